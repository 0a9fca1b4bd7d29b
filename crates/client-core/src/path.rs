//! Path selection: which relays a new circuit goes through.
//!
//! Everything here is a pure function of the network document, the target
//! and a random number generator, so it is tested with a seeded generator.
//!
//! A random path has [`PATH_LEN`] = 3 distinct relays, chosen in tor's
//! order, most constrained first:
//!
//! 1. the **exit**: a relay with the Exit flag whose exit policy allows the
//!    target (for an IP literal, [`ExitPolicy::allows`] on that address and
//!    port; for a host name, which the exit resolves,
//!    [`ExitPolicy::allows_port_somewhere`] on the port);
//! 2. the **guard**: a relay with the Guard flag, other than the exit;
//! 3. the **middle**: any other relay.
//!
//! Only relays with a `tls` address are candidates (the client reaches its
//! guard over TLS, and relays extend to each other by that address). Each
//! choice is random, weighted by the relays' `bandwidth`; when every
//! candidate's bandwidth is 0 (the document's default), the choice is
//! uniform.
//!
//! A multi-path set of `m` legs ([`select_legs`]) has one exit and `m`
//! guards and `m` middles, all distinct, each chosen as above without
//! the relays chosen before it: the legs share only the exit, so no relay
//! but the exit sees more than one leg (seed 004's gotchas). C tor keeps
//! a list of persistent guards and needs at least `m` usable ones in it;
//! here every set chooses its guards afresh.
//!
//! Unlike tor there are no persistent guards, no family or /16
//! restrictions (a lab network runs every relay on one host or subnet) and
//! no position weights (Wgg, Wmd...): the bandwidth is the weight.

use std::fmt;
use std::net::IpAddr;

use onionlab_netdoc::doc::TRANSPORT_TLS;
use onionlab_netdoc::{ExitPolicy, RelayEntry};
use rand::{Rng, RngExt};

/// Hops in a path chosen at random.
pub const PATH_LEN: usize = 3;

/// Where a stream goes: an IP address or a host name, and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// The host.
    pub host: TargetHost,
    /// TCP port.
    pub port: u16,
}

/// The host part of a [`Target`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TargetHost {
    /// An IPv4 or IPv6 literal.
    Ip(IpAddr),
    /// A host name, resolved by the exit.
    Name(String),
}

impl Target {
    /// A target at an IP address.
    pub fn ip(ip: IpAddr, port: u16) -> Self {
        Target {
            host: TargetHost::Ip(ip),
            port,
        }
    }

    /// A target by host name.
    pub fn name(name: impl Into<String>, port: u16) -> Self {
        Target {
            host: TargetHost::Name(name.into()),
            port,
        }
    }

    /// A target from a host name as an application gave it: an IP
    /// literal (IPv6 with or without brackets) becomes an IP target, so the
    /// exit policy check is exact; anything else stays a name.
    pub fn from_host(host: &str, port: u16) -> Self {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        match bare.parse::<IpAddr>() {
            Ok(ip) if bare.len() == host.len() || ip.is_ipv6() => Target::ip(ip, port),
            _ => Target::name(host, port),
        }
    }

    /// Whether an exit with `policy` may carry a stream to this target:
    /// exact for IP literals, "may work" for host names (see the module
    /// docs).
    pub fn allowed_by(&self, policy: &ExitPolicy) -> bool {
        match &self.host {
            TargetHost::Ip(ip) => policy.allows(*ip, self.port),
            TargetHost::Name(_) => policy.allows_port_somewhere(self.port),
        }
    }

    /// The host as a BEGIN message carries it (IPv6 without brackets).
    pub fn host_string(&self) -> String {
        match &self.host {
            TargetHost::Ip(ip) => ip.to_string(),
            TargetHost::Name(n) => n.clone(),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            TargetHost::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            TargetHost::Ip(IpAddr::V4(ip)) => write!(f, "{ip}:{}", self.port),
            TargetHost::Name(n) => write!(f, "{n}:{}", self.port),
        }
    }
}

