//! `onionlab lab run` end to end on the bundled `quick` scenario: real
//! relays, client, server and agent processes in emulated-network hosts;
//! and the namespace engine's tear-down when a run ends early.
//! Needs root (network namespaces, TUN): without it the test says SKIPPED,
//! unless ONIONLAB_REQUIRE_NETNS=1 (CI as root), where that is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use onionlab_lab::agent::TransferRecord;
use onionlab_lab::engine::{Engine, Namespaces, RunHooks};
use onionlab_lab::plan::Plan;
use onionlab_lab::Scenario;

/// Whether namespaces are available; without them the test is skipped,
/// unless ONIONLAB_REQUIRE_NETNS=1, where that is a failure.
fn netns_available() -> bool {
    match onionlab_netem::check_privileges() {
        Ok(()) => true,
        Err(e) if std::env::var("ONIONLAB_REQUIRE_NETNS").as_deref() == Ok("1") => {
            panic!("ONIONLAB_REQUIRE_NETNS=1 but namespaces are unavailable: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: needs root, TUN and network namespaces: {e}");
            false
        }
    }
}

/// The network namespaces whose names start with `prefix`, with their
/// inodes.
fn namespaces(prefix: &str) -> Vec<(String, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().into_string().ok()?;
                let inode = std::fs::metadata(e.path()).ok()?.ino();
                name.starts_with(prefix).then_some((name, inode))
            })
            .collect()
        })
        .unwrap_or_default()
}

/// The command lines of the processes in the network namespaces `inodes`.
fn processes_in(inodes: &[u64]) -> Vec<String> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| {
            let e = e.ok()?;
            e.file_name().to_str()?.parse::<u32>().ok()?;
            let ns = std::fs::read_link(e.path().join("ns/net")).ok()?;
            let inode: u64 = ns
                .to_str()?
                .strip_prefix("net:[")?
                .strip_suffix(']')?
                .parse()
                .ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            inodes.contains(&inode).then_some(cmd)
        })
        .collect()
}

