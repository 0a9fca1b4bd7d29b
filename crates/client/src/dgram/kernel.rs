//! A client's kernel sets (`[link.datagram] end_to_end = "kernel"`;
//! `onionlab_dgram::tunnel`, seed 004's TUN mode): each SOCKS stream
//! becomes a connection of the client's kernel TCP to its set's virtual
//! exit address, through the client's TUN device; the proxy carries its
//! segments over the set's circuits, and the exit's kernel accepts it.
//! The connection opens with the stream's target (as a user-space lane
//! does) and the exit's one-byte answer, then the application's bytes
//! are spliced onto it.
//!
//! A set's connections are reset when the set fails, so an application
//! never reads a clean end of a truncated stream; a set the client no
//! longer picks for new streams is closed when its last connection ends.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_cell::msg::EndReason;
use onionlab_client_core::path::Target;
use onionlab_dgram::e2e::stream_preamble;
use onionlab_dgram::tunnel::{from_kernel, to_kernel, PeerAddrs, TunnelEnd, TUNNEL_PORT};
use onionlab_dgram::Proxy;
use onionlab_transport::datagram::pump::splice;
use onionlab_transport::datagram::tunnel::{tunnel_socket, KernelSetStats, TunDevice};
use onionlab_transport::tcp::TcpCongestion;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tor_socksproto::SocksRequest;

use super::{flush, Shared, State};
use crate::socks::{self, reply};
use crate::{Error, Result};

/// The client's kernel sets: its TUN device, each set's virtual exit
/// address and connections.
pub(crate) struct KernelSets {
    tun: Arc<TunDevice>,
    addrs: PeerAddrs,
    sets: HashMap<u64, SetConns>,
    congestion: TcpCongestion,
    connections: u64,
    filtered: u64,
}

/// A set's connections.
struct SetConns {
    open: usize,
    /// No new connection goes on it: closed with its last.
    retired: bool,
    /// Becomes `true` when the set ends: its connections reset.
    ended: watch::Sender<bool>,
}

impl KernelSets {
    /// Open the TUN device; connections use `congestion`.
    pub(crate) fn open(congestion: TcpCongestion) -> Result<Self> {
        let tun = TunDevice::open().map_err(|e| Error::Datagram(e.to_string()))?;
        Ok(KernelSets {
            tun: Arc::new(tun),
            addrs: PeerAddrs::default(),
            sets: HashMap::new(),
            congestion,
            connections: 0,
            filtered: 0,
        })
    }

    /// The TUN device, for the driver's reads.
    pub(crate) fn tun(&self) -> Arc<TunDevice> {
        self.tun.clone()
    }

    /// What they did so far.
    pub(crate) fn stats(&self) -> KernelSetStats {
        KernelSetStats {
            connections: self.connections,
            refused: 0,
            filtered: self.filtered,
            tun: self.tun.stats(),
        }
    }

    /// A packet the kernel sent: its segment onto its set's circuits.
    pub(crate) fn packet_from_kernel(&mut self, proxy: &mut Proxy, packet: &[u8]) {
        match from_kernel(TunnelEnd::Client, &self.addrs, packet) {
            Ok((set, segment)) => {
                proxy.send_kernel_segment(Instant::now(), set, segment);
            }
            Err(why) => {
                self.filtered += 1;
                tracing::trace!("a packet from the kernel dropped: {why}");
            }
        }
    }

    /// A segment the set's exit sent: into the kernel.
    pub(crate) fn segment_to_kernel(&mut self, set: u64, segment: &[u8]) {
        let Some(peer) = self.addrs.addr_of(set) else {
            return;
        };
        match to_kernel(TunnelEnd::Client, peer, segment) {
            Ok(packet) => self.tun.send(&packet),
            Err(why) => {
                self.filtered += 1;
                tracing::debug!(set, "a segment from the exit dropped: {why}");
            }
        }
    }

    /// The set ended (failed, or closed): its connections are reset and
    /// its address is free.
    pub(crate) fn set_ended(&mut self, set: u64) {
        if let Some(conns) = self.sets.remove(&set) {
            let _ = conns.ended.send(true);
        }
        self.addrs.release(set);
    }

    /// No new connection goes on `set`: it is closed now if it has none,
    /// else when its last one ends.
    pub(crate) fn retire(&mut self, proxy: &mut Proxy, set: u64) {
        match self.sets.get_mut(&set) {
            Some(conns) if conns.open > 0 => conns.retired = true,
            _ => {
                proxy.close_set(set);
                self.set_ended(set);
            }
        }
    }

    /// A connection on `set` starts: the set's virtual exit address and
    /// its end; `None` when every address is taken.
    fn conn_start(&mut self, set: u64) -> Option<(Ipv4Addr, watch::Receiver<bool>)> {
        let addr = self.addrs.assign(set)?;
        let conns = self.sets.entry(set).or_insert_with(|| SetConns {
            open: 0,
            retired: false,
            ended: watch::channel(false).0,
        });
        conns.open += 1;
        self.connections += 1;
        Some((addr, conns.ended.subscribe()))
    }

    /// A connection on `set` ended; `true` if it was the last of a
    /// retired set, to be closed after [`RETIRED_LINGER`].
    fn conn_done(&mut self, set: u64) -> bool {
        let Some(conns) = self.sets.get_mut(&set) else {
            return false;
        };
        conns.open -= 1;
        conns.open == 0 && conns.retired
    }

    /// Close `set` if it is still retired with no connection.
    fn close_if_idle(&mut self, proxy: &mut Proxy, set: u64) {
        if self
            .sets
            .get(&set)
            .is_some_and(|c| c.retired && c.open == 0)
        {
            proxy.close_set(set);
            self.set_ended(set);
        }
    }
}

