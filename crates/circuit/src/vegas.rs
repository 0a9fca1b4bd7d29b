//! TOR_VEGAS circuit congestion control (tor proposal 324, section 3.3),
//! with C tor's parameters for exit circuits.
//!
//! The sender of a circuit measures the circuit's round-trip time from each
//! DATA cell that completes a SENDME increment to the SENDME that
//! acknowledges it, smooths it (N-EWMA), estimates the bandwidth-delay
//! product from the congestion window (`BDP = cwnd * RTT_min / RTT_ewma`)
//! and treats `cwnd - BDP` as the cells queued along the path: below
//! `alpha` the window grows, above `beta` it shrinks, above `delta` it is
//! cut to `BDP + delta`. Slow start is RFC 3742's limited slow start and
//! ends when the queue estimate reaches `gamma`.
//!
//! Sans-IO: fed the times of sent DATA cells and of SENDME arrivals.
//! Written here from the proposal's pseudocode; neither Arti nor any crate
//! offers it as a library.

use std::collections::VecDeque;
use std::time::Instant;

use crate::cc::{CcSnapshot, CongestionControl, RttStats};
use crate::ParamError;

/// Vegas and common congestion-control parameters, named as the consensus
/// parameters of proposal 324 (`cc_*`). [`Default`] is C tor's for exit
/// circuits as the live network runs it (tor 0.4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VegasParams {
    /// `cc_sendme_inc`: cells acknowledged by one SENDME (31).
    pub sendme_inc: u32,
    /// `cc_cwnd_init`: initial window in cells (4 x 31 = 124).
    pub cwnd_init: u32,
    /// `cc_cwnd_min`: the window never goes below this (124).
    pub cwnd_min: u32,
    /// `cc_cwnd_max`: nor above this (`i32::MAX`).
    pub cwnd_max: u32,
    /// `cc_cwnd_inc`: steady-state increment and decrement (1).
    pub cwnd_inc: u32,
    /// `cc_cwnd_inc_rate`: window updates per window of cells after slow
    /// start (31).
    pub cwnd_inc_rate: u32,
    /// `cc_cwnd_inc_pct_ss`: slow-start increment per SENDME, percent of
    /// `sendme_inc`, below the slow-start cap (100: the window doubles
    /// every round trip).
    pub cwnd_inc_pct_ss: u32,
    /// `cc_sscap_exit`: above this window slow start grows as RFC 3742
    /// limited slow start (600).
    pub ss_cap: u32,
    /// `cc_ss_max`: slow start ends here whatever happens (5000).
    pub ss_max: u32,
    /// `cc_vegas_alpha_exit`: below this queue estimate the window grows
    /// (3 x 62 = 186).
    pub alpha: u32,
    /// `cc_vegas_beta_exit`: above this it shrinks (4 x 62 = 248).
    pub beta: u32,
    /// `cc_vegas_gamma_exit`: slow start ends at this queue estimate
    /// (3 x 62 = 186).
    pub gamma: u32,
    /// `cc_vegas_delta_exit`: above this the window is cut to
    /// `BDP + delta` (5 x 62 = 310).
    pub delta: u32,
    /// `cc_ewma_cwnd_pct`: the RTT's N-EWMA spans this percentage of the
    /// SENDMEs between two window updates (50).
    pub ewma_cwnd_pct: u32,
    /// `cc_ewma_max`: ... at most this many (10).
    pub ewma_max: u32,
    /// `cc_ewma_ss`: N during slow start (2).
    pub ewma_ss: u32,
    /// `cc_rtt_reset_pct`: when the window falls to its minimum after slow
    /// start, `RTT_min` moves this far toward the current RTT (100).
    pub rtt_reset_pct: u32,
    /// `cc_cwnd_full_gap`: the window counts as full when fewer than this
    /// many SENDME increments are left unused (4).
    pub cwnd_full_gap: u32,
    /// `cc_cwnd_full_minpct`: ... and stops counting as full below this
    /// percentage of use (25).
    pub cwnd_full_minpct: u32,
    /// `cc_cwnd_full_per_cwnd`: the full state is reset once per window
    /// (true) rather than once per window update (false).
    pub cwnd_full_per_cwnd: bool,
}

