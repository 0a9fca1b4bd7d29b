//! What a datagram link's DTLS session carries (`docs/datagram.md`
//! section 2): cells, one per record, nothing resent; and MORE's
//! messages (section 6), told from cells by their length. A session of
//! `onionlab_dtls` with this carrier is a datagram link: the relay
//! identities are bound inside it as in dtls-utcp's, and DTLS's record
//! numbers refuse replayed and forged records; a lost datagram loses its
//! cells, which only the end-to-end transport recovers.
//!
//! Bounded both ways: cells are handed on as they arrive (one event each,
//! drained by the driver after every call), a peer sending faster than
//! its token bucket allows has the excess dropped and counted, and cells
//! queued to send beyond `send_queue` are dropped and counted (the
//! end-to-end congestion control sees a loss).
//!
//! Alive or not: a side that has sent nothing for `heartbeat` sends a
//! one-byte heartbeat record, and a peer silent for `dead_after` is
//! reported ([`CellLinkEvent::Silent`]) so that the link's circuits end
//! (a killed relay is noticed in seconds, as a closed TCP connection
//! would be).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use onionlab_dtls::{Carrier, Role};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use crate::more::wire::LINK_MSG_MAX;
use crate::wire::CELL_LEN;
use crate::{Error, WireError};

/// What a datagram relay's `AUTH` signature covers first.
pub const AUTH_LABEL: &[u8] = b"onionlab datagram auth v1\0";

/// What a datagram endpoint's cookie MAC covers first.
pub const COOKIE_LABEL: &[u8] = b"onionlab datagram cookie v1\0";

/// A cell as it crosses a link.
pub type CellBytes = Box<[u8; CELL_LEN]>;

/// How a datagram link's sessions carry cells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellLinkConfig {
    /// Cells and MORE messages queued to send at most; more are dropped.
    pub send_queue: usize,
    /// Cells and MORE messages per second a peer may send (the token
    /// bucket's rate).
    pub peer_rate: u32,
    /// Cells and MORE messages a peer may send at once above its rate
    /// (the bucket's size).
    pub peer_burst: u32,
    /// After this long without sending, a heartbeat goes out.
    pub heartbeat: Duration,
    /// A peer silent this long is reported dead.
    pub dead_after: Duration,
}

/// Default [`CellLinkConfig::heartbeat`].
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// Default [`CellLinkConfig::dead_after`]: a few heartbeats lost in a row
/// on a lossy path do not end a link.
pub const DEFAULT_DEAD_AFTER: Duration = Duration::from_secs(5);

/// A heartbeat record's one byte (a cell is never one byte long).
const HEARTBEAT: u8 = 0;

impl Default for CellLinkConfig {
    fn default() -> Self {
        CellLinkConfig {
            send_queue: 256,
            // 100k cells/s is about 50 MB/s: a guard's share for one peer
            // on the lab's links, far above what one client needs.
            peer_rate: 100_000,
            peer_burst: 10_000,
            heartbeat: DEFAULT_HEARTBEAT,
            dead_after: DEFAULT_DEAD_AFTER,
        }
    }
}

/// What a datagram link refused or dropped, since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CellLinkStats {
    /// Cells and MORE messages handed on.
    pub cells_in: u64,
    /// Cells and MORE messages sent.
    pub cells_out: u64,
    /// Cells not sent: the send queue was full.
    pub send_dropped: u64,
    /// Cells from the peer over its rate, dropped.
    pub over_rate: u64,
    /// Heartbeats sent.
    pub heartbeats_out: u64,
}

/// What a datagram link reports.
#[derive(Debug, PartialEq, Eq)]
pub enum CellLinkEvent {
    /// A cell from the peer (its bytes are the circuit layer's to parse).
    Cell(CellBytes),
    /// A MORE message from the peer (its bytes are MORE's to parse).
    More(Vec<u8>),
    /// Nothing came from the peer for `dead_after`: the link is dead
    /// (reported once; the driver ends the session).
    Silent,
}

/// One session's cells (see the module docs).
#[derive(Debug)]
pub struct CellLink {
    config: CellLinkConfig,
    /// Cells and MORE messages to send.
    outbound: VecDeque<Vec<u8>>,
    events: VecDeque<CellLinkEvent>,
    /// The peer's token bucket: cells it may still send, and when it was
    /// last filled.
    tokens: f64,
    filled_at: Instant,
    stats: CellLinkStats,
    /// When the peer was last heard, and we last sent.
    heard_at: Instant,
    sent_at: Instant,
    /// Messages sent when `sent_at` was last set.
    sent_count: u64,
    heartbeat_due: bool,
    silent: bool,
}

impl CellLink {
    /// Queue `cell` to the peer (sent at the session's next flush);
    /// `false` if the queue was full and the cell was dropped.
    pub fn send(&mut self, cell: CellBytes) -> bool {
        self.queue(cell.to_vec())
    }

