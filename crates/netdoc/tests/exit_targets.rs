//! What an exit refuses before its policy: private and local addresses in
//! every textual and mapped form, the relays' OR ports, its own addresses;
//! and the operator's opt-in list.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_netdoc::exit_targets::{
    is_private_or_local, ExitTargets, PrivateTargets, TargetRefusal,
};
use onionlab_netdoc::{ExitPolicy, NetworkDocument, RelayEntry, TransportAddress};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// A document with one relay at 198.51.100.7:9001 (TLS) and :9002 (QUIC).
fn doc() -> NetworkDocument {
    let keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(1));
    let mut r = RelayEntry::new("relay0", &keys.public());
    for (transport, addr) in [("tls", "198.51.100.7:9001"), ("quic", "198.51.100.7:9002")] {
        r.addresses.push(TransportAddress {
            transport: transport.into(),
            addr: sa(addr),
        });
    }
    NetworkDocument {
        network_name: "t".into(),
        created_unix: 0,
        valid_after_unix: 0,
        valid_until_unix: 86_400,
        params: Default::default(),
        relays: vec![r],
    }
}

fn targets(reject_private: bool, allow: &[&str]) -> ExitTargets {
    ExitTargets::new(
        ExitPolicy::accept_all(),
        reject_private,
        PrivateTargets::parse(allow).expect("allow list"),
        &doc(),
        [
            IpAddr::V4(Ipv4Addr::new(203, 0, 113, 5)),
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        ],
    )
}

#[test]
fn local_targets_are_refused_in_every_form() {
    let t = targets(true, &[]);
    for addr in [
        "127.0.0.1:80",
        "[::ffff:127.0.0.1]:80",
        "[::ffff:7f00:1]:80",
        "[::7f00:1]:80",
        "[::1]:80",
        "[::]:80",
        "0.0.0.0:80",
        "10.1.2.3:80",
        "172.31.255.255:80",
        "192.168.0.1:80",
        "169.254.1.1:80",
        "100.64.0.1:80",
        "224.0.0.1:80",
        "255.255.255.255:80",
        "[fe80::1]:80",
        "[fd00::1]:80",
        "[fec0::1]:80",
        "[ff02::1]:80",
    ] {
        assert_eq!(
            t.check(sa(addr)),
            Err(TargetRefusal::PrivateAddress),
            "{addr}"
        );
    }
    // Public addresses pass.
    for addr in ["8.8.8.8:53", "[2001:db8::1]:443", "[::ffff:8.8.8.8]:53"] {
        assert_eq!(t.check(sa(addr)), Ok(()), "{addr}");
    }
}

#[test]
fn relays_or_ports_are_refused_even_when_private_targets_are_allowed() {
    for t in [targets(true, &[]), targets(false, &["198.51.100.7:*"])] {
        assert_eq!(
            t.check(sa("198.51.100.7:9001")),
            Err(TargetRefusal::RelayAddress)
        );
        assert_eq!(
            t.check(sa("[::ffff:198.51.100.7]:9002")),
            Err(TargetRefusal::RelayAddress)
        );
        // Another port of the relay's host is not an OR port.
        assert_eq!(t.check(sa("198.51.100.7:80")), Ok(()));
    }
}

#[test]
fn own_addresses_are_refused_unless_listed() {
    let t = targets(true, &[]);
    assert_eq!(
        t.check(sa("203.0.113.5:22")),
        Err(TargetRefusal::OwnAddress)
    );
    let t = targets(true, &["203.0.113.5:8000"]);
    assert_eq!(t.check(sa("203.0.113.5:8000")), Ok(()));
    assert_eq!(
        t.check(sa("203.0.113.5:22")),
        Err(TargetRefusal::OwnAddress)
    );
    // An unspecified listening address adds nothing.
    assert_eq!(t.check(sa("8.8.8.8:80")), Ok(()));
}

