//! Scenario files: valid ones expand into the expected variants; broken
//! ones get an error naming the line and the problem.

use std::path::{Path, PathBuf};

use onionlab_lab::variant::Implementation;
use onionlab_lab::workload::parse_size;
use onionlab_lab::{Error, Scenario};

fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

const BASE: &str = r#"name = "t"
topology = "topologies/seed000-path.toml"
repetitions = 3

[[relay]]
host = "guard"
guard = true
[[relay]]
host = "middle"
[[relay]]
host = "exit"
exit = true

[[client]]
name = "op"
host = "client"
path = ["guard", "middle", "exit"]

[[server]]
name = "srv"
host = "server"

[[workload]]
kind = "download"
client = "op"
server = "srv"
size = "320KiB"
count = 2
"#;

fn parse(text: &str) -> Result<Scenario, Error> {
    Scenario::from_toml_str(text, "t.toml", &scenarios_dir())
}

/// The error for `text` must be at `line` and mention `needle`.
fn assert_error(text: &str, line: usize, needle: &str) {
    match parse(text) {
        Ok(_) => panic!("accepted a broken scenario (wanted {needle:?} at line {line})"),
        Err(Error::Scenario {
            line: l, message, ..
        }) => {
            assert_eq!(l, line, "wrong line for {needle:?}: {message}");
            assert!(
                message.contains(needle),
                "{message:?} does not mention {needle:?}"
            );
        }
        Err(other) => panic!("unexpected error kind: {other}"),
    }
}

#[test]
fn every_bundled_scenario_is_valid() {
    let mut n = 0;
    for entry in std::fs::read_dir(scenarios_dir()).expect("scenarios/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "toml") {
            let s =
                Scenario::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(!s.variants().is_empty());
            assert!(
                !s.description.is_empty(),
                "{} needs a description",
                path.display()
            );
            n += 1;
        }
    }
    assert!(n >= 3, "expected the bundled scenarios, found {n}");
}

#[test]
fn the_matrix_expands_into_every_combination() {
    let text = format!(
        "{BASE}\n[matrix]\nscheduler = [\"ewma\", \"round-robin\"]\nlatency = [\"20ms\", \"40ms\"]\nsize = [\"1MiB\"]\n\"loss:guard-middle\" = [\"0%\", \"1%\"]\n"
    );
    let s = parse(&text).expect("valid");
    let v = s.variants();
    assert_eq!(v.len(), 8);
    let labels: Vec<&str> = v.iter().map(|v| v.label.as_str()).collect();
    assert!(
        labels.contains(&"latency=40ms loss:guard-middle=1% scheduler=round-robin size=1MiB"),
        "{labels:?}"
    );
    let x = v
        .iter()
        .find(|v| v.label == "latency=40ms loss:guard-middle=1% scheduler=round-robin size=1MiB")
        .expect("variant");
    assert_eq!(x.scheduler, "round-robin");
    assert_eq!(x.workloads[0].size, 1 << 20);
    let t = &x.topology;
    let (g, m, c) = (
        t.host_id("guard").expect("guard"),
        t.host_id("middle").expect("middle"),
        t.host_id("client").expect("client"),
    );
    assert_eq!(t.path(g, m).latency.as_millis(), 40);
    assert_eq!(t.path(c, g).latency.as_millis(), 40);
    assert!((t.path(m, g).loss.mean_loss() - 0.01).abs() < 1e-9);
    assert_eq!(t.path(c, g).loss.mean_loss(), 0.0);
}

#[test]
fn no_matrix_is_one_default_variant() {
    let s = parse(BASE).expect("valid");
    let v = s.variants();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].label, "default");
    assert_eq!(v[0].transport, "tls");
    assert_eq!(s.repetitions, 3);
}

#[test]
fn broken_files_name_the_line_and_the_problem() {
    assert_error(
        &BASE.replace("host = \"middle\"", "host = \"midle\""),
        9,
        "unknown host \"midle\"",
    );
    assert_error(
        &BASE.replace("kind = \"download\"", "kind = \"downlaod\""),
        24,
        "unknown workload kind",
    );
    assert_error(
        &BASE.replace("size = \"320KiB\"", "size = \"320 parsecs\""),
        27,
        "unknown unit",
    );
    assert_error(
        &BASE.replace("client = \"op\"\nserver", "client = \"nobody\"\nserver"),
        25,
        "unknown client",
    );
    assert_error(
        &BASE.replace(
            "path = [\"guard\", \"middle\", \"exit\"]",
            "path = [\"guard\", \"server\"]",
        ),
        17,
        "not a relay",
    );
    assert_error(
        &BASE.replace("repetitions = 3", "repetitions = 0"),
        3,
        "at least 1",
    );
    assert_error(
        &BASE.replace("repetitions = 3", "repetitions = 3\ncolour = \"blue\""),
        4,
        "unknown field",
    );
    assert_error(
        &format!("{BASE}\n[matrix]\ntransport = [\"carrier-pigeon\"]\n"),
        31,
        "unknown transport",
    );
    assert_error(
        &format!("{BASE}\n[matrix]\nscheduler = []\n"),
        31,
        "no values",
    );
    assert_error(
        &format!("{BASE}\n[matrix]\nlatency = [\"fast\"]\n"),
        31,
        "fast",
    );
    assert_error(
        &format!("{BASE}\n[matrix]\n\"loss:guard-mars\" = [\"1%\"]\n"),
        31,
        "unknown host \"mars\"",
    );
    assert_error(
        &format!("{BASE}\n[matrix]\nscheduler = [\"ewma\", \"ewma\"]\n"),
        31,
        "lists \"ewma\" twice",
    );
    assert_error(
        &format!("{BASE}\n[matrix]\nflavour = [\"vanilla\"]\n"),
        31,
        "unknown matrix parameter",
    );
    assert_error("name = \"t\"\ntopology = [", 2, "");
}

#[test]
fn a_missing_topology_is_a_clear_error() {
    let text = BASE.replace("topologies/seed000-path.toml", "nowhere.toml");
    assert_error(&text, 2, "No such file");
}

#[test]
fn too_few_relays_or_no_exit_is_refused() {
    let no_exit = BASE.replace("exit = true", "exit = false");
    assert!(
        matches!(parse(&no_exit), Err(Error::Scenario { message, .. }) if message.contains("exit"))
    );
}

#[test]
fn sizes() {
    assert_eq!(parse_size("320KiB"), Ok(327_680));
    assert_eq!(parse_size("5 MiB"), Ok(5 << 20));
    assert_eq!(parse_size("1MB"), Ok(1_000_000));
    assert_eq!(parse_size("1000"), Ok(1000));
    assert!(parse_size("0").is_err());
    assert!(parse_size("-1KiB").is_err());
    assert!(parse_size("1 parsec").is_err());
}

