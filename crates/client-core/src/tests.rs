//! Unit tests of the core's decisions: sharing, dirtiness, path choice,
//! failed relays, document changes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_cell::msg::LinkSpec;
use onionlab_netdoc::doc::TRANSPORT_TLS;
use onionlab_netdoc::{ExitPolicy, NetworkDocument, RelayEntry};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::core::{path_hops, still_usable, Circ, Pick};
use crate::path::{path_names, PinnedPathError, Target};
use crate::settings::{Config, PolicySettings, RelayId};
use crate::*;

#[test]
fn sharing_needs_same_isolation_and_a_fitting_exit() {
    let user = |u: &str| IsolationKey::UserPass {
        user: u.as_bytes().to_vec(),
        pass: b"pw".to_vec(),
    };
    let web = ExitPolicy::parse("accept *:80, accept *:443").expect("policy");
    let t80 = Target::ip("192.0.2.1".parse().expect("ip"), 80);
    let t22 = Target::ip("192.0.2.1".parse().expect("ip"), 22);
    let name80 = Target::name("example.com", 80);
    let none = IsolationKey::None;
    assert!(may_share(&none, &web, &none, &t80));
    assert!(may_share(&none, &web, &none, &name80));
    assert!(!may_share(&none, &web, &none, &t22), "exit policy");
    assert!(may_share(&user("a"), &web, &user("a"), &t80));
    assert!(!may_share(&user("a"), &web, &user("b"), &t80), "isolation");
    assert!(!may_share(&user("a"), &web, &none, &t80), "isolation");
    assert!(!may_share(&none, &web, &user("a"), &t80), "isolation");
}

#[test]
fn dirtiness_counts_from_first_use() {
    let t0 = Instant::now();
    let max = Duration::from_secs(600);
    assert!(!too_dirty(None, t0 + Duration::from_secs(10_000), max));
    assert!(!too_dirty(Some(t0), t0 + Duration::from_secs(599), max));
    assert!(too_dirty(Some(t0), t0 + Duration::from_secs(600), max));
    // A limit of 0: one stream per circuit.
    assert!(too_dirty(Some(t0), t0, Duration::ZERO));
}

/// `n` relays named `relay0`...: even ones are guards, the last two
/// exits.
fn relays(n: usize) -> Vec<RelayEntry> {
    use onionlab_crypto::identity::RelaySecretKeys;
    use onionlab_netdoc::doc::TransportAddress;
    (0..n)
        .map(|i| {
            let keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(i as u64));
            let mut r = RelayEntry::new(format!("relay{i}"), &keys.public());
            r.addresses.push(TransportAddress {
                transport: TRANSPORT_TLS.into(),
                addr: format!("127.0.0.1:{}", 9000 + i).parse().expect("addr"),
            });
            r.flags.guard = i % 2 == 0;
            r.flags.exit = i + 2 >= n;
            r.exit_policy = ExitPolicy::parse("accept *:*").expect("policy");
            r
        })
        .collect()
}

/// A document valid from `valid_after` for a day.
fn doc(relays: Vec<RelayEntry>, valid_after: u64) -> NetworkDocument {
    NetworkDocument {
        network_name: "test".into(),
        created_unix: valid_after,
        valid_after_unix: valid_after,
        valid_until_unix: valid_after + 86_400,
        params: Default::default(),
        relays,
    }
}

/// A state over `doc`, with a pinned path if `path` is given.
fn state_with(doc: NetworkDocument, path: Option<&[&str]>) -> ClientCore {
    let mut settings = PolicySettings::new(Arc::new(doc));
    settings.path = path.map(|p| p.iter().map(|n| n.to_string()).collect());
    ClientCore::new(Config::new(settings).expect("pinned path resolves"))
}

/// A state over `n` relays with random paths.
fn state_with_relays(n: usize) -> ClientCore {
    state_with(doc(relays(n), 0), None)
}

/// The identity of the relay called `nick` in the document held.
fn id(st: &ClientCore, nick: &str) -> RelayId {
    st.cfg
        .settings
        .network
        .relay_by_nickname(nick)
        .expect("listed")
        .ed_identity
}

fn launched(st: &mut ClientCore) -> Vec<usize> {
    let target = Target::ip("192.0.2.1".parse().expect("ip"), 80);
    match st.pick(Instant::now(), &target, &IsolationKey::None) {
        Ok(Pick::Launch(p)) => {
            assert!(Arc::ptr_eq(&p.doc, &st.cfg.settings.network));
            assert_eq!(p.legs.len(), 1);
            p.legs[0].clone()
        }
        other => panic!("expected a new path, got {:?}", other.map(|_| ())),
    }
}

