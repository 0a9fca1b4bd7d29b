//! The QUIC transport (seeds 000 and 001): one QUIC connection per pair of
//! nodes, and one QUIC stream per circuit, so a lost packet delays only the
//! circuit whose stream it carried ([`Ordering::PerCircuit`](crate::Ordering)).
//!
//! Library: quinn (0.11) over rustls, the same TLS 1.3 stack and ring
//! provider as the [`tls`](crate::tls) transport. quinn is the maintained
//! pure-Rust QUIC implementation with tokio integration and pluggable
//! congestion control (Cubic, NewReno, BBR); quiche and s2n-quic would
//! bring a C or a second TLS stack, and neither plugs into rustls' raw
//! public keys as directly.
//!
//! # Identity
//!
//! Exactly as in the TLS transport: the QUIC handshake is TLS 1.3 with
//! raw public keys (RFC 7250) that are the relays' Ed25519 identities.
//! The connecting side refuses a peer whose key is not the one the network
//! document lists ([`Error::WrongIdentity`]); relays prove their identity
//! when they connect, clients stay anonymous. ALPN is [`ALPN`].
//!
//! # Wire layout
//!
//! - **Control stream.** The connecting side opens the connection's first
//!   bidirectional stream and writes a preamble (`OLQ1`, the mode byte,
//!   and a 16-byte link token); the accepting side answers `OLQ1` and its
//!   own token. Both then run tor's VERSIONS/NETINFO handshake
//!   ([`crate::link`]) on it. Afterwards it carries link-level cells
//!   (padding) only; a circuit cell there is a protocol violation.
//! - **Circuit lanes.** The first cell either side sends on a circuit ID
//!   opens a bidirectional stream that starts with the 4-byte circuit ID;
//!   both directions of that circuit then use that stream, and every cell
//!   on it must carry that circuit ID. A lane is mapped by *circuit*, never
//!   by tor stream (seed 000 explains how QuicTor's per-stream mapping
//!   collapsed onto one QUIC stream). Sending or receiving a DESTROY
//!   finishes the lane; a later circuit reusing the ID opens a new stream,
//!   and the receiver reads it only after the old stream's end, so the
//!   old circuit's DESTROY is handed over before the new CREATE2.
//! - **`quic-conn-per-circuit`** ([`Mode::ConnPerCircuit`]): each lane is
//!   its own QUIC connection from the same UDP socket, whose one stream
//!   starts with `OLQL`, the *receiver's* link token and the circuit ID.
//!   Each circuit then also has its own congestion controller, which
//!   separates the two effects of the design: standard QUIC keeps one
//!   congestion window per connection, so stream-per-circuit removes
//!   head-of-line blocking but not the shared window. Lane connections are
//!   authenticated like links, and a relay's must prove the link's
//!   identity. (A circuit ID reused while the old lane's connection is
//!   still draining is not ordered across connections; circuit IDs are
//!   random 31-bit values, so this needs a collision within one round
//!   trip.)
//!
//! One UDP socket per relay serves every peer, for connections it accepts
//! and opens alike. A client has one socket per address family.
//!
//! # Settings that matter for many small streams
//!
//! | setting | value | why |
//! |---|---|---|
//! | concurrent bidirectional streams | [`MAX_LANES`] per connection | one per circuit; a peer cannot open more |
//! | unidirectional streams | 0 | not used |
//! | stream receive window | [`STREAM_WINDOW`] | above tor's circuit window (1000 cells of 514 bytes), so tor's SENDMEs, not QUIC, limit a circuit |
//! | connection receive window | [`CONNECTION_WINDOW`] | bounds what a peer may have in flight to us over all circuits |
//! | send window | [`SEND_WINDOW`] | bounds unacknowledged data quinn buffers per connection |
//! | send fairness | on | streams of equal priority take turns per packet, so one bulk circuit cannot starve light ones |
//! | lane buffer | [`LANE_HIGH_WATER`] | cells wait in the circuit queues, where the scheduler and the memory cap see them |
//! | keep-alive / idle timeout | [`DEFAULT_KEEP_ALIVE`] / [`DEFAULT_IDLE_TIMEOUT`] ([`QuicSettings`]) | idle channels stay open like tor's; a peer that vanished is noticed within the idle timeout |
//! | stateless reset key | derived from the relay's identity key | a relay that restarts resets its peers' old connections at their next packet |
//! | congestion control | [`Congestion`], Cubic by default | quinn's implementations |
//! | UDP socket buffers | [`UDP_SOCKET_BUFFER`](crate::UDP_SOCKET_BUFFER) each way (capped by the kernel) | one socket serves every peer; the kernel's 208 KiB default drops bursts TCP's autotuned buffers absorb |
//! | initial MTU, initial window | [`QuicSettings::initial_mtu`] (1200 by default), [`INITIAL_WINDOW_PACKETS`] packets | as large as TCP's packets and initial window when the path's MTU is known (the lab) |
//!
//! # Dead peers
//!
//! TCP learns of a dead peer from the kernel (a reset, at once, when the
//! process died but its host lives); QUIC over UDP learns nothing of the
//! kind, so two mechanisms stand in for it:
//!
//! - **Keep-alive and idle timeout.** Each side sends a PING after
//!   [`QuicSettings::keep_alive`] without traffic on a connection, and a
//!   link that has received no packet on any of its connections for
//!   [`QuicSettings::idle_timeout`] fails: a peer that vanished is noticed
//!   within that time, and its circuits are destroyed. The check counts
//!   every connection of the link together because, with a connection per
//!   circuit, the connection that carries no circuit can hear nothing for
//!   seconds under a full bottleneck while its siblings are busy; quinn's
//!   own per-connection idle timeout is set well above it (four times, at
//!   least a minute; negotiated, the smaller of both sides'): it ends
//!   connections left without a link, and a connection that heard nothing
//!   for that long even while its siblings did (which ends the link).
//! - **Stateless resets (RFC 9000 section 10.3).** A relay's reset key is
//!   derived from its identity secret key (`relay_endpoint_config`), so the
//!   same relay restarted on the same address answers a packet of a
//!   connection it has forgotten with a reset its peer recognises: the old
//!   connection closes at once and the next circuit opens a new one. A
//!   client's key is random (clients have no lasting identity and nobody
//!   keeps connections to them).
//!
//! # Back-pressure
//!
//! Each lane has its own bounded buffer ([`LANE_HIGH_WATER`]) drained by
//! its own task into its QUIC stream. [`CellWriter::has_room_for`](crate::CellWriter::has_room_for)
//! answers per lane, so a circuit whose stream is blocked (peer flow
//! control, congestion) blocks only itself.
//!
//! Memory per circuit is bounded: its lane buffer (at most twice
//! [`LANE_HIGH_WATER`]: one buffer being written, one filling), and in
//! quinn at most the peer's stream window ([`STREAM_WINDOW`]) of data not
//! yet acknowledged, which tor's circuit window (1000 cells) already keeps
//! lower. The relay reports its lane buffers to the circuit layer
//! (`RelayNode::set_transport_buffered`), so they count toward its
//! `MaxMemInQueues`-style cap. On the receiving side each lane takes
//! quinn's received chunks as they are (no buffer of its own while it
//! waits, a partial cell between reads), and decoded batches wait in a
//! bounded queue for the node; when the queue is full the lanes stop
//! reading and quinn holds their data, up to a stream window each. The
//! reader reports its queue, the partial cells and that window bound for
//! every waiting lane ([`CellReader::buffered_bytes`](crate::CellReader::buffered_bytes)),
//! and the relay counts it too, closing the channels holding the most
//! received data when it is over its cap. Not counted: out-of-order data
//! quinn reassembles for a lane that is being read, at most the windows
//! per connection (as tor does not count the kernel's socket buffers).

