//! Circuit schedulers: which circuit's cell a channel writes next.
//!
//! A channel keeps one scheduler. A circuit is *active* on it while it has
//! cells queued for that channel. The channel asks [`CircuitScheduler::next`]
//! for a circuit, writes one of its cells, reports it with
//! [`CircuitScheduler::on_sent`], and re-activates the circuit if it still
//! has cells queued.
//!
//! Schedulers are deterministic: the order they give depends only on the
//! calls made, never on a hash seed. Their `HashMap`s are only looked up
//! (and swept with `retain`, whose order cannot show); the order lives in a
//! queue (round robin) or a heap of distinct keys (EWMA).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Chooses the next circuit to send from among the active ones.
pub trait CircuitScheduler<K>: std::fmt::Debug + Send {
    /// `key` has cells to send on this channel (no-op if already active).
    fn activate(&mut self, key: K, now: Instant);
    /// Take the circuit whose cell goes next; it stops being active.
    fn next(&mut self, now: Instant) -> Option<K>;
    /// `cells` cells of `key` were written to the channel.
    fn on_sent(&mut self, key: K, cells: u32, now: Instant);
    /// Forget `key` entirely (the circuit closed or left the channel).
    fn remove(&mut self, key: K);
    /// `key` has nothing to send after all (its cells went out some other
    /// way): it stops being active but keeps its history. The default
    /// forgets it as [`remove`](Self::remove) does.
    fn deactivate(&mut self, key: K) {
        self.remove(key);
    }
    /// Is no circuit active?
    fn is_idle(&self) -> bool;
    /// The priority of `key`'s lane for a transport that multiplexes one
    /// lane per circuit by priority itself (quinn's
    /// `SendStream::set_priority`: higher goes first, equal priorities
    /// share fairly), at `now`. It ranks circuits as [`next`](Self::next)
    /// does, coarsely: of two circuits, the one with the higher priority is
    /// the one `next` would take first. The default, for schedulers
    /// without a ranking (round robin), is 0 for every circuit: all lanes
    /// share fairly.
    fn priority(&self, key: &K, now: Instant) -> i32 {
        let _ = (key, now);
        0
    }
}

/// Lowest lane priority (negated) that [`Ewma`]'s
/// [`CircuitScheduler::priority`] gives: `-MAX_LANE_PRIORITY_LEVEL`, for a
/// circuit with 2^31 or more recent cells.
pub const MAX_LANE_PRIORITY_LEVEL: i32 = 31;

/// The lane priority of a circuit whose decayed cell count is `count`:
/// `-floor(log2(1 + count))`, between `-MAX_LANE_PRIORITY_LEVEL` and 0
/// (NaN or negative counts as 0).
///
/// Why coarse levels and not the EWMA itself: a transport that honours
/// priorities strictly (quinn sends from the highest-priority stream while
/// it has data) would let the bulk circuit with the lowest count hog the
/// connection, and starve the other bulk circuits, until the driver next
/// re-prioritises it. Buckets of doubling width keep tor's rule where it
/// matters (a light circuit, with a small fraction of a bulk circuit's
/// cells, lands in a strictly higher level and goes first) while bulk
/// circuits of similar weight share a level and so share the connection
/// fairly, as quinn does for equal priorities.
pub fn lane_priority_level(count: f64) -> i32 {
    let level = (1.0 + count.max(0.0)).log2().floor();
    // `max` drops NaN; infinity is clamped here.
    let level = level.clamp(0.0, f64::from(MAX_LANE_PRIORITY_LEVEL));
    -(level as i32)
}

/// Which scheduler a channel uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SchedulerKind {
    /// Round robin: active circuits take turns, one cell each.
    RoundRobin,
    /// EWMA (Tang & Goldberg 2010; tor's CircuitPriorityHalflife): the
    /// active circuit that sent the fewest recently (exponentially decayed)
    /// cells goes first, favouring light interactive circuits over bulk ones.
    Ewma {
        /// Time for a cell's weight to decay to half.
        half_life: Duration,
    },
}

impl Default for SchedulerKind {
    /// EWMA with tor's default half-life of 30 s.
    fn default() -> Self {
        SchedulerKind::Ewma {
            half_life: Duration::from_secs(30),
        }
    }
}

