//! XON/XOFF stream flow control (tor proposal 324, section 4), which
//! replaces tor-spec's 500-cell stream windows and stream-level SENDMEs on
//! circuits that run congestion control ([`crate::vegas`]).
//!
//! With congestion control, an endpoint acknowledges every DATA cell at the
//! circuit level as soon as it is decrypted, before it reaches the stream's
//! edge (the application's SOCKS connection at a client, the target's TCP
//! connection at an exit). If that edge stops reading, data builds up in the
//! stream's outgoing buffer (the "outbuf"); instead of a window, the
//! receiving edge tells the sending edge to stop (XOFF) when the buffer
//! grows past a limit and to resume (XON) once it has drained, and
//! advertises the rate at which it drains (section 4.1.2) so the sender can
//! pace the stream instead of bouncing between XON and XOFF.
//!
//! Two sans-IO state machines, fed byte counts and times, with no I/O and no
//! clock of their own:
//!
//! * [`XonXoffReceiver`]: the edge whose outbuf fills. Fed the stream data
//!   arriving from the circuit ([`on_data`](XonXoffReceiver::on_data)) and
//!   the bytes its edge connection took ([`on_drain`](XonXoffReceiver::on_drain)),
//!   it answers with a [`FlowAction`] to send: an XOFF when the buffer passes
//!   the limit of its [`EdgePosition`] (4.1.1), an XON when the buffer has
//!   emptied after an XOFF (4.1.1), and advisory XONs when the N-EWMA drain
//!   rate moves by more than `cc_xon_change_pct` (4.1.1, 4.1.2).
//! * [`XonXoffSender`]: the edge that packages the stream's data. An XOFF
//!   stops packaging, an XON resumes it and sets the advisory rate. At a
//!   client (or onion service) it enforces the dropmark mitigations of
//!   section 4.1.4 and refuses XOFFs and XONs that arrive before the data
//!   sent could have caused them ([`XonXoffError`]).
//!
//! # Rules and parameters (with their sections)
//!
//! * Limits count stream payload bytes; consensus parameters count "relay
//!   cell multiples" (6.5.5), converted with [`CELL_PAYLOAD_BYTES`] (498, the
//!   most stream data one relay cell carries; C tor multiplies by
//!   `RELAY_PAYLOAD_SIZE`, the same 498).
//! * XOFF when the buffered bytes exceed `cc_xoff_client` (client, onion
//!   service) or `cc_xoff_exit` (exit) cells' worth, unless an XOFF is
//!   already outstanding: never two XOFFs without an XON between (4.1.1).
//!   An XOFF resets the drain-rate EWMA to 0 (4.1.2).
//! * XON after an XOFF once the buffer is empty (4.1.1 "once the queue is
//!   expected to empty"; the XON threshold is 0, 6.5.5 `cc_xoff_*` notes).
//!   It carries the EWMA drain rate in KB/s (1000 bytes/s, 4.1.2 NOTE);
//!   0 means unlimited (4.1), so it is sent when no rate could be measured.
//! * Drain rate (4.1.2): timing starts once 32 cells' worth (16 KB, the
//!   largest burst tor writes at once, [`MAX_EXPECTED_CELL_BURST`]) has
//!   accumulated; after `cc_xon_rate` cells' worth of bytes drained, the
//!   rate `bytes / elapsed` enters an N-EWMA with `N = cc_xon_ewma_cnt`
//!   (`ewma = (2 * rate + (N - 1) * ewma) / (N + 1)`, section 2.1.2), the
//!   count is zeroed and a new timestamp taken. A zero elapsed time (a
//!   stalled clock, section 2.1.1) clears the measurement without recording
//!   it. When the buffer empties the timestamp is cleared; after
//!   `cc_xon_rate` cells' worth drained with the buffer empty the EWMA
//!   doubles, and again every `cc_xon_rate` cells while it stays empty.
//! * Advisory XON when no XOFF is outstanding and the EWMA differs from the
//!   last rate sent by more than `cc_xon_change_pct` percent (4.1.1). Like
//!   C tor, this needs a nonzero rate sent before (a change relative to
//!   "unlimited" has no percentage), and it is not restricted to a
//!   non-empty buffer (4.1.2 says "if the buffers are non-zero", 4.1.1
//!   "whenever"; following 4.1.2 strictly would keep the doubled rate of an
//!   empty buffer from ever being advertised, which is what it is for).
//! * Sender (4.1.1): XOFF stops packaging; XON resumes it and stores the
//!   advisory rate. An XON while not stopped is an advisory XON and is
//!   valid. A second XOFF without an XON between is refused (our receiver
//!   never sends one; C tor flags it as invalid too). A version other than
//!   0 is a protocol violation (4.1).
//! * Dropmark mitigation (4.1.4), checked when the local edge is a client
//!   or an onion service: the n-th XOFF needs at least `n` times the peer's
//!   XOFF limit sent on the stream (`cc_xoff_exit` toward an exit,
//!   `cc_xoff_client` toward an onion service or client: the MUST and the
//!   "not more often than every XOFF limit" SHOULD in one rule); the n-th
//!   XON needs `n * min(xoff limit, cc_xon_rate)` cells' worth sent (the two
//!   SHOULDs on XONs). Violations are errors: the spec says the circuit
//!   SHOULD then be closed. C tor only flags them (for the vanguards
//!   addon); onionlab refuses. An exit checks none of these: the attack
//!   they stop targets clients.
//!
//! # How circuits use it
//!
//! On a circuit whose [`CircuitCc`](crate::flow::CircuitCc) is Vegas, every
//! stream gets an [`XonXoffReceiver`] and an [`XonXoffSender`] instead of
//! [`StreamWindows`](crate::flow::StreamWindows) (`StreamMap` in
//! `stream.rs`):
//!
//! * No stream SENDMEs are sent; one received is a protocol violation, as is
//!   an XON/XOFF on a circuit without congestion control, from a hop other
//!   than the stream's, or for a stream never opened. Circuit SENDMEs go out
//!   as soon as DATA is recognized (4.1).
//! * Receiving: DATA feeds [`on_data`](XonXoffReceiver::on_data), each
//!   read by the edge (the client's application, the exit's target)
//!   [`on_drain`](XonXoffReceiver::on_drain); each [`FlowAction`] becomes an
//!   XON or XOFF on that stream toward its hop. A peer that goes on sending
//!   far past an XOFF (`StreamConfig::max_unread_bytes`) closes the circuit.
//! * Sending: packaging skips a stream whose sender cannot
//!   [`package`](XonXoffSender::can_package); an error from the sender closes
//!   the circuit, except a repeated XOFF at an exit, which changes nothing
//!   there and is ignored (a client refuses it: XOFFs that change nothing
//!   could carry a signal).
//! * Pacing: an XON's rate limits what the edge hands over, as C tor limits
//!   its reads from the edge connection: a token bucket of one second's
//!   worth ([`allowance`](XonXoffSender::allowance)). The stream takes no
//!   more bytes than it holds, and tells the edge when it will again
//!   ([`resumes_at`](XonXoffSender::resumes_at)).
//!
//! Not done yet, and known:
//!
//! * The oomkiller of 4.1.3 (close the streams holding the oldest buffered
//!   data) is the relay's memory accounting, which closes whole circuits by
//!   queued bytes (stream buffers included).
//! * The half-closed stream rule of 4.1.4 (accept late data for
//!   `max(max RTT, circuit build timeout)`): half-closed streams are kept
//!   by count, as under fixed windows.