#[test]
fn probe_workloads_take_probes_and_interval_and_keep_their_size() {
    let text = BASE.replace(
        "[[workload]]\nkind = \"download\"",
        "[[workload]]\nname = \"p\"\nkind = \"probe\"\nclient = \"op\"\nserver = \"srv\"\nprobes = 50\ninterval = \"20ms\"\n\n[[workload]]\nkind = \"download\"",
    );
    let text = format!("{text}\n[matrix]\nsize = [\"1MiB\"]\n");
    let s = parse(&text).expect("valid");
    let v = &s.variants()[0];
    let p = v
        .workloads
        .iter()
        .find(|w| w.name == "p")
        .expect("probe workload");
    assert_eq!(p.probes, 50);
    assert_eq!(p.probe_interval.as_millis(), 20);
    assert_eq!(
        p.size,
        50 * 16,
        "a size matrix must not change probe streams"
    );
    let d = v
        .workloads
        .iter()
        .find(|w| w.name == "op")
        .expect("download");
    assert_eq!(d.size, 1 << 20);
    // `probes` on a download is a mistake worth reporting.
    let bad = BASE.replace("count = 2", "count = 2\nprobes = 5");
    assert_error(&bad, 29, "belong to kind");
}

#[test]
fn traces_are_read_and_checked() {
    use onionlab_lab::traffic::read_trace;
    use std::time::Duration;
    let t = read_trace(
        "# comment\ntime_ms,bytes\n0,100\n12.5,2000\n12.5,0\n",
        "t.csv",
    )
    .expect("valid");
    assert_eq!(
        t,
        vec![
            (Duration::ZERO, 100),
            (Duration::from_micros(12_500), 2000),
            (Duration::from_micros(12_500), 0)
        ]
    );
    for (bad, needle) in [
        ("0,1\n5,1\n3,1\n", "t.csv:3: times go backwards"),
        ("0,1\nx,1\n", "t.csv:2: bad time"),
        ("0,99999999\n", "larger than 1 MiB"),
        ("0;1\n", "expected time_ms,bytes"),
        ("# nothing\n", "no entries"),
        ("-5,1\n", "time must be"),
    ] {
        let e = read_trace(bad, "t.csv").expect_err(bad);
        assert!(e.contains(needle), "{e:?} lacks {needle:?}");
    }
}

#[test]
fn trace_workloads_need_a_readable_trace() {
    let with = |line: &str| {
        BASE.replace(
            "[[workload]]\nkind = \"download\"",
            &format!("[[workload]]\nname = \"t\"\nkind = \"trace\"\nclient = \"op\"\nserver = \"srv\"\n{line}\n\n[[workload]]\nkind = \"download\""),
        )
    };
    let s = parse(&with("trace = \"traces/interactive.csv\"")).expect("valid");
    let t = s
        .workloads
        .iter()
        .find(|w| w.name == "t")
        .expect("trace workload");
    assert!(t.trace.len() > 50);
    assert_eq!(
        t.size,
        t.trace.iter().map(|(_, b)| u64::from(*b)).sum::<u64>()
    );
    assert_error(
        &with("trace = \"traces/missing.csv\""),
        28,
        "cannot read trace",
    );
    assert_error(&with(""), 25, "needs `trace");
}

#[test]
fn devices_and_directories_are_not_read_as_files() {
    assert_error(
        &BASE.replace("topologies/seed000-path.toml", "/dev/zero"),
        2,
        "not a regular file",
    );
    assert_error(
        &BASE.replace("topologies/seed000-path.toml", "topologies"),
        2,
        "not a regular file",
    );
}

#[test]
fn transport_congestion_and_block_parameters() {
    let text = format!(
        "{BASE}\n[matrix]\ntransport = [\"tls\", \"quic\", \"quic-conn-per-circuit\", \"auto\"]\ncongestion = [\"cubic\", \"newreno\", \"bbr\"]\n\"block:guard-middle\" = [\"none\", \"udp\"]\n"
    );
    let s = parse(&text).expect("valid");
    let v = s.variants();
    assert_eq!(v.len(), 4 * 3 * 2);
    let x = v
        .iter()
        .find(|v| v.label == "block:guard-middle=udp congestion=bbr transport=quic")
        .expect("variant");
    assert_eq!(x.transport, "quic");
    assert_eq!(x.congestion, "bbr");
    let t = &x.topology;
    let (g, m, e) = (
        t.host_id("guard").expect("guard"),
        t.host_id("middle").expect("middle"),
        t.host_id("exit").expect("exit"),
    );
    assert!(t.path(g, m).block.udp && t.path(m, g).block.udp);
    assert!(!t.path(g, m).block.tcp);
    assert!(!t.path(m, e).block.udp, "other pairs pass UDP");
    let none = v
        .iter()
        .find(|v| v.label == "block:guard-middle=none congestion=cubic transport=auto")
        .expect("variant");
    assert!(none.topology.path(g, m).block.is_none());

    // Defaults: tls, cubic, nothing blocked.
    let d = &parse(BASE).expect("valid").variants()[0];
    assert_eq!(
        (d.transport.name(), d.congestion.as_str()),
        ("tls", "cubic")
    );
    assert!(d.topology.path(g, m).block.is_none());

    // `block` without a pair blocks every path.
    let s = parse(&format!("{BASE}\n[matrix]\nblock = [\"udp\"]\n")).expect("valid");
    let t = &s.variants()[0].topology;
    assert!(t.path(g, m).block.udp && t.path(m, e).block.udp);
}

#[test]
fn bad_transport_congestion_and_block_values() {
    assert_error(
        &format!("{BASE}\n[matrix]\ntransport = [\"tls\", \"udp\"]\n"),
        31,
        "unknown transport `udp`: expected one of `auto`, `tls`, `quic`, `quic-conn-per-circuit`",
    );
    assert_error(
        &format!("{BASE}\n[matrix]\ncongestion = [\"reno\"]\n"),
        31,
        "unknown congestion control \"reno\" (cubic, newreno, bbr)",
    );
    assert_error(
        &format!("{BASE}\n[matrix]\n\"block:guard-middle\" = [\"none\", \"sctp\"]\n"),
        31,
        "expected udp, tcp, icmp or none",
    );
    assert_error(
        &format!("{BASE}\n[matrix]\n\"block:guard-pluto\" = [\"udp\"]\n"),
        31,
        "unknown host \"pluto\"",
    );
    assert_error(
        &format!("{BASE}\n[matrix]\n\"congestion:guard-middle\" = [\"bbr\"]\n"),
        31,
        "congestion takes no hosts or pairs",
    );
}

