//! onionlab's onion proxy: a SOCKS5 server that carries application streams
//! over 3-hop circuits, as a tor client does.
//!
//! ```no_run
//! # async fn example(settings: onionlab_client::ClientSettings) -> onionlab_client::Result<()> {
//! let client = onionlab_client::Client::bind(settings).await?;
//! println!("SOCKS5 on {}", client.local_addr());
//! client.run(onionlab_client::shutdown_signal()?).await
//! # }
//! ```
//!
//! # What it does
//!
//! * **SOCKS** ([`socks`]): SOCKS5 CONNECT to IPv4, IPv6 and host names,
//!   with no authentication or username/password; the reply code says what
//!   failed (table in [`socks`]).
//! * **Paths** ([`path`]): bandwidth-weighted guard, middle and exit (Exit
//!   flag, policy allowing the target), all distinct; or a pinned path.
//! * **Channels**: one TLS link per guard, opened on demand and shared by
//!   every circuit through that guard. Circuit IDs are random with the high
//!   bit set (link protocol 4+, we initiate). Each channel has a circuit
//!   scheduler ([`PolicySettings::scheduler`](onionlab_client_core::PolicySettings::scheduler), EWMA by default) for the
//!   order in which circuits' cells go out. If the link dies, its circuits
//!   close and their streams are closed (or get a failure reply).
//! * **Circuits**: built hop by hop with the build timeout, retried with
//!   fresh paths (a pinned path: the same path) up to `build_retries`
//!   times. A new stream reuses an open circuit while the circuit is
//!   younger than the dirtiness limit since its first stream, its exit's
//!   policy fits the target, and its isolation matches; streams waiting
//!   for the same kind of circuit share one being built.
//! * **Isolation** ([`socks::IsolationKey`]), like tor's
//!   `IsolateSOCKSAuth`: streams with different SOCKS credentials never
//!   share a circuit; streams without credentials share.
//! * **Streams**: BEGIN, the SOCKS reply on CONNECTED or END, then bytes
//!   both ways with back-pressure and bounded buffers (see the stream
//!   module's docs in the source).
//! * **Network document**: loaded again every
//!   [`ClientSettings::network_refresh`] (hourly by default); a newer
//!   valid one replaces the held one, an older one is refused as a
//!   rollback ([`onionlab_config::refresh`]). Circuits keep the document
//!   they were built from; those through a relay the new document drops
//!   take no new streams.
//!
//! # Design
//!
//! Single-threaded, as tor is: a current-thread runtime and a `LocalSet`.
//! Every decision is the sans-IO [`onionlab_client_core::ClientCore`]'s
//! (the client node with its guard channels, circuits and streams; path
//! selection, circuit reuse, isolation, dirtiness, failed-relay avoidance,
//! build and stream retries, the connect timeout); this crate drives it
//! with sockets and timers, as the simulation drives it with simulated
//! ones. The core and the tasks' handles live in one `Rc<RefCell<State>>`,
//! borrowed only between awaits. Tasks: the accept loop; one per SOCKS
//! connection, which asks the core for a stream and waits for its answer;
//! a reader and a writer per guard channel, woken by a `tokio::sync::Notify`;
//! a timer task for the core's deadlines (build, hop and connect
//! timeouts); a housekeeping task that closes unused dirty circuits;
//! a task that reloads the network document every `network_refresh` and
//! keeps the newest valid one (see the refresh module in the source).
//!
//! Logs go to `tracing`: `info` for channels and circuits (built, failed,
//! with the path's nicknames), `debug` per stream.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod channel;
mod dgram;
mod error;
pub use onionlab_client_core::path;
mod refresh;
pub mod settings;
pub mod socks;
mod state;
mod stream;

use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::LocalSet;

pub use error::{Error, Result};
pub use settings::{ClientSettings, NetworkOrigin};

use onionlab_client_core::Config;

use crate::state::{Shared, State};

/// How long shutdown waits for DESTROYs to be flushed to the guards.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(2);

/// How often unused circuits past their dirtiness limit are looked for.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(5);

