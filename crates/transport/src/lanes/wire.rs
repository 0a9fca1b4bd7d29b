//! The pure parsing of a lane's cells, for every lane transport: the
//! lane readers ([`super::recv`]) hand over what their streams delivered
//! and call these.

use std::net::SocketAddr;

use bytes::BytesMut;
use onionlab_cell::chan::{AnyChanCell, AnyChanMsg, ChanMsg};
use onionlab_cell::codec::CellCodec;

use crate::Error;

/// The next cell of the lane of `circ_id` from `buf`, what its stream
/// delivered and was not decoded yet: `Ok(None)` (nothing consumed) if
/// `buf` holds no whole cell.
///
/// # Errors
///
/// [`Error::Cell`] for bytes the codec refuses; [`Error::Protocol`] for a
/// cell of another circuit or a link-level cell (VERSIONS, NETINFO, CERTS,
/// AUTH_CHALLENGE, AUTHENTICATE, PADDING, VPADDING), which a lane may not
/// carry.
pub fn next_lane_cell(
    codec: &mut CellCodec,
    circ_id: u32,
    buf: &mut BytesMut,
    peer: SocketAddr,
) -> Result<Option<AnyChanCell>, Error> {
    let cell = match codec.decode(buf) {
        Ok(Some(cell)) => cell,
        Ok(None) => return Ok(None),
        Err(source) => return Err(Error::Cell { peer, source }),
    };
    if cell.circid().map(u32::from) != Some(circ_id) {
        return Err(Error::Protocol {
            peer,
            detail: format!(
                "{} cell for circuit {:?} on the lane of circuit {circ_id}",
                cell.msg().cmd(),
                cell.circid().map(u32::from)
            ),
        });
    }
    match cell.msg() {
        AnyChanMsg::Versions(_)
        | AnyChanMsg::Netinfo(_)
        | AnyChanMsg::Certs(_)
        | AnyChanMsg::AuthChallenge(_)
        | AnyChanMsg::Authenticate(_)
        | AnyChanMsg::Padding(_)
        | AnyChanMsg::Vpadding(_) => Err(Error::Protocol {
            peer,
            detail: format!("{} cell on a circuit lane", cell.msg().cmd()),
        }),
        _ => Ok(Some(cell)),
    }
}

/// The end of the stream of the lane of `circ_id`, with `buffered` bytes
/// not decoded.
///
/// # Errors
///
/// [`Error::Protocol`] unless the stream ended on a cell boundary.
pub fn lane_end(circ_id: u32, buffered: usize, peer: SocketAddr) -> Result<(), Error> {
    if buffered == 0 {
        Ok(())
    } else {
        Err(Error::Protocol {
            peer,
            detail: format!("lane {circ_id} ended inside a cell ({buffered} bytes)"),
        })
    }
}