use std::time::Instant;

use crate::ParamError;

/// Stream payload bytes in one relay cell: consensus limits in "relay cell
/// multiples" (proposal 324 section 6.5.5) are this many bytes each.
pub const CELL_PAYLOAD_BYTES: u64 = onionlab_cell::relay::MAX_DATA_LEN as u64;

/// Cells tor writes to an edge in one burst: drain-rate timing starts once
/// this many cells' worth (16 KB) is buffered (proposal 324 section 4.1.2).
pub const MAX_EXPECTED_CELL_BURST: u64 = 32;

/// Flow-control consensus parameters of proposal 324 section 6.5.5, in
/// cells. [`Default`] is C tor's, which are the proposal's defaults and what
/// the live network runs (no consensus overrides them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XonXoffParams {
    /// `cc_xoff_client`: buffered cells at a client or onion service edge
    /// beyond which it sends XOFF. Default 500, range [1, 10000] (6.5.5).
    pub xoff_client: u32,
    /// `cc_xoff_exit`: the same at an exit. Default 500, range [1, 10000]
    /// (6.5.5).
    pub xoff_exit: u32,
    /// `cc_xon_rate`: cells' worth of bytes drained per drain-rate sample,
    /// hence the least data between advisory XONs. Default 500, range
    /// [1, 5000] (6.5.5).
    pub xon_rate: u32,
    /// `cc_xon_change_pct`: change of the drain rate, in percent of the
    /// last rate sent, that triggers an advisory XON. Default 25, range
    /// [1, 99] (6.5.5).
    pub xon_change_pct: u32,
    /// `cc_xon_ewma_cnt`: the N of the drain rate's N-EWMA. Default 2,
    /// range [2, 100] (6.5.5).
    pub xon_ewma_cnt: u32,
}

impl Default for XonXoffParams {
    fn default() -> Self {
        XonXoffParams {
            xoff_client: 500,
            xoff_exit: 500,
            xon_rate: 500,
            xon_change_pct: 25,
            xon_ewma_cnt: 2,
        }
    }
}

impl XonXoffParams {
    /// The parameters by their consensus names (section 6.5.5).
    pub fn named_mut(&mut self) -> Vec<(&'static str, &mut u32)> {
        vec![
            ("cc_xoff_client", &mut self.xoff_client),
            ("cc_xoff_exit", &mut self.xoff_exit),
            ("cc_xon_rate", &mut self.xon_rate),
            ("cc_xon_change_pct", &mut self.xon_change_pct),
            ("cc_xon_ewma_cnt", &mut self.xon_ewma_cnt),
        ]
    }

    /// Check the ranges of proposal 324 section 6.5.5.
    ///
    /// # Errors
    ///
    /// The first parameter out of its range.
    pub fn validate(&self) -> Result<(), ParamError> {
        let checks = [
            ("cc_xoff_client", self.xoff_client, 1, 10_000),
            ("cc_xoff_exit", self.xoff_exit, 1, 10_000),
            ("cc_xon_rate", self.xon_rate, 1, 5000),
            ("cc_xon_change_pct", self.xon_change_pct, 1, 99),
            ("cc_xon_ewma_cnt", self.xon_ewma_cnt, 2, 100),
        ];
        ParamError::check_ranges(&checks)
    }

    /// The XOFF limit of a receiving edge at `position`, in bytes.
    pub fn xoff_limit_bytes(&self, position: EdgePosition) -> u64 {
        let cells = match position {
            EdgePosition::Client | EdgePosition::OnionService => self.xoff_client,
            EdgePosition::Exit => self.xoff_exit,
        };
        u64::from(cells) * CELL_PAYLOAD_BYTES
    }

    /// `cc_xon_rate` in bytes.
    pub fn xon_rate_bytes(&self) -> u64 {
        u64::from(self.xon_rate) * CELL_PAYLOAD_BYTES
    }
}

/// Where a stream's edge is: it decides the XOFF limit (section 4.1) and
/// whether the dropmark checks of section 4.1.4 apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgePosition {
    /// A client's end of the stream (the application's SOCKS connection).
    Client,
    /// An exit's end (the TCP connection to the target).
    Exit,
    /// An onion service's end (uses the client limits, section 4.1).
    OnionService,
}

/// What a receiving edge must send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowAction {
    /// Send XOFF (version 0): the peer must stop sending on this stream.
    SendXoff,
    /// Send XON (version 0) with this drain rate in KB/s (1000 bytes/s);
    /// 0 means unlimited.
    SendXon {
        /// The `kbps_ewma` field.
        kbps: u32,
    },
}

/// The receiving edge of one stream: its outbuf, its drain rate and the
/// XON/XOFF it owes the peer (proposal 324 sections 4.1.1 and 4.1.2).
#[derive(Debug, Clone)]
pub struct XonXoffReceiver {
    p: XonXoffParams,
    xoff_limit: u64,
    buffered: u64,
    xoff_sent: bool,
    /// When the current drain-rate measurement started (None: not timing).
    measure_start: Option<Instant>,
    /// Bytes drained since `measure_start`.
    drained: u64,
    /// Bytes drained while not timing (the buffer below a burst or empty),
    /// for the doubling of the rate.
    drained_idle: u64,
    ewma_kbps: u32,
    /// The rate of the last XON sent (0: none, or unlimited).
    advertised_kbps: u32,
}

