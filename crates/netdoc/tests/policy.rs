//! Exit policy parsing and evaluation.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use onionlab_netdoc::policy::{
    canonical_ip, Action, AddrPattern, ExitPolicy, PolicyRule, PortRange,
};
use onionlab_netdoc::{Error, RuleError};
use proptest::prelude::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn evaluation_table() {
    // (policy, address, port, allowed)
    let cases: &[(&str, &str, u16, bool)] = &[
        ("accept *:*", "1.2.3.4", 80, true),
        ("accept *:*", "::1", 65535, true),
        ("accept *:*", "1.2.3.4", 0, false),
        ("reject *:*", "1.2.3.4", 80, false),
        ("", "1.2.3.4", 80, false),
        // Implicit final reject.
        ("accept *:80", "1.2.3.4", 81, false),
        ("accept *:80", "1.2.3.4", 80, true),
        // Port ranges, inclusive.
        ("accept *:80-443", "1.2.3.4", 79, false),
        ("accept *:80-443", "1.2.3.4", 80, true),
        ("accept *:80-443", "1.2.3.4", 443, true),
        ("accept *:80-443", "1.2.3.4", 444, false),
        ("accept *:1-65535", "1.2.3.4", 65535, true),
        ("accept *:65535", "1.2.3.4", 65535, true),
        // First match wins.
        ("reject 10.0.0.0/8:*, accept *:*", "10.200.0.1", 80, false),
        ("reject 10.0.0.0/8:*, accept *:*", "11.0.0.1", 80, true),
        ("accept *:*, reject 10.0.0.0/8:*", "10.200.0.1", 80, true),
        // Masks.
        ("accept 1.2.3.4/32:*", "1.2.3.4", 1, true),
        ("accept 1.2.3.4/32:*", "1.2.3.5", 1, false),
        ("accept 1.2.3.4:*", "1.2.3.5", 1, false),
        ("accept 0.0.0.0/0:*", "255.255.255.255", 1, true),
        ("accept 0.0.0.0/0:*", "::", 1, false),
        ("accept 9.9.9.9/0:*", "1.1.1.1", 1, true),
        ("accept 192.168.0.0/16:*", "192.168.255.255", 1, true),
        ("accept 192.168.0.0/16:*", "192.169.0.0", 1, false),
        ("accept 10.1.2.3/8:*", "10.9.9.9", 1, true),
        // Families.
        ("accept *4:*", "1.2.3.4", 1, true),
        // An IPv4-mapped address is the IPv4 address it carries.
        ("accept *4:*", "::ffff:1.2.3.4", 1, true),
        ("accept *6:*", "::ffff:1.2.3.4", 1, false),
        ("accept *6:*", "1.2.3.4", 1, false),
        ("accept *6:*", "2001:db8::1", 1, true),
        ("accept [::1]:22", "::1", 22, true),
        ("accept [::1]:22", "::2", 22, false),
        ("accept [::1]:22", "127.0.0.1", 22, false),
        ("accept [2001:db8::]/32:*", "2001:db8:ffff::1", 9, true),
        ("accept [2001:db8::]/32:*", "2001:db9::1", 9, false),
        ("accept [::]/0:*", "ffff::", 9, true),
        ("accept [::]/0:*", "1.1.1.1", 9, false),
        ("accept [::1]/128:*", "::1", 9, true),
        // Newline separated, blank entries, spacing.
        (
            "reject 127.0.0.1:*\n\n  accept *:*  ,",
            "127.0.0.1",
            5,
            false,
        ),
        (
            "reject 127.0.0.1:*\n\n  accept *:*  ,",
            "127.0.0.2",
            5,
            true,
        ),
        ("accept\t*:*", "127.0.0.2", 5, true),
    ];
    for &(policy, addr, port, want) in cases {
        let p = ExitPolicy::parse(policy).unwrap_or_else(|e| panic!("{policy}: {e}"));
        assert_eq!(p.allows(ip(addr), port), want, "{policy:?} {addr} {port}");
    }
}

