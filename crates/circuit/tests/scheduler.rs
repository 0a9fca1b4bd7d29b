//! Circuit schedulers in a deterministic channel simulation: one channel
//! writes one cell per millisecond (simulated), bulk circuits are always
//! backlogged, and a light circuit queues one cell every 100 ms. EWMA must
//! give the light circuit lower queueing delay than round robin.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use onionlab_circuit::scheduler::{
    lane_priority_level, CircuitScheduler, Ewma, RoundRobin, SchedulerKind, MAX_LANE_PRIORITY_LEVEL,
};

const LIGHT: u32 = 0;
const SLOT: Duration = Duration::from_millis(1);

/// Returns the queueing delays of the light circuit's cells, in slots.
fn simulate(kind: SchedulerKind, n_bulk: u32, seconds: u64) -> Vec<u32> {
    let mut sched: Box<dyn CircuitScheduler<u32>> = kind.build();
    let start = Instant::now();
    // Per-circuit FIFO of the slot at which each cell was queued.
    let mut queues: HashMap<u32, VecDeque<u64>> = HashMap::new();
    let mut delays = Vec::new();
    let slots = seconds * 1000;
    for slot in 0..slots {
        let now = start + SLOT * u32::try_from(slot).expect("slot");
        // Bulk circuits keep a deep backlog.
        for c in 1..=n_bulk {
            let q = queues.entry(c).or_default();
            while q.len() < 50 {
                q.push_back(slot);
            }
            sched.activate(c, now);
        }
        if slot % 100 == 0 {
            queues.entry(LIGHT).or_default().push_back(slot);
            sched.activate(LIGHT, now);
        }
        // Write one cell.
        let Some(c) = sched.next(now) else { continue };
        let q = queues.get_mut(&c).expect("active circuit has a queue");
        let queued_at = q.pop_front().expect("active circuit has a cell");
        sched.on_sent(c, 1, now);
        if !q.is_empty() {
            sched.activate(c, now);
        }
        if c == LIGHT {
            delays.push(u32::try_from(slot - queued_at).expect("delay"));
        }
    }
    delays
}

fn mean(v: &[u32]) -> f64 {
    v.iter().map(|x| f64::from(*x)).sum::<f64>() / v.len() as f64
}

#[test]
fn ewma_favours_the_light_circuit() {
    let ewma = SchedulerKind::Ewma {
        half_life: Duration::from_secs(30),
    };
    for n_bulk in [1, 4, 16] {
        let rr = simulate(SchedulerKind::RoundRobin, n_bulk, 60);
        let ew = simulate(ewma, n_bulk, 60);
        assert_eq!(rr.len(), 600);
        assert_eq!(ew.len(), 600);
        // Once history exists (after the first cell, when all circuits tie
        // at zero and the longest-waiting goes first), the light circuit has
        // sent far fewer cells than any bulk one, so EWMA sends its cell in
        // the very next slot.
        assert!(
            ew[1..].iter().all(|d| *d == 0),
            "EWMA delays with {n_bulk} bulk: {ew:?}"
        );
        // Round robin makes it wait for bulk circuits queued ahead of it.
        assert!(
            mean(&rr) > mean(&ew),
            "RR {} vs EWMA {}",
            mean(&rr),
            mean(&ew)
        );
        if n_bulk >= 4 {
            assert!(
                mean(&rr) >= f64::from(n_bulk) / 4.0,
                "RR mean {} with {n_bulk} bulk",
                mean(&rr)
            );
        }
    }
}

#[test]
fn ewma_with_tiny_half_life_degrades_to_fair_sharing() {
    // With a 1 us half-life (1000 half-lives per 1 ms slot) history is
    // forgotten at once, so every circuit ties and the longest-waiting one
    // goes: bulk circuits share the channel equally.
    let kind = SchedulerKind::Ewma {
        half_life: Duration::from_micros(1),
    };
    let mut sched: Box<dyn CircuitScheduler<u32>> = kind.build();
    let start = Instant::now();
    let mut counts = [0u32; 3];
    for slot in 0..3000u32 {
        let now = start + SLOT * slot;
        for c in 0..3 {
            sched.activate(c, now);
        }
        let c = sched.next(now).expect("active");
        counts[c as usize] += 1;
        sched.on_sent(c, 1, now);
    }
    for c in counts {
        assert!((900..=1100).contains(&c), "{counts:?}");
    }
}

#[test]
fn schedulers_survive_long_runs_and_rescaling() {
    // Hours of simulated time force the EWMA weights to be rescaled many
    // times; ordering must stay correct (the light circuit still wins).
    let ewma = SchedulerKind::Ewma {
        half_life: Duration::from_millis(50),
    };
    let delays = simulate(ewma, 2, 600);
    assert!(delays[1..].iter().all(|d| *d == 0));
}

#[test]
fn round_robin_alternates_and_removal_works() {
    let mut rr: Box<dyn CircuitScheduler<u32>> = SchedulerKind::RoundRobin.build();
    let now = Instant::now();
    for c in [1, 2, 3] {
        rr.activate(c, now);
    }
    rr.remove(2);
    assert_eq!(rr.next(now), Some(1));
    rr.activate(1, now);
    assert_eq!(rr.next(now), Some(3));
    assert_eq!(rr.next(now), Some(1));
    assert_eq!(rr.next(now), None);
    assert!(rr.is_idle());
}