impl XonXoffReceiver {
    /// The receiving edge at `position` with `params` (checked with
    /// [`XonXoffParams::validate`] by the caller).
    pub fn new(params: XonXoffParams, position: EdgePosition) -> Self {
        XonXoffReceiver {
            p: params,
            xoff_limit: params.xoff_limit_bytes(position),
            buffered: 0,
            xoff_sent: false,
            measure_start: None,
            drained: 0,
            drained_idle: 0,
            ewma_kbps: 0,
            advertised_kbps: 0,
        }
    }

    /// Bytes waiting in the outbuf.
    pub fn buffered(&self) -> u64 {
        self.buffered
    }

    /// Whether an XOFF was sent and no XON since.
    pub fn xoff_outstanding(&self) -> bool {
        self.xoff_sent
    }

    /// The drain rate's N-EWMA in KB/s (0: not measured).
    pub fn drain_rate_kbps(&self) -> u32 {
        self.ewma_kbps
    }

    /// The rate carried by the last XON sent (0: none yet, or unlimited).
    pub fn advertised_kbps(&self) -> u32 {
        self.advertised_kbps
    }

    /// `bytes` of stream data arrived from the circuit at `now` and were
    /// queued for the edge. Returns [`FlowAction::SendXoff`] when the
    /// buffer passed the XOFF limit and no XOFF is outstanding.
    pub fn on_data(&mut self, bytes: usize, now: Instant) -> Option<FlowAction> {
        self.buffered = self.buffered.saturating_add(to_u64(bytes));
        self.maybe_start_timing(now);
        if self.buffered > self.xoff_limit && !self.xoff_sent {
            self.xoff_sent = true;
            // Section 4.1.2: a rate that let the buffer reach XOFF is wrong.
            self.ewma_kbps = 0;
            return Some(FlowAction::SendXoff);
        }
        None
    }

    /// The edge took `bytes` from the outbuf at `now` (written to the
    /// socket, read by the application). More than is buffered counts as
    /// all of it. Returns an XON when one is due.
    pub fn on_drain(&mut self, bytes: usize, now: Instant) -> Option<FlowAction> {
        let n = to_u64(bytes).min(self.buffered);
        self.buffered -= n;
        if self.measure_start.is_some() {
            self.drained = self.drained.saturating_add(n);
            if self.drained >= self.p.xon_rate_bytes() {
                self.take_rate_sample(now);
            }
        } else {
            self.drained_idle = self.drained_idle.saturating_add(n);
        }
        if self.buffered == 0 {
            self.on_empty();
        } else {
            self.maybe_start_timing(now);
        }
        if self.xoff_sent {
            (self.buffered == 0).then(|| self.send_xon())
        } else if self.rate_changed() {
            Some(self.send_xon())
        } else {
            None
        }
    }

    fn send_xon(&mut self) -> FlowAction {
        self.xoff_sent = false;
        self.advertised_kbps = self.ewma_kbps;
        FlowAction::SendXon {
            kbps: self.ewma_kbps,
        }
    }

    /// Start timing once a burst's worth has accumulated (section 4.1.2).
    fn maybe_start_timing(&mut self, now: Instant) {
        if self.measure_start.is_none()
            && self.buffered >= MAX_EXPECTED_CELL_BURST * CELL_PAYLOAD_BYTES
        {
            self.measure_start = Some(now);
            self.drained = 0;
            self.drained_idle = 0;
        }
    }

    /// `cc_xon_rate` cells' worth drained since timing started: fold the
    /// rate into the EWMA and start a new sample.
    fn take_rate_sample(&mut self, now: Instant) {
        let Some(start) = self.measure_start else {
            return;
        };
        let us = now.saturating_duration_since(start).as_micros();
        // bytes/us * 1e6 us/s / 1000 bytes/KB = bytes * 1000 / us.
        if let Some(kbps) = (u128::from(self.drained) * 1000).checked_div(us) {
            let kbps = u32::try_from(kbps).unwrap_or(u32::MAX).max(1);
            self.ewma_kbps = n_ewma(kbps, self.ewma_kbps, self.p.xon_ewma_cnt);
        }
        // A zero delta is a stalled clock (section 2.1.1): the sample is
        // dropped, the fields cleared all the same.
        self.drained = 0;
        self.measure_start = (self.buffered > 0).then_some(now);
    }

    /// The outbuf is empty: stop timing; after `cc_xon_rate` cells' worth
    /// drained through an empty buffer, double the rate (section 4.1.2).
    fn on_empty(&mut self) {
        self.measure_start = None;
        self.drained = 0;
        if self.drained_idle >= self.p.xon_rate_bytes()
            && self.advertised_kbps != 0
            && self.ewma_kbps != 0
        {
            self.ewma_kbps = self.ewma_kbps.saturating_mul(2);
            self.drained_idle = 0;
        }
    }

    /// Has the EWMA moved more than `cc_xon_change_pct` from the last rate
    /// sent (section 4.1.1)?
    fn rate_changed(&self) -> bool {
        if self.advertised_kbps == 0 {
            return false;
        }
        let ewma = u64::from(self.ewma_kbps) * 100;
        let last = u64::from(self.advertised_kbps);
        let pct = u64::from(self.p.xon_change_pct);
        ewma > last * (100 + pct) || ewma < last * (100 - pct.min(100))
    }
}

