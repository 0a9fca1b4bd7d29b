//! What a datagram link's DTLS session carries (`docs/datagram.md`
//! section 2): cells, one per record, nothing resent. A session of
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

use std::collections::VecDeque;
use std::time::Instant;

use onionlab_dtls::{Carrier, Role};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

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
    /// Cells queued to send at most; more are dropped.
    pub send_queue: usize,
    /// Cells per second a peer may send (the token bucket's rate).
    pub peer_rate: u32,
    /// Cells a peer may send at once above its rate (the bucket's size).
    pub peer_burst: u32,
}

impl Default for CellLinkConfig {
    fn default() -> Self {
        CellLinkConfig {
            send_queue: 256,
            // 100k cells/s is about 50 MB/s: a guard's share for one peer
            // on the lab's links, far above what one client needs.
            peer_rate: 100_000,
            peer_burst: 10_000,
        }
    }
}

/// What a datagram link refused or dropped, since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CellLinkStats {
    /// Cells handed on.
    pub cells_in: u64,
    /// Cells sent.
    pub cells_out: u64,
    /// Cells not sent: the send queue was full.
    pub send_dropped: u64,
    /// Cells from the peer over its rate, dropped.
    pub over_rate: u64,
}

/// What a datagram link reports.
#[derive(Debug, PartialEq, Eq)]
pub enum CellLinkEvent {
    /// A cell from the peer (its bytes are the circuit layer's to parse).
    Cell(CellBytes),
}

/// One session's cells (see the module docs).
#[derive(Debug)]
pub struct CellLink {
    config: CellLinkConfig,
    outbound: VecDeque<CellBytes>,
    events: VecDeque<CellLinkEvent>,
    /// The peer's token bucket: cells it may still send, and when it was
    /// last filled.
    tokens: f64,
    filled_at: Instant,
    stats: CellLinkStats,
}

impl CellLink {
    /// Queue `cell` to the peer (sent at the session's next flush);
    /// `false` if the queue was full and the cell was dropped.
    pub fn send(&mut self, cell: CellBytes) -> bool {
        if self.outbound.len() >= self.config.send_queue {
            self.stats.send_dropped += 1;
            return false;
        }
        self.outbound.push_back(cell);
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
        if CELL_LEN > max_message {
            return Err(Error::Settings(format!(
                "a {CELL_LEN}-byte cell does not fit one record of a datagram \
                 ({max_message} bytes at most)"
            )));
        }
        if config.send_queue == 0 || config.peer_rate == 0 {
            return Err(Error::Settings(
                "send_queue and peer_rate must be positive".into(),
            ));
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
        })
    }

    fn handle_message(&mut self, message: &[u8], now: Instant) -> Result<(), Error> {
        let cell: [u8; CELL_LEN] = message.try_into().map_err(|_| WireError::Length {
            what: "datagram cell",
            got: message.len(),
        })?;
        if !self.take_token(now) {
            self.stats.over_rate += 1;
            return Ok(());
        }
        self.stats.cells_in += 1;
        self.events.push_back(CellLinkEvent::Cell(Box::new(cell)));
        Ok(())
    }

    fn poll_message(&mut self) -> Option<Vec<u8>> {
        let cell = self.outbound.pop_front()?;
        self.stats.cells_out += 1;
        Some(cell.to_vec())
    }

    fn poll_event(&mut self) -> Option<CellLinkEvent> {
        self.events.pop_front()
    }

    fn handle_timeout(&mut self, _now: Instant) {}

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
}
