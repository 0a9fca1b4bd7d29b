//! The datagram circuits' wire formats (`docs/datagram.md` section 3.1):
//! the 529-byte cell every datagram link record carries, and the relay
//! messages inside a sealed cell's plaintext. Pure parsing, fuzzed by
//! `fuzz/fuzz_targets/dgram_wire.rs`.
//!
//! Written here: tor-cell's cells and relay messages are tor1's (514-byte
//! cells, relay bodies with `recognized` and `digest`); these are not.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use onionlab_crypto::dgram::Plaintext;
use onionlab_crypto::dgram::{SealedCell, BODY_LEN, HEADER_LEN, PLAINTEXT_LEN};
use onionlab_crypto::ntor::{CLIENT_HANDSHAKE_LEN, SERVER_HANDSHAKE_LEN};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use crate::WireError;

/// Bytes of a datagram cell: circuit ID, command, payload.
pub const CELL_LEN: usize = 4 + 1 + PAYLOAD_LEN;
/// Bytes of a cell's payload: a sealed cell's header block and body.
pub const PAYLOAD_LEN: usize = HEADER_LEN + BODY_LEN;
/// Bytes of a relay message's data.
pub const MSG_DATA_LEN: usize = PLAINTEXT_LEN - 5;

/// tor-spec's command numbers, for the four commands a datagram link
/// carries.
const CMD_RELAY: u8 = 3;
const CMD_DESTROY: u8 = 4;
const CMD_CREATE2: u8 = 10;
const CMD_CREATED2: u8 = 11;
/// ntor's handshake type in CREATE2.
const HTYPE_NTOR: u16 = 2;

/// One cell of a datagram link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DgramCell {
    /// A circuit's cell, under its layers.
    Relay {
        /// The circuit on this link (never 0).
        circ_id: u32,
        /// The header block and body.
        cell: Box<SealedCell>,
    },
    /// Open a circuit: ntor's client handshake.
    Create2 {
        /// The new circuit's ID on this link.
        circ_id: u32,
        /// `ID | B | X`.
        handshake: [u8; CLIENT_HANDSHAKE_LEN],
    },
    /// The circuit is open: ntor's server handshake.
    Created2 {
        /// The circuit.
        circ_id: u32,
        /// `Y | AUTH`.
        reply: [u8; SERVER_HANDSHAKE_LEN],
    },
    /// The circuit is gone.
    Destroy {
        /// The circuit.
        circ_id: u32,
        /// tor-spec's DESTROY reason.
        reason: u8,
    },
}

impl DgramCell {
    /// The cell's circuit.
    pub fn circ_id(&self) -> u32 {
        match *self {
            DgramCell::Relay { circ_id, .. }
            | DgramCell::Create2 { circ_id, .. }
            | DgramCell::Created2 { circ_id, .. }
            | DgramCell::Destroy { circ_id, .. } => circ_id,
        }
    }

    /// The cell's bytes (unused payload bytes zero).
    pub fn encode(&self) -> [u8; CELL_LEN] {
        let mut out = [0u8; CELL_LEN];
        out[..4].copy_from_slice(&self.circ_id().to_be_bytes());
        let payload = &mut out[5..];
        match self {
            DgramCell::Relay { cell, .. } => {
                out[4] = CMD_RELAY;
                out[5..5 + HEADER_LEN].copy_from_slice(&cell.header);
                out[5 + HEADER_LEN..].copy_from_slice(&cell.body);
            }
            DgramCell::Create2 { handshake, .. } => {
                payload[..2].copy_from_slice(&HTYPE_NTOR.to_be_bytes());
                payload[2..4].copy_from_slice(&(CLIENT_HANDSHAKE_LEN as u16).to_be_bytes());
                payload[4..4 + CLIENT_HANDSHAKE_LEN].copy_from_slice(handshake);
                out[4] = CMD_CREATE2;
            }
            DgramCell::Created2 { reply, .. } => {
                payload[..2].copy_from_slice(&(SERVER_HANDSHAKE_LEN as u16).to_be_bytes());
                payload[2..2 + SERVER_HANDSHAKE_LEN].copy_from_slice(reply);
                out[4] = CMD_CREATED2;
            }
            DgramCell::Destroy { reason, .. } => {
                payload[0] = *reason;
                out[4] = CMD_DESTROY;
            }
        }
        out
    }