/// N-EWMA of proposal 324 section 2.1.2: `(2 * x + (N - 1) * ewma) / (N + 1)`,
/// or `x` when there is no previous value.
fn n_ewma(x: u32, ewma: u32, n: u32) -> u32 {
    if ewma == 0 {
        return x;
    }
    let n = u64::from(n.max(1));
    let v = (2 * u64::from(x) + (n - 1) * u64::from(ewma)) / (n + 1);
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn to_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// An XON or XOFF the sending edge refuses. Every one is a protocol
/// violation by the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum XonXoffError {
    /// The version byte is not 0 (proposal 324 section 4.1: a protocol
    /// violation).
    #[error("XON/XOFF with unrecognized version {0}")]
    UnknownVersion(u8),
    /// An XOFF while the previous one has not been lifted by an XON.
    #[error("second XOFF without an XON between")]
    DuplicateXoff,
    /// More XOFFs than the data sent can explain (section 4.1.4).
    #[error("XOFF number {count} after only {sent} bytes sent (needs {needed})")]
    EarlyXoff {
        /// This XOFF's number on the stream.
        count: u64,
        /// Stream bytes sent so far.
        sent: u64,
        /// Bytes it needs.
        needed: u64,
    },
    /// More XONs than the data sent can explain (section 4.1.4).
    #[error("XON number {count} after only {sent} bytes sent (needs {needed})")]
    EarlyXon {
        /// This XON's number on the stream.
        count: u64,
        /// Stream bytes sent so far.
        sent: u64,
        /// Bytes it needs.
        needed: u64,
    },
}

impl XonXoffError {
    /// Whether the circuit must be closed (reason PROTOCOL) wherever it
    /// happens: the dropmark violations (section 4.1.4 says the circuit
    /// SHOULD close) and unknown versions. A duplicate XOFF changes nothing
    /// for an exit, which ignores it; a client closes the circuit for it
    /// too (see the stream map).
    pub fn closes_circuit(&self) -> bool {
        !matches!(self, XonXoffError::DuplicateXoff)
    }
}

/// The sending edge of one stream: whether it may package data, at what
/// advisory rate, and the dropmark checks of proposal 324 section 4.1.4.
#[derive(Debug, Clone)]
pub struct XonXoffSender {
    /// XOFF and XON byte allowances when checks apply (client side).
    limits: Option<(u64, u64)>,
    xoff_received: bool,
    rate_kbps: u32,
    /// Paces what the edge hands over to the rate of the last XON.
    bucket: Option<RateBucket>,
    sent: u64,
    xoffs: u64,
    xons: u64,
}

impl XonXoffSender {
    /// The sending edge at `local`, whose peer (the receiving edge) is at
    /// `peer`. The dropmark checks apply unless `local` is an exit; they use
    /// the peer's XOFF limit.
    pub fn new(params: XonXoffParams, local: EdgePosition, peer: EdgePosition) -> Self {
        let xoff = params.xoff_limit_bytes(peer);
        let xon = xoff.min(params.xon_rate_bytes());
        XonXoffSender {
            limits: (local != EdgePosition::Exit).then_some((xoff, xon)),
            xoff_received: false,
            rate_kbps: 0,
            bucket: None,
            sent: 0,
            xoffs: 0,
            xons: 0,
        }
    }

    /// May stream data be packaged now (no XOFF outstanding)?
    pub fn can_package(&self) -> bool {
        !self.xoff_received
    }

    /// The advisory rate of the last XON in bytes per second; None if
    /// unlimited (no XON yet, or an XON with rate 0).
    pub fn rate_limit(&self) -> Option<u64> {
        (self.rate_kbps != 0).then(|| u64::from(self.rate_kbps) * 1000)
    }

    /// Bytes the edge may hand over at `now` under the XON's advisory rate
    /// (`u64::MAX` without one). Read from the edge no more than this, and
    /// report what was taken with [`take`](Self::take).
    pub fn allowance(&mut self, now: Instant) -> u64 {
        self.bucket.as_mut().map_or(u64::MAX, |b| b.tokens(now))
    }

    /// The edge handed over `bytes` (at most the last
    /// [`allowance`](Self::allowance)).
    pub fn take(&mut self, bytes: usize) {
        if let Some(b) = &mut self.bucket {
            b.take(to_u64(bytes));
        }
    }

    /// When the allowance will have grown back to 10 ms of the rate, or a
    /// cell's payload if that is more (the whole burst if less), if it is
    /// below that now; `None` without a rate or when there is enough. An
    /// edge refused for the rate waits until then: at most about 100
    /// wake-ups a second, mostly whole cells.
    pub fn resumes_at(&self) -> Option<Instant> {
        let b = self.bucket.as_ref()?;
        b.reaches(CELL_PAYLOAD_BYTES.max(b.rate / 100))
    }

    /// `bytes` of stream data were packaged (a DATA message's length).
    pub fn on_data_sent(&mut self, bytes: usize) {
        self.sent = self.sent.saturating_add(to_u64(bytes));
    }

    /// An XOFF arrived with this version byte. On success the stream stops
    /// packaging until an XON.
    ///
    /// # Errors
    ///
    /// [`XonXoffError`]: the state is left unchanged; the caller closes the
    /// stream or circuit.
    pub fn on_xoff(&mut self, version: u8) -> Result<(), XonXoffError> {
        check_version(version)?;
        if self.xoff_received {
            return Err(XonXoffError::DuplicateXoff);
        }
        let count = self.xoffs.saturating_add(1);
        if let Some((xoff, _)) = self.limits {
            let needed = xoff.saturating_mul(count);
            if self.sent < needed {
                return Err(XonXoffError::EarlyXoff {
                    count,
                    sent: self.sent,
                    needed,
                });
            }
        }
        self.xoffs = count;
        self.xoff_received = true;
        Ok(())
    }

    /// An XON arrived with this version byte and rate (KB/s, 0 for
    /// unlimited). Resumes packaging if stopped; while not stopped it is an
    /// advisory XON (section 4.1.1) and only updates the rate.
    ///
    /// # Errors
    ///
    /// [`XonXoffError`]: the state is left unchanged.
    pub fn on_xon(&mut self, version: u8, kbps: u32) -> Result<(), XonXoffError> {
        check_version(version)?;
        let count = self.xons.saturating_add(1);
        if let Some((_, xon)) = self.limits {
            let needed = xon.saturating_mul(count);
            if self.sent < needed {
                return Err(XonXoffError::EarlyXon {
                    count,
                    sent: self.sent,
                    needed,
                });
            }
        }
        self.xons = count;
        self.rate_kbps = kbps;
        self.bucket = match self.rate_limit() {
            None => None,
            Some(rate) => Some(match self.bucket.take() {
                Some(mut b) => {
                    b.set_rate(rate);
                    b
                }
                None => RateBucket::full(rate),
            }),
        };
        self.xoff_received = false;
        Ok(())
    }
}

