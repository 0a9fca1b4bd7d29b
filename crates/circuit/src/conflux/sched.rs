//! Leg schedulers: which leg of a linked set carries the next multiplexed
//! cell. Each is a decision rule over what the sender knows of its legs
//! ([`LegView`]); none looks at the cells themselves.
//!
//! | Scheduler | Rule | Source |
//! |---|---|---|
//! | [`LegSchedulerKind::RoundRobin`] | `cells_per_leg` cells on a leg, then the next leg in turn; if it cannot send, wait for it | seed 004's local experiment (RR for every system); mUDP-OR's default |
//! | [`LegSchedulerKind::Random`] | a leg that can send, uniformly at random | mUDP-OR's second dispatcher |
//! | [`LegSchedulerKind::Conflux2013`] | the leg that can send with the lowest congestion estimate: the time from sending the cell a SENDME acknowledges to receiving that SENDME (the link RTT until a sample exists) | AlSabah et al. 2013, as seed 004 describes it |
//! | [`LegSchedulerKind::MTor`] | stay on a leg while its window has room, then the next one, first in first out | Yang and Li 2015, as seed 004 describes it |
//! | [`LegSchedulerKind::MinRtt`] | only the leg with the lowest RTT; if it cannot send, wait | proposal 329 3.1 and C tor's `CONFLUX_ALG_MINRTT` |
//! | [`LegSchedulerKind::LowRtt`] | the leg with the lowest RTT among those that can send | proposal 329 3.2 and C tor's `CONFLUX_ALG_LOWRTT` |
//! | [`LegSchedulerKind::CwndRtt`] | the lowest-RTT leg if it can send, else a leg whose window still has room for `cwnd * min_rtt / its_rtt` cells (all of it in slow start) | C tor's `CONFLUX_ALG_CWNDRTT` |
//!
//! mTor's window is the stream-level window (500 cells) per circuit. Here
//! streams belong to the set, not to a leg, so a leg's window is
//! [`LegView::window_room`]: what its circuit-level flow control lets it
//! send. Legs without an RTT sample count as infinitely slow, as in C tor.

use rand::rngs::StdRng;
use rand::RngExt;

/// What the sender knows of one leg when it picks one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LegView<L> {
    /// The leg.
    pub leg: L,
    /// Whether it may send a DATA cell now (window room, local link not
    /// blocked).
    pub can_send: bool,
    /// Cells its circuit-level flow control lets it send now.
    pub window_room: u64,
    /// Its round-trip time in microseconds (smoothed or latest), if
    /// measured.
    pub rtt_us: Option<u64>,
    /// Its congestion window in cells.
    pub cwnd: u64,
    /// Cells sent on it and not yet acknowledged.
    pub inflight: u64,
    /// Whether its congestion control is in slow start.
    pub in_slow_start: bool,
    /// Conflux 2013's congestion estimate in microseconds: the time from
    /// sending the cell a SENDME acknowledges to receiving that SENDME.
    pub sendme_delay_us: Option<u64>,
}

/// A leg-scheduling rule (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegSchedulerKind {
    /// `cells_per_leg` cells per leg in turn.
    RoundRobin {
        /// Cells sent on a leg before moving on (at least 1).
        cells_per_leg: u32,
    },
    /// A random leg that can send.
    Random,
    /// AlSabah et al.'s congestion-based choice.
    Conflux2013,
    /// mTor's window-based first-in-first-out filling.
    MTor,
    /// Only the lowest-RTT leg.
    MinRtt,
    /// The lowest-RTT leg that can send.
    LowRtt,
    /// Lowest RTT, other legs up to their RTT-scaled window.
    CwndRtt,
}

impl LegSchedulerKind {
    /// Every scheduler, with RR's default of one cell per leg.
    pub const ALL: [LegSchedulerKind; 7] = [
        LegSchedulerKind::RoundRobin { cells_per_leg: 1 },
        LegSchedulerKind::Random,
        LegSchedulerKind::Conflux2013,
        LegSchedulerKind::MTor,
        LegSchedulerKind::MinRtt,
        LegSchedulerKind::LowRtt,
        LegSchedulerKind::CwndRtt,
    ];

    /// The names [`parse`](Self::parse) takes, for error messages:
    /// every scheduler's, and round robin's with a cell count.
    pub fn names() -> String {
        let mut names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
        names.insert(1, "round-robin:N");
        names.join(", ")
    }

