//! Wall-clock cost of the whole sans-IO per-cell path: a bulk download of
//! 4 MiB through client + guard + middle + exit on the in-memory network
//! (cell encoding, relay crypto at every hop, windows, SENDMEs, schedulers).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_sim::demo::{self, DemoConfig};

fn bulk_through_three_hops(c: &mut Criterion) {
    let config = DemoConfig {
        bulk_bytes: 4 * 1024 * 1024,
        ..DemoConfig::default()
    };
    let mut g = c.benchmark_group("three_hop_path");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(config.bulk_bytes as u64));
    for (name, kind) in [
        ("round_robin", SchedulerKind::RoundRobin),
        ("ewma", SchedulerKind::default()),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| demo::run(&config, kind).map(|r| r.bulk_bytes))
        });
    }
    g.finish();
}

criterion_group!(benches, bulk_through_three_hops);
criterion_main!(benches);
