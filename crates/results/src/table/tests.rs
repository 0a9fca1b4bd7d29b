use std::path::PathBuf;

use clap::Parser;
use onionlab_lab::agent::TransferRecord;
use onionlab_lab::journal::Segment;
use onionlab_lab::run::RepetitionRecord;
use onionlab_lab::rundata::RunData;
use onionlab_stats::{ratio_of_medians, ratio_of_medians_clustered};

use super::*;

const SCENARIO: &str = r#"name = "synthetic"
topology = "t.toml"
repetitions = 8
[matrix]
"loss:guard-middle" = ["0%", "1%"]
transport = ["tls", "quic"]
"#;

fn label(loss: &str, transport: &str) -> String {
    format!("loss:guard-middle={loss} transport={transport}")
}

/// A run: per variant and repetition, `per_rep` transfers of the workloads
/// `light` and `bulk`, with TTLB = base x factor x the repetition's own
/// effect (up to `1 + spread`) x a small spread within it.
fn run_with(
    reps: u32,
    per_rep: u32,
    spread: f64,
    effect: impl Fn(&str, &str, &str) -> f64,
) -> RunData {
    let mut records = Vec::new();
    let mut repetitions = Vec::new();
    for rep in 0..reps {
        // Each repetition's network is its own.
        let rep_effect = 1.0 + spread * f64::from((rep * 7) % 5) / 4.0;
        for loss in ["0%", "1%"] {
            for transport in ["tls", "quic"] {
                let variant = label(loss, transport);
                for w in ["light", "bulk"] {
                    for i in 0..per_rep {
                        let within = 1.0 + 0.01 * f64::from(i);
                        let ttlb = 100.0 * effect(loss, transport, w) * rep_effect * within;
                        records.push(TransferRecord {
                            workload: w.into(),
                            kind: "download".into(),
                            index: i,
                            size: 10 * 1024,
                            ttfb_ms: Some(ttlb / 4.0),
                            ttlb_ms: Some(ttlb),
                            variant: variant.clone(),
                            repetition: rep,
                            ..TransferRecord::default()
                        });
                    }
                }
                repetitions.push(RepetitionRecord {
                    variant: variant.clone(),
                    repetition: rep,
                    jobs: 1,
                    ..RepetitionRecord::default()
                });
            }
        }
    }
    RunData {
        source: PathBuf::from("/synthetic/run-1"),
        manifest: None,
        scenario_toml: SCENARIO.into(),
        records,
        repetitions,
        segments: vec![Segment {
            commit: "0123456789ab".into(),
            ..Segment::default()
        }],
        joined: Vec::new(),
    }
}

/// [`run_with`] with a weak repetition effect (5%).
fn run(reps: u32, per_rep: u32, effect: impl Fn(&str, &str, &str) -> f64) -> RunData {
    run_with(reps, per_rep, 0.05, effect)
}

/// QUIC 20% faster under loss for the light client, the same otherwise.
fn quic_helps_light_under_loss(loss: &str, transport: &str, w: &str) -> f64 {
    if loss == "1%" && transport == "quic" && w == "light" {
        0.8
    } else {
        1.0
    }
}

#[derive(Parser)]
struct Cmd {
    #[command(flatten)]
    args: TableArgs,
}

fn args(extra: &[&str]) -> TableArgs {
    let mut words = vec!["table", "/synthetic/run-1"];
    words.extend_from_slice(extra);
    Cmd::parse_from(words).args
}

#[test]
fn rows_compare_each_transport_with_its_baseline_condition() {
    let data = run(8, 2, quic_helps_light_under_loss);
    let t = table_of(&data, &args(&["--metric", "ttlb"])).unwrap();
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(
        lines[0],
        "| loss:guard-middle | transport | workload | reps | TTLB ms (tls) | TTLB ratio [95% CI] | p adj. |"
    );
    // 2 conditions x 2 workloads, one row each (quic against tls).
    let rows: Vec<&str> = lines[2..]
        .iter()
        .take_while(|l| l.starts_with('|'))
        .copied()
        .collect();
    assert_eq!(rows.len(), 4, "{t}");
    assert!(
        rows[0].starts_with("| 0% | quic | light | 8 | "),
        "{}",
        rows[0]
    );
    let light_loss = rows
        .iter()
        .find(|r| r.starts_with("| 1% | quic | light"))
        .unwrap();
    // 0.8 exactly (the repetition effect cancels in the pairing), bold:
    // every repetition's QUIC median is below every TLS one.
    assert!(light_loss.contains("**0.80** [0.80, 0.80]"), "{light_loss}");
    let bulk_loss = rows
        .iter()
        .find(|r| r.starts_with("| 1% | quic | bulk"))
        .unwrap();
    assert!(
        bulk_loss.contains("| 1.00 [1.00, 1.00] | 1.000 |"),
        "{bulk_loss}"
    );
    assert!(t.contains(
        "Run `run-1` (scenario `synthetic`, 8 of 8 planned repetitions), commit 0123456789ab."
    ));
    assert!(t.contains("Holm-adjusted over the 4 comparisons"), "{t}");
    assert!(t.contains("Bold (1)"), "{t}");
    // Byte-stable: the same data gives the same table.
    assert_eq!(t, table_of(&data, &args(&["--metric", "ttlb"])).unwrap());
}