    /// Parse a cell.
    ///
    /// # Errors
    ///
    /// A length other than [`CELL_LEN`], circuit ID 0, an unknown command,
    /// a handshake that is not ntor's or not of its length.
    pub fn parse(bytes: &[u8]) -> Result<DgramCell, WireError> {
        let bytes: &[u8; CELL_LEN] = bytes.try_into().map_err(|_| WireError::Length {
            what: "datagram cell",
            got: bytes.len(),
        })?;
        let circ_id = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if circ_id == 0 {
            return Err(WireError::ZeroCircuit);
        }
        let payload = &bytes[5..];
        match bytes[4] {
            CMD_RELAY => {
                let mut cell = SealedCell {
                    header: [0; HEADER_LEN],
                    body: [0; BODY_LEN],
                };
                cell.header.copy_from_slice(&payload[..HEADER_LEN]);
                cell.body.copy_from_slice(&payload[HEADER_LEN..]);
                Ok(DgramCell::Relay {
                    circ_id,
                    cell: Box::new(cell),
                })
            }
            CMD_CREATE2 => {
                let htype = u16::from_be_bytes([payload[0], payload[1]]);
                let hlen = usize::from(u16::from_be_bytes([payload[2], payload[3]]));
                if htype != HTYPE_NTOR || hlen != CLIENT_HANDSHAKE_LEN {
                    return Err(WireError::Handshake { htype, hlen });
                }
                let mut handshake = [0u8; CLIENT_HANDSHAKE_LEN];
                handshake.copy_from_slice(&payload[4..4 + CLIENT_HANDSHAKE_LEN]);
                Ok(DgramCell::Create2 { circ_id, handshake })
            }
            CMD_CREATED2 => {
                let hlen = usize::from(u16::from_be_bytes([payload[0], payload[1]]));
                if hlen != SERVER_HANDSHAKE_LEN {
                    return Err(WireError::Handshake {
                        htype: HTYPE_NTOR,
                        hlen,
                    });
                }
                let mut reply = [0u8; SERVER_HANDSHAKE_LEN];
                reply.copy_from_slice(&payload[2..2 + SERVER_HANDSHAKE_LEN]);
                Ok(DgramCell::Created2 { circ_id, reply })
            }
            CMD_DESTROY => Ok(DgramCell::Destroy {
                circ_id,
                reason: payload[0],
            }),
            other => Err(WireError::Command(other)),
        }
    }
}

/// What a relay message asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayCommand {
    /// Extend the circuit (client to its last hop).
    Extend2,
    /// The circuit was extended (last hop to the client).
    Extended2,
    /// A segment of the end-to-end transport (client and exit).
    Segment,
    /// Join this circuit to a set of circuits to the same exit (mUDP-OR).
    Link,
    /// The exit joined the circuit to the set (its answer to every LINK).
    Linked,
}

impl RelayCommand {
    fn byte(self) -> u8 {
        match self {
            RelayCommand::Extend2 => 14,
            RelayCommand::Extended2 => 15,
            // Outside tor-spec's relay commands.
            RelayCommand::Segment => 200,
            RelayCommand::Link => 201,
            RelayCommand::Linked => 202,
        }
    }

    fn of(b: u8) -> Option<Self> {
        Some(match b {
            14 => RelayCommand::Extend2,
            15 => RelayCommand::Extended2,
            200 => RelayCommand::Segment,
            201 => RelayCommand::Link,
            202 => RelayCommand::Linked,
            _ => return None,
        })
    }
}

/// A relay message: the plaintext of a sealed cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayMsg {
    /// What it asks.
    pub command: RelayCommand,
    /// Its data (at most [`MSG_DATA_LEN`] bytes).
    pub data: Vec<u8>,
}