impl Default for VegasParams {
    fn default() -> Self {
        VegasParams {
            sendme_inc: 31,
            cwnd_init: 124,
            cwnd_min: 124,
            cwnd_max: i32::MAX as u32,
            cwnd_inc: 1,
            cwnd_inc_rate: 31,
            cwnd_inc_pct_ss: 100,
            ss_cap: 600,
            ss_max: 5000,
            alpha: 186,
            beta: 248,
            gamma: 186,
            delta: 310,
            ewma_cwnd_pct: 50,
            ewma_max: 10,
            ewma_ss: 2,
            rtt_reset_pct: 100,
            cwnd_full_gap: 4,
            cwnd_full_minpct: 25,
            cwnd_full_per_cwnd: true,
        }
    }
}

impl VegasParams {
    /// The parameters by their consensus names (proposal 324 section 6.5),
    /// for setting one by name. `cc_cwnd_full_per_cwnd` is 0 or 1.
    pub fn named_mut(&mut self) -> Vec<(&'static str, ParamSlot<'_>)> {
        vec![
            ("cc_sendme_inc", ParamSlot::Int(&mut self.sendme_inc)),
            ("cc_cwnd_init", ParamSlot::Int(&mut self.cwnd_init)),
            ("cc_cwnd_min", ParamSlot::Int(&mut self.cwnd_min)),
            ("cc_cwnd_max", ParamSlot::Int(&mut self.cwnd_max)),
            ("cc_cwnd_inc", ParamSlot::Int(&mut self.cwnd_inc)),
            ("cc_cwnd_inc_rate", ParamSlot::Int(&mut self.cwnd_inc_rate)),
            (
                "cc_cwnd_inc_pct_ss",
                ParamSlot::Int(&mut self.cwnd_inc_pct_ss),
            ),
            ("cc_sscap_exit", ParamSlot::Int(&mut self.ss_cap)),
            ("cc_ss_max", ParamSlot::Int(&mut self.ss_max)),
            ("cc_vegas_alpha_exit", ParamSlot::Int(&mut self.alpha)),
            ("cc_vegas_beta_exit", ParamSlot::Int(&mut self.beta)),
            ("cc_vegas_gamma_exit", ParamSlot::Int(&mut self.gamma)),
            ("cc_vegas_delta_exit", ParamSlot::Int(&mut self.delta)),
            ("cc_ewma_cwnd_pct", ParamSlot::Int(&mut self.ewma_cwnd_pct)),
            ("cc_ewma_max", ParamSlot::Int(&mut self.ewma_max)),
            ("cc_ewma_ss", ParamSlot::Int(&mut self.ewma_ss)),
            ("cc_rtt_reset_pct", ParamSlot::Int(&mut self.rtt_reset_pct)),
            ("cc_cwnd_full_gap", ParamSlot::Int(&mut self.cwnd_full_gap)),
            (
                "cc_cwnd_full_minpct",
                ParamSlot::Int(&mut self.cwnd_full_minpct),
            ),
            (
                "cc_cwnd_full_per_cwnd",
                ParamSlot::Bool(&mut self.cwnd_full_per_cwnd),
            ),
        ]
    }