/// The onion proxy: a bound SOCKS listener and the client's state.
///
/// Not `Send`: run it on a current-thread runtime (as [`run_blocking`]
/// does).
pub struct Client {
    listener: TcpListener,
    local_addr: SocketAddr,
    state: Shared,
    /// With the `datagram` or `more` transport: the datagram sets streams
    /// go on.
    datagram: Option<dgram::Shared>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

/// Say so when the settings ask for multi-path sets and the network's
/// exits do not link them (`cfx_enabled` is off): circuits are plain.
pub(crate) fn warn_if_no_sets(cfg: &Config) {
    if let Some(legs) = cfg.sets_refused() {
        tracing::warn!(
            legs,
            "the network document does not enable multi-path sets (cfx_enabled): \
             plain circuits instead (the first pinned leg, if legs are pinned)"
        );
    }
}

impl Client {
    /// Check the settings (a pinned path must name relays of the network
    /// document, each once, each with a `tls` address) and bind the SOCKS
    /// listener.
    ///
    /// # Errors
    ///
    /// [`Error::PinnedPath`], [`Error::Setting`] (a `tcp_congestion` the kernel
    /// lacks), [`Error::Bind`].
    pub async fn bind(settings: ClientSettings) -> Result<Client> {
        settings.link.check().map_err(|source| Error::Setting {
            what: "the client's [link] settings",
            source,
        })?;
        settings
            .link
            .tcp_congestion()
            .check_available()
            .map_err(|e| Error::Setting {
                what: "the client's TCP congestion control",
                source: e.into(),
            })?;
        let names = settings.policy.pinned_names();
        let cfg = Config::new(settings.policy.clone()).map_err(|source| Error::PinnedPath {
            path: names.clone().unwrap_or_default(),
            source,
        })?;
        let shortest = cfg.pinned.iter().flatten().map(Vec::len).min();
        if let Some(hops) = shortest.filter(|&n| n < path::PATH_LEN) {
            tracing::warn!(
                path = ?names,
                "pinned path of {hops} hop(s): fine for a lab, no anonymity",
            );
        }
        warn_if_no_sets(&cfg);
        let addr = settings.socks_listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| Error::Bind { addr, source })?;
        tracing::info!(
            socks = %local_addr,
            relays = settings.policy.network.relays.len(),
            pinned = ?names,
            legs = cfg.legs(),
            "client ready"
        );
        // With the `datagram` or `more` transport, what its sets run
        // with: the paths and timeouts, the end-to-end TCP's settings, and
        // which design.
        let only = |kind| settings.link.transport == onionlab_transport::Choice::Only(kind);
        let more = only(onionlab_transport::TransportKind::MORE);
        let datagram = (only(onionlab_transport::TransportKind::DATAGRAM) || more)
            .then(|| (settings.policy.clone(), settings.link.clone()));
        let state = State::new_shared(settings, cfg)?;
        let datagram = match datagram {
            Some((policy, link)) => {
                let socket = state
                    .borrow()
                    .connector()
                    .endpoints()
                    .get::<std::sync::Arc<onionlab_transport::datagram::DatagramSocket>>(
                        onionlab_transport::endpoint::EndpointKind::DGRAM,
                        "datagram",
                    )
                    .map_err(|source| Error::Setting {
                        what: "the client's datagram socket",
                        source,
                    })?
                    .clone();
                Some(dgram::State::new_shared(socket, policy, &link, more)?)
            }
            None => None,
        };
        Ok(Client {
            listener,
            local_addr,
            state,
            datagram,
        })
    }