#[test]
fn fewer_than_five_repetitions_are_a_first_look_without_bold() {
    let data = run(3, 2, quic_helps_light_under_loss);
    let t = table_of(&data, &args(&[])).unwrap();
    assert!(!t.contains("**0."), "{t}");
    assert!(t.contains("**First look**"), "{t}");
}

#[test]
fn holm_takes_the_number_of_comparisons_into_account() {
    // Eight repetitions, a clear effect in one cell: alone its U test gives
    // p ≈ 8.7e-4 (every QUIC median below every TLS one; the repetitions'
    // tied values make it the normal approximation); with the other
    // metrics and workloads in the table it is multiplied by the number of
    // comparisons (Holm: 8 for the smallest).
    let data = run(8, 1, quic_helps_light_under_loss);
    let one = table_of(
        &data,
        &args(&[
            "--metric",
            "ttlb",
            "--workload",
            "light",
            "--where",
            "loss:guard-middle=1%",
        ]),
    )
    .unwrap();
    assert!(one.contains("over the 1 comparisons"), "{one}");
    assert!(one.contains("| < 0.001 |"), "{one}");
    let many = table_of(&data, &args(&["--metric", "ttfb,ttlb"])).unwrap();
    assert!(many.contains("over the 8 comparisons"), "{many}");
    // 8 x 8.7e-4 = 0.007: still significant, no longer below 0.001.
    assert!(many.contains("**0.80** [0.80, 0.80] | 0.007 |"), "{many}");
    let bh = table_of(
        &data,
        &args(&["--metric", "ttfb,ttlb", "--correction", "bh"]),
    )
    .unwrap();
    assert!(bh.contains("Benjamini-Hochberg"), "{bh}");
}

#[test]
fn the_interval_by_repetition_is_wider_than_by_transfer_with_a_repetition_effect() {
    // Light, 1% loss, QUIC against TLS: 6 transfers per repetition, a
    // strong repetition effect. By transfer the 48 values look like 48
    // independent draws; by repetition there are 8.
    let data = run_with(8, 6, 0.6, |loss, t, w| {
        // No pairing benefit: QUIC's repetition effect is reversed.
        if loss == "1%" && t == "quic" && w == "light" {
            0.9
        } else {
            1.0
        }
    });
    let sel = Selection::new(&data, false, false);
    let a = sel.sample(MetricKind::Ttlb, &label("1%", "quic"), Some("light"));
    // Scramble the pairing: TLS's repetitions in reverse order.
    let mut b = sel.sample(MetricKind::Ttlb, &label("1%", "tls"), Some("light"));
    b.repetitions.iter_mut().for_each(|r| *r = 7 - *r);
    let by_value = ratio_of_medians(&a.values, &b.values, 1).unwrap();
    let by_rep =
        ratio_of_medians_clustered(&a.values, &a.repetitions, &b.values, &b.repetitions, 1)
            .unwrap();
    let width = |r: &RatioCi| r.ci95.1 - r.ci95.0;
    assert!(
        width(&by_rep) > 1.2 * width(&by_value),
        "by repetition {by_rep:?}, by transfer {by_value:?}"
    );
}

#[test]
fn failed_transfers_and_saturated_repetitions_are_left_out_and_counted() {
    let mut data = run(6, 1, quic_helps_light_under_loss);
    data.records[0].error = Some("timed out".into());
    data.records[0].ttlb_ms = None;
    let v = data.records[0].variant.clone();
    for r in data.repetitions.iter_mut().filter(|r| r.repetition == 5) {
        r.cpu_saturated = true;
    }
    let t = table_of(&data, &args(&["--workload", "light"])).unwrap();
    assert!(
        t.contains("Left out: 1 failed transfers, 4 repetitions on a saturated CPU."),
        "{t}"
    );
    let sel = Selection::new(&data, false, false);
    assert_eq!(
        sel.sample(MetricKind::Ttlb, &v, Some("light")).values.len(),
        4
    );
}