pub mod gate;
mod lanes;
mod plain_udp;
pub(crate) mod setup;
pub(crate) mod wire;

/// The pure parsing of the QUIC transport's reads (preambles, lane
/// headers, lane cells), reachable for the fuzz targets (`fuzz/`); not a
/// stable API.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::wire::*;
    /// A lane's cells, parsed as every lane transport's (QUIC's among
    /// them) are.
    pub use crate::lanes::wire::{lane_end, next_lane_cell};
}

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use onionlab_crypto::identity::RelaySecretKeys;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Endpoint, TransportConfig, VarInt};
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tor_llcrypto::pk::ed25519::Ed25519Identity;
use tracing::{debug, info};

use crate::any::AnyLink;
use crate::any::{SettingInfo, TransportInfo};
use crate::endpoint::{Acceptor, BoxFuture, EndpointInfo, EndpointKind, PendingLink};
use crate::link::{self, Role};
use crate::tls::identity;
use crate::SettingError;
use crate::{Error, Link, Ordering, PeerInfo, TransportKind};

use gate::{GateCounters, HandshakeGate, HandshakeLimits, Verdict};

use crate::lanes::{Lane, LinkShared};
use lanes::{LinkSpec, QuicConns, QuicLaneRead};
pub use lanes::{QuicReader, QuicWriter};
use wire::Preamble;

use plain_udp::PlainUdpRuntime;
pub use plain_udp::UdpIo;

/// Settings every QUIC transport reads.
const QUIC_SETTINGS: &[SettingInfo] = &[
    SettingInfo {
        key: "listen.quic",
        default: "none (no QUIC endpoint)",
        about: "relays: UDP address of the QUIC endpoint",
    },
    SettingInfo {
        key: "link.quic.congestion",
        default: "cubic",
        about: "congestion control of every QUIC connection: cubic, newreno or bbr",
    },
    SettingInfo {
        key: "link.quic.initial_mtu",
        default: "1200",
        about: "UDP payload of the first packets",
    },
    SettingInfo {
        key: "link.quic.keep_alive_ms",
        default: "2000",
        about: "PING after this long without traffic",
    },
    SettingInfo {
        key: "link.quic.idle_timeout_ms",
        default: "8000",
        about: "a link that received no packet on any of its connections for this long is closed",
    },
    SettingInfo {
        key: "link.quic.udp_io",
        default: "batched",
        about: "UDP I/O of the QUIC endpoints: batched (quinn's) or plain (one datagram per system call, for the Shadow simulator)",
    },
];

/// The QUIC endpoint: one UDP socket for both QUIC transports, which tell
/// their connections apart by their first stream's preamble.
pub(crate) static ENDPOINT: EndpointInfo = EndpointInfo {
    doc_name: "quic",
    about: "UDP: QUIC connections of both modes",
    protocol: crate::any::IpProtocol::Udp,
};

/// The QUIC endpoint's kind.
pub(crate) const QUIC: EndpointKind = EndpointKind::new(&ENDPOINT);

/// The registry's description of QUIC with a stream per circuit.
pub(crate) static STREAM_PER_CIRCUIT: TransportInfo = TransportInfo {
    name: "quic",
    about: "one QUIC connection per relay pair, one stream per circuit (seeds 000, 001)",
    ordering: Ordering::PerCircuit,
    endpoint: QUIC,
    settings: QUIC_SETTINGS,
    open: |endpoints, addr, expected| {
        Box::pin(open_link(endpoints, addr, expected, Mode::StreamPerCircuit))
    },
};

/// The registry's description of QUIC with a connection per circuit.
pub(crate) static CONN_PER_CIRCUIT: TransportInfo = TransportInfo {
    name: "quic-conn-per-circuit",
    about:
        "one QUIC connection per circuit over one UDP socket (own congestion window per circuit)",
    ordering: Ordering::PerCircuit,
    endpoint: QUIC,
    settings: QUIC_SETTINGS,
    open: |endpoints, addr, expected| {
        Box::pin(open_link(endpoints, addr, expected, Mode::ConnPerCircuit))
    },
};

async fn open_link(
    endpoints: &crate::endpoint::Endpoints,
    addr: SocketAddr,
    expected: Ed25519Identity,
    mode: Mode,
) -> Result<AnyLink, Error> {
    let quic: &QuicTransport = endpoints.get(QUIC, mode.kind().name())?;
    let link = quic.connect_mode(addr, expected, mode).await?;
    Ok(AnyLink::erase(mode.kind(), link))
}

/// An open QUIC link.
pub type QuicLink = Link<QuicReader, QuicWriter>;

/// ALPN protocol name of onionlab's QUIC links.
pub const ALPN: &[u8] = b"onionlab-quic/1";