    /// Check the ranges proposal 324 gives (and that the window can ever
    /// be acknowledged: `cwnd_min` and `cwnd_init` at least `sendme_inc`).
    ///
    /// # Errors
    ///
    /// The first parameter out of its range.
    pub fn validate(&self) -> Result<(), ParamError> {
        let checks = [
            ("cc_sendme_inc", self.sendme_inc, 1, 255),
            ("cc_cwnd_init", self.cwnd_init, 31, 10_000),
            ("cc_cwnd_min", self.cwnd_min, 31, 1000),
            ("cc_cwnd_max", self.cwnd_max, 500, i32::MAX as u32),
            ("cc_cwnd_inc", self.cwnd_inc, 1, 1000),
            ("cc_cwnd_inc_rate", self.cwnd_inc_rate, 1, 250),
            ("cc_cwnd_inc_pct_ss", self.cwnd_inc_pct_ss, 1, 500),
            ("cc_sscap_exit", self.ss_cap, 100, i32::MAX as u32),
            ("cc_ss_max", self.ss_max, 500, i32::MAX as u32),
            ("cc_vegas_alpha_exit", self.alpha, 0, 1000),
            ("cc_vegas_beta_exit", self.beta, 0, 1000),
            ("cc_vegas_gamma_exit", self.gamma, 0, 1000),
            ("cc_vegas_delta_exit", self.delta, 0, i32::MAX as u32),
            ("cc_ewma_cwnd_pct", self.ewma_cwnd_pct, 1, 255),
            ("cc_ewma_max", self.ewma_max, 2, i32::MAX as u32),
            ("cc_ewma_ss", self.ewma_ss, 2, i32::MAX as u32),
            ("cc_rtt_reset_pct", self.rtt_reset_pct, 0, 100),
            ("cc_cwnd_full_gap", self.cwnd_full_gap, 0, i16::MAX as u32),
            ("cc_cwnd_full_minpct", self.cwnd_full_minpct, 0, 100),
        ];
        ParamError::check_ranges(&checks)?;
        for (low, high, in_order) in [
            (
                "cc_sendme_inc",
                "cc_cwnd_min",
                self.sendme_inc <= self.cwnd_min,
            ),
            (
                "cc_sendme_inc",
                "cc_cwnd_init",
                self.sendme_inc <= self.cwnd_init,
            ),
            ("cc_cwnd_min", "cc_cwnd_max", self.cwnd_min <= self.cwnd_max),
        ] {
            if !in_order {
                return Err(ParamError::Order { low, high });
            }
        }
        Ok(())
    }
}

/// A congestion-control parameter, to read or set by name.
#[derive(Debug)]
pub enum ParamSlot<'a> {
    /// A count or percentage.
    Int(&'a mut u32),
    /// A switch, 0 or 1 in a consensus.
    Bool(&'a mut bool),
}

impl ParamSlot<'_> {
    /// The value as a consensus carries it.
    pub fn get(&self) -> u32 {
        match self {
            ParamSlot::Int(v) => **v,
            ParamSlot::Bool(b) => u32::from(**b),
        }
    }

    /// Set the parameter `name` from a consensus value.
    ///
    /// # Errors
    ///
    /// A switch set to anything but 0 or 1.
    pub fn set(&mut self, name: &str, value: u32) -> Result<(), ParamError> {
        match self {
            ParamSlot::Int(v) => **v = value,
            ParamSlot::Bool(b) => {
                **b = match value {
                    0 => false,
                    1 => true,
                    _ => {
                        return Err(ParamError::NotSwitch {
                            name: name.to_string(),
                            value,
                        })
                    }
                }
            }
        }
        Ok(())
    }
}

/// Ratio beyond which an RTT sample is taken for a clock jump or stall
/// (proposal 324 section 2.1.1).
const CLOCK_JUMP_RATIO: u64 = 5000;

/// TOR_VEGAS state of one circuit's sending side.
#[derive(Debug, Clone)]
pub struct Vegas {
    p: VegasParams,
    cwnd: u32,
    inflight: u32,
    in_slow_start: bool,
    cwnd_full: bool,
    next_cc_event: u32,
    next_cwnd_event: u32,
    /// DATA cells sent so far (the SENDME cadence).
    sent: u64,
    /// When each not yet acknowledged `sendme_inc`-th cell was sent.
    stamps: VecDeque<Instant>,
    rtt: RttStats,
    /// The last sample was a zero delta (proposal 324's global stall flag,
    /// kept per circuit here).
    clock_stalled: bool,
    /// Whether the link to the next hop is blocked (set by the driver;
    /// an immediate congestion signal).
    orconn_blocked: bool,
    /// `orconn_blocked` as the last SENDME found it: a change is a
    /// congestion event at once (C tor's `blocked_chan`).
    blocked_at_last_ack: bool,
}