#[test]
fn the_opt_in_list_allows_exactly_its_entries_and_the_policy_still_applies() {
    let t = targets(true, &["127.0.0.2:*", "10.77.0.9:8000"]);
    assert_eq!(t.check(sa("127.0.0.2:4567")), Ok(()));
    assert_eq!(t.check(sa("[::ffff:127.0.0.2]:4567")), Ok(()));
    assert_eq!(t.check(sa("10.77.0.9:8000")), Ok(()));
    assert_eq!(
        t.check(sa("10.77.0.9:8001")),
        Err(TargetRefusal::PrivateAddress)
    );
    assert_eq!(
        t.check(sa("127.0.0.1:4567")),
        Err(TargetRefusal::PrivateAddress)
    );
    let strict = ExitTargets::new(
        ExitPolicy::parse("accept *:80").expect("policy"),
        true,
        PrivateTargets::parse(&["127.0.0.2:*"]).expect("list"),
        &doc(),
        [],
    );
    assert_eq!(strict.check(sa("127.0.0.2:80")), Ok(()));
    assert_eq!(strict.check(sa("127.0.0.2:81")), Err(TargetRefusal::Policy));
}

#[test]
fn without_reject_private_only_relays_and_the_policy_decide() {
    let t = targets(false, &[]);
    assert_eq!(t.check(sa("127.0.0.1:80")), Ok(()));
    assert_eq!(t.check(sa("203.0.113.5:22")), Ok(()));
}

#[test]
fn the_opt_in_list_parses_and_prints_like_policy_rules() {
    let list =
        PrivateTargets::parse(&["127.0.0.1:8000", " [::1]:80-90 ", "10.0.0.0/8:*"]).expect("valid");
    assert_eq!(
        list.to_string(),
        r#"["127.0.0.1:8000", "[::1]:80-90", "10.0.0.0/8:*"]"#
    );
    for bad in ["127.0.0.1", "accept 127.0.0.1:80", "127.0.0.1:0", "host:80"] {
        assert!(PrivateTargets::parse(&[bad]).is_err(), "{bad}");
    }
    #[derive(serde::Deserialize)]
    struct W {
        allow: PrivateTargets,
    }
    let w: W = toml::from_str(r#"allow = ["127.0.0.1:8000"]"#).expect("toml");
    assert!(w.allow.contains(sa("127.0.0.1:8000")));
    assert!(toml::from_str::<W>(r#"allow = ["nope"]"#).is_err());
}

/// Every textual and mapped form of an IPv4 address: the address, its
/// IPv4-mapped and IPv4-compatible IPv6 forms.
fn forms(v4: Ipv4Addr) -> Vec<IpAddr> {
    let bits = u32::from(v4);
    vec![
        IpAddr::V4(v4),
        IpAddr::V6(v4.to_ipv6_mapped()),
        IpAddr::V6(Ipv6Addr::from(u128::from(bits))),
    ]
}

proptest! {
    /// No address in a private IPv4 range passes in any of its forms,
    /// whatever the policy says; a textual round trip changes nothing.
    #[test]
    fn no_private_address_passes_in_any_form(
        net in prop::sample::select(vec![
            (0x0000_0000u32, 8u8), (0x0a00_0000, 8), (0x6440_0000, 10), (0x7f00_0000, 8),
            (0xa9fe_0000, 16), (0xac10_0000, 12), (0xc0a8_0000, 16), (0xe000_0000, 4),
            (0xf000_0000, 4),
        ]),
        host in any::<u32>(),
        port in 1u16..=65535,
    ) {
        let (base, bits) = net;
        let v4 = Ipv4Addr::from(base | (host >> bits));
        let t = targets(true, &[]);
        for ip in forms(v4) {
            // 0.0.0.0 and 0.0.0.1 in IPv4-compatible form are :: and ::1,
            // which are local IPv6 addresses: refused all the same.
            prop_assert!(is_private_or_local(ip), "{}", ip);
            let addr = SocketAddr::new(ip, port);
            prop_assert!(t.check(addr).is_err(), "{}", addr);
            let reparsed: SocketAddr = addr.to_string().parse().expect("round trip");
            prop_assert!(t.check(reparsed).is_err(), "{}", reparsed);
        }
    }

    /// The same for private IPv6 ranges.
    #[test]
    fn no_private_ipv6_address_passes(
        net in prop::sample::select(vec![
            (0u128, 8u8), (0xfc00u128 << 112, 7), (0xfe80u128 << 112, 10),
            (0xfec0u128 << 112, 10), (0xff00u128 << 112, 8),
        ]),
        host in any::<u128>(),
        port in 1u16..=65535,
    ) {
        let (base, bits) = net;
        let ip = IpAddr::V6(Ipv6Addr::from(base | (host >> bits)));
        let t = targets(true, &[]);
        prop_assert!(t.check(SocketAddr::new(ip, port)).is_err(), "{}", ip);
    }
}