/// Most concurrent circuit lanes (bidirectional streams) per connection.
pub const MAX_LANES: u32 = 1024;
/// Per-stream receive window (bytes).
pub const STREAM_WINDOW: u32 = 768 * 1024;
/// Per-connection receive window (bytes).
pub const CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
/// Per-connection send window (bytes).
pub const SEND_WINDOW: u64 = 8 * 1024 * 1024;
/// Bytes of encoded cells a lane buffers before it reports no room (the
/// same bound as every lane transport's).
pub use crate::lanes::LANE_HIGH_WATER;
/// Default bound on the QUIC and link handshakes.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default interval of keep-alive PINGs on a connection without traffic.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(2);
/// Default idle timeout: a link that received nothing for this long is
/// closed (its peer is taken for dead).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(8);
/// Largest idle timeout QUIC can carry (milliseconds in a variable-length
/// integer); also a sane upper bound for a setting.
const MAX_IDLE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Context of the stateless reset key derivation.
const RESET_KEY_CONTEXT: &[u8] = b"onionlab quic stateless reset key v1";
/// Context of the connection ID check key derivation.
const CID_KEY_CONTEXT: &[u8] = b"onionlab quic connection id key v1";

/// Preamble magic of a link's control stream.
const LINK_MAGIC: &[u8; 4] = b"OLQ1";
/// Preamble magic of a lane connection (conn-per-circuit mode).
const LANE_MAGIC: &[u8; 4] = b"OLQL";
/// Length of a link token.
const TOKEN_LEN: usize = 16;
/// Handshakes being completed by a relay's acceptor, at most.
const MAX_PENDING_LINKS: usize = 64;

/// How circuits are mapped onto QUIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// One connection per node pair, one stream per circuit.
    #[default]
    StreamPerCircuit,
    /// One connection per circuit (each with one stream), over the same
    /// UDP socket.
    ConnPerCircuit,
}

impl Mode {
    /// The registered transport of this mode.
    pub fn kind(self) -> TransportKind {
        match self {
            Mode::StreamPerCircuit => TransportKind::of(&STREAM_PER_CIRCUIT),
            Mode::ConnPerCircuit => TransportKind::of(&CONN_PER_CIRCUIT),
        }
    }

    fn byte(self) -> u8 {
        match self {
            Mode::StreamPerCircuit => 0,
            Mode::ConnPerCircuit => 1,
        }
    }

    fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(Mode::StreamPerCircuit),
            1 => Some(Mode::ConnPerCircuit),
            _ => None,
        }
    }
}

/// QUIC congestion controllers (quinn's implementations); in
/// configuration files `"cubic"`, `"newreno"` or `"bbr"`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Congestion {
    /// CUBIC (RFC 9438), quinn's default.
    #[default]
    Cubic,
    /// NewReno (RFC 9002).
    NewReno,
    /// BBR (quinn's experimental BBRv1).
    Bbr,
}

impl Congestion {
    /// Every algorithm, in the order of the documentation.
    pub const ALL: [Congestion; 3] = [Congestion::Cubic, Congestion::NewReno, Congestion::Bbr];

    /// The configuration name.
    pub fn name(self) -> &'static str {
        match self {
            Congestion::Cubic => "cubic",
            Congestion::NewReno => "newreno",
            Congestion::Bbr => "bbr",
        }
    }

    /// Parse the configuration name (`cubic`, `newreno`, `bbr`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The Linux TCP congestion control that matches this one, so that a
    /// comparison of TCP and QUIC compares transports, not algorithms:
    /// `cubic`, `reno` (Linux's NewReno), `bbr` (which BBR version each
    /// side implements is in docs/settings.md).
    pub fn tcp_match(self) -> &'static str {
        match self {
            Congestion::Cubic => "cubic",
            Congestion::NewReno => "reno",
            Congestion::Bbr => "bbr",
        }
    }
}

impl fmt::Display for Congestion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Congestion {
    type Err = SettingError;

    /// The configuration name; the error lists the valid ones.
    fn from_str(s: &str) -> Result<Self, SettingError> {
        Self::from_name(s).ok_or_else(|| {
            let names: Vec<String> = Self::ALL
                .iter()
                .map(|c| format!("{:?}", c.name()))
                .collect();
            SettingError::UnknownName {
                setting: "congestion control",
                value: s.to_string(),
                expected: format!("one of {}", names.join(", ")),
            }
        })
    }
}

/// Settings of a QUIC transport. It is also the `[link.quic]` section of
/// relay and client configuration files (`congestion`, `keep_alive_ms`,
/// `idle_timeout_ms`, `initial_mtu`; the rest is set by the node).
#[serde_with::serde_as]
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuicSettings {
    /// How circuits map onto QUIC for the links opened with
    /// [`Transport::connect`](crate::Transport::connect) (the registry's
    /// transports choose their mode themselves; the accepting side
    /// follows the opener).
    #[serde(skip)]
    pub mode: Mode,
    /// Congestion controller of every connection this node opens or
    /// accepts.
    pub congestion: Congestion,
    /// Bound on the QUIC plus link handshake (a node sets it from
    /// [`LinkSettings::handshake_timeout`](crate::LinkSettings::handshake_timeout)).
    #[serde(skip)]
    pub handshake_timeout: Duration,
    /// A PING is sent after this long without sending anything.
    #[serde(rename = "keep_alive_ms")]
    #[serde_as(as = "serde_with::DurationMilliSeconds<u64>")]
    pub keep_alive: Duration,
    /// A link that received no packet on any of its connections for this
    /// long is closed (each side applies its own; quinn's per-connection
    /// timer is set far above it, see `backstop_idle_timeout`).
    #[serde(rename = "idle_timeout_ms")]
    #[serde_as(as = "serde_with::DurationMilliSeconds<u64>")]
    pub idle_timeout: Duration,
    /// What a relay accepts before any cryptography ([`gate`]; a relay sets
    /// its Retry rate from `dos_quic_retry_rate`).
    #[serde(skip)]
    pub handshakes: HandshakeLimits,
    /// UDP payload of the first packets, before MTU discovery
    /// ([`DEFAULT_INITIAL_MTU`], QUIC's safe minimum; the lab sets its
    /// links' MTU less the IPv4 and UDP headers, so that QUIC packets are
    /// as large as TCP's from the start). The initial congestion window is
    /// [`INITIAL_WINDOW_PACKETS`] of these.
    pub initial_mtu: u16,
    /// The endpoints' UDP I/O: quinn's own, or one plain system call per
    /// datagram for the Shadow simulator ([`UdpIo`]; the lab's Shadow
    /// engine sets `plain`).
    #[serde(default)]
    pub udp_io: UdpIo,
}

