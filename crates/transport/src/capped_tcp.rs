//! TCP streams whose every write call hands the kernel at most
//! [`MAX_TCP_WRITE`] bytes.
//!
//! tokio takes a short write on a TCP socket as the sign that the send
//! buffer is full: it clears the socket's write readiness and waits for
//! the next edge. Linux makes a write short only then. The Shadow
//! simulator's TCP takes at most 65535 bytes in one call whatever the
//! room, and raises no edge while the socket stays writable, so a writer
//! that handed it more waits for ever. TLS hands the socket all that
//! rustls has queued in one vectored write, which under load is more.
//! Capped, a write is short only when the buffer is full, under every
//! engine; 64 KiB per system call (44 full segments) costs Linux nothing
//! measurable. tokio has no such cap, so this wrapper is written here.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Most bytes one write call hands a TCP socket: what Shadow's TCP takes.
pub const MAX_TCP_WRITE: usize = 65_535;

/// A TCP stream whose writes are at most [`MAX_TCP_WRITE`] bytes each.
#[derive(Debug)]
pub struct CappedTcp {
    inner: TcpStream,
}

impl CappedTcp {
    /// Caps `inner`'s writes.
    pub fn new(inner: TcpStream) -> Self {
        CappedTcp { inner }
    }

    /// The TCP stream (for its socket options and addresses).
    pub fn get_ref(&self) -> &TcpStream {
        &self.inner
    }
}

/// How many of `bufs`, from the first, fit in [`MAX_TCP_WRITE`] together.
fn slices_within_cap(bufs: &[IoSlice<'_>]) -> usize {
    let mut total = 0usize;
    bufs.iter()
        .take_while(|b| {
            total = total.saturating_add(b.len());
            total <= MAX_TCP_WRITE
        })
        .count()
}

impl AsyncRead for CappedTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for CappedTcp {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = buf.len().min(MAX_TCP_WRITE);
        Pin::new(&mut self.inner).poll_write(cx, &buf[..n])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match slices_within_cap(bufs) {
            // The first slice alone is larger: a part of it.
            0 => match bufs.iter().find(|b| !b.is_empty()) {
                Some(first) => {
                    let n = first.len().min(MAX_TCP_WRITE);
                    Pin::new(&mut self.inner).poll_write(cx, &first[..n])
                }
                None => Poll::Ready(Ok(0)),
            },
            k => Pin::new(&mut self.inner).poll_write_vectored(cx, &bufs[..k]),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn vectored_writes_take_the_slices_that_fit() {
        let big = vec![0u8; MAX_TCP_WRITE + 1];
        let half = vec![0u8; MAX_TCP_WRITE / 2];
        assert_eq!(slices_within_cap(&[IoSlice::new(&big)]), 0);
        assert_eq!(
            slices_within_cap(&[IoSlice::new(&half), IoSlice::new(&half)]),
            2
        );
        let three = [
            IoSlice::new(&half),
            IoSlice::new(&half),
            IoSlice::new(&half),
        ];
        assert_eq!(slices_within_cap(&three), 2);
    }

    /// A write of a megabyte is taken at most 65535 bytes at a time, and
    /// every byte arrives.
    #[tokio::test]
    async fn a_large_write_arrives_whole_in_capped_calls() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let sender = tokio::spawn(async move {
            let tcp = TcpStream::connect(addr).await.expect("connect");
            let mut capped = CappedTcp::new(tcp);
            let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
            let first = capped.write(&data).await.expect("write");
            assert!(first <= MAX_TCP_WRITE, "{first}");
            capped.write_all(&data[first..]).await.expect("write_all");
            capped.shutdown().await.expect("shutdown");
        });
        let (mut rx, _) = listener.accept().await.expect("accept");
        let mut got = Vec::new();
        rx.read_to_end(&mut got).await.expect("read");
        sender.await.expect("sender");
        assert_eq!(got.len(), 1 << 20);
        assert!(got.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    }
}
