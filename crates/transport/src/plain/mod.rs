//! `plain`, a transport for tests only (feature `test-transport`, which
//! only test builds enable): one unencrypted TCP connection per relay
//! pair, every circuit in it. It exists to show that a transport is its
//! own module plus one line in each registry list: the end-to-end suite
//! runs over it like over the others, and nothing outside this module
//! names it.
//!
//! Never deploy it: nothing is encrypted. Identities are still proven, so
//! that the suite's identity tests apply: the responder signs the
//! initiator's nonce with its Ed25519 identity key, and a relay that
//! initiates signs both nonces with its own (a client stays anonymous).
//! The proof is written here by hand (no library offers this toy
//! exchange) and is [`wire`]'s fixed-size records; then the link
//! handshake (VERSIONS, NETINFO) runs as on every transport.

pub(crate) mod setup;
pub mod wire;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tor_llcrypto::pk::ed25519::{Ed25519Identity, Keypair};

use crate::any::{AnyLink, IpProtocol, TransportInfo};
use crate::endpoint::{Acceptor, BoxFuture, EndpointInfo, EndpointKind, Endpoints, PendingLink};
use crate::link::{self, Role, StreamCellReader, StreamCellWriter};
use crate::tcp::TcpCongestion;
use crate::{Error, Link, Ordering, PeerInfo, TransportKind};
use wire::{InitiatorProof, ResponderProof, NONCE_LEN};

/// The plain endpoint: a TCP listener of its own.
pub(crate) static ENDPOINT: EndpointInfo = EndpointInfo {
    doc_name: "plain",
    about: "TCP: plain test links (test builds only)",
    protocol: IpProtocol::Tcp,
};

/// The plain endpoint's kind.
pub(crate) const PLAIN: EndpointKind = EndpointKind::new(&ENDPOINT);

/// This transport's kind.
const KIND: TransportKind = TransportKind::of(&INFO);

/// The registry's description of this transport.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "plain",
    about:
        "TEST BUILDS ONLY: one unencrypted TCP connection per relay pair (shows the plug-in seam)",
    ordering: Ordering::PerConnection,
    endpoint: PLAIN,
    settings: &[],
    open: |endpoints, addr, expected| Box::pin(open(endpoints, addr, expected)),
};

/// A node's plain endpoint: how it opens links, and its identity.
pub struct PlainEndpoint {
    /// A relay's identity key; `None` for a client.
    identity: Option<Arc<Keypair>>,
    /// The node's own addresses, for NETINFO.
    my_addrs: Vec<IpAddr>,
    /// Bound on the proof and the link handshake.
    handshake_timeout: Duration,
    /// Kernel congestion control of every connection.
    congestion: TcpCongestion,
}

impl PlainEndpoint {
    fn role_opening(&self) -> Role {
        Role::Initiator {
            my_addrs: self.my_addrs.clone(),
            relay: self.identity.is_some(),
        }
    }

    async fn connect(&self, addr: SocketAddr, expected: Ed25519Identity) -> Result<AnyLink, Error> {
        let mut tcp = crate::tls::connect_tcp(None, addr, &self.congestion).await?;
        let _ = tcp.set_nodelay(true);
        let nonce: [u8; NONCE_LEN] = rand::random();
        write_all(&mut tcp, &wire::hello(&nonce, self.identity.is_some())).await?;
        let mut answer = [0u8; ResponderProof::LEN];
        read_exact(&mut tcp, &mut answer, addr).await?;
        let proof = ResponderProof::parse(&answer);
        let got = proof
            .verify(&nonce)
            .ok_or_else(|| bad_proof(addr, "responder"))?;
        if got != expected {
            return Err(Error::WrongIdentity {
                peer: addr,
                got: hex::encode(got.as_bytes()),
                expected: hex::encode(expected.as_bytes()),
            });
        }
        if let Some(key) = &self.identity {
            let ours = InitiatorProof::sign(key, &nonce, &proof.nonce);
            write_all(&mut tcp, &ours.to_bytes()).await?;
        }
        let negotiated = link::handshake(&mut tcp, self.role_opening(), addr).await?;
        Ok(erase(tcp, negotiated, Some(expected), addr))
    }