/// A token bucket in bytes: `rate` bytes per second, holding at most one
/// second's worth, as C tor paces an edge connection's reads after an XON
/// with a rate (its `token_bucket_rw_adjust(bucket, rate, rate)`).
/// Written here: tor-proto has no such bucket for XON rates.
#[derive(Debug, Clone)]
struct RateBucket {
    rate: u64,
    tokens: f64,
    /// When `tokens` was last brought up to date (None: not yet used).
    at: Option<Instant>,
}

impl RateBucket {
    fn full(rate: u64) -> Self {
        RateBucket {
            rate,
            tokens: rate as f64,
            at: None,
        }
    }

    fn burst(&self) -> f64 {
        self.rate as f64
    }

    /// A new rate keeps the tokens held, up to the new burst.
    fn set_rate(&mut self, rate: u64) {
        self.rate = rate;
        self.tokens = self.tokens.min(self.burst());
    }

    fn tokens(&mut self, now: Instant) -> u64 {
        if let Some(at) = self.at {
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.rate as f64).min(self.burst());
        }
        self.at = Some(now.max(self.at.unwrap_or(now)));
        self.tokens as u64
    }

    fn take(&mut self, bytes: u64) {
        self.tokens = (self.tokens - bytes as f64).max(0.0);
    }

    fn reaches(&self, want: u64) -> Option<Instant> {
        let want = (want as f64).min(self.burst());
        if self.tokens >= want {
            return None;
        }
        let at = self.at?;
        let wait = (want - self.tokens) / self.rate as f64;
        // Rounded up to the next microsecond, so that the allowance then
        // is not a rounding error short.
        let micros = (wait * 1e6).ceil() as u64 + 1;
        Some(at + std::time::Duration::from_micros(micros))
    }
}

