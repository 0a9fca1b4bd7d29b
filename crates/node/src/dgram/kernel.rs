//! An exit's kernel sets (`[link.datagram] end_to_end = "kernel"`;
//! `onionlab_dgram::tunnel`, seed 004's TUN mode): its TUN device, where
//! the clients' segments enter its kernel from each set's virtual
//! address, and its kernel's listener on the tunnel's port. Each
//! connection it accepts opens with the stream's target (one length
//! byte, then `host:port`, as a user-space lane does); the exit connects
//! under its rules, answers with one byte (0: connected, else tor-spec's
//! END reason) and splices the two connections.
//!
//! Bounded as the user-space streams are: connections per set and in all
//! (`max_streams_per_set`, `max_streams`), connects under way
//! (`exit_max_pending_connects`), a target read within
//! [`TARGET_TIMEOUT`]. A set's connections are reset when the set ends.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use onionlab_cell::msg::EndReason;
use onionlab_dgram::e2e::parse_stream_preamble;
use onionlab_dgram::tunnel::{
    from_kernel, to_kernel, PeerAddrs, TunnelEnd, NODE_ADDR, TUNNEL_PORT,
};
use onionlab_dgram::ExitSets;
use onionlab_transport::datagram::pump::splice;
use onionlab_transport::datagram::tunnel::{tunnel_socket, KernelSetStats, TunDevice};
use onionlab_transport::tcp::TcpCongestion;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::spawn_local;
use tracing::debug;

use super::{flush, split_target, Shared, State};
use crate::exit::connect_target;

/// A connection's target must arrive within this.
pub(crate) const TARGET_TIMEOUT: Duration = Duration::from_secs(10);

/// The exit's kernel sets: its TUN device, its listener, each set's
/// virtual client address and connections.
pub(crate) struct ExitKernel {
    tun: Arc<TunDevice>,
    /// Taken by the accept loop when it starts.
    listener: Option<TcpListener>,
    addrs: PeerAddrs,
    sets: HashMap<u64, SetConns>,
    /// Connections in all sets.
    open: usize,
    max_per_set: usize,
    max_total: usize,
    stats: KernelSetStats,
}

/// A set's connections.
struct SetConns {
    open: usize,
    /// Becomes `true` when the set ends: its connections reset.
    ended: watch::Sender<bool>,
}

impl ExitKernel {
    /// Open the TUN device and listen on [`NODE_ADDR`]:[`TUNNEL_PORT`]
    /// on it, with `congestion` and keep-alive ([`tunnel_socket`];
    /// accepted connections inherit them); at most
    /// `max_per_set` connections per set and `max_total` in all. Must
    /// run inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// The system's, saying what failed.
    pub(crate) fn open(
        congestion: &TcpCongestion,
        max_per_set: usize,
        max_total: usize,
    ) -> io::Result<ExitKernel> {
        let tun = TunDevice::open()?;
        let listen = SocketAddr::from((NODE_ADDR, TUNNEL_PORT));
        let listener = (|| {
            let socket = tunnel_socket(congestion)?;
            socket.set_reuseaddr(true)?;
            socket.bind(listen)?;
            socket.listen(1024)
        })()
        .map_err(|e| io::Error::new(e.kind(), format!("listening on {listen}: {e}")))?;
        Ok(ExitKernel {
            tun: Arc::new(tun),
            listener: Some(listener),
            addrs: PeerAddrs::default(),
            sets: HashMap::new(),
            open: 0,
            max_per_set,
            max_total,
            stats: KernelSetStats::default(),
        })
    }

    /// The TUN device, for the driver's reads.
    pub(crate) fn tun(&self) -> Arc<TunDevice> {
        self.tun.clone()
    }

    /// What they did so far.
    pub(crate) fn stats(&self) -> KernelSetStats {
        KernelSetStats {
            tun: self.tun.stats(),
            ..self.stats
        }
    }

    /// A packet the kernel sent: its segment onto its set's circuits.
    pub(crate) fn packet_from_kernel(&mut self, sets: &mut ExitSets, packet: &[u8]) {
        match from_kernel(TunnelEnd::Exit, &self.addrs, packet) {
            Ok((set, segment)) => {
                sets.send_kernel_segment(set, segment);
            }
            Err(why) => {
                self.stats.filtered += 1;
                tracing::trace!("a packet from the kernel dropped: {why}");
            }
        }
    }

    /// A segment the set's client sent: into the kernel, from the set's
    /// address (given at its first segment).
    pub(crate) fn segment_to_kernel(&mut self, set: u64, segment: &[u8]) {
        let Some(peer) = self.addrs.assign(set) else {
            return debug!(set, "no tunnel address left: segment dropped");
        };
        match to_kernel(TunnelEnd::Exit, peer, segment) {
            Ok(packet) => self.tun.send(&packet),
            Err(why) => {
                self.stats.filtered += 1;
                debug!(set, "a segment from the client dropped: {why}");
            }
        }
    }

    /// The set ended: its connections are reset and its address is free.
    pub(crate) fn set_ended(&mut self, set: u64) {
        if let Some(conns) = self.sets.remove(&set) {
            let _ = conns.ended.send(true);
        }
        self.addrs.release(set);
    }