impl Vegas {
    /// A circuit's sender with `params` (checked with
    /// [`VegasParams::validate`] by the caller).
    pub fn new(params: VegasParams) -> Self {
        Vegas {
            p: params,
            cwnd: params.cwnd_init,
            inflight: 0,
            in_slow_start: true,
            cwnd_full: false,
            next_cc_event: 0,
            next_cwnd_event: 0,
            sent: 0,
            stamps: VecDeque::new(),
            rtt: RttStats::default(),
            clock_stalled: false,
            orconn_blocked: false,
            blocked_at_last_ack: false,
        }
    }

    /// The congestion window in cells.
    pub fn cwnd(&self) -> u32 {
        self.cwnd
    }

    /// Cells sent and not yet acknowledged.
    pub fn inflight(&self) -> u32 {
        self.inflight
    }

    /// Still in slow start?
    pub fn in_slow_start(&self) -> bool {
        self.in_slow_start
    }

    /// The RTT estimates.
    pub fn rtt(&self) -> RttStats {
        self.rtt
    }

    /// The parameters.
    pub fn params(&self) -> &VegasParams {
        &self.p
    }

    /// Tell whether the channel toward the next hop is blocked (cells wait
    /// for the transport): taken as congestion at the next SENDME. As in C
    /// tor, the state each SENDME finds is compared with the previous
    /// SENDME's, and a change (blocked or unblocked) makes that SENDME a
    /// congestion event whatever the once-per-window pacing.
    pub fn set_orconn_blocked(&mut self, blocked: bool) {
        self.orconn_blocked = blocked;
    }

    /// The BDP estimate from the window (proposal 324 section 3.1.2), in
    /// cells; the window itself before any RTT sample.
    pub fn bdp(&self) -> u32 {
        if self.rtt.ewma_us == 0 {
            return self.cwnd;
        }
        let bdp = u64::from(self.cwnd) * self.rtt.min_us / self.rtt.ewma_us;
        u32::try_from(bdp).unwrap_or(u32::MAX)
    }

    fn sendmes_per_cwnd(&self) -> u32 {
        (self.cwnd + self.p.sendme_inc / 2) / self.p.sendme_inc
    }

    fn cwnd_update_rate(&self) -> u32 {
        if self.in_slow_start {
            1
        } else {
            let per = self.p.cwnd_inc_rate * self.p.sendme_inc;
            (self.cwnd + per / 2) / per
        }
    }

    fn ewma_n(&self) -> u64 {
        if self.in_slow_start {
            u64::from(self.p.ewma_ss)
        } else {
            let n = u64::from(self.cwnd_update_rate()) * u64::from(self.p.ewma_cwnd_pct) / 100;
            n.min(u64::from(self.p.ewma_max)).max(2)
        }
    }

    /// Take an RTT sample ending now; false if the clock stalled or jumped
    /// (then nothing else is updated this round).
    fn sample_rtt(&mut self, sent_at: Instant, now: Instant) -> bool {
        let us =
            u64::try_from(now.saturating_duration_since(sent_at).as_micros()).unwrap_or(u64::MAX);
        if us == 0 {
            self.clock_stalled = true;
            self.rtt.ignored += 1;
            return false;
        }
        let ewma = self.rtt.ewma_us;
        if ewma != 0 && !self.in_slow_start {
            if us > ewma.saturating_mul(CLOCK_JUMP_RATIO) {
                self.rtt.ignored += 1;
                return false;
            }
            if us.saturating_mul(CLOCK_JUMP_RATIO) < ewma && self.clock_stalled {
                self.rtt.ignored += 1;
                return false;
            }
        }
        self.clock_stalled = false;
        let n = self.ewma_n();
        self.rtt.ewma_us = if ewma == 0 {
            us
        } else {
            // Proposal 324 section 2.1.2, in the rearranged form it requires.
            (us * 2 + ewma * (n - 1)) / (n + 1)
        };
        self.rtt.max_us = self.rtt.max_us.max(us);
        if self.rtt.min_us == 0 || self.rtt.ewma_us < self.rtt.min_us {
            self.rtt.min_us = self.rtt.ewma_us;
        }
        self.rtt.samples += 1;
        true
    }