    /// Its name in settings and reports, without round robin's count
    /// (the `Display` form has it).
    pub fn name(self) -> &'static str {
        match self {
            LegSchedulerKind::RoundRobin { .. } => "round-robin",
            LegSchedulerKind::Random => "random",
            LegSchedulerKind::Conflux2013 => "conflux-2013",
            LegSchedulerKind::MTor => "mtor",
            LegSchedulerKind::MinRtt => "minrtt",
            LegSchedulerKind::LowRtt => "lowrtt",
            LegSchedulerKind::CwndRtt => "cwndrtt",
        }
    }

    /// The scheduler called `name` (`round-robin` takes one cell per leg;
    /// `round-robin:N` takes N).
    pub fn parse(name: &str) -> Option<Self> {
        if let Some(n) = name.strip_prefix("round-robin:") {
            let cells_per_leg = n.parse().ok().filter(|n| *n > 0)?;
            return Some(LegSchedulerKind::RoundRobin { cells_per_leg });
        }
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// lowRTT: what C tor uses for the default UX (high throughput).
impl Default for LegSchedulerKind {
    fn default() -> Self {
        LegSchedulerKind::LowRtt
    }
}

impl std::fmt::Display for LegSchedulerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LegSchedulerKind::RoundRobin { cells_per_leg } if *cells_per_leg != 1 => {
                write!(f, "round-robin:{cells_per_leg}")
            }
            other => f.write_str(other.name()),
        }
    }
}

/// A leg scheduler with its state (current leg, cells sent on it, RNG).
#[derive(Debug)]
pub struct LegScheduler<L> {
    kind: LegSchedulerKind,
    current: Option<L>,
    sent_on_current: u32,
    rng: StdRng,
}

impl<L: Copy + Eq> LegScheduler<L> {
    /// A scheduler of `kind`; `rng` is used by [`LegSchedulerKind::Random`].
    pub fn new(kind: LegSchedulerKind, rng: StdRng) -> Self {
        LegScheduler {
            kind,
            current: None,
            sent_on_current: 0,
            rng,
        }
    }

    /// Its rule.
    pub fn kind(&self) -> LegSchedulerKind {
        self.kind
    }

    /// The leg the next DATA cell goes on, or `None` to wait (no leg the
    /// rule allows can send). `legs` in a fixed order (the order legs
    /// joined the set).
    pub fn choose(&mut self, legs: &[LegView<L>]) -> Option<L> {
        let chosen = match self.kind {
            LegSchedulerKind::RoundRobin { cells_per_leg } => self.round_robin(legs, cells_per_leg),
            LegSchedulerKind::Random => {
                let ready: Vec<L> = legs.iter().filter(|l| l.can_send).map(|l| l.leg).collect();
                (!ready.is_empty()).then(|| ready[self.rng.random_range(0..ready.len())])
            }
            LegSchedulerKind::Conflux2013 => legs
                .iter()
                .filter(|l| l.can_send)
                .min_by_key(|l| l.sendme_delay_us.or(l.rtt_us).unwrap_or(u64::MAX))
                .map(|l| l.leg),
            LegSchedulerKind::MTor => self.fill_in_turn(legs),
            LegSchedulerKind::MinRtt => lowest_rtt(legs.iter())
                .filter(|l| l.can_send)
                .map(|l| l.leg),
            LegSchedulerKind::LowRtt => {
                lowest_rtt(legs.iter().filter(|l| l.can_send)).map(|l| l.leg)
            }
            LegSchedulerKind::CwndRtt => cwnd_rtt(legs),
        };
        match chosen {
            Some(leg) if Some(leg) == self.current => self.sent_on_current += 1,
            Some(leg) => {
                self.current = Some(leg);
                self.sent_on_current = 1;
            }
            None => {}
        }
        chosen
    }

    /// The leg the scheduler sent on last (where a cell that must go out
    /// when no leg can send DATA, such as an END, goes).
    pub fn current(&self) -> Option<L> {
        self.current
    }

    /// Round robin: stay for `per_leg` cells, then move to the next leg
    /// (in `legs` order). Strict: when the leg whose turn it is cannot
    /// send, wait for it rather than skip it, so every leg carries the
    /// same share ("RR ensures equal use of the circuits", seed 004), the
    /// slowest leg setting the pace as it does in the paper's RR.
    fn round_robin(&self, legs: &[LegView<L>], per_leg: u32) -> Option<L> {
        if legs.is_empty() {
            return None;
        }
        let at = self
            .current
            .and_then(|c| legs.iter().position(|l| l.leg == c));
        let turn = match at {
            Some(i) if self.sent_on_current < per_leg.max(1) => i,
            Some(i) => (i + 1) % legs.len(),
            None => 0,
        };
        legs[turn].can_send.then_some(legs[turn].leg)
    }