impl SchedulerKind {
    /// A fresh scheduler of this kind.
    pub fn build<K: Copy + Eq + Hash + Ord + std::fmt::Debug + Send + 'static>(
        self,
    ) -> Box<dyn CircuitScheduler<K>> {
        match self {
            SchedulerKind::RoundRobin => Box::new(RoundRobin::default()),
            SchedulerKind::Ewma { half_life } => Box::new(Ewma::new(half_life)),
        }
    }
}

/// Stale entries (of circuits removed or deactivated) a scheduler keeps in
/// its queue before it sweeps them out, beyond twice the active ones. Keeps
/// the queue bounded when circuits come and go without [`CircuitScheduler::next`]
/// being called (a driver that sends per circuit).
const STALE_SLACK: usize = 64;

/// Round-robin circuit scheduler.
#[derive(Debug)]
pub struct RoundRobin<K> {
    /// Activation order; entries whose sequence number no longer matches
    /// `active` are stale and skipped.
    order: VecDeque<(K, u64)>,
    /// Active circuits and the sequence number of their activation. Only
    /// looked up: the order is `order`'s.
    active: HashMap<K, u64>,
    next_seq: u64,
}

impl<K> Default for RoundRobin<K> {
    fn default() -> Self {
        RoundRobin {
            order: VecDeque::new(),
            active: HashMap::new(),
            next_seq: 0,
        }
    }
}

impl<K: Copy + Eq + Hash + std::fmt::Debug + Send> CircuitScheduler<K> for RoundRobin<K> {
    fn activate(&mut self, key: K, _now: Instant) {
        if self.active.contains_key(&key) {
            return;
        }
        if self.order.len() > 2 * self.active.len() + STALE_SLACK {
            let active = &self.active;
            self.order.retain(|(k, seq)| active.get(k) == Some(seq));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.active.insert(key, seq);
        self.order.push_back((key, seq));
    }
    fn next(&mut self, _now: Instant) -> Option<K> {
        while let Some((k, seq)) = self.order.pop_front() {
            if self.active.get(&k) == Some(&seq) {
                self.active.remove(&k);
                return Some(k);
            }
        }
        None
    }
    fn on_sent(&mut self, _key: K, _cells: u32, _now: Instant) {}
    fn remove(&mut self, key: K) {
        // Lazily dropped from `order` when reached or swept.
        self.active.remove(&key);
    }
    fn deactivate(&mut self, key: K) {
        self.active.remove(&key);
    }
    fn is_idle(&self) -> bool {
        self.active.is_empty()
    }
}

impl<K> RoundRobin<K> {
    /// Entries in the activation queue, stale ones included.
    pub fn queue_len(&self) -> usize {
        self.order.len()
    }
}

/// A totally ordered f64 for the heap.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Weight(f64);
impl Eq for Weight {}
impl PartialOrd for Weight {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Weight {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Rescale stored weights once the newest cell weighs this many half-lives
/// more than the epoch (2^40: far from f64 overflow, precision kept).
const RESCALE_AFTER_HALF_LIVES: f64 = 40.0;

/// EWMA circuit scheduler.
///
/// A cell sent at time `t` adds `2^((t - epoch) / half_life)` to its
/// circuit's weight. At any instant every circuit's decayed EWMA equals its
/// weight times the same factor `2^(-(now - epoch) / half_life)`, so
/// comparing weights compares EWMAs, and a circuit's weight changes only
/// when it sends: a min-heap of active circuits stays valid without
/// touching idle ones. Ties (equal EWMA) go to the circuit that has waited
/// longest, so EWMA degrades to round robin when history is equal. Tor
/// decays in 10-second ticks; this is the same quantity computed
/// continuously.
#[derive(Debug)]
pub struct Ewma<K> {
    half_life_secs: f64,
    epoch: Option<Instant>,
    /// Looked up, and scaled all alike by `rescale` (order cannot show).
    weights: HashMap<K, f64>,
    /// Min-heap on (weight, activation sequence); entries whose sequence no
    /// longer matches `active` are stale and skipped. Its entries are
    /// distinct (sequence numbers are unique), so the order it pops them
    /// in does not depend on the order they were pushed in: rebuilding it
    /// from `active` in hash order is deterministic.
    heap: BinaryHeap<std::cmp::Reverse<(Weight, u64, K)>>,
    /// Active circuits and the sequence number of their activation.
    active: HashMap<K, u64>,
    next_seq: u64,
}

impl<K: Copy + Eq + Hash + Ord> Ewma<K> {
    /// An EWMA scheduler with the given half-life.
    pub fn new(half_life: Duration) -> Self {
        Ewma {
            half_life_secs: half_life.as_secs_f64().max(1e-9),
            epoch: None,
            weights: HashMap::new(),
            heap: BinaryHeap::new(),
            active: HashMap::new(),
            next_seq: 0,
        }
    }

