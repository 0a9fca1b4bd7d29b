//! The Shadow export: a preset's repetition written as Shadow's graph and
//! configuration, what Shadow runs its own way noted, what it cannot run
//! refused, and every bundled preset either exported or refused with a
//! reason.

use std::path::{Path, PathBuf};

use onionlab_lab::engine::shadow::{
    export, Schedule, Shadow, ShadowOptions, CONFIG_FILE, GRAPH_FILE, SIMULATION_START_UNIX,
};
use onionlab_lab::plan::{Plan, Role};
use onionlab_lab::variant::Implementation;
use onionlab_lab::{Error, Scenario};
use serde_json::Value;

fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

fn preset(name: &str) -> Scenario {
    let path = scenarios_dir().join(format!("{name}.toml"));
    Scenario::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn options() -> ShadowOptions {
    ShadowOptions {
        bin: PathBuf::from("/opt/onionlab/bin/onionlab"),
        parallelism: 2,
        log: Some("warn".into()),
    }
}

/// The configuration as JSON (after its comment header).
fn read_config(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join(CONFIG_FILE)).expect("the configuration");
    let body: String = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    serde_json::from_str(&body).expect("JSON, which is YAML 1.2")
}

fn seconds(v: &Value) -> f64 {
    let s = v.as_str().expect("a time string");
    let ms: f64 = s
        .strip_suffix(" ms")
        .expect("in ms")
        .parse()
        .expect("a number");
    ms / 1000.0
}

#[test]
fn a_repetition_becomes_shadow_hosts_running_the_plans_processes() {
    let s = preset("circuit-cc-loss");
    let v = &s.variants()[0];
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("rep000-v00");
    let e = export(&s, v, (0, 7), &dir, &options()).expect("export");

    // The plan is the namespace engine's, with the document valid from
    // Shadow's clock's start and TCP left to Shadow's own.
    assert!(
        e.notes.iter().any(|n| n.contains("cubic becomes Reno")),
        "{:?}",
        e.notes
    );
    let mut adapted = v.clone();
    adapted.tcp_congestion = Some("reno".into());
    let quic: toml::Table = toml::from_str("[link.quic]\nudp_io = \"plain\"").expect("toml");
    adapted.relay_settings.extend(quic);
    let plan = Plan::of(&s, &adapted, (0, 7), SIMULATION_START_UNIX).expect("plan");
    assert_eq!(e.plan, plan);
    for f in plan.files.iter() {
        assert!(dir.join(&f.path).is_file(), "{} written", f.path);
    }
    assert!(dir.join(GRAPH_FILE).is_file());

    let c = read_config(&dir);
    assert_eq!(c["network"]["use_shortest_path"], Value::Bool(false));
    assert_eq!(c["network"]["graph"]["file"]["path"], GRAPH_FILE);
    assert_eq!(c["experimental"]["use_new_tcp"], Value::Bool(false));
    let hosts = c["hosts"].as_object().expect("hosts");
    assert_eq!(hosts.len(), plan.topology.hosts.len());
    let mut starts = Vec::new();
    for (id, h) in plan.topology.hosts.iter().enumerate() {
        let sh = &hosts[&h.name];
        assert_eq!(sh["network_node_id"], id);
        assert_eq!(sh["ip_addr"], h.address.to_string());
        let procs = sh["processes"].as_array().expect("processes");
        let mine: Vec<_> = plan.processes.iter().filter(|p| p.host == h.name).collect();
        assert_eq!(procs.len(), mine.len(), "{}", h.name);
        for (sp, p) in procs.iter().zip(mine) {
            assert_eq!(sp["path"], "/opt/onionlab/bin/onionlab");
            let args: Vec<&str> = sp["args"]
                .as_array()
                .expect("args")
                .iter()
                .map(|a| a.as_str().expect("a string"))
                .collect();
            assert_eq!(args[..2], ["-C", dir.to_str().expect("utf-8")]);
            assert_eq!(
                args[2..],
                p.args.iter().map(String::as_str).collect::<Vec<_>>()[..]
            );
            assert_eq!(sp["environment"]["ONIONLAB_LOG"], "warn");
            let final_state = &sp["expected_final_state"];
            match p.role {
                Role::Agent => assert_eq!(final_state["exited"], 0),
                _ => assert_eq!(final_state, "running"),
            }
            starts.push((p.role, seconds(&sp["start_time"])));
        }
    }
    // Servers, relays, clients, agents, in that order; the simulation
    // ends at the agents' start plus the workload's deadline.
    let at = |role: Role| {
        starts
            .iter()
            .filter(move |(r, _)| *r == role)
            .map(|(_, t)| *t)
    };
    let last = |role: Role| at(role).fold(f64::MIN, f64::max);
    let first = |role: Role| at(role).fold(f64::MAX, f64::min);
    assert!(last(Role::Server) < first(Role::Relay));
    assert!(last(Role::Relay) < first(Role::Client));
    assert!(last(Role::Client) < first(Role::Agent));
    let stop = seconds(&c["general"]["stop_time"]);
    let deadline = plan.workload_deadline.as_secs_f64();
    assert!((stop - first(Role::Agent) - deadline).abs() < 1e-3);
    assert!((e.schedule.stop_at.as_secs_f64() - stop).abs() < 1e-3);
}

