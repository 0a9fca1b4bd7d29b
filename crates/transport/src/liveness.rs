//! Whether the peer of a link made of several TCP connections (pctcp,
//! torchestra) is still there, judged over all of the link's connections
//! together.
//!
//! Kernel keep-alive judges each connection alone: after a minute
//! without traffic it sends a probe every [`KEEPALIVE_INTERVAL`] and kills
//! the connection after three unanswered ones. On a link whose circuits
//! have connections of their own, the connection that carries no circuit
//! (pctcp's main one, an idle torchestra light or heavy one) is the idle
//! one; when the path's bottleneck queue is full of its siblings' packets,
//! its few probes can all be dropped, the kernel declares it dead while its
//! siblings carry data, and its end takes the whole link and every circuit
//! on it (seen in the seed 003 runs). So these links turn kernel
//! keep-alive off and use this instead:
//!
//! - **Heartbeat.** Every [`LivenessTiming::heartbeat`] each side queues a
//!   PADDING cell on its main connection, unless that connection already
//!   has something queued. TCP retransmits a lost heartbeat, so loss makes
//!   it late, not lost; the receiver drops it like any link padding.
//! - **Silence.** The link fails when none of its connections delivered a
//!   byte for [`LivenessTiming::silence_limit`] while we were reading:
//!   time spent not reading because the node is behind (back-pressure)
//!   does not count, since the peer's bytes then wait in our kernel.
//!
//! A peer whose host vanished is noticed within the silence limit, busy
//! link or idle (kernel keep-alive needed 90 s on an idle connection, and
//! a connection with data in flight took TCP's retransmission limit, about
//! 15 minutes); so is a peer process that stopped without closing its
//! sockets, which kernel keep-alive never noticed.
//!
//! [`KEEPALIVE_INTERVAL`]: crate::tls::KEEPALIVE_INTERVAL

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use onionlab_cell::codec::CellCodec;
use tokio::io::{AsyncRead, ReadBuf};

use crate::sendbuf::{Owner, SendBuffer};
use crate::Error;

/// Default [`LivenessTiming::heartbeat`]: tor's keep-alive probe interval
/// on its TLS connections.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
/// Default [`LivenessTiming::silence_limit`]: six heartbeats, so that a
/// heartbeat TCP retransmitted several times over a lossy, full path
/// still arrives in time.
pub const DEFAULT_SILENCE_LIMIT: Duration = Duration::from_secs(60);

/// The timers of a multi-connection link's liveness check. The silence
/// limit should be several heartbeats, or an idle link fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessTiming {
    /// How often each side sends a heartbeat on its main connection.
    pub heartbeat: Duration,
    /// A link that received nothing on any of its connections for this
    /// long fails.
    pub silence_limit: Duration,
}

impl Default for LivenessTiming {
    fn default() -> Self {
        LivenessTiming {
            heartbeat: DEFAULT_HEARTBEAT,
            silence_limit: DEFAULT_SILENCE_LIMIT,
        }
    }
}

/// When a link last heard from its peer, shared by its read tasks and its
/// watchdog.
pub(crate) struct Liveness {
    epoch: Instant,
    /// Milliseconds after `epoch` of the last byte received (or of the
    /// end of the last pause).
    last_heard_ms: AtomicU64,
    /// Read tasks waiting for the node (back-pressure), not reading.
    paused: AtomicUsize,
}

