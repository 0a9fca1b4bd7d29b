//! QUIC's UDP I/O with one plain `sendto`/`recvfrom` per datagram, for
//! where quinn's own path cannot run: the Shadow simulator implements
//! neither the socket options quinn-udp sets (`IP_PKTINFO`, ECN, GSO) nor
//! `sendmmsg`/`recvmmsg`, and a relay's QUIC endpoint fails to bind there
//! ("Protocol not available"). quinn lets a runtime supply its own socket
//! type; quinn has no such plain socket of its own, so this one is written
//! here. It sends and receives one datagram per system call, without ECN
//! or the destination address (the endpoint binds one address), so it
//! costs more CPU per packet than quinn's path: it is for engines that
//! model no CPU, not for measuring CPU.

use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncTimer, AsyncUdpSocket, Runtime, TokioRuntime, UdpPoller};
use serde::{Deserialize, Serialize};

/// How a QUIC endpoint does its UDP I/O.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UdpIo {
    /// quinn's own (quinn-udp: batched system calls, GSO/GRO, ECN).
    #[default]
    Batched,
    /// One `sendto`/`recvfrom` per datagram and no socket options
    /// (`PlainUdpRuntime`): what the Shadow simulator can run.
    Plain,
}

/// The tokio runtime for quinn, with [`PlainUdpSocket`]s.
#[derive(Debug)]
pub struct PlainUdpRuntime;

impl Runtime for PlainUdpRuntime {
    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        TokioRuntime.new_timer(at)
    }

    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        TokioRuntime.spawn(future);
    }

    fn wrap_udp_socket(&self, socket: std::net::UdpSocket) -> io::Result<Arc<dyn AsyncUdpSocket>> {
        socket.set_nonblocking(true)?;
        Ok(Arc::new(PlainUdpSocket {
            io: tokio::net::UdpSocket::from_std(socket)?,
        }))
    }

    fn now(&self) -> Instant {
        TokioRuntime.now()
    }
}

/// A UDP socket quinn drives with one system call per datagram.
#[derive(Debug)]
pub struct PlainUdpSocket {
    io: tokio::net::UdpSocket,
}

impl AsyncUdpSocket for PlainUdpSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(WritablePoller {
            socket: self,
            waiting: None,
        })
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        // One datagram per call: quinn asks for segments only up to
        // `max_transmit_segments` (1), but a segmented transmit is still
        // sent whole, segment by segment.
        let size = transmit
            .segment_size
            .unwrap_or(transmit.contents.len())
            .max(1);
        for datagram in transmit.contents.chunks(size) {
            loop {
                match self.io.try_send_to(datagram, transmit.destination) {
                    Ok(_) => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(e),
                    // As quinn's own path does: a datagram the network
                    // refuses is lost, not the connection's end (QUIC
                    // recovers it).
                    Err(e) => {
                        tracing::debug!(to = %transmit.destination, "UDP send failed: {e}");
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let (Some(buf), Some(slot)) = (bufs.first_mut(), meta.first_mut()) else {
            return Poll::Ready(Ok(0));
        };
        loop {
            ready!(self.io.poll_recv_ready(cx))?;
            match self.io.try_recv_from(buf) {
                Ok((len, addr)) => {
                    *slot = RecvMeta {
                        addr,
                        len,
                        stride: len,
                        ecn: None,
                        dst_ip: None,
                    };
                    return Poll::Ready(Ok(1));
                }
                // Readiness was stale: poll again, which registers.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                // As quinn's own path does: an error on one datagram (an
                // ICMP report of an earlier send, say) does not end the
                // endpoint; the next datagram is read.
                Err(e) => tracing::debug!("UDP receive failed: {e}"),
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.local_addr()
    }
}

/// The future of one wait for writability.
type Writable = Pin<Box<dyn Future<Output = io::Result<()>> + Send + Sync>>;

/// Waits for a [`PlainUdpSocket`] to be writable; each poller keeps its
/// own wait, so every task waiting is woken (tokio's `writable` wakes all
/// its waiters, unlike `poll_send_ready`, which keeps the last one).
struct WritablePoller {
    socket: Arc<PlainUdpSocket>,
    waiting: Option<Writable>,
}

impl fmt::Debug for WritablePoller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WritablePoller").finish_non_exhaustive()
    }
}

impl UdpPoller for WritablePoller {
    fn poll_writable(mut self: Pin<&mut Self>, cx: &mut Context) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let socket = this.socket.clone();
        let waiting = this
            .waiting
            .get_or_insert_with(|| Box::pin(async move { socket.io.writable().await }));
        let result = waiting.as_mut().poll(cx);
        if result.is_ready() {
            this.waiting = None;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A datagram in is one datagram with its sender; a segmented
    /// transmit out is its datagrams, one by one.
    #[tokio::test]
    async fn the_plain_socket_carries_single_datagrams() {
        let runtime: Arc<dyn Runtime> = Arc::new(PlainUdpRuntime);
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let wrapped = runtime.wrap_udp_socket(socket).expect("wrap");
        let addr = wrapped.local_addr().expect("addr");
        let peer = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("peer");
        peer.send_to(b"hello", addr).await.expect("send");
        let mut buf = [0u8; 64];
        let mut meta = [RecvMeta {
            addr,
            len: 0,
            stride: 0,
            ecn: None,
            dst_ip: None,
        }];
        let n = std::future::poll_fn(|cx| {
            let mut bufs = [IoSliceMut::new(&mut buf)];
            wrapped.poll_recv(cx, &mut bufs, &mut meta)
        })
        .await
        .expect("recv");
        assert_eq!(n, 1);
        assert_eq!(&buf[..meta[0].len], b"hello");
        let peer_addr = peer.local_addr().expect("peer addr");
        assert_eq!(meta[0].addr, peer_addr);

        let transmit = Transmit {
            destination: peer_addr,
            ecn: None,
            contents: b"abcdefg",
            segment_size: Some(3),
            src_ip: None,
        };
        wrapped.try_send(&transmit).expect("send");
        let mut got = Vec::new();
        for _ in 0..3 {
            let (n, from) = peer.recv_from(&mut buf).await.expect("recv");
            assert_eq!(from, addr);
            got.push(buf[..n].to_vec());
        }
        assert_eq!(got, [b"abc".to_vec(), b"def".to_vec(), b"g".to_vec()]);
    }
}