    /// mTor: the current leg while its window has room, then the next leg
    /// in order whose window has room.
    fn fill_in_turn(&self, legs: &[LegView<L>]) -> Option<L> {
        let open = |l: &LegView<L>| l.can_send && l.window_room > 0;
        let at = self
            .current
            .and_then(|c| legs.iter().position(|l| l.leg == c));
        if let Some(i) = at.filter(|i| open(&legs[*i])) {
            return Some(legs[i].leg);
        }
        let start = at.map_or(0, |i| i + 1);
        (0..legs.len())
            .map(|k| &legs[(start + k) % legs.len()])
            .find(|l| open(l))
            .map(|l| l.leg)
    }
}

/// The leg with the lowest measured RTT (the first of equals).
fn lowest_rtt<'a, L: 'a>(legs: impl Iterator<Item = &'a LegView<L>>) -> Option<&'a LegView<L>> {
    legs.filter(|l| l.rtt_us.is_some())
        .min_by_key(|l| l.rtt_us.unwrap_or(u64::MAX))
}

/// C tor's cwndRTT rule.
fn cwnd_rtt<L: Copy>(legs: &[LegView<L>]) -> Option<L> {
    let fastest = lowest_rtt(legs.iter())?;
    if fastest.can_send {
        return Some(fastest.leg);
    }
    let min_rtt = fastest.rtt_us.unwrap_or(u64::MAX);
    // The last leg (in order) that may still send, as C tor picks it.
    legs.iter()
        .filter(|l| l.can_send && sendable(l, min_rtt) > 0)
        .last()
        .map(|l| l.leg)
}

/// Cells `leg` may send while the fastest leg's acknowledgements travel:
/// its free window scaled by `min_rtt / its RTT` (capped at its cwnd),
/// or all of it in slow start.
fn sendable<L>(leg: &LegView<L>, min_rtt: u64) -> u64 {
    let free = leg.cwnd.saturating_sub(leg.inflight);
    match leg.rtt_us {
        Some(rtt) if rtt > 0 && !leg.in_slow_start => {
            let scaled = u128::from(free) * u128::from(min_rtt) / u128::from(rtt);
            u64::try_from(scaled).unwrap_or(u64::MAX).min(leg.cwnd)
        }
        _ => free,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn leg(id: u8, can_send: bool, rtt_ms: Option<u64>) -> LegView<u8> {
        LegView {
            leg: id,
            can_send,
            window_room: if can_send { 10 } else { 0 },
            rtt_us: rtt_ms.map(|ms| ms * 1000),
            cwnd: 100,
            inflight: if can_send { 50 } else { 100 },
            in_slow_start: false,
            sendme_delay_us: None,
        }
    }

    fn sched(kind: LegSchedulerKind) -> LegScheduler<u8> {
        LegScheduler::new(kind, StdRng::seed_from_u64(1))
    }

    fn run(s: &mut LegScheduler<u8>, legs: &[LegView<u8>], n: usize) -> Vec<Option<u8>> {
        (0..n).map(|_| s.choose(legs)).collect()
    }

    #[test]
    fn round_robin_takes_turns_and_waits_for_a_blocked_leg() {
        let legs = [leg(1, true, None), leg(2, true, None), leg(3, true, None)];
        let mut rr = sched(LegSchedulerKind::RoundRobin { cells_per_leg: 2 });
        let picks = run(&mut rr, &legs, 7);
        assert_eq!(picks, [1, 1, 2, 2, 3, 3, 1].map(Some));
        // Leg 2's turn while it cannot send: wait, never skip it.
        let blocked = [leg(1, true, None), leg(2, false, None), leg(3, true, None)];
        let mut rr = sched(LegSchedulerKind::RoundRobin { cells_per_leg: 1 });
        assert_eq!(run(&mut rr, &blocked, 3), [Some(1), None, None]);
        assert_eq!(rr.current(), Some(1), "the last leg used stays current");
        assert_eq!(run(&mut rr, &legs, 3), [2, 3, 1].map(Some));
        // A leg gone from the set: the turn starts again at the first.
        let fewer = [leg(2, true, None), leg(3, true, None)];
        assert_eq!(run(&mut rr, &fewer, 3), [2, 3, 2].map(Some));
        assert_eq!(rr.choose(&[]), None);
    }

    #[test]
    fn random_uses_every_leg_that_can_send_and_no_other() {
        let legs = [leg(1, true, None), leg(2, false, None), leg(3, true, None)];
        let mut r = sched(LegSchedulerKind::Random);
        let picks = run(&mut r, &legs, 200);
        let ones = picks.iter().filter(|p| **p == Some(1)).count();
        let threes = picks.iter().filter(|p| **p == Some(3)).count();
        assert_eq!(ones + threes, 200);
        assert!(ones > 60 && threes > 60, "{ones} {threes}");
    }

    #[test]
    fn rtt_rules_follow_c_tor() {
        // Leg 1 is fastest but blocked; leg 2 is slower and free; leg 3 is
        // slowest and free.
        let legs = [
            leg(1, false, Some(20)),
            leg(2, true, Some(40)),
            leg(3, true, Some(80)),
        ];
        assert_eq!(
            sched(LegSchedulerKind::MinRtt).choose(&legs),
            None,
            "minRTT waits"
        );
        assert_eq!(sched(LegSchedulerKind::LowRtt).choose(&legs), Some(2));
        // cwndRTT: leg 2 may send 50 * 20/40 = 25 cells, leg 3 50 * 20/80
        // = 12; both > 0, so C tor's loop ends on the last: leg 3.
        assert_eq!(sched(LegSchedulerKind::CwndRtt).choose(&legs), Some(3));
        let mut full3 = legs;
        full3[2].inflight = 99; // 1 * 20/80 = 0 cells.
        assert_eq!(sched(LegSchedulerKind::CwndRtt).choose(&full3), Some(2));
        // The fastest leg free: every RTT rule takes it.
        let free = [leg(1, true, Some(20)), leg(2, true, Some(40))];
        for k in [
            LegSchedulerKind::MinRtt,
            LegSchedulerKind::LowRtt,
            LegSchedulerKind::CwndRtt,
        ] {
            assert_eq!(sched(k).choose(&free), Some(1), "{k:?}");
        }
        // Unmeasured legs count as infinitely slow.
        let unmeasured = [leg(1, true, None), leg(2, true, Some(90))];
        assert_eq!(sched(LegSchedulerKind::LowRtt).choose(&unmeasured), Some(2));
        // In slow start a leg may use its whole free window.
        let mut ss = full3;
        ss[2].in_slow_start = true;
        assert_eq!(sched(LegSchedulerKind::CwndRtt).choose(&ss), Some(3));
    }

    #[test]
    fn conflux_2013_prefers_the_least_congested_leg() {
        let mut legs = [leg(1, true, Some(20)), leg(2, true, Some(40))];
        let mut cb = sched(LegSchedulerKind::Conflux2013);
        assert_eq!(cb.choose(&legs), Some(1), "link RTT until a SENDME sample");
        legs[0].sendme_delay_us = Some(300_000); // Leg 1's queue grew.
        legs[1].sendme_delay_us = Some(60_000);
        assert_eq!(cb.choose(&legs), Some(2));
        legs[1].can_send = false;
        assert_eq!(cb.choose(&legs), Some(1));
    }

    #[test]
    fn mtor_fills_a_leg_until_its_window_closes() {
        let mut legs = [leg(1, true, None), leg(2, true, None)];
        let mut m = sched(LegSchedulerKind::MTor);
        assert_eq!(run(&mut m, &legs, 3), [1, 1, 1].map(Some));
        legs[0].window_room = 0;
        assert_eq!(run(&mut m, &legs, 2), [2, 2].map(Some));
        legs[0].window_room = 5;
        assert_eq!(m.choose(&legs), Some(2), "stays while leg 2 has room");
        legs[1].window_room = 0;
        assert_eq!(m.choose(&legs), Some(1));
        legs[0].window_room = 0;
        assert_eq!(m.choose(&legs), None);
    }

    #[test]
    fn names_round_trip() {
        for k in LegSchedulerKind::ALL {
            assert_eq!(LegSchedulerKind::parse(k.name()), Some(k));
        }
        let rr5 = LegSchedulerKind::RoundRobin { cells_per_leg: 5 };
        assert_eq!(LegSchedulerKind::parse(&rr5.to_string()), Some(rr5));
        assert_eq!(
            LegSchedulerKind::parse("round-robin:5"),
            Some(LegSchedulerKind::RoundRobin { cells_per_leg: 5 })
        );
        assert_eq!(LegSchedulerKind::parse("round-robin:0"), None);
        assert_eq!(LegSchedulerKind::parse("fastest"), None);
    }
}