#[test]
fn pairs_pool_and_metrics_per_repetition() {
    let data = run(6, 2, quic_helps_light_under_loss);
    let a = label("1%", "quic");
    let b = label("0%", "tls");
    let t = table_of(
        &data,
        &args(&["--pair", &a, &b, "--pool", "--metric", "ttlb"]),
    )
    .unwrap();
    assert!(
        t.starts_with("| A | B | workload | reps | TTLB ms (B) |"),
        "{t}"
    );
    assert!(t.contains(&format!("| {a} | {b} | all | 6 |")), "{t}");
    let e = table_of(&data, &args(&["--metric", "ttlb,relay-cpu"])).unwrap_err();
    assert!(e.to_string().contains("separate tables"), "{e}");
    // No relay CPU recorded in the synthetic run: every cell is "-".
    let cpu = table_of(&data, &args(&["--metric", "relay-cpu"])).unwrap();
    assert!(cpu.contains("| 0% | quic | 0 | - | - | - |"), "{cpu}");
}

#[test]
fn arguments_that_do_not_fit_the_run_are_named() {
    let data = run(5, 1, quic_helps_light_under_loss);
    let err = |extra: &[&str]| table_of(&data, &args(extra)).unwrap_err().to_string();
    assert!(err(&["--workload", "video"]).contains("no workload \"video\""));
    assert!(err(&["--baseline", "pctcp"]).contains("transport=pctcp"));
    assert!(err(&["--compare", "scheduler"]).contains("\"scheduler\""));
    assert!(err(&["--where", "loss:guard-middle=5%"]).contains("no variant"));
    assert!(err(&["--where", "oops"]).contains("PARAM=VALUE"));
    assert!(err(&["--pair", "transport=x", "transport=y"]).contains("no variant"));
}

#[test]
fn the_slowest_client_per_repetition_and_means() {
    // Goodput: QUIC's light client twice as fast under loss; the slowest
    // client of a repetition is the bulk one (goodput 1 per its TTLB).
    let mut data = run(6, 2, quic_helps_light_under_loss);
    for r in &mut data.records {
        r.goodput_mib_s = r.ttlb_ms.map(|t| 1000.0 / t);
    }
    // A failed transfer: its repetition has no slowest client.
    let failed = data
        .records
        .iter_mut()
        .find(|r| r.variant == label("1%", "quic") && r.repetition == 2)
        .unwrap();
    failed.error = Some("timed out".into());
    let t = table_of(
        &data,
        &args(&[
            "--pool",
            "--per-repetition",
            "min",
            "--metric",
            "goodput",
            "--where",
            "loss:guard-middle=1%",
        ]),
    )
    .unwrap();
    assert!(t.contains("goodput MiB/s, min a repetition (tls)"), "{t}");
    // Only the 5 repetitions both have; the slowest is bulk, as fast over
    // both transports.
    assert!(t.contains("| quic | all | 5 |"), "{t}");
    assert!(t.contains("| 1.00 [1.00, 1.00] |"), "{t}");
    assert!(
        t.contains("each repetition's min (repetitions with a failed transfer left out)"),
        "{t}"
    );
    let mean = table_of(
        &data,
        &args(&[
            "--center",
            "mean",
            "--metric",
            "ttlb",
            "--workload",
            "light",
        ]),
    )
    .unwrap();
    assert!(
        mean.contains("the means of the transfers' values"),
        "{mean}"
    );
    assert!(mean.contains("**0.80** [0.80, 0.80]"), "{mean}");
}

#[test]
fn a_workload_pattern_pools_what_it_matches() {
    let data = run(6, 2, quic_helps_light_under_loss);
    let star = table_of(&data, &args(&["--workload", "*", "--metric", "ttlb"])).unwrap();
    let pool = table_of(&data, &args(&["--pool", "--metric", "ttlb"])).unwrap();
    assert_eq!(star.replace("| * |", "| all |"), pool);
    let light = table_of(&data, &args(&["--workload", "l*t", "--metric", "ttlb"])).unwrap();
    let named = table_of(&data, &args(&["--workload", "light", "--metric", "ttlb"])).unwrap();
    assert_eq!(light.replace("| l*t |", "| light |"), named);
    let e = table_of(&data, &args(&["--pool", "--workload", "light"])).unwrap_err();
    assert!(e.to_string().contains("pattern"), "{e}");
}

