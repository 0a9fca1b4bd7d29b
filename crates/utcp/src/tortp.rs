//! TORTP, the compact header of a user-space TCP segment inside a DTLS
//! record (Reardon and Goldberg's name; the paper gives no layout, so
//! this one is ours, specified in `docs/dtls-utcp.md`).
//!
//! A TCP/IPv4 header is 40 bytes before options. Inside one DTLS session
//! the addresses are the session's and each circuit's ports are fixed, so
//! TORTP replaces addresses and ports with the lane (the circuit's TCP
//! connection) and drops the checksum (DTLS authenticates every record)
//! and the urgent pointer:
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-------------------------------------------------------------+
//! |I|                 lane number (31 bits)                       |
//! +-+-------------------------------------------------------------+
//! |                       sequence number                         |
//! +---------------------------------------------------------------+
//! |                    acknowledgment number                      |
//! +---------------+---------------+-------------------------------+
//! |     flags     | option words  |            window             |
//! +---------------+---------------+-------------------------------+
//! |          TCP options (4 x option words bytes, at most 40)     |
//! +---------------------------------------------------------------+
//! |                            payload                            |
//! ```
//!
//! All fields are big-endian. `I` says which side opened the lane: set if
//! the side that began the DTLS session did, so both sides number their
//! lanes without colliding. Flags are TCP's low bits: FIN 0x01, SYN 0x02,
//! RST 0x04, PSH 0x08, ACK 0x10; any other bit is an error. Options are
//! TCP's, as the stack wrote them.

use thiserror::Error;

/// Bytes before the options.
pub const HEADER_LEN: usize = 16;
/// Most option bytes (TCP's limit).
pub const MAX_OPTIONS_LEN: usize = 40;

/// FIN: the sender has no more data.
pub const FIN: u8 = 0x01;
/// SYN: opens a lane.
pub const SYN: u8 = 0x02;
/// RST: aborts a lane.
pub const RST: u8 = 0x04;
/// PSH.
pub const PSH: u8 = 0x08;
/// ACK: the acknowledgment number is valid.
pub const ACK: u8 = 0x10;
/// Every flag TORTP carries.
pub const KNOWN_FLAGS: u8 = FIN | SYN | RST | PSH | ACK;

/// A lane: one circuit's TCP connection inside a DTLS session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaneId(pub u32);

impl LaneId {
    /// The bit set in the lanes that the session's initiator opened.
    pub const INITIATOR_BIT: u32 = 1 << 31;

    /// Lane `number` (below 2^31) opened by the initiator or not.
    pub fn new(number: u32, by_initiator: bool) -> Option<LaneId> {
        let bit = if by_initiator { Self::INITIATOR_BIT } else { 0 };
        (number < Self::INITIATOR_BIT).then_some(LaneId(number | bit))
    }

    /// Whether the session's initiator opened this lane.
    pub fn opened_by_initiator(self) -> bool {
        self.0 & Self::INITIATOR_BIT != 0
    }

    /// The lane's number among those its opener opened.
    pub fn number(self) -> u32 {
        self.0 & !Self::INITIATOR_BIT
    }
}

impl std::fmt::Display for LaneId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = if self.opened_by_initiator() { "i" } else { "r" };
        write!(f, "{side}{}", self.number())
    }
}

/// One TORTP segment, borrowed from the bytes it was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment<'a> {
    /// The lane.
    pub lane: LaneId,
    /// TCP sequence number.
    pub seq: u32,
    /// TCP acknowledgment number (meaningful with [`ACK`]).
    pub ack: u32,
    /// Flags ([`KNOWN_FLAGS`] only).
    pub flags: u8,
    /// TCP window (scaled as negotiated on the SYNs).
    pub window: u16,
    /// TCP options, a multiple of 4 bytes, at most [`MAX_OPTIONS_LEN`].
    pub options: &'a [u8],
    /// Data.
    pub payload: &'a [u8],
}

