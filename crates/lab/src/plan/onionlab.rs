//! onionlab's nodes in a plan: each relay's keys and `relay.toml`, each
//! client's `client.toml`, and the signed network document, all made from
//! the variant and the repetition's seed.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use onionlab_config::{ClientConfig, ConfigFile, NetworkSource, RelayConfig};
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_netdoc::exit_targets::PrivateTargets;
use onionlab_netdoc::{ExitPolicy, Flags, NetworkDocument, RelayEntry, TransportAddress};
use onionlab_transport::addrs::EndpointAddrs;
use onionlab_transport::endpoint::EndpointKind;
use onionlab_transport::Choice as TransportChoice;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{address_of, PlanFile, PlanProcess, Program, Ready, Role, RELAY_PORT, SOCKS_PORT};
use crate::error::{Error, Result};
use crate::scenario::{ClientSpec, Scenario};
use crate::variant::Variant;

/// An onionlab network's files and processes: a relay per `[[relay]]`, a
/// client per active `[[client]]`; `servers` are the workload servers'
/// addresses (the exits may reach them).
pub(super) fn network(
    scenario: &Scenario,
    variant: &Variant,
    seed: u64,
    now_unix: u64,
    servers: &[SocketAddr],
) -> Result<(Vec<PlanFile>, Vec<PlanProcess>)> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x005e_ed0f_ce11);
    let network_key = onionlab_netdoc::keys::generate_network_key(&mut rng);
    let network_key_hex = onionlab_netdoc::keys::public_key_hex(&network_key.verifying_key());
    let mut files = Vec::new();
    let mut processes = Vec::new();
    let mut entries = Vec::new();
    for r in &scenario.relays {
        let keys = RelaySecretKeys::generate(&mut rng);
        let addr = SocketAddr::new(
            IpAddr::V4(address_of(&variant.topology, &r.host)?),
            RELAY_PORT,
        );
        let mut e = RelayEntry::new(r.host.clone(), &keys.public());
        e.addresses = relay_addresses(variant.transport, addr);
        // A relay with a datagram address can run MORE: its Sphinx key.
        if e.address(EndpointKind::DGRAM.doc_name()).is_some() {
            e.sphinx_key = Some(keys.sphinx_public());
        }
        e.flags = Flags {
            guard: r.guard,
            exit: r.exit,
        };
        e.bandwidth = r.bandwidth;
        if r.exit {
            e.exit_policy = ExitPolicy::accept_all();
        }
        entries.push(e);
        files.push(PlanFile::secret(
            format!("{}/keys.secret", r.host),
            onionlab_netdoc::keys::relay_keys_text(&keys),
        ));
        let config = relay_config(&r.host, addr, &network_key_hex, variant, servers)?;
        let path = format!("{}/relay.toml", r.host);
        files.push(PlanFile::text(&path, config.to_toml()?));
        processes.push(PlanProcess {
            name: r.host.clone(),
            host: r.host.clone(),
            role: Role::Relay,
            program: Program::Onionlab,
            args: ["--log", "info", "relay", "--config", path.as_str()]
                .map(String::from)
                .to_vec(),
            log: format!("{}.log", r.host),
            ready: Ready::Listening(addr),
        });
    }
    let doc = NetworkDocument {
        network_name: "lab".into(),
        created_unix: now_unix,
        valid_after_unix: now_unix,
        valid_until_unix: now_unix + onionlab_netdoc::DEFAULT_LIFETIME.as_secs(),
        params: network_params(variant),
        relays: entries,
    };
    files.push(PlanFile::text(
        "network.doc",
        doc.to_signed_text(&network_key),
    ));
    // Random paths drawn from the repetition's seed: every variant of one
    // repetition gets the same paths (as long as its clients ask for
    // circuits in the same order), so variants compare on the same paths.
    for (i, c) in variant.active_clients(&scenario.clients).iter().enumerate() {
        let config = client_config(
            c,
            variant,
            &network_key_hex,
            client_path_seed(seed, i),
            scenario.transfer_timeout,
        )?;
        let path = format!("{}/client.toml", c.name);
        files.push(PlanFile::text(&path, config.to_toml()?));
        processes.push(PlanProcess {
            name: c.name.clone(),
            host: c.host.clone(),
            role: Role::Client,
            program: Program::Onionlab,
            args: ["--log", "info", "client", "--config", path.as_str()]
                .map(String::from)
                .to_vec(),
            log: format!("client-{}.log", c.name),
            ready: Ready::Listening(SocketAddr::from(([127, 0, 0, 1], SOCKS_PORT))),
        });
    }
    Ok((files, processes))
}