    /// Queue a MORE message (`more::wire::LinkMsg`'s bytes) to the peer;
    /// `false` if the queue was full, or the message has a cell's or a
    /// heartbeat's length or is too long, and it was dropped.
    pub fn send_more(&mut self, message: Vec<u8>) -> bool {
        if !is_more_len(message.len()) {
            self.stats.send_dropped += 1;
            return false;
        }
        self.queue(message)
    }

    fn queue(&mut self, message: Vec<u8>) -> bool {
        if self.outbound.len() >= self.config.send_queue {
            self.stats.send_dropped += 1;
            return false;
        }
        self.outbound.push_back(message);
        true
    }

    /// What was carried and dropped so far.
    pub fn stats(&self) -> CellLinkStats {
        self.stats
    }

    /// Take one token from the peer's bucket, filled up to `now`.
    fn take_token(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.filled_at);
        self.filled_at = self.filled_at.max(now);
        let burst = f64::from(self.config.peer_burst.max(1));
        self.tokens =
            (self.tokens + elapsed.as_secs_f64() * f64::from(self.config.peer_rate)).min(burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl Carrier for CellLink {
    type Config = CellLinkConfig;
    type Event = CellLinkEvent;
    type Error = Error;
    const AUTH_LABEL: &'static [u8] = AUTH_LABEL;
    const COOKIE_LABEL: &'static [u8] = COOKIE_LABEL;

    fn check(config: &CellLinkConfig, max_message: usize) -> Result<(), Error> {
        if CELL_LEN.max(LINK_MSG_MAX) > max_message {
            return Err(Error::Settings(format!(
                "a {CELL_LEN}-byte cell or a {LINK_MSG_MAX}-byte MORE message does not \
                 fit one record of a datagram ({max_message} bytes at most)"
            )));
        }
        if config.send_queue == 0 || config.peer_rate == 0 {
            return Err(Error::Settings(
                "send_queue and peer_rate must be positive".into(),
            ));
        }
        if config.heartbeat.is_zero() || config.dead_after <= config.heartbeat {
            return Err(Error::Settings(format!(
                "heartbeat {:?} must be positive and below dead_after {:?}",
                config.heartbeat, config.dead_after
            )));
        }
        Ok(())
    }

    fn start(
        config: &CellLinkConfig,
        _role: Role,
        _peer: Option<Ed25519Identity>,
        _seed: u64,
        now: Instant,
    ) -> Result<CellLink, Error> {
        Ok(CellLink {
            config: config.clone(),
            outbound: VecDeque::new(),
            events: VecDeque::new(),
            tokens: f64::from(config.peer_burst.max(1)),
            filled_at: now,
            stats: CellLinkStats::default(),
            heard_at: now,
            sent_at: now,
            sent_count: 0,
            heartbeat_due: false,
            silent: false,
        })
    }

    fn handle_message(&mut self, message: &[u8], now: Instant) -> Result<(), Error> {
        self.heard_at = self.heard_at.max(now);
        if message == [HEARTBEAT] {
            return Ok(());
        }
        let event = match <[u8; CELL_LEN]>::try_from(message) {
            Ok(cell) => CellLinkEvent::Cell(Box::new(cell)),
            Err(_) if is_more_len(message.len()) => CellLinkEvent::More(message.to_vec()),
            Err(_) => {
                return Err(WireError::Length {
                    what: "datagram cell or MORE message",
                    got: message.len(),
                }
                .into())
            }
        };
        if !self.take_token(now) {
            self.stats.over_rate += 1;
            return Ok(());
        }
        self.stats.cells_in += 1;
        self.events.push_back(event);
        Ok(())
    }

    fn poll_message(&mut self) -> Option<Vec<u8>> {
        // (The send time is noted at the timer: a session flushes right
        // after queueing, so "now" is the last call's time.)
        if let Some(message) = self.outbound.pop_front() {
            self.stats.cells_out += 1;
            self.heartbeat_due = false;
            return Some(message);
        }
        if std::mem::take(&mut self.heartbeat_due) {
            self.stats.heartbeats_out += 1;
            return Some(vec![HEARTBEAT]);
        }
        None
    }

    fn poll_event(&mut self) -> Option<CellLinkEvent> {
        self.events.pop_front()
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.silent {
            return;
        }
        if now.saturating_duration_since(self.heard_at) >= self.config.dead_after {
            self.silent = true;
            self.events.push_back(CellLinkEvent::Silent);
            return;
        }
        // Cells sent since the last look count as sending (as if sent
        // now: a heartbeat comes at most one interval late).
        if self.stats.cells_out != self.sent_count {
            self.sent_count = self.stats.cells_out;
            self.sent_at = now;
        }
        if now.saturating_duration_since(self.sent_at) >= self.config.heartbeat {
            self.heartbeat_due = true;
            self.sent_at = now;
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if self.silent {
            return None;
        }
        Some((self.sent_at + self.config.heartbeat).min(self.heard_at + self.config.dead_after))
    }
}

/// Whether a message of `len` bytes is MORE's: not a cell's or a
/// heartbeat's length, and not too long.
fn is_more_len(len: usize) -> bool {
    len > 1 && len != CELL_LEN && len <= LINK_MSG_MAX
}