/// Default [`QuicSettings::initial_mtu`]: 1200 bytes, the least every
/// QUIC path carries (RFC 9000 section 14).
pub const DEFAULT_INITIAL_MTU: u16 = 1200;
/// Largest [`QuicSettings::initial_mtu`]: a 9000-byte jumbo frame less the
/// IPv4 and UDP headers.
pub const MAX_INITIAL_MTU: u16 = 9000 - 28;

/// The [`QuicSettings::initial_mtu`] that fills a link of `mtu` bytes
/// (less the IPv4 and UDP headers, 28 bytes), within what QUIC accepts:
/// QUIC's first packets then are as large as TCP's first segments.
pub fn initial_mtu_for_link(mtu: u32) -> u16 {
    let payload = mtu.saturating_sub(28);
    u16::try_from(payload)
        .unwrap_or(u16::MAX)
        .clamp(DEFAULT_INITIAL_MTU, MAX_INITIAL_MTU)
}
/// Initial congestion window in packets of the initial MTU: 10, as Linux
/// TCP's initial window is 10 segments (RFC 6928).
pub const INITIAL_WINDOW_PACKETS: u64 = 10;

impl Default for QuicSettings {
    fn default() -> Self {
        QuicSettings {
            mode: Mode::StreamPerCircuit,
            congestion: Congestion::Cubic,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            keep_alive: DEFAULT_KEEP_ALIVE,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            handshakes: HandshakeLimits::default(),
            initial_mtu: DEFAULT_INITIAL_MTU,
            udp_io: UdpIo::Batched,
        }
    }
}

/// The quinn runtime for endpoints doing their UDP I/O as `io` says
/// (inside a tokio runtime).
fn quinn_runtime(io: UdpIo) -> std::io::Result<Arc<dyn quinn::Runtime>> {
    match io {
        UdpIo::Batched => {
            quinn::default_runtime().ok_or_else(|| std::io::Error::other("no async runtime"))
        }
        UdpIo::Plain => Ok(Arc::new(PlainUdpRuntime)),
    }
}

impl QuicSettings {
    /// Check the timers: all positive, the keep-alive shorter than the
    /// idle timeout (or every quiet connection would die), the idle timeout
    /// at most a day.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the offending setting.
    pub fn validate(&self) -> Result<(), Error> {
        if self.handshake_timeout.is_zero() {
            return Err(Error::Config(
                "QUIC handshake timeout must be positive".into(),
            ));
        }
        if self.keep_alive.is_zero() || self.idle_timeout.is_zero() {
            return Err(Error::Config(
                "QUIC keep-alive and idle timeout must be positive".into(),
            ));
        }
        if self.keep_alive >= self.idle_timeout {
            return Err(Error::Config(format!(
                "QUIC keep-alive ({:?}) must be shorter than the idle timeout ({:?})",
                self.keep_alive, self.idle_timeout
            )));
        }
        if self.idle_timeout > MAX_IDLE_TIMEOUT {
            return Err(Error::Config(format!(
                "QUIC idle timeout ({:?}) above the limit of {MAX_IDLE_TIMEOUT:?}",
                self.idle_timeout
            )));
        }
        self.handshakes
            .validate()
            .map_err(|e| Error::Config(e.to_string()))?;
        if !(DEFAULT_INITIAL_MTU..=MAX_INITIAL_MTU).contains(&self.initial_mtu) {
            return Err(Error::Config(format!(
                "QUIC initial MTU {} outside {DEFAULT_INITIAL_MTU}..={MAX_INITIAL_MTU}",
                self.initial_mtu
            )));
        }
        Ok(())
    }
}

/// The endpoint configuration of a relay: its stateless reset key is
/// HMAC-SHA256 keyed with HMAC-SHA256(identity seed, [`RESET_KEY_CONTEXT`]),
/// and its connection IDs carry a check value keyed from the same
/// derivation, so the same relay restarted recognises its former
/// connection IDs (quinn drops packets whose IDs fail the check before it
/// considers a reset) and sends the reset tokens its peers already hold.
/// The key is secret, stable across restarts, and the tokens a peer
/// learns reveal nothing about the identity key.
fn relay_endpoint_config(keys: &RelaySecretKeys) -> quinn::EndpointConfig {
    let seed = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, keys.ed25519_keypair().as_bytes());
    let derived = ring::hmac::sign(&seed, RESET_KEY_CONTEXT);
    let reset_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, derived.as_ref());
    let cid_tag = ring::hmac::sign(&reset_key, CID_KEY_CONTEXT);
    let mut cid_key = [0u8; 8];
    cid_key.copy_from_slice(&cid_tag.as_ref()[..8]);
    let cid_key = u64::from_le_bytes(cid_key);
    let mut config = quinn::EndpointConfig::new(Arc::new(reset_key));
    config.cid_generator(move || {
        Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
    });
    config
}

fn transport_config(settings: &QuicSettings) -> Arc<TransportConfig> {
    let mut t = TransportConfig::default();
    t.max_concurrent_bidi_streams(VarInt::from_u32(MAX_LANES))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .stream_receive_window(VarInt::from_u32(STREAM_WINDOW))
        .receive_window(VarInt::from_u32(CONNECTION_WINDOW))
        .send_window(SEND_WINDOW)
        .send_fairness(true)
        .keep_alive_interval(Some(settings.keep_alive))
        .max_idle_timeout(Some(idle_timeout(backstop_idle_timeout(
            settings.idle_timeout,
        ))))
        .initial_mtu(settings.initial_mtu);
    let window = INITIAL_WINDOW_PACKETS * u64::from(settings.initial_mtu);
    match settings.congestion {
        Congestion::Cubic => {
            let mut c = quinn::congestion::CubicConfig::default();
            c.initial_window(window);
            t.congestion_controller_factory(Arc::new(c))
        }
        Congestion::NewReno => {
            let mut c = quinn::congestion::NewRenoConfig::default();
            c.initial_window(window);
            t.congestion_controller_factory(Arc::new(c))
        }
        Congestion::Bbr => {
            let mut c = quinn::congestion::BbrConfig::default();
            c.initial_window(window);
            t.congestion_controller_factory(Arc::new(c))
        }
    };
    Arc::new(t)
}