#[test]
fn kernel_tcp_settings_are_matrix_parameters() {
    let s = parse(&format!(
        "{BASE}\n[matrix]\nslow_start_after_idle = [\"on\", \"off\"]\n"
    ))
    .expect("valid");
    let got: Vec<(String, Option<bool>)> = s
        .variants()
        .iter()
        .map(|v| (v.label.clone(), v.kernel_tcp.slow_start_after_idle))
        .collect();
    assert_eq!(
        got,
        [
            ("slow_start_after_idle=on".to_string(), Some(true)),
            ("slow_start_after_idle=off".to_string(), Some(false)),
        ]
    );
    // Default: the kernel's, left alone.
    assert_eq!(
        parse(BASE).expect("valid").variants()[0].kernel_tcp,
        Default::default()
    );
    let s = parse(&format!(
        "{BASE}\n[matrix]\ntcp_notsent_lowat = [\"kernel\", \"16KiB\"]\n"
    ))
    .expect("valid");
    let got: Vec<Option<u64>> = s
        .variants()
        .iter()
        .map(|v| v.kernel_tcp.notsent_lowat)
        .collect();
    assert_eq!(got, [None, Some(16384)]);
    assert_error(
        &format!("{BASE}\n[matrix]\ntcp_notsent_lowat = [\"lots\"]\n"),
        31,
        "tcp_notsent_lowat = \"lots\": \"kernel\" or a size",
    );
    assert_error(
        &format!("{BASE}\n[matrix]\nslow_start_after_idle = [\"1\"]\n"),
        31,
        "slow_start_after_idle = \"1\": on or off",
    );
}

/// `tcp_pacing` reaches every onionlab node's configuration when on,
/// nothing when off; C tor variants refuse it.
#[test]
fn tcp_pacing_is_a_matrix_parameter_for_onionlab_nodes() {
    let s = parse(&format!(
        "{BASE}\n[matrix]\ntcp_pacing = [\"off\", \"on\"]\n"
    ))
    .expect("valid");
    let v = s.variants();
    assert_eq!(v[1].label, "tcp_pacing=on");
    for host in ["guard", "client"] {
        assert!(!v[0].link_settings(host).expect("valid").tcp.pacing);
        assert!(v[1].link_settings(host).expect("valid").tcp.pacing);
    }
    assert!(!parse(BASE).expect("valid").variants()[0].tcp_pacing);
    assert_error(
        &format!("{BASE}\n[matrix]\ntcp_pacing = [\"yes\"]\n"),
        31,
        "tcp_pacing = \"yes\": on or off",
    );
    let ctor =
        format!("{BASE}\n[matrix]\ntransport = [\"tls\", \"ctor\"]\ntcp_pacing = [\"on\"]\n");
    match parse(&ctor) {
        Err(Error::Scenario { message, .. }) => {
            assert!(message.contains("tcp_pacing is onionlab's"), "{message}")
        }
        other => panic!("a paced C tor variant accepted: {other:?}"),
    }
}

/// `cubic_hystart` is on, off or (absent) the machine's.
#[test]
fn cubic_hystart_is_a_matrix_parameter() {
    let s = parse(&format!(
        "{BASE}\n[matrix]\ncubic_hystart = [\"on\", \"off\"]\n"
    ))
    .expect("valid");
    let got: Vec<Option<bool>> = s.variants().iter().map(|v| v.cubic_hystart).collect();
    assert_eq!(got, [Some(true), Some(false)]);
    assert_eq!(
        parse(BASE).expect("valid").variants()[0].cubic_hystart,
        None
    );
    assert_error(
        &format!("{BASE}\n[matrix]\ncubic_hystart = [\"0\"]\n"),
        31,
        "cubic_hystart = \"0\": on or off",
    );
    // Machine-wide: runs beside each other would change it under each
    // other, so `--jobs` above 1 is refused before anything is created.
    let out = std::env::temp_dir().join(format!("onionlab-hystart-jobs-{}", std::process::id()));
    let opts = onionlab_lab::run::RunOptions {
        out: out.clone(),
        bin: PathBuf::from("/nonexistent"),
        repetitions: Some(1),
        progress: false,
        resume: false,
        redo: Default::default(),
        jobs: 2,
        stop: None,
        abort: None,
        shadow: None,
    };
    let e = onionlab_lab::run::run(&s, &opts).expect_err("refused");
    assert!(e.to_string().contains("--jobs 1"), "{e}");
    assert!(!out.exists(), "nothing created");
}

#[test]
fn host_rates_and_queues_are_matrix_parameters() {
    use onionlab_netem::{QueueLimit, Rate};
    let s = parse(&format!(
        "{BASE}\n[matrix]\n\"rate:guard,middle\" = [\"100Mbit\", \"5Mbit\"]\n\"queue:middle\" = [\"100ms\"]\n"
    ))
    .expect("valid");
    let v = s.variants();
    assert_eq!(v.len(), 2);
    let slow = v
        .iter()
        .find(|v| v.label.contains("rate:guard,middle=5Mbit"))
        .expect("variant");
    let t = &slow.topology;
    let host = |name: &str| &t.hosts[t.host_id(name).expect("host")];
    for name in ["guard", "middle"] {
        assert_eq!(host(name).uplink.rate, Rate(Some(5_000_000)), "{name} up");
        assert_eq!(
            host(name).downlink.rate,
            Rate(Some(5_000_000)),
            "{name} down"
        );
    }
    let base = parse(BASE).expect("valid").variants()[0].topology.clone();
    let base_host = |name: &str| &base.hosts[base.host_id(name).expect("host")];
    assert_eq!(
        host("exit").uplink,
        base_host("exit").uplink,
        "other hosts keep theirs"
    );
    assert_eq!(
        host("middle").uplink.queue,
        QueueLimit::parse("100ms").expect("queue")
    );
    assert_eq!(
        host("middle").downlink.queue,
        QueueLimit::parse("100ms").expect("queue")
    );
    assert_eq!(host("guard").uplink.queue, base_host("guard").uplink.queue);

    // Without a host list: every host.
    let s = parse(&format!("{BASE}\n[matrix]\nrate = [\"20Mbit\"]\n")).expect("valid");
    let t = &s.variants()[0].topology;
    assert!(t
        .hosts
        .iter()
        .all(|h| h.uplink.rate == Rate(Some(20_000_000))
            && h.downlink.rate == Rate(Some(20_000_000))));

    assert_error(
        &format!("{BASE}\n[matrix]\n\"rate:guard,pluto\" = [\"5Mbit\"]\n"),
        31,
        "unknown host \"pluto\"",
    );
    assert_error(
        &format!("{BASE}\n[matrix]\nrate = [\"fast\"]\n"),
        31,
        "fast",
    );
    assert_error(
        &format!("{BASE}\n[matrix]\n\"queue:guard\" = [\"deep\"]\n"),
        31,
        "deep",
    );
}

