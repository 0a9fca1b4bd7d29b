//! One UDP socket running a sans-IO `onionlab_dtls::Endpoint` whose
//! sessions carry cells: datagrams in, timers, cells out. The endpoint
//! decides everything (cookies, handshakes, identities, replay, rates);
//! this only moves bytes between it and the socket.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use onionlab_dgram::link::CellBytes;
use onionlab_dgram::{CellLink, CellLinkEvent, CellLinkStats};
use onionlab_dtls::{Endpoint, EndpointConfig, EndpointEvent, EndpointStats};
use tokio::net::UdpSocket;
use tokio::sync::Notify;
use tor_llcrypto::pk::ed25519::Ed25519Identity;
use tracing::debug;

use crate::Error;

/// Cells waiting for [`DatagramSocket::next_event`], at most: more are
/// dropped (counted in [`DatagramSocket::events_dropped`]) as a full link
/// would drop them. Session events are never dropped.
pub const EVENT_QUEUE: usize = 4096;

/// What happens on a datagram socket's links.
#[derive(Debug)]
pub enum LinkEvent {
    /// The session with `peer` is authenticated both ways: a relay's
    /// proven identity, or `None` for a client. Cells may be sent.
    Up {
        /// The peer's address.
        peer: SocketAddr,
        /// Its identity.
        identity: Option<Ed25519Identity>,
        /// Whether this socket dialled the session; `false` also when
        /// our dial crossed the peer's and gave way to it
        /// (`onionlab_dtls::endpoint`'s crossed dials): the peer's
        /// identity was then not checked against the one dialled.
        dialled: bool,
    },
    /// A cell from an authenticated peer.
    Cell {
        /// The peer's address.
        peer: SocketAddr,
        /// The cell's bytes.
        cell: CellBytes,
    },
    /// A MORE message from an authenticated peer.
    More {
        /// The peer's address.
        peer: SocketAddr,
        /// The message's bytes.
        message: Vec<u8>,
    },
    /// The session with `peer` ended (or never began) and is forgotten.
    Down {
        /// The peer's address.
        peer: SocketAddr,
        /// Why.
        reason: String,
    },
}

/// A UDP socket with its datagram links. Dropping it stops its driver:
/// every link on it ends (peers notice by their own timers).
pub struct DatagramSocket {
    shared: Arc<Shared>,
    driver: tokio::task::JoinHandle<()>,
}

struct Shared {
    socket: UdpSocket,
    local: SocketAddr,
    state: Mutex<State>,
    /// The driver has datagrams to send.
    wake: Notify,
    /// Events are waiting.
    events_ready: Notify,
}

struct State {
    endpoint: Endpoint<CellLink>,
    events: VecDeque<LinkEvent>,
    cells_queued: usize,
    events_dropped: u64,
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|p| p.into_inner())
}

impl DatagramSocket {
    /// Bind a UDP socket at `addr` and start its driver (needs a tokio
    /// runtime).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the socket cannot be bound, [`Error::Config`] for
    /// settings the endpoint refuses.
    pub fn bind(addr: SocketAddr, config: EndpointConfig<CellLink>) -> Result<Self, Error> {
        let endpoint = Endpoint::new(config, rand::random(), Instant::now())
            .map_err(|e| Error::Config(format!("datagram endpoint: {e}")))?;
        let (socket, local) = crate::udp::bind(addr, "binding the datagram UDP socket")?;
        let shared = Arc::new(Shared {
            socket,
            local,
            state: Mutex::new(State {
                endpoint,
                events: VecDeque::new(),
                cells_queued: 0,
                events_dropped: 0,
            }),
            wake: Notify::new(),
            events_ready: Notify::new(),
        });
        let driver = tokio::spawn(drive(shared.clone()));
        Ok(DatagramSocket { shared, driver })
    }

    /// The socket's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// Open a link to the relay at `peer`, which must prove `expect`: a
    /// [`LinkEvent::Up`] or [`LinkEvent::Down`] for `peer` follows (the
    /// handshake timeout bounds it).
    ///
    /// # Errors
    ///
    /// [`Error::Protocol`] if there is a session with `peer` already or no
    /// room for one.
    pub fn connect(&self, peer: SocketAddr, expect: Ed25519Identity) -> Result<(), Error> {
        lock(&self.shared)
            .endpoint
            .connect(peer, expect, Instant::now())
            .map_err(|e| Error::Protocol {
                peer,
                detail: format!("datagram: {e}"),
            })?;
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Send `cell` to `peer` now; `Ok(false)` if its link's send queue
    /// was full and the cell was dropped (a loss, as on any datagram
    /// link).
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] if there is no authenticated link with `peer`.
    pub fn send(&self, peer: SocketAddr, cell: CellBytes) -> Result<bool, Error> {
        let sent = lock(&self.shared)
            .endpoint
            .with_carrier(peer, Instant::now(), |link| link.send(cell))
            .ok_or(Error::Closed)?;
        self.shared.wake.notify_one();
        Ok(sent)
    }