/// quinn's own idle timeout for a link whose [`QuicSettings::idle_timeout`]
/// is `link_timeout`: four times as long, at least a minute. A link is
/// judged over all its connections together (`lanes::watch_packets`):
/// with a connection per circuit, the connection that carries no circuit
/// sends only keep-alives, and when the path's queue is full of its
/// siblings' packets it can hear nothing for several seconds while they
/// are busy; its own idle timeout must not end the link that soon.
/// quinn's timer still ends a connection silent for the backstop's
/// length (and with the main one, the link), and connections whose link
/// is gone.
fn backstop_idle_timeout(link_timeout: Duration) -> Duration {
    (link_timeout * 4).max(Duration::from_secs(60))
}

/// `timeout` as quinn's idle timeout (clamped to what QUIC can carry;
/// [`QuicSettings::validate`] refuses more).
fn idle_timeout(timeout: Duration) -> quinn::IdleTimeout {
    let ms = u32::try_from(timeout.min(MAX_IDLE_TIMEOUT).as_millis()).unwrap_or(u32::MAX);
    VarInt::from_u32(ms).into()
}

/// Links of one endpoint by the token a peer names in lane connections.
type TokenMap = Mutex<HashMap<[u8; TOKEN_LEN], (Weak<LinkShared>, Weak<QuicConns>)>>;

/// The QUIC transport of one node.
#[derive(Clone)]
pub struct QuicTransport {
    inner: Arc<Inner>,
}

struct Inner {
    provider: Arc<CryptoProvider>,
    our_key: Option<Arc<CertifiedKey>>,
    settings: QuicSettings,
    my_addrs: Vec<IpAddr>,
    /// A relay's one endpoint (accepting and connecting).
    relay_endpoint: Option<Endpoint>,
    /// A client's endpoints, one per address family, made on first use.
    client_v4: OnceLock<Endpoint>,
    client_v6: OnceLock<Endpoint>,
    /// Links by our token, for lane connections.
    tokens: Arc<TokenMap>,
    /// The acceptor's output, taken by [`crate::Transport::bind`].
    incoming: Mutex<Option<mpsc::Receiver<QuicIncoming>>>,
    /// What a relay's acceptor admits before any cryptography.
    gate: Arc<Mutex<GateState>>,
    /// A client's source address (`None`: the system's choice).
    bind: Option<IpAddr>,
}

/// The handshake gate and the rate limit of its log line.
struct GateState {
    gate: HandshakeGate,
    log: onionlab_ops::LogLimiter,
}

impl GateState {
    fn new(limits: HandshakeLimits) -> Arc<Mutex<Self>> {
        Arc::new(Mutex::new(GateState {
            gate: HandshakeGate::new(limits),
            log: onionlab_ops::LogLimiter::new(onionlab_ops::DEFAULT_LOG_INTERVAL),
        }))
    }
}

impl QuicTransport {
    /// The transport of a relay: binds its UDP socket at `listen` now
    /// (must run inside a tokio runtime) and serves every peer from it.
    pub fn relay(
        keys: &RelaySecretKeys,
        my_addrs: Vec<IpAddr>,
        listen: SocketAddr,
        settings: QuicSettings,
    ) -> Result<Self, Error> {
        settings.validate()?;
        let provider = crate::tls::provider();
        let our_key = identity::certified_key(&provider, keys.ed25519_keypair())?;
        let mut tls = crate::tls::server_config(&provider, &our_key)?;
        tls.alpn_protocols = vec![ALPN.to_vec()];
        tls.max_early_data_size = 0;
        let crypto = QuicServerConfig::try_from(tls).map_err(|e| Error::Config(e.to_string()))?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        server.transport_config(transport_config(&settings));
        server.migration(false);
        let endpoint_config = relay_endpoint_config(keys);
        let endpoint = crate::udp::socket(listen)
            .and_then(|socket| {
                let runtime = quinn_runtime(settings.udp_io)?;
                Endpoint::new(endpoint_config, Some(server), socket, runtime)
            })
            .map_err(|source| Error::Io {
                what: "binding the QUIC endpoint",
                source,
            })?;
        let tokens: Arc<TokenMap> = Arc::default();
        let (tx, rx) = mpsc::channel(MAX_PENDING_LINKS);
        let gate = GateState::new(settings.handshakes);
        tokio::spawn(acceptor(
            endpoint.clone(),
            tokens.clone(),
            gate.clone(),
            tx,
            settings.handshake_timeout,
        ));
        Ok(QuicTransport {
            inner: Arc::new(Inner {
                provider,
                our_key: Some(our_key),
                settings,
                my_addrs,
                relay_endpoint: Some(endpoint),
                client_v4: OnceLock::new(),
                client_v6: OnceLock::new(),
                tokens,
                incoming: Mutex::new(Some(rx)),
                gate,
                bind: None,
            }),
        })
    }

    /// The transport of a client: authenticates relays, stays anonymous,
    /// accepts nothing.
    pub fn client(settings: QuicSettings) -> Self {
        Self::client_from(settings, None)
    }

    /// A client transport whose connections come from source address
    /// `ip` (a host with several addresses; tests that play another host
    /// on loopback).
    pub fn client_bound(settings: QuicSettings, ip: IpAddr) -> Self {
        Self::client_from(settings, Some(ip))
    }

    fn client_from(settings: QuicSettings, bind: Option<IpAddr>) -> Self {
        QuicTransport {
            inner: Arc::new(Inner {
                provider: crate::tls::provider(),
                our_key: None,
                settings,
                my_addrs: Vec::new(),
                relay_endpoint: None,
                client_v4: OnceLock::new(),
                client_v6: OnceLock::new(),
                tokens: Arc::default(),
                incoming: Mutex::new(None),
                gate: GateState::new(settings.handshakes),
                bind,
            }),
        }
    }