/// Whether C tor is installed; without it the test is skipped, unless
/// ONIONLAB_REQUIRE_NETNS=1 (CI as root, where scripts/test.sh installs
/// it), where that is a failure.
fn ctor_available() -> bool {
    match onionlab_lab::ctor::tor_version() {
        Ok(_) => true,
        Err(e) if std::env::var("ONIONLAB_REQUIRE_NETNS").as_deref() == Ok("1") => {
            panic!("ONIONLAB_REQUIRE_NETNS=1 but C tor is unavailable: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            false
        }
    }
}

/// `onionlab lab run scenarios/NAME.toml --reps 1` into a fresh directory;
/// returns the directory and the transfer records.
fn run_scenario(name: &str) -> (PathBuf, Vec<TransferRecord>, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out: PathBuf =
        std::env::temp_dir().join(format!("onionlab-lab-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(env!("CARGO_BIN_EXE_onionlab"))
        .args(["--log", "warn", "lab", "run"])
        .arg(root.join(format!("scenarios/{name}.toml")))
        .args(["--reps", "1", "--out"])
        .arg(&out)
        .status()
        .expect("run onionlab lab run");
    assert!(status.success(), "lab run {name} failed");
    let text = std::fs::read_to_string(out.join("records.jsonl")).expect("records.jsonl");
    let records = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a record"))
        .collect();
    (out, records, text)
}

#[test]
fn the_quick_scenario_runs_end_to_end() {
    if !netns_available() {
        return;
    }
    let (out, records, text) = run_scenario("quick");
    // Two variants (schedulers) x 3 downloads.
    assert_eq!(records.len(), 6, "{text}");
    for r in &records {
        assert_eq!(r.error, None, "{r:?}");
        assert!(!r.timed_out);
        let (ttfb, ttlb) = (r.ttfb_ms.expect("ttfb"), r.ttlb_ms.expect("ttlb"));
        // Three 20 ms hops each way: no first byte before 120 ms of
        // propagation (request out, data back).
        assert!(ttfb >= 119.0, "TTFB {ttfb} ms is faster than light");
        assert!(ttlb >= ttfb);
    }
    let variants: std::collections::BTreeSet<&str> =
        records.iter().map(|r| r.variant.as_str()).collect();
    assert_eq!(
        variants.into_iter().collect::<Vec<_>>(),
        ["scheduler=ewma", "scheduler=round-robin"]
    );
    for f in [
        "records.csv",
        "repetitions.jsonl",
        "scenario.toml",
        "topology.toml",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let reps = std::fs::read_to_string(out.join("repetitions.jsonl")).expect("repetitions");
    assert_eq!(reps.lines().count(), 2);
    assert!(reps.contains("\"circuit_build_ms\":["), "{reps}");
    // Every host ran TCP Cubic (the match of QUIC's default Cubic, not the
    // kernel's default) without cached path metrics, and says so.
    for line in reps.lines() {
        let r: onionlab_lab::run::RepetitionRecord = serde_json::from_str(line).expect("record");
        assert_eq!(r.tcp.len(), 5, "{line}");
        for h in &r.tcp {
            assert_eq!(
                (h.congestion.as_str(), h.no_metrics_save.as_str()),
                ("cubic", "1")
            );
        }
    }
    let env: onionlab_lab::run::Environment =
        serde_json::from_str(&std::fs::read_to_string(out.join("environment.json")).expect("env"))
            .expect("environment.json");
    assert!(!env.kernel.is_empty());
    assert_eq!(
        env.host_sysctls
            .get("net.ipv4.tcp_no_metrics_save")
            .map(String::as_str),
        Some("1")
    );
    assert!(env
        .machine_sysctls
        .contains_key("net.ipv4.tcp_available_congestion_control"));
    assert_eq!(env.wire.link_mtu, 1500);
    assert_eq!(env.wire.tcp_mss, 1460);
    // tls only: the kernel decides what goes on the wire, no endpoint
    // adds an account of its own.
    assert!(env.wire.endpoints.is_empty(), "{:?}", env.wire.endpoints);
    // The report: tables and figures.
    let md = std::fs::read_to_string(out.join("report/report.md")).expect("report.md");
    for needle in [
        "time to first byte",
        "time to last byte",
        "median ratio vs",
        "Mann",
        "scheduler=round-robin",
    ] {
        assert!(md.contains(needle), "report.md lacks {needle:?}");
    }
    for f in [
        "report.html",
        "ttfb_ms_cdf.png",
        "ttfb_ms_cdf.svg",
        "ttlb_ms_box.png",
        "circuit_build_ms_cdf.svg",
    ] {
        let p = out.join("report").join(f);
        assert!(
            p.metadata().is_ok_and(|m| m.len() > 100),
            "{f} missing or empty"
        );
    }
    assert!(md.contains("**commit**"), "report.md names no commit");

    // Stored as the repository keeps runs, then unpacked elsewhere, as a
    // later session on another machine would. A test build may come from a
    // tree with uncommitted changes, which `lab store` refuses: the first
    // part's segment is made to name a clean commit for this test.
    let seg_path = out.join("segments.jsonl");
    let seg = std::fs::read_to_string(&seg_path).expect("segments");
    std::fs::write(&seg_path, seg.replace("-dirty\"", "\"")).expect("segments");
    let stored = out.with_file_name(format!(
        "{}-stored",
        out.file_name().expect("name").to_string_lossy()
    ));
    let unpacked = out.with_file_name(format!(
        "{}-unpacked",
        out.file_name().expect("name").to_string_lossy()
    ));
    for (what, args) in [
        ("store", [out.as_os_str(), stored.as_os_str()]),
        ("unpack", [stored.as_os_str(), unpacked.as_os_str()]),
    ] {
        let status = Command::new(env!("CARGO_BIN_EXE_onionlab"))
            .args(["lab", what])
            .args(args)
            .status()
            .expect("run onionlab lab store/unpack");
        assert!(status.success(), "lab {what} failed");
    }
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&stored);
    let out = unpacked;

    // Continue the unpacked run to three repetitions, two runs at once:
    // only the second and third run, each with its own seed, every run is
    // recorded once with the jobs it ran beside, and the run directory
    // says it came in two segments.
    let status = Command::new(env!("CARGO_BIN_EXE_onionlab"))
        .args(["--log", "warn", "lab", "run"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/quick.toml"))
        .args(["--reps", "3", "--jobs", "2", "--resume", "--out"])
        .arg(&out)
        .status()
        .expect("run onionlab lab run --resume");
    assert!(status.success(), "lab run --resume failed");
    let reps = std::fs::read_to_string(out.join("repetitions.jsonl")).expect("repetitions");
    let reps: Vec<onionlab_lab::run::RepetitionRecord> = reps
        .lines()
        .map(|l| serde_json::from_str(l).expect("record"))
        .collect();
    let mut runs: Vec<(u32, &str)> = reps
        .iter()
        .map(|r| (r.repetition, r.variant.as_str()))
        .collect();
    runs.sort();
    assert_eq!(
        runs,
        [
            (0, "scheduler=ewma"),
            (0, "scheduler=round-robin"),
            (1, "scheduler=ewma"),
            (1, "scheduler=round-robin"),
            (2, "scheduler=ewma"),
            (2, "scheduler=round-robin")
        ]
    );
    let seeds: std::collections::BTreeSet<(u32, u64)> =
        reps.iter().map(|r| (r.repetition, r.seed)).collect();
    assert_eq!(seeds.len(), 3, "one seed per repetition: {seeds:?}");
    let distinct: std::collections::BTreeSet<u64> = seeds.iter().map(|s| s.1).collect();
    assert_eq!(distinct.len(), 3, "each repetition its own seed: {seeds:?}");
    let jobs: Vec<usize> = reps.iter().map(|r| r.jobs).collect();
    assert_eq!(jobs, [1, 1, 2, 2, 2, 2]);
    let records = std::fs::read_to_string(out.join("records.jsonl")).expect("records");
    assert_eq!(records.lines().count(), 18, "{records}");
    let segments = onionlab_lab::journal::segments(&out);
    assert_eq!(segments.len(), 2, "{segments:?}");
    assert!(segments[1].resumed && segments[1].runs_done_before == 2);
    let md = std::fs::read_to_string(out.join("report/report.md")).expect("report.md");
    assert!(md.contains("continued with --resume"), "{md}");
    assert!(md.contains("up to 2 at once"), "{md}");
    let _ = std::fs::remove_dir_all(&out);
}

/// `scenarios/multipath-quick.toml`: a download of 1 MiB and one of
/// 320 KiB through 1, 2 and 3 pinned legs over the emulated network, over
/// tls and quic. Every transfer completes with every byte checked (the
/// agents compare the payload pattern), and the clients built sets of the
/// variant's legs.
#[test]
fn multipath_sets_of_two_and_three_legs_run_over_the_emulated_network() {
    if !netns_available() {
        return;
    }
    let (out, records, text) = run_scenario("multipath-quick");
    assert_eq!(records.len(), 12, "{text}");
    for r in &records {
        assert_eq!(r.error, None, "{r:?}");
        assert!(!r.timed_out, "{r:?}");
    }
    for legs in 1..=3 {
        for transport in ["tls", "quic"] {
            let variant = format!("leg_scheduler=round-robin legs={legs} transport={transport}");
            let done = records.iter().filter(|r| r.variant == variant).count();
            assert_eq!(done, 2, "{variant}: {text}");
        }
    }
    // The client logs each set it built: its legs' paths joined by " + ".
    let mut sets = Vec::new();
    for entry in walk(&out) {
        if entry.file_name().is_some_and(|n| n == "client-op.log") {
            let log = std::fs::read_to_string(&entry).unwrap_or_default();
            for line in log.lines().filter(|l| l.contains("circuit built")) {
                sets.push(line.matches(" + ").count() + 1);
            }
        }
    }
    sets.sort();
    // Per run, one set for each of the two workloads (their streams are
    // isolated from each other), in 2 transports.
    assert_eq!(
        sets,
        [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3],
        "sets built: {sets:?}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// `scenarios/datagram-kernel-quick.toml`: mUDP-OR with the kernels' TCP
/// through TUN devices (`end_to_end = "kernel"`, docs/datagram.md section
/// 4.1) at 0% and 1% loss beside the user-space TCP at 0%, over 1 and 3
/// pinned legs. Every transfer (1 MiB each way) completes with every byte
/// checked, and in the kernel variants the client's and the exit's
/// kernels carried both connections through their TUN devices.
#[test]
fn datagram_sets_carry_the_kernels_tcp_through_tun_devices() {
    if !netns_available() {
        return;
    }
    let (out, records, text) = run_scenario("datagram-kernel-quick");
    assert_eq!(records.len(), 12, "{text}");
    for r in &records {
        assert_eq!(r.error, None, "{r:?}");
        assert!(!r.timed_out, "{r:?}");
    }
    let kernel_runs = records
        .iter()
        .filter(|r| r.variant.contains("end_to_end=kernel"))
        .count();
    assert_eq!(kernel_runs, 8, "{text}");
    // What each node's kernel sets did, from its last log line.
    let stats = |log: &Path, stopped: &str| -> Option<String> {
        let text = std::fs::read_to_string(log).ok()?;
        let line = text.lines().rev().find(|l| l.contains(stopped))?;
        Some(line.split("kernel=").nth(1)?.to_string())
    };
    let mut kernel_dirs = 0;
    for entry in walk(&out) {
        if entry.file_name().is_none_or(|n| n != "client-op.log") {
            continue;
        }
        let dir = entry.parent().expect("a run directory");
        let client = stats(&entry, "datagram client stopped").expect("client stats");
        let exit = stats(&dir.join("exit.log"), "datagram relay stopped").expect("exit stats");
        if client.starts_with("none") {
            assert!(exit.starts_with("none"), "a user-space run's exit: {exit}");
            continue;
        }
        kernel_dirs += 1;
        for s in [&client, &exit] {
            assert!(s.starts_with("connections=2 "), "{}: {s}", dir.display());
            // At least a megabyte each way in 487-byte segments.
            let read: u64 = s
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix("tun_read="))
                .and_then(|v| v.parse().ok())
                .expect("tun_read");
            assert!(read > 2_000, "{}: {s}", dir.display());
        }
    }
    assert_eq!(kernel_dirs, 4, "the kernel variants' runs");
    let _ = std::fs::remove_dir_all(&out);
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// `scenarios/quic-fallback.toml`: transport `auto` everywhere and all UDP
/// between guard and middle dropped by the emulated network. Every
/// transfer completes, and the guard says it fell back to TLS.
#[test]
fn quic_falls_back_to_tls_when_udp_is_blocked() {
    if !netns_available() {
        return;
    }
    let (out, records, text) = run_scenario("quic-fallback");
    // One variant (auto, UDP blocked guard-middle) x 3 downloads.
    assert_eq!(records.len(), 3, "{text}");
    for r in &records {
        assert_eq!(r.error, None, "a failed transfer: {r:?}");
        assert!(!r.timed_out, "a timed-out transfer: {r:?}");
        assert!(r.ttlb_ms.is_some(), "{r:?}");
    }
    // Relays run at `info`; each repetition's logs are in raw/repNNN-vNN/,
    // named after the relay's host.
    let mut guard_logs = Vec::new();
    for rep in std::fs::read_dir(out.join("raw")).expect("raw/") {
        let log = rep.expect("raw entry").path().join("guard.log");
        if log.exists() {
            guard_logs.push(std::fs::read_to_string(&log).expect("guard.log"));
        }
    }
    assert_eq!(guard_logs.len(), 1, "one repetition, one guard log");
    for log in &guard_logs {
        assert!(
            log.contains("falling back to TLS"),
            "the guard did not fall back to TLS:\n{log}"
        );
    }
    // QUIC's first packets are as large as the links allow, like TCP's,
    // and environment.json says so.
    let env: onionlab_lab::run::Environment =
        serde_json::from_str(&std::fs::read_to_string(out.join("environment.json")).expect("env"))
            .expect("environment.json");
    assert_eq!(env.wire.link_mtu, 1500);
    assert_eq!(env.wire.endpoints["quic"]["initial_mtu"], "1472");
    assert_eq!(env.wire.endpoints["quic"]["initial_window_bytes"], "14720");
    let _ = std::fs::remove_dir_all(&out);
}

/// A scenario name that is neither a file nor a bundled scenario (here:
/// run outside the repository root) says where it looked and what to do.
#[test]
fn an_unknown_scenario_name_says_where_bundled_ones_are() {
    let out = Command::new(env!("CARGO_BIN_EXE_onionlab"))
        .args(["lab", "check", "seed002-exp3"])
        .current_dir(std::env::temp_dir())
        .output()
        .expect("onionlab runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("scenarios/seed002-exp3.toml"), "{stderr}");
    assert!(stderr.contains("lab list"), "{stderr}");
}

/// C tor as a variant (scenarios/ctor-quick.toml): a private tor network
/// in the same hosts carries the same download as onionlab's tls, both
/// are recorded alike, and the report compares them.
#[test]
fn c_tor_runs_beside_onionlab_in_the_lab() {
    if !netns_available() || !ctor_available() {
        return;
    }
    let (out, records, text) = run_scenario("ctor-quick");
    assert_eq!(records.len(), 2, "{text}");
    for r in &records {
        assert_eq!(r.error, None, "{r:?}");
        assert_eq!(r.size, 1024 * 1024);
        // Three 20 ms hops each way.
        assert!(r.ttfb_ms.expect("ttfb") >= 119.0, "{r:?}");
    }
    let variants: std::collections::BTreeSet<&str> =
        records.iter().map(|r| r.variant.as_str()).collect();
    assert_eq!(
        variants.into_iter().collect::<Vec<_>>(),
        ["transport=ctor", "transport=tls"]
    );
    let reps = std::fs::read_to_string(out.join("repetitions.jsonl")).expect("repetitions");
    for line in reps.lines() {
        let r: onionlab_lab::run::RepetitionRecord = serde_json::from_str(line).expect("record");
        // The same measurements for both: the three relays' CPU, the
        // links' bytes from the workload's start (the download, not C
        // tor's bootstrap), every host's TCP Cubic.
        let names: Vec<&str> = r.relay_cpu_s.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["guard", "middle", "exit"], "{line}");
        for (n, cpu) in &r.relay_cpu_s {
            assert!(cpu.is_finite() && *cpu >= 0.0, "{n}: {cpu} CPU seconds");
        }
        let to_client: u64 = r
            .links
            .iter()
            .filter(|l| l.0 == "guard" && l.1 == "client")
            .map(|l| l.2)
            .sum();
        assert!(
            (1_048_576..1_500_000).contains(&to_client),
            "{} bytes to the client: {line}",
            to_client
        );
        for h in &r.tcp {
            assert_eq!(h.congestion, "cubic", "{line}");
        }
        if r.variant == "transport=ctor" {
            // C tor sets nothing per socket: the namespaces' default is it.
            assert!(r.tcp.iter().all(|h| h.kernel_default == "cubic"), "{line}");
        }
        // Circuit build times: onionlab's client builds its circuit when
        // the download asks, so it logs one. C tor's come from its control
        // port during the workload, and C tor may serve so short a
        // workload from a circuit it built ahead of time (it did in CI):
        // none is required, but the watch must have seen the download's
        // stream. Three 20 ms hops need at least 120 ms.
        if r.variant == "transport=ctor" {
            let seen: Vec<(&str, &str, u64)> = r
                .ctor_streams
                .iter()
                .map(|s| (s.workload.as_str(), s.purpose.as_str(), s.streams))
                .collect();
            assert_eq!(seen, [("bulk", "GENERAL", 1)], "{line}");
            assert!(r.client_paths.is_empty(), "{line}");
        } else {
            assert!(!r.circuit_build_ms.is_empty(), "{line}");
            // onionlab's client: its circuit, guard to exit.
            let paths: Vec<(&str, Vec<&str>)> = r
                .client_paths
                .iter()
                .map(|(c, p)| (c.as_str(), p.iter().map(String::as_str).collect()))
                .collect();
            assert_eq!(paths, [("op", vec!["guard", "middle", "exit"])], "{line}");
        }
        assert!(r.circuit_build_ms.iter().all(|ms| *ms >= 119.0), "{line}");
    }
    let env: onionlab_lab::run::Environment =
        serde_json::from_str(&std::fs::read_to_string(out.join("environment.json")).expect("env"))
            .expect("environment.json");
    assert!(
        env.ctor_version
            .as_deref()
            .is_some_and(|v| v.starts_with("Tor version 0.4")),
        "{:?}",
        env.ctor_version
    );
    let md = std::fs::read_to_string(out.join("report/report.md")).expect("report.md");
    assert!(
        md.contains("ctor / tls"),
        "the report compares C tor with tls"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// C tor's conflux as a variant (scenarios/ctor-conflux-quick.toml): with
/// two pinned legs, Vegas and lowrtt, the C tor client waits for a linked
/// set before the workload, and its downloads come over both guards, as
/// onionlab's do; the third guard, not pinned for two legs, carries
/// nothing.
/// The text of the file under run directory `out` whose path ends with
/// `suffix`.
fn read_under(out: &Path, suffix: &str) -> String {
    let path = walk(out)
        .into_iter()
        .find(|p| p.ends_with(suffix))
        .unwrap_or_else(|| panic!("no {suffix} under {}", out.display()));
    std::fs::read_to_string(path).expect(suffix)
}

#[test]
fn c_tor_runs_conflux_over_both_pinned_guards() {
    if !netns_available() || !ctor_available() {
        return;
    }
    let (out, records, text) = run_scenario("ctor-conflux-quick");
    assert_eq!(records.len(), 4, "{text}");
    for r in &records {
        assert_eq!(r.error, None, "{r:?}");
    }
    let reps = std::fs::read_to_string(out.join("repetitions.jsonl")).expect("repetitions");
    let mut implementations = Vec::new();
    for line in reps.lines() {
        let r: onionlab_lab::run::RepetitionRecord = serde_json::from_str(line).expect("record");
        let to_op = |guard: &str| -> u64 {
            r.links
                .iter()
                .filter(|l| l.0 == guard && l.1 == "op")
                .map(|l| l.2)
                .sum()
        };
        // 1 MiB + 320 KiB in all: each leg carries a good share.
        for guard in ["g1", "g2"] {
            assert!(
                to_op(guard) > 200_000,
                "{guard}: {} bytes: {line}",
                to_op(guard)
            );
        }
        assert_eq!(to_op("g3"), 0, "{line}");
        if r.variant.ends_with("=ctor") {
            // Each workload's stream ran over a linked set (the lab
            // waited for one per workload besides the test download's).
            // No circuit need be built during so short a workload, so
            // build times are not checked here (control.rs tests them).
            let mut seen: Vec<(&str, &str, u64)> = r
                .ctor_streams
                .iter()
                .map(|s| (s.workload.as_str(), s.purpose.as_str(), s.streams))
                .collect();
            seen.sort();
            assert_eq!(
                seen,
                [("bulk", "CONFLUX_LINKED", 1), ("web", "CONFLUX_LINKED", 1)],
                "{line}"
            );
            assert_eq!(r.conflux_fallback_streams, 0, "{line}");
        }
        implementations.push(r.variant.rsplit('=').next().unwrap_or("").to_string());
    }
    implementations.sort();
    assert_eq!(implementations, ["ctor", "tls"]);
    let torrc = read_under(&out, "ctor/client-op/torrc");
    assert!(
        torrc.contains("ConfluxEnabled 1\nConfluxClientUX throughput\n"),
        "{torrc}"
    );
    let auth = read_under(&out, "ctor/auth/torrc");
    assert!(
        auth.contains("cfx_num_legs_set=2 cfx_max_prebuilt_set=3"),
        "{auth}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// Ctrl-C twice during a run: the run under way ends within seconds,
/// every process it started is gone, its namespaces are removed, nothing
/// of it is recorded, and `lab run` fails saying so.
#[test]
fn a_second_signal_ends_the_run_under_way_and_leaves_nothing_behind() {
    if netns_available() {
        second_signal_ends_the_run(libc::SIGINT);
    }
}

/// The same with SIGTERM (a service manager's stop) as the second signal.
#[test]
fn a_sigterm_after_ctrl_c_ends_the_run_under_way_too() {
    if netns_available() {
        second_signal_ends_the_run(libc::SIGTERM);
    }
}

/// Sends `lab run` SIGINT, then `second`, while its workload runs, and
/// checks that the run under way ends and leaves nothing behind.
fn second_signal_ends_the_run(second: libc::c_int) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::temp_dir().join(format!(
        "onionlab-lab-abort-{}-{second}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    // The quick scenario with downloads enough for minutes.
    let quick = std::fs::read_to_string(root.join("scenarios/quick.toml")).expect("quick.toml");
    assert!(quick.contains("count = 3\n") && quick.contains("\"topologies/"));
    let topologies = root.join("scenarios/topologies");
    let scenario = quick
        .replace("count = 3\n", "count = 1000\n")
        .replace("\"topologies/", &format!("\"{}/", topologies.display()));
    let scenario_path = dir.join("abort.toml");
    std::fs::write(&scenario_path, scenario).expect("scenario");
    let out = dir.join("out");
    let mut lab = Command::new(env!("CARGO_BIN_EXE_onionlab"))
        .args(["--log", "warn", "lab", "run"])
        .arg(&scenario_path)
        .args(["--reps", "1", "--out"])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start lab run");
    let pid = lab.id();
    // Under way: the workload agent has started (its spec is written just
    // before), and its thousand downloads take minutes.
    let agent = out.join("raw/rep000-v00/agent-op.json");
    let started = std::time::Instant::now();
    while !agent.exists() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(90),
            "no workload agent started within 90 s"
        );
        assert!(
            lab.try_wait().expect("lab run").is_none(),
            "lab run ended early"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::thread::sleep(std::time::Duration::from_secs(3));
    // The run's namespaces, by inode: every process it started is in one.
    let prefix = format!("olab-l{pid}-");
    let lab_namespaces = || namespaces(&prefix);
    let inodes: Vec<u64> = lab_namespaces().iter().map(|n| n.1).collect();
    assert!(!inodes.is_empty(), "no namespace named {prefix}*");
    let signal = |sig| {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid as libc::pid_t, sig) };
    };
    signal(libc::SIGINT);
    std::thread::sleep(std::time::Duration::from_millis(500));
    signal(second);
    let interrupted = std::time::Instant::now();
    let status = loop {
        if let Some(s) = lab.try_wait().expect("lab run") {
            break s;
        }
        if interrupted.elapsed() > std::time::Duration::from_secs(60) {
            let _ = lab.kill();
            panic!("lab run still going 60 s after the second SIGINT");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut lab.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert!(!status.success(), "an interrupted run exited 0: {stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let left = processes_in(&inodes);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    let namespaces = lab_namespaces();
    assert!(
        namespaces.is_empty(),
        "namespaces left behind: {namespaces:?}"
    );
    let journal = std::fs::read_to_string(out.join("repetitions.jsonl")).unwrap_or_default();
    assert_eq!(
        journal.lines().count(),
        0,
        "the ended run was recorded: {journal}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A panic in the lab while a workload runs (here in the run's hook, a
/// few seconds into the workload) unwinds through the engine: every
/// process the run started stops and its namespaces are removed.
#[test]
fn a_panic_mid_run_leaves_no_process_or_namespace_behind() {
    if !netns_available() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::temp_dir().join(format!("onionlab-engine-panic-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    // The quick scenario with downloads enough for minutes.
    let quick = std::fs::read_to_string(root.join("scenarios/quick.toml")).expect("quick.toml");
    assert!(quick.contains("count = 3\n") && quick.contains("\"topologies/"));
    let topologies = root.join("scenarios/topologies");
    let text = quick
        .replace("count = 3\n", "count = 1000\n")
        .replace("\"topologies/", &format!("\"{}/", topologies.display()));
    let s = Scenario::from_toml_str(&text, "panic.toml", &dir).expect("scenario");
    let plan = Plan::of(&s, &s.variants()[0], (0, 1), onionlab_config::unix_now()).expect("plan");
    let lab = format!("tp{}", std::process::id());
    let engine = Namespaces {
        bin: env!("CARGO_BIN_EXE_onionlab").into(),
        lab: lab.clone(),
    };
    let prefix = format!("olab-{lab}-");
    let seen = std::sync::Mutex::new(Vec::new());
    let agents_since = std::cell::Cell::new(None::<Instant>);
    let started = Instant::now();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let status = |_: &str| {};
        // Called while the agents run: panics 3 s into the workload, once
        // the run's namespaces are recorded.
        let interrupted = || {
            let since = agents_since.get().unwrap_or_else(|| {
                let now = Instant::now();
                agents_since.set(Some(now));
                now
            });
            if since.elapsed() > Duration::from_secs(3) {
                *seen.lock().expect("seen") = namespaces(&prefix);
                panic!("a test panic mid-run");
            }
            assert!(started.elapsed() < Duration::from_secs(120), "no workload");
            false
        };
        let hooks = RunHooks {
            status: &status,
            interrupted: &interrupted,
        };
        engine.run(&plan, &dir.join("rep"), &hooks)
    }));
    assert!(result.is_err(), "the run did not panic");
    let seen = seen.into_inner().expect("seen");
    assert!(
        !seen.is_empty(),
        "no namespace named {prefix}* while it ran"
    );
    let inodes: Vec<u64> = seen.iter().map(|n| n.1).collect();
    let left = processes_in(&inodes);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    let namespaces = namespaces(&prefix);
    assert!(
        namespaces.is_empty(),
        "namespaces left behind: {namespaces:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