    /// Queue a MORE message to `peer`, as [`send`](Self::send) a cell.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] if there is no link to `peer`.
    pub fn send_more(&self, peer: SocketAddr, message: Vec<u8>) -> Result<bool, Error> {
        let sent = lock(&self.shared)
            .endpoint
            .with_carrier(peer, Instant::now(), |link| link.send_more(message))
            .ok_or(Error::Closed)?;
        self.shared.wake.notify_one();
        Ok(sent)
    }

    /// Whether there is a session with `peer`, authenticated or still
    /// handshaking (its [`LinkEvent::Up`] or [`LinkEvent::Down`] is to
    /// come if it is not in yet).
    pub fn has_session(&self, peer: SocketAddr) -> bool {
        lock(&self.shared).endpoint.has_session(peer)
    }

    /// End the link with `peer` (without a word: the peer notices by its
    /// own timers); false if there was none.
    pub fn close(&self, peer: SocketAddr) -> bool {
        lock(&self.shared).endpoint.close(peer)
    }

    /// The next event: a link up or down, a cell or a MORE message.
    pub async fn next_event(&self) -> LinkEvent {
        loop {
            let ready = self.shared.events_ready.notified();
            {
                let mut st = lock(&self.shared);
                if let Some(e) = st.events.pop_front() {
                    if matches!(e, LinkEvent::Cell { .. } | LinkEvent::More { .. }) {
                        st.cells_queued -= 1;
                    }
                    return e;
                }
            }
            ready.await;
        }
    }

    /// What the endpoint refused or dropped so far.
    pub fn stats(&self) -> EndpointStats {
        lock(&self.shared).endpoint.stats()
    }

    /// What the link with `peer` carried and dropped, while it is up.
    pub fn link_stats(&self, peer: SocketAddr) -> Option<CellLinkStats> {
        lock(&self.shared)
            .endpoint
            .with_carrier(peer, Instant::now(), |link| link.stats())
    }

    /// Cells dropped because nobody took them fast enough.
    pub fn events_dropped(&self) -> u64 {
        lock(&self.shared).events_dropped
    }
}

impl Drop for DatagramSocket {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl State {
    fn take_events(&mut self) {
        while let Some(ev) = self.endpoint.poll_event() {
            let ev = match ev {
                EndpointEvent::Authenticated {
                    peer,
                    identity,
                    dialled,
                } => LinkEvent::Up {
                    peer,
                    identity,
                    dialled,
                },
                EndpointEvent::Carrier {
                    peer,
                    event: CellLinkEvent::Cell(cell),
                } => {
                    if self.cells_queued >= EVENT_QUEUE {
                        self.events_dropped += 1;
                        continue;
                    }
                    self.cells_queued += 1;
                    LinkEvent::Cell { peer, cell }
                }
                EndpointEvent::Carrier {
                    peer,
                    event: CellLinkEvent::More(message),
                } => {
                    if self.cells_queued >= EVENT_QUEUE {
                        self.events_dropped += 1;
                        continue;
                    }
                    self.cells_queued += 1;
                    LinkEvent::More { peer, message }
                }
                // A dead peer (a killed relay): the session ends here, so
                // that its circuits end now.
                EndpointEvent::Carrier {
                    peer,
                    event: CellLinkEvent::Silent,
                } => {
                    self.endpoint.close(peer);
                    debug!(%peer, "datagram link silent: ended");
                    LinkEvent::Down {
                        peer,
                        reason: "the peer fell silent".into(),
                    }
                }
                EndpointEvent::Closed { peer, error } => {
                    debug!(%peer, "datagram link ended: {error}");
                    LinkEvent::Down {
                        peer,
                        reason: error.to_string(),
                    }
                }
            };
            self.events.push_back(ev);
        }
    }
}

/// The driver: datagrams in, timers, datagrams out.
async fn drive(shared: Arc<Shared>) {
    let mut buf = vec![0u8; crate::udp::MAX_DATAGRAM];
    loop {
        let (deadline, out, has_events) = {
            let mut st = lock(&shared);
            st.take_events();
            let out: Vec<_> = std::iter::from_fn(|| st.endpoint.poll_transmit()).collect();
            (st.endpoint.poll_timeout(), out, !st.events.is_empty())
        };
        if has_events {
            shared.events_ready.notify_one();
        }
        for (to, d) in &out {
            if let Err(e) = shared.socket.send_to(d, to).await {
                debug!(%to, "datagram send: {e}");
            }
        }
        if !out.is_empty() {
            // Sending took time: look again before sleeping.
            tokio::task::yield_now().await;
        }
        let notified = shared.wake.notified();
        let sleep = async {
            match deadline {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = shared.socket.recv_from(&mut buf) => match r {
                Ok((n, from)) => {
                    let mut st = lock(&shared);
                    let now = Instant::now();
                    crate::udp::take_batch(&shared.socket, &mut buf, (from, n), |from, d| {
                        st.endpoint.handle_datagram(from, d, now)
                    });
                }
                // An ICMP error for an earlier datagram, on Linux: the
                // session concerned learns by its own timers.
                Err(e) => debug!("datagram receive: {e}"),
            },
            _ = sleep => lock(&shared).endpoint.handle_timeout(Instant::now()),
            _ = notified => {}
        }
    }
}
