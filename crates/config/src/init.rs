//! Set up a new network: keys, the signed network document and node
//! configurations, in one directory (`onionlab network init`).
//!
//! Layout of the output directory:
//!
//! ```text
//! network-key.secret         network signing key (hex seed, 0600)
//! network-key.pub            network public key (hex)
//! network.doc                the signed network document
//! client.toml                a client configuration (no pinned path)
//! relays/<nick>/keys.secret  relay secret keys (hex, 0600)
//! relays/<nick>/relay.toml   relay configuration
//! README.txt                 what these files are
//! ```
//!
//! Relays are named `relay0`, `relay1`, ...; relay `i` runs every
//! endpoint kind, each on `host:base_port+i` of its protocol (TLS on
//! that TCP port, QUIC on the same UDP port) and a second endpoint of one
//! protocol `relays` ports further (dtls-utcp on UDP port
//! `base_port+relays+i`, the datagram endpoint on `base_port+2*relays+i`;
//! see
//! [`EndpointAddrs::on_ports`](onionlab_transport::addrs::EndpointAddrs::on_ports)),
//! and advertises all of them (`tls`, `quic`, `utcp`, `dgram`) in the document; its
//! configuration lists them in `[listen]` and leaves `link.transport` at
//! `"auto"`. Configurations are written by serialising
//! [`RelayConfig`] and [`ClientConfig`] values, with only what differs
//! from the defaults.
//! The last `exits` relays get the Exit flag and the policy `accept *:*`;
//! the others `reject *:*`. The non-exit relays get the Guard flag (all
//! relays do if every relay is an exit).
//!
//! Exits refuse private and local targets (see [`onionlab_netdoc::exit_targets`])
//! except those in [`InitOptions::exit_allow_private`], written into their
//! configuration.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use onionlab_crypto::identity::RelaySecretKeys;

use crate::error::{Error, Result};
use crate::{ClientConfig, ConfigFile, NetworkSource, RelayConfig};
use onionlab_netdoc::doc::{
    toml_string, valid_network_name, Flags, NetworkDocument, RelayEntry, TransportAddress,
};
use onionlab_netdoc::exit_targets::PrivateTargets;
use onionlab_netdoc::keys;
use onionlab_netdoc::policy::ExitPolicy;
use onionlab_transport::addrs::EndpointAddrs;
use onionlab_transport::any::IpProtocol;
use onionlab_transport::endpoint::EndpointKind;

/// Options of [`init_network`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitOptions {
    /// Number of relays (at least 1).
    pub relays: usize,
    /// How many of them are exits (at most `relays`).
    pub exits: usize,
    /// Output directory: created if missing, must be empty if present.
    pub out: PathBuf,
    /// Address every node listens on (default 127.0.0.1).
    pub host: IpAddr,
    /// Port of relay 0; relay `i` listens on `base_port + i` (default 9001).
    pub base_port: u16,
    /// Port of the client's SOCKS listener (default 9050).
    pub socks_port: u16,
    /// Network name (default `"onionlab"`; 1-64 of `[A-Za-z0-9._-]`).
    pub network_name: String,
    /// Bandwidth weight of every relay, KB/s (default 1000).
    pub bandwidth: u64,
    /// Creation time written in the document; `None` means now. The
    /// document is valid from then for `lifetime`.
    pub created_unix: Option<u64>,
    /// How long the document is valid (default
    /// [`DEFAULT_LIFETIME`](onionlab_netdoc::doc::DEFAULT_LIFETIME), 30 days).
    pub lifetime: std::time::Duration,
    /// Private or local targets the exits may reach despite rejecting
    /// private addresses (`exit_allow_private` in their `relay.toml`),
    /// such as `127.0.0.1:8000`; default none.
    pub exit_allow_private: PrivateTargets,
    /// Network-wide parameters written in the document (default: fixed
    /// circuit windows).
    pub params: onionlab_netdoc::params::NetworkParams,
}