/// Why no path could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// No relay with the Exit flag (and a `tls` address) allows the target.
    #[error("no exit relay's policy allows {target}")]
    NoExit {
        /// The target, as `host:port`.
        target: String,
    },
    /// No relay with the Guard flag (and a `tls` address) is left once the
    /// exit is chosen.
    #[error("no guard relay is available besides the exit {exit:?}")]
    NoGuard {
        /// The exit chosen.
        exit: String,
    },
    /// A multi-path set needs more distinct relays in one position than
    /// there are.
    #[error("{legs} legs need {legs} distinct {position}s, but {available} are available")]
    TooFewForLegs {
        /// `guard` or `middle`.
        position: &'static str,
        /// Legs asked for.
        legs: usize,
        /// Relays that could take the position.
        available: usize,
    },
    /// No third relay is left for the middle hop.
    #[error("no relay is left for the middle hop besides guard {guard:?} and exit {exit:?}")]
    NoMiddle {
        /// The guard chosen.
        guard: String,
        /// The exit chosen.
        exit: String,
    },
}

/// Whether a relay can be on a path at all: it has a `tls` address.
fn reachable(r: &RelayEntry) -> bool {
    r.address(TRANSPORT_TLS).is_some()
}

/// Choose a random 3-hop path for `target` from `relays`: indexes of the
/// guard, middle and exit, all distinct (see the module docs for the rules).
///
/// # Errors
///
/// [`PathError`] says which position could not be filled.
pub fn select_path<R: Rng + ?Sized>(
    relays: &[RelayEntry],
    target: &Target,
    rng: &mut R,
) -> Result<[usize; PATH_LEN], PathError> {
    select_path_avoiding(relays, target, &[], rng)
}

/// [`select_path`] without the relays (indexes into `relays`) in `avoid`,
/// such as relays that failed a moment ago. The caller decides whether to
/// fall back to [`select_path`] when this finds no path.
///
/// # Errors
///
/// [`PathError`] says which position could not be filled.
pub fn select_path_avoiding<R: Rng + ?Sized>(
    relays: &[RelayEntry],
    target: &Target,
    avoid: &[usize],
    rng: &mut R,
) -> Result<[usize; PATH_LEN], PathError> {
    let legs = select_legs(relays, target, 1, avoid, rng)?;
    Ok(legs[0])
}

/// Paths for a multi-path set of `legs` legs (at least 1) to `target`,
/// without the relays in `avoid`: one exit shared by every leg, and
/// guards and middles all distinct (see the module docs). One leg is
/// [`select_path_avoiding`].
///
/// # Errors
///
/// [`PathError`]: no exit, or too few guards or middles
/// ([`PathError::TooFewForLegs`] when more than one leg was asked for).
pub fn select_legs<R: Rng + ?Sized>(
    relays: &[RelayEntry],
    target: &Target,
    legs: usize,
    avoid: &[usize],
    rng: &mut R,
) -> Result<Vec<[usize; PATH_LEN]>, PathError> {
    let legs = legs.max(1);
    let reachable = |r: &RelayEntry, i: usize| reachable(r) && !avoid.contains(&i);
    let exits: Vec<usize> = (0..relays.len())
        .filter(|&i| {
            let r = &relays[i];
            r.flags.exit && reachable(r, i) && target.allowed_by(&r.exit_policy)
        })
        .collect();
    let exit =
        weighted_choice(&exits, |i| relays[i].bandwidth, rng).ok_or_else(|| PathError::NoExit {
            target: target.to_string(),
        })?;
    let guards: Vec<usize> = (0..relays.len())
        .filter(|&i| i != exit && relays[i].flags.guard && reachable(&relays[i], i))
        .collect();
    let guards = choose_distinct(&guards, legs, relays, rng).map_err(|available| {
        if legs == 1 {
            PathError::NoGuard {
                exit: relays[exit].nickname.clone(),
            }
        } else {
            PathError::TooFewForLegs {
                position: "guard",
                legs,
                available,
            }
        }
    })?;
    let middles: Vec<usize> = (0..relays.len())
        .filter(|&i| i != exit && !guards.contains(&i) && reachable(&relays[i], i))
        .collect();
    let middles = choose_distinct(&middles, legs, relays, rng).map_err(|available| {
        if legs == 1 {
            PathError::NoMiddle {
                guard: relays[guards[0]].nickname.clone(),
                exit: relays[exit].nickname.clone(),
            }
        } else {
            PathError::TooFewForLegs {
                position: "middle",
                legs,
                available,
            }
        }
    })?;
    Ok(guards
        .into_iter()
        .zip(middles)
        .map(|(guard, middle)| [guard, middle, exit])
        .collect())
}