#[test]
fn syntax_errors() {
    let cases: &[(&str, &str)] = &[
        ("accept", "expected `accept` or `reject`"),
        ("allow *:*", "must start with `accept` or `reject`"),
        ("ACCEPT *:*", "must start with"),
        ("accept *", "missing `:PORT`"),
        ("accept *:", "port"),
        ("accept *:0", "out of range"),
        ("accept *:65536", "out of range"),
        ("accept *:100000", "not *, a number"),
        ("accept *:80-", "not *, a number"),
        ("accept *:-80", "not *, a number"),
        ("accept *:443-80", "empty port range"),
        ("accept *:+80", "not *, a number"),
        ("accept *:8 0", "unexpected space"),
        ("accept */8:*", "takes no /MASKBITS"),
        ("accept *4/0:*", "takes no /MASKBITS"),
        ("accept 1.2.3.4/33:*", "out of range (0-32)"),
        ("accept 1.2.3.4/:*", "not a number of bits"),
        ("accept 1.2.3.4/-1:*", "not a number of bits"),
        ("accept 1.2.3.4/255.0.0.0:*", "not a number of bits"),
        ("accept [::1]/129:*", "out of range (0-128)"),
        ("accept [::1:*", "missing `]`"),
        ("accept [1.2.3.4]:*", "not an IPv6 address"),
        ("accept ::1:80", "must be in brackets"),
        ("accept 1.2.3:*", "is not *, *4, *6"),
        ("accept 1.2.3.4.5:*", "is not *, *4, *6"),
        ("accept host.example:80", "is not *, *4, *6"),
        ("accept :80", "missing address"),
        ("accept *:*, bogus", "bogus"),
    ];
    for &(text, want) in cases {
        let err = ExitPolicy::parse(text).unwrap_err();
        assert!(matches!(err, Error::Policy { .. }), "{text}: {err}");
        assert!(err.to_string().contains(want), "{text}: {err}");
    }
}

#[test]
fn a_malformed_rule_says_what_is_wrong_as_a_type() {
    let reason = |text: &str| match ExitPolicy::parse(text) {
        Err(Error::Policy { reason, .. }) => reason,
        other => panic!("{text}: {other:?}"),
    };
    assert_eq!(reason("accept *:90-80"), RuleError::EmptyPortRange(90, 80));
    assert_eq!(reason("accept *:0"), RuleError::PortOutOfRange("0".into()));
    assert_eq!(
        reason("accept 1.2.3.4/33:*"),
        RuleError::MaskOutOfRange {
            mask: "33".into(),
            max: 32
        }
    );
    assert_eq!(reason("allow *:*"), RuleError::NoAction);
}

#[test]
fn display_is_canonical() {
    let cases: &[(&str, &str)] = &[
        ("accept *:*", "accept *:*"),
        ("accept *:1-65535", "accept *:*"),
        ("reject *4:80", "reject *4:80"),
        ("reject *6:80-80", "reject *6:80"),
        ("accept 10.1.2.3/8:1-2", "accept 10.0.0.0/8:1-2"),
        ("accept 1.2.3.4/32:*", "accept 1.2.3.4:*"),
        ("accept [2001:DB8::1]/32:*", "accept [2001:db8::]/32:*"),
        ("accept [::1]/128:22", "accept [::1]:22"),
        (
            "reject 127.0.0.0/8:*\naccept *:443",
            "reject 127.0.0.0/8:*, accept *:443",
        ),
        ("", ""),
    ];
    for &(text, want) in cases {
        let p = ExitPolicy::parse(text).unwrap();
        assert_eq!(p.to_string(), want);
        assert_eq!(ExitPolicy::parse(&p.to_string()).unwrap(), p);
    }
    assert_eq!(ExitPolicy::accept_all().to_string(), "accept *:*");
    assert_eq!(ExitPolicy::reject_all().to_string(), "reject *:*");
}

#[test]
fn presets() {
    let a = ExitPolicy::accept_all();
    let r = ExitPolicy::reject_all();
    for (addr, port) in [("1.1.1.1", 1), ("::", 65535), ("127.0.0.1", 9050)] {
        assert!(a.allows(ip(addr), port));
        assert!(!r.allows(ip(addr), port));
    }
    assert!(a.allows_port_somewhere(80));
    assert!(!r.allows_port_somewhere(80));
    assert!(!a.allows_port_somewhere(0));
    assert_eq!(ExitPolicy::default(), ExitPolicy::parse("").unwrap());
}

#[test]
fn allows_port_somewhere_table() {
    let cases: &[(&str, u16, bool)] = &[
        ("accept *:80", 80, true),
        ("accept *:80", 443, false),
        ("reject *:80, accept *:*", 80, false),
        ("reject *:80, accept *:*", 81, true),
        ("reject 10.0.0.0/8:*, accept *:*", 80, true),
        // An accept rule entirely shadowed by earlier rejects.
        ("reject *4:80, accept 10.0.0.0/8:80", 80, false),
        ("reject *4:80, accept *:80", 80, true),
        ("reject *4:80, reject *6:80, accept *:80", 80, false),
        (
            "reject 0.0.0.0/1:*, reject 128.0.0.0/1:*, accept *4:*",
            5,
            false,
        ),
        (
            "reject 0.0.0.0/1:*, reject 128.0.0.0/2:*, accept *4:*",
            5,
            true,
        ),
        (
            "reject 0.0.0.0/1:*, reject 128.0.0.0/2:*, reject 192.0.0.0/2:*, accept *4:*",
            5,
            false,
        ),
        ("reject 1.2.3.4:*, accept 1.2.3.4:*", 5, false),
        ("reject 1.2.3.0/24:*, accept 1.2.3.4:*", 5, false),
        ("reject 1.2.3.4:*, accept 1.2.3.0/24:*", 5, true),
        (
            "reject [::]/1:*, reject [8000::]/1:*, accept *6:*",
            5,
            false,
        ),
        ("reject [::]/1:*, accept *6:*", 5, true),
        // A reject on other ports does not shadow.
        ("reject *:1-79, accept *:80", 80, true),
        ("", 80, false),
    ];
    for &(policy, port, want) in cases {
        let p = ExitPolicy::parse(policy).unwrap();
        assert_eq!(
            p.allows_port_somewhere(port),
            want,
            "{policy:?} port {port}"
        );
    }
}