    /// A connection from `peer` was accepted: its set and the set's end;
    /// `Err(None)` if no set has that address, `Err(Some(reason))` over
    /// a limit.
    fn conn_start(
        &mut self,
        peer: Ipv4Addr,
    ) -> Result<(u64, watch::Receiver<bool>), Option<EndReason>> {
        let Some(set) = self.addrs.set_of(peer) else {
            self.stats.refused += 1;
            return Err(None);
        };
        let conns = self.sets.entry(set).or_insert_with(|| SetConns {
            open: 0,
            ended: watch::channel(false).0,
        });
        if conns.open >= self.max_per_set || self.open >= self.max_total {
            self.stats.refused += 1;
            return Err(Some(EndReason::RESOURCELIMIT));
        }
        conns.open += 1;
        self.open += 1;
        self.stats.connections += 1;
        Ok((set, conns.ended.subscribe()))
    }

    /// A connection of `set` ended.
    fn conn_done(&mut self, set: u64) {
        self.open -= 1;
        if let Some(conns) = self.sets.get_mut(&set) {
            conns.open -= 1;
        }
    }
}

/// A connection counted on its set until dropped.
struct Conn {
    shared: Shared,
    set: u64,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Ok(mut st) = self.shared.try_borrow_mut() {
            if let Some(kernel) = st.kernel.as_mut() {
                kernel.conn_done(self.set);
            }
        }
    }
}

/// Wait until the set ends (or its sender is gone with it).
async fn set_ended(mut ended: watch::Receiver<bool>) {
    let _ = ended.wait_for(|e| *e).await;
}

/// Start accepting the kernel's tunnel connections (a task of the
/// relay's, aborted with it).
pub(super) fn start(shared: &Shared) {
    let listener = shared
        .borrow_mut()
        .kernel
        .as_mut()
        .and_then(|k| k.listener.take());
    let Some(listener) = listener else {
        return;
    };
    let task = spawn_local(accept_loop(shared.clone(), listener));
    shared.borrow_mut().tasks.push(task);
}

async fn accept_loop(shared: Shared, listener: TcpListener) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, most likely: wait, as the SOCKS
                // listener does.
                debug!("accepting a tunnel connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let SocketAddr::V4(peer) = peer else {
            continue;
        };
        let started = match shared.borrow_mut().kernel.as_mut() {
            Some(kernel) => kernel.conn_start(*peer.ip()),
            None => Err(None),
        };
        let task = match started {
            Ok((set, ended)) => {
                let conn = Conn {
                    shared: shared.clone(),
                    set,
                };
                spawn_local(serve_conn(conn, tcp, ended))
            }
            Err(Some(reason)) => spawn_local(answer(tcp, reason)),
            Err(None) => {
                let _ = tcp.set_zero_linger();
                continue;
            }
        };
        let mut st = shared.borrow_mut();
        st.tasks.retain(|t| !t.is_finished());
        st.tasks.push(task);
    }
}

/// Refuse a connection with `reason`.
async fn answer(mut tcp: TcpStream, reason: EndReason) {
    let _ = tcp.write_all(&[u8::from(reason)]).await;
    let _ = tcp.shutdown().await;
}

/// Read a connection's target, connect it under the exit's rules, answer,
/// and splice the two until both end or the set does.
async fn serve_conn(conn: Conn, mut tcp: TcpStream, ended: watch::Receiver<bool>) {
    let (target, early) = match tokio::time::timeout(TARGET_TIMEOUT, read_target(&mut tcp)).await {
        Ok(Ok(read)) => read,
        Ok(Err(e)) => {
            debug!(set = conn.set, "tunnel connection without a target: {e}");
            let _ = tcp.set_zero_linger();
            return;
        }
        Err(_) => {
            debug!(
                set = conn.set,
                "tunnel connection's target not sent in time"
            );
            let _ = tcp.set_zero_linger();
            return;
        }
    };
    let Some((host, port)) = split_target(&target) else {
        return answer(tcp, EndReason::TORPROTOCOL).await;
    };
    let shared = conn.shared.clone();
    let job = {
        let mut st = shared.borrow_mut();
        let State {
            exit, connecting, ..
        } = &mut *st;
        match exit.as_ref() {
            Some((_, job, max)) if *connecting < *max => {
                *connecting += 1;
                Some(job.clone())
            }
            _ => None,
        }
    };
    let Some(job) = job else {
        return answer(tcp, EndReason::RESOURCELIMIT).await;
    };
    let connected = tokio::select! {
        r = connect_target(&host, port, &job) => Some(r),
        () = set_ended(ended.clone()) => None,
    };
    shared.borrow_mut().connecting -= 1;
    let target_tcp = match connected {
        Some(Ok(target_tcp)) => target_tcp,
        Some(Err(f)) => {
            debug!(set = conn.set, reason = ?f.reason, error = ?f.error, "tunnel connect failed");
            return answer(tcp, f.reason).await;
        }
        None => {
            let _ = tcp.set_zero_linger();
            return;
        }
    };
    let mut target_tcp = target_tcp;
    let started = async {
        tcp.write_all(&[0]).await?;
        target_tcp.write_all(&early).await
    };
    if started.await.is_err() {
        let _ = tcp.set_zero_linger();
        let _ = target_tcp.set_zero_linger();
        return;
    }
    let end = splice(tcp, target_tcp, set_ended(ended)).await;
    debug!(set = conn.set, ?end, "tunnel connection done");
    drop(conn);
    flush(&shared);
}

/// A connection's target and the bytes that came after it.
async fn read_target(tcp: &mut TcpStream) -> io::Result<(String, Vec<u8>)> {
    let mut buf = Vec::with_capacity(256);
    loop {
        match parse_stream_preamble(&buf) {
            Ok(Some((target, used))) => return Ok((target, buf.split_off(used))),
            Ok(None) => {}
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
        }
        if tcp.read_buf(&mut buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}