/// `n` distinct relays of `candidates`, each chosen by bandwidth among
/// those not yet chosen; `Err(available)` if there are fewer than `n`.
fn choose_distinct<R: Rng + ?Sized>(
    candidates: &[usize],
    n: usize,
    relays: &[RelayEntry],
    rng: &mut R,
) -> Result<Vec<usize>, usize> {
    if candidates.len() < n {
        return Err(candidates.len());
    }
    let mut left = candidates.to_vec();
    let mut chosen = Vec::with_capacity(n);
    while chosen.len() < n {
        let pick = weighted_choice(&left, |i| relays[i].bandwidth, rng).ok_or(left.len())?;
        left.retain(|&i| i != pick);
        chosen.push(pick);
    }
    Ok(chosen)
}

/// One of `candidates`, with probability proportional to `weight`; uniform
/// if all weights are 0; `None` if there are no candidates.
pub fn weighted_choice<R: Rng + ?Sized>(
    candidates: &[usize],
    weight: impl Fn(usize) -> u64,
    rng: &mut R,
) -> Option<usize> {
    if candidates.is_empty() {
        return None;
    }
    // u128: the sum of many u64 weights cannot overflow it.
    let total: u128 = candidates.iter().map(|&i| u128::from(weight(i))).sum();
    if total == 0 {
        return candidates
            .get(rng.random_range(0..candidates.len()))
            .copied();
    }
    let mut point = rng.random_range(0..total);
    for &i in candidates {
        let w = u128::from(weight(i));
        if point < w {
            return Some(i);
        }
        point -= w;
    }
    // Unreachable: `point < total` is the sum of the weights.
    candidates.last().copied()
}

/// Why a pinned path is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinnedPathError {
    /// The path is empty.
    #[error("a pinned path needs at least one relay")]
    Empty,
    /// A nickname is not in the network document.
    #[error("relay {0:?} is not in the network document")]
    UnknownRelay(String),
    /// A relay appears twice.
    #[error("relay {0:?} appears twice")]
    Repeated(String),
    /// A relay has no `tls` address.
    #[error("relay {0:?} has no tls address")]
    NoTlsAddress(String),
    /// Pinned legs that are not 1 to `MAX_LEGS_PER_SET` paths ending at
    /// the same exit.
    #[error("pinned legs: {0}")]
    BadLegs(String),
}

/// Resolve a pinned path of nicknames (guard first, exit last; compared
/// regardless of case) to relay indexes.
///
/// Any length of at least one is accepted: one hop (the guard is the exit)
/// or two are useful in labs and tests, though they give no anonymity.
/// Flags are not checked (the operator chose the path), but the exit's
/// policy still decides which targets the client sends through it.
///
/// # Errors
///
/// [`PinnedPathError`] for an empty path, an unknown nickname, a repeated
/// relay, or a relay without a `tls` address.
pub fn resolve_pinned(
    relays: &[RelayEntry],
    nicknames: &[String],
) -> Result<Vec<usize>, PinnedPathError> {
    if nicknames.is_empty() {
        return Err(PinnedPathError::Empty);
    }
    let mut path = Vec::with_capacity(nicknames.len());
    for nick in nicknames {
        let i = relays
            .iter()
            .position(|r| r.nickname.eq_ignore_ascii_case(nick))
            .ok_or_else(|| PinnedPathError::UnknownRelay(nick.clone()))?;
        if path.contains(&i) {
            return Err(PinnedPathError::Repeated(relays[i].nickname.clone()));
        }
        if !reachable(&relays[i]) {
            return Err(PinnedPathError::NoTlsAddress(relays[i].nickname.clone()));
        }
        path.push(i);
    }
    Ok(path)
}