    /// RFC 3742 limited slow start's increment (proposal 324 section 3.3).
    fn ss_inc(&self) -> u32 {
        if self.cwnd <= self.p.ss_cap {
            (self.p.cwnd_inc_pct_ss * self.p.sendme_inc + 50) / 100
        } else {
            let num = u64::from(self.p.sendme_inc) * u64::from(self.p.ss_cap);
            let den = 2 * u64::from(self.cwnd);
            u32::try_from((num + den / 2) / den).unwrap_or(1).max(1)
        }
    }

    fn update_full(&mut self) {
        let gap = u64::from(self.p.cwnd_full_gap) * u64::from(self.p.sendme_inc);
        if u64::from(self.inflight) + gap >= u64::from(self.cwnd) {
            self.cwnd_full = true;
        } else if 100 * u64::from(self.inflight)
            < u64::from(self.p.cwnd_full_minpct) * u64::from(self.cwnd)
        {
            self.cwnd_full = false;
        }
    }

    fn slow_start_step(&mut self, bdp: u32, queue: u32) {
        if queue < self.p.gamma && !self.orconn_blocked {
            if self.cwnd_full {
                let inc = self.ss_inc();
                self.cwnd = self.cwnd.saturating_add(inc);
                let per_cwnd = u64::from(inc) * u64::from(self.sendmes_per_cwnd());
                if per_cwnd <= u64::from(self.p.cwnd_inc) * u64::from(self.p.cwnd_inc_rate) {
                    self.in_slow_start = false;
                }
            }
        } else {
            self.in_slow_start = false;
            self.cwnd = bdp.saturating_add(self.p.gamma);
        }
        if self.cwnd >= self.p.ss_max {
            self.cwnd = self.p.ss_max;
            self.in_slow_start = false;
        }
    }

    fn steady_step(&mut self, bdp: u32, queue: u32) {
        if queue > self.p.delta {
            self.cwnd = bdp
                .saturating_add(self.p.delta)
                .saturating_sub(self.p.cwnd_inc);
        } else if queue > self.p.beta || self.orconn_blocked {
            self.cwnd = self.cwnd.saturating_sub(self.p.cwnd_inc);
        } else if self.cwnd_full && queue < self.p.alpha {
            self.cwnd = self.cwnd.saturating_add(self.p.cwnd_inc);
        }
    }

    /// The window at its minimum after slow start: move `RTT_min` toward
    /// the current RTT so a circuit can escape starvation (section 3.1.2).
    fn maybe_reset_min_rtt(&mut self) {
        if !self.in_slow_start && self.cwnd <= self.p.cwnd_min {
            let pct = u64::from(self.p.rtt_reset_pct);
            self.rtt.min_us = (pct * self.rtt.ewma_us + (100 - pct) * self.rtt.min_us) / 100;
        }
    }