#[test]
fn configs_follow_the_transport() {
    use onionlab_config::{ConfigFile, Congestion, RelayConfig, TransportChoice};
    use onionlab_lab::plan::{relay_addresses, relay_config};
    use onionlab_transport::tcp::TcpCongestion;

    let key = {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let k = onionlab_netdoc::keys::generate_network_key(&mut rng);
        onionlab_netdoc::keys::public_key_hex(&k.verifying_key())
    };
    let addr: std::net::SocketAddr = "10.77.0.3:9001".parse().expect("addr");
    let text = format!(
        "{BASE}\n[matrix]\ntransport = [\"tls\", \"quic\", \"quic-conn-per-circuit\", \"auto\"]\ncongestion = [\"newreno\"]\n"
    );
    for v in parse(&text).expect("valid").variants() {
        let names: Vec<String> = relay_addresses(v.transport, addr)
            .into_iter()
            .map(|a| {
                assert_eq!(a.addr, addr);
                a.transport
            })
            .collect();
        let server: std::net::SocketAddr = "10.77.0.9:8000".parse().expect("addr");
        let written = relay_config("guard", addr, &key, &v, &[server])
            .unwrap_or_else(|e| panic!("{}: {e}", v.label));
        let text = written.to_toml().expect("written");
        let cfg = RelayConfig::from_toml_str(&text, "r", Path::new(""))
            .unwrap_or_else(|e| panic!("{}: {e}", v.label));
        assert_eq!(cfg, written, "{text}");
        // Exits reach the lab's servers and no other private address.
        assert!(cfg.exit_reject_private);
        assert!(cfg.exit_allow_private.contains(server));
        assert!(!cfg
            .exit_allow_private
            .contains("10.77.0.9:8001".parse().expect("addr")));
        assert_eq!(cfg.link.transport, v.transport);
        // The relay listens where the document says it does.
        let listening: Vec<_> = cfg.listen.iter().map(|(k, a)| (k.doc_name(), a)).collect();
        let advertised: Vec<_> = names.iter().map(|n| (n.as_str(), addr)).collect();
        assert_eq!(listening, advertised, "{}", v.label);
        if v.transport == "tls" {
            assert_eq!(names, ["tls"]);
            assert_eq!(
                cfg.link.transport,
                "tls".parse::<TransportChoice>().expect("tls")
            );
            // No QUIC settings for a transport without QUIC.
            assert!(!text.contains("[link.quic]"), "{text}");
        } else {
            assert_eq!(names, ["tls", "quic"]);
            assert_eq!(cfg.link.quic.congestion, Congestion::NewReno);
            // The topology's MTU (1500) less IPv4 and UDP headers.
            assert_eq!(cfg.link.quic.initial_mtu, 1472);
        }
        // Kernel TCP matches QUIC's NewReno, whatever the transport.
        assert_eq!(
            cfg.link.tcp.congestion,
            Some(TcpCongestion::Named("reno".into()))
        );
    }
}

#[test]
fn bundled_quic_scenarios() {
    let load = |name: &str| {
        Scenario::from_file(&scenarios_dir().join(format!("{name}.toml")))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    // Seed 000 scenarios 1-4: TLS vs QUIC, 50 repetitions, 20/40 ms.
    for (name, variants) in [
        ("seed000-s1", 16),
        ("seed000-s2", 16),
        ("seed000-s3", 8),
        ("seed000-s4", 8),
    ] {
        let s = load(name);
        assert_eq!(s.repetitions, 50, "{name}");
        let v = s.variants();
        assert_eq!(v.len(), variants, "{name}");
        for t in ["tls", "quic"] {
            assert_eq!(
                v.iter().filter(|v| v.transport == t).count(),
                variants / 2,
                "{name} {t}"
            );
        }
        for l in ["20ms", "40ms"] {
            assert!(
                v.iter().any(|v| v.label.contains(&format!("={l}"))),
                "{name} {l}"
            );
        }
        // Every QUIC variant has a TLS twin (the same parameters but the
        // transport), its baseline in the report.
        let without_transport = |v: &onionlab_lab::Variant| -> Vec<(String, String)> {
            v.params
                .iter()
                .filter(|(k, _)| k != "transport")
                .cloned()
                .collect()
        };
        for q in v.iter().filter(|v| v.transport == "quic") {
            assert!(
                v.iter()
                    .any(|t| t.transport == "tls" && without_transport(t) == without_transport(q)),
                "{name}: {} has no TLS twin",
                q.label
            );
        }
    }
    let q = load("quic-quick");
    let t: Vec<String> = q
        .variants()
        .into_iter()
        .map(|v| v.transport.to_string())
        .collect();
    assert_eq!(t, ["tls", "quic", "quic-conn-per-circuit"]);

    let f = load("quic-fallback");
    let v = f.variants();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].transport, "auto");
    let topo = &v[0].topology;
    let (g, m, e) = (
        topo.host_id("guard").expect("guard"),
        topo.host_id("middle").expect("middle"),
        topo.host_id("exit").expect("exit"),
    );
    assert!(topo.path(g, m).block.udp && topo.path(m, g).block.udp);
    assert!(!topo.path(g, m).block.tcp);
    assert!(topo.path(m, e).block.is_none());
}

#[test]
fn clients_runs_the_first_n_clients_and_their_workloads() {
    let text = format!(
        "{BASE}\n[[client]]\nname = \"op2\"\nhost = \"server\"\npath = [\"guard\", \"middle\", \"exit\"]\n\n[[workload]]\nname = \"second\"\nkind = \"upload\"\nclient = \"op2\"\nserver = \"srv\"\nsize = \"1MiB\"\n\n[matrix]\nclients = [1, 2]\n"
    );
    let s = parse(&text).expect("valid");
    let v = s.variants();
    assert_eq!(v.len(), 2);
    let one = v.iter().find(|v| v.clients == Some(1)).expect("clients=1");
    assert_eq!(one.active_clients(&s.clients).len(), 1);
    assert!(one.workloads.iter().all(|w| w.client == "op"));
    let two = v.iter().find(|v| v.clients == Some(2)).expect("clients=2");
    assert_eq!(two.active_clients(&s.clients).len(), 2);
    assert_eq!(two.workloads.len(), 2);
    // More clients than the file has, or none, is an error on its line.
    let bad = text.replace("clients = [1, 2]", "clients = [1, 3]");
    let lines = bad.lines().count();
    assert_error(&bad, lines, "from 1 to 2");
    assert_error(
        &text.replace("clients = [1, 2]", "clients = [0]"),
        lines,
        "from 1 to 2",
    );
}