/// Why bytes are not a TORTP segment.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TortpError {
    /// Shorter than the header or its options.
    #[error("TORTP segment truncated: {len} bytes, header and options need {need}")]
    Truncated {
        /// Bytes given.
        len: usize,
        /// Bytes the header says it has.
        need: usize,
    },
    /// Flags TORTP does not carry (URG, ECE, CWR, NS).
    #[error("TORTP flags {0:#04x} include bits it does not carry")]
    UnknownFlags(u8),
    /// More than 40 option bytes.
    #[error("TORTP options of {0} bytes (at most 40)")]
    OptionsTooLong(usize),
    /// Longer than a TCP/IPv4 packet could carry.
    #[error("TORTP segment of {0} bytes is longer than a TCP/IPv4 packet can carry")]
    TooLong(usize),
}

impl<'a> Segment<'a> {
    /// Read one segment (the whole of `bytes`).
    pub fn parse(bytes: &'a [u8]) -> Result<Segment<'a>, TortpError> {
        if bytes.len() < HEADER_LEN {
            return Err(TortpError::Truncated {
                len: bytes.len(),
                need: HEADER_LEN,
            });
        }
        let word =
            |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let flags = bytes[12];
        if flags & !KNOWN_FLAGS != 0 {
            return Err(TortpError::UnknownFlags(flags));
        }
        let options_len = usize::from(bytes[13]) * 4;
        if options_len > MAX_OPTIONS_LEN {
            return Err(TortpError::OptionsTooLong(options_len));
        }
        let need = HEADER_LEN + options_len;
        if bytes.len() < need {
            return Err(TortpError::Truncated {
                len: bytes.len(),
                need,
            });
        }
        Ok(Segment {
            lane: LaneId(word(0)),
            seq: word(4),
            ack: word(8),
            flags,
            window: u16::from_be_bytes([bytes[14], bytes[15]]),
            options: &bytes[HEADER_LEN..need],
            payload: &bytes[need..],
        })
    }

    /// Bytes [`encode`](Self::encode) writes.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.options.len() + self.payload.len()
    }

    /// Append the segment to `out`. Options must be a multiple of 4 bytes
    /// and at most 40, flags within [`KNOWN_FLAGS`] (as TCP stacks write
    /// them); otherwise the segment is not written and the error says why.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), TortpError> {
        if self.flags & !KNOWN_FLAGS != 0 {
            return Err(TortpError::UnknownFlags(self.flags));
        }
        if self.options.len() > MAX_OPTIONS_LEN || !self.options.len().is_multiple_of(4) {
            return Err(TortpError::OptionsTooLong(self.options.len()));
        }
        out.reserve(self.encoded_len());
        out.extend_from_slice(&self.lane.0.to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.ack.to_be_bytes());
        out.push(self.flags);
        // At most 10 words: fits.
        out.push((self.options.len() / 4) as u8);
        out.extend_from_slice(&self.window.to_be_bytes());
        out.extend_from_slice(self.options);
        out.extend_from_slice(self.payload);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_survives_encoding() {
        let s = Segment {
            lane: LaneId::new(7, true).expect("lane"),
            seq: 0xdead_beef,
            ack: 12,
            flags: SYN | ACK,
            window: 512,
            options: &[2, 4, 5, 0xb4],
            payload: b"cells",
        };
        let mut out = Vec::new();
        s.encode(&mut out).expect("encode");
        assert_eq!(out.len(), s.encoded_len());
        assert_eq!(out[..4], [0x80, 0, 0, 7]);
        assert_eq!(Segment::parse(&out), Ok(s));
        assert_eq!(s.lane.to_string(), "i7");
    }

    #[test]
    fn broken_segments_are_errors() {
        assert!(matches!(
            Segment::parse(&[0; 15]),
            Err(TortpError::Truncated { len: 15, need: 16 })
        ));
        let mut b = [0u8; 16];
        b[12] = 0x20; // URG
        assert_eq!(Segment::parse(&b), Err(TortpError::UnknownFlags(0x20)));
        b[12] = ACK;
        b[13] = 11;
        assert_eq!(Segment::parse(&b), Err(TortpError::OptionsTooLong(44)));
        b[13] = 1;
        assert!(matches!(
            Segment::parse(&b),
            Err(TortpError::Truncated { len: 16, need: 20 })
        ));
        let odd = Segment {
            options: &[1, 1, 1],
            ..Segment::parse(&[0; 16]).expect("empty segment")
        };
        assert!(odd.encode(&mut Vec::new()).is_err());
        assert_eq!(LaneId::new(1 << 31, false), None);
    }
}