impl Default for InitOptions {
    /// 3 relays, 1 exit, into `./network`, on 127.0.0.1 ports 9001-9003,
    /// SOCKS on 9050.
    fn default() -> Self {
        InitOptions {
            relays: 3,
            exits: 1,
            out: PathBuf::from("network"),
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            base_port: 9001,
            socks_port: 9050,
            network_name: "onionlab".into(),
            bandwidth: 1000,
            created_unix: None,
            lifetime: onionlab_netdoc::doc::DEFAULT_LIFETIME,
            exit_allow_private: PrivateTargets::none(),
            params: onionlab_netdoc::params::NetworkParams::default(),
        }
    }
}

/// One relay made by [`init_network`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitRelay {
    /// Nickname.
    pub nickname: String,
    /// TLS listen address (TCP); the QUIC endpoint listens on the same
    /// address over UDP.
    pub listen: SocketAddr,
    /// Every endpoint's address, as in its configuration's `[listen]`
    /// and the document.
    pub endpoints: EndpointAddrs,
    /// Has the Guard flag.
    pub guard: bool,
    /// Has the Exit flag (and `accept *:*`).
    pub exit: bool,
    /// Its configuration file.
    pub config: PathBuf,
    /// Its secret keys file.
    pub keys: PathBuf,
}

/// What [`init_network`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitSummary {
    /// The output directory.
    pub out: PathBuf,
    /// The signed network document.
    pub network_doc: PathBuf,
    /// The network secret key file.
    pub network_key_secret: PathBuf,
    /// The network public key file.
    pub network_key_public: PathBuf,
    /// The network public key, hex.
    pub network_key_hex: String,
    /// The client configuration file.
    pub client_config: PathBuf,
    /// The relays, in order.
    pub relays: Vec<InitRelay>,
}

impl fmt::Display for InitSummary {
    /// A few lines for the user: where things are and what to run next.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "network with {} relays written to {}",
            self.relays.len(),
            self.out.display()
        )?;
        writeln!(f, "  network key: {}", self.network_key_hex)?;
        writeln!(f, "  document:    {}", self.network_doc.display())?;
        for r in &self.relays {
            let role = match (r.guard, r.exit) {
                (true, true) => "guard, exit",
                (true, false) => "guard",
                (false, true) => "exit",
                (false, false) => "middle",
            };
            writeln!(
                f,
                "  {:<10} {:<22} {:<12} {}",
                r.nickname,
                r.listen.to_string(),
                role,
                r.config.display()
            )?;
        }
        write!(f, "  client:      {}", self.client_config.display())
    }
}

/// Relay nickname `i`.
fn nickname(i: usize) -> String {
    format!("relay{i}")
}

/// Check `opts`, returning each relay's endpoint addresses.
fn check_options(opts: &InitOptions) -> Result<Vec<EndpointAddrs>> {
    let bad = |m: String| Err(Error::InitOptions(m));
    if opts.relays == 0 {
        return bad("a network needs at least one relay".into());
    }
    if opts.exits > opts.relays {
        return bad(format!(
            "{} exits requested but only {} relays",
            opts.exits, opts.relays
        ));
    }
    if !valid_network_name(&opts.network_name) {
        return bad(format!(
            "network name {:?} must be 1-64 characters of [A-Za-z0-9._-]",
            opts.network_name
        ));
    }
    if opts.host.is_unspecified() || opts.host.is_multicast() {
        return bad(format!(
            "host {} cannot be connected to; give the address clients should use",
            opts.host
        ));
    }
    if opts.base_port == 0 || opts.socks_port == 0 {
        return bad("ports must be 1-65535 (not 0)".into());
    }
    // A second endpoint of one protocol takes the ports after the relays'
    // (see the module docs).
    let kinds = EndpointKind::all();
    let stride = u16::try_from(opts.relays).ok();
    let listen: Option<Vec<EndpointAddrs>> = (0..opts.relays)
        .map(|i| {
            let port = opts.base_port.checked_add(u16::try_from(i).ok()?)?;
            EndpointAddrs::on_ports(opts.host, port, stride?, &kinds)
        })
        .collect();
    let Some(listen) = listen else {
        return bad(format!(
            "{} relays from port {} do not fit below port 65536",
            opts.relays, opts.base_port
        ));
    };
    let tcp_port_taken = listen
        .iter()
        .flat_map(|addrs| addrs.iter())
        .any(|(kind, addr)| kind.protocol() == IpProtocol::Tcp && addr.port() == opts.socks_port);
    if tcp_port_taken {
        return bad(format!(
            "SOCKS port {} is one of the relays' TCP ports (from {} on)",
            opts.socks_port, opts.base_port
        ));
    }
    if i64::try_from(opts.bandwidth).is_err() {
        return bad("bandwidth is above i64::MAX".into());
    }
    if nickname(opts.relays - 1).len() > 19 {
        return bad("too many relays for 19-character nicknames".into());
    }
    Ok(listen)
}

