//! The `pctcp` transport: one TLS-over-TCP connection per circuit between
//! two nodes (PCTCP, AlSabah and Goldberg, "PCTCP: Per-Circuit TCP-over-
//! IPsec Transport for Anonymous Communication Overlay Networks", CCS
//! 2013; without the IPsec part: each circuit's connection is a TLS
//! connection authenticated like the link). It is seed 001's control: the
//! head-of-line isolation and per-circuit congestion window of
//! `quic-conn-per-circuit`, with the kernel's TCP.
//!
//! # Layout
//!
//! Every connection is TLS 1.3 over TCP with the relays' Ed25519 raw
//! public keys, exactly as the [`tls`](crate::tls) transport.
//!
//! - **Main connection.** The opener writes a link preamble after TLS:
//!   `OLT1`, mode byte 1, its 16-byte link token, and where it accepts
//!   lanes (family byte 0: nowhere, a client; 4 or 6: address and port of
//!   a relay's TCP listener). The acceptor answers `OLT1` and its own
//!   token. Both then run tor's VERSIONS/NETINFO handshake
//!   ([`crate::link`]) on it. It carries link-level cells and the circuits
//!   that have no lane.
//! - **Lanes.** The first side to send on a circuit ID opens a TLS
//!   connection to the other's lane address, requiring the link's
//!   identity (a peer proving another key is refused, as on the link),
//!   and writes a lane preamble: `OLTL`, the receiver's link token, the
//!   circuit ID, the lane's number among those its opener opened on this
//!   link (from 1) and the number of the opener's previous lane for the
//!   same circuit ID (0: none). The acceptor checks that the lane proves
//!   the same identity as its link (a client's lanes: none, like its
//!   link). Both directions of the circuit then use that connection.
//!   Sending or receiving a DESTROY ends the lane.
//! - **Reused circuit IDs are ordered.** A lane is read only after the
//!   previous lane of its circuit ID ended (its previous number says which
//!   one that is, whatever order the TCP connections were accepted in),
//!   so an old circuit's DESTROY reaches the node before a new circuit's
//!   CREATE2.
//!
//! The opener of the link gives its listener's address only if it is a
//! relay, so a guard never opens lanes to a client: a circuit whose first
//! cell the guard would send (none in tor: clients create circuits) stays
//! on the main connection. A circuit whose first cell arrived on the main
//! connection stays there in both directions.
//!
//! # Liveness
//!
//! The link's connections have no kernel keep-alive: each side sends a
//! PADDING cell on the main connection every heartbeat, and the link fails
//! when nothing arrived on any of its connections for the silence limit
//! ([`crate::liveness`]). The main connection, which carries no circuit,
//! is the quiet one; judged alone, its keep-alive probes could all be lost
//! behind a full bottleneck while its lanes are busy.
//!
//! # Bounds
//!
//! - **Descriptors.** A node opens lanes while fewer than its cap
//!   ([`PctcpSettings::max_lanes`], `pctcp_max_lanes`) of its lane
//!   connections (opened or accepted) are open; above it, new circuits use
//!   the main connection, and the fallback is counted
//!   ([`TlsTransport::lane_fallbacks`]) and logged at INFO (at most once
//!   per interval). Lanes it accepts are bounded per link by
//!   [`MAX_LANES_PER_LINK`] (a peer opening more broke the protocol) and
//!   by the relay's connection limits.
//! - **Memory.** Each connection buffers at most `LANE_HIGH_WATER` (16 KiB)
//!   of encoded cells before it reports no room, so cells wait in the
//!   circuit queues; received cells wait in a bounded queue for the node,
//!   and connections are not read while it is full.
//!
//! A lane that fails (cannot be opened, is refused or reset) ends only its
//! circuit: the node gets a DESTROY (CHANNEL_CLOSED) as from the peer,
//! the cells queued on the lane are dropped with it, and the link and its
//! other circuits go on; after a refusal new circuits use the main
//! connection for a while (counted as fallbacks). A lane to a relay that
//! proves another identity, a protocol error on a lane, or the main
//! connection's failure fails the whole link: the node then destroys the
//! link's circuits, and the applications see their streams fail.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use crate::lanes::{self, Lane, LaneDialer, LaneHeader, LaneRules, LinkShared, LinkSpec, MainConn};
pub use crate::lanes::{
    LaneReader as PctcpReader, LaneSettings as PctcpSettings, LaneWriter as PctcpWriter,
    DEFAULT_MAX_LANES, MAX_LANES_PER_LINK,
};

