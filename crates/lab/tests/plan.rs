//! Plans: every bundled preset's plans build without root, a plan
//! round-trips through JSON, plans are the same for the same inputs, and
//! one preset's plan matches its stored snapshot.

use std::path::{Path, PathBuf};

use onionlab_lab::plan::{Plan, Ready, Role};
use onionlab_lab::variant::Implementation;
use onionlab_lab::Scenario;

/// The network document's start in every plan of these tests.
const NOW: u64 = 1_800_000_000;

fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

fn preset(name: &str) -> Scenario {
    let path = scenarios_dir().join(format!("{name}.toml"));
    Scenario::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_bundled_preset_plans_every_variant_without_root() {
    let mut plans = 0;
    for entry in std::fs::read_dir(scenarios_dir()).expect("scenarios/") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let s = Scenario::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for v in s.variants() {
            let plan = Plan::of(&s, &v, (0, 7), NOW)
                .unwrap_or_else(|e| panic!("{} {}: {e}", path.display(), v.label));
            let agents = plan.processes_of(Role::Agent).count();
            assert_eq!(agents, plan.agents.len(), "{}", v.label);
            assert!(agents > 0, "{} {}: no agent", path.display(), v.label);
            match v.implementation {
                Implementation::Onionlab => {
                    assert_eq!(plan.processes_of(Role::Relay).count(), s.relays.len());
                    assert!(plan.ctor.is_none());
                }
                Implementation::Ctor => {
                    assert_eq!(plan.processes_of(Role::Relay).count(), 0);
                    assert!(plan.ctor.is_some());
                }
            }
            plans += 1;
        }
    }
    assert!(
        plans > 50,
        "expected the bundled presets' variants, found {plans}"
    );
}

#[test]
fn a_plan_round_trips_through_json() {
    for name in ["demo", "seed004-scale-datagram", "ctor-quick"] {
        let s = preset(name);
        for v in s.variants() {
            let plan = Plan::of(&s, &v, (1, 99), NOW).expect("plan");
            let text = serde_json::to_string(&plan).expect("serialise");
            let back: Plan = serde_json::from_str(&text).expect("deserialise");
            assert_eq!(back, plan, "{name} {}", v.label);
        }
    }
}

#[test]
fn a_plan_is_a_function_of_its_inputs() {
    let s = preset("demo");
    let v = &s.variants()[0];
    let a = Plan::of(&s, v, (0, 5), NOW).expect("plan");
    assert_eq!(a, Plan::of(&s, v, (0, 5), NOW).expect("plan"));
    let b = Plan::of(&s, v, (0, 6), NOW).expect("plan");
    let keys = |p: &Plan| -> Vec<String> {
        p.files
            .iter()
            .filter(|f| f.secret)
            .map(|f| f.text.clone())
            .collect()
    };
    assert!(!keys(&a).is_empty(), "relays have keys");
    assert_ne!(keys(&a), keys(&b), "another seed makes other keys");
    assert_eq!(a.topology.seed, 5);
}

#[test]
fn relays_and_clients_wait_for_their_listening_addresses() {
    let s = preset("demo");
    let plan = Plan::of(&s, &s.variants()[0], (0, 1), NOW).expect("plan");
    for p in plan
        .processes_of(Role::Relay)
        .chain(plan.processes_of(Role::Client))
    {
        assert!(matches!(p.ready, Ready::Listening(_)), "{}", p.name);
        let config = p.args.last().expect("a config path");
        assert!(
            plan.files.iter().any(|f| &f.path == config),
            "{}'s config {config} is a file of the plan",
            p.name
        );
    }
    assert!(plan.files.iter().any(|f| f.path == "network.doc"));
}

/// The stored snapshot of the demo's first plan (repetition 0, seed 1):
/// a change to what the lab deploys shows here. Rewrite it with
/// `ONIONLAB_UPDATE_SNAPSHOTS=1 cargo test -p onionlab-lab --test plan`
/// and read the difference.
#[test]
fn the_demo_plan_matches_its_snapshot() {
    let s = preset("demo");
    let plan = Plan::of(&s, &s.variants()[0], (0, 1), NOW).expect("plan");
    let text = serde_json::to_string_pretty(&plan).expect("serialise") + "\n";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/demo-plan.json");
    if std::env::var_os("ONIONLAB_UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, &text).expect("write the snapshot");
    }
    let stored = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (write it: see this test's doc)", path.display()));
    assert!(
        stored == text,
        "the demo's plan differs from {}",
        path.display()
    );
}

#[test]
fn a_timed_workload_bounds_the_deadline_by_its_time() {
    let s = preset("seed001-shadow-scale");
    let v = &s.variants()[0];
    let plan = Plan::of(&s, v, (0, 1), NOW).expect("plan");
    // The last transfer starts before `until` (120 s) and ends within the
    // transfer timeout (300 s): the count (unbounded) does not set it.
    let until = std::time::Duration::from_secs(120);
    assert!(plan
        .agents
        .iter()
        .all(|a| a.spec.workloads[0].0.until == Some(until)));
    let deadline = plan.workload_deadline.as_secs();
    assert!((420..=500).contains(&deadline), "{deadline} s");
    // The relays' weights in the network document are the scenario's.
    let doc = plan
        .files
        .iter()
        .find(|f| f.path == "network.doc")
        .expect("the network document");
    assert!(
        doc.text.contains("bandwidth = 15900"),
        "exitguard1's weight"
    );
}
