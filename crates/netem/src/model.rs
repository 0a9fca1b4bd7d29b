//! The link model: a sans-IO, seeded, deterministic unit.
//!
//! Packets go in with [`LinkModel::submit`] at a timestamp; release times and
//! drops come out of [`LinkModel::poll`]. The model never reads a clock: the
//! caller passes time in (nanoseconds on any monotonic time line), so it can
//! be driven by the real forwarder or by a test in simulated time.
//!
//! A packet from `src` to `dst` crosses, in order:
//! 1. the uplink of `src` (rate + drop-tail queue),
//! 2. the path `src -> dst`: cut check, blocked-protocol check, optional
//!    bottleneck (rate + queue),
//!    loss process, one-way latency with jitter (no reordering unless asked),
//! 3. the downlink of `dst` (rate + drop-tail queue), shared by all senders
//!    and served in order of arrival.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::counters::{DropCounts, Histogram, HostCounters, PathCounters};
use crate::rng::Rng;
use crate::topology::{
    HostId, HostSpec, HostUpdate, LinkSpec, LossModel, PathSpec, PathUpdate, Topology,
};
use crate::units::QueueLimit;

/// Time in nanoseconds on the caller's monotonic time line.
pub type Nanos = u64;

/// Why a packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropCause {
    /// The sender's uplink queue was full.
    UplinkQueue,
    /// The path's bottleneck queue was full.
    PathQueue,
    /// The receiver's downlink queue was full.
    DownlinkQueue,
    /// Lost by the loss process.
    Loss,
    /// The path is cut.
    LinkDown,
    /// The model holds too many packets.
    Overflow,
    /// The path blocks the packet's IP protocol.
    Blocked,
}

/// What [`LinkModel::poll`] hands back.
#[derive(Debug, PartialEq, Eq)]
pub enum Output<T> {
    /// Deliver `token` to `dst`; `at` is the scheduled release time.
    Deliver {
        /// The caller's packet.
        token: T,
        /// Sender.
        src: HostId,
        /// Receiver.
        dst: HostId,
        /// Packet length in bytes.
        len: u32,
        /// Scheduled release time.
        at: Nanos,
    },
    /// The packet was dropped after having been accepted by `submit`.
    Drop {
        /// The caller's packet.
        token: T,
        /// Sender.
        src: HostId,
        /// Receiver.
        dst: HostId,
        /// Why.
        cause: DropCause,
    },
}

/// A rate limiter with a drop-tail queue, evaluated lazily.
#[derive(Debug, Clone)]
struct RateQueue {
    spec: LinkSpec,
    busy_until: Nanos,
    /// Finish times and sizes of packets queued or in transmission.
    backlog: VecDeque<(Nanos, u32)>,
    backlog_bytes: u64,
}

impl RateQueue {
    fn new(spec: LinkSpec) -> Self {
        RateQueue {
            spec,
            busy_until: 0,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
        }
    }

    /// A packet of `len` bytes arrives at `t`: returns (finish time, waiting
    /// time) or `None` if the queue drops it.
    fn admit(&mut self, t: Nanos, len: u32) -> Option<(Nanos, Nanos)> {
        let Some(bps) = self.spec.rate.0 else {
            return Some((t, 0));
        };
        while let Some(&(finish, l)) = self.backlog.front() {
            if finish > t {
                break;
            }
            self.backlog.pop_front();
            self.backlog_bytes -= u64::from(l);
        }
        let wait = self.busy_until.saturating_sub(t);
        let full = match self.spec.queue {
            QueueLimit::Packets(n) => self.backlog.len() >= n as usize,
            QueueLimit::Bytes(b) => self.backlog_bytes + u64::from(len) > b,
            QueueLimit::Delay(d) => u128::from(wait) > d.as_nanos(),
        };
        if full {
            return None;
        }
        let ser = ((u128::from(len) * 8 * 1_000_000_000).div_ceil(u128::from(bps.max(1)))) as u64;
        let finish = t.max(self.busy_until) + ser;
        self.busy_until = finish;
        self.backlog.push_back((finish, len));
        self.backlog_bytes += u64::from(len);
        Some((finish, wait))
    }
}