#[test]
fn report_settings_name_and_compare_the_variants() {
    let text = format!(
        "{BASE}\n[matrix]\ntransport = [\"tls\", \"quic\"]\n\"latency:client-guard,guard-middle,middle-exit\" = [\"20ms\", \"40ms\"]\n\n[report]\ncompare = \"transport\"\nbaseline = \"quic\"\n[report.labels]\n\"latency:client-guard,guard-middle,middle-exit\" = \"per hop\"\n"
    );
    let s = parse(&text).unwrap();
    assert_eq!(
        s.short_labels(),
        [
            "tls, per hop 20ms",
            "quic, per hop 20ms",
            "tls, per hop 40ms",
            "quic, per hop 40ms"
        ]
    );
    assert_eq!(s.design().compare.unwrap().baseline, "quic");
    // Without [report]: transport against tls, default short names.
    let plain = text.split("\n[report]").next().unwrap().to_string();
    let s = parse(&plain).unwrap();
    assert_eq!(s.short_labels()[3], "quic, latency 40ms");
    assert_eq!(s.design().compare.unwrap().baseline, "tls");
    // Broken settings name the [report] table's line.
    let line = text.lines().position(|l| l == "[report]").unwrap() + 1;
    let bad = text.replace("baseline = \"quic\"", "baseline = \"pctcp\"");
    assert_error(&bad, line, "not one of");
    let bad = text.replace("compare = \"transport\"", "compare = \"size\"");
    assert_error(&bad, line, "not a matrix parameter");
    let bad = text.replace("\"per hop\"", "\"per hop\"\nlatency = \"x\"");
    assert_error(&bad, line, "\"latency\" is not a matrix parameter");
    let bad = text.replace(
        "compare = \"transport\"",
        "compare = \"transport\"\ncolour = 1",
    );
    assert_error(&bad, line + 2, "unknown field");
    // [report.labels] alone (no [report] line) is the same table.
    let labels_only = text.replace(
        "[report]\ncompare = \"transport\"\nbaseline = \"quic\"\n",
        "",
    );
    let s = parse(&labels_only).expect("[report.labels] without [report]");
    assert_eq!(s.short_labels()[3], "quic, per hop 40ms");
    assert_eq!(s.design().compare.unwrap().baseline, "tls");
}

