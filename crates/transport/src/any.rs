//! Choosing a transport per connection: a node's TLS transport, its QUIC
//! transport if it has one, and the rule that picks between them
//! ([`Choice`]), with fallback from QUIC to TLS (seed 000's deployability
//! requirement: use QUIC only when both ends support it and it connects).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tor_llcrypto::pk::ed25519::Ed25519Identity;
use tracing::info;

use crate::quic::{QuicIncomingLink, QuicListener, QuicReader, QuicTransport, QuicWriter};
use crate::tls::{TlsIncoming, TlsListener, TlsReader, TlsTransport, TlsWriter};
use crate::{
    AnyChanCell, CellReader, CellWriter, CircId, Error, Incoming, Link, Listener, Ordering,
    Transport, TransportKind,
};

/// How long an `auto` connection waits for QUIC before trying TLS.
pub const QUIC_FALLBACK_AFTER: Duration = Duration::from_secs(3);
/// How long a peer whose QUIC failed is reached over TLS only.
pub const QUIC_RETRY_AFTER: Duration = Duration::from_secs(600);

/// Which transport a node uses for the links it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Choice {
    /// QUIC (stream per circuit) when the peer advertises it and it
    /// connects within [`QUIC_FALLBACK_AFTER`]; TLS otherwise.
    #[default]
    Auto,
    /// TLS only.
    Tls,
    /// QUIC, stream per circuit, no fallback (experiments).
    Quic,
    /// QUIC, connection per circuit, no fallback (experiments).
    QuicConnPerCircuit,
}

impl Choice {
    /// Parse the configuration name (`auto`, `tls`, `quic`,
    /// `quic-conn-per-circuit`).
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "auto" => Choice::Auto,
            "tls" => Choice::Tls,
            "quic" => Choice::Quic,
            "quic-conn-per-circuit" => Choice::QuicConnPerCircuit,
            _ => return None,
        })
    }

    /// Whether links may use QUIC.
    pub fn may_use_quic(self) -> bool {
        self != Choice::Tls
    }

    /// The QUIC mode of the links opened under this choice.
    pub fn quic_mode(self) -> crate::quic::Mode {
        match self {
            Choice::QuicConnPerCircuit => crate::quic::Mode::ConnPerCircuit,
            _ => crate::quic::Mode::StreamPerCircuit,
        }
    }
}

/// A peer's addresses per transport (from the network document).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerAddrs {
    /// TLS (TCP) address.
    pub tls: Option<SocketAddr>,
    /// QUIC (UDP) address.
    pub quic: Option<SocketAddr>,
}

/// Incoming cells of a link of either transport.
pub enum AnyReader {
    /// A TLS link.
    Tls(TlsReader),
    /// A QUIC link.
    Quic(QuicReader),
}

/// Outgoing cells of a link of either transport.
pub enum AnyWriter {
    /// A TLS link.
    Tls(TlsWriter),
    /// A QUIC link.
    Quic(QuicWriter),
}

/// A link of either transport.
pub type AnyLink = Link<AnyReader, AnyWriter>;

impl From<Link<TlsReader, TlsWriter>> for AnyLink {
    fn from(l: Link<TlsReader, TlsWriter>) -> Self {
        Link {
            peer: l.peer,
            link_version: l.link_version,
            reader: AnyReader::Tls(l.reader),
            writer: AnyWriter::Tls(l.writer),
        }
    }
}

impl From<Link<QuicReader, QuicWriter>> for AnyLink {
    fn from(l: Link<QuicReader, QuicWriter>) -> Self {
        Link {
            peer: l.peer,
            link_version: l.link_version,
            reader: AnyReader::Quic(l.reader),
            writer: AnyWriter::Quic(l.writer),
        }
    }
}

impl AnyWriter {
    /// Bytes the link buffers outside the circuit queues: the TLS send
    /// buffer, or a QUIC link's lane buffers.
    pub fn buffered_bytes(&self) -> usize {
        match self {
            AnyWriter::Tls(w) => w.buffered_bytes(),
            AnyWriter::Quic(w) => w.buffered_bytes(),
        }
    }