/// Jitter as a time-correlated delay variation: random values uniform in
/// ±jitter at knots `4 * jitter` apart (at least 1 ms), linearly interpolated.
/// The slope of the delay is at most 1/2, so a later packet never overtakes
/// an earlier one, and the mean delay stays the configured latency (no bias
/// from clamping).
#[derive(Debug, Default, Clone)]
struct JitterProcess {
    t0: Nanos,
    v0: i64,
    t1: Nanos,
    v1: i64,
}

impl JitterProcess {
    fn sample(&mut self, t: Nanos, jitter: u64, rng: &mut Rng) -> i64 {
        let period = (4 * jitter).max(1_000_000);
        let draw = |rng: &mut Rng| ((rng.next_f64() * 2.0 - 1.0) * jitter as f64) as i64;
        if self.t1 == 0 || t >= self.t1 + period {
            self.t0 = t;
            self.v0 = draw(rng);
            self.t1 = t + period;
            self.v1 = draw(rng);
        }
        while t >= self.t1 {
            self.t0 = self.t1;
            self.v0 = self.v1;
            self.t1 = self.t0 + period;
            self.v1 = draw(rng);
        }
        let frac = (t - self.t0) as f64 / (self.t1 - self.t0) as f64;
        self.v0 + ((self.v1 - self.v0) as f64 * frac) as i64
    }
}

#[derive(Debug)]
struct PathState {
    spec: PathSpec,
    rng: Rng,
    ge_bad: bool,
    last_arrival: Nanos,
    jitter: JitterProcess,
    bottleneck: RateQueue,
    counters: PathStats,
}

#[derive(Debug, Default)]
struct PathStats {
    submitted_packets: u64,
    submitted_bytes: u64,
    delivered_packets: u64,
    delivered_bytes: u64,
    drops: DropCounts,
    queue_delay: Option<Box<Histogram>>,
}

#[derive(Debug)]
struct HostState {
    spec: HostSpec,
    uplink: RateQueue,
    downlink: RateQueue,
    no_route_packets: u64,
    no_route_bytes: u64,
    not_ipv4_packets: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Scheduled time is the arrival at the receiver's downlink.
    Arrive,
    /// Scheduled time is the release to the receiver.
    Release,
}

#[derive(Debug)]
struct Pending<T> {
    token: T,
    src: HostId,
    dst: HostId,
    len: u32,
    queued: Nanos,
    stage: Stage,
}

/// The link model of a whole topology.
#[derive(Debug)]
pub struct LinkModel<T> {
    hosts: Vec<HostState>,
    paths: Vec<PathState>,
    n: usize,
    heap: BinaryHeap<Reverse<(Nanos, u64, usize)>>,
    slab: Vec<Option<Pending<T>>>,
    free: Vec<usize>,
    seq: u64,
    max_pending: usize,
}

impl<T> LinkModel<T> {
    /// Default limit of packets held at once (beyond it packets are dropped
    /// with [`DropCause::Overflow`]).
    pub const DEFAULT_MAX_PENDING: usize = 1 << 18;

    /// Builds the model of a topology; all randomness derives from `topology.seed`.
    pub fn new(topology: &Topology) -> Self {
        let n = topology.hosts.len();
        let hosts = topology
            .hosts
            .iter()
            .map(|h| HostState {
                spec: h.clone(),
                uplink: RateQueue::new(h.uplink),
                downlink: RateQueue::new(h.downlink),
                no_route_packets: 0,
                no_route_bytes: 0,
                not_ipv4_packets: 0,
            })
            .collect();
        let mut paths = Vec::with_capacity(n * n);
        for s in 0..n {
            for d in 0..n {
                let spec = *topology.path(s, d);
                paths.push(PathState {
                    spec,
                    rng: Rng::derive(topology.seed, s as u64, d as u64),
                    ge_bad: false,
                    last_arrival: 0,
                    jitter: JitterProcess::default(),
                    bottleneck: RateQueue::new(spec.bottleneck),
                    counters: PathStats::default(),
                });
            }
        }
        LinkModel {
            hosts,
            paths,
            n,
            heap: BinaryHeap::new(),
            slab: Vec::new(),
            free: Vec::new(),
            seq: 0,
            max_pending: Self::DEFAULT_MAX_PENDING,
        }
    }

