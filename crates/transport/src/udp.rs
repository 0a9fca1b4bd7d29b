//! What the UDP sockets of dtls-utcp and the datagram link share: binding
//! one for tokio, and taking a batch of datagrams per wake.

use std::net::SocketAddr;

use tokio::net::UdpSocket;

use crate::Error;

/// Datagrams taken per wake before a driver sends what they caused.
pub(crate) const RECV_BATCH: usize = 64;
/// Largest datagram read.
pub(crate) const MAX_DATAGRAM: usize = 65_536;

/// Socket buffers asked of the kernel for every UDP socket the transports
/// bind (QUIC's endpoints, dtls-utcp's and the datagram link's sockets),
/// each direction. The kernel's default (`net.core.rmem_default`, about
/// 208 KiB) is far below what TCP's autotuning gives a TLS link
/// (`net.ipv4.tcp_rmem`, up to 32 MiB here), and one socket serves every
/// peer: with the default, a burst the process does not read at once is
/// dropped by the host and seen as loss (the lab counts such drops as
/// `udp_rcvbuf_errors`). The kernel caps the request at
/// `net.core.rmem_max` / `wmem_max`.
pub const UDP_SOCKET_BUFFER: usize = 8 << 20;

/// A blocking UDP socket bound to `addr` with [`UDP_SOCKET_BUFFER`]
/// buffers (best effort: a kernel that refuses the size leaves its
/// default).
pub(crate) fn socket(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    for (what, r) in [
        ("receive", socket.set_recv_buffer_size(UDP_SOCKET_BUFFER)),
        ("send", socket.set_send_buffer_size(UDP_SOCKET_BUFFER)),
    ] {
        if let Err(e) = r {
            tracing::debug!("UDP {what} buffer left at the kernel's default: {e}");
        }
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Bind a non-blocking UDP socket at `addr` with [`UDP_SOCKET_BUFFER`]
/// buffers for tokio (needs a runtime); `what` names it in errors.
pub(crate) fn bind(addr: SocketAddr, what: &'static str) -> Result<(UdpSocket, SocketAddr), Error> {
    let io = |source| Error::Io { what, source };
    let std_socket = socket(addr).map_err(io)?;
    std_socket.set_nonblocking(true).map_err(io)?;
    let socket = UdpSocket::from_std(std_socket).map_err(io)?;
    let local = socket.local_addr().map_err(io)?;
    Ok((socket, local))
}

/// Hand `take` the datagram just received (`first`: its sender and
/// length in `buf`), then whatever else is waiting, up to [`RECV_BATCH`]
/// in all.
pub(crate) fn take_batch(
    socket: &UdpSocket,
    buf: &mut [u8],
    first: (SocketAddr, usize),
    mut take: impl FnMut(SocketAddr, &[u8]),
) {
    let (from, n) = first;
    take(from, &buf[..n]);
    for _ in 1..RECV_BATCH {
        match socket.try_recv_from(buf) {
            Ok((n, from)) => take(from, &buf[..n]),
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sysctl(name: &str) -> usize {
        std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Every transport's UDP socket gets more buffer than the kernel's
    /// default, as much as the kernel allows up to the request: QUIC's
    /// endpoint and the tokio sockets of dtls-utcp and the datagram link.
    #[tokio::test]
    async fn udp_sockets_get_large_buffers() {
        let (default, max) = (sysctl("rmem_default"), sysctl("rmem_max"));
        if max <= default {
            eprintln!("SKIPPED: net.core.rmem_max {max} is not above the default {default}");
            return;
        }
        // Linux doubles the value asked (for bookkeeping) after capping it.
        let expected = 2 * UDP_SOCKET_BUFFER.min(max);
        let plain = socket("127.0.0.1:0".parse().expect("addr")).expect("socket");
        let (tokio_socket, _) = bind("127.0.0.1:0".parse().expect("addr"), "test").expect("bind");
        for got in [
            socket2::SockRef::from(&plain).recv_buffer_size(),
            socket2::SockRef::from(&tokio_socket).recv_buffer_size(),
        ] {
            let got = got.expect("SO_RCVBUF");
            assert_eq!(got, expected, "rmem_default {default}, rmem_max {max}");
        }
    }
}
