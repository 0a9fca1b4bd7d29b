//! Framing of channel cells on an ordered byte stream (tor-spec "Cell packet format").
//!
//! After the link handshake every cell is `CircID(4) | Command(1) | Body`, where
//! the body is 509 bytes for fixed-length commands and `Length(2) | Length bytes`
//! for variable-length ones (command 7 and >= 128). The VERSIONS cell that opens
//! a link is the exception: it still carries the obsolete 2-byte circuit ID.

use bytes::BytesMut;
use tor_cell::chancell::codec::ChannelCodec;
use tor_cell::chancell::msg::Versions;
use tor_cell::chancell::{AnyChanCell, ChanCmd};

use crate::Error;

/// Link protocol versions we speak: both use 4-byte circuit IDs.
pub const LINK_PROTOCOLS: &[u16] = &[4, 5];

/// Length of a fixed-length cell on the wire with a 4-byte circuit ID.
pub const FIXED_CELL_LEN: usize = 514;

/// Default largest body we accept in a variable-length cell. Tor's largest
/// real var cells (CERTS) are a few KiB; anything near the 65535-byte
/// maximum is a peer trying to make us buffer.
pub const DEFAULT_MAX_VAR_BODY: usize = 8 * 1024;

/// Header length of a variable-length cell: CircID(4) | Command(1) | Length(2).
const VAR_HEADER_LEN: usize = 7;

/// Encoder and decoder of channel cells for one link.
pub struct CellCodec {
    inner: ChannelCodec,
    max_var_body: usize,
}

impl CellCodec {
    /// A codec for a negotiated link protocol (4 or 5).
    pub fn new(link_version: u16) -> Self {
        CellCodec {
            inner: ChannelCodec::new(link_version),
            max_var_body: DEFAULT_MAX_VAR_BODY,
        }
    }

    /// Change the largest variable-length cell body accepted.
    pub fn with_max_var_body(mut self, max: usize) -> Self {
        self.max_var_body = max;
        self
    }

    /// Append the wire encoding of `cell` to `dst`.
    pub fn encode(&mut self, cell: AnyChanCell, dst: &mut BytesMut) -> Result<(), Error> {
        self.inner
            .write_cell(cell, dst)
            .map_err(|source| Error::Encode {
                what: "channel cell",
                source,
            })
    }

    /// Take one cell off the front of `src`.
    ///
    /// `Ok(None)` means more bytes are needed. An error means the stream is
    /// corrupt and the link must be closed: the bad cell's bytes may already
    /// have been consumed.
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<AnyChanCell>, Error> {
        if src.len() >= VAR_HEADER_LEN && ChanCmd::from(src[4]).is_var_cell() {
            let len = usize::from(u16::from_be_bytes([src[5], src[6]]));
            if len > self.max_var_body {
                return Err(Error::OversizedCell {
                    len,
                    limit: self.max_var_body,
                });
            }
        }
        match self.inner.decode_cell(src) {
            Ok(Some((cell, _raw))) => Ok(Some(cell)),
            Ok(None) => Ok(None),
            Err(e) => Err(Error::BadChanCell(e)),
        }
    }
}

/// Encode the VERSIONS cell that opens a link (2-byte circuit ID 0).
pub fn encode_versions(versions: &[u16]) -> Result<Vec<u8>, Error> {
    let map = |source| Error::Encode {
        what: "VERSIONS cell",
        source,
    };
    let cell = Versions::new(versions.to_vec()).map_err(map)?;
    cell.encode_for_handshake()
        .map_err(|e| map(tor_cell::Error::EncodeErr(e)))
}

/// Take the opening VERSIONS cell off the front of `src` and return the
/// versions it lists. `Ok(None)` means more bytes are needed.
pub fn decode_versions(src: &mut BytesMut) -> Result<Option<Vec<u16>>, Error> {
    const HEADER: usize = 5; // CircID(2) | Command(1) | Length(2)
    if src.len() < HEADER {
        return Ok(None);
    }
    if src[2] != u8::from(ChanCmd::VERSIONS) {
        return Err(Error::BadVersions("first cell is not VERSIONS"));
    }
    if src[0] != 0 || src[1] != 0 {
        return Err(Error::BadVersions("nonzero circuit ID"));
    }
    let len = usize::from(u16::from_be_bytes([src[3], src[4]]));
    if len % 2 != 0 {
        return Err(Error::BadVersions("odd body length"));
    }
    if len > 2 * 64 {
        return Err(Error::BadVersions("too many versions"));
    }
    if src.len() < HEADER + len {
        return Ok(None);
    }
    let cell = src.split_to(HEADER + len);
    Ok(Some(
        cell[HEADER..]
            .chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect(),
    ))
}

/// The highest link protocol both we and the peer support.
pub fn best_shared_version(theirs: &[u16]) -> Option<u16> {
    LINK_PROTOCOLS
        .iter()
        .copied()
        .filter(|v| theirs.contains(v))
        .max()
}
