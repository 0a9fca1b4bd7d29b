//! A scenario's nodes: its `[[relay]]`, `[[client]]` and `[[server]]`
//! entries, each on a host of the topology.

use std::collections::HashSet;

use toml::Spanned;

use super::raw::{RawClient, RawRelay, RawServer};
use super::{ClientSpec, Ctx, RelaySpec, ServerSpec, DEFAULT_RELAY_BANDWIDTH};
use crate::error::Result;
use crate::matrix;

/// `h` if the topology has that host.
fn known_host(ctx: &Ctx<'_>, hosts: &HashSet<&str>, h: &Spanned<String>) -> Result<String> {
    if hosts.contains(h.get_ref().as_str()) {
        Ok(h.get_ref().clone())
    } else {
        Err(ctx.err(
            h.span(),
            format!("unknown host {:?} (not in the topology)", h.get_ref()),
        ))
    }
}

/// The largest relay `bandwidth` a scenario may give, in KB/s (10 GB/s):
/// far above any relay, small enough that a network's sum cannot overflow.
const MAX_RELAY_BANDWIDTH: u64 = 10_000_000;

/// The `[[relay]]` entries: at least 3, one per host, an exit among them.
pub(super) fn relays(
    ctx: &Ctx<'_>,
    raw: &[RawRelay],
    hosts: &HashSet<&str>,
) -> Result<Vec<RelaySpec>> {
    let mut relays = Vec::new();
    let mut used_hosts = HashSet::new();
    for r in raw {
        let host = known_host(ctx, hosts, &r.host)?;
        if !used_hosts.insert(host.clone()) {
            return Err(ctx.err(r.host.span(), format!("host {host:?} already runs a relay")));
        }
        let bandwidth = match &r.bandwidth {
            None => DEFAULT_RELAY_BANDWIDTH,
            Some(b) if *b.get_ref() == 0 || *b.get_ref() > MAX_RELAY_BANDWIDTH => {
                return Err(ctx.err(
                    b.span(),
                    format!("bandwidth must be 1 to {MAX_RELAY_BANDWIDTH} (KB/s)"),
                ))
            }
            Some(b) => *b.get_ref(),
        };
        relays.push(RelaySpec {
            host,
            guard: r.guard,
            exit: r.exit,
            bandwidth,
        });
    }
    if relays.len() < 3 {
        return Err(ctx.err(0..0, "a scenario needs at least 3 relays ([[relay]])"));
    }
    if !relays.iter().any(|r| r.exit) {
        return Err(ctx.err(0..0, "no relay has exit = true"));
    }
    Ok(relays)
}

/// The `[[client]]` entries: distinct names, each with a pinned path,
/// pinned legs or neither.
pub(super) fn clients(
    ctx: &Ctx<'_>,
    raw: &[RawClient],
    hosts: &HashSet<&str>,
    relays: &[RelaySpec],
) -> Result<Vec<ClientSpec>> {
    let relay_hosts: HashSet<&str> = relays.iter().map(|r| r.host.as_str()).collect();
    let mut clients: Vec<ClientSpec> = Vec::new();
    for c in raw {
        let host = known_host(ctx, hosts, &c.host)?;
        if clients.iter().any(|x| &x.name == c.name.get_ref()) {
            return Err(ctx.err(
                c.name.span(),
                format!("duplicate client name {:?}", c.name.get_ref()),
            ));
        }
        let path = match &c.path {
            None => None,
            Some(p) => Some(pinned_path(ctx, &c.name, p, &relay_hosts)?),
        };
        let paths = match &c.paths {
            None => None,
            Some(_) if path.is_some() => {
                return Err(ctx.err(
                    c.name.span(),
                    "give a client either path or paths (pinned legs), not both",
                ))
            }
            Some(legs) => Some(pinned_legs(ctx, &c.name, legs, &relay_hosts)?),
        };
        clients.push(ClientSpec {
            name: c.name.get_ref().clone(),
            host,
            path,
            paths,
        });
    }
    Ok(clients)
}

/// The `[[server]]` entries: distinct names.
pub(super) fn servers(
    ctx: &Ctx<'_>,
    raw: &[RawServer],
    hosts: &HashSet<&str>,
) -> Result<Vec<ServerSpec>> {
    let mut servers: Vec<ServerSpec> = Vec::new();
    for s in raw {
        let host = known_host(ctx, hosts, &s.host)?;
        if servers.iter().any(|x| &x.name == s.name.get_ref()) {
            return Err(ctx.err(
                s.name.span(),
                format!("duplicate server name {:?}", s.name.get_ref()),
            ));
        }
        servers.push(ServerSpec {
            name: s.name.get_ref().clone(),
            host,
        });
    }
    Ok(servers)
}

/// A client's pinned path: relay hosts, each once, at least one.
fn pinned_path(
    ctx: &Ctx<'_>,
    client: &Spanned<String>,
    hops: &[Spanned<String>],
    relay_hosts: &HashSet<&str>,
) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for hop in hops {
        if !relay_hosts.contains(hop.get_ref().as_str()) {
            return Err(ctx.err(hop.span(), format!("{:?} is not a relay", hop.get_ref())));
        }
        if names.contains(hop.get_ref()) {
            return Err(ctx.err(
                hop.span(),
                format!("{:?} appears twice in the path", hop.get_ref()),
            ));
        }
        names.push(hop.get_ref().clone());
    }
    if names.is_empty() {
        return Err(ctx.err(client.span(), "an empty path; omit `path` for random paths"));
    }
    Ok(names)
}

/// A client's pinned legs: 1 to [`matrix::MAX_LEGS`] paths as [`pinned_path`]
/// checks them, all ending at the same exit.
fn pinned_legs(
    ctx: &Ctx<'_>,
    client: &Spanned<String>,
    legs: &[Vec<Spanned<String>>],
    relay_hosts: &HashSet<&str>,
) -> Result<Vec<Vec<String>>> {
    if legs.is_empty() || legs.len() > matrix::MAX_LEGS {
        return Err(ctx.err(
            client.span(),
            format!(
                "paths: 1 to {} pinned legs, not {}",
                matrix::MAX_LEGS,
                legs.len()
            ),
        ));
    }
    let legs = legs
        .iter()
        .map(|hops| pinned_path(ctx, client, hops, relay_hosts))
        .collect::<Result<Vec<_>>>()?;
    if legs.iter().any(|l| l.last() != legs[0].last()) {
        return Err(ctx.err(
            client.span(),
            "the pinned legs (paths) of a client must all end at the same exit",
        ));
    }
    Ok(legs)
}
