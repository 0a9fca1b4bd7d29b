//! The link handshake and cell framing on an ordered, authenticated byte
//! stream (TLS today; a QUIC control stream could reuse it).
//!
//! tor-spec's handshake is VERSIONS, then CERTS / AUTH_CHALLENGE /
//! AUTHENTICATE to prove identities, then NETINFO. In onionlab the identity
//! proof is the TLS handshake itself (see [`crate::tls`]), so the link
//! handshake keeps VERSIONS and NETINFO:
//!
//! - the initiator sends VERSIONS, reads the responder's VERSIONS, sends
//!   NETINFO and reads the responder's NETINFO;
//! - the responder reads VERSIONS, sends VERSIONS and NETINFO, then reads
//!   the initiator's NETINFO.
//!
//! Cells that arrive right behind NETINFO stay buffered for the reader.

use std::net::{IpAddr, SocketAddr};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use onionlab_cell::chan::{AnyChanCell, AnyChanMsg, ChanCell, ChanMsg, Netinfo};
use onionlab_cell::codec::LINK_PROTOCOLS;
use onionlab_cell::codec::{best_shared_version, decode_versions, encode_versions, CellCodec};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{CellReader, CellWriter, Error};

/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 32 * 1024;

/// Most cells handed over per [`CellReader::read_cells`] call.
const MAX_BATCH: usize = 64;

/// Send buffer high-water mark: enough for a TLS record's worth of cells
/// and a few more, small enough that cells wait in the circuit queues.
pub const WRITE_HIGH_WATER: usize = 32 * 1024;

/// Padding cells tolerated before NETINFO during the handshake.
const MAX_HANDSHAKE_PADDING: usize = 16;

/// Which side of the handshake we are.
#[derive(Debug, Clone)]
pub enum Role {
    /// We opened the connection.
    Initiator {
        /// Our own public addresses (relays), empty for clients.
        my_addrs: Vec<IpAddr>,
        /// Whether we are a relay (NETINFO carries a timestamp).
        relay: bool,
    },
    /// We accepted the connection (always a relay).
    Responder {
        /// Our own public addresses.
        my_addrs: Vec<IpAddr>,
    },
}

/// What the handshake negotiated.
pub struct Negotiated {
    /// Link protocol version.
    pub link_version: u16,
    /// Bytes read past the handshake (the first cells).
    pub leftover: BytesMut,
}

/// Run the link handshake on `io`, an authenticated ordered byte stream.
pub async fn handshake<S>(io: &mut S, role: Role, peer: SocketAddr) -> Result<Negotiated, Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    handshake_after(io, role, peer, BytesMut::with_capacity(4096)).await
}

/// [`handshake`] when the first bytes of the peer's input were read
/// already (`read`, to tell a link from other uses of the connection).
pub async fn handshake_after<S>(
    io: &mut S,
    role: Role,
    peer: SocketAddr,
    read: BytesMut,
) -> Result<Negotiated, Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = read;
    let versions =
        encode_versions(LINK_PROTOCOLS).map_err(|source| Error::Cell { peer, source })?;
    let (my_addrs, relay) = match &role {
        Role::Initiator { my_addrs, relay } => (my_addrs.clone(), *relay),
        Role::Responder { my_addrs } => (my_addrs.clone(), true),
    };
    let initiator = matches!(role, Role::Initiator { .. });

    if initiator {
        write_all(io, &versions, peer).await?;
    }
    let theirs = loop {
        if let Some(v) = decode_versions(&mut buf).map_err(|source| Error::Cell { peer, source })? {
            break v;
        }
        fill(io, &mut buf, peer).await?;
    };
    let version = best_shared_version(&theirs).ok_or_else(|| Error::Protocol {
        peer,
        detail: format!("no shared link protocol version (peer offers {theirs:?})"),
    })?;
    let mut codec = CellCodec::new(version);

    let netinfo = if relay {
        Netinfo::from_relay(unix_now(), Some(peer.ip()), my_addrs)
    } else {
        Netinfo::from_client(Some(peer.ip()))
    };
    let mut out = BytesMut::new();
    if !initiator {
        out.extend_from_slice(&versions);
    }
    codec
        .encode(ChanCell::new(None, netinfo.into()), &mut out)
        .map_err(|source| Error::Cell { peer, source })?;
    write_all(io, &out, peer).await?;

    let mut padding = 0;
    loop {
        match codec
            .decode(&mut buf)
            .map_err(|source| Error::Cell { peer, source })?
        {
            None => fill(io, &mut buf, peer).await?,
            Some(cell) => match cell.msg() {
                AnyChanMsg::Netinfo(_) => break,
                AnyChanMsg::Padding(_) | AnyChanMsg::Vpadding(_)
                    if padding < MAX_HANDSHAKE_PADDING =>
                {
                    padding += 1
                }
                other => {
                    return Err(Error::Protocol {
                        peer,
                        detail: format!("{} before NETINFO", other.cmd()),
                    })
                }
            },
        }
    }
    Ok(Negotiated {
        link_version: version,
        leftover: buf,
    })
}

fn unix_now() -> u32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    u32::try_from(secs).unwrap_or(u32::MAX)
}

async fn write_all<S: AsyncWrite + Unpin>(
    io: &mut S,
    data: &[u8],
    peer: SocketAddr,
) -> Result<(), Error> {
    io.write_all(data)
        .await
        .map_err(|source| Error::Tls { peer, source })?;
    io.flush()
        .await
        .map_err(|source| Error::Tls { peer, source })
}