    async fn respond(&self, mut tcp: TcpStream, addr: SocketAddr) -> Result<AnyLink, Error> {
        let key = self.identity.as_ref().ok_or_else(|| {
            Error::Config("a plain endpoint without an identity accepts nothing".into())
        })?;
        let mut hello = [0u8; wire::HELLO_LEN];
        read_exact(&mut tcp, &mut hello, addr).await?;
        let (their_nonce, relay) =
            wire::parse_hello(&hello).map_err(|source| Error::Framing { peer: addr, source })?;
        let nonce: [u8; NONCE_LEN] = rand::random();
        let proof = ResponderProof::sign(key, &their_nonce, nonce);
        write_all(&mut tcp, &proof.to_bytes()).await?;
        let identity = if relay {
            let mut theirs = [0u8; InitiatorProof::LEN];
            read_exact(&mut tcp, &mut theirs, addr).await?;
            let id = InitiatorProof::parse(&theirs)
                .verify(&their_nonce, &nonce)
                .ok_or_else(|| bad_proof(addr, "initiator"))?;
            Some(id)
        } else {
            None
        };
        let role = Role::Responder {
            my_addrs: self.my_addrs.clone(),
        };
        let negotiated = link::handshake(&mut tcp, role, addr).await?;
        Ok(erase(tcp, negotiated, identity, addr))
    }
}

/// A proof whose key or signature is not valid.
fn bad_proof(peer: SocketAddr, side: &str) -> Error {
    Error::Protocol {
        peer,
        detail: format!("the plain link's {side} proof does not verify"),
    }
}

/// The link on `tcp` after its handshakes.
fn erase(
    tcp: TcpStream,
    negotiated: link::Negotiated,
    identity: Option<Ed25519Identity>,
    addr: SocketAddr,
) -> AnyLink {
    let (r, w) = tcp.into_split();
    let v = negotiated.link_version;
    AnyLink::erase(
        KIND,
        Link {
            link_version: v,
            reader: StreamCellReader::new(r, v, negotiated.leftover, addr),
            writer: StreamCellWriter::new(w, v, addr),
            peer: PeerInfo { identity, addr },
        },
    )
}

async fn write_all(tcp: &mut TcpStream, bytes: &[u8]) -> Result<(), Error> {
    tcp.write_all(bytes).await.map_err(|source| Error::Io {
        what: "writing the plain link's proof",
        source,
    })
}

async fn read_exact(tcp: &mut TcpStream, buf: &mut [u8], peer: SocketAddr) -> Result<(), Error> {
    match tcp.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(Error::Protocol {
            peer,
            detail: "the connection closed during the plain link's proof".into(),
        }),
        Err(source) => Err(Error::Io {
            what: "reading the plain link's proof",
            source,
        }),
    }
}

async fn open(
    endpoints: &Endpoints,
    addr: SocketAddr,
    expected: Ed25519Identity,
) -> Result<AnyLink, Error> {
    let ep: &Arc<PlainEndpoint> = endpoints.get(PLAIN, INFO.name)?;
    tokio::time::timeout(ep.handshake_timeout, ep.connect(addr, expected))
        .await
        .map_err(|_| Error::HandshakeTimeout { peer: addr })?
}

/// A relay's plain listener.
pub struct PlainListener {
    listener: TcpListener,
    local_addr: SocketAddr,
    endpoint: Arc<PlainEndpoint>,
}

impl Acceptor for PlainListener {
    fn kind(&self) -> EndpointKind {
        PLAIN
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        Some(self.local_addr)
    }

    fn accept(&mut self) -> BoxFuture<'_, Result<PendingLink, Error>> {
        Box::pin(async move {
            let (tcp, addr) = self.listener.accept().await.map_err(|source| Error::Io {
                what: "accepting a TCP connection",
                source,
            })?;
            let _ = tcp.set_nodelay(true);
            let endpoint = self.endpoint.clone();
            Ok(PendingLink::new(addr, async move {
                let link =
                    tokio::time::timeout(endpoint.handshake_timeout, endpoint.respond(tcp, addr))
                        .await
                        .map_err(|_| Error::HandshakeTimeout { peer: addr })??;
                Ok(Some(link))
            }))
        })
    }
}