#[test]
fn relay_metrics_choose_their_relays() {
    let mut data = run(6, 1, quic_helps_light_under_loss);
    for r in &mut data.repetitions {
        let quic = r.variant.contains("quic");
        let guard = if quic { 2.0 } else { 1.0 };
        r.relay_cpu_s = vec![("guard".into(), guard), ("exit".into(), 1.0)];
        r.relay_peak_rss = vec![("guard".into(), 10 << 20), ("exit".into(), 20 << 20)];
    }
    let cpu = |relay: &str| {
        table_of(
            &data,
            &args(&[
                "--metric",
                "relay-cpu-s",
                "--relay",
                relay,
                "--where",
                "loss:guard-middle=0%",
            ]),
        )
        .unwrap()
    };
    assert!(
        cpu("guard").contains("| 2.00 (1.00) | **2.00** [2.00, 2.00] |"),
        "{}",
        cpu("guard")
    );
    assert!(
        cpu("e*").contains("| 1.00 (1.00) | 1.00 [1.00, 1.00] |"),
        "{}",
        cpu("e*")
    );
    let all = table_of(&data, &args(&["--metric", "relay-cpu-s,relay-rss"])).unwrap();
    assert!(
        all.contains("| 3.00 (2.00) | **1.50** [1.50, 1.50] |"),
        "{all}"
    );
    assert!(
        all.contains("the medians of the repetitions' values"),
        "{all}"
    );
    // Two relays a repetition: the median of 10 and 20 MiB.
    assert!(all.contains("| 15.0 (15.0) | 1.00 [1.00, 1.00] |"), "{all}");
}

#[test]
fn a_cell_thinned_below_five_repetitions_is_never_bold() {
    let mut data = run(6, 1, quic_helps_light_under_loss);
    let t = table_of(&data, &args(&["--metric", "ttlb", "--workload", "light"])).unwrap();
    assert!(t.contains("**0.80**"), "{t}");
    // Two of QUIC's repetitions at 1% loss ran on a saturated CPU: four
    // are left for that comparison.
    for r in data
        .repetitions
        .iter_mut()
        .filter(|r| r.variant == label("1%", "quic") && r.repetition >= 4)
    {
        r.cpu_saturated = true;
    }
    let t = table_of(&data, &args(&["--metric", "ttlb", "--workload", "light"])).unwrap();
    assert!(t.contains("| 1% | quic | light | 4 |"), "{t}");
    assert!(!t.contains("**"), "{t}");
    assert!(
        t.contains("1 cells rest on fewer than 5 repetitions"),
        "{t}"
    );
}

#[test]
fn several_relay_patterns_make_a_row_each_and_relay_core_is_a_share_of_wall_time() {
    let mut data = run(6, 1, quic_helps_light_under_loss);
    for r in &mut data.repetitions {
        let quic = r.variant.contains("quic");
        r.wall_s = if quic { 10.0 } else { 20.0 };
        r.relay_cpu_s = vec![("g1".into(), 2.0), ("exit".into(), 1.0)];
    }
    let t = table_of(
        &data,
        &args(&[
            "--metric",
            "relay-core",
            "--relay",
            "g1,exit",
            "--where",
            "loss:guard-middle=0%",
        ]),
    )
    .unwrap();
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines[0].contains("| relays | reps |"), "{t}");
    // 2 s of 10 s against 2 s of 20 s: 20% against 10% of a core.
    assert!(
        lines[2].starts_with("| quic | g1 | 6 | 20.0 (10.0) | **2.00**"),
        "{t}"
    );
    assert!(
        lines[3].starts_with("| quic | exit | 6 | 10.0 (5.00) |"),
        "{t}"
    );
    let e = table_of(&data, &args(&["--metric", "relay-core", "--relay", "m9"])).unwrap_err();
    assert!(e.to_string().contains("no relay matches"), "{e}");
    let e = table_of(&data, &args(&["--metric", "ttlb", "--relay", "g1"])).unwrap_err();
    assert!(e.to_string().contains("relay metrics only"), "{e}");
}