/// Where a relay on `addr` listens under a variant's transport, and so
/// what it advertises: its TCP endpoint (`tls`) always (EXTEND2 names it,
/// and `wait_ready` checks it), and every endpoint the transport may use,
/// on `addr`'s port of its protocol (each relay is a host of its own; a
/// second endpoint of one protocol would take the next port).
pub fn relay_listen(transport: TransportChoice, addr: SocketAddr) -> EndpointAddrs {
    let mut kinds = vec![EndpointKind::TCP];
    for kind in transport.endpoints() {
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    EndpointAddrs::on_ports(addr.ip(), addr.port(), 1, &kinds)
        .expect("the lab's relay port leaves room for every endpoint")
}

/// The addresses a relay on `addr` advertises in the network document
/// under a variant's transport: where it listens ([`relay_listen`]).
pub fn relay_addresses(transport: TransportChoice, addr: SocketAddr) -> Vec<TransportAddress> {
    relay_listen(transport, addr)
        .iter()
        .map(|(kind, addr)| TransportAddress {
            transport: kind.doc_name().into(),
            addr,
        })
        .collect()
}

/// The network parameters of a variant: its circuit congestion control
/// (checked when the scenario was read), and multi-path sets enabled with
/// its leg scheduler when it asks for more than one leg.
pub fn network_params(variant: &Variant) -> onionlab_netdoc::NetworkParams {
    let mut params =
        onionlab_netdoc::NetworkParams::with_circuit_cc(&variant.circuit_cc).unwrap_or_default();
    params.cfx_enabled = variant.legs > 1;
    params.cfx_scheduler = variant.leg_scheduler;
    params
}

/// A client's paths under a variant of `legs` legs: its first `legs`
/// pinned legs (`paths`) or its pinned path, and `legs` for random legs.
pub fn set_client_paths(cfg: &mut ClientConfig, c: &ClientSpec, legs: usize) {
    match (&c.paths, c.first_path()) {
        (Some(pinned), _) if legs > 1 => {
            cfg.paths = Some(pinned.iter().take(legs).cloned().collect());
        }
        (_, Some(path)) => cfg.path = Some(path.to_vec()),
        (_, None) if legs > 1 => cfg.legs = legs,
        (_, None) => {}
    }
}

/// A relay's configuration for a variant: its endpoints listen where
/// [`relay_listen`] says (`[listen]`). Exits refuse private
/// addresses except `servers`, the workload servers the lab starts
/// (`exit_allow_private`). The scenario's `[relay_settings]` is set over
/// it.
///
/// # Errors
///
/// [`Error::NodeConfig`] for values a relay would refuse (checked when the
/// scenario was read).
pub fn relay_config(
    nickname: &str,
    addr: SocketAddr,
    network_key_hex: &str,
    variant: &Variant,
    servers: &[SocketAddr],
) -> Result<RelayConfig> {
    let network = NetworkSource::File("../network.doc".into());
    let mut cfg = RelayConfig::new(
        nickname,
        "keys.secret".into(),
        addr,
        network,
        network_key_hex,
    )?;
    cfg.scheduler = variant
        .scheduler
        .parse()
        .map_err(|e: onionlab_config::UnknownScheduler| Error::Config(e.to_string()))?;
    cfg.exit_packaging = variant.exit_packaging;
    cfg.listen = relay_listen(variant.transport, addr);
    let allowed: Vec<String> = servers.iter().map(ToString::to_string).collect();
    cfg.exit_allow_private = PrivateTargets::parse(&allowed)?;
    let cfg = cfg.with_overrides(&variant.relay_settings, "[relay_settings]")?;
    let link = variant.link_settings(nickname)?;
    Ok(RelayConfig { link, ..cfg })
}

/// A client's configuration for a variant: SOCKS on the client host's
/// loopback, its paths ([`set_client_paths`]), `path_seed` and
/// circuit build timeout, and its `[link]` ([`Variant::link_settings`]).
///
/// # Errors
///
/// As [`relay_config`].
pub fn client_config(
    c: &ClientSpec,
    variant: &Variant,
    network_key_hex: &str,
    path_seed: u64,
    build_timeout: Duration,
) -> Result<ClientConfig> {
    let socks = SocketAddr::from(([127, 0, 0, 1], SOCKS_PORT));
    let network = NetworkSource::File("../network.doc".into());
    let mut cfg = ClientConfig::new(socks, network, network_key_hex)?;
    cfg.circuit_build_timeout_ms = build_timeout.as_millis().min(60_000) as u64;
    set_client_paths(&mut cfg, c, variant.legs);
    cfg.path_seed = Some(path_seed);
    cfg.link = variant.link_settings(&c.host)?;
    Ok(cfg)
}

/// The `path_seed` of the `index`-th client of a repetition whose seed is
/// `seed` (a different stream per client, the same in every variant);
/// below 2^63, as TOML's integers are signed.
fn client_path_seed(seed: u64, index: usize) -> u64 {
    let mixed =
        (seed ^ 0x9a75_5eed).wrapping_add((index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    mixed & (i64::MAX as u64)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn client_path_seeds_fit_a_client_config_and_differ_per_client() {
        let key = "0".repeat(64);
        for seed in [0, 1002003006, u64::MAX] {
            let seeds: Vec<u64> = (0..16).map(|i| client_path_seed(seed, i)).collect();
            for (i, s) in seeds.iter().enumerate() {
                assert!(!seeds[..i].contains(s), "two clients share {s}");
                let text = format!(
                    "socks_listen = \"127.0.0.1:9050\"\nnetwork = \"n.doc\"\nnetwork_key = \"{key}\"\npath_seed = {s}\n"
                );
                let cfg = onionlab_config::ClientConfig::from_toml_str(
                    &text,
                    "client.toml",
                    Path::new("."),
                )
                .expect("a client config takes the seed");
                assert_eq!(cfg.path_seed, Some(*s));
            }
        }
    }
}