impl RelayMsg {
    /// The plaintext: command, two reserved bytes, length, data, zeros.
    ///
    /// # Errors
    ///
    /// [`WireError::Length`] for data over [`MSG_DATA_LEN`] bytes.
    pub fn encode(&self) -> Result<Plaintext, WireError> {
        if self.data.len() > MSG_DATA_LEN {
            return Err(WireError::Length {
                what: "relay message data",
                got: self.data.len(),
            });
        }
        let mut p = [0u8; PLAINTEXT_LEN];
        p[0] = self.command.byte();
        p[3..5].copy_from_slice(&(self.data.len() as u16).to_be_bytes());
        p[5..5 + self.data.len()].copy_from_slice(&self.data);
        Ok(p)
    }

    /// Parse a plaintext.
    ///
    /// # Errors
    ///
    /// An unknown command, a length past the plaintext, or nonzero
    /// reserved or padding bytes.
    pub fn parse(p: &Plaintext) -> Result<RelayMsg, WireError> {
        let command = RelayCommand::of(p[0]).ok_or(WireError::Command(p[0]))?;
        let len = usize::from(u16::from_be_bytes([p[3], p[4]]));
        if len > MSG_DATA_LEN {
            return Err(WireError::Length {
                what: "relay message data",
                got: len,
            });
        }
        if p[1..3] != [0, 0] || p[5 + len..].iter().any(|&b| b != 0) {
            return Err(WireError::Padding);
        }
        Ok(RelayMsg {
            command,
            data: p[5..5 + len].to_vec(),
        })
    }
}

/// EXTEND2's data: where the next hop listens, who it is, and the
/// client's handshake for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extend2 {
    /// The next hop's datagram address.
    pub addr: SocketAddr,
    /// Its Ed25519 identity (its DTLS session must prove it).
    pub identity: Ed25519Identity,
    /// The client's ntor handshake for it.
    pub handshake: [u8; CLIENT_HANDSHAKE_LEN],
}

impl Extend2 {
    /// The message's data: family (4 or 6), address, port, identity,
    /// handshake.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + 16 + 2 + 32 + CLIENT_HANDSHAKE_LEN);
        match self.addr.ip() {
            IpAddr::V4(a) => {
                out.push(4);
                out.extend_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                out.push(6);
                out.extend_from_slice(&a.octets());
            }
        }
        out.extend_from_slice(&self.addr.port().to_be_bytes());
        out.extend_from_slice(self.identity.as_bytes());
        out.extend_from_slice(&self.handshake);
        out
    }

    /// Parse the data of an EXTEND2.
    ///
    /// # Errors
    ///
    /// An unknown family, port 0, or a length that does not match.
    pub fn parse(data: &[u8]) -> Result<Extend2, WireError> {
        let bad = || WireError::Length {
            what: "EXTEND2",
            got: data.len(),
        };
        let (&family, rest) = data.split_first().ok_or_else(bad)?;
        let (ip, rest): (IpAddr, &[u8]) = match family {
            4 => {
                let o: [u8; 4] = rest
                    .get(..4)
                    .ok_or_else(bad)?
                    .try_into()
                    .map_err(|_| bad())?;
                (Ipv4Addr::from(o).into(), &rest[4..])
            }
            6 => {
                let o: [u8; 16] = rest
                    .get(..16)
                    .ok_or_else(bad)?
                    .try_into()
                    .map_err(|_| bad())?;
                (Ipv6Addr::from(o).into(), &rest[16..])
            }
            other => return Err(WireError::Family(other)),
        };
        if rest.len() != 2 + 32 + CLIENT_HANDSHAKE_LEN {
            return Err(bad());
        }
        let port = u16::from_be_bytes([rest[0], rest[1]]);
        if port == 0 {
            return Err(WireError::Port);
        }
        let id: [u8; 32] = rest[2..34].try_into().map_err(|_| bad())?;
        let mut handshake = [0u8; CLIENT_HANDSHAKE_LEN];
        handshake.copy_from_slice(&rest[34..]);
        Ok(Extend2 {
            addr: SocketAddr::new(ip, port),
            identity: Ed25519Identity::from(id),
            handshake,
        })
    }
}