#[test]
fn an_ignored_parameter_lets_every_variant_meet_the_one_baseline() {
    let data = run(6, 1, quic_helps_light_under_loss);
    // Without --ignore, quic at 1% meets tls at 1%; ignoring the loss, tls
    // at 0% is the baseline of both quic variants and of tls at 1%.
    let t = table_of(
        &data,
        &args(&[
            "--metric",
            "ttlb",
            "--workload",
            "light",
            "--compare",
            "transport",
            "--ignore",
            "loss:guard-middle",
            "--where",
            "transport=quic",
        ]),
    );
    // The filter removed the baseline: an error that says so.
    assert!(t.is_err());
    let data = {
        let mut d = data;
        d.records
            .retain(|r| !(r.variant.contains("1%") && r.variant.contains("tls")));
        d.repetitions
            .retain(|r| !(r.variant.contains("1%") && r.variant.contains("tls")));
        d
    };
    let t = table_of(
        &data,
        &args(&[
            "--metric",
            "ttlb",
            "--workload",
            "light",
            "--ignore",
            "loss:guard-middle",
        ]),
    )
    .unwrap();
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(
        lines[0],
        "| loss:guard-middle | transport | workload | reps | TTLB ms (tls) | TTLB ratio [95% CI] | p adj. |",
        "{t}"
    );
    assert!(lines[2].starts_with("| 0% | quic | light |"), "{t}");
    assert!(lines[3].starts_with("| 1% | quic | light |"), "{t}");
    assert!(lines[3].contains("**0.80** [0.80, 0.80]"), "{t}");
    let e = table_of(&data, &args(&["--ignore", "transport"])).unwrap_err();
    assert!(e.to_string().contains("compared parameter"), "{e}");
}

#[test]
fn a_summary_gives_each_variant_its_centre_and_an_interval_by_repetition() {
    // A strong repetition effect (50%): the interval must reflect six
    // repetitions, not 6 x 4 transfers.
    let data = run_with(6, 4, 0.5, quic_helps_light_under_loss);
    let t = table_of(
        &data,
        &args(&[
            "--summary",
            "--metric",
            "ttlb",
            "--workload",
            "light",
            "--center",
            "mean",
        ]),
    )
    .unwrap();
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(
        lines[0], "| loss:guard-middle | transport | workload | reps | TTLB ms, mean [95% CI] |",
        "{t}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("| ")).count(),
        5,
        "{t}"
    );
    let tls = lines[2];
    assert!(tls.starts_with("| 0% | tls | light | 6 | "), "{t}");
    let cell = tls.rsplit('|').nth(1).unwrap().trim();
    let (center, ci) = cell.split_once(" [").unwrap();
    let center: f64 = center.parse().unwrap();
    let (lo, hi) = ci.trim_end_matches(']').split_once(", ").unwrap();
    let (lo, hi): (f64, f64) = (lo.parse().unwrap(), hi.parse().unwrap());
    assert!(lo < center && center < hi, "{cell}");
    // By transfer, 24 values spread by the repetitions' effect would give
    // a narrower interval; here it spans most of the effect's range.
    let by_transfer = onionlab_stats::Summary::of(
        &data
            .records
            .iter()
            .filter(|r| r.variant == label("0%", "tls") && r.workload == "light")
            .filter_map(|r| r.ttlb_ms)
            .collect::<Vec<_>>(),
        1,
    )
    .unwrap();
    assert!(
        hi - lo > by_transfer.mean_ci95.1 - by_transfer.mean_ci95.0,
        "{cell} against {:?}",
        by_transfer.mean_ci95
    );
    assert!(
        t.contains("cluster-bootstrap interval over repetitions"),
        "{t}"
    );
    // Byte-stable.
    assert_eq!(
        t,
        table_of(
            &data,
            &args(&[
                "--summary",
                "--metric",
                "ttlb",
                "--workload",
                "light",
                "--center",
                "mean"
            ])
        )
        .unwrap()
    );
    let e = Cmd::try_parse_from(["t", "/r", "--summary", "--pair", "a", "b"]);
    assert!(e.is_err());
}