    /// Number of packets currently held.
    pub fn pending(&self) -> usize {
        self.slab.len() - self.free.len()
    }

    fn path_mut(&mut self, src: HostId, dst: HostId) -> Option<&mut PathState> {
        if src < self.n && dst < self.n {
            self.paths.get_mut(src * self.n + dst)
        } else {
            None
        }
    }

    /// Current properties of a host's access links.
    pub fn host_spec(&self, host: HostId) -> Option<&HostSpec> {
        self.hosts.get(host).map(|h| &h.spec)
    }

    /// Changes the path `src -> dst`. Returns false for unknown hosts.
    pub fn update_path(&mut self, src: HostId, dst: HostId, update: &PathUpdate) -> bool {
        let Some(p) = self.path_mut(src, dst) else {
            return false;
        };
        update.apply(&mut p.spec);
        p.bottleneck.spec = p.spec.bottleneck;
        true
    }

    /// Changes a host's access links. Returns false for an unknown host.
    pub fn update_host(&mut self, host: HostId, update: &HostUpdate) -> bool {
        let Some(h) = self.hosts.get_mut(host) else {
            return false;
        };
        update.apply(&mut h.spec);
        h.uplink.spec = h.spec.uplink;
        h.downlink.spec = h.spec.downlink;
        true
    }

    /// Counts a packet from `src` whose destination is not in the topology.
    pub fn count_no_route(&mut self, src: HostId, len: usize) {
        if let Some(h) = self.hosts.get_mut(src) {
            h.no_route_packets += 1;
            h.no_route_bytes += len as u64;
        }
    }

    /// Counts a packet from `src` that is not IPv4.
    pub fn count_not_ipv4(&mut self, src: HostId) {
        if let Some(h) = self.hosts.get_mut(src) {
            h.not_ipv4_packets += 1;
        }
    }

    fn count_drop(&mut self, src: HostId, dst: HostId, cause: DropCause) {
        if let Some(p) = self.path_mut(src, dst) {
            let d = &mut p.counters.drops;
            match cause {
                DropCause::UplinkQueue => d.uplink_queue += 1,
                DropCause::PathQueue => d.path_queue += 1,
                DropCause::DownlinkQueue => d.downlink_queue += 1,
                DropCause::Loss => d.loss += 1,
                DropCause::LinkDown => d.link_down += 1,
                DropCause::Overflow => d.overflow += 1,
                DropCause::Blocked => d.blocked += 1,
            }
        }
    }

    /// Offers a packet of `len` bytes from `src` to `dst` at time `now`,
    /// of no particular IP protocol (never blocked); see
    /// [`submit_ip`](Self::submit_ip).
    ///
    /// Returns the token back with the cause if it is dropped at once;
    /// otherwise the packet comes out of [`poll`](Self::poll) later.
    pub fn submit(
        &mut self,
        now: Nanos,
        src: HostId,
        dst: HostId,
        len: usize,
        token: T,
    ) -> Result<(), (T, DropCause)> {
        self.submit_ip(now, src, dst, len, 0, token)
    }