/// Nicknames of relay indexes of the document held.
fn names(st: &ClientCore, path: &[usize]) -> String {
    path_names(st.cfg.relays(), path)
}

/// Add a circuit on `path` (nicknames, in the document held) that the
/// client takes for built; its channel never opens.
fn open_circuit(st: &mut ClientCore, path: &[&str]) -> CircKey {
    let doc = st.cfg.settings.network.clone();
    let path: Vec<usize> = path
        .iter()
        .map(|n| {
            doc.relays
                .iter()
                .position(|r| r.nickname == *n)
                .expect("listed")
        })
        .collect();
    let hops = path_hops(&doc, &path);
    let key = st
        .node
        .launch(Instant::now(), hops, Default::default())
        .expect("a path");

    let c = Circ {
        doc,
        legs: vec![path],
        stale: false,
        isolation: IsolationKey::None,
        open: true,
        first_use: None,
        streams: HashMap::new(),
        waiting: Vec::new(),
    };
    st.circuits.insert(key, c);
    // The node asks for the guard's channel; nothing opens it here.
    st.settle(Instant::now());
    key
}

#[test]
fn a_path_seed_repeats_the_paths_and_none_varies_them() {
    let seeded = |seed| {
        let mut settings = PolicySettings::new(Arc::new(doc(relays(12), 0)));
        settings.path_seed = Some(seed);
        let mut st = ClientCore::new(Config::new(settings).expect("config"));
        (0..8).map(|_| launched(&mut st)).collect::<Vec<_>>()
    };
    assert_eq!(seeded(7), seeded(7), "same seed, same paths");
    assert_ne!(seeded(7), seeded(8), "another seed, other paths");
    // Without a seed, 8 paths over 12 relays repeat with a chance far
    // below 1e-6.
    let unseeded = || {
        let mut st = state_with_relays(12);
        (0..8).map(|_| launched(&mut st)).collect::<Vec<_>>()
    };
    assert_ne!(unseeded(), unseeded());
}

fn pick_web(st: &mut ClientCore) -> Pick {
    let target = Target::ip("192.0.2.1".parse().expect("ip"), 80);
    match st.pick(Instant::now(), &target, &IsolationKey::None) {
        Ok(p) => p,
        Err(e) => panic!("no circuit: {e}"),
    }
}

/// A state whose document has `cfx_enabled` as given, with `legs`
/// legs or the pinned `paths`.
fn multipath_state(cfx: bool, legs: usize, paths: Option<&[&[&str]]>) -> ClientCore {
    let mut d = doc(relays(10), 0);
    d.params.cfx_enabled = cfx;
    let mut settings = PolicySettings::new(Arc::new(d));
    settings.legs = legs;
    settings.paths = paths.map(|ps| {
        ps.iter()
            .map(|p| p.iter().map(|n| n.to_string()).collect())
            .collect()
    });
    ClientCore::new(Config::new(settings).expect("resolves"))
}