impl Liveness {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Liveness {
            epoch: Instant::now(),
            last_heard_ms: AtomicU64::new(0),
            paused: AtomicUsize::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Bytes arrived on one of the link's connections.
    pub(crate) fn heard(&self) {
        self.last_heard_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// A read task stops reading until the returned guard is dropped
    /// (it waits for the node): silence meanwhile is ours, not the peer's.
    pub(crate) fn pause(self: &Arc<Self>) -> Paused {
        self.paused.fetch_add(1, Ordering::AcqRel);
        Paused(self.clone())
    }

    /// How long nothing arrived while every read task was reading;
    /// `None` while one is paused.
    fn silence(&self) -> Option<Duration> {
        if self.paused.load(Ordering::Acquire) > 0 {
            return None;
        }
        let last = self.last_heard_ms.load(Ordering::Relaxed);
        Some(Duration::from_millis(self.now_ms().saturating_sub(last)))
    }
}

/// A paused read task (see [`Liveness::pause`]); its end counts as
/// hearing from the peer, so the silence is measured from the resumption.
pub(crate) struct Paused(Arc<Liveness>);

impl Drop for Paused {
    fn drop(&mut self) {
        self.0.heard();
        self.0.paused.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection's read half that tells the link's [`Liveness`] whenever
/// bytes arrive.
pub(crate) struct Heard<R> {
    inner: R,
    liveness: Arc<Liveness>,
}

impl<R> Heard<R> {
    pub(crate) fn new(inner: R, liveness: Arc<Liveness>) -> Self {
        Heard { inner, liveness }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Heard<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.liveness.heard();
        }
        polled
    }
}

/// Where a link's heartbeats go.
pub(crate) struct Heartbeat<'a> {
    /// The main connection's buffer.
    pub(crate) on: &'a SendBuffer,
    /// The link's count of buffered bytes.
    pub(crate) buffered: &'a AtomicUsize,
    /// The link's version (cell framing).
    pub(crate) link_version: u16,
}

/// The link's watchdog: every heartbeat, a PADDING cell on the main
/// connection if it has nothing queued; the link fails through `owner`
/// once it has heard nothing for the silence limit (`connections` counts
/// its connections for the error). Runs until the link's tasks are
/// aborted.
pub(crate) async fn watchdog<O: Owner>(
    owner: &O,
    liveness: &Liveness,
    timing: LivenessTiming,
    heartbeat: Heartbeat<'_>,
    connections: impl Fn() -> usize + Send,
) {
    let mut codec = CellCodec::new(heartbeat.link_version);
    // Checked at least four times per silence limit, so a dead peer is
    // noticed at most a quarter late.
    let tick = timing
        .heartbeat
        .min(timing.silence_limit / 4)
        .max(Duration::from_millis(10));
    let mut next_heartbeat = tokio::time::Instant::now() + timing.heartbeat;
    loop {
        tokio::time::sleep(tick).await;
        if let Some(silence) = liveness.silence() {
            if silence >= timing.silence_limit {
                owner.fail(Error::Silent {
                    peer: owner.peer_addr(),
                    silence,
                    connections: connections(),
                });
                return;
            }
        }
        if tokio::time::Instant::now() >= next_heartbeat {
            heartbeat
                .on
                .queue_padding_if_idle(&mut codec, heartbeat.buffered);
            next_heartbeat += timing.heartbeat;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_is_measured_from_the_last_byte_and_not_while_paused() {
        let l = Liveness::new();
        std::thread::sleep(Duration::from_millis(30));
        let s = l.silence().expect("not paused");
        assert!(s >= Duration::from_millis(30), "{s:?}");
        l.heard();
        assert!(l.silence().expect("not paused") < Duration::from_millis(30));
        let p = l.pause();
        assert_eq!(l.silence(), None);
        std::thread::sleep(Duration::from_millis(30));
        drop(p);
        assert!(l.silence().expect("resumed") < Duration::from_millis(30));
    }

    #[tokio::test]
    async fn heard_wraps_a_reader() {
        let l = Liveness::new();
        std::thread::sleep(Duration::from_millis(30));
        let data: &[u8] = b"abc";
        let mut r = Heard::new(data, l.clone());
        let mut out = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut r, &mut out)
            .await
            .expect("read");
        assert_eq!(out, b"abc");
        assert!(l.silence().expect("not paused") < Duration::from_millis(30));
    }
}