    /// Which transport carries this link.
    pub fn kind(&self) -> TransportKind {
        match self {
            AnyWriter::Tls(_) => TransportKind::Tls,
            AnyWriter::Quic(w) => w.kind(),
        }
    }
}

impl CellReader for AnyReader {
    async fn read_cells(&mut self, out: &mut Vec<AnyChanCell>) -> Result<(), Error> {
        match self {
            AnyReader::Tls(r) => r.read_cells(out).await,
            AnyReader::Quic(r) => r.read_cells(out).await,
        }
    }

    fn buffered_bytes(&self) -> usize {
        match self {
            AnyReader::Tls(r) => r.buffered_bytes(),
            AnyReader::Quic(r) => r.buffered_bytes(),
        }
    }
}

impl CellWriter for AnyWriter {
    fn queue(&mut self, cell: AnyChanCell) -> Result<(), Error> {
        match self {
            AnyWriter::Tls(w) => w.queue(cell),
            AnyWriter::Quic(w) => w.queue(cell),
        }
    }
    fn has_room(&self) -> bool {
        match self {
            AnyWriter::Tls(w) => w.has_room(),
            AnyWriter::Quic(w) => w.has_room(),
        }
    }
    fn has_pending(&self) -> bool {
        match self {
            AnyWriter::Tls(w) => w.has_pending(),
            AnyWriter::Quic(w) => w.has_pending(),
        }
    }
    async fn flush(&mut self) -> Result<(), Error> {
        match self {
            AnyWriter::Tls(w) => w.flush().await,
            AnyWriter::Quic(w) => w.flush().await,
        }
    }
    async fn shutdown(&mut self) -> Result<(), Error> {
        match self {
            AnyWriter::Tls(w) => w.shutdown().await,
            AnyWriter::Quic(w) => w.shutdown().await,
        }
    }
    fn ordering(&self) -> Ordering {
        match self {
            AnyWriter::Tls(w) => w.ordering(),
            AnyWriter::Quic(w) => w.ordering(),
        }
    }
    fn has_room_for(&self, circ_id: CircId) -> bool {
        match self {
            AnyWriter::Tls(w) => w.has_room_for(circ_id),
            AnyWriter::Quic(w) => w.has_room_for(circ_id),
        }
    }
    async fn writable(&mut self) {
        match self {
            AnyWriter::Tls(w) => w.writable().await,
            AnyWriter::Quic(w) => w.writable().await,
        }
    }
}

/// Opens links with the transport [`Choice`] picks.
#[derive(Clone)]
pub struct Connector {
    tls: TlsTransport,
    quic: Option<QuicTransport>,
    choice: Choice,
    /// Peers whose QUIC failed under `auto`, and when.
    quic_failed: Arc<Mutex<HashMap<SocketAddr, Instant>>>,
}

impl Connector {
    /// A connector using `tls`, and `quic` where `choice` allows. With
    /// [`Choice::Quic`] or [`Choice::QuicConnPerCircuit`], `quic` must be
    /// given, in the matching mode.
    pub fn new(tls: TlsTransport, quic: Option<QuicTransport>, choice: Choice) -> Self {
        Connector {
            tls,
            quic,
            choice,
            quic_failed: Arc::default(),
        }
    }

    /// The rule in use.
    pub fn choice(&self) -> Choice {
        self.choice
    }