/// Create `out` or check that it is an empty directory.
fn prepare_out_dir(out: &Path) -> Result<()> {
    match std::fs::read_dir(out) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(Error::OutputNotEmpty {
                    path: out.to_path_buf(),
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_dir(out),
        Err(source) => Err(Error::Io {
            op: "read directory",
            path: out.to_path_buf(),
            source,
        }),
    }
}

/// `create_dir_all` with the path in the error.
fn create_dir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|source| Error::Io {
        op: "create directory",
        path: path.to_path_buf(),
        source,
    })
}

/// Write a new, world-readable text file.
fn write_text(path: &Path, text: &str) -> Result<()> {
    Ok(keys::write_new_file(path, text.as_bytes(), 0o644)?)
}

/// Create a network in `opts.out`: see the [module documentation](self).
///
/// # Errors
///
/// [`Error::InitOptions`] for inconsistent options (no relays, more exits
/// than relays, ports that do not fit or collide, bad name or host),
/// [`Error::OutputNotEmpty`] if the directory has files, [`Error::Io`] if a
/// file cannot be written (files written before stay).
pub fn init_network<R: rand::Rng + rand::CryptoRng>(
    opts: &InitOptions,
    rng: &mut R,
) -> Result<InitSummary> {
    let listen = check_options(opts)?;
    prepare_out_dir(&opts.out)?;
    let out = &opts.out;

    let network_key = keys::generate_network_key(rng);
    let public = network_key.verifying_key();
    let key_hex = keys::public_key_hex(&public);
    let network_key_secret = out.join("network-key.secret");
    let network_key_public = out.join("network-key.pub");
    keys::save_network_key(&network_key_secret, &network_key)?;
    keys::save_network_public_key(&network_key_public, &public)?;

    let created_unix = opts.created_unix.unwrap_or_else(crate::unix_now);
    let first_exit = opts.relays - opts.exits;
    let mut entries = Vec::with_capacity(opts.relays);
    let mut relays = Vec::with_capacity(opts.relays);
    let relays_dir = out.join("relays");
    for (i, endpoints) in listen.into_iter().enumerate() {
        let addr = endpoints
            .get(EndpointKind::TCP)
            .expect("every endpoint kind has an address");
        let nick = nickname(i);
        let exit = i >= first_exit;
        let guard = !exit || opts.exits == opts.relays;
        let dir = relays_dir.join(&nick);
        create_dir(&dir)?;
        let secret = RelaySecretKeys::generate(rng);
        let keys_path = dir.join("keys.secret");
        keys::save_relay_keys(&keys_path, &secret)?;
        let config = dir.join("relay.toml");
        let allow = exit.then_some(&opts.exit_allow_private);
        write_text(&config, &relay_toml(&nick, &endpoints, &key_hex, allow)?)?;

        let mut entry = RelayEntry::new(nick.clone(), &secret.public());
        for (kind, addr) in endpoints.iter() {
            entry.addresses.push(TransportAddress {
                transport: kind.doc_name().into(),
                addr,
            });
        }
        // A relay with a datagram address can run MORE: its Sphinx key.
        if entry.address(EndpointKind::DGRAM.doc_name()).is_some() {
            entry.sphinx_key = Some(secret.sphinx_public());
        }
        entry.flags = Flags { guard, exit };
        entry.bandwidth = opts.bandwidth;
        entry.exit_policy = if exit {
            ExitPolicy::accept_all()
        } else {
            ExitPolicy::reject_all()
        };
        entries.push(entry);
        relays.push(InitRelay {
            nickname: nick,
            listen: addr,
            endpoints,
            guard,
            exit,
            config,
            keys: keys_path,
        });
    }

    let (created_unix, valid_after_unix, valid_until_unix) =
        NetworkDocument::window(created_unix, opts.lifetime);
    let doc = NetworkDocument {
        network_name: opts.network_name.clone(),
        created_unix,
        valid_after_unix,
        valid_until_unix,
        params: opts.params,
        relays: entries,
    };
    doc.validate()?;
    let network_doc = out.join("network.doc");
    write_text(&network_doc, &doc.to_signed_text(&network_key))?;

    let socks = SocketAddr::new(opts.host, opts.socks_port);
    let client_config = out.join("client.toml");
    write_text(&client_config, &client_toml(socks, &key_hex, &relays)?)?;
    write_text(&out.join("README.txt"), &readme(opts, &relays))?;

    Ok(InitSummary {
        out: out.clone(),
        network_doc,
        network_key_secret,
        network_key_public,
        network_key_hex: key_hex,
        client_config,
        relays,
    })
}