    /// The address the SOCKS listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serve SOCKS connections until `shutdown` completes; then destroy
    /// every circuit, flush the DESTROYs (for at most 2 s), and close every
    /// connection.
    ///
    /// Runs its tasks on a `LocalSet` of its own: call it on a
    /// current-thread runtime.
    ///
    /// # Errors
    ///
    /// None so far: failures of accept are logged and retried, failures
    /// of streams and circuits are reported to the application.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let local = LocalSet::new();
        local.run_until(self.run_inner(shutdown)).await
    }

    async fn run_inner(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let Client {
            listener,
            state,
            datagram,
            ..
        } = self;
        let datagram_driver = datagram
            .as_ref()
            .map(|d| tokio::task::spawn_local(dgram::drive(d.clone())));
        let hs_timeout = state.borrow().settings.socks_handshake_timeout;
        let housekeeping = {
            let state = state.clone();
            tokio::task::spawn_local(async move {
                let mut tick = tokio::time::interval(HOUSEKEEPING_PERIOD);
                loop {
                    tick.tick().await;
                    state.borrow_mut().expire_dirty();
                }
            })
        };
        let timer = tokio::task::spawn_local(State::run_timer(state.clone()));
        let refresh = refresh::spawn(&state);
        let max_conns = state.borrow().settings.max_socks_connections;
        let active = Rc::new(Cell::new(0usize));
        let mut backoff = onionlab_ops::AcceptBackoff::new("SOCKS port");
        let mut over_limit_log = onionlab_ops::LogLimiter::default();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((sock, peer)) => {
                        backoff.on_success();
                        if active.get() >= max_conns {
                            if let Some(held_back) = over_limit_log.check(std::time::Instant::now()) {
                                // held_back: connections closed since the last line.
                                tracing::warn!(%peer, held_back, "too many SOCKS connections ({max_conns}): closing");
                            }
                            continue;
                        }
                        let _ = sock.set_nodelay(true);
                        let guard = ConnCount::new(active.clone());
                        let state = state.clone();
                        let datagram = datagram.clone();
                        tokio::task::spawn_local(async move {
                            let _guard = guard;
                            match datagram {
                                Some(d) => dgram::serve(d, sock, peer, hs_timeout).await,
                                None => stream::serve(state, sock, peer).await,
                            }
                        });
                    }
                    Err(e) => {
                        // Out of descriptors, say: growing delays instead of
                        // a spin; the log line is rate-limited.
                        let delay = backoff.on_error(std::time::Instant::now(), &e);
                        tokio::select! {
                            _ = &mut shutdown => break,
                            () = tokio::time::sleep(delay) => {}
                        }
                    }
                },
            }
        }
        tracing::info!("shutting down");
        if let Some(d) = datagram_driver {
            d.abort();
        }
        housekeeping.abort();
        timer.abort();
        if let Some(r) = refresh {
            r.abort();
        }
        drop(listener);
        let writers = state.borrow_mut().begin_shutdown();
        let flushed = tokio::time::timeout(SHUTDOWN_FLUSH, async {
            for w in writers {
                let _ = w.await;
            }
        })
        .await;
        if flushed.is_err() {
            tracing::debug!("some channels did not flush in time");
        }
        Ok(())
    }
}

/// Counts a live SOCKS connection while it exists.
struct ConnCount(Rc<Cell<usize>>);

impl ConnCount {
    fn new(c: Rc<Cell<usize>>) -> Self {
        c.set(c.get() + 1);
        ConnCount(c)
    }
}

impl Drop for ConnCount {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

/// A future that completes on SIGINT or SIGTERM (on Unix; Ctrl-C
/// elsewhere). Call it inside a tokio runtime.
///
/// # Errors
///
/// [`Error::Signal`] if a handler cannot be installed.
pub fn shutdown_signal() -> Result<impl Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt()).map_err(|source| Error::Signal {
            signal: "SIGINT",
            source,
        })?;
        let mut term = signal(SignalKind::terminate()).map_err(|source| Error::Signal {
            signal: "SIGTERM",
            source,
        })?;
        Ok(async move {
            tokio::select! {
                _ = int.recv() => tracing::info!("SIGINT received"),
                _ = term.recv() => tracing::info!("SIGTERM received"),
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)
}

/// Run the client with `settings` on a current-thread runtime of its own
/// until SIGINT or SIGTERM.
///
/// # Errors
///
/// Those of [`Client::bind`], [`shutdown_signal`], and [`Error::Runtime`].
pub fn run_blocking(settings: ClientSettings) -> Result<()> {
    runtime()?.block_on(async {
        let shutdown = shutdown_signal()?;
        Client::bind(settings).await?.run(shutdown).await
    })
}

/// What `onionlab client --config FILE` does: load the configuration file,
/// read or fetch the network document and verify it, bind the SOCKS
/// listener and run until SIGINT or SIGTERM, on a current-thread runtime
/// of its own.
///
/// # Errors
///
/// Those of [`ClientSettings::load`] and [`run_blocking`].
pub fn run_config_file(config: &Path) -> Result<()> {
    runtime()?.block_on(async {
        let shutdown = shutdown_signal()?;
        let settings = ClientSettings::load(config).await?;
        Client::bind(settings).await?.run(shutdown).await
    })
}