#[test]
fn an_export_never_writes_over_files() {
    let s = preset("circuit-cc-loss");
    let v = &s.variants()[0];
    let tmp = tempfile::tempdir().expect("tempdir");
    export(&s, v, (0, 7), tmp.path(), &options()).expect("the first export");
    let again = export(&s, v, (0, 7), tmp.path(), &options()).unwrap_err();
    assert!(again.to_string().contains("is not empty"), "{again}");
}

#[test]
fn what_linux_tcp_sets_is_noted_by_name() {
    let s = preset("seed001-toy-loaded");
    let v = &s.variants()[0];
    let tmp = tempfile::tempdir().expect("tempdir");
    let e = export(&s, v, (0, 7), tmp.path(), &options()).expect("export");
    let varies = e
        .notes
        .iter()
        .any(|n| n.contains("varies slow_start_after_idle"));
    assert!(varies, "{:?}", e.notes);
}

#[test]
fn a_c_tor_variant_is_refused() {
    let s = preset("ctor-quick");
    let variants = s.variants();
    let v = variants
        .iter()
        .find(|v| v.implementation == Implementation::Ctor)
        .expect("a C tor variant");
    let tmp = tempfile::tempdir().expect("tempdir");
    let e = export(&s, v, (0, 7), tmp.path(), &options()).unwrap_err();
    assert!(matches!(e, Error::Shadow(_)), "{e}");
    assert!(e.to_string().contains("C tor"), "{e}");
}

#[test]
fn every_bundled_preset_exports_or_says_why_not() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (mut exported, mut refused) = (0, 0);
    for entry in std::fs::read_dir(scenarios_dir()).expect("scenarios/") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let s = Scenario::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let v = &s.variants()[0];
        let dir = tmp.path().join(&s.name);
        match export(&s, v, (0, 7), &dir, &options()) {
            Ok(_) => exported += 1,
            Err(Error::Shadow(why)) => {
                assert!(!why.is_empty());
                refused += 1;
            }
            Err(e) => panic!("{}: not a Shadow refusal: {e}", path.display()),
        }
    }
    assert!(exported >= 10, "{exported} exported, {refused} refused");
}

#[test]
fn quic_endpoints_do_their_udp_io_one_datagram_per_call() {
    let s = preset("quic-quick");
    let v = &s.variants()[1];
    let tmp = tempfile::tempdir().expect("tempdir");
    let e = export(&s, v, (0, 7), tmp.path(), &options()).expect("export");
    let configs: Vec<_> = e
        .plan
        .files
        .iter()
        .filter(|f| f.path.ends_with("relay.toml") || f.path.ends_with("client.toml"))
        .collect();
    assert!(configs.len() >= 4, "three relays and a client");
    for f in configs {
        let t: toml::Table = toml::from_str(&f.text).expect("a node configuration");
        assert_eq!(
            t["link"]["quic"]["udp_io"].as_str(),
            Some("plain"),
            "{}",
            f.path
        );
    }
}

#[test]
fn processes_of_one_host_start_apart_in_the_plans_order() {
    let s = preset("quic-quick");
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut plan = export(&s, &s.variants()[0], (0, 7), tmp.path(), &options())
        .expect("export")
        .plan;
    // Every process on one host: each role's processes tie, and must not.
    let host = plan.processes[0].host.clone();
    for p in &mut plan.processes {
        p.host = host.clone();
    }
    let schedule = Schedule::of(&plan);
    let order = schedule.start_order(&plan, &host);
    assert_eq!(order.len(), plan.processes.len());
    let starts: Vec<_> = order.iter().map(|&i| schedule.starts[i]).collect();
    assert!(starts.windows(2).all(|w| w[0] < w[1]), "{starts:?}");
    for role in [Role::Server, Role::Relay, Role::Client, Role::Agent] {
        let of_role: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&i| plan.processes[i].role == role)
            .collect();
        assert!(
            of_role.windows(2).all(|w| w[0] < w[1]),
            "{role:?}: {of_role:?}"
        );
    }
    assert!(schedule.stop_at >= *starts.last().expect("a start") + plan.workload_deadline);
}

#[test]
fn a_missing_shadow_binary_is_a_clear_error() {
    let e = Shadow::new(Some(PathBuf::from("/nonexistent/shadow")), options()).unwrap_err();
    assert!(matches!(e, Error::Shadow(_)), "{e}");
    assert!(e.to_string().contains("/nonexistent/shadow"), "{e}");
}