/// How long a retired set lives after its last connection ended: the
/// kernel may still be resending that connection's last segments.
pub(crate) const RETIRED_LINGER: Duration = Duration::from_secs(10);

/// A connection counted on its set until dropped.
struct Conn {
    shared: Shared,
    set: u64,
}

impl Drop for Conn {
    fn drop(&mut self) {
        let Ok(mut st) = self.shared.try_borrow_mut() else {
            return;
        };
        let last = st.kernel.as_mut().is_some_and(|k| k.conn_done(self.set));
        drop(st);
        if !last {
            return;
        }
        // The kernel may still resend the connection's last segments
        // (its FIN among them): the set lives a little longer.
        let (shared, set) = (self.shared.clone(), self.set);
        tokio::task::spawn_local(async move {
            tokio::time::sleep(RETIRED_LINGER).await;
            {
                let mut st = shared.borrow_mut();
                let State { kernel, proxy, .. } = &mut *st;
                if let Some(kernel) = kernel.as_mut() {
                    kernel.close_if_idle(proxy, set);
                }
            }
            flush(&shared);
        });
    }
}

/// Wait until the set ends (or its sender is gone with it).
async fn set_ended(mut ended: watch::Receiver<bool>) {
    let _ = ended.wait_for(|e| *e).await;
}

/// Serve a SOCKS stream to `target` (`host`) over a kernel set: the
/// SOCKS reply says how it opened, then bytes flow until both sides end,
/// or the set fails (a reset).
pub(super) async fn serve_stream(
    shared: Shared,
    mut sock: TcpStream,
    peer: SocketAddr,
    request: &SocksRequest,
    (target, host): (Target, String),
    early: Vec<u8>,
) {
    let (mut tunnel, conn, ended) = match open(&shared, &target, &host).await {
        Ok(opened) => opened,
        Err(code) => {
            tracing::debug!(%peer, %target, code, "kernel stream failed");
            let _ = sock.write_all(&socks::reply_bytes(request, code)).await;
            return;
        }
    };
    let success = socks::reply_bytes(request, reply::SUCCEEDED);
    let started = async {
        sock.write_all(&success).await?;
        tunnel.write_all(&early).await
    };
    if started.await.is_err() {
        // The application may have its SUCCEEDED: a reset, not an end.
        let _ = tunnel.set_zero_linger();
        let _ = sock.set_zero_linger();
        return;
    }
    let end = splice(sock, tunnel, set_ended(ended)).await;
    tracing::debug!(%peer, %target, set = conn.set, ?end, "kernel stream done");
}

/// Open a kernel connection for `host` on a set to an exit that allows
/// `target`, and wait for the exit's answer within the build and connect
/// timeouts: the connection, its count on the set and the set's end; or
/// a SOCKS reply code.
async fn open(
    shared: &Shared,
    target: &Target,
    host: &str,
) -> std::result::Result<(TcpStream, Conn, watch::Receiver<bool>), u8> {
    let preamble = stream_preamble(host).map_err(|_| reply::GENERAL_FAILURE)?;
    let now = Instant::now();
    let (addr, ended, congestion, deadline, conn) = {
        let mut st = shared.borrow_mut();
        let set = st.set_for(now, target).map_err(|why| {
            tracing::info!(%target, "no datagram set: {why}");
            reply::GENERAL_FAILURE
        })?;
        let deadline = now + st.policy.circuit_build_timeout + st.policy.stream_connect_timeout;
        let kernel = st.kernel.as_mut().ok_or(reply::GENERAL_FAILURE)?;
        let (addr, ended) = kernel.conn_start(set).ok_or(reply::GENERAL_FAILURE)?;
        let conn = Conn {
            shared: shared.clone(),
            set,
        };
        (addr, ended, kernel.congestion.clone(), deadline, conn)
    };
    // The set's circuits are asked for now, not at the next event.
    flush(shared);
    let connect = async {
        tunnel_socket(&congestion)?
            .connect(SocketAddr::from((addr, TUNNEL_PORT)))
            .await
    };
    let failed = |e: io::Error| {
        tracing::info!(%target, "kernel connection through the set failed: {e}");
        reply::GENERAL_FAILURE
    };
    let mut tcp = tokio::select! {
        r = tokio::time::timeout_at(deadline.into(), connect) => match r {
            Ok(connected) => connected.map_err(failed)?,
            Err(_) => return Err(reply::TTL_EXPIRED),
        },
        () = set_ended(ended.clone()) => return Err(reply::GENERAL_FAILURE),
    };
    let asked = async {
        tcp.write_all(&preamble).await?;
        let mut answer = [0u8; 1];
        tcp.read_exact(&mut answer).await?;
        Ok::<_, io::Error>(answer[0])
    };
    let answered = tokio::select! {
        r = tokio::time::timeout_at(deadline.into(), asked) => Some(r),
        () = set_ended(ended.clone()) => None,
    };
    match answered {
        Some(Ok(Ok(0))) => Ok((tcp, conn, ended)),
        Some(Ok(Ok(reason))) => Err(socks::end_reason_reply(EndReason::from(reason))),
        answered => {
            // The exit may have the target already: reset, so it never
            // passes on a clean, empty stream.
            let _ = tcp.set_zero_linger();
            match answered {
                Some(Ok(Err(e))) => Err(failed(e)),
                Some(Err(_)) => Err(reply::TTL_EXPIRED),
                _ => Err(reply::GENERAL_FAILURE),
            }
        }
    }
}

impl State {
    /// The TUN device of a client with kernel sets.
    pub(super) fn kernel_tun(&self) -> Option<Arc<TunDevice>> {
        self.kernel.as_ref().map(KernelSets::tun)
    }
}