#[test]
fn relay_hosts_tcp_counters_and_torchestra_moves_sum_over_the_chosen_relays() {
    use onionlab_lab::hostnet::HostTcpCounters;
    let mut data = run(6, 1, quic_helps_light_under_loss);
    for r in &mut data.repetitions {
        let quic = r.variant.contains("quic");
        r.relay_cpu_s = vec![("guard".into(), 1.0), ("exit".into(), 1.0)];
        let counters = |host: &str, timeouts| HostTcpCounters {
            host: host.into(),
            timeouts,
            retrans_segs: 10 * timeouts,
            ..HostTcpCounters::default()
        };
        // The client's host is not a relay's: never counted.
        r.tcp_counters = vec![
            counters("guard", if quic { 1 } else { 4 }),
            counters("exit", 2),
            counters("op", 100),
        ];
        if quic {
            r.torchestra_moves = vec![("exit".into(), 3), ("middle".into(), 3)];
        }
    }
    let t = table_of(
        &data,
        &args(&[
            "--summary",
            "--metric",
            "tcp-timeouts,tcp-retransmits,torchestra-moves",
            "--where",
            "loss:guard-middle=0%",
        ]),
    )
    .unwrap();
    assert!(
        t.contains("| tls | 6 | 6.00 [6.00, 6.00] | 60.0 [60.0, 60.0] | 0.000 [0.000, 0.000] |"),
        "{t}"
    );
    assert!(
        t.contains("| quic | 6 | 3.00 [3.00, 3.00] | 30.0 [30.0, 30.0] | 6.00 [6.00, 6.00] |"),
        "{t}"
    );
    let exit = table_of(
        &data,
        &args(&[
            "--summary",
            "--metric",
            "torchestra-moves",
            "--relay",
            "exit,guard",
        ]),
    )
    .unwrap();
    assert!(
        exit.contains("| 1% | quic | exit | 6 | 3.00 [3.00, 3.00] |"),
        "{exit}"
    );
    assert!(
        exit.contains("| 1% | quic | guard | 6 | 0.000 [0.000, 0.000] |"),
        "{exit}"
    );
}

#[test]
fn a_summary_reduces_each_repetition_first_where_asked() {
    let data = run(6, 3, quic_helps_light_under_loss);
    let t = table_of(
        &data,
        &args(&[
            "--summary",
            "--metric",
            "ttlb",
            "--workload",
            "light",
            "--per-repetition",
            "sum",
            "--where",
            "loss:guard-middle=0%",
        ]),
    )
    .unwrap();
    assert!(
        t.contains("| TTLB ms, median of each repetition's sum [95% CI] |"),
        "{t}"
    );
    // Three transfers of about 100 ms a repetition.
    let tls = t.lines().find(|l| l.starts_with("| tls |")).unwrap();
    let center: f64 = tls
        .split('|')
        .nth(4)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((300.0..330.0).contains(&center), "{t}");
}

#[test]
fn several_baselines_in_one_condition_are_named_in_an_against_column() {
    // Ignoring the loss, tls at 0% and at 1% are both baselines of every
    // quic variant (seed 003's Normal and Prioritized Tor).
    let data = run(6, 1, quic_helps_light_under_loss);
    let t = table_of(
        &data,
        &args(&[
            "--metric",
            "ttlb",
            "--workload",
            "light",
            "--ignore",
            "loss:guard-middle",
        ]),
    )
    .unwrap();
    let lines: Vec<&str> = t.lines().collect();
    assert!(
        lines[0].starts_with("| against | loss:guard-middle | transport | workload |"),
        "{t}"
    );
    assert!(
        lines[2..]
            .iter()
            .any(|l| l.starts_with("| loss:guard-middle=0% | 1% | quic | light |")),
        "{t}"
    );
    assert!(
        lines[2..]
            .iter()
            .any(|l| l.starts_with("| loss:guard-middle=1% | 0% | quic | light |")),
        "{t}"
    );
    // tls at 1% against tls at 0% is a row too.
    assert!(
        lines[2..]
            .iter()
            .any(|l| l.starts_with("| loss:guard-middle=0% | 1% | tls | light |")),
        "{t}"
    );
}

#[test]
fn a_slope_over_lost_packets_is_the_cost_of_each() {
    use onionlab_lab::run::LinkPackets;
    // TTLB = 100 x effect x the repetition's effect x spread, and each
    // repetition's lost packets are set so that tls pays 2 ms and quic
    // 5 ms more per lost packet on top of it.
    let mut data = run(8, 2, |_, _, _| 1.0);
    for r in &mut data.repetitions {
        let lost = 10 * u64::from(r.repetition % 4) + 5;
        r.link_packets = vec![LinkPackets {
            packets: 1000,
            lost,
            ..LinkPackets::default()
        }];
        let cost = if r.variant.contains("quic") { 5.0 } else { 2.0 };
        for t in data
            .records
            .iter_mut()
            .filter(|t| t.variant == r.variant && t.repetition == r.repetition)
        {
            t.ttlb_ms = Some(300.0 + cost * lost as f64);
        }
    }
    let t = table_of(
        &data,
        &args(&[
            "--slope-over",
            "lost-packets",
            "--metric",
            "ttlb",
            "--workload",
            "light",
            "--where",
            "loss:guard-middle=0%",
        ]),
    )
    .unwrap();
    assert!(
        t.contains("| tls | light | 8 | 20.0 | 340 | 2.00 [2.00, 2.00] |"),
        "{t}"
    );
    assert!(
        t.contains("| quic | light | 8 | 20.0 | 400 | 5.00 [5.00, 5.00] |"),
        "{t}"
    );
    let e = table_of(&data, &args(&["--slope-over", "ttlb"])).unwrap_err();
    assert!(e.to_string().contains("per repetition is needed"), "{e}");
    let e = table_of(&data, &args(&["--slope-over", "lost-packets"])).unwrap_err();
    assert!(e.to_string().contains("one --metric"), "{e}");
}