#[test]
fn ewma_survives_hours_of_idleness() {
    // 10 hours idle at a 30 s half-life is 1200 half-lives: 2^1200 would
    // overflow an f64 if weights were not rescaled before adding.
    let kind = SchedulerKind::Ewma {
        half_life: Duration::from_secs(30),
    };
    let mut sched: Box<dyn CircuitScheduler<u32>> = kind.build();
    let start = Instant::now();
    for _ in 0..100 {
        sched.activate(1, start);
        let c = sched.next(start).expect("active");
        sched.on_sent(c, 1, start);
    }
    let later = start + Duration::from_secs(10 * 3600);
    for _ in 0..10 {
        sched.activate(1, later);
        let c = sched.next(later).expect("active");
        sched.on_sent(c, 1, later);
    }
    // Circuit 1 sent recently, circuit 2 never: 2 goes first, then 1 (its
    // weight is finite, so it is still scheduled at all).
    sched.activate(1, later);
    sched.activate(2, later);
    assert_eq!(sched.next(later), Some(2));
    sched.on_sent(2, 1, later);
    assert_eq!(sched.next(later), Some(1));
}

#[test]
fn deactivated_circuits_leave_and_keep_their_history() {
    let half_life = Duration::from_secs(30);
    let now = Instant::now();
    for kind in [SchedulerKind::RoundRobin, SchedulerKind::Ewma { half_life }] {
        let mut sched: Box<dyn CircuitScheduler<u32>> = kind.build();
        sched.activate(1, now);
        sched.activate(2, now);
        sched.deactivate(1);
        assert_eq!(sched.next(now), Some(2), "{kind:?}");
        assert_eq!(sched.next(now), None, "{kind:?}");
        assert!(sched.is_idle());
        // Re-activated, a circuit takes its place at the back, once.
        sched.activate(1, now);
        sched.activate(3, now);
        sched.deactivate(3);
        sched.activate(3, now);
        assert_eq!(sched.next(now), Some(1), "{kind:?}");
        assert_eq!(sched.next(now), Some(3), "{kind:?}");
        assert_eq!(sched.next(now), None, "{kind:?}");
    }
    // EWMA keeps the history of a deactivated circuit (remove forgets it).
    let mut ewma = Ewma::new(half_life);
    for _ in 0..10 {
        ewma.on_sent(1, 1, now);
    }
    ewma.activate(1, now);
    ewma.deactivate(1);
    ewma.activate(2, now);
    ewma.activate(1, now);
    assert_eq!(ewma.next(now), Some(2));
    assert_eq!(ewma.next(now), Some(1));
}

#[test]
fn stale_entries_are_swept_without_next() {
    // A driver sending per circuit never calls `next`: circuits are
    // activated when cells arrive and deactivated when their lane takes
    // the last one. The queues must not grow with every cycle.
    let now = Instant::now();
    let mut rr = RoundRobin::default();
    let mut ewma = Ewma::new(Duration::from_secs(30));
    for i in 0..100_000u32 {
        let key = i % 10;
        rr.activate(key, now);
        ewma.activate(key, now);
        ewma.on_sent(key, 1, now);
        rr.deactivate(key);
        ewma.deactivate(key);
        assert!(rr.queue_len() <= 100, "round robin: {}", rr.queue_len());
        assert!(ewma.queue_len() <= 100, "EWMA: {}", ewma.queue_len());
    }
    // Removal without `next` is swept the same way.
    for i in 0..100_000u32 {
        rr.activate(i, now);
        rr.remove(i);
        ewma.activate(i, now);
        ewma.remove(i);
    }
    assert!(rr.queue_len() <= 100 && ewma.queue_len() <= 100);
    assert!(rr.is_idle() && ewma.is_idle());
}

#[test]
fn lane_priority_levels_are_log2_buckets() {
    assert_eq!(lane_priority_level(0.0), 0);
    assert_eq!(lane_priority_level(0.99), 0);
    assert_eq!(lane_priority_level(1.0), -1);
    assert_eq!(lane_priority_level(2.9), -1);
    assert_eq!(lane_priority_level(3.0), -2);
    assert_eq!(lane_priority_level(1000.0), -9);
    assert_eq!(lane_priority_level(1500.0), -10);
    // Hostile or broken values stay in range.
    for max in [1e300, f64::INFINITY] {
        assert_eq!(lane_priority_level(max), -MAX_LANE_PRIORITY_LEVEL);
    }
    for zero in [f64::NAN, -5.0, f64::NEG_INFINITY] {
        assert_eq!(lane_priority_level(zero), 0);
    }
}

#[test]
fn ewma_priorities_follow_the_decayed_count() {
    let start = Instant::now();
    let mut ewma = Ewma::new(Duration::from_secs(1));
    assert_eq!(ewma.priority(&1, start), 0, "no history yet");
    ewma.on_sent(3, 1, start);
    // 45 half-lives later: the stored weights are rescaled on this send.
    let t = start + Duration::from_secs(45);
    ewma.on_sent(1, 100, t);
    ewma.on_sent(2, 3, t);
    let later = t + Duration::from_secs(1);
    assert!((ewma.decayed_count(&1, later) - 50.0).abs() < 1e-6);
    assert!((ewma.decayed_count(&2, later) - 1.5).abs() < 1e-6);
    assert!(ewma.decayed_count(&3, later) < 1e-9);
    assert_eq!(ewma.priority(&1, later), -5);
    assert_eq!(ewma.priority(&2, later), -1);
    assert_eq!(ewma.priority(&3, later), 0);
    // The same ranking as `next`: 3, then 2, then 1.
    for k in [1, 2, 3] {
        ewma.activate(k, later);
    }
    assert_eq!(ewma.next(later), Some(3));
    assert_eq!(ewma.next(later), Some(2));
    assert_eq!(ewma.next(later), Some(1));
    // Round robin has no ranking.
    let mut rr = RoundRobin::default();
    rr.on_sent(1, 100, later);
    assert_eq!(rr.priority(&1, later), 0);
}