/// Nicknames of a path, comma-separated, for logs.
pub fn path_names(relays: &[RelayEntry], path: &[usize]) -> String {
    path.iter()
        .map(|&i| relays.get(i).map_or("?", |r| r.nickname.as_str()))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use onionlab_crypto::identity::RelaySecretKeys;
    use onionlab_netdoc::doc::TransportAddress;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn relay(i: usize, guard: bool, exit: bool, bandwidth: u64, policy: &str) -> RelayEntry {
        let keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(i as u64));
        let mut r = RelayEntry::new(format!("relay{i}"), &keys.public());
        r.addresses.push(TransportAddress {
            transport: TRANSPORT_TLS.into(),
            addr: format!("127.0.0.1:{}", 9000 + i).parse().expect("addr"),
        });
        r.flags.guard = guard;
        r.flags.exit = exit;
        r.bandwidth = bandwidth;
        r.exit_policy = ExitPolicy::parse(policy).expect("policy");
        r
    }

    fn web() -> Target {
        Target::ip("192.0.2.1".parse().expect("ip"), 443)
    }

    #[test]
    fn paths_are_three_distinct_relays_in_the_right_roles() {
        let relays: Vec<RelayEntry> = (0..6)
            .map(|i| relay(i, i % 2 == 0, i >= 3, 100, "accept *:*"))
            .collect();
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..500 {
            let [g, m, e] = select_path(&relays, &web(), &mut rng).expect("path");
            assert!(g != m && m != e && g != e, "{g} {m} {e}");
            assert!(relays[g].flags.guard);
            assert!(relays[e].flags.exit);
        }
    }

    #[test]
    fn avoided_relays_are_never_chosen_and_an_impossible_avoidance_is_an_error() {
        let relays: Vec<RelayEntry> = (0..6)
            .map(|i| relay(i, i % 2 == 0, i >= 3, 100, "accept *:*"))
            .collect();
        let mut rng = StdRng::seed_from_u64(2);
        for _ in 0..500 {
            let p = select_path_avoiding(&relays, &web(), &[1, 4], &mut rng).expect("path");
            assert!(!p.contains(&1) && !p.contains(&4), "{p:?}");
        }
        // Avoiding every exit leaves no path: the caller must decide.
        assert!(matches!(
            select_path_avoiding(&relays, &web(), &[3, 4, 5], &mut rng),
            Err(PathError::NoExit { .. })
        ));
    }

    #[test]
    fn guard_choice_follows_bandwidth() {
        // Guards 0, 1, 2 with weights 1:2:7; relay 3 is the only exit and
        // relay 4 a non-guard that can be the middle.
        let mut relays = vec![
            relay(0, true, false, 100, "reject *:*"),
            relay(1, true, false, 200, "reject *:*"),
            relay(2, true, false, 700, "reject *:*"),
            relay(3, false, true, 50, "accept *:*"),
            relay(4, false, false, 1_000_000, "reject *:*"),
        ];
        let mut rng = StdRng::seed_from_u64(7);
        let n = 20_000;
        let mut counts = [0usize; 5];
        for _ in 0..n {
            let [g, _, e] = select_path(&relays, &web(), &mut rng).expect("path");
            assert_eq!(e, 3);
            counts[g] += 1;
        }
        for (i, want) in [(0, 0.1), (1, 0.2), (2, 0.7)] {
            let got = counts[i] as f64 / n as f64;
            assert!((got - want).abs() < 0.02, "guard {i}: {got} vs {want}");
        }
        // With every bandwidth 0 the choice is uniform.
        for r in &mut relays {
            r.bandwidth = 0;
        }
        let mut counts = [0usize; 5];
        for _ in 0..n {
            let [g, _, _] = select_path(&relays, &web(), &mut rng).expect("path");
            counts[g] += 1;
        }
        for (i, count) in counts.iter().enumerate().take(3) {
            let got = *count as f64 / n as f64;
            assert!((got - 1.0 / 3.0).abs() < 0.02, "guard {i}: {got}");
        }
    }

    #[test]
    fn weighted_choice_edge_cases() {
        let mut rng = StdRng::seed_from_u64(3);
        assert_eq!(weighted_choice(&[], |_| 1, &mut rng), None);
        assert_eq!(weighted_choice(&[4], |_| 0, &mut rng), Some(4));
        // A zero-weight candidate is never chosen when others have weight.
        for _ in 0..1000 {
            assert_eq!(
                weighted_choice(&[1, 2], |i| if i == 1 { 0 } else { 5 }, &mut rng),
                Some(2)
            );
        }
        // Huge weights do not overflow.
        let c = weighted_choice(&[0, 1, 2], |_| u64::MAX, &mut rng);
        assert!(c.is_some());
    }

    #[test]
    fn exit_policy_filters_exits() {
        let relays = vec![
            relay(0, true, false, 100, "reject *:*"),
            relay(1, false, false, 100, "reject *:*"),
            relay(2, false, true, 100, "accept *:80, reject *:*"),
            relay(3, false, true, 100, "accept 10.0.0.0/8:*, reject *:*"),
        ];
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..200 {
            // Port 80 anywhere: only relay 2.
            let t = Target::ip("192.0.2.9".parse().expect("ip"), 80);
            assert_eq!(select_path(&relays, &t, &mut rng).expect("path")[2], 2);
            // 10.1.2.3:22: only relay 3.
            let t = Target::ip("10.1.2.3".parse().expect("ip"), 22);
            assert_eq!(select_path(&relays, &t, &mut rng).expect("path")[2], 3);
            // A host name on port 22: relay 3 may work, relay 2 cannot.
            let t = Target::name("example.com", 22);
            assert_eq!(select_path(&relays, &t, &mut rng).expect("path")[2], 3);
        }
        let t = Target::ip("192.0.2.9".parse().expect("ip"), 22);
        assert_eq!(
            select_path(&relays, &t, &mut rng),
            Err(PathError::NoExit {
                target: "192.0.2.9:22".into()
            })
        );
        let t = Target::ip("2001:db8::1".parse().expect("ip"), 22);
        let err = select_path(&relays, &t, &mut rng).expect_err("no exit");
        assert!(err.to_string().contains("[2001:db8::1]:22"), "{err}");
    }

    #[test]
    fn not_enough_relays_is_a_clear_error() {
        let mut rng = StdRng::seed_from_u64(9);
        // Only one relay, guard and exit at once.
        let one = vec![relay(0, true, true, 1, "accept *:*")];
        assert_eq!(
            select_path(&one, &web(), &mut rng),
            Err(PathError::NoGuard {
                exit: "relay0".into()
            })
        );
        // Two relays: no middle.
        let two = vec![
            relay(0, true, false, 1, "reject *:*"),
            relay(1, false, true, 1, "accept *:*"),
        ];
        let err = select_path(&two, &web(), &mut rng).expect_err("no middle");
        assert_eq!(
            err,
            PathError::NoMiddle {
                guard: "relay0".into(),
                exit: "relay1".into()
            }
        );
        assert!(err.to_string().contains("middle"), "{err}");
        // No exit at all.
        let none = vec![
            relay(0, true, false, 1, "accept *:*"),
            relay(1, true, false, 1, "accept *:*"),
            relay(2, true, false, 1, "accept *:*"),
        ];
        assert!(matches!(
            select_path(&none, &web(), &mut rng),
            Err(PathError::NoExit { .. })
        ));
        // A relay without a tls address is never chosen.
        let mut three = vec![
            relay(0, true, false, 1, "reject *:*"),
            relay(1, false, false, 1, "reject *:*"),
            relay(2, false, true, 1, "accept *:*"),
        ];
        three[1].addresses[0].transport = "quic".into();
        assert!(matches!(
            select_path(&three, &web(), &mut rng),
            Err(PathError::NoMiddle { .. })
        ));
    }

    #[test]
    fn multipath_legs_share_only_the_exit() {
        // Relays 0-3 guards, 4-7 plain, 8-9 exits.
        let relays: Vec<RelayEntry> = (0..10)
            .map(|i| relay(i, i < 4, i >= 8, 100, "accept *:*"))
            .collect();
        let mut rng = StdRng::seed_from_u64(11);
        for legs in 1..=3 {
            for _ in 0..300 {
                let paths = select_legs(&relays, &web(), legs, &[5], &mut rng).expect("legs");
                assert_eq!(paths.len(), legs);
                let exit = paths[0][2];
                assert!(relays[exit].flags.exit);
                let mut seen = std::collections::BTreeSet::new();
                for [g, m, e] in &paths {
                    assert_eq!(*e, exit, "{paths:?}");
                    assert!(relays[*g].flags.guard, "{paths:?}");
                    assert!(
                        seen.insert(*g) && seen.insert(*m),
                        "shared relay: {paths:?}"
                    );
                    assert!(*m != 5 && *g != 5);
                }
            }
        }
        // Four guards: five legs cannot have distinct guards.
        let err = select_legs(&relays, &web(), 5, &[], &mut rng).expect_err("too few guards");
        assert_eq!(
            err,
            PathError::TooFewForLegs {
                position: "guard",
                legs: 5,
                available: 4
            }
        );
        assert!(
            err.to_string()
                .contains("5 legs need 5 distinct guards, but 4 are"),
            "{err}"
        );
        // Four guards leave five middles (one exit, the other among them):
        // four legs fit, and with two relays avoided they do not.
        assert_eq!(
            select_legs(&relays, &web(), 4, &[], &mut rng)
                .expect("four legs")
                .len(),
            4
        );
        assert!(matches!(
            select_legs(&relays, &web(), 4, &[6, 7], &mut rng),
            Err(PathError::TooFewForLegs {
                position: "middle",
                ..
            })
        ));
    }

    #[test]
    fn pinned_paths() {
        let relays: Vec<RelayEntry> = (0..3)
            .map(|i| relay(i, false, false, 0, "reject *:*"))
            .collect();
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            resolve_pinned(&relays, &names(&["relay2", "RELAY0", "relay1"])),
            Ok(vec![2, 0, 1])
        );
        assert_eq!(resolve_pinned(&relays, &names(&["relay1"])), Ok(vec![1]));
        assert_eq!(
            resolve_pinned(&relays, &names(&["relay0", "nobody"])),
            Err(PinnedPathError::UnknownRelay("nobody".into()))
        );
        assert_eq!(
            resolve_pinned(&relays, &names(&["relay0", "relay0"])),
            Err(PinnedPathError::Repeated("relay0".into()))
        );
        assert_eq!(resolve_pinned(&relays, &[]), Err(PinnedPathError::Empty));
        let mut no_tls = relays.clone();
        no_tls[1].addresses[0].transport = "quic".into();
        assert_eq!(
            resolve_pinned(&no_tls, &names(&["relay1"])),
            Err(PinnedPathError::NoTlsAddress("relay1".into()))
        );
        assert_eq!(path_names(&relays, &[2, 0]), "relay2,relay0");
    }

    #[test]
    fn targets_display_and_encode() {
        let t = Target::ip("::1".parse().expect("ip"), 80);
        assert_eq!(t.to_string(), "[::1]:80");
        assert_eq!(t.host_string(), "::1");
        assert_eq!(
            Target::from_host("10.0.0.1", 80),
            Target::ip("10.0.0.1".parse().expect("ip"), 80)
        );
        assert_eq!(
            Target::from_host("[2001:db8::1]", 80),
            Target::ip("2001:db8::1".parse().expect("ip"), 80)
        );
        assert_eq!(
            Target::from_host("2001:db8::1", 80),
            Target::ip("2001:db8::1".parse().expect("ip"), 80)
        );
        assert_eq!(
            Target::from_host("[10.0.0.1]", 80),
            Target::name("[10.0.0.1]", 80)
        );
        assert_eq!(
            Target::from_host("example.com", 80),
            Target::name("example.com", 80)
        );
        let t = Target::name("localhost", 8080);
        assert_eq!(t.to_string(), "localhost:8080");
        assert_eq!(t.host_string(), "localhost");
    }
}