    /// As [`submit`](Self::submit), for an IP packet of protocol `protocol`
    /// (the IPv4 header's protocol field: 6 TCP, 17 UDP): dropped with
    /// [`DropCause::Blocked`] if the path blocks that protocol.
    pub fn submit_ip(
        &mut self,
        now: Nanos,
        src: HostId,
        dst: HostId,
        len: usize,
        protocol: u8,
        token: T,
    ) -> Result<(), (T, DropCause)> {
        if src >= self.n || dst >= self.n {
            return Err((token, DropCause::LinkDown));
        }
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        let overflow = self.pending() >= self.max_pending;
        let n = self.n;
        let (uplink, paths) = (&mut self.hosts[src].uplink, &mut self.paths);
        let path = &mut paths[src * n + dst];
        path.counters.submitted_packets += 1;
        path.counters.submitted_bytes += u64::from(len);
        let verdict = (|| {
            if overflow {
                return Err(DropCause::Overflow);
            }
            if !path.spec.up {
                return Err(DropCause::LinkDown);
            }
            if path.spec.block.blocks(protocol) {
                return Err(DropCause::Blocked);
            }
            let (up_done, w1) = uplink.admit(now, len).ok_or(DropCause::UplinkQueue)?;
            let (bn_done, w2) = path
                .bottleneck
                .admit(up_done, len)
                .ok_or(DropCause::PathQueue)?;
            let lost = match path.spec.loss {
                LossModel::None => false,
                LossModel::Bernoulli { rate } => path.rng.chance(rate),
                LossModel::GilbertElliott {
                    p,
                    r,
                    loss_good,
                    loss_bad,
                } => {
                    let lost = path
                        .rng
                        .chance(if path.ge_bad { loss_bad } else { loss_good });
                    if path.ge_bad {
                        if path.rng.chance(r) {
                            path.ge_bad = false;
                        }
                    } else if path.rng.chance(p) {
                        path.ge_bad = true;
                    }
                    lost
                }
            };
            if lost {
                return Err(DropCause::Loss);
            }
            let latency = path.spec.latency.as_nanos() as i128;
            let jitter = path.spec.jitter.as_nanos() as i128;
            let delay = if jitter > 0 {
                let off = i128::from(path.jitter.sample(bn_done, jitter as u64, &mut path.rng));
                (latency + off).max(0) as u64
            } else {
                latency as u64
            };
            let arrival = if path.spec.reorder > 0.0 && path.rng.chance(path.spec.reorder) {
                bn_done + delay + path.spec.reorder_delay.as_nanos() as u64
            } else {
                let a = (bn_done + delay).max(path.last_arrival);
                path.last_arrival = a;
                a
            };
            Ok((arrival, w1 + w2))
        })();
        match verdict {
            Err(cause) => {
                self.count_drop(src, dst, cause);
                Err((token, cause))
            }
            Ok((arrival, queued)) => {
                let p = Pending {
                    token,
                    src,
                    dst,
                    len,
                    queued,
                    stage: Stage::Arrive,
                };
                let slot = match self.free.pop() {
                    Some(i) => {
                        self.slab[i] = Some(p);
                        i
                    }
                    None => {
                        self.slab.push(Some(p));
                        self.slab.len() - 1
                    }
                };
                self.seq += 1;
                self.heap.push(Reverse((arrival, self.seq, slot)));
                Ok(())
            }
        }
    }

    /// Time of the next internal event, if any packet is held.
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.heap.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Returns the next delivery or late drop due at or before `now`.
    /// Call until it returns `None`.
    pub fn poll(&mut self, now: Nanos) -> Option<Output<T>> {
        loop {
            let &Reverse((at, _, slot)) = self.heap.peek()?;
            if at > now {
                return None;
            }
            self.heap.pop();
            let stage = self.slab.get(slot)?.as_ref()?.stage;
            if stage == Stage::Arrive {
                let (dst, len) = {
                    let p = self.slab.get(slot)?.as_ref()?;
                    (p.dst, p.len)
                };
                match self.hosts.get_mut(dst)?.downlink.admit(at, len) {
                    None => {
                        let p = self.take(slot)?;
                        self.count_drop(p.src, p.dst, DropCause::DownlinkQueue);
                        return Some(Output::Drop {
                            token: p.token,
                            src: p.src,
                            dst: p.dst,
                            cause: DropCause::DownlinkQueue,
                        });
                    }
                    Some((finish, wait)) => {
                        let p = self.slab.get_mut(slot)?.as_mut()?;
                        p.queued += wait;
                        if finish > at {
                            p.stage = Stage::Release;
                            self.seq += 1;
                            self.heap.push(Reverse((finish, self.seq, slot)));
                            continue;
                        }
                    }
                }
            }
            let p = self.take(slot)?;
            let n = self.n;
            let stats = &mut self.paths.get_mut(p.src * n + p.dst)?.counters;
            stats.delivered_packets += 1;
            stats.delivered_bytes += u64::from(p.len);
            stats
                .queue_delay
                .get_or_insert_with(Default::default)
                .record(p.queued);
            return Some(Output::Deliver {
                token: p.token,
                src: p.src,
                dst: p.dst,
                len: p.len,
                at,
            });
        }
    }