    /// A SENDME arrived at `now`: the pseudocode of proposal 324 section
    /// 3.3, run on every SENDME. The caller has checked the SENDME
    /// (authenticated, expected).
    fn on_ack(&mut self, now: Instant) {
        self.next_cc_event = self.next_cc_event.saturating_sub(1);
        self.next_cwnd_event = self.next_cwnd_event.saturating_sub(1);
        let sampled = match self.stamps.pop_front() {
            Some(sent_at) => self.sample_rtt(sent_at, now),
            None => false,
        };
        if !sampled {
            self.inflight = self.inflight.saturating_sub(self.p.sendme_inc);
            return;
        }
        if self.orconn_blocked != self.blocked_at_last_ack {
            self.blocked_at_last_ack = self.orconn_blocked;
            self.next_cc_event = 0;
        }
        let bdp = self.bdp();
        let queue = self.cwnd.saturating_sub(bdp);
        self.update_full();
        if self.in_slow_start {
            self.slow_start_step(bdp, queue);
        } else if self.next_cc_event == 0 {
            self.steady_step(bdp, queue);
        }
        self.cwnd = self.cwnd.clamp(self.p.cwnd_min, self.p.cwnd_max);
        self.maybe_reset_min_rtt();
        if self.next_cc_event == 0 {
            self.next_cc_event = self.cwnd_update_rate();
        }
        if self.next_cwnd_event == 0 {
            self.next_cwnd_event = self.sendmes_per_cwnd();
        }
        let reset_full = if self.p.cwnd_full_per_cwnd {
            self.next_cwnd_event == self.sendmes_per_cwnd()
        } else {
            self.next_cc_event == self.cwnd_update_rate()
        };
        if reset_full {
            self.cwnd_full = false;
        }
        self.inflight = self.inflight.saturating_sub(self.p.sendme_inc);
    }
}

impl CongestionControl for Vegas {
    fn can_send(&self) -> bool {
        self.inflight < self.cwnd
    }

    fn on_data_sent(&mut self, now: Instant) {
        self.inflight = self.inflight.saturating_add(1);
        self.sent += 1;
        if self.sent.is_multiple_of(u64::from(self.p.sendme_inc)) {
            self.stamps.push_back(now);
        }
    }

    fn on_sendme(&mut self, now: Instant) {
        self.on_ack(now);
    }

    fn available(&self) -> u32 {
        self.cwnd.saturating_sub(self.inflight)
    }

    fn sendme_inc(&self) -> u32 {
        self.p.sendme_inc
    }

    fn set_channel_blocked(&mut self, blocked: bool) {
        self.set_orconn_blocked(blocked);
    }