    fn half_lives_since_epoch(&mut self, now: Instant) -> f64 {
        let epoch = *self.epoch.get_or_insert(now);
        now.saturating_duration_since(epoch).as_secs_f64() / self.half_life_secs
    }

    fn weight(&self, key: &K) -> Weight {
        Weight(self.weights.get(key).copied().unwrap_or(0.0))
    }

    fn rescale(&mut self, now: Instant) {
        let factor = (-self.half_lives_since_epoch(now)).exp2();
        self.epoch = Some(now);
        self.weights.retain(|_, w| {
            *w *= factor;
            *w > 1e-9
        });
        self.rebuild_heap();
    }

    /// The heap of exactly the active circuits (stale entries dropped).
    fn rebuild_heap(&mut self) {
        self.heap = self
            .active
            .iter()
            .map(|(k, seq)| std::cmp::Reverse((self.weight(k), *seq, *k)))
            .collect();
    }

    /// Entries in the heap, stale ones included.
    pub fn queue_len(&self) -> usize {
        self.heap.len()
    }

    /// `key`'s decayed cell count at `now`: each cell it sent weighs 1
    /// when sent and half as much every half-life since. Every circuit's
    /// count is its stored weight times the same factor, so ranking by
    /// count is ranking by weight, as [`CircuitScheduler::next`] does.
    pub fn decayed_count(&self, key: &K, now: Instant) -> f64 {
        let Some(epoch) = self.epoch else {
            return 0.0;
        };
        let half_lives = now.saturating_duration_since(epoch).as_secs_f64() / self.half_life_secs;
        self.weights.get(key).copied().unwrap_or(0.0) * (-half_lives).exp2()
    }
}

impl<K: Copy + Eq + Hash + Ord + std::fmt::Debug + Send> CircuitScheduler<K> for Ewma<K> {
    fn activate(&mut self, key: K, _now: Instant) {
        if !self.active.contains_key(&key) {
            if self.heap.len() > 2 * self.active.len() + STALE_SLACK {
                self.rebuild_heap();
            }
            let seq = self.next_seq;
            self.next_seq += 1;
            self.active.insert(key, seq);
            self.heap
                .push(std::cmp::Reverse((self.weight(&key), seq, key)));
        }
    }
    fn next(&mut self, _now: Instant) -> Option<K> {
        while let Some(std::cmp::Reverse((_, seq, k))) = self.heap.pop() {
            if self.active.get(&k) == Some(&seq) {
                self.active.remove(&k);
                return Some(k);
            }
        }
        None
    }
    fn on_sent(&mut self, key: K, cells: u32, now: Instant) {
        // Rescale first, so the weight added is never huge (after hours of
        // idleness `2^exponent` would overflow to infinity).
        if self.half_lives_since_epoch(now) > RESCALE_AFTER_HALF_LIVES {
            self.rescale(now);
        }
        let exponent = self.half_lives_since_epoch(now);
        *self.weights.entry(key).or_insert(0.0) += f64::from(cells) * exponent.exp2();
    }
    fn remove(&mut self, key: K) {
        self.active.remove(&key);
        self.weights.remove(&key);
    }
    fn deactivate(&mut self, key: K) {
        self.active.remove(&key);
    }
    fn is_idle(&self) -> bool {
        self.active.is_empty()
    }
    /// [`lane_priority_level`] of the circuit's decayed cell count.
    fn priority(&self, key: &K, now: Instant) -> i32 {
        lane_priority_level(self.decayed_count(key, now))
    }
}
