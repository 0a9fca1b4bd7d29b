//! Decoded cells on their way from a link's connection (or stream) tasks
//! to its reader, and the link's failure: what the transports with a lane
//! per circuit share (pctcp, dtls-utcp, quic).
//!
//! The queue is bounded: a task whose batch finds it full waits (the
//! transport may count that, see [`Inbox::deliver`]), so a node that falls
//! behind stops reading its sockets and holds the peer up through flow
//! control instead of growing memory. A failure is reported before the
//! cells still queued (the link is broken, they are not worth waiting
//! for), except a clean end ([`Error::Closed`]), which comes after them.

use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Mutex, MutexGuard};

use onionlab_cell::chan::AnyChanCell;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, Notify};

use crate::Error;

/// Batches waiting for the reader, at most (then the tasks wait).
const QUEUE: usize = 64;

/// Decoded cells of one connection or stream.
struct Batch {
    cells: Vec<AnyChanCell>,
    /// Their size as the transport counts it, in [`Inbox::bytes`] until
    /// read.
    bytes: usize,
}

/// The tasks' side of a link's inbox, shared by its tasks and its reader.
pub(crate) struct Inbox {
    tx: mpsc::Sender<Batch>,
    /// Bytes of the cells queued.
    bytes: AtomicUsize,
    failure: Mutex<Option<Error>>,
    failed: Notify,
}

/// The reader's side of a link's inbox.
pub(crate) struct InboxReader {
    rx: mpsc::Receiver<Batch>,
    /// The link's end was reported: every later read says it ended.
    ended: bool,
}

impl Inbox {
    /// A new, empty inbox and its reading side.
    pub(crate) fn new() -> (Inbox, InboxReader) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let inbox = Inbox {
            tx,
            bytes: AtomicUsize::new(0),
            failure: Mutex::new(None),
            failed: Notify::new(),
        };
        (inbox, InboxReader { rx, ended: false })
    }

    fn failure(&self) -> MutexGuard<'_, Option<Error>> {
        self.failure.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hand `cells` (`bytes` as the transport counts them) to the reader;
    /// while the queue is full, the value `blocked` returns is held (a
    /// guard that pauses a liveness watch, or counts a stream whose data
    /// the transport now holds). False if the reader is gone.
    pub(crate) async fn deliver<G>(
        &self,
        cells: Vec<AnyChanCell>,
        bytes: usize,
        blocked: impl FnOnce() -> G,
    ) -> bool {
        self.bytes.fetch_add(bytes, AtomicOrdering::Relaxed);
        let sent = match self.tx.try_send(Batch { cells, bytes }) {
            Ok(()) => true,
            Err(TrySendError::Full(batch)) => {
                let _blocked = blocked();
                self.tx.send(batch).await.is_ok()
            }
            Err(TrySendError::Closed(_)) => false,
        };
        if !sent {
            self.bytes.fetch_sub(bytes, AtomicOrdering::Relaxed);
        }
        sent
    }

    /// The link ended with `e`: the reader reports it once it has read
    /// what is queued if `e` is a clean end, at once otherwise. Only the
    /// first end counts (a failure that follows another is its
    /// consequence).
    pub(crate) fn fail(&self, e: Error) {
        self.failure().get_or_insert(e);
        self.failed.notify_one();
    }

    /// Bytes of the cells queued, as the transport counted them.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(AtomicOrdering::Relaxed)
    }
}

impl InboxReader {
    /// Wait for cells of `inbox` and append them to `out`, or return how
    /// the link ended (once; [`Error::Closed`] after that).
    pub(crate) async fn read_cells(
        &mut self,
        inbox: &Inbox,
        out: &mut Vec<AnyChanCell>,
    ) -> Result<(), Error> {
        let take = |batch: Batch, out: &mut Vec<AnyChanCell>| {
            inbox.bytes.fetch_sub(batch.bytes, AtomicOrdering::Relaxed);
            out.extend(batch.cells);
        };
        if self.ended {
            return Err(Error::Closed);
        }
        loop {
            let mut failure = inbox.failure().take();
            if matches!(failure, Some(Error::Closed)) {
                // A clean end comes after the cells that arrived before it;
                // a broken link's cells are not worth waiting for.
                if let Ok(batch) = self.rx.try_recv() {
                    *inbox.failure() = failure.take();
                    take(batch, out);
                    return Ok(());
                }
            }
            if let Some(e) = failure {
                return Err(self.end(inbox, e));
            }
            let failed = inbox.failed.notified();
            tokio::select! {
                batch = self.rx.recv() => {
                    let Some(batch) = batch else {
                        return Err(self.end(inbox, Error::Closed));
                    };
                    take(batch, out);
                    return Ok(());
                }
                () = failed => {}
            }
        }
    }

