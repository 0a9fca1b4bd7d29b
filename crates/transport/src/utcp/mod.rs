//! The `dtls-utcp` transport (seed 002; `docs/dtls-utcp.md`): a
//! user-space TCP connection per circuit inside one DTLS session per node
//! pair, over UDP. The sans-IO parts are crate `onionlab-utcp`; this
//! module runs them on sockets.
//!
//! The UDP socket and its sessions, with each lane as a byte stream
//! ([`socket`]); links with circuits on lanes ([`link`], pctcp's
//! machinery over the session's lanes); the registry entry (below).

pub mod link;
pub(crate) mod setup;
pub mod socket;

pub use link::{UtcpIncoming, UtcpLink, UtcpSettings, UtcpTransport};
/// Bytes a DTLS record adds to a lane's segment in a datagram.
pub use onionlab_utcp::RECORD_OVERHEAD;

/// The lanes' largest segment that fills a link of `mtu` bytes: less the
/// IPv4 and UDP headers (28 bytes) and a DTLS record's overhead, as TCP's
/// segments and QUIC's packets fill it (1449 on 1500-byte links).
pub fn segment_for_link(mtu: u32) -> usize {
    mtu.saturating_sub(28 + RECORD_OVERHEAD as u32)
        .clamp(100, 65_000) as usize
}
/// The lanes' user-space TCP settings and congestion control.
pub use onionlab_utcp::{Congestion as LaneCongestion, Settings as LaneTcp};

/// The lanes' congestion control that imitates the kernel's `tcp` (smoltcp
/// has Cubic and Reno), so that dtls-utcp and the TCP transports compare
/// on the same algorithm.
///
/// # Errors
///
/// [`Error::Config`] for an algorithm smoltcp lacks (BBR, or the kernel's
/// unnamed default).
pub fn lanes_imitating(tcp: &crate::tcp::TcpCongestion) -> Result<LaneCongestion, Error> {
    match tcp.name() {
        Some("cubic") => Ok(LaneCongestion::Cubic),
        Some("reno") => Ok(LaneCongestion::Reno),
        _ => Err(Error::Config(format!(
            "dtls-utcp has no {tcp} (smoltcp has cubic and reno)"
        ))),
    }
}

use std::net::SocketAddr;

use tor_llcrypto::pk::ed25519::Ed25519Identity;

use std::sync::Arc;

use crate::any::AnyLink;
use crate::any::{OpenFuture, SettingInfo, TransportInfo};
use crate::endpoint::{Acceptor, BoxFuture, EndpointInfo, EndpointKind, Endpoints, PendingLink};
use crate::{Error, Ordering, TransportKind};

/// The dtls-utcp endpoint: one UDP socket that accepts sessions (a relay
/// also opens sessions from a second, ephemeral socket).
pub(crate) static ENDPOINT: EndpointInfo = EndpointInfo {
    doc_name: "utcp",
    about: "UDP: dtls-utcp sessions",
    protocol: crate::any::IpProtocol::Udp,
};

/// The dtls-utcp endpoint's kind.
pub(crate) const UTCP: EndpointKind = EndpointKind::new(&ENDPOINT);

/// This transport's kind.
const KIND: TransportKind = TransportKind::of(&INFO);

/// The registry's description of this transport.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "dtls-utcp",
    about: "a user-space TCP connection per circuit inside one DTLS session per relay pair, over UDP (Reardon and Goldberg 2009; seed 002)",
    ordering: Ordering::PerCircuit,
    endpoint: UTCP,
    settings: &[
        SettingInfo {
            key: "listen.utcp",
            default: "none (no dtls-utcp endpoint)",
            about: "relays: UDP address of the dtls-utcp endpoint",
        },
        SettingInfo {
            key: "link.utcp.congestion",
            default: "cubic",
            about: "each lane's user-space TCP congestion control: cubic or reno",
        },
        SettingInfo {
            key: "link.utcp.max_segment",
            default: "1200",
            about: "largest segment, TORTP header included (100 to 65000)",
        },
        SettingInfo {
            key: "link.utcp.rx_buffer, tx_buffer",
            default: "262144, 65536",
            about: "each lane's receive and send buffer",
        },
        SettingInfo {
            key: "link.utcp.ack_delay_ms",
            default: "10",
            about: "delayed ACK, 0 for none (at most 1000)",
        },
    ],
    open: open_link,
};

fn open_link(endpoints: &Endpoints, addr: SocketAddr, expected: Ed25519Identity) -> OpenFuture<'_> {
    Box::pin(async move {
        let utcp: &Arc<UtcpTransport> = endpoints.get(UTCP, INFO.name)?;
        let link = utcp.connect(addr, expected).await?;
        Ok(AnyLink::erase(KIND, link))
    })
}
pub use socket::{HeldBytes, IncomingLanes, LaneStream, UtcpSession, UtcpSocket};

impl Acceptor for Arc<UtcpTransport> {
    fn kind(&self) -> EndpointKind {
        UTCP
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        UtcpTransport::local_addr(self)
    }

    fn accept(&mut self) -> BoxFuture<'_, Result<PendingLink, Error>> {
        Box::pin(async move {
            let incoming = self.accept_session().await?;
            Ok(PendingLink::new(incoming.peer_addr(), async move {
                let link = incoming.handshake().await?;
                Ok(Some(AnyLink::erase(KIND, link)))
            }))
        })
    }
}