fn launched_legs(st: &mut ClientCore) -> Vec<String> {
    let target = Target::ip("192.0.2.1".parse().expect("ip"), 80);
    match st.pick(Instant::now(), &target, &IsolationKey::None) {
        Ok(Pick::Launch(p)) => p.legs.iter().map(|l| names(st, l)).collect(),
        other => panic!("expected a new path, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn pinned_legs_built_in_code_are_checked() {
    let mut d = doc(relays(10), 0);
    d.params.cfx_enabled = true;
    let settings = |legs: Vec<Vec<&str>>| {
        let mut s = PolicySettings::new(Arc::new(d.clone()));
        s.paths = Some(
            legs.iter()
                .map(|p| p.iter().map(|n| n.to_string()).collect())
                .collect(),
        );
        s
    };
    for (legs, needle) in [
        (vec![], "1 to 8 paths"),
        (
            vec![
                vec!["relay0", "relay1", "relay8"],
                vec!["relay2", "relay3", "relay9"],
            ],
            "same exit",
        ),
    ] {
        let e = Config::new(settings(legs)).expect_err(needle);
        assert!(e.to_string().contains(needle), "{e}");
    }
}

#[test]
fn sets_are_launched_only_when_the_network_links_them() {
    // cfx_enabled: three random legs, one exit, nothing else shared.
    let mut st = multipath_state(true, 3, None);
    assert_eq!(st.cfg.legs(), 3);
    for _ in 0..50 {
        let legs = launched_legs(&mut st);
        assert_eq!(legs.len(), 3);
        let hops: Vec<Vec<&str>> = legs.iter().map(|l| l.split(',').collect()).collect();
        let mut relays: Vec<&str> = hops.iter().flat_map(|h| h[..2].to_vec()).collect();
        relays.sort();
        relays.dedup();
        assert_eq!(relays.len(), 6, "{legs:?}");
        assert!(hops.iter().all(|h| h[2] == hops[0][2]), "{legs:?}");
    }
    // Without it: plain circuits, and pinned legs fall back to the first.
    let mut st = multipath_state(false, 3, None);
    assert_eq!(st.cfg.legs(), 1);
    assert_eq!(launched_legs(&mut st).len(), 1);
    let pinned: &[&[&str]] = &[
        &["relay0", "relay1", "relay9"],
        &["relay2", "relay3", "relay9"],
    ];
    let mut st = multipath_state(false, 1, Some(pinned));
    assert_eq!(launched_legs(&mut st), ["relay0,relay1,relay9"]);
    let mut st = multipath_state(true, 1, Some(pinned));
    assert_eq!(
        launched_legs(&mut st),
        ["relay0,relay1,relay9", "relay2,relay3,relay9"]
    );
}

#[test]
fn failed_relays_are_avoided_for_a_while_unless_no_path_is_left() {
    let mut st = state_with_relays(6);
    let now = Instant::now();
    // relay5 (an exit) and relay1 failed a moment ago.
    st.failed_relays.insert(id(&st, "relay5"), now);
    st.failed_relays.insert(id(&st, "relay1"), now);
    for _ in 0..200 {
        let p = launched(&mut st);
        assert!(!p.contains(&5) && !p.contains(&1), "{p:?}");
    }
    // Both exits failed: no path without them, so they are used.
    st.failed_relays.insert(id(&st, "relay4"), now);
    let p = launched(&mut st);
    assert!(p[2] == 4 || p[2] == 5, "{p:?}");
    // After the avoidance period, nothing is avoided any more.
    let long_ago = now - st.cfg.settings.relay_failure_avoidance - Duration::from_secs(1);
    for at in st.failed_relays.values_mut() {
        *at = long_ago;
    }
    let seen: std::collections::HashSet<usize> = (0..300).flat_map(|_| launched(&mut st)).collect();
    assert!(seen.contains(&1) && seen.contains(&5), "{seen:?}");
    assert!(st.failed_relays.is_empty());
}

#[test]
fn a_newer_document_with_relays_removed_and_reordered_keeps_names_right() {
    let pinned = ["relay0", "relay2", "relay5"];
    let mut st = state_with(doc(relays(6), 0), Some(&pinned));
    let kept = open_circuit(&mut st, &["relay0", "relay1", "relay5"]);
    let through_gone = open_circuit(&mut st, &["relay0", "relay3", "relay5"]);
    let now = Instant::now();
    st.failed_relays.insert(id(&st, "relay1"), now);
    st.failed_relays.insert(id(&st, "relay4"), now);
    st.failed_relays.insert(id(&st, "relay3"), now);

    // The newer document lists the relays backwards, without relay3.
    let mut newer: Vec<RelayEntry> = relays(6).into_iter().rev().collect();
    newer.retain(|r| r.nickname != "relay3");
    let swapped = st.replace_network(Arc::new(doc(newer, 10)));
    assert_eq!(
        swapped,
        Ok(Swapped {
            vanished: 1,
            retired: 1
        })
    );
    assert_eq!(st.cfg.settings.network.valid_after_unix, 10);

    // The pinned path was resolved again: same relays, new indexes.
    let p = st.cfg.pinned.clone().expect("pinned").remove(0);
    assert_ne!(p, vec![0, 2, 5]);
    assert_eq!(names(&st, &p), "relay0,relay2,relay5");
    // Failed relays are still the same relays; relay3 is gone.
    let mut failed: Vec<String> = st
        .recently_failed(now)
        .iter()
        .map(|&i| st.cfg.relays()[i].nickname.clone())
        .collect();
    failed.sort();
    assert_eq!(failed, ["relay1", "relay4"]);
    // Circuits still name their own relays.
    for (key, want) in [
        (kept, "relay0,relay1,relay5"),
        (through_gone, "relay0,relay3,relay5"),
    ] {
        let c = &st.circuits[&key];
        assert_eq!(c.path_names(), want);
    }
    // The circuit through the vanished relay takes no new streams and
    // closes when unused; the other one is still picked.
    assert!(st.circuits[&through_gone].stale && !st.circuits[&kept].stale);
    assert!(matches!(pick_web(&mut st), Pick::Ready(k) if k == kept));
    st.circuits.remove(&kept);
    match pick_web(&mut st) {
        Pick::Launch(p) => assert_eq!(names(&st, &p.legs[0]), "relay0,relay2,relay5"),
        _ => panic!("expected the pinned path to be launched"),
    }
    st.expire_dirty(Instant::now());
    assert!(!st.circuits.contains_key(&through_gone), "closed");
}

#[test]
fn a_newer_document_without_a_pinned_relay_is_not_used() {
    let mut st = state_with(doc(relays(6), 0), Some(&["relay0", "relay2", "relay5"]));
    let held = st.cfg.clone();
    let mut newer = relays(6);
    newer.retain(|r| r.nickname != "relay2");
    let err = st.replace_network(Arc::new(doc(newer, 10)));
    assert_eq!(err, Err(PinnedPathError::UnknownRelay("relay2".into())));
    assert!(Arc::ptr_eq(&held, &st.cfg), "the held document stays");
}

#[test]
fn circuits_are_usable_under_a_new_document_while_their_relays_are_listed() {
    let old = relays(6);
    let cfg_of = |relays: Vec<RelayEntry>| {
        let settings = PolicySettings::new(Arc::new(doc(relays, 1)));
        Config::new(settings).expect("config")
    };
    // Reordered: still usable (by identity, not index).
    let reordered = cfg_of(old.iter().rev().cloned().collect());
    assert!(still_usable(&old, &[0, 1, 5], &reordered));
    // A hop removed: not usable.
    let mut without1 = old.clone();
    without1.remove(1);
    assert!(!still_usable(&old, &[0, 1, 5], &cfg_of(without1.clone())));
    assert!(still_usable(&old, &[0, 2, 5], &cfg_of(without1)));
    // The exit's policy changed: not usable (it may no longer allow
    // the circuit's streams); another relay's change does not matter.
    let mut narrowed = old.clone();
    narrowed[5].exit_policy = ExitPolicy::parse("accept *:443").expect("policy");
    narrowed[1].bandwidth = 7;
    let narrowed = cfg_of(narrowed);
    assert!(!still_usable(&old, &[0, 1, 5], &narrowed));
    assert!(still_usable(&old, &[0, 1, 4], &narrowed));
    // An index out of range (never made by the client): not usable, no
    // panic.
    assert!(!still_usable(&old, &[0, 1, 9], &reordered));
    assert!(!still_usable(&old, &[], &reordered));
}

#[test]
fn linkspecs_name_address_and_identity() {
    use onionlab_crypto::identity::RelaySecretKeys;
    use onionlab_netdoc::doc::TransportAddress;
    let keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(1));
    let mut r = RelayEntry::new("r", &keys.public());
    r.addresses.push(TransportAddress {
        transport: TRANSPORT_TLS.into(),
        addr: "127.0.0.1:9001".parse().expect("addr"),
    });
    let specs: Vec<LinkSpec> = linkspecs(&r)
        .iter()
        .map(|s| s.parse().expect("parses"))
        .collect();
    assert_eq!(
        specs,
        vec![
            LinkSpec::OrPort("127.0.0.1".parse().expect("ip"), 9001),
            LinkSpec::Ed25519Id(keys.public().ed_identity),
        ]
    );
}

#[test]
fn a_circuit_the_node_closed_is_not_picked_before_its_event_is_handled() {
    let mut st = state_with_relays(6);
    let key = open_circuit(&mut st, &["relay0", "relay1", "relay5"]);
    assert!(matches!(pick_web(&mut st), Pick::Ready(k) if k == key));
    // Closed in the node (as a channel's closing closes all its circuits
    // at once); its Closed event is not handled yet.
    st.node.destroy(Instant::now(), key);
    assert!(st.circuits.contains_key(&key));
    assert!(matches!(pick_web(&mut st), Pick::Launch(_)));
}
