//! The kernel tunnel's I/O (`onionlab_dgram::tunnel`, seed 004's TUN
//! mode): the TUN device a client or an exit hands its kernel's TCP
//! segments through, and the choice of which TCP a set runs.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use onionlab_dgram::tunnel::{NODE_ADDR, TUNNEL_MTU, TUNNEL_NET};
use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;

use crate::tcp::TcpCongestion;

/// The TUN device's name (one per network namespace: a node that needs
/// two fails to open the second).
pub const TUN_NAME: &str = "oldgram0";

/// Which TCP runs end to end over a client's datagram sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndToEnd {
    /// onionlab's user-space TCP (smoltcp), one lane per stream: no
    /// privileges needed.
    #[default]
    User,
    /// The nodes' kernel TCP through TUN devices, as the paper's
    /// mUDP-OR: needs `CAP_NET_ADMIN` at the client and the exit. An
    /// exit with it serves both kinds of sets.
    Kernel,
}

/// `[link.datagram]`: the datagram transports' settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatagramSettings {
    /// The TCP that runs end to end (`"user"` or `"kernel"`).
    pub end_to_end: EndToEnd,
}

/// A node's TUN device for kernel sets: [`NODE_ADDR`] in [`TUNNEL_NET`],
/// MTU [`TUNNEL_MTU`], no packet information header, no offloads (each
/// packet one segment), non-blocking under tokio's reactor.
pub struct TunDevice {
    device: AsyncFd<tun_rs::SyncDevice>,
    read: AtomicU64,
    written: AtomicU64,
    write_dropped: AtomicU64,
}

/// A kernel set's connection with no byte either way for this long is
/// probed (TCP keep-alive, as the user-space lanes' `STREAM_KEEP_ALIVE`):
/// a peer that forgot it answers with a reset, so a connection whose
/// reset was lost on the set ends anyway.
pub const TUNNEL_KEEP_ALIVE: Duration = Duration::from_secs(30);
/// Keep-alive probes 10 s apart, 3 of them, before the kernel gives up.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEP_ALIVE_PROBES: u32 = 3;

/// A TCP socket for a kernel set's connection (the client's, or the
/// exit's listener, whose connections inherit its options): IPv4,
/// `congestion`, keep-alive after [`TUNNEL_KEEP_ALIVE`], and bound to
/// [`TUN_NAME`], so it takes packets from the tunnel only, never for its
/// address from another interface.
///
/// # Errors
///
/// The system's (binding to a device needs `CAP_NET_RAW`).
pub fn tunnel_socket(congestion: &TcpCongestion) -> io::Result<tokio::net::TcpSocket> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    congestion.apply(&socket)?;
    let sock = socket2::SockRef::from(&socket);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TUNNEL_KEEP_ALIVE)
        .with_interval(KEEP_ALIVE_INTERVAL)
        .with_retries(KEEP_ALIVE_PROBES);
    sock.set_tcp_keepalive(&keepalive)?;
    sock.bind_device(Some(TUN_NAME.as_bytes()))?;
    Ok(socket)
}

/// What a node's kernel sets did, for the log when it stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelSetStats {
    /// Connections opened through a set (client), or accepted for one
    /// (exit).
    pub connections: u64,
    /// (Exits) connections refused: over a limit, or from no set.
    pub refused: u64,
    /// Packets or segments the tunnel's rules dropped.
    pub filtered: u64,
    /// The TUN device's counts.
    pub tun: TunStats,
}

impl std::fmt::Display for KernelSetStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tun = &self.tun;
        write!(
            f,
            "connections={} refused={} filtered={} tun_read={} tun_written={} tun_write_dropped={}",
            self.connections, self.refused, self.filtered, tun.read, tun.written, tun.write_dropped
        )
    }
}

/// What a TUN device moved, for the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TunStats {
    /// Packets the kernel sent into it.
    pub read: u64,
    /// Packets handed to the kernel.
    pub written: u64,
    /// Packets the kernel did not take (its queue full).
    pub write_dropped: u64,
}

impl std::fmt::Debug for TunDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TunDevice")
    }
}

impl TunDevice {
    /// Create [`TUN_NAME`] in this network namespace, up, with the
    /// tunnel's address and MTU (its connected route takes the tunnel's
    /// network). Must run inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// The system's, with what was tried: without `CAP_NET_ADMIN`, or
    /// when the namespace has the device already.
    pub fn open() -> io::Result<TunDevice> {
        let context = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!(
                    "creating the TUN device {TUN_NAME} ({NODE_ADDR}/{}, needs CAP_NET_ADMIN): {e}",
                    TUNNEL_NET.1
                ),
            )
        };
        let device = tun_rs::DeviceBuilder::new()
            .name(TUN_NAME)
            .packet_information(false)
            .ipv4(NODE_ADDR, TUNNEL_NET.1, None)
            .mtu(TUNNEL_MTU as u16)
            .build_sync()
            .map_err(context)?;
        device.set_nonblocking(true).map_err(context)?;
        // SAFETY: the device owns its file descriptor, and nothing
        // replaces or closes it while the `AsyncFd` owns the device.
        let device = unsafe { AsyncFd::register(device) }.map_err(|e| context(e.into()))?;
        Ok(TunDevice {
            device,
            read: AtomicU64::new(0),
            written: AtomicU64::new(0),
            write_dropped: AtomicU64::new(0),
        })
    }

    /// The next packet the kernel sent into the device.
    ///
    /// # Errors
    ///
    /// The device's read error.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut ready = self.device.readable().await?;
            match ready.try_io(|d| d.get_ref().recv(buf)) {
                Ok(read) => {
                    self.read.fetch_add(1, Ordering::Relaxed);
                    return read;
                }
                Err(_would_block) => continue,
            }
        }
    }

    /// Hand a packet to the kernel, without waiting: a full device drops
    /// it, as a full router queue would (the kernel's TCP resends).
    pub fn send(&self, packet: &[u8]) {
        match self.device.get_ref().send(packet) {
            Ok(_) => self.written.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                if e.kind() != io::ErrorKind::WouldBlock {
                    tracing::debug!("TUN write failed: {e}");
                }
                self.write_dropped.fetch_add(1, Ordering::Relaxed)
            }
        };
    }

    /// What it moved so far.
    pub fn stats(&self) -> TunStats {
        TunStats {
            read: self.read.load(Ordering::Relaxed),
            written: self.written.load(Ordering::Relaxed),
            write_dropped: self.write_dropped.load(Ordering::Relaxed),
        }
    }
}