/// Read more bytes into `buf`; a clean EOF mid-handshake is an error.
async fn fill<S: AsyncRead + Unpin>(
    io: &mut S,
    buf: &mut BytesMut,
    peer: SocketAddr,
) -> Result<(), Error> {
    if buf.len() > 2 * READ_CHUNK {
        // Decoders consume complete cells as soon as they are buffered, so
        // this much unconsumed input means a frame that never completes.
        return Err(Error::Protocol {
            peer,
            detail: "handshake input grew without a complete cell".into(),
        });
    }
    buf.reserve(READ_CHUNK);
    let n = io
        .read_buf(buf)
        .await
        .map_err(|source| Error::Tls { peer, source })?;
    if n == 0 {
        return Err(Error::Protocol {
            peer,
            detail: "connection closed during the link handshake".into(),
        });
    }
    Ok(())
}

/// Reads cells from an ordered byte stream.
pub struct StreamCellReader<R> {
    io: R,
    codec: CellCodec,
    buf: BytesMut,
    peer: SocketAddr,
}

impl<R: AsyncRead + Unpin> StreamCellReader<R> {
    /// A reader for link version `link_version`, starting with `leftover`
    /// bytes already read.
    pub fn new(io: R, link_version: u16, leftover: BytesMut, peer: SocketAddr) -> Self {
        StreamCellReader {
            io,
            codec: CellCodec::new(link_version),
            buf: leftover,
            peer,
        }
    }

    fn decode_available(&mut self, out: &mut Vec<AnyChanCell>) -> Result<usize, Error> {
        let peer = self.peer;
        let mut n = 0;
        while n < MAX_BATCH {
            match self
                .codec
                .decode(&mut self.buf)
                .map_err(|source| Error::Cell { peer, source })?
            {
                None => break,
                Some(cell) => match cell.msg() {
                    // Link padding is the transport's business.
                    AnyChanMsg::Padding(_) | AnyChanMsg::Vpadding(_) => {}
                    AnyChanMsg::Versions(_)
                    | AnyChanMsg::Netinfo(_)
                    | AnyChanMsg::Certs(_)
                    | AnyChanMsg::AuthChallenge(_)
                    | AnyChanMsg::Authenticate(_) => {
                        return Err(Error::Protocol {
                            peer,
                            detail: format!("{} after the link handshake", cell.msg().cmd()),
                        })
                    }
                    _ => {
                        out.push(cell);
                        n += 1;
                    }
                },
            }
        }
        Ok(n)
    }
}

impl<R: AsyncRead + Unpin + Send> CellReader for StreamCellReader<R> {
    async fn read_cells(&mut self, out: &mut Vec<AnyChanCell>) -> Result<(), Error> {
        loop {
            if self.decode_available(out)? > 0 {
                return Ok(());
            }
            // No complete cell is buffered, so the buffer holds less than
            // one maximal cell: reading one more chunk keeps it bounded.
            self.buf.reserve(READ_CHUNK);
            let n = self
                .io
                .read_buf(&mut self.buf)
                .await
                .map_err(|source| Error::Tls {
                    peer: self.peer,
                    source,
                })?;
            if n == 0 {
                return if self.buf.is_empty() {
                    Err(Error::Closed)
                } else {
                    Err(Error::Protocol {
                        peer: self.peer,
                        detail: format!(
                            "connection closed inside a cell ({} bytes left)",
                            self.buf.len()
                        ),
                    })
                };
            }
        }
    }

    fn buffered_bytes(&self) -> usize {
        self.buf.len()
    }
}

/// Writes cells to an ordered byte stream.
pub struct StreamCellWriter<W> {
    io: W,
    codec: CellCodec,
    buf: BytesMut,
    peer: SocketAddr,
}

impl<W: AsyncWrite + Unpin> StreamCellWriter<W> {
    /// A writer for link version `link_version`.
    pub fn new(io: W, link_version: u16, peer: SocketAddr) -> Self {
        StreamCellWriter {
            io,
            codec: CellCodec::new(link_version),
            buf: BytesMut::with_capacity(WRITE_HIGH_WATER + 1024),
            peer,
        }
    }
}

impl<W: AsyncWrite + Unpin + Send> CellWriter for StreamCellWriter<W> {
    fn queue(&mut self, cell: AnyChanCell) -> Result<(), Error> {
        let peer = self.peer;
        self.codec
            .encode(cell, &mut self.buf)
            .map_err(|source| Error::Cell { peer, source })
    }

    fn has_room(&self) -> bool {
        self.buf.len() < WRITE_HIGH_WATER
    }

    fn has_pending(&self) -> bool {
        !self.buf.is_empty()
    }

    fn buffered_bytes(&self) -> usize {
        self.buf.len()
    }

    async fn flush(&mut self) -> Result<(), Error> {
        let peer = self.peer;
        if !self.buf.is_empty() {
            self.io
                .write_all(&self.buf)
                .await
                .map_err(|source| Error::Tls { peer, source })?;
            self.buf.clear();
        }
        self.io
            .flush()
            .await
            .map_err(|source| Error::Tls { peer, source })
    }

    async fn shutdown(&mut self) -> Result<(), Error> {
        self.flush().await?;
        let peer = self.peer;
        self.io
            .shutdown()
            .await
            .map_err(|source| Error::Tls { peer, source })
    }
}
