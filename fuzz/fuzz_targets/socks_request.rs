//! Arbitrary bytes as everything an application sends to the client's SOCKS
//! port, through the server side of the handshake the client runs
//! (`onionlab_client::socks::handshake_for_fuzzing`, the same code as on a
//! TCP socket, without the time limit): SOCKS4/4a requests, SOCKS5
//! greetings, username/password sub-negotiation and requests.
//!
//! The input is delivered twice: in reads as large as the handshake asks
//! for, and in reads of a few bytes (size from the first byte). Checked
//! besides "no panic":
//! * the handshake never waits on a stream that has data (the in-memory
//!   peer is always ready, so the future finishes on its first poll);
//! * whole and chunked delivery agree: the same request (or the same
//!   error) and the same reply bytes;
//! * an accepted request is a CONNECT whose reply encodes; the bytes read
//!   after it (optimistic data) are exactly the input that followed the
//!   request, never more than was read, and at most one SOCKS buffer
//!   (1024 bytes); the request itself took the same bytes both ways;
//! * a "closed during the handshake" error only once the input ran out;
//! * the replies written are a few short messages.
#![no_main]

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};

use libfuzzer_sys::fuzz_target;
use onionlab_client::socks::{handshake_for_fuzzing, HandshakeError};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tor_socksproto::{SocksCmd, SocksStatus};

/// `tor-socksproto`'s buffer size (`SOCKS_BUF_LEN`).
const SOCKS_BUF: usize = 1024;

/// The application's side of the socket: hands out `input` in reads of at
/// most `chunk` bytes, then EOF; records what the handshake writes.
struct Peer<'a> {
    input: &'a [u8],
    pos: usize,
    chunk: usize,
    written: Vec<u8>,
}

impl AsyncRead for Peer<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = (self.input.len() - self.pos)
            .min(buf.remaining())
            .min(self.chunk);
        let start = self.pos;
        buf.put_slice(&self.input[start..start + n]);
        self.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Peer<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.written.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// The request (`Debug`) or the error message.
    result: Result<String, String>,
    /// Input bytes the request took (accepted requests only).
    consumed: usize,
    /// Replies written.
    written: Vec<u8>,
}

fn run(input: &[u8], chunk: usize) -> Outcome {
    let mut peer = Peer {
        input,
        pos: 0,
        chunk,
        written: Vec::new(),
    };
    let result = {
        let mut fut = pin!(handshake_for_fuzzing(&mut peer));
        let mut cx = Context::from_waker(Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(r) => r,
            Poll::Pending => panic!("the handshake waits although the peer is ready"),
        }
    };
    let read = peer.pos;
    let (result, consumed) = match result {
        Ok((request, early)) => {
            assert_eq!(
                request.command(),
                SocksCmd::CONNECT,
                "a command other than CONNECT was accepted"
            );
            assert!(
                early.len() <= SOCKS_BUF,
                "{} bytes of early data",
                early.len()
            );
            assert!(early.len() <= read, "more early data than was read");
            let consumed = read - early.len();
            assert_eq!(
                &input[consumed..read],
                &early[..],
                "early data is not the input after the request"
            );
            // The success reply encodes.
            request
                .reply(SocksStatus::SUCCEEDED, None)
                .expect("the reply to an accepted request encodes");
            (Ok(format!("{request:?}")), consumed)
        }
        Err(e) => {
            if matches!(e, HandshakeError::Closed) {
                assert_eq!(read, input.len(), "EOF reported with input left");
            }
            (Err(e.to_string()), 0)
        }
    };
    // Method selection, authentication status, one reply (at most an
    // IPv6 bound address: 22 bytes).
    assert!(
        peer.written.len() <= 2 + 2 + 22,
        "{} reply bytes",
        peer.written.len()
    );
    Outcome {
        result,
        consumed,
        written: peer.written,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&setup, input)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(setup % 16) + 1;
    let whole = run(input, usize::MAX);
    let chunked = run(input, chunk);
    assert_eq!(
        whole, chunked,
        "delivery in {chunk}-byte reads changes the outcome"
    );
});