#[test]
fn serde_is_a_list_of_rule_strings() {
    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct W {
        exit_policy: ExitPolicy,
    }
    let w = W {
        exit_policy: ExitPolicy::parse("reject [fc00::]/7:*, accept *:80").unwrap(),
    };
    let text = toml::to_string(&w).unwrap();
    assert_eq!(
        text.trim(),
        r#"exit_policy = ["reject [fc00::]/7:*", "accept *:80"]"#
    );
    assert_eq!(toml::from_str::<W>(&text).unwrap(), w);
    let err = toml::from_str::<W>("exit_policy = [\"accept *:x\"]").unwrap_err();
    assert!(err.to_string().contains("accept *:x"), "{err}");
    assert!(toml::from_str::<W>("exit_policy = \"accept *:*\"").is_err());
}

#[test]
fn constructors() {
    assert_eq!(PortRange::new(0, 5), None);
    assert_eq!(PortRange::new(6, 5), None);
    assert_eq!(PortRange::single(0), None);
    let r = PortRange::new(5, 6).unwrap();
    assert_eq!((r.lo(), r.hi()), (5, 6));
    assert!(AddrPattern::v4(Ipv4Addr::LOCALHOST, 33).is_none());
    assert!(AddrPattern::v6(Ipv6Addr::LOCALHOST, 129).is_none());
    assert_eq!(
        AddrPattern::v4("10.1.2.3".parse().unwrap(), 8).unwrap(),
        AddrPattern::V4 {
            addr: "10.0.0.0".parse().unwrap(),
            bits: 8
        }
    );
    // Unnormalized patterns built by hand still match by prefix.
    let p = AddrPattern::V4 {
        addr: "10.1.2.3".parse().unwrap(),
        bits: 8,
    };
    assert!(p.matches(ip("10.9.9.9")));
    let rule: PolicyRule = "reject *:25".parse().unwrap();
    assert_eq!(rule.action, Action::Reject);
    assert!(rule.matches(ip("1.1.1.1"), 25));
    let policy: ExitPolicy = "accept *:25".parse().unwrap();
    assert_eq!(policy.rules().len(), 1);
}

fn arb_addr() -> impl Strategy<Value = AddrPattern> {
    prop_oneof![
        Just(AddrPattern::Any),
        Just(AddrPattern::AnyV4),
        Just(AddrPattern::AnyV6),
        (any::<u32>(), 0u8..=32).prop_map(|(a, b)| AddrPattern::v4(Ipv4Addr::from(a), b).unwrap()),
        (any::<u128>(), 0u8..=128)
            .prop_map(|(a, b)| AddrPattern::v6(Ipv6Addr::from(a), b).unwrap()),
    ]
}

fn arb_ports() -> impl Strategy<Value = PortRange> {
    prop_oneof![
        Just(PortRange::ALL),
        (1u16..=65535).prop_map(|p| PortRange::single(p).unwrap()),
        (1u16..=65535, 1u16..=65535).prop_map(|(a, b)| PortRange::new(a.min(b), a.max(b)).unwrap()),
    ]
}

fn arb_rule() -> impl Strategy<Value = PolicyRule> {
    (any::<bool>(), arb_addr(), arb_ports()).prop_map(|(accept, addr, ports)| PolicyRule {
        action: if accept {
            Action::Accept
        } else {
            Action::Reject
        },
        addr,
        ports,
    })
}