use crate::any::AnyLink;
use crate::any::{SettingInfo, TransportInfo};
use crate::endpoint::{BoxFuture, Endpoints};
use crate::link;
use crate::tcp_share::mode::{self, Accept, TcpMode};
use crate::tcp_share::wire::{
    encode_link_answer, parse_link_answer, LinkPreamble, LINK_ANSWER_LEN, TOKEN_LEN,
};
use crate::tls::{keepalive_off, TlsTransport};
use crate::{Error, Link, Ordering, PeerInfo, TransportKind};

/// The registry's description of this transport.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "pctcp",
    about: "one TLS over TCP connection per circuit (PCTCP, AlSabah and Goldberg 2013; seed 001's control)",
    ordering: Ordering::PerCircuit,
    endpoint: crate::tls::TCP,
    settings: &[
        SettingInfo {
            key: "link.pctcp.max_lanes",
            default: "512",
            about: "lane connections a node keeps open at most; above it new circuits share the main connection",
        },
        SettingInfo {
            key: "link.tcp.congestion",
            default: "the match of link.quic.congestion",
            about: "kernel congestion control of every TCP socket, lanes included",
        },
        SettingInfo {
            key: "link.tcp.pacing",
            default: "false",
            about: "Linux paces every TCP socket, lanes included",
        },
    ],
    open: |endpoints, addr, expected| Box::pin(open_link(endpoints, addr, expected)),
};

/// This transport's kind.
const KIND: TransportKind = TransportKind::of(&INFO);

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

/// Open a pctcp link to `addr`, whose peer must prove `expected`.
async fn connect(
    transport: &TlsTransport,
    addr: SocketAddr,
    expected: Ed25519Identity,
) -> Result<Link<PctcpReader, PctcpWriter>, Error> {
    let (mut tls, our_token, answer) =
        mode::open_link(transport, addr, expected, MODE_PCTCP, LINK_ANSWER_LEN).await?;
    let peer_token =
        parse_link_answer(&answer).map_err(|source| Error::Framing { peer: addr, source })?;
    let negotiated = link::handshake(&mut tls, transport.initiator_role(), addr).await?;
    keepalive_off(&tls);
    Ok(start(
        transport,
        LinkSpec {
            main: MainConn::stream(Box::new(tls)),
            leftover: negotiated.leftover,
            link_version: negotiated.link_version,
            peer: PeerInfo {
                identity: Some(expected),
                addr,
            },
            our_token,
            peer_token,
            dialer: Box::new(TcpDialer {
                transport: transport.clone(),
                target: Some(addr),
            }),
            liveness: Some(transport.liveness_timing()),
        },
    ))
}

fn start(transport: &TlsTransport, spec: LinkSpec) -> Link<PctcpReader, PctcpWriter> {
    let token = spec.our_token;
    let (link, shared) = lanes::start(spec, transport.lanes().clone());
    transport.tokens().register(token, &shared);
    link
}

/// Mode byte of a pctcp link on the shared TCP endpoint.
const MODE_PCTCP: u8 = 1;

/// pctcp's rules in the lane framework: lanes are connections of their
/// own, numbered, and the main connection carries the circuits above the
/// caps.
pub(crate) const LANE_RULES: LaneRules = LaneRules {
    name: "pctcp",
    main_carries_circuits: true,
    lane_errors_end_circuit: true,
    priorities: false,
    linger: true,
};

/// pctcp's lanes: TLS over TCP to the peer's lane address.
struct TcpDialer {
    transport: TlsTransport,
    /// Where the peer accepts lanes (`None`: nowhere, a client).
    target: Option<SocketAddr>,
}

impl LaneDialer for TcpDialer {
    fn rules(&self) -> LaneRules {
        LANE_RULES
    }

    fn header(&self, header: &LaneHeader) -> Vec<u8> {
        lanes::wire::encode_lane_preamble(header)
    }

    fn can_open(&self) -> bool {
        self.target.is_some()
    }

    fn open(
        &self,
        peer: SocketAddr,
        identity: Option<Ed25519Identity>,
        _circ_id: u32,
    ) -> BoxFuture<'_, Result<Lane, Error>> {
        Box::pin(async move {
            let identity = identity.ok_or_else(|| Error::Protocol {
                peer,
                detail: "a lane to an anonymous peer".into(),
            })?;
            let target = self.target.ok_or_else(|| Error::Protocol {
                peer,
                detail: "a lane to a peer that accepts none".into(),
            })?;
            let tls = self.transport.connect_tls(target, identity).await?;
            keepalive_off(&tls);
            Ok(Lane::stream(Box::new(tls)))
        })
    }
}

