//! What the UDP sockets of dtls-utcp and the datagram link share: binding
//! one for tokio, and taking a batch of datagrams per wake.

use std::net::SocketAddr;

use tokio::net::UdpSocket;

use crate::Error;

/// Datagrams taken per wake before a driver sends what they caused.
pub(crate) const RECV_BATCH: usize = 64;
/// Largest datagram read.
pub(crate) const MAX_DATAGRAM: usize = 65_536;

/// Bind a non-blocking UDP socket at `addr` for tokio (needs a runtime);
/// `what` names it in errors.
pub(crate) fn bind(addr: SocketAddr, what: &'static str) -> Result<(UdpSocket, SocketAddr), Error> {
    let io = |source| Error::Io { what, source };
    let std_socket = std::net::UdpSocket::bind(addr).map_err(io)?;
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