    fn snapshot(&self) -> Option<CcSnapshot> {
        Some(CcSnapshot {
            cwnd: self.cwnd,
            inflight: self.inflight,
            in_slow_start: self.in_slow_start,
            rtt: self.rtt,
            channel_blocked: self.orconn_blocked,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use proptest::prelude::*;

    /// The RTT of a path of base RTT `base` that carries `bdp` cells per
    /// round trip: every cell in flight beyond it waits in a queue,
    /// adding `per_cell`.
    fn rtt_with_queue(base: Duration, bdp: u32, inflight: u32, per_cell: Duration) -> Duration {
        base + per_cell * inflight.saturating_sub(bdp)
    }

    /// Drive a bulk sender through a path of base RTT `base` and capacity
    /// `bdp` cells per RTT (cells beyond it queue, adding `per_cell` of
    /// delay each), for `rounds` round trips; returns the windows seen.
    fn bulk(v: &mut Vegas, base: Duration, bdp: u32, per_cell: Duration, rounds: u32) -> Vec<u32> {
        let mut now = Instant::now();
        let mut windows = Vec::new();
        for _ in 0..rounds {
            let mut sent_times = Vec::new();
            while v.can_send() {
                v.on_data_sent(now);
                sent_times.push(now);
            }
            let rtt = rtt_with_queue(base, bdp, v.inflight(), per_cell);
            now += rtt;
            // Every SENDME of this round arrives about one RTT after its cell.
            let acks = v.inflight() / v.params().sendme_inc;
            for _ in 0..acks {
                v.on_sendme(now);
            }
            windows.push(v.cwnd());
        }
        windows
    }

    #[test]
    fn defaults_are_c_tors_and_valid() {
        let p = VegasParams::default();
        p.validate().expect("valid");
        assert_eq!(
            (p.sendme_inc, p.cwnd_init, p.alpha, p.beta, p.gamma, p.delta),
            (31, 124, 186, 248, 186, 310)
        );
        assert_eq!((p.ss_cap, p.ss_max), (600, 5000));
        let bad = VegasParams { cwnd_min: 20, ..p };
        assert_eq!(
            bad.validate(),
            Err(ParamError::OutOfRange {
                name: "cc_cwnd_min",
                value: 20,
                min: 31,
                max: 1000
            })
        );
        let above_max = VegasParams {
            cwnd_min: 600,
            cwnd_max: 500,
            ..p
        };
        assert_eq!(
            above_max.validate(),
            Err(ParamError::Order {
                low: "cc_cwnd_min",
                high: "cc_cwnd_max"
            })
        );
    }

    #[test]
    fn slow_start_doubles_below_the_cap_then_limits() {
        let v = Vegas::new(VegasParams::default());
        // Below the cap: 100% of 31 per SENDME, i.e. doubling per RTT.
        assert_eq!(v.ss_inc(), 31);
        let mut w = v.clone();
        w.cwnd = 1200;
        // RFC 3742 above the cap: round(31 * 600 / (2 * 1200)) = 8.
        assert_eq!(w.ss_inc(), 8);
        w.cwnd = 100_000;
        assert_eq!(w.ss_inc(), 1, "at least one");
    }

    #[test]
    fn slow_start_ends_at_gamma_and_the_window_settles_near_the_bdp() {
        let mut v = Vegas::new(VegasParams::default());
        let base = Duration::from_millis(100);
        // A path that carries 1000 cells per RTT; each queued cell adds
        // 0.1 ms.
        let w = bulk(&mut v, base, 1000, Duration::from_micros(100), 60);
        assert!(!v.in_slow_start(), "{w:?}");
        let last = *w.last().expect("rounds");
        // Vegas keeps between alpha and beta cells queued: the window ends
        // above the BDP, by less than delta.
        assert!(last > 1000 && last < 1000 + 310 + 31, "{w:?}");
        // It grew at first (slow start doubled it from 124).
        assert!(w[0] > 124 && w[1] > w[0], "{w:?}");
    }

    #[test]
    fn a_path_that_stays_fast_lets_slow_start_reach_its_hard_max() {
        let mut v = Vegas::new(VegasParams::default());
        // No queueing delay at all: no congestion signal ever.
        let w = bulk(
            &mut v,
            Duration::from_millis(50),
            u32::MAX,
            Duration::ZERO,
            40,
        );
        assert!(!v.in_slow_start());
        let at_max = w
            .iter()
            .position(|&c| c == 5000)
            .expect("slow start hit cc_ss_max");
        // Then steady state: one cell per window update, a few per round.
        for pair in w[at_max..].windows(2) {
            assert!(pair[1] >= pair[0] && pair[1] - pair[0] <= 31, "{w:?}");
        }
    }

    #[test]
    fn the_window_follows_the_path_when_its_capacity_halves() {
        let mut v = Vegas::new(VegasParams::default());
        let base = Duration::from_millis(100);
        let before = bulk(&mut v, base, 1000, Duration::from_micros(100), 60);
        let settled = *before.last().expect("rounds");
        // Half the rate: 500 cells per round trip, each queued cell waits
        // twice as long.
        let after = bulk(&mut v, base, 500, Duration::from_micros(200), 120);
        let last = *after.last().expect("rounds");
        assert!(after.iter().all(|&c| c >= 124));
        assert!(
            last < settled && last > 500 && last < 500 + 310 + 31,
            "{settled} then {after:?}"
        );
    }

    #[test]
    fn a_blocked_channel_ends_slow_start_and_shrinks_the_window_at_once() {
        let base = Duration::from_millis(100);
        // In slow start on a fast path, a blocked channel ends it at the
        // next SENDME (the window set from the BDP estimate).
        let mut v = Vegas::new(VegasParams::default());
        bulk(&mut v, base, u32::MAX, Duration::ZERO, 2);
        assert!(v.in_slow_start());
        v.set_channel_blocked(true);
        bulk(&mut v, base, u32::MAX, Duration::ZERO, 1);
        assert!(!v.in_slow_start(), "blocked, still in slow start");
        // In steady state a change of the signal is a congestion event at
        // the very next SENDME, whatever the once-per-window pacing:
        // blocked takes cwnd_inc off, and keeps doing so once per window.
        let mut v = Vegas::new(VegasParams::default());
        bulk(&mut v, base, 1000, Duration::from_micros(100), 60);
        assert!(!v.in_slow_start());
        let now = Instant::now();
        while v.can_send() {
            v.on_data_sent(now);
        }
        let settled = v.cwnd();
        v.next_cc_event = 5;
        v.set_channel_blocked(true);
        v.on_sendme(now + base);
        assert_eq!(v.cwnd(), settled - v.params().cwnd_inc);
        let blocked = bulk(&mut v, base, 1000, Duration::from_micros(100), 20);
        assert!(blocked.windows(2).all(|w| w[1] <= w[0]), "{blocked:?}");
        assert!(
            *blocked.last().expect("rounds") < settled - 31,
            "{blocked:?}"
        );
        // Unblocked, it grows back toward the path's capacity.
        v.set_channel_blocked(false);
        let free = bulk(&mut v, base, 1000, Duration::from_micros(100), 60);
        assert!(*free.last().expect("rounds") > 1000, "{free:?}");
    }

    #[test]
    fn stalled_clocks_are_ignored() {
        let mut v = Vegas::new(VegasParams::default());
        let now = Instant::now();
        for _ in 0..31 {
            v.on_data_sent(now);
        }
        let before = v.cwnd();
        v.on_sendme(now);
        assert_eq!(v.rtt().ignored, 1);
        assert_eq!(v.rtt().samples, 0);
        assert_eq!(v.cwnd(), before, "no update on a zero RTT");
        assert_eq!(v.inflight(), 0, "but the cells are acknowledged");
    }

    #[test]
    fn ewma_uses_the_rearranged_form() {
        let mut v = Vegas::new(VegasParams::default());
        let t0 = Instant::now();
        assert!(v.sample_rtt(t0, t0 + Duration::from_micros(1000)));
        assert_eq!(v.rtt().ewma_us, 1000);
        // Slow start: N = 2, so (2 * 4000 + 1000 * 1) / 3 = 3000.
        assert!(v.sample_rtt(t0, t0 + Duration::from_micros(4000)));
        assert_eq!(v.rtt().ewma_us, 3000);
        assert_eq!(v.rtt().min_us, 1000);
        assert_eq!(v.rtt().max_us, 4000);
    }

    proptest! {
        /// Whatever the RTTs, the window stays within its bounds, and the
        /// sender never has more in flight than the window allowed when it
        /// sent.
        #[test]
        fn window_bounds_hold(rtts in proptest::collection::vec(1u64..500_000, 1..200),
                              blocked in proptest::collection::vec(any::<bool>(), 1..200)) {
            let p = VegasParams::default();
            let mut v = Vegas::new(p);
            let mut now = Instant::now();
            for (i, us) in rtts.iter().enumerate() {
                while v.can_send() {
                    prop_assert!(v.inflight() < v.cwnd());
                    v.on_data_sent(now);
                    // Never more in flight than the window allowed.
                    prop_assert!(v.inflight() <= v.cwnd());
                }
                prop_assert_eq!(v.available(), 0);
                v.set_orconn_blocked(blocked[i % blocked.len()]);
                now += Duration::from_micros(*us);
                let acks = v.inflight() / p.sendme_inc;
                for _ in 0..acks {
                    v.on_sendme(now);
                    prop_assert!(v.cwnd() >= p.cwnd_min);
                    prop_assert!(v.cwnd() <= p.cwnd_max);
                    prop_assert!(!v.in_slow_start() || v.cwnd() <= p.ss_max);
                }
            }
        }
    }
}
