//! The `torchestra` transport (seed 003; Gopal, "Torchestra: Reducing
//! interactive traffic delays over Tor", M.S. thesis, UC San Diego, 2012):
//! two TLS connections per relay pair, one for light circuits and one for
//! heavy ones, and an in-band protocol that moves a circuit between them
//! without pausing, reordering or losing a cell. The exit's classifier
//! (in the circuit layer) decides which circuits are heavy; the middle
//! passes the switch on to the entrance; a client's link is never split.
//!
//! The protocol is specified in `docs/torchestra.md`: the link (the
//! shared TCP endpoint's link preamble with mode 2, [`crate::tcp_share`],
//! then a heavy connection opened by the link's opener between relays;
//! [`wire`]), the messages and the exchange ([`switch`], sans-IO), and
//! every error case. Here: the link's connections (`link.rs`):
//! [`TorchestraReader`], [`TorchestraWriter`].

pub(crate) mod link;
pub mod switch;
pub mod wire;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use link::LinkSpec;
pub use link::{TorchestraReader, TorchestraWriter};

use crate::any::AnyLink;
use crate::any::{SettingInfo, TransportInfo};
use crate::endpoint::Endpoints;
use crate::link as handshake;
use crate::tcp_share::mode::{self, Accept, TcpMode};
use crate::tcp_share::wire::{LinkPreamble, TOKEN_LEN};
use crate::tls::TlsTransport;
use crate::{Error, Link, Ordering, PeerInfo, TransportKind};

/// The registry's description of this transport.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "torchestra",
    about: "two TLS connections per relay pair, light and heavy; the exit moves heavy circuits (Torchestra, Gopal 2012; seed 003)",
    ordering: Ordering::PerCircuit,
    endpoint: crate::tls::TCP,
    settings: &[
        SettingInfo {
            key: "torchestra.window_ms",
            default: "2000",
            about: "the exit's classification window",
        },
        SettingInfo {
            key: "torchestra.alpha",
            default: "0.18",
            about: "EWMA multiplier of circuits with cells in the window (and of the connection)",
        },
        SettingInfo {
            key: "torchestra.beta",
            default: "0.36",
            about: "EWMA multiplier of idle circuits",
        },
        SettingInfo {
            key: "torchestra.thresh_light",
            default: "0.7",
            about: "a light circuit this far above its fair share turns heavy",
        },
        SettingInfo {
            key: "torchestra.thresh_heavy",
            default: "0.7",
            about: "a heavy circuit this far below its fair share turns light",
        },
        SettingInfo {
            key: "torchestra.thresh_verylight",
            default: "0.9",
            about: "a circuit this far below its fair share is not counted active",
        },
    ],
    open: |endpoints, addr, expected| Box::pin(open_link(endpoints, addr, expected)),
};

/// This transport's kind.
const KIND: TransportKind = TransportKind::of(&INFO);

/// A node's torchestra state on its TCP endpoint (a mode state, see
/// `tcp_share::states::ModeStates`).
#[derive(Debug)]
pub(crate) struct NodeState {
    /// Whether the node switches circuits on its torchestra links.
    switches: AtomicBool,
    /// Heavy connections attached so far.
    heavy_attached: AtomicU64,
}

impl Default for NodeState {
    fn default() -> Self {
        NodeState {
            switches: AtomicBool::new(true),
            heavy_attached: AtomicU64::new(0),
        }
    }
}

impl NodeState {
    /// Count a heavy connection attached.
    pub(crate) fn heavy_attached(&self) {
        self.heavy_attached.fetch_add(1, AtomicOrdering::Relaxed);
    }
}

/// Whether the node of TCP endpoint `tcp` switches circuits on the
/// torchestra links it opens or accepts from now on (default yes);
/// without, its torchestra links run as tls (for tests of a peer that
/// does not switch).
pub fn set_switching(tcp: &TlsTransport, on: bool) {
    tcp.mode_state::<NodeState>()
        .switches
        .store(on, AtomicOrdering::Relaxed);
}

/// Torchestra heavy connections the node of TCP endpoint `tcp` attached
/// so far (opened or accepted).
pub fn heavy_connections(tcp: &TlsTransport) -> u64 {
    tcp.mode_state::<NodeState>()
        .heavy_attached
        .load(AtomicOrdering::Relaxed)
}

/// Whether this node switches circuits on a link with a relay.
fn switches(tcp: &TlsTransport) -> bool {
    tcp.is_relay()
        && tcp
            .mode_state::<NodeState>()
            .switches
            .load(AtomicOrdering::Relaxed)
}