    /// This transport's settings.
    pub fn settings(&self) -> QuicSettings {
        self.inner.settings
    }

    /// Exempt these addresses (the network's relays) from the per-address
    /// handshake rate of the [`gate`].
    pub fn set_exempt_addresses(&self, addrs: impl IntoIterator<Item = IpAddr>) {
        lock(&self.inner.gate).gate.set_exempt(addrs);
    }

    /// What the handshake [`gate`] refused and retried so far.
    pub fn gate_counters(&self) -> GateCounters {
        lock(&self.inner.gate).gate.counters()
    }

    /// The address of a relay's UDP socket.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner
            .relay_endpoint
            .as_ref()
            .and_then(|e| e.local_addr().ok())
    }

    /// QUIC connections open on this node's endpoint(s) (links and, in
    /// conn-per-circuit mode, lanes).
    pub fn open_connections(&self) -> usize {
        let endpoints = [
            self.inner.relay_endpoint.as_ref(),
            self.inner.client_v4.get(),
            self.inner.client_v6.get(),
        ];
        endpoints
            .into_iter()
            .flatten()
            .map(|e| e.open_connections())
            .sum()
    }

    fn endpoint_for(&self, peer: SocketAddr) -> Result<Endpoint, Error> {
        if let Some(e) = &self.inner.relay_endpoint {
            return Ok(e.clone());
        }
        let (cell, mut any) = if peer.is_ipv4() {
            (&self.inner.client_v4, SocketAddr::from(([0, 0, 0, 0], 0)))
        } else {
            (&self.inner.client_v6, SocketAddr::from(([0u16; 8], 0)))
        };
        if let Some(ip) = self.inner.bind.filter(|ip| ip.is_ipv4() == peer.is_ipv4()) {
            any.set_ip(ip);
        }
        if let Some(e) = cell.get() {
            return Ok(e.clone());
        }
        let e = crate::udp::socket(any)
            .and_then(|socket| {
                let runtime = quinn_runtime(self.inner.settings.udp_io)?;
                Endpoint::new(quinn::EndpointConfig::default(), None, socket, runtime)
            })
            .map_err(|source| Error::Io {
                what: "binding the QUIC client socket",
                source,
            })?;
        Ok(cell.get_or_init(|| e).clone())
    }

    /// A quinn client configuration requiring the peer to prove `verifier`'s
    /// identity.
    fn client_config(
        &self,
        verifier: Arc<identity::ExpectIdentity>,
    ) -> Result<quinn::ClientConfig, Error> {
        let mut tls =
            crate::tls::client_config(&self.inner.provider, self.inner.our_key.as_ref(), verifier)?;
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let crypto = QuicClientConfig::try_from(tls).map_err(|e| Error::Config(e.to_string()))?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        config.transport_config(transport_config(&self.inner.settings));
        Ok(config)
    }

    /// Open an authenticated QUIC connection to `addr` (no link yet).
    pub(crate) async fn open_connection(
        &self,
        addr: SocketAddr,
        expected: Ed25519Identity,
    ) -> Result<quinn::Connection, Error> {
        let endpoint = self.endpoint_for(addr)?;
        let verifier = Arc::new(identity::ExpectIdentity::new(
            expected,
            &self.inner.provider,
        ));
        let config = self.client_config(verifier.clone())?;
        let connecting = endpoint
            .connect_with(config, addr, "onionlab")
            .map_err(|e| Error::Quic {
                peer: addr,
                detail: e.to_string(),
            })?;
        connecting.await.map_err(|e| match verifier.presented() {
            Some(got) if got != expected => Error::WrongIdentity {
                peer: addr,
                got: hex::encode(got.as_bytes()),
                expected: hex::encode(expected.as_bytes()),
            },
            _ => Error::Quic {
                peer: addr,
                detail: e.to_string(),
            },
        })
    }

    /// Open a link to `addr` in `mode` (whatever the settings' mode),
    /// requiring the peer to prove `expected`.
    pub async fn connect_mode(
        &self,
        addr: SocketAddr,
        expected: Ed25519Identity,
        mode: Mode,
    ) -> Result<QuicLink, Error> {
        tokio::time::timeout(
            self.inner.settings.handshake_timeout,
            self.connect_inner(addr, expected, mode),
        )
        .await
        .map_err(|_| Error::HandshakeTimeout { peer: addr })?
    }

    async fn connect_inner(
        &self,
        addr: SocketAddr,
        expected: Ed25519Identity,
        mode: Mode,
    ) -> Result<QuicLink, Error> {
        let conn = self.open_connection(addr, expected).await?;
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| quic_err(addr, e))?;
        let token: [u8; TOKEN_LEN] = rand::random();
        let mut preamble = LINK_MAGIC.to_vec();
        preamble.push(mode.byte());
        preamble.extend_from_slice(&token);
        send.write_all(&preamble)
            .await
            .map_err(|e| quic_err(addr, e))?;
        let mut answer = [0u8; wire::LINK_ANSWER_LEN];
        recv.read_exact(&mut answer)
            .await
            .map_err(|e| Error::Protocol {
                peer: addr,
                detail: format!("reading the QUIC link preamble: {e}"),
            })?;
        let peer_token = wire::parse_link_answer(&answer)
            .map_err(|source| Error::Framing { peer: addr, source })?;
        let mut control = tokio::io::join(recv, send);
        let role = Role::Initiator {
            my_addrs: self.inner.my_addrs.clone(),
            relay: self.inner.our_key.is_some(),
        };
        let negotiated = link::handshake(&mut control, role, addr).await?;
        let (recv, send) = control.into_inner();
        Ok(self.finish_link(LinkSpec {
            conn,
            control_send: send,
            control_recv: recv,
            leftover: negotiated.leftover,
            link_version: negotiated.link_version,
            peer: PeerInfo {
                identity: Some(expected),
                addr,
            },
            mode,
            our_token: token,
            peer_token,
        }))
    }

    fn finish_link(&self, spec: LinkSpec) -> QuicLink {
        let token = spec.our_token;
        let (link, shared, conns) = lanes::start(spec, self.clone());
        self.inner
            .tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token, (Arc::downgrade(&shared), Arc::downgrade(&conns)));
        link
    }

    /// Forget a link's token (the link is gone).
    pub(crate) fn forget_token(&self, token: &[u8; TOKEN_LEN]) {
        self.inner
            .tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(token);
    }
}