    /// The link ended with `e`: nothing more is read, so what is queued
    /// is dropped (and no longer counted), and tasks waiting for room
    /// learn that the reader is gone.
    fn end(&mut self, inbox: &Inbox, e: Error) -> Error {
        self.ended = true;
        self.rx.close();
        while let Ok(batch) = self.rx.try_recv() {
            inbox.bytes.fetch_sub(batch.bytes, AtomicOrdering::Relaxed);
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use onionlab_cell::chan::{AnyChanMsg, Padding};

    fn padding(n: usize) -> Vec<AnyChanCell> {
        (0..n)
            .map(|_| AnyChanCell::new(None, AnyChanMsg::Padding(Padding::new())))
            .collect()
    }

    #[tokio::test]
    async fn a_clean_end_comes_after_the_queued_cells_a_failure_before_them() {
        let (inbox, mut reader) = Inbox::new();
        assert!(inbox.deliver(padding(2), 1028, || ()).await);
        assert_eq!(inbox.bytes(), 1028);
        inbox.fail(Error::Closed);
        let mut out = Vec::new();
        reader
            .read_cells(&inbox, &mut out)
            .await
            .expect("queued cells first");
        assert_eq!((out.len(), inbox.bytes()), (2, 0));
        assert!(matches!(
            reader.read_cells(&inbox, &mut out).await,
            Err(Error::Closed)
        ));

        let (inbox, mut reader) = Inbox::new();
        assert!(inbox.deliver(padding(2), 1028, || ()).await);
        inbox.fail(Error::Silent {
            peer: "127.0.0.1:1".parse().expect("literal"),
            silence: std::time::Duration::from_secs(1),
            connections: 1,
        });
        // A later end is the first one's consequence.
        inbox.fail(Error::Closed);
        let e = reader.read_cells(&inbox, &mut out).await;
        assert!(matches!(e, Err(Error::Silent { .. })), "{e:?}");
        // What was queued is dropped with the end, and nothing more is
        // taken.
        assert_eq!(inbox.bytes(), 0);
        assert!(!inbox.deliver(padding(1), 514, || ()).await);
        assert_eq!(inbox.bytes(), 0);
        let again = reader.read_cells(&inbox, &mut out).await;
        assert!(matches!(again, Err(Error::Closed)), "{again:?}");
    }

    #[tokio::test]
    async fn a_full_queue_holds_the_sender_and_its_guard_until_read() {
        let (inbox, mut reader) = Inbox::new();
        for _ in 0..QUEUE {
            assert!(
                inbox
                    .deliver(padding(1), 514, || panic!("not full yet"))
                    .await
            );
        }
        let blocked = AtomicUsize::new(0);
        struct Guard<'a>(&'a AtomicUsize);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, AtomicOrdering::Relaxed);
            }
        }
        let send = inbox.deliver(padding(1), 514, || {
            blocked.fetch_add(1, AtomicOrdering::Relaxed);
            Guard(&blocked)
        });
        let read = async {
            tokio::task::yield_now().await;
            assert_eq!(blocked.load(AtomicOrdering::Relaxed), 1);
            let mut out = Vec::new();
            reader.read_cells(&inbox, &mut out).await.expect("a batch");
        };
        let (sent, ()) = tokio::join!(send, read);
        assert!(sent);
        assert_eq!(blocked.load(AtomicOrdering::Relaxed), 0);
        assert_eq!(inbox.bytes(), QUEUE * 514);
        drop(reader);
        assert!(!inbox.deliver(padding(1), 514, || ()).await);
        assert_eq!(inbox.bytes(), QUEUE * 514);
    }
}