/// How torchestra shares the TCP endpoint: its links' mode byte, and its
/// heavy connections' magic.
pub(crate) static TCP_MODE: TcpMode = TcpMode {
    link_mode: wire::MODE_TORCHESTRA,
    accept_link: |a, p| Box::pin(accept(a, p)),
    join_magics: &[*wire::HEAVY_MAGIC],
    accept_join: |a| Box::pin(accept_heavy(a)),
};

async fn open_link(
    endpoints: &Endpoints,
    addr: SocketAddr,
    expected: Ed25519Identity,
) -> Result<AnyLink, Error> {
    let tcp: &TlsTransport = endpoints.get(crate::tls::TCP, INFO.name)?;
    let link = tokio::time::timeout(tcp.handshake_timeout(), connect(tcp, addr, expected))
        .await
        .map_err(|_| Error::HandshakeTimeout { peer: addr })??;
    Ok(AnyLink::erase(KIND, link))
}

/// Open a torchestra link to `addr`, whose peer must prove `expected`.
async fn connect(
    transport: &TlsTransport,
    addr: SocketAddr,
    expected: Ed25519Identity,
) -> Result<Link<TorchestraReader, TorchestraWriter>, Error> {
    let (mut tls, our_token, answer) = mode::open_link(
        transport,
        addr,
        expected,
        wire::MODE_TORCHESTRA,
        wire::FLAGGED_ANSWER_LEN,
    )
    .await?;
    let (peer_token, flags) = wire::parse_flagged_answer(&answer)
        .map_err(|source| Error::Framing { peer: addr, source })?;
    let negotiated = handshake::handshake(&mut tls, transport.initiator_role(), addr).await?;
    // Only between relays that both switch: a client's link is never
    // split (the thesis), and a peer that does not switch makes it tls.
    let switching = flags & wire::FLAG_SWITCHES != 0 && switches(transport);
    Ok(start(
        transport,
        LinkSpec {
            tls,
            leftover: negotiated.leftover,
            link_version: negotiated.link_version,
            peer: PeerInfo {
                identity: Some(expected),
                addr,
            },
            our_token,
            peer_token,
            switching,
            opener: true,
        },
    ))
}

/// Hand a heavy connection (its first 4 bytes read) to its link: only
/// between relays, and from the link's peer.
async fn accept_heavy(mut a: Accept) -> Result<(), Error> {
    let bytes = a.read_preamble(wire::HEAVY_PREAMBLE_LEN).await?;
    let token = wire::parse_heavy_preamble(&bytes).map_err(|source| Error::Framing {
        peer: a.addr,
        source,
    })?;
    let link: Arc<link::LinkShared> = a.joined_link(&token, "heavy connection").await?;
    let what = "heavy connection";
    if let Some(e) = a.foreign(link.peer.identity, what) {
        return Err(e);
    }
    if a.identity.is_none() {
        return Err(Error::Protocol {
            peer: a.addr,
            detail: "a heavy connection from a client".into(),
        });
    }
    link.accept_heavy(a.tls)
}

/// Accept a torchestra link whose preamble `p` was read.
async fn accept(a: Accept, p: LinkPreamble) -> Result<AnyLink, Error> {
    let Accept {
        transport,
        mut tls,
        identity,
        addr,
        ..
    } = a;
    let transport = &transport;
    let switching = identity.is_some() && switches(transport);
    let our_token: [u8; TOKEN_LEN] = rand::random();
    let flags = if switching { wire::FLAG_SWITCHES } else { 0 };
    // Held until the link is registered, whatever happens meanwhile.
    let _reservation = transport.tokens().reserve(our_token);
    tls.write_all(&wire::encode_flagged_answer(&our_token, flags))
        .await
        .map_err(|source| Error::Tls { peer: addr, source })?;
    let negotiated = handshake::handshake(&mut tls, transport.responder_role(), addr).await?;
    let link = start(
        transport,
        LinkSpec {
            tls,
            leftover: negotiated.leftover,
            link_version: negotiated.link_version,
            peer: PeerInfo { identity, addr },
            our_token,
            peer_token: p.token,
            switching,
            opener: false,
        },
    );
    Ok(AnyLink::erase(KIND, link))
}

fn start(transport: &TlsTransport, spec: LinkSpec) -> Link<TorchestraReader, TorchestraWriter> {
    let token = spec.our_token;
    let (link, shared) = link::start(spec, transport.clone());
    transport.tokens().register(token, &shared);
    link
}