pub(crate) fn quic_err(peer: SocketAddr, e: impl std::fmt::Display) -> Error {
    Error::Quic {
        peer,
        detail: e.to_string(),
    }
}

/// The identity a connection's peer proved, if any.
fn peer_identity(conn: &quinn::Connection) -> Option<Ed25519Identity> {
    let any = conn.peer_identity()?;
    let certs = any
        .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
        .ok()?;
    certs.first().and_then(|c| identity::identity_from_spki(c))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A relay's acceptor: asks the [`gate`] about each incoming connection,
/// completes QUIC handshakes and preambles, hands new links to the
/// listener and lane connections to their links.
async fn acceptor(
    endpoint: Endpoint,
    tokens: Arc<TokenMap>,
    gate: Arc<Mutex<GateState>>,
    links: mpsc::Sender<QuicIncoming>,
    timeout: Duration,
) {
    while let Some(incoming) = endpoint.accept().await {
        let addr = incoming.remote_address();
        let validated = incoming.remote_address_validated();
        let verdict = lock(&gate)
            .gate
            .decide(addr.ip(), validated, Instant::now());
        match verdict {
            Verdict::Accept => {}
            Verdict::Retry => {
                if incoming.may_retry() {
                    // Cannot fail after may_retry(); a failure drops it.
                    let _ = incoming.retry();
                } else {
                    incoming.refuse();
                }
                continue;
            }
            Verdict::Refuse(why) => {
                incoming.refuse();
                let mut g = lock(&gate);
                if let Some(held) = g.log.check(Instant::now()) {
                    let c = g.gate.counters();
                    info!(
                        peer = %addr,
                        "QUIC handshake refused: {why} ({held} more since the last line; \
                         {} refused, {} retries in all)",
                        c.refused, c.retried
                    );
                }
                continue;
            }
        }
        let tokens = tokens.clone();
        let links = links.clone();
        let gate = gate.clone();
        tokio::spawn(async move {
            let result = tokio::time::timeout(timeout, accept_one(incoming, &tokens)).await;
            lock(&gate).gate.done();
            match result {
                Ok(Ok(Accepted::Link(link))) => {
                    if links.try_send(link).is_err() {
                        debug!(peer = %addr, "QUIC link refused: too many pending links");
                    }
                }
                Ok(Ok(Accepted::Lane)) => {}
                Ok(Err(e)) => debug!(peer = %addr, "QUIC connection refused: {e}"),
                Err(_) => debug!(peer = %addr, "QUIC handshake timed out"),
            }
        });
    }
}

enum Accepted {
    Link(QuicIncoming),
    Lane,
}

async fn accept_one(incoming: quinn::Incoming, tokens: &TokenMap) -> Result<Accepted, Error> {
    let addr = incoming.remote_address();
    let conn = incoming
        .accept()
        .map_err(|e| quic_err(addr, e))?
        .await
        .map_err(|e| quic_err(addr, e))?;
    let identity = peer_identity(&conn);
    let (send, mut recv) = conn.accept_bi().await.map_err(|e| quic_err(addr, e))?;
    let mut preamble = [0u8; 4 + TOKEN_LEN + 4];
    recv.read_exact(&mut preamble[..4])
        .await
        .map_err(|e| quic_err(addr, e))?;
    let magic: [u8; 4] = preamble[..4].try_into().expect("4 bytes");
    let len = wire::preamble_len(&magic).unwrap_or(4);
    recv.read_exact(&mut preamble[4..len])
        .await
        .map_err(|e| quic_err(addr, e))?;
    let (token, circ_id) = match wire::parse_preamble(&preamble[..len]) {
        Ok(Preamble::Link { mode, peer_token }) => {
            return Ok(Accepted::Link(QuicIncoming {
                conn,
                send,
                recv,
                addr,
                identity,
                mode,
                peer_token,
            }))
        }
        Ok(Preamble::Lane { token, circ_id }) => (token, circ_id),
        Err(source) => {
            conn.close(VarInt::from_u32(1), b"bad preamble");
            return Err(Error::Framing { peer: addr, source });
        }
    };
    let link = lock(tokens)
        .get(&token)
        .and_then(|(link, conns)| Some((link.upgrade()?, conns.upgrade()?)));
    let Some((link, conns)) = link else {
        conn.close(VarInt::from_u32(1), b"unknown link");
        return Err(Error::Protocol {
            peer: addr,
            detail: "lane connection for an unknown link".into(),
        });
    };
    if link.peer.identity.is_some() && link.peer.identity != identity {
        conn.close(VarInt::from_u32(1), b"wrong identity");
        return Err(Error::Protocol {
            peer: addr,
            detail: "lane connection from another identity than its link's".into(),
        });
    }
    let lane = Lane {
        read: Box::new(QuicLaneRead::new(
            recv,
            Some(conns.lane_conn(conn, circ_id)),
        )),
        write: Box::new(send),
    };
    crate::lanes::accept_in_order(&link, circ_id, lane);
    Ok(Accepted::Lane)
}

impl crate::Transport for QuicTransport {
    type Reader = QuicReader;
    type Writer = QuicWriter;
    type Listener = QuicListener;

    fn kind(&self) -> TransportKind {
        self.inner.settings.mode.kind()
    }

    async fn connect(
        &self,
        addr: SocketAddr,
        expected: Ed25519Identity,
    ) -> Result<QuicLink, Error> {
        self.connect_mode(addr, expected, self.inner.settings.mode)
            .await
    }

    async fn bind(&self, addr: SocketAddr) -> Result<QuicListener, Error> {
        let local = self.local_addr().ok_or_else(|| {
            Error::Config("a client QUIC transport cannot accept connections".into())
        })?;
        if addr.port() != 0 && addr != local {
            return Err(Error::Config(format!(
                "the QUIC endpoint is bound to {local}, not {addr}"
            )));
        }
        let rx = self
            .inner
            .incoming
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| Error::Config("the QUIC endpoint is already listening".into()))?;
        Ok(QuicListener {
            rx,
            local_addr: local,
            transport: self.clone(),
        })
    }
}