fn check_version(version: u8) -> Result<(), XonXoffError> {
    if version == 0 {
        Ok(())
    } else {
        Err(XonXoffError::UnknownVersion(version))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Duration;

    use super::*;
    use proptest::prelude::*;

    const CELL: usize = 498;
    /// The default XOFF limit in bytes: 500 cells of 498.
    const LIMIT: u64 = 500 * 498;

    fn exit_receiver() -> XonXoffReceiver {
        XonXoffReceiver::new(XonXoffParams::default(), EdgePosition::Exit)
    }

    fn client_sender() -> XonXoffSender {
        XonXoffSender::new(
            XonXoffParams::default(),
            EdgePosition::Client,
            EdgePosition::Exit,
        )
    }

    #[test]
    fn defaults_are_the_proposals_and_valid() {
        let p = XonXoffParams::default();
        p.validate().expect("valid");
        assert_eq!(
            (
                p.xoff_client,
                p.xoff_exit,
                p.xon_rate,
                p.xon_change_pct,
                p.xon_ewma_cnt
            ),
            (500, 500, 500, 25, 2)
        );
        assert_eq!(p.xoff_limit_bytes(EdgePosition::Exit), LIMIT);
        assert_eq!(p.xon_rate_bytes(), 249_000);
        let bad = [
            XonXoffParams {
                xoff_client: 0,
                ..p
            },
            XonXoffParams {
                xoff_exit: 10_001,
                ..p
            },
            XonXoffParams {
                xon_rate: 5001,
                ..p
            },
            XonXoffParams {
                xon_change_pct: 100,
                ..p
            },
            XonXoffParams {
                xon_ewma_cnt: 1,
                ..p
            },
        ];
        let names = [
            "cc_xoff_client",
            "cc_xoff_exit",
            "cc_xon_rate",
            "cc_xon_change_pct",
            "cc_xon_ewma_cnt",
        ];
        for (b, name) in bad.iter().zip(names) {
            assert!(
                matches!(b.validate(), Err(ParamError::OutOfRange { name: n, .. }) if n == name),
                "{name}"
            );
        }
    }

    #[test]
    fn position_picks_the_limit() {
        let p = XonXoffParams {
            xoff_client: 10,
            xoff_exit: 20,
            ..XonXoffParams::default()
        };
        assert_eq!(p.xoff_limit_bytes(EdgePosition::Client), 10 * 498);
        assert_eq!(p.xoff_limit_bytes(EdgePosition::OnionService), 10 * 498);
        assert_eq!(p.xoff_limit_bytes(EdgePosition::Exit), 20 * 498);
        let now = Instant::now();
        let mut client = XonXoffReceiver::new(p, EdgePosition::Client);
        assert_eq!(client.on_data(10 * 498, now), None, "at the limit: no XOFF");
        assert_eq!(client.on_data(1, now), Some(FlowAction::SendXoff));
        let mut exit = XonXoffReceiver::new(p, EdgePosition::Exit);
        assert_eq!(exit.on_data(10 * 498 + 1, now), None);
        assert_eq!(exit.on_data(10 * 498, now), Some(FlowAction::SendXoff));
    }

    #[test]
    fn xoff_once_then_xon_when_empty() {
        let mut r = exit_receiver();
        let now = Instant::now();
        for _ in 0..500 {
            assert_eq!(r.on_data(CELL, now), None);
        }
        assert_eq!(r.buffered(), LIMIT);
        assert_eq!(r.on_data(CELL, now), Some(FlowAction::SendXoff));
        // Never a second XOFF while the first stands.
        for _ in 0..100 {
            assert_eq!(r.on_data(CELL, now), None);
        }
        assert!(r.xoff_outstanding());
        // Partial drains: still buffered, no XON.
        assert_eq!(r.on_drain(100 * CELL, now), None);
        assert_eq!(r.on_drain(500 * CELL, now), None);
        assert_eq!(r.buffered(), 498);
        // Empty: XON. Draining more than buffered counts as all of it.
        let xon = r.on_drain(10_000, now);
        assert!(matches!(xon, Some(FlowAction::SendXon { .. })), "{xon:?}");
        assert_eq!(r.buffered(), 0);
        assert!(!r.xoff_outstanding());
        // The next XOFF needs the limit passed again.
        assert_eq!(r.on_data(LIMIT as usize, now), None);
        assert_eq!(r.on_data(1, now), Some(FlowAction::SendXoff));
    }

    #[test]
    fn xon_carries_the_drain_rate_in_kb_per_s() {
        let mut r = exit_receiver();
        let t0 = Instant::now();
        // 600 cells arrive at once: timing starts (more than 32 cells).
        assert_eq!(r.on_data(600 * CELL, t0), Some(FlowAction::SendXoff));
        // 500 cells (249,000 bytes) drain in 1 s: 249 KB/s.
        assert_eq!(r.on_drain(500 * CELL, t0 + Duration::from_secs(1)), None);
        assert_eq!(r.drain_rate_kbps(), 249);
        // The rest drains: XON with the rate.
        let xon = r.on_drain(100 * CELL, t0 + Duration::from_millis(1200));
        assert_eq!(xon, Some(FlowAction::SendXon { kbps: 249 }));
        assert_eq!(r.advertised_kbps(), 249);
    }

    #[test]
    fn xon_without_a_measurement_is_unlimited() {
        let mut r = exit_receiver();
        let now = Instant::now();
        assert_eq!(r.on_data(501 * CELL, now), Some(FlowAction::SendXoff));
        // 501 cells drained with no time passing: a stalled clock, the
        // sample is dropped and the XON says unlimited.
        assert_eq!(
            r.on_drain(501 * CELL, now),
            Some(FlowAction::SendXon { kbps: 0 })
        );
        assert_eq!(r.drain_rate_kbps(), 0);
        // cc_xon_rate above what was ever buffered: no sample either (the
        // tuning note of 6.5.5 on cc_xoff_* and cc_xon_rate).
        let p = XonXoffParams {
            xon_rate: 1000,
            ..XonXoffParams::default()
        };
        let mut r = XonXoffReceiver::new(p, EdgePosition::Exit);
        assert_eq!(r.on_data(600 * CELL, now), Some(FlowAction::SendXoff));
        let later = now + Duration::from_secs(3);
        assert_eq!(
            r.on_drain(600 * CELL, later),
            Some(FlowAction::SendXon { kbps: 0 })
        );
        assert_eq!(r.drain_rate_kbps(), 0);
    }

    #[test]
    fn timing_starts_at_a_burst_and_rates_are_n_ewma() {
        let mut r = exit_receiver();
        let t0 = Instant::now();
        // 31 cells buffered: below the 32-cell burst, no timing.
        r.on_data(31 * CELL, t0);
        r.on_drain(31 * CELL, t0 + Duration::from_secs(5));
        assert_eq!(r.drain_rate_kbps(), 0);
        // 400 cells: timing starts at t0.
        r.on_data(400 * CELL, t0);
        r.on_data(400 * CELL, t0);
        // 500 cells drained in 2 s: 124 KB/s (249,000 * 1000 / 2e6 = 124.5).
        r.on_drain(500 * CELL, t0 + Duration::from_secs(2));
        assert_eq!(r.drain_rate_kbps(), 124);
        // A new sample starts at t0+2s: 249,000 bytes in 0.5 s = 498 KB/s;
        // N = 2: (2 * 498 + 1 * 124) / 3 = 373.
        r.on_data(300 * CELL, t0 + Duration::from_secs(2));
        r.on_drain(500 * CELL, t0 + Duration::from_millis(2500));
        assert_eq!(r.drain_rate_kbps(), 373);
        assert_eq!(n_ewma(10, 0, 2), 10);
        assert_eq!(n_ewma(u32::MAX, u32::MAX, 100), u32::MAX);
    }

    #[test]
    fn xoff_resets_the_rate() {
        let mut r = exit_receiver();
        let t0 = Instant::now();
        r.on_data(400 * CELL, t0);
        r.on_drain(399 * CELL, t0 + Duration::from_secs(1));
        r.on_data(200 * CELL, t0 + Duration::from_secs(1));
        r.on_drain(101 * CELL, t0 + Duration::from_secs(2));
        assert_eq!(r.drain_rate_kbps(), 124);
        assert_eq!(r.on_data(600 * CELL, t0), Some(FlowAction::SendXoff));
        assert_eq!(r.drain_rate_kbps(), 0);
    }

    /// A receiver that has advertised 249 KB/s, with 100 cells buffered and
    /// timing from `t0`.
    fn advertised_249(t0: Instant) -> XonXoffReceiver {
        let mut r = exit_receiver();
        assert_eq!(r.on_data(600 * CELL, t0), Some(FlowAction::SendXoff));
        r.on_drain(500 * CELL, t0 + Duration::from_secs(1));
        let xon = r.on_drain(100 * CELL, t0 + Duration::from_secs(1));
        assert_eq!(xon, Some(FlowAction::SendXon { kbps: 249 }));
        r
    }

    #[test]
    fn advisory_xon_when_the_rate_moves_more_than_25_percent() {
        let t0 = Instant::now();
        let mut r = advertised_249(t0);
        let t1 = t0 + Duration::from_secs(10);
        // Same rate again: EWMA stays 249, no XON.
        r.on_data(500 * CELL, t1);
        assert_eq!(r.on_drain(500 * CELL, t1 + Duration::from_secs(1)), None);
        assert_eq!(r.drain_rate_kbps(), 249);
        // Twice as fast (498 KB/s): EWMA (2 * 498 + 249) / 3 = 415, +67%:
        // an advisory XON although no XOFF stands.
        let t2 = t1 + Duration::from_secs(1);
        r.on_data(500 * CELL, t2);
        let xon = r.on_drain(500 * CELL, t2 + Duration::from_millis(500));
        assert_eq!(xon, Some(FlowAction::SendXon { kbps: 415 }));
        // A smaller change is not enough: 415 -> (2 * 498 + 415) / 3 = 470,
        // +13%.
        let t3 = t2 + Duration::from_millis(500);
        r.on_data(500 * CELL, t3);
        let xon = r.on_drain(500 * CELL, t3 + Duration::from_millis(500));
        assert_eq!(r.drain_rate_kbps(), 470);
        assert_eq!(xon, None);
        // A drop of more than 25%: 249,000 bytes in 2 s = 124;
        // (2 * 124 + 470) / 3 = 239 < 75% of 415.
        let t4 = t3 + Duration::from_millis(500);
        r.on_data(500 * CELL, t4);
        let xon = r.on_drain(500 * CELL, t4 + Duration::from_secs(2));
        assert_eq!(xon, Some(FlowAction::SendXon { kbps: 239 }));
    }

    #[test]
    fn rate_doubles_while_the_buffer_stays_empty() {
        let t0 = Instant::now();
        let mut r = advertised_249(t0);
        // Cells pass straight through (never a burst buffered): after 500
        // cells' worth the rate doubles and is advertised (+100%).
        let mut t = t0 + Duration::from_secs(2);
        let mut actions = Vec::new();
        for _ in 0..1000 {
            r.on_data(CELL, t);
            actions.extend(r.on_drain(CELL, t));
            t += Duration::from_millis(1);
        }
        assert_eq!(
            actions,
            [
                FlowAction::SendXon { kbps: 498 },
                FlowAction::SendXon { kbps: 996 }
            ]
        );
    }

    #[test]
    fn no_advisory_xon_before_a_rate_was_sent() {
        let mut r = exit_receiver();
        let t0 = Instant::now();
        for i in 0..20 {
            let t = t0 + Duration::from_secs(i);
            r.on_data(500 * CELL, t);
            assert_eq!(
                r.on_drain(500 * CELL, t + Duration::from_millis(i * 50 + 1)),
                None
            );
        }
    }

    #[test]
    fn sender_stops_on_xoff_and_resumes_on_xon() {
        let mut s = client_sender();
        assert!(s.can_package());
        assert_eq!(s.rate_limit(), None);
        s.on_data_sent(LIMIT as usize);
        s.on_xoff(0).expect("after the limit");
        assert!(!s.can_package());
        assert_eq!(s.on_xoff(0), Err(XonXoffError::DuplicateXoff));
        s.on_xon(0, 300).expect("xon");
        assert!(s.can_package());
        assert_eq!(s.rate_limit(), Some(300_000));
        // An advisory XON while not stopped only changes the rate.
        s.on_data_sent(LIMIT as usize);
        s.on_xon(0, 0).expect("advisory xon");
        assert!(s.can_package());
        assert_eq!(s.rate_limit(), None, "0 is unlimited");
    }

    #[test]
    fn an_xon_rate_paces_the_edge_with_a_one_second_burst() {
        let t = Instant::now();
        let mut s = client_sender();
        assert_eq!(s.allowance(t), u64::MAX, "no XON yet: unlimited");
        assert_eq!(s.resumes_at(), None);
        s.on_data_sent(LIMIT as usize);
        s.on_xon(0, 100).expect("xon");
        // 100 KB/s: a full second's worth at once, then 100 bytes per ms.
        assert_eq!(s.allowance(t), 100_000);
        s.take(100_000);
        assert_eq!(s.allowance(t), 0);
        let resume = s.resumes_at().expect("empty: waits");
        let wait = resume - t;
        // 10 ms of 100 KB/s (1000 bytes, more than a cell's 498).
        assert!(wait >= Duration::from_micros(10_000) && wait <= Duration::from_micros(10_010));
        assert_eq!(s.allowance(t + Duration::from_millis(10)), 1000);
        assert_eq!(s.resumes_at(), None);
        // Never more than a second's worth, however long idle.
        assert_eq!(s.allowance(t + Duration::from_secs(60)), 100_000);
        // A lower rate caps what is held at its own burst.
        s.on_data_sent(LIMIT as usize);
        s.on_xon(0, 10).expect("advisory xon");
        assert_eq!(s.allowance(t + Duration::from_secs(60)), 10_000);
        // Rate 0 lifts the limit.
        s.on_data_sent(LIMIT as usize);
        s.on_xon(0, 0).expect("advisory xon");
        assert_eq!(s.allowance(t + Duration::from_secs(60)), u64::MAX);
        assert_eq!(s.resumes_at(), None);
    }

    #[test]
    fn unknown_versions_are_refused() {
        let mut s = client_sender();
        s.on_data_sent(10 * LIMIT as usize);
        assert_eq!(s.on_xoff(1), Err(XonXoffError::UnknownVersion(1)));
        assert_eq!(s.on_xon(255, 5), Err(XonXoffError::UnknownVersion(255)));
        assert!(s.can_package(), "state unchanged");
        assert!(XonXoffError::UnknownVersion(1).closes_circuit());
        assert!(!XonXoffError::DuplicateXoff.closes_circuit());
    }

    #[test]
    fn client_refuses_early_xoff_and_xon() {
        let mut s = client_sender();
        // Section 4.1.4: no XOFF before cc_xoff_exit worth was sent.
        s.on_data_sent(LIMIT as usize - 1);
        let e = s.on_xoff(0).unwrap_err();
        assert_eq!(
            e,
            XonXoffError::EarlyXoff {
                count: 1,
                sent: LIMIT - 1,
                needed: LIMIT
            }
        );
        assert!(e.closes_circuit());
        assert!(s.can_package());
        // Nor an XON before min(limit, cc_xon_rate) = 249,000 bytes.
        assert!(matches!(s.on_xon(0, 1), Err(XonXoffError::EarlyXon { .. })));
        s.on_data_sent(1);
        s.on_xoff(0).expect("exactly the limit");
        s.on_xon(0, 1).expect("first xon");
        // A second XOFF needs a second limit's worth; so does a second XON.
        s.on_data_sent(LIMIT as usize - 1);
        assert!(matches!(
            s.on_xoff(0),
            Err(XonXoffError::EarlyXoff { count: 2, .. })
        ));
        assert!(matches!(
            s.on_xon(0, 1),
            Err(XonXoffError::EarlyXon { count: 2, .. })
        ));
        s.on_data_sent(1);
        s.on_xoff(0).expect("second");
        s.on_xon(0, 1).expect("second");
    }

    #[test]
    fn onion_limits_and_exit_side() {
        let p = XonXoffParams {
            xoff_client: 100,
            xoff_exit: 1000,
            xon_rate: 200,
            ..XonXoffParams::default()
        };
        // Toward an onion service: the client limit, XON allowance
        // min(100, 200) cells.
        let mut s = XonXoffSender::new(p, EdgePosition::Client, EdgePosition::OnionService);
        s.on_data_sent(100 * CELL);
        s.on_xon(0, 1).expect("100 cells");
        s.on_xoff(0).expect("100 cells");
        // An exit checks nothing (the dropmark defence protects clients).
        let mut e = XonXoffSender::new(p, EdgePosition::Exit, EdgePosition::Client);
        for _ in 0..10 {
            e.on_xoff(0).expect("exit accepts");
            e.on_xon(0, 0).expect("exit accepts");
        }
        assert_eq!(e.on_xon(1, 0), Err(XonXoffError::UnknownVersion(1)));
    }

    /// Messages flowing back from the receiving edge to the sender, in
    /// circuit order: SENDME-like credits (one per delivered cell) and
    /// flow-control actions.
    #[derive(Debug, Clone, Copy)]
    enum Back {
        Credit,
        Flow(FlowAction),
    }

    #[derive(Debug, Clone, Copy)]
    enum Op {
        /// The sender packages up to this many cells.
        Send(u8),
        /// This many cells in flight reach the receiver.
        Deliver(u8),
        /// The edge drains this many bytes.
        Drain(u32),
        /// This many messages reach the sender.
        Back(u8),
        /// Time passes (ms).
        Wait(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u8>().prop_map(Op::Send),
            any::<u8>().prop_map(Op::Deliver),
            (0u32..400_000).prop_map(Op::Drain),
            any::<u8>().prop_map(Op::Back),
            (0u16..2000).prop_map(Op::Wait),
        ]
    }

    proptest! {
        /// An honest client sender and exit receiver, over a circuit that
        /// lets at most `cwnd` cells be in flight: the buffer never holds
        /// more than the XOFF limit plus one cell plus a window; XOFF and
        /// XON alternate (advisory XONs aside); the sender never refuses.
        #[test]
        fn obeying_sender_bounds_the_buffer(ops in proptest::collection::vec(op(), 1..400),
                                            cwnd in 31u64..2000) {
            let p = XonXoffParams::default();
            let mut r = XonXoffReceiver::new(p, EdgePosition::Exit);
            let mut s = XonXoffSender::new(p, EdgePosition::Client, EdgePosition::Exit);
            let mut now = Instant::now();
            let mut inflight = 0u64;
            let mut forward = 0u64;
            let mut back: VecDeque<Back> = VecDeque::new();
            let mut xoff_standing = false;
            for op in ops {
                match op {
                    Op::Send(n) => for _ in 0..n {
                        if !s.can_package() || inflight >= cwnd { break; }
                        s.on_data_sent(CELL);
                        inflight += 1;
                        forward += 1;
                    },
                    Op::Deliver(n) => for _ in 0..u64::from(n).min(forward) {
                        forward -= 1;
                        back.push_back(Back::Credit);
                        if let Some(a) = r.on_data(CELL, now) {
                            prop_assert_eq!(a, FlowAction::SendXoff);
                            prop_assert!(!xoff_standing, "two XOFFs in a row");
                            xoff_standing = true;
                            back.push_back(Back::Flow(a));
                        }
                    },
                    Op::Drain(b) => {
                        if let Some(a) = r.on_drain(b as usize, now) {
                            prop_assert!(matches!(a, FlowAction::SendXon { .. }), "{:?}", a);
                            xoff_standing = false;
                            back.push_back(Back::Flow(a));
                        }
                    }
                    Op::Back(n) => for _ in 0..n {
                        match back.pop_front() {
                            None => break,
                            Some(Back::Credit) => inflight -= 1,
                            Some(Back::Flow(FlowAction::SendXoff)) => s.on_xoff(0).map_err(|e| TestCaseError::fail(e.to_string()))?,
                            Some(Back::Flow(FlowAction::SendXon { kbps })) => s.on_xon(0, kbps).map_err(|e| TestCaseError::fail(e.to_string()))?,
                        }
                    },
                    Op::Wait(ms) => now += Duration::from_millis(u64::from(ms)),
                }
                let bound = p.xoff_limit_bytes(EdgePosition::Exit) + (cwnd + 1) * CELL as u64;
                prop_assert!(r.buffered() <= bound, "{} > {}", r.buffered(), bound);
                prop_assert_eq!(r.xoff_outstanding(), xoff_standing);
            }
        }

        /// A peer that floods XON/XOFF: the client accepts at most one XOFF
        /// per XOFF limit and one XON per min(limit, cc_xon_rate) of data
        /// sent, and refuses the next.
        #[test]
        fn flood_is_refused(sent in 0u64..5_000_000, xoffs in 0u8..40, xons in 0u8..40) {
            let p = XonXoffParams::default();
            let mut s = XonXoffSender::new(p, EdgePosition::Client, EdgePosition::Exit);
            s.on_data_sent(sent as usize);
            let xon_allow = sent / p.xoff_limit_bytes(EdgePosition::Exit).min(p.xon_rate_bytes());
            let mut accepted = 0u64;
            for _ in 0..xons {
                match s.on_xon(0, 7) {
                    Ok(()) => accepted += 1,
                    Err(e) => { prop_assert!(e.closes_circuit()); prop_assert!(matches!(e, XonXoffError::EarlyXon { .. }), "{}", e); }
                }
            }
            prop_assert_eq!(accepted, xon_allow.min(u64::from(xons)));
            let xoff_allow = sent / p.xoff_limit_bytes(EdgePosition::Exit);
            let mut accepted = 0u64;
            for _ in 0..xoffs {
                match s.on_xoff(0) {
                    Ok(()) => accepted += 1,
                    Err(XonXoffError::DuplicateXoff) => {}
                    Err(e) => prop_assert!(matches!(e, XonXoffError::EarlyXoff { .. }), "{}", e),
                }
            }
            prop_assert_eq!(accepted, xoff_allow.min(u64::from(xoffs)).min(1));
        }

        /// Any input to the receiver: no panic, and never two XOFFs in a row.
        #[test]
        fn receiver_never_panics(events in proptest::collection::vec((any::<bool>(), any::<u32>(), 0u64..10_000_000), 1..300)) {
            let mut r = exit_receiver();
            let mut now = Instant::now();
            let mut standing = false;
            for (arrive, n, us) in events {
                now += Duration::from_micros(us);
                let a = if arrive { r.on_data(n as usize, now) } else { r.on_drain(n as usize, now) };
                match a {
                    Some(FlowAction::SendXoff) => { prop_assert!(!standing); standing = true; }
                    Some(FlowAction::SendXon { .. }) => standing = false,
                    None => {}
                }
            }
        }
    }
}