    fn take(&mut self, slot: usize) -> Option<Pending<T>> {
        let p = self.slab.get_mut(slot)?.take()?;
        self.free.push(slot);
        Some(p)
    }

    /// Removes every held packet (e.g. at shutdown), returning the tokens.
    pub fn drain(&mut self) -> Vec<T> {
        self.heap.clear();
        self.free.clear();
        self.slab.drain(..).flatten().map(|p| p.token).collect()
    }

    /// Snapshot of the per-path counters (paths that saw traffic) and per-host counters.
    pub fn counters(&self) -> (Vec<PathCounters>, Vec<HostCounters>) {
        let mut paths = Vec::new();
        for s in 0..self.n {
            for d in 0..self.n {
                let Some(p) = self.paths.get(s * self.n + d) else {
                    continue;
                };
                let c = &p.counters;
                if c.submitted_packets == 0 {
                    continue;
                }
                paths.push(PathCounters {
                    src: self.hosts[s].spec.name.clone(),
                    dst: self.hosts[d].spec.name.clone(),
                    submitted_packets: c.submitted_packets,
                    submitted_bytes: c.submitted_bytes,
                    delivered_packets: c.delivered_packets,
                    delivered_bytes: c.delivered_bytes,
                    drops: c.drops,
                    queue_delay: c
                        .queue_delay
                        .as_ref()
                        .map(|h| h.summary())
                        .unwrap_or_default(),
                });
            }
        }
        let hosts = self
            .hosts
            .iter()
            .map(|h| HostCounters {
                name: h.spec.name.clone(),
                no_route_packets: h.no_route_packets,
                no_route_bytes: h.no_route_bytes,
                not_ipv4_packets: h.not_ipv4_packets,
            })
            .collect();
        (paths, hosts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::Rate;
    use std::time::Duration;

    const MS: Nanos = 1_000_000;

    type Outcome = (Vec<(u64, Nanos)>, Vec<(u64, DropCause)>);

    fn topo(extra: &str) -> Topology {
        let src = format!("seed = 42\n{extra}\n[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n[[host]]\nname = \"c\"\n");
        Topology::from_toml_str(&src, "test").unwrap()
    }

    /// Drives the model with packets every `gap` ns and collects outputs.
    fn run(
        model: &mut LinkModel<u64>,
        count: u64,
        gap: Nanos,
        len: usize,
        src: HostId,
        dst: HostId,
    ) -> Outcome {
        let mut delivered = Vec::new();
        let mut dropped = Vec::new();
        for i in 0..count {
            let now = i * gap;
            while let Some(o) = model.poll(now) {
                collect(o, &mut delivered, &mut dropped);
            }
            if let Err((t, c)) = model.submit(now, src, dst, len, i) {
                dropped.push((t, c));
            }
        }
        while let Some(o) = model.poll(u64::MAX) {
            collect(o, &mut delivered, &mut dropped);
        }
        (delivered, dropped)
    }

    fn collect(
        o: Output<u64>,
        delivered: &mut Vec<(u64, Nanos)>,
        dropped: &mut Vec<(u64, DropCause)>,
    ) {
        match o {
            Output::Deliver { token, at, .. } => delivered.push((token, at)),
            Output::Drop { token, cause, .. } => dropped.push((token, cause)),
        }
    }

    /// 99% two-sided normal approximation of a binomial interval.
    fn binomial_99(n: u64, p: f64) -> (f64, f64) {
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        (n as f64 * p - 2.576 * sd, n as f64 * p + 2.576 * sd)
    }

    #[test]
    fn latency_is_exact() {
        let mut m = LinkModel::new(&topo("[defaults]\nlatency = \"20ms\""));
        let (d, x) = run(&mut m, 100, MS, 100, 0, 1);
        assert!(x.is_empty());
        for (i, at) in d {
            assert_eq!(at, i * MS + 20 * MS);
        }
    }

    #[test]
    fn bernoulli_loss_rates() {
        for rate in [0.001, 0.01, 0.05] {
            let mut m = LinkModel::new(&topo(&format!("[defaults]\nloss = {rate}")));
            let n = 200_000;
            let (d, x) = run(&mut m, n, 1000, 100, 0, 1);
            let lost = x.iter().filter(|(_, c)| *c == DropCause::Loss).count() as f64;
            let (lo, hi) = binomial_99(n, rate);
            assert!(
                lo <= lost && lost <= hi,
                "rate {rate}: lost {lost} not in [{lo}, {hi}]"
            );
            assert_eq!(d.len() as f64 + lost, n as f64);
        }
    }

    #[test]
    fn gilbert_elliott_bursts() {
        let mut m = LinkModel::new(&topo(
            "[defaults]\nloss = { model = \"gilbert-elliott\", rate = \"2%\", burst = 4 }",
        ));
        let n = 400_000;
        let (_, x) = run(&mut m, n, 1000, 100, 0, 1);
        let mut lost: Vec<u64> = x.iter().map(|(t, _)| *t).collect();
        lost.sort_unstable();
        let mut bursts = 0u64;
        let mut prev = None;
        for &t in &lost {
            if prev != Some(t.wrapping_sub(1)) {
                bursts += 1;
            }
            prev = Some(t);
        }
        let mean_burst = lost.len() as f64 / bursts as f64;
        let rate = lost.len() as f64 / n as f64;
        assert!((mean_burst - 4.0).abs() < 0.25, "mean burst {mean_burst}");
        assert!((rate - 0.02).abs() < 0.003, "loss rate {rate}");
    }

    #[test]
    fn rate_limits_throughput() {
        // 10 Mbit/s: a 1250-byte packet takes exactly 1 ms.
        let mut m = LinkModel::new(&topo(
            "[defaults]\nlatency = \"5ms\"\nup = \"10Mbit\"\nqueue = \"10000 packets\"",
        ));
        let (d, x) = run(&mut m, 1000, 0, 1250, 0, 1);
        assert!(x.is_empty());
        assert_eq!(d.len(), 1000);
        for (k, (i, at)) in d.iter().enumerate() {
            assert_eq!(*i as usize, k, "FIFO order");
            assert_eq!(*at, (k as u64 + 1) * MS + 5 * MS);
        }
    }

    #[test]
    fn rate_sustained_input() {
        // Offer 20 Mbit/s to a 10 Mbit/s uplink with a 50-packet queue:
        // about half gets through, at the link rate.
        let mut m = LinkModel::new(&topo("[defaults]\nup = \"10Mbit\"\nqueue = \"50 packets\""));
        let (d, x) = run(&mut m, 10_000, MS / 2, 1250, 0, 1);
        let dur = d.last().unwrap().1 - d.first().unwrap().1;
        let mbit = (d.len() - 1) as f64 * 1250.0 * 8.0 / (dur as f64 / 1e9) / 1e6;
        assert!((mbit - 10.0).abs() < 0.01, "{mbit}");
        assert!(x.iter().all(|(_, c)| *c == DropCause::UplinkQueue));
        assert!((x.len() as i64 - 5000).abs() < 100, "{}", x.len());
    }

    #[test]
    fn queue_limits() {
        for (q, expect) in [
            ("\"10 packets\"", 10),
            ("\"12500 bytes\"", 10),
            ("\"9500us\"", 10),
        ] {
            let mut m = LinkModel::new(&topo(&format!("[defaults]\nup = \"10Mbit\"\nqueue = {q}")));
            let (d, x) = run(&mut m, 100, 0, 1250, 0, 1);
            assert_eq!(d.len(), expect, "queue {q}");
            assert_eq!(x.len(), 100 - expect);
            assert!(x.iter().all(|(_, c)| *c == DropCause::UplinkQueue));
        }
    }

    #[test]
    fn downlink_shared_by_senders() {
        // Two senders into one 10 Mbit/s downlink.
        let mut m = LinkModel::new(&topo(
            "[defaults]\nlatency = \"1ms\"\ndown = \"10Mbit\"\nqueue = \"1000 packets\"",
        ));
        let mut at = Vec::new();
        for i in 0..100u64 {
            m.submit(i * MS / 2, 0, 2, 1250, i).unwrap();
            m.submit(i * MS / 2, 1, 2, 1250, 1000 + i).unwrap();
        }
        while let Some(Output::Deliver { at: t, .. }) = m.poll(u64::MAX) {
            at.push(t);
        }
        assert_eq!(at.len(), 200);
        assert!(
            at.windows(2).all(|w| w[1] - w[0] == MS),
            "one packet per ms"
        );
        let (paths, _) = m.counters();
        let p = paths.iter().find(|p| p.src == "a" && p.dst == "c").unwrap();
        assert_eq!(p.delivered_packets, 100);
        assert!(p.queue_delay.max_us > 50_000.0);
    }

    #[test]
    fn jitter_without_reordering() {
        let mut m = LinkModel::new(&topo("[defaults]\nlatency = \"10ms\"\njitter = \"2ms\""));
        let (d, _) = run(&mut m, 20_000, 100_000, 100, 0, 1);
        assert!(
            d.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "reordered"
        );
        let delays: Vec<i64> = d.iter().map(|(i, at)| (*at - i * 100_000) as i64).collect();
        let min = *delays.iter().min().unwrap();
        let max = *delays.iter().max().unwrap();
        let mean = delays.iter().sum::<i64>() as f64 / delays.len() as f64;
        assert!(min >= 8 * MS as i64 && max <= 12 * MS as i64, "{min} {max}");
        assert!((mean - 10e6).abs() < 0.3e6, "mean {mean}");
        assert!(max - min > 3 * MS as i64, "jitter absent");
        // Sparse traffic sees the whole range too, with the right mean.
        let mut m = LinkModel::new(&topo("[defaults]\nlatency = \"10ms\"\njitter = \"2ms\""));
        let (d, _) = run(&mut m, 2000, 50 * MS, 100, 0, 1);
        let delays: Vec<f64> = d.iter().map(|(i, at)| (*at - i * 50 * MS) as f64).collect();
        let mean = delays.iter().sum::<f64>() / delays.len() as f64;
        let sd =
            (delays.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / delays.len() as f64).sqrt();
        assert!((mean - 10e6).abs() < 0.1e6, "mean {mean}");
        assert!(sd > 0.8e6 && sd < 1.3e6, "sd {sd}");
    }

    #[test]
    fn reordering_when_asked() {
        let mut m = LinkModel::new(&topo(
            "[defaults]\nlatency = \"10ms\"\nreorder = \"5%\"\nreorder_delay = \"2ms\"",
        ));
        let (mut d, _) = run(&mut m, 10_000, 100_000, 100, 0, 1);
        d.sort_by_key(|&(i, at)| (at, i));
        let late = d.windows(2).filter(|w| w[0].0 > w[1].0).count() as f64;
        assert!(
            (late / 10_000.0 - 0.05).abs() < 0.01,
            "reordered fraction {}",
            late / 10_000.0
        );
    }

    #[test]
    fn deterministic_for_a_seed() {
        let t = topo("[defaults]\nlatency = \"3ms\"\njitter = \"1ms\"\nloss = \"3%\"\nup = \"50Mbit\"\nqueue = \"20 packets\"");
        let mut a = LinkModel::new(&t);
        let mut b = LinkModel::new(&t);
        assert_eq!(
            run(&mut a, 5000, 50_000, 700, 0, 1),
            run(&mut b, 5000, 50_000, 700, 0, 1)
        );
        let mut t2 = t.clone();
        t2.seed = 43;
        let mut c = LinkModel::new(&t2);
        assert_ne!(
            run(&mut c, 5000, 50_000, 700, 0, 1),
            run(&mut LinkModel::new(&t), 5000, 50_000, 700, 0, 1)
        );
    }

    #[test]
    fn cut_and_restore_at_run_time() {
        let mut m: LinkModel<u64> = LinkModel::new(&topo("[defaults]\nlatency = \"1ms\""));
        assert!(m.submit(0, 0, 1, 100, 1).is_ok());
        m.update_path(
            0,
            1,
            &PathUpdate {
                up: Some(false),
                ..Default::default()
            },
        );
        assert_eq!(m.submit(10, 0, 1, 100, 2), Err((2, DropCause::LinkDown)));
        assert!(
            m.submit(10, 1, 0, 100, 3).is_ok(),
            "other direction still up"
        );
        m.update_path(
            0,
            1,
            &PathUpdate {
                up: Some(true),
                latency: Some(Duration::from_millis(7)),
                ..Default::default()
            },
        );
        assert!(m.submit(20, 0, 1, 100, 4).is_ok());
        let mut out = Vec::new();
        while let Some(Output::Deliver { token, at, .. }) = m.poll(u64::MAX) {
            out.push((token, at));
        }
        assert_eq!(out, vec![(1, MS), (3, MS + 10), (4, 7 * MS + 20)]);
        m.update_host(
            0,
            &HostUpdate {
                up: Some(Rate(Some(8_000_000))),
                ..Default::default()
            },
        );
        assert_eq!(m.host_spec(0).unwrap().uplink.rate, Rate(Some(8_000_000)));
        let (paths, _) = m.counters();
        assert_eq!(
            paths
                .iter()
                .find(|p| p.src == "a" && p.dst == "b")
                .unwrap()
                .drops
                .link_down,
            1
        );
    }

    #[test]
    fn blocked_protocols() {
        use crate::topology::Block;
        let t = topo("[[link]]\na = \"a\"\nb = \"b\"\nblock = [\"udp\"]");
        let mut m: LinkModel<u64> = LinkModel::new(&t);
        assert_eq!(
            m.submit_ip(0, 0, 1, 100, Block::PROTO_UDP, 1),
            Err((1, DropCause::Blocked))
        );
        assert_eq!(
            m.submit_ip(0, 1, 0, 100, Block::PROTO_UDP, 2),
            Err((2, DropCause::Blocked)),
            "both directions"
        );
        assert!(m.submit_ip(0, 0, 1, 100, Block::PROTO_TCP, 3).is_ok());
        assert!(m.submit_ip(0, 0, 1, 100, Block::PROTO_ICMP, 4).is_ok());
        assert!(m.submit(0, 0, 1, 100, 5).is_ok(), "no protocol given");
        assert!(m.submit_ip(0, 0, 2, 100, Block::PROTO_UDP, 6).is_ok());
        // Unblock at run time.
        m.update_path(
            0,
            1,
            &PathUpdate {
                block: Some(Block::NONE),
                ..Default::default()
            },
        );
        assert!(m.submit_ip(1, 0, 1, 100, Block::PROTO_UDP, 7).is_ok());
        let mut delivered = Vec::new();
        while let Some(Output::Deliver { token, .. }) = m.poll(u64::MAX) {
            delivered.push(token);
        }
        delivered.sort_unstable();
        assert_eq!(delivered, vec![3, 4, 5, 6, 7]);
        let (paths, _) = m.counters();
        let drops = |s: &str, d: &str| {
            paths
                .iter()
                .find(|p| p.src == s && p.dst == d)
                .unwrap()
                .drops
        };
        assert_eq!(drops("a", "b").blocked, 1);
        assert_eq!(drops("a", "b").total(), 1);
        assert_eq!(drops("b", "a").blocked, 1);
    }

    #[test]
    fn per_pair_bottleneck() {
        let t = topo(
            "[[link]]\na = \"a\"\nb = \"b\"\nrate = \"10Mbit\"\nqueue = \"5 packets\"\nloss = 0",
        );
        let mut m = LinkModel::new(&t);
        let (d, x) = run(&mut m, 50, 0, 1250, 0, 1);
        assert_eq!((d.len(), x.len()), (5, 45));
        assert!(x.iter().all(|(_, c)| *c == DropCause::PathQueue));
        let mut m = LinkModel::new(&t);
        let (d, x) = run(&mut m, 50, 0, 1250, 0, 2);
        assert_eq!((d.len(), x.len()), (50, 0), "a->c unaffected");
    }
}