/// `[relay_settings]` reach every relay.toml, and are checked when the
/// scenario is read: unknown keys, bad values and the lab's own settings
/// are errors naming the file.
#[test]
fn relay_settings_are_checked_and_written() {
    use onionlab_config::{ConfigFile, RelayConfig};
    use onionlab_lab::plan::relay_config;
    let text = format!(
        "{BASE}\n[relay_settings]\ntorchestra = {{ thresh_light = 0.4, window_ms = 500 }}\nlink.quic.keep_alive_ms = 1000\n\n[matrix]\ntransport = [\"torchestra\"]\n"
    );
    let v = parse(&text).expect("valid").variants().remove(0);
    let key = "0".repeat(64);
    let addr: std::net::SocketAddr = "10.77.0.3:9001".parse().expect("addr");
    let written = relay_config("guard", addr, &key, &v, &[]).expect("made");
    let cfg = RelayConfig::from_toml_str(&written.to_toml().expect("text"), "r", Path::new(""))
        .expect("a valid relay.toml");
    assert_eq!(cfg, written);
    assert_eq!(cfg.torchestra.thresh_light, 0.4);
    assert_eq!(cfg.torchestra.window, std::time::Duration::from_millis(500));
    assert_eq!(cfg.link.transport.name(), "torchestra");
    assert_eq!(cfg.link.quic.keep_alive, std::time::Duration::from_secs(1));
    for (bad, needle) in [
        ("torchestra.thresh_light = 1.5", "must be in (0, 1]"),
        ("no_such_setting = 1", "unknown field"),
        ("link.quic.color = 1", "unknown field"),
        ("link.transport = \"tls\"", "the lab writes it"),
        ("link = { tcp = { pacing = true } }", "the lab writes it"),
        ("scheduler = \"ewma\"", "the lab writes it"),
        ("torchestra_alpha = 0.5", "[torchestra] alpha"),
    ] {
        let text = format!("{BASE}\n[relay_settings]\n{bad}\n");
        match parse(&text) {
            Err(Error::Scenario {
                origin, message, ..
            }) => {
                assert_eq!(origin, "t.toml");
                assert!(message.contains(needle), "{bad}: {message}");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn stream_workloads_take_a_duration_and_no_size() {
    let text = BASE.replace(
        "[[workload]]\nkind = \"download\"",
        "[[workload]]\nname = \"ts\"\nkind = \"stream\"\nclient = \"op\"\nserver = \"srv\"\nduration = \"2s\"\n\n[[workload]]\nkind = \"download\"",
    );
    let text = format!("{text}\n[matrix]\nsize = [\"1MiB\"]\n");
    let s = parse(&text).expect("valid");
    let v = &s.variants()[0];
    let w = v.workloads.iter().find(|w| w.name == "ts").expect("stream");
    assert_eq!(w.stream_duration, std::time::Duration::from_secs(2));
    assert_eq!(w.size, 0, "a size matrix must not give a stream a size");
    // A size or a zero duration on a stream, a duration elsewhere: errors.
    let sized = BASE.replace("kind = \"download\"", "kind = \"stream\"");
    assert_error(&sized, 27, "a stream has no size");
    let zero = BASE
        .replace(
            "kind = \"download\"",
            "kind = \"stream\"\nduration = \"0s\"",
        )
        .replace("size = \"320KiB\"\n", "");
    assert_error(&zero, 25, "between 1 ms and 1 h");
    let long = BASE
        .replace(
            "kind = \"download\"",
            "kind = \"stream\"\nduration = \"115s\"",
        )
        .replace("size = \"320KiB\"\n", "");
    assert_error(&long, 25, "cannot finish within transfer_timeout");
    let misplaced = BASE.replace("count = 2", "count = 2\nduration = \"5s\"");
    assert_error(&misplaced, 29, "belongs to kind = \"stream\"");
}

#[test]
fn exclude_leaves_out_matching_combinations() {
    let text = format!(
        "{BASE}\n[matrix]\ntransport = [\"tls\", \"quic\"]\n\"loss:guard-middle\" = [\"0%\", \"1%\"]\n\"loss:middle-exit\" = [\"0%\", \"1%\"]\n\n[[exclude]]\n\"loss:guard-middle\" = \"1%\"\n\"loss:middle-exit\" = \"1%\"\n"
    );
    let s = parse(&text).expect("valid");
    let labels: Vec<String> = s.variants().iter().map(|v| v.label.clone()).collect();
    assert_eq!(labels.len(), 6, "{labels:?}");
    assert!(labels
        .iter()
        .all(|l| !(l.contains("loss:guard-middle=1%") && l.contains("loss:middle-exit=1%"))));
    assert_eq!(s.short_labels().len(), 6);

    let unknown = format!(
        "{BASE}\n[matrix]\ntransport = [\"tls\", \"quic\"]\n\n[[exclude]]\nscheduler = \"ewma\"\n"
    );
    assert_error(&unknown, 33, "not a matrix parameter");
    let value = format!(
        "{BASE}\n[matrix]\ntransport = [\"tls\", \"quic\"]\n\n[[exclude]]\ntransport = \"pctcp\"\n"
    );
    assert_error(&value, 33, "not one of the matrix's values");
    let all =
        format!("{BASE}\n[matrix]\ntransport = [\"tls\"]\n\n[[exclude]]\ntransport = \"tls\"\n");
    assert_error(&all, 33, "leaves no variant");
}

#[test]
fn dtls_utcp_with_bbr_is_refused_unless_excluded() {
    let matrix =
        "[matrix]\ntransport = [\"tls\", \"dtls-utcp\"]\ncongestion = [\"cubic\", \"bbr\"]\n";
    let text = format!("{BASE}\n{matrix}");
    assert_error(&text, 32, "dtls-utcp has no bbr");
    // The kernel's default (BBR here) is no match for smoltcp either.
    let system =
        format!("{BASE}\n[matrix]\ntransport = [\"dtls-utcp\"]\ntcp_congestion = [\"system\"]\n");
    assert_error(&system, 32, "dtls-utcp has no system");
    let text =
        format!("{BASE}\n{matrix}\n[[exclude]]\ntransport = \"dtls-utcp\"\ncongestion = \"bbr\"\n");
    assert_eq!(parse(&text).expect("valid").variants().len(), 3);
}

#[test]
fn the_lab_writes_dtls_utcp_lanes_at_parity() {
    let text = format!(
        "{BASE}\n[matrix]\ntransport = [\"dtls-utcp\"]\ncongestion = [\"cubic\", \"newreno\"]\n\n[relay_settings.link.utcp]\nrx_buffer = 131072\n"
    );
    let s = parse(&text).expect("valid");
    let lanes: Vec<_> = s
        .variants()
        .iter()
        .map(|v| v.link_settings("client").expect("valid").utcp)
        .collect();
    // 1500-byte links: 1500 - 28 (IPv4, UDP) - 23 (DTLS record) = 1449;
    // the scenario's buffer, to clients too.
    use onionlab_transport::utcp::LaneCongestion;
    assert_eq!(lanes[0].congestion, LaneCongestion::Cubic);
    assert_eq!((lanes[0].max_segment, lanes[0].rx_buffer), (1449, 131_072));
    assert_eq!(lanes[1].congestion, LaneCongestion::Reno);
    // The scenario may set what the lab would.
    let text = text.replace("rx_buffer = 131072", "max_segment = 1200");
    let v = &parse(&text).expect("valid").variants()[0];
    let lane = v.link_settings("guard").expect("valid").utcp;
    assert_eq!(lane.max_segment, 1200);
}

/// `transport = "ctor"` makes a C tor variant (TLS channels); a misspelt
/// transport names ctor among the valid values; C tor needs three-hop
/// paths.
#[test]
fn ctor_is_a_transport_value_with_three_hop_paths() {
    use onionlab_lab::variant::Implementation;
    let text = format!("{BASE}\n[matrix]\ntransport = [\"tls\", \"ctor\"]\n");
    let v = parse(&text).expect("valid").variants();
    let kinds: Vec<Implementation> = v.iter().map(|v| v.implementation).collect();
    assert_eq!(kinds, [Implementation::Onionlab, Implementation::Ctor]);
    assert_eq!(v[1].label, "transport=ctor");
    assert_eq!(v[1].transport.to_string(), v[0].transport.to_string());
    let lines = text.lines().count();
    assert_error(
        &text.replace("\"ctor\"]", "\"c-tor\"]"),
        lines,
        "or ctor (C tor)",
    );
    let two_hops = text.replace(
        "path = [\"guard\", \"middle\", \"exit\"]",
        "path = [\"guard\", \"exit\"]",
    );
    match parse(&two_hops) {
        Err(Error::Scenario { message, .. }) => {
            assert!(message.contains("2-hop path"), "{message}")
        }
        other => panic!("a 2-hop C tor path accepted: {other:?}"),
    }
    // Without C tor the same path is fine.
    parse(&two_hops.replace(", \"ctor\"]", "]")).expect("onionlab takes any path");
    // C tor's first hop must be a guard, its last an exit.
    let no_guard_first = text.replace(
        "path = [\"guard\", \"middle\", \"exit\"]",
        "path = [\"middle\", \"guard\", \"exit\"]",
    );
    match parse(&no_guard_first) {
        Err(Error::Scenario { message, .. }) => {
            assert!(message.contains("`guard = true`"), "{message}")
        }
        other => panic!("a C tor path without a guard first accepted: {other:?}"),
    }
}

#[test]
fn ctor_torrc_lines_are_kept_and_the_labs_own_options_refused() {
    let ok = format!(
        "{BASE}\n[ctor]\nrelay_torrc = [\"NumCPUs 1\", \" KISTSchedRunInterval 2 msec \"]\n\
         client_torrc = [\"CircuitPadding 0\"]\n"
    );
    let s = parse(&ok).expect("valid");
    assert_eq!(
        s.ctor_relay_torrc,
        vec!["NumCPUs 1", "KISTSchedRunInterval 2 msec"]
    );
    assert_eq!(s.ctor_client_torrc, vec!["CircuitPadding 0"]);
    assert!(parse(BASE).expect("valid").ctor_relay_torrc.is_empty());
    let line = BASE.lines().count() + 2;
    let own = format!("{BASE}\n[ctor]\nrelay_torrc = [\"orport 9999\"]\n");
    assert_error(&own, line, "may not set ORPort");
    let matrix = format!("{BASE}\n[ctor]\nrelay_torrc = [\"+Schedulers Vanilla\"]\n");
    assert_error(&matrix, line, "may not set Schedulers");
    let two = format!("{BASE}\n[ctor]\nclient_torrc = [\"A 1\\nB 2\"]\n");
    assert_error(&two, line, "is not one torrc line");
    let params = format!("{BASE}\n[ctor]\nconsensus_params = [\" cellq_high=1000\", \"x_1=-2\"]\n");
    assert_eq!(
        parse(&params).expect("valid").ctor_consensus_params,
        vec!["cellq_high=1000", "x_1=-2"]
    );
    for (bad, why) in [
        ("cc_alg=2", "may not set cc_alg"),
        ("cfx_max_prebuilt_set=5", "may not set cfx_max_prebuilt_set"),
        ("cfx_enabled=0", "may not set cfx_enabled"),
        ("cellq_high", "is not `name=integer`"),
        ("cellq_high=1k", "is not `name=integer`"),
        ("cellq high=1", "is not `name=integer`"),
        ("=1", "is not `name=integer`"),
    ] {
        let text = format!("{BASE}\n[ctor]\nconsensus_params = [\"{bad}\"]\n");
        assert_error(&text, line, why);
    }
    let twice = format!("{BASE}\n[ctor]\nconsensus_params = [\"a=1\", \"a=2\"]\n");
    assert_error(&twice, line, "a set twice");
    let unknown = format!("{BASE}\n[ctor]\nrelays = []\n");
    assert_error(&unknown, line + 1, "unknown field");
}

#[test]
fn ctor_scheduler_varies_c_tor_only() {
    let matrix =
        "\n[matrix]\ntransport = [\"tls\", \"ctor\"]\nctor_scheduler = [\"kist\", \"vanilla\"]\n";
    let both = format!("{BASE}{matrix}");
    assert_error(&both, 1, "differ only in ctor_scheduler");
    let one_tls =
        format!("{BASE}{matrix}\n[[exclude]]\ntransport = \"tls\"\nctor_scheduler = \"vanilla\"\n");
    let s = parse(&one_tls).expect("valid");
    let schedulers: Vec<_> = s
        .variants()
        .iter()
        .map(|v| (v.implementation, v.ctor_scheduler.clone()))
        .collect();
    assert_eq!(schedulers.len(), 3);
    assert!(schedulers.contains(&(Implementation::Ctor, Some("vanilla".into()))));
    assert!(schedulers.contains(&(Implementation::Ctor, Some("kist".into()))));
    let rr = format!("{BASE}\n[matrix]\ntransport = [\"ctor\"]\nscheduler = [\"round-robin\"]\n");
    assert_error(&rr, 1, "cannot schedule circuits round robin");
    let unknown =
        format!("{BASE}\n[matrix]\ntransport = [\"ctor\"]\nctor_scheduler = [\"fifo\"]\n");
    assert_error(
        &unknown,
        BASE.lines().count() + 4,
        "unknown C tor scheduler",
    );
}

/// `exit_packaging` reaches every onionlab relay.toml; C tor variants
/// take only "eager" (what C tor does), and unknown values are refused.
#[test]
fn exit_packaging_is_a_matrix_parameter() {
    use onionlab_circuit::relay::ExitPackaging;
    use onionlab_lab::plan::relay_config;
    let matrix =
        "\n[matrix]\ntransport = [\"tls\", \"ctor\"]\nexit_packaging = [\"lazy\", \"eager\"]\n";
    let all = format!("{BASE}{matrix}");
    assert_error(&all, 1, "C tor's exits package eagerly");
    let text = format!("{all}\n[[exclude]]\ntransport = \"ctor\"\nexit_packaging = \"lazy\"\n");
    let s = parse(&text).expect("valid");
    let variants = s.variants();
    let seen: Vec<_> = variants
        .iter()
        .map(|v| (v.implementation, v.exit_packaging))
        .collect();
    assert_eq!(seen.len(), 3);
    for want in [
        (Implementation::Onionlab, ExitPackaging::Lazy),
        (Implementation::Onionlab, ExitPackaging::Eager),
        (Implementation::Ctor, ExitPackaging::Eager),
    ] {
        assert!(seen.contains(&want), "{want:?} in {seen:?}");
    }
    let key = "0".repeat(64);
    let addr: std::net::SocketAddr = "10.77.0.3:9001".parse().expect("addr");
    for v in variants
        .iter()
        .filter(|v| v.implementation == Implementation::Onionlab)
    {
        let cfg = relay_config("exit", addr, &key, v, &[]).expect("a valid relay.toml");
        assert_eq!(cfg.exit_packaging, v.exit_packaging);
    }
    // Without the parameter every variant is lazy, C tor's too (ignored).
    let plain = parse(&format!("{BASE}\n[matrix]\ntransport = [\"ctor\"]\n")).expect("valid");
    assert_eq!(plain.variants()[0].exit_packaging, ExitPackaging::Lazy);
    let unknown = format!("{BASE}\n[matrix]\nexit_packaging = [\"soon\"]\n");
    assert_error(
        &unknown,
        BASE.lines().count() + 3,
        "is not one of lazy, eager",
    );
    let by_hand = format!("{BASE}\n[relay_settings]\nexit_packaging = \"eager\"\n");
    assert!(parse(&by_hand).is_err(), "the lab writes exit_packaging");
}

#[test]
fn legs_and_leg_schedulers_are_matrix_parameters() {
    use onionlab_config::{ClientConfig, NetworkSource};
    use onionlab_lab::plan::{network_params, set_client_paths};
    let blank = || {
        let network = NetworkSource::File("n".into());
        ClientConfig::new(
            "127.0.0.1:1".parse().expect("addr"),
            network,
            &"0".repeat(64),
        )
        .expect("valid")
    };
    let paths_of = |c: &onionlab_lab::scenario::ClientSpec, legs: usize| {
        let mut cfg = blank();
        set_client_paths(&mut cfg, c, legs);
        (cfg.path, cfg.paths, cfg.legs)
    };
    let hops = |p: &[&str]| p.iter().map(ToString::to_string).collect::<Vec<_>>();
    let seven = BASE
        .replace(
            "[[relay]]\nhost = \"guard\"\nguard = true\n",
            "[[relay]]\nhost = \"guard\"\nguard = true\n[[relay]]\nhost = \"client\"\nguard = true\n",
        )
        .replace(
            "path = [\"guard\", \"middle\", \"exit\"]",
            "paths = [[\"guard\", \"middle\", \"exit\"], [\"client\", \"server\", \"exit\"]]",
        )
        .replace(
            "[[relay]]\nhost = \"middle\"\n",
            "[[relay]]\nhost = \"middle\"\n[[relay]]\nhost = \"server\"\n",
        );
    // (The topology's hosts stand in for relays: client and server relay
    // here too, which a parse does not mind.)
    let text = format!(
        "{}\n[matrix]\nlegs = [1, 2]\nleg_scheduler = [\"round-robin:4\", \"mtor\"]\n",
        seven
    );
    let s = parse(&text).expect("valid");
    let variants = s.variants();
    assert_eq!(variants.len(), 4);
    for v in &variants {
        let params = network_params(v);
        assert_eq!(params.cfx_enabled, v.legs > 1, "{}", v.label);
        assert_eq!(params.cfx_scheduler.to_string(), v.params[0].1);
        let first = hops(&["guard", "middle", "exit"]);
        if v.legs == 1 {
            assert_eq!(paths_of(&s.clients[0], v.legs), (Some(first), None, 1));
        } else {
            let second = hops(&["client", "server", "exit"]);
            assert_eq!(
                paths_of(&s.clients[0], v.legs),
                (None, Some(vec![first, second]), 1)
            );
        }
    }
    // A client without pinned legs takes random ones.
    let random = onionlab_lab::scenario::ClientSpec {
        name: "r".into(),
        host: "client".into(),
        path: None,
        paths: None,
    };
    assert_eq!(paths_of(&random, 3), (None, None, 3));
    assert_eq!(paths_of(&random, 1), (None, None, 1));

    for (matrix, needle) in [
        ("legs = [9]", "1 to 8"),
        ("legs = [0]", "1 to 8"),
        ("leg_scheduler = [\"fastest\"]", "unknown leg scheduler"),
    ] {
        let e = parse(&format!("{BASE}\n[matrix]\n{matrix}\n")).expect_err(matrix);
        assert!(e.to_string().contains(needle), "{matrix}: {e}");
    }
    // One pinned path cannot make two legs; three legs need three pinned.
    let e = parse(&format!("{BASE}\n[matrix]\nlegs = [2]\n")).expect_err("one path");
    assert!(e.to_string().contains("pins one path"), "{e}");
    let e = parse(&format!("{}\n[matrix]\nlegs = [3]\n", seven)).expect_err("too few pinned");
    assert!(e.to_string().contains("pins only 2"), "{e}");
    // Random legs need the relays for them: quick's three relays have one
    // guard.
    let random = BASE.replace("path = [\"guard\", \"middle\", \"exit\"]\n", "");
    let e = parse(&format!("{random}\n[matrix]\nlegs = [2]\n")).expect_err("too few relays");
    assert!(e.to_string().contains("needs 2 guard relays"), "{e}");
    // C tor variants with legs run C tor's conflux: it needs Vegas and one
    // of its two schedulers.
    let ctor =
        |rest: &str| format!("{seven}\n[matrix]\nlegs = [2]\ntransport = [\"ctor\"]\n{rest}");
    let e = parse(&ctor("")).expect_err("ctor legs with fixed windows");
    assert!(e.to_string().contains("circuit_cc = \"vegas\""), "{e}");
    let e = parse(&ctor(
        "circuit_cc = [\"vegas\"]\nleg_scheduler = [\"mtor\"]\n",
    ))
    .expect_err("ctor legs with mtor");
    assert!(e.to_string().contains("lowrtt or minrtt"), "{e}");
    let s = parse(&ctor(
        "circuit_cc = [\"vegas\"]\nleg_scheduler = [\"minrtt\"]\n",
    ))
    .expect("C tor's conflux");
    let plan = onionlab_lab::ctor::NetPlan::of_variant(&s, &s.variants()[0]).expect("plan");
    let cfx = plan.conflux.expect("conflux on");
    assert_eq!((cfx.legs, cfx.ux.as_str()), (2, "latency"));
    assert_eq!(plan.clients[0].path, None);
    // One workload: a linked set of its own, beside the test download's.
    assert_eq!(plan.clients[0].isolated_streams, 1);
    assert_eq!(
        plan.clients[0].legs,
        s.clients[0].paths.clone().expect("paths")
    );
    // C tor's legs never share a guard or a middle.
    let shared = ctor("circuit_cc = [\"vegas\"]\n").replace(
        "[\"client\", \"server\", \"exit\"]",
        "[\"guard\", \"server\", \"exit\"]",
    );
    let e = parse(&shared).expect_err("shared guard");
    assert!(e.to_string().contains("share the guard \"guard\""), "{e}");
    // One leg is a plain C tor circuit, conflux off.
    let s = parse(&format!("{seven}\n[matrix]\ntransport = [\"ctor\"]\n")).expect("one leg");
    let plan = onionlab_lab::ctor::NetPlan::of_variant(&s, &s.variants()[0]).expect("plan");
    assert_eq!(plan.conflux, None);
    assert!(plan.clients[0].path.is_some() && plan.clients[0].legs.is_empty());
    // Pinned legs end at one exit, and a client has path or paths.
    let two_exits = BASE.replace(
        "path = [\"guard\", \"middle\", \"exit\"]",
        "paths = [[\"guard\", \"exit\"], [\"middle\", \"guard\"]]",
    );
    assert_error(&two_exits, 15, "same exit");
    let both = BASE.replace(
        "path = [\"guard\", \"middle\", \"exit\"]",
        "path = [\"guard\", \"exit\"]\npaths = [[\"guard\", \"exit\"]]",
    );
    assert_error(&both, 15, "either path or paths");
}

#[test]
fn a_workload_can_run_for_a_time_instead_of_a_count() {
    let timed = BASE.replace("count = 2", "think = \"1s-60s\"\nuntil = \"1800s\"");
    let s = parse(&timed).expect("until without count");
    let w = &s.workloads[0];
    assert_eq!(w.until, Some(std::time::Duration::from_secs(1800)));
    assert_eq!(w.count, u32::MAX, "bounded by its time alone");
    let both = BASE.replace("count = 2", "count = 2\nuntil = \"60s\"");
    let s = parse(&both).expect("until with count");
    assert_eq!(
        (s.workloads[0].count, s.workloads[0].until.is_some()),
        (2, true)
    );
    // Without `until`, a workload does `count` transfers (default 1).
    assert_eq!(parse(BASE).expect("base").workloads[0].until, None);

    assert_error(
        &BASE.replace("count = 2", "start = \"60s\"\nuntil = \"60s\""),
        29,
        "must come after start",
    );
    assert_error(&BASE.replace("count = 2", "until = \"soon\""), 28, "soon");
    let stream = BASE
        .replace("kind = \"download\"", "kind = \"stream\"")
        .replace("size = \"320KiB\"\n", "")
        .replace("count = 2", "until = \"60s\"");
    assert_error(&stream, 27, "not a trace or a stream");
}

#[test]
fn a_relay_can_carry_its_weight_in_path_selection() {
    let s = parse(BASE).expect("base");
    assert!(
        s.relays.iter().all(|r| r.bandwidth == 1000),
        "all alike by default"
    );
    let weighted = BASE.replace("host = \"middle\"", "host = \"middle\"\nbandwidth = 2500");
    let s = parse(&weighted).expect("a weight");
    assert_eq!(s.relays[1].bandwidth, 2500);
    assert_error(
        &BASE.replace("host = \"middle\"", "host = \"middle\"\nbandwidth = 0"),
        10,
        "bandwidth must be 1 to",
    );
}

/// `end_to_end` picks the TCP a datagram variant runs end to end: it
/// reaches every node's `[link.datagram]`, and `kernel` with another
/// transport (which would ignore it, or for MORE cannot run it) is
/// refused until excluded.
#[test]
fn end_to_end_is_the_datagram_transports() {
    use onionlab_transport::datagram::tunnel::EndToEnd;
    let matrix = "\n[matrix]\ntransport = [\"datagram\"]\nend_to_end = [\"user\", \"kernel\"]\n";
    let s = parse(&format!("{BASE}{matrix}")).expect("valid");
    let kinds: Vec<EndToEnd> = s
        .variants()
        .iter()
        .map(|v| {
            let link = v.link_settings("exit").expect("link settings");
            assert_eq!(link.datagram.end_to_end, v.end_to_end);
            v.end_to_end
        })
        .collect();
    assert_eq!(kinds, [EndToEnd::User, EndToEnd::Kernel]);
    for transport in ["tls", "more"] {
        let mixed = format!(
            "{BASE}\n[matrix]\ntransport = [\"datagram\", \"{transport}\"]\nend_to_end = [\"user\", \"kernel\"]\n"
        );
        assert_error(
            &mixed,
            1,
            "end_to_end = \"kernel\" is the datagram transport's",
        );
        let excluded =
            format!("{mixed}\n[[exclude]]\ntransport = \"{transport}\"\nend_to_end = \"kernel\"\n");
        assert_eq!(parse(&excluded).expect("valid").variants().len(), 3);
    }
    let unknown = format!("{BASE}\n[matrix]\nend_to_end = [\"both\"]\n");
    assert_error(&unknown, BASE.lines().count() + 3, "unknown end_to_end");
}