proptest! {
    #[test]
    fn display_parse_round_trip(rules in prop::collection::vec(arb_rule(), 0..12)) {
        let policy = ExitPolicy::new(rules);
        let text = policy.to_string();
        prop_assert_eq!(ExitPolicy::parse(&text).unwrap(), policy.clone());
        // Newline-separated works too.
        let lines = text.replace(", ", "\n");
        prop_assert_eq!(ExitPolicy::parse(&lines).unwrap(), policy);
    }

    #[test]
    fn allows_port_somewhere_agrees_with_allows(
        rules in prop::collection::vec(arb_rule(), 0..6),
        port in 1u16..=65535,
        probes in prop::collection::vec(any::<u128>(), 16),
    ) {
        let policy = ExitPolicy::new(rules);
        // If a probe address is allowed, the port is allowed somewhere.
        // Probe the rules' own addresses and random ones.
        let mut addrs: Vec<IpAddr> = Vec::new();
        for r in policy.rules() {
            match r.addr {
                AddrPattern::V4 { addr, .. } => addrs.push(addr.into()),
                AddrPattern::V6 { addr, .. } => addrs.push(addr.into()),
                _ => {}
            }
        }
        for p in probes {
            addrs.push(Ipv6Addr::from(p).into());
            addrs.push(Ipv4Addr::from(p as u32).into());
        }
        if addrs.iter().any(|a| policy.allows(*a, port)) {
            prop_assert!(policy.allows_port_somewhere(port));
        }
    }

    #[test]
    fn parse_never_panics_and_reparses(s in "[acceptrj *46:/\\[\\]0-9a-f.,\n-]{0,60}") {
        if let Ok(p) = ExitPolicy::parse(&s) {
            prop_assert_eq!(ExitPolicy::parse(&p.to_string()).unwrap(), p);
        }
    }
}

/// Every way to write an IPv4 address as an address the exit would
/// connect to: itself, IPv4-mapped and IPv4-compatible IPv6, each parsed
/// from text as a BEGIN or a resolver could give it.
fn forms_of(v4: Ipv4Addr) -> Vec<IpAddr> {
    let [a, b, c, d] = v4.octets();
    let hi = u16::from_be_bytes([a, b]);
    let lo = u16::from_be_bytes([c, d]);
    let texts = [
        v4.to_string(),
        format!("::ffff:{v4}"),
        format!("::ffff:{hi:x}:{lo:x}"),
        format!("0:0:0:0:0:ffff:{hi:x}:{lo:x}"),
        format!("::{v4}"),
        format!("::{hi:x}:{lo:x}"),
    ];
    texts
        .iter()
        .map(|t| t.parse::<IpAddr>().unwrap_or_else(|e| panic!("{t}: {e}")))
        // `::` and `::1` are not IPv4-compatible addresses.
        .filter(|ip| !matches!(ip, IpAddr::V6(v6) if u128::from(*v6) <= 1))
        .collect()
}

proptest! {
    /// No address in a rejected IPv4 range gets through in any of its
    /// forms, and one outside it is treated alike in every form.
    #[test]
    fn mapped_and_compatible_forms_are_judged_as_ipv4(
        net in any::<u32>(),
        bits in 1u8..=32,
        host in any::<u32>(),
        port in 1u16..=65535,
    ) {
        let rejected = AddrPattern::v4(Ipv4Addr::from(net), bits).unwrap();
        let rule = |action, addr| PolicyRule { action, addr, ports: PortRange::ALL };
        let policy = ExitPolicy::new(vec![
            rule(Action::Reject, rejected),
            rule(Action::Accept, AddrPattern::Any),
        ]);
        let mask = if bits == 32 { u32::MAX } else { !(u32::MAX >> bits) };
        let inside = Ipv4Addr::from((net & mask) | (host & !mask));
        for form in forms_of(inside) {
            prop_assert!(!policy.allows(form, port), "{form} passed {policy}");
        }
        let outside = Ipv4Addr::from(u32::from(inside) ^ (1u32 << (32 - bits)));
        let verdicts: Vec<bool> = forms_of(outside).iter().map(|f| policy.allows(*f, port)).collect();
        prop_assert!(verdicts.iter().all(|v| *v), "{outside}: {verdicts:?}");
    }
}

#[test]
fn loopback_in_every_form_is_refused_by_a_loopback_reject() {
    let policy = ExitPolicy::parse("reject 127.0.0.0/8:*, reject [::1]:*, accept *:*").unwrap();
    for text in [
        "127.0.0.1",
        "::ffff:127.0.0.1",
        "::ffff:7f00:1",
        "::127.0.0.1",
        "::7f00:1",
        "::1",
    ] {
        assert!(!policy.allows(ip(text), 80), "{text}");
    }
    // The unspecified and loopback IPv6 addresses stay IPv6.
    assert_eq!(canonical_ip(ip("::1")), ip("::1"));
    assert_eq!(canonical_ip(ip("::")), ip("::"));
    assert_eq!(canonical_ip(ip("::ffff:10.1.2.3")), ip("10.1.2.3"));
    assert!(policy.allows(ip("1.2.3.4"), 80));
}
