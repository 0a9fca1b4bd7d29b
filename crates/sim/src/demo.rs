//! The demo experiment: a bulk download and a light interactive stream on
//! two circuits that share every channel of a 3-hop path, run once per
//! circuit scheduler.
//!
//! It reports what the sans-IO core alone does: goodput and ping times in
//! simulated time (channel capacity is the tick's burst limit, not a real
//! link), and wall-clock throughput of the full cell/crypto/circuit path.
//! Per-circuit queues already keep the light circuit out of the bulk
//! circuit's queue here; the head-of-line effects the papers study live in
//! the transport (TCP buffers), which the lab's emulated network adds.

use std::time::{Duration, Instant};

use onionlab_cell::msg::StreamId;
use onionlab_circuit::client::ClientEvent;
use onionlab_circuit::node::{CircKey, NodeEvent};
use onionlab_circuit::scheduler::SchedulerKind;

use crate::{Net, Pattern, SimError};

/// Settings of the demo.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Seed of the network's randomness.
    pub seed: u64,
    /// Bytes the bulk circuit downloads.
    pub bulk_bytes: usize,
    /// Size of one light ping.
    pub ping_bytes: usize,
    /// Simulated time between pings.
    pub ping_interval: Duration,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            seed: 1,
            bulk_bytes: 64 * 1024 * 1024,
            ping_bytes: 100,
            ping_interval: Duration::from_millis(20),
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// The scheduler used on every channel.
    pub scheduler: SchedulerKind,
    /// Bulk bytes moved (all checked against the generator).
    pub bulk_bytes: usize,
    /// Simulated duration of the bulk download.
    pub bulk_sim_time: Duration,
    /// Wall-clock time of the whole run.
    pub wall_time: Duration,
    /// Round-trip times of the light pings (simulated), sorted.
    pub ping_rtts: Vec<Duration>,
}

impl DemoReport {
    /// Bulk goodput in MiB per simulated second.
    pub fn bulk_goodput_sim(&self) -> f64 {
        self.bulk_bytes as f64 / 1048576.0 / self.bulk_sim_time.as_secs_f64().max(1e-9)
    }
    /// MiB of payload pushed through the 3-hop path per wall-clock second.
    pub fn wall_throughput(&self) -> f64 {
        self.bulk_bytes as f64 / 1048576.0 / self.wall_time.as_secs_f64().max(1e-9)
    }
    /// The `q` quantile (0..=1) of ping RTTs.
    pub fn ping_quantile(&self, q: f64) -> Option<Duration> {
        if self.ping_rtts.is_empty() {
            return None;
        }
        let i = ((self.ping_rtts.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        self.ping_rtts.get(i).copied()
    }
}

/// Run the demo once with `scheduler`.
pub fn run(config: &DemoConfig, scheduler: SchedulerKind) -> Result<DemoReport, SimError> {
    let wall = Instant::now();
    let mut net = Net::new(config.seed, 3, scheduler);
    let bulk = net.new_circuit();
    let light = net.new_circuit();
    net.build(bulk)?;
    net.build(light)?;
    let now = net.instant();
    let bulk_stream = net.client.begin(now, bulk, "bulk.example", 80)?;
    let light_stream = net.client.begin(now, light, "light.example", 7)?;

    let mut exit_bulk: Option<(CircKey, StreamId)> = None;
    let mut exit_light: Option<(CircKey, StreamId)> = None;
    let mut to_send = Pattern::new(7, config.bulk_bytes);
    let mut to_check = Pattern::new(7, config.bulk_bytes);
    let mut buf = vec![0u8; 64 * 1024];
    let mut echo = Vec::new();
    let mut next_ping = net.now;
    let mut ping_sent_at: Option<Duration> = None;
    let mut ping_rtts = Vec::new();
    let mut ping_got = 0usize;
    let start = net.now;
    let exit = net.relays.len() - 1;
    let limit = net.now + Duration::from_secs(3600);

    while to_check.remaining > 0 {
        if net.now > limit {
            return Err(SimError::Timeout(Duration::from_secs(3600)));
        }
        net.tick();
        let now = net.instant();
        for (_, ev) in net.node_events.drain(..) {
            match ev {
                NodeEvent::ExitConnect {
                    circ,
                    stream,
                    port: 80,
                    ..
                } => exit_bulk = Some((circ, stream)),
                NodeEvent::ExitConnect { circ, stream, .. } => exit_light = Some((circ, stream)),
                NodeEvent::CircuitClosed { reason, .. } => return Err(SimError::Closed(reason)),
                _ => {}
            }
        }
        for (_, ev) in net.client_events.drain(..) {
            if let ClientEvent::Closed(r) = ev {
                return Err(SimError::Closed(r));
            }
        }
        // Exit: the bulk server writes as fast as the circuit takes it; the
        // light server echoes.
        if let Some((c, s)) = exit_bulk {
            let chunk = to_send.peek(64 * 1024).to_vec();
            if !chunk.is_empty() {
                let n = net.relays[exit].exit_write(now, c, s, &chunk)?;
                to_send.consume(n);
            }
        }
        if let Some((c, s)) = exit_light {
            let n = net.relays[exit].exit_read(now, c, s, &mut buf)?;
            echo.extend_from_slice(&buf[..n]);
            if !echo.is_empty() {
                let n = net.relays[exit].exit_write(now, c, s, &echo)?;
                echo.drain(..n);
            }
        }
        // Client: read bulk, send pings, time echoes.
        let n = net.client.read(now, bulk, bulk_stream, &mut buf)?;
        if !to_check.expect(&buf[..n]) {
            return Err(SimError::Corrupt("bulk download"));
        }
        let n = net.client.read(now, light, light_stream, &mut buf)?;
        ping_got += n;
        if let Some(sent) = ping_sent_at {
            if ping_got >= config.ping_bytes {
                ping_got -= config.ping_bytes;
                ping_rtts.push(net.now - sent);
                ping_sent_at = None;
            }
        }
        if ping_sent_at.is_none() && net.now >= next_ping {
            let ping = vec![0x70u8; config.ping_bytes];
            if net.client.write(now, light, light_stream, &ping)? == ping.len() {
                ping_sent_at = Some(net.now);
                next_ping = net.now + config.ping_interval;
            }
        }
    }
    ping_rtts.sort();
    Ok(DemoReport {
        scheduler,
        bulk_bytes: config.bulk_bytes,
        bulk_sim_time: net.now - start,
        wall_time: wall.elapsed(),
        ping_rtts,
    })
}