    /// Open a link to the peer with `expected` identity at `addrs`.
    pub async fn connect(
        &self,
        addrs: PeerAddrs,
        expected: Ed25519Identity,
    ) -> Result<AnyLink, Error> {
        let quic_only = matches!(self.choice, Choice::Quic | Choice::QuicConnPerCircuit);
        if quic_only {
            let quic = self.quic.as_ref().ok_or_else(|| {
                Error::Config("QUIC is forced but this node has no QUIC transport".into())
            })?;
            let addr = addrs.quic.ok_or_else(|| {
                Error::Config("QUIC is forced but the peer advertises no quic address".into())
            })?;
            return Ok(quic.connect(addr, expected).await?.into());
        }
        let tls_addr = addrs.tls;
        if self.choice == Choice::Auto {
            if let (Some(quic), Some(addr)) = (&self.quic, addrs.quic) {
                if !self.recently_failed(addr) {
                    let attempt =
                        tokio::time::timeout(QUIC_FALLBACK_AFTER, quic.connect(addr, expected))
                            .await;
                    match attempt {
                        Ok(Ok(link)) => return Ok(link.into()),
                        // The peer proved the wrong key: TLS would not help.
                        Ok(Err(e @ Error::WrongIdentity { .. })) => return Err(e),
                        Ok(Err(e)) if tls_addr.is_none() => return Err(e),
                        Err(_) if tls_addr.is_none() => {
                            return Err(Error::HandshakeTimeout { peer: addr })
                        }
                        Ok(Err(e)) => {
                            info!(peer = %addr, "QUIC failed ({e}): falling back to TLS");
                            self.mark_failed(addr);
                        }
                        Err(_) => {
                            info!(
                                peer = %addr,
                                "QUIC did not connect in {QUIC_FALLBACK_AFTER:?}: falling back to TLS"
                            );
                            self.mark_failed(addr);
                        }
                    }
                }
            }
        }
        let addr =
            tls_addr.ok_or_else(|| Error::Config("the peer advertises no tls address".into()))?;
        Ok(self.tls.connect(addr, expected).await?.into())
    }

    fn recently_failed(&self, addr: SocketAddr) -> bool {
        let mut failed = self.quic_failed.lock().unwrap_or_else(|p| p.into_inner());
        failed.retain(|_, at| at.elapsed() < QUIC_RETRY_AFTER);
        failed.contains_key(&addr)
    }

    fn mark_failed(&self, addr: SocketAddr) {
        self.quic_failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, Instant::now());
    }
}

/// A relay's listeners: TLS always, QUIC if configured.
pub struct AnyListener {
    tls: TlsListener,
    quic: Option<QuicListener>,
}

/// An accepted connection of either transport, before its handshake.
pub enum AnyIncoming {
    /// A TCP connection.
    Tls(TlsIncoming),
    /// A QUIC connection.
    Quic(QuicIncomingLink),
}

impl AnyListener {
    /// Listen with `tls`, and with `quic` if given.
    pub fn new(tls: TlsListener, quic: Option<QuicListener>) -> Self {
        AnyListener { tls, quic }
    }

    /// The TLS listener's address.
    pub fn tls_addr(&self) -> SocketAddr {
        self.tls.local_addr()
    }

    /// The QUIC endpoint's address.
    pub fn quic_addr(&self) -> Option<SocketAddr> {
        self.quic.as_ref().map(|q| q.local_addr())
    }

    /// The next connection on either listener.
    pub async fn accept(&mut self) -> Result<AnyIncoming, Error> {
        match &mut self.quic {
            None => Ok(AnyIncoming::Tls(self.tls.accept().await?)),
            Some(quic) => tokio::select! {
                t = self.tls.accept() => Ok(AnyIncoming::Tls(t?)),
                q = quic.accept() => Ok(AnyIncoming::Quic(q?)),
            },
        }
    }
}

impl AnyIncoming {
    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        match self {
            AnyIncoming::Tls(i) => i.peer_addr(),
            AnyIncoming::Quic(i) => i.peer_addr(),
        }
    }

    /// Run the handshake.
    pub async fn handshake(self) -> Result<AnyLink, Error> {
        Ok(match self {
            AnyIncoming::Tls(i) => i.handshake().await?.into(),
            AnyIncoming::Quic(i) => i.handshake().await?.into(),
        })
    }
}
