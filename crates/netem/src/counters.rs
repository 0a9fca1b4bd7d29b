//! Counters and histograms, written as JSON at the end of a run.

use serde::{Deserialize, Serialize};

const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
const MAX_MSB: u32 = 40;
const BUCKETS: usize = ((MAX_MSB - SUB_BITS + 2) as usize) * SUB as usize;

/// Log-linear histogram of nanosecond values (16 sub-buckets per power of
/// two, so bucket bounds are within 6.25% of any value; values up to ~18 min).
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            sum: 0,
            max: 0,
        }
    }
}

fn bucket_index(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let msb = (63 - v.leading_zeros()).min(MAX_MSB);
    let v = v.min((1u64 << (MAX_MSB + 1)) - 1);
    let shift = msb - SUB_BITS;
    let sub = (v >> shift) & (SUB - 1);
    ((msb - SUB_BITS + 1) as u64 * SUB + sub) as usize
}

fn bucket_bounds(idx: usize) -> (u64, u64) {
    let idx = idx as u64;
    if idx < SUB {
        return (idx, idx + 1);
    }
    let msb = idx / SUB + SUB_BITS as u64 - 1;
    let sub = idx % SUB;
    let shift = msb - SUB_BITS as u64;
    ((SUB + sub) << shift, (SUB + sub + 1) << shift)
}

impl Histogram {
    /// Adds one value (nanoseconds).
    pub fn record(&mut self, v: u64) {
        let i = bucket_index(v);
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.total += 1;
        self.sum += u128::from(v);
        self.max = self.max.max(v);
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Merges another histogram into this one.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    /// Estimated quantile `q` in [0, 1] (bucket midpoint), in nanoseconds.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, hi) = bucket_bounds(i);
                return ((lo + hi - 1) / 2).min(self.max);
            }
        }
        self.max
    }

    /// Summary for JSON output (microseconds).
    pub fn summary(&self) -> HistogramSummary {
        let us = |ns: u64| ns as f64 / 1000.0;
        HistogramSummary {
            count: self.total,
            mean_us: if self.total == 0 {
                0.0
            } else {
                self.sum as f64 / self.total as f64 / 1000.0
            },
            p50_us: us(self.quantile(0.5)),
            p90_us: us(self.quantile(0.9)),
            p99_us: us(self.quantile(0.99)),
            max_us: us(self.max),
            buckets: self
                .counts
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(i, &c)| {
                    let (lo, hi) = bucket_bounds(i);
                    (us(lo), us(hi), c)
                })
                .collect(),
        }
    }
}

/// A histogram as written to JSON.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HistogramSummary {
    /// Number of samples.
    pub count: u64,
    /// Mean in microseconds.
    pub mean_us: f64,
    /// Median in microseconds.
    pub p50_us: f64,
    /// 90th percentile in microseconds.
    pub p90_us: f64,
    /// 99th percentile in microseconds.
    pub p99_us: f64,
    /// Maximum in microseconds.
    pub max_us: f64,
    /// Non-empty buckets: `(lower_us, upper_us, count)`.
    pub buckets: Vec<(f64, f64, u64)>,
}

/// Drops by cause.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DropCounts {
    /// Sender's uplink queue was full.
    pub uplink_queue: u64,
    /// The path's own bottleneck queue was full.
    pub path_queue: u64,
    /// Receiver's downlink queue was full.
    pub downlink_queue: u64,
    /// The loss model dropped the packet.
    pub loss: u64,
    /// The path was cut.
    pub link_down: u64,
    /// The forwarder held too many packets.
    pub overflow: u64,
    /// The path blocks the packet's IP protocol (`block = ["udp"]`).
    #[serde(default)]
    pub blocked: u64,
}

impl DropCounts {
    /// Sum of all causes.
    pub fn total(&self) -> u64 {
        self.uplink_queue
            + self.path_queue
            + self.downlink_queue
            + self.loss
            + self.link_down
            + self.overflow
            + self.blocked
    }
}

/// Counters of one directed path.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PathCounters {
    /// Sending host.
    pub src: String,
    /// Receiving host.
    pub dst: String,
    /// Packets that entered the path.
    pub submitted_packets: u64,
    /// Bytes (IP packet length) that entered the path.
    pub submitted_bytes: u64,
    /// Packets delivered to the receiver.
    pub delivered_packets: u64,
    /// Bytes delivered to the receiver.
    pub delivered_bytes: u64,
    /// Drops by cause.
    pub drops: DropCounts,
    /// Time delivered packets spent waiting in queues (excludes propagation
    /// delay and serialisation).
    pub queue_delay: HistogramSummary,
}

/// Counters of one host that are not tied to a path.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HostCounters {
    /// Host name.
    pub name: String,
    /// Packets sent to an address that is not a host of the topology.
    pub no_route_packets: u64,
    /// Bytes of those packets.
    pub no_route_bytes: u64,
    /// Packets that were not IPv4 (dropped).
    pub not_ipv4_packets: u64,
}

/// Counters of the forwarder itself.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ForwarderCounters {
    /// Seconds the forwarder ran.
    pub elapsed_s: f64,
    /// CPU seconds used by the forwarder thread (includes spinning).
    pub cpu_s: f64,
    /// Packets read from TUN devices.
    pub read_packets: u64,
    /// Packets written to TUN devices.
    pub written_packets: u64,
    /// Failed writes to TUN devices.
    pub write_errors: u64,
    /// Actual minus scheduled release time of delivered packets (taken when
    /// the write into the destination TUN starts).
    pub release_error: HistogramSummary,
    /// Duration of the write into the destination TUN (the kernel delivers
    /// the packet into the receiving stack inside this call).
    pub write_time: HistogramSummary,
}

/// Everything counted during a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Counters {
    /// Lab name.
    pub lab: String,
    /// Paths that saw traffic.
    pub paths: Vec<PathCounters>,
    /// Per-host counters.
    pub hosts: Vec<HostCounters>,
    /// Forwarder counters.
    pub forwarder: ForwarderCounters,
}

impl Counters {
    /// Counters of the path `src -> dst`, if it saw traffic.
    pub fn path(&self, src: &str, dst: &str) -> Option<&PathCounters> {
        self.paths.iter().find(|p| p.src == src && p.dst == dst)
    }

    /// Counters of a host.
    pub fn host(&self, name: &str) -> Option<&HostCounters> {
        self.hosts.iter().find(|h| h.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values() {
        for v in [
            0u64,
            1,
            15,
            16,
            17,
            31,
            32,
            1000,
            123_456,
            99_999_999,
            1 << 40,
        ] {
            let (lo, hi) = bucket_bounds(bucket_index(v));
            assert!(lo <= v && v < hi, "{v} not in [{lo},{hi})");
            assert!(hi - lo <= 1.max(v / 8), "bucket too wide for {v}");
        }
        let mut h = Histogram::default();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.07, "{p50}");
        let p99 = h.quantile(0.99) as f64;
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.07, "{p99}");
    }
}