/// The registered transports' names, quoted, for comments.
fn transport_names() -> String {
    let names: Vec<String> = onionlab_transport::TransportKind::names()
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect();
    names.join(", ")
}

/// The `relay.toml` of one relay; `exit_allow_private` for an exit.
fn relay_toml(
    nick: &str,
    listen: &EndpointAddrs,
    key_hex: &str,
    exit_allow_private: Option<&PrivateTargets>,
) -> Result<String> {
    let network = NetworkSource::File(PathBuf::from("../../network.doc"));
    let tls = listen
        .get(EndpointKind::TCP)
        .expect("every endpoint kind has an address");
    let mut cfg = RelayConfig::new(nick, PathBuf::from("keys.secret"), tls, network, key_hex)?;
    cfg.listen = listen.clone();
    if let Some(allow) = exit_allow_private {
        cfg.exit_allow_private = allow.clone();
    }
    let exit_note = if exit_allow_private.is_some() {
        "\n\
# As an exit it refuses private, loopback and link-local addresses and this
# host's own addresses whatever the exit policy says (the relays' OR ports
# are refused either way), except those in exit_allow_private (ADDR:PORT,
# for example [\"127.0.0.1:8000\"]; `network init --allow-private-target`).
"
    } else {
        ""
    };
    Ok(format!(
        "\
# onionlab relay configuration, written by `onionlab network init`.
# Relative paths are relative to this file's directory.
#
# keys: the secret identity (Ed25519) and ntor onion (x25519) keys; keep
# them private. network: the signed network document, a file or a
# directory URL such as \"http://127.0.0.1:7000/network.doc\"; it must be
# signed with network_key. [listen]: where the endpoints listen, by the
# document's names: tls (TCP: TLS, pctcp, torchestra), quic, utcp and
# dgram (UDP: QUIC, dtls-utcp, datagram circuits); remove quic, utcp or
# dgram to run without it.
#
# Every other setting is at its default and left out. docs/settings.md
# lists each with its C tor counterpart: the circuit scheduler, queue
# memory, timeouts, denial-of-service limits, exit rules, and the [link]
# section, which says how links are made (`transport`: \"auto\", QUIC when
# the peer advertises it, else or on failure TLS; or one transport without
# fallback: {transports}).
{exit_note}
{body}",
        transports = transport_names(),
        body = cfg.to_toml()?,
    ))
}

