//! The decision of how many DATA cells a circuit may have in flight toward
//! one hop: the [`CongestionControl`] trait every algorithm implements,
//! tor-spec's [`FixedWindow`], and what an algorithm shows of itself
//! ([`CcSnapshot`], [`RttStats`]). Proposal 324's TOR_VEGAS is
//! [`Vegas`](crate::vegas::Vegas); which one a circuit runs is its
//! [`CircuitCc`](crate::flow::CircuitCc).

use std::time::Instant;

/// Initial circuit package/deliver window, in DATA cells.
pub const CIRCWINDOW_START: u32 = 1000;
/// Cells acknowledged by one circuit-level SENDME.
pub const CIRCWINDOW_INCREMENT: u32 = 100;

/// Decides how many DATA cells a circuit may send toward one hop before it
/// must wait for acknowledgements.
pub trait CongestionControl: std::fmt::Debug + Send {
    /// May one more DATA cell be sent now?
    fn can_send(&self) -> bool;
    /// A DATA cell was sent.
    fn on_data_sent(&mut self, now: Instant);
    /// A valid circuit-level SENDME acknowledged [`sendme_inc`](Self::sendme_inc) cells.
    fn on_sendme(&mut self, now: Instant);
    /// DATA cells that may still be sent before waiting (for inspection).
    fn available(&self) -> u32;
    /// DATA cells one SENDME acknowledges (tor-spec's 100 unless the
    /// algorithm negotiated another `cc_sendme_inc`).
    fn sendme_inc(&self) -> u32 {
        CIRCWINDOW_INCREMENT
    }
    /// The algorithm's state, for logs and tests (None: nothing to show).
    fn snapshot(&self) -> Option<CcSnapshot> {
        None
    }
    /// Whether the channel the circuit sends on is blocked now (its cells
    /// wait for the transport): a congestion signal to algorithms that use
    /// one (TOR_VEGAS); ignored by default.
    fn set_channel_blocked(&mut self, blocked: bool) {
        let _ = blocked;
    }
}

/// The state of an RTT-based congestion control at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CcSnapshot {
    /// Congestion window, in cells.
    pub cwnd: u32,
    /// Cells in flight.
    pub inflight: u32,
    /// Still in slow start?
    pub in_slow_start: bool,
    /// Smoothed and minimum RTT, and how many samples were taken.
    pub rtt: RttStats,
    /// Whether the channel it sends on was last reported blocked.
    pub channel_blocked: bool,
}

/// tor-spec's fixed circuit window: at most 1000 unacknowledged DATA cells.
#[derive(Debug, Clone)]
pub struct FixedWindow {
    package_window: u32,
}

impl Default for FixedWindow {
    fn default() -> Self {
        FixedWindow {
            package_window: CIRCWINDOW_START,
        }
    }
}

impl CongestionControl for FixedWindow {
    fn can_send(&self) -> bool {
        self.package_window > 0
    }
    fn on_data_sent(&mut self, _now: Instant) {
        self.package_window = self.package_window.saturating_sub(1);
    }
    fn on_sendme(&mut self, _now: Instant) {
        self.package_window += CIRCWINDOW_INCREMENT;
    }
    fn available(&self) -> u32 {
        self.package_window
    }
}

/// The circuit's RTT: smoothed, minimum and maximum (microseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RttStats {
    /// N-EWMA of the samples (0 before the first).
    pub ewma_us: u64,
    /// Least smoothed value seen (0 before the first sample).
    pub min_us: u64,
    /// Largest sample.
    pub max_us: u64,
    /// Samples taken.
    pub samples: u64,
    /// Samples ignored as a clock stall or jump.
    pub ignored: u64,
}