/// How pctcp shares the TCP endpoint: its links' mode byte, and its
/// lanes' magic.
pub(crate) static TCP_MODE: TcpMode = TcpMode {
    link_mode: MODE_PCTCP,
    accept_link: |a, p| Box::pin(accept_link(a, p)),
    join_magics: &[*lanes::wire::LANE_MAGIC],
    accept_join: |a| Box::pin(accept_lane(a)),
};

/// Hand a lane connection (its first 4 bytes read) to its link. The lane
/// must prove what its link's peer proved.
async fn accept_lane(mut a: Accept) -> Result<(), Error> {
    let bytes = a.read_preamble(lanes::wire::LANE_PREAMBLE_LEN).await?;
    let p = lanes::wire::parse_lane_preamble(&bytes).map_err(|source| Error::Framing {
        peer: a.addr,
        source,
    })?;
    let link: Arc<LinkShared> = a.joined_link(&p.token, "lane").await?;
    if let Some(e) = a.foreign(link.peer.identity, "lane connection") {
        return Err(e);
    }
    keepalive_off(&a.tls);
    lanes::accept_numbered(&link, &p, Lane::stream(Box::new(a.tls)));
    Ok(())
}

/// Accept a pctcp link whose preamble `p` was read.
async fn accept_link(a: Accept, p: LinkPreamble) -> Result<AnyLink, Error> {
    let Accept {
        transport,
        mut tls,
        identity,
        addr,
        ..
    } = a;
    let tls_err = |source| Error::Tls { peer: addr, source };
    // Lanes go only to relays: an anonymous peer's address is ignored.
    let lane_target = p.lanes_at.filter(|_| identity.is_some());
    let our_token: [u8; TOKEN_LEN] = rand::random();
    // Held until the link is registered, whatever happens meanwhile.
    let _reservation = transport.tokens().reserve(our_token);
    tls.write_all(&encode_link_answer(&our_token))
        .await
        .map_err(tls_err)?;
    let negotiated = link::handshake(&mut tls, transport.responder_role(), addr).await?;
    keepalive_off(&tls);
    let link = start(
        &transport,
        LinkSpec {
            main: MainConn::stream(Box::new(tls)),
            leftover: negotiated.leftover,
            link_version: negotiated.link_version,
            peer: PeerInfo { identity, addr },
            our_token,
            peer_token: p.token,
            dialer: Box::new(TcpDialer {
                transport: transport.clone(),
                target: lane_target,
            }),
            liveness: Some(transport.liveness_timing()),
        },
    );
    Ok(AnyLink::erase(KIND, link))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Listener, Transport};
    use onionlab_crypto::identity::RelaySecretKeys;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn relay(seed: u64) -> (TlsTransport, Ed25519Identity) {
        let keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(seed));
        let t = TlsTransport::relay(&keys, vec![]).expect("tls");
        (t, keys.public().ed_identity)
    }

    /// A relay that knows a link's token but proves another identity than
    /// the link's peer cannot attach a lane to it.
    #[tokio::test]
    async fn a_lane_from_another_identity_is_refused() {
        let (a, _) = relay(1);
        let (b, b_id) = relay(2);
        let (d, _) = relay(3);
        let mut listener = b.bind("127.0.0.1:0".parse().unwrap()).await.expect("bind");
        let addr = listener.local_addr();
        let accept = async {
            let incoming = listener.accept().await.expect("accept");
            crate::tcp_share::accept_any(incoming)
                .await
                .expect("link")
                .expect("a link")
        };
        let (ours, _theirs) = tokio::join!(connect(&a, addr, b_id), accept);
        let _ours = ours.expect("link");
        let token = b.tokens().live()[0];
        let lane = async {
            let mut tls = d.connect_tls(addr, b_id).await.expect("tls");
            let p = crate::lanes::wire::LaneHeader {
                token,
                circ_id: 5,
                seq: 1,
                prev: 0,
            };
            tls.write_all(&crate::lanes::wire::encode_lane_preamble(&p))
                .await
                .expect("write");
            tls
        };
        let accept = async {
            let incoming = listener.accept().await.expect("accept");
            crate::tcp_share::accept_any(incoming).await
        };
        let (_tls, accepted) = tokio::join!(lane, accept);
        match accepted {
            Err(Error::Protocol { detail, .. }) => {
                assert!(detail.contains("another identity"), "{detail}")
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("the lane was accepted"),
        }
        assert_eq!(b.open_lanes(), 0);
    }
}