/// The `client.toml`.
fn client_toml(socks: SocketAddr, key_hex: &str, relays: &[InitRelay]) -> Result<String> {
    // An example pinned path for the comment: first guard, a middle, last
    // exit, when there are enough relays.
    let example: Vec<String> = match relays {
        [first, .., last] if relays.len() >= 3 => {
            vec![
                first.nickname.clone(),
                relays[1].nickname.clone(),
                last.nickname.clone(),
            ]
        }
        _ => relays.iter().map(|r| r.nickname.clone()).collect(),
    };
    let example: Vec<String> = example.iter().map(|n| toml_string(n)).collect();
    let network = NetworkSource::File(PathBuf::from("network.doc"));
    let cfg = ClientConfig::new(socks, network, key_hex)?;
    Ok(format!(
        "\
# onionlab client configuration, written by `onionlab network init`.
# Relative paths are relative to this file's directory.
#
# socks_listen: the SOCKS5 listener for applications. network: the signed
# network document, a file or a directory URL such as
# \"http://127.0.0.1:7000/network.doc\"; it must be signed with network_key.
#
# Every other setting is at its default and left out. docs/settings.md
# lists each with its C tor counterpart, for example:
# path = [{example}]
#   pins every circuit to these relays, guard first, exit last;
# legs = 2
#   multi-path (docs/conflux.md), when the network document has cfx_enabled
#   (`network init --conflux`): circuits per linked set, 1 to 8; also
#   leg_scheduler and paths (pinned legs ending at one exit);
# circuit_build_timeout_ms, max_circuit_dirtiness_s, build_retries,
# stream_connect_timeout_ms, stream_retries, network_refresh_s, log;
# [link] transport = \"auto\" (or {transports}) and the transports' sections.

{body}",
        example = example.join(", "),
        transports = transport_names(),
        body = cfg.to_toml()?,
    ))
}

/// The `README.txt`.
fn readme(opts: &InitOptions, relays: &[InitRelay]) -> String {
    let exits: Vec<&str> = relays
        .iter()
        .filter(|r| r.exit)
        .map(|r| r.nickname.as_str())
        .collect();
    let guards: Vec<&str> = relays
        .iter()
        .filter(|r| r.guard)
        .map(|r| r.nickname.as_str())
        .collect();
    format!(
        "\
onionlab network \"{name}\" ({n} relays), written by `onionlab network init`.

network-key.secret   Network signing key (hex Ed25519 seed). Secret: whoever
                     holds it can sign network documents. Mode 0600.
network-key.pub      Network public key (hex). Nodes check the document's
                     signature against it (the network_key of every config).
network.doc          The signed network document: TOML listing every relay
                     (nickname, identity and onion keys, addresses, flags,
                     bandwidth, exit policy), then a line
                     `signature ed25519 <hex>`. Editing it breaks the
                     signature; make a new network instead.
client.toml          Client configuration (SOCKS5 on {socks}).
relays/<nick>/keys.secret
                     Relay identity and onion secret keys (hex). Mode 0600.
relays/<nick>/relay.toml
                     Relay configuration.

Relays listen on {host} ports {first}-{last} (relay i on port {first}+i),
TLS on the TCP port and QUIC on the same UDP port, dtls-utcp on the UDP
port {n} further, datagram circuits {n} further again; the document
advertises all four.
Guards: {guards}
Exits:  {exits}
Exits have the policy `accept *:*` but, like tor's exits, refuse private,
loopback and link-local addresses, their own addresses and the relays' OR
ports; targets listed in `exit_allow_private` of their relay.toml (see
`onionlab network init --allow-private-target`) are allowed anyway.

Nodes may read network.doc directly, or fetch it from a directory serving it
over HTTP: point `network` at http://HOST:PORT/network.doc.
",
        name = opts.network_name,
        n = relays.len(),
        socks = SocketAddr::new(opts.host, opts.socks_port),
        host = opts.host,
        first = opts.base_port,
        last = u64::from(opts.base_port) + relays.len() as u64 - 1,
        guards = if guards.is_empty() {
            "none".into()
        } else {
            guards.join(", ")
        },
        exits = if exits.is_empty() {
            "none".into()
        } else {
            exits.join(", ")
        },
    )
}