#[test]
fn percentiles_per_workload_reductions_and_the_loaded_window() {
    let mut data = run(
        6,
        4,
        |_, transport, _| if transport == "quic" { 0.5 } else { 1.0 },
    );
    // Transfer i of a workload takes 100 x (i + 1) (x the factors):
    // within a repetition, light's values are 100, 200, 300, 400.
    for t in &mut data.records {
        let base = t.ttlb_ms.unwrap() / (1.0 + 0.01 * f64::from(t.index));
        t.ttlb_ms = Some(base * f64::from(t.index + 1));
        t.start_unix_ms = 1000.0 * f64::from(t.index);
    }
    let one = |data: &RunData, extra: &[&str]| {
        let mut a = vec![
            "--summary",
            "--metric",
            "ttlb",
            "--workload",
            "light",
            "--where",
            "loss:guard-middle=0%",
            "--where",
            "transport=tls",
        ];
        a.extend_from_slice(extra);
        let t = table_of(data, &args(&a)).unwrap();
        let line = t.lines().nth(2).unwrap().to_string();
        let cell = line.rsplit('|').nth(1).unwrap().trim().to_string();
        let center: f64 = cell.split_whitespace().next().unwrap().parse().unwrap();
        (center, t)
    };
    let (median, _) = one(&data, &[]);
    let (p75, t) = one(&data, &["--center", "p75"]);
    let (p95, _) = one(&data, &["--center", "p95"]);
    assert!(median < p75 && p75 < p95, "{median} {p75} {p95}\n{t}");
    assert!(t.contains("TTLB ms, 75th percentile [95% CI]"), "{t}");
    // One workload a client: the clients' medians, one a repetition.
    let (per_workload, t) = one(&data, &["--per-workload", "max"]);
    assert!(per_workload > p75, "{t}");
    assert!(t.contains("each workload's max in a repetition"), "{t}");
    let e = table_of(&data, &args(&["--pool", "--per-workload", "median"])).unwrap_err();
    assert!(e.to_string().contains("--per-workload"), "{e}");

    // A stream ending at 1500 ms: light's transfers 0 (ends 0 + ~100) and
    // 1 (1000 + ~200) ran under load, 2 and 3 ended after it (and so
    // did bulk's, which the caption counts too: 2 x 2 x 6).
    for rep in 0..6 {
        data.records.push(TransferRecord {
            workload: "load".into(),
            kind: "stream".into(),
            ttlb_ms: Some(1500.0),
            variant: label("0%", "tls"),
            repetition: rep,
            ..TransferRecord::default()
        });
    }
    // Each workload's transfer by its number: light's second is 200 (x
    // its repetition's effect, at most 5%), its first 100.
    let (second, t) = one(&data, &["--index", "1"]);
    assert!((200.0..=210.0).contains(&second), "{second}\n{t}");
    assert!(t.contains("Only each workload's second transfer"), "{t}");
    let (first, _) = one(&data, &["--index", "0", "--center", "mean"]);
    assert!((100.0..=105.0).contains(&first), "{first}");

    let (loaded, t) = one(&data, &["--while-loaded", "--center", "p95"]);
    assert!(loaded < median, "{loaded}\n{t}");
    assert!(
        t.contains("Left out: 24 transfers that ended after their repetition's first stream"),
        "{t}"
    );
}

#[test]
fn repetitions_beside_other_runs_are_set_against_those_made_alone() {
    let mut data = run(8, 2, |_, _, _| 1.0);
    let e = table_of(&data, &args(&["--by-jobs"])).unwrap_err();
    assert!(
        e.to_string().contains("no repetition was made beside"),
        "{e}"
    );
    for r in &mut data.repetitions {
        if r.repetition >= 4 {
            r.jobs = 4;
            r.cpu_busy_fraction = 0.6;
        }
    }
    for t in &mut data.records {
        if t.repetition >= 4 {
            t.ttlb_ms = t.ttlb_ms.map(|x| x * 1.2);
        }
    }
    let t = table_of(
        &data,
        &args(&[
            "--by-jobs",
            "--metric",
            "ttlb",
            "--where",
            "loss:guard-middle=0%",
        ]),
    )
    .unwrap();
    let tls = t
        .lines()
        .find(|l| l.starts_with("| tls | light |"))
        .unwrap_or_else(|| panic!("{t}"));
    assert!(tls.contains("| 4 / 4 |"), "{tls}");
    // 1.2 x the alone repetitions' (whose own effects differ: the
    // interval is wide, unpaired).
    let ratio: f64 = tls
        .rsplit('|')
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1.1..1.4).contains(&ratio), "{tls}");
    assert!(t.contains("machine busy 60.0"), "{t}");
    assert!(Cmd::try_parse_from(["t", "/r", "--by-jobs", "--alone"]).is_err());
}