/// A relay's QUIC listener.
pub struct QuicListener {
    rx: mpsc::Receiver<QuicIncoming>,
    local_addr: SocketAddr,
    transport: QuicTransport,
}

impl crate::Listener for QuicListener {
    type Reader = QuicReader;
    type Writer = QuicWriter;
    type Incoming = QuicIncomingLink;

    fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    async fn accept(&mut self) -> Result<QuicIncomingLink, Error> {
        let incoming = self.rx.recv().await.ok_or(Error::Closed)?;
        Ok(QuicIncomingLink {
            incoming,
            transport: self.transport.clone(),
        })
    }
}

impl Acceptor for QuicListener {
    fn kind(&self) -> EndpointKind {
        QUIC
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let gate = self.transport.gate_counters();
        vec![
            ("quic_handshakes_refused", gate.refused),
            ("quic_retries", gate.retried),
        ]
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        Some(self.local_addr)
    }

    fn accept(&mut self) -> BoxFuture<'_, Result<PendingLink, Error>> {
        Box::pin(async move {
            let incoming = crate::Listener::accept(self).await?;
            let peer = crate::Incoming::peer_addr(&incoming);
            Ok(PendingLink::new(peer, async move {
                let kind = incoming.kind();
                let link = crate::Incoming::handshake(incoming).await?;
                Ok(Some(AnyLink::erase(kind, link)))
            }))
        })
    }
}

/// A QUIC connection whose preamble arrived (acceptor's output).
struct QuicIncoming {
    conn: quinn::Connection,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    addr: SocketAddr,
    identity: Option<Ed25519Identity>,
    mode: Mode,
    peer_token: [u8; TOKEN_LEN],
}

/// An accepted QUIC connection whose link handshake is pending.
pub struct QuicIncomingLink {
    incoming: QuicIncoming,
    transport: QuicTransport,
}

impl QuicIncomingLink {
    /// The transport the peer opened this link with.
    pub fn kind(&self) -> TransportKind {
        self.incoming.mode.kind()
    }

    async fn handshake_inner(self) -> Result<QuicLink, Error> {
        let QuicIncoming {
            conn,
            mut send,
            recv,
            addr,
            identity,
            mode,
            peer_token,
        } = self.incoming;
        let token: [u8; TOKEN_LEN] = rand::random();
        let mut answer = LINK_MAGIC.to_vec();
        answer.extend_from_slice(&token);
        send.write_all(&answer)
            .await
            .map_err(|e| quic_err(addr, e))?;
        let mut control = tokio::io::join(recv, send);
        let negotiated = link::handshake(
            &mut control,
            Role::Responder {
                my_addrs: self.transport.inner.my_addrs.clone(),
            },
            addr,
        )
        .await?;
        control.flush().await.map_err(|e| quic_err(addr, e))?;
        let (recv, send) = control.into_inner();
        Ok(self.transport.finish_link(LinkSpec {
            conn,
            control_send: send,
            control_recv: recv,
            leftover: negotiated.leftover,
            link_version: negotiated.link_version,
            peer: PeerInfo { identity, addr },
            mode,
            our_token: token,
            peer_token,
        }))
    }
}

impl crate::Incoming for QuicIncomingLink {
    type Reader = QuicReader;
    type Writer = QuicWriter;

    fn peer_addr(&self) -> SocketAddr {
        self.incoming.addr
    }

    async fn handshake(self) -> Result<QuicLink, Error> {
        let addr = self.incoming.addr;
        let timeout = self.transport.inner.settings.handshake_timeout;
        tokio::time::timeout(timeout, self.handshake_inner())
            .await
            .map_err(|_| Error::HandshakeTimeout { peer: addr })?
    }
}

/// Read a lane's circuit ID from a stream the peer opened (never 0).
pub(crate) async fn read_lane_header(
    recv: &mut quinn::RecvStream,
    peer: SocketAddr,
) -> Result<u32, Error> {
    let mut id = [0u8; 4];
    recv.read_exact(&mut id)
        .await
        .map_err(|e| Error::Protocol {
            peer,
            detail: format!("reading a lane header: {e}"),
        })?;
    wire::lane_circ_id(id).map_err(|source| Error::Framing { peer, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link dropped without a shutdown lets its state go: its lane tasks
    /// end (they used to wait for cells forever, holding the link), and so
    /// do its reading and watching tasks once its connection is closed.
    #[tokio::test]
    async fn a_link_dropped_without_shutdown_lets_its_state_go() {
        use crate::{CellWriter, Incoming, Listener, Transport};
        use onionlab_cell::chan::{AnyChanMsg, ChanCell, CircId, Relay};
        use rand::SeedableRng;
        let keys = |seed| RelaySecretKeys::generate(&mut rand::rngs::StdRng::seed_from_u64(seed));
        let (a, b) = (keys(1), keys(2));
        let settings = QuicSettings {
            // The packet watch notices the closed connection within a tick.
            idle_timeout: Duration::from_millis(400),
            keep_alive: Duration::from_millis(100),
            ..QuicSettings::default()
        };
        let loopback: SocketAddr = "127.0.0.1:0".parse().expect("literal");
        let ta = QuicTransport::relay(&a, vec![], loopback, settings).expect("relay");
        let tb = QuicTransport::relay(&b, vec![], loopback, settings).expect("relay");
        let mut listener = tb.bind(loopback).await.expect("bind");
        let addr = Listener::local_addr(&listener);
        let (ab, ba) = tokio::join!(ta.connect(addr, b.public().ed_identity), async {
            Listener::accept(&mut listener).await?.handshake().await
        });
        let (mut ab, _ba) = (ab.expect("connect"), ba.expect("accept"));
        let cell = ChanCell::new(CircId::new(5), AnyChanMsg::Relay(Relay::new([1; 509])));
        ab.writer.queue(cell).expect("queue");
        assert_eq!(ab.writer.send_lanes(), 1);
        let (link, conns) = {
            let tokens = ta.inner.tokens.lock().expect("tokens");
            tokens.values().next().expect("the link's token").clone()
        };
        drop(ab);
        let deadline = Instant::now() + Duration::from_secs(5);
        while link.upgrade().is_some() || conns.upgrade().is_some() {
            assert!(
                Instant::now() < deadline,
                "the dropped link's state is still held"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