#[test]
fn sharing_keeps_the_web_clients_of_one_class_from_the_recorded_paths() {
    let mut data = run(8, 2, quic_helps_light_under_loss);
    data.scenario_toml.push_str(
        "[[workload]]\nname = \"light\"\nkind = \"web\"\nclient = \"w1\"\n\
         [[workload]]\nname = \"bulk\"\nkind = \"bulk\"\nclient = \"b1\"\n",
    );
    let hops = |h: &str| h.split(',').map(str::to_string).collect::<Vec<_>>();
    for r in &mut data.repetitions {
        // Even repetitions: the web client's circuit shares m1-e1 with the
        // bulk client's; odd ones: nothing. quic at 1% has no paths (as
        // C tor would not).
        let web = if r.repetition % 2 == 0 {
            "g2,m1,e1"
        } else {
            "g3,m3,e3"
        };
        if !(r.variant.contains("quic") && r.variant.contains("1%")) {
            r.client_paths = vec![("b1".into(), hops("g1,m1,e1")), ("w1".into(), hops(web))];
        }
    }
    let t = |class: &str| {
        table_of(
            &data,
            &args(&["--summary", "--metric", "ttlb", "--sharing", class]),
        )
        .unwrap()
    };
    let connection = t("connection");
    assert!(
        connection.contains("| 0% | tls | light | 4 |"),
        "{connection}"
    );
    // The bulk client is no web client: never in a class.
    assert!(
        connection.contains("| 0% | tls | bulk | 0 | - |"),
        "{connection}"
    );
    assert!(
        connection.contains("| 1% | quic | light | 0 | - |"),
        "{connection}"
    );
    assert!(
        connection.contains("Only web clients whose circuit shares a link connection"),
        "{connection}"
    );
    assert!(t("apart").contains("| 0% | tls | light | 4 |"));
    assert!(t("relay").contains("| 0% | tls | light | 0 | - |"));
}

#[test]
fn runs_read_together_pair_their_repetitions_and_are_named_in_the_caption() {
    let mut a = run(6, 1, quic_helps_light_under_loss);
    let mut b = run(6, 1, |_, _, _| 0.5);
    // b: another preset whose variants carry one more parameter.
    b.source = PathBuf::from("/synthetic/run-2");
    for r in &mut b.records {
        r.variant = format!("{} tcp_notsent_lowat=16KiB", r.variant);
    }
    for r in &mut b.repetitions {
        r.variant = format!("{} tcp_notsent_lowat=16KiB", r.variant);
    }
    b.scenario_toml = b.scenario_toml.replace("synthetic", "synthetic-lowat");
    let mut same = a.clone();
    assert!(same.join(a.clone()).is_err());
    a.join(b).unwrap();
    let lowat = format!("{} tcp_notsent_lowat=16KiB", label("0%", "tls"));
    let t = table_of(
        &a,
        &args(&[
            "--pair",
            &lowat,
            &label("0%", "tls"),
            "--metric",
            "ttlb",
            "--workload",
            "light",
        ]),
    )
    .unwrap();
    // Paired by repetition: exactly half, the repetition effect cancels.
    assert!(t.contains("| **0.50** [0.50, 0.50] |"), "{t}");
    // A summary tells the two runs' tls apart by the parameter only one
    // has.
    let s = table_of(
        &a,
        &args(&[
            "--summary",
            "--metric",
            "ttlb",
            "--workload",
            "light",
            "--where",
            "transport=tls",
        ]),
    )
    .unwrap();
    assert!(s.contains("| 0% | - | light |"), "{s}");
    assert!(s.contains("| 0% | 16KiB | light |"), "{s}");
    assert!(
        t.contains("Runs `run-1` (scenario `synthetic`, 6 of 8 planned repetitions) at 0123456789ab and `run-2` (scenario `synthetic-lowat`, 6 of 8 planned repetitions) at 0123456789ab, read together"),
        "{t}"
    );
}
