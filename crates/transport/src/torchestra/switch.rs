//! Torchestra's switch protocol on one link, sans-IO: which of the two
//! connections (light, heavy) each circuit's cells go on, and the
//! SWITCH / SWITCHED_CONN / SWITCHED exchange that moves a circuit from one
//! to the other without pausing it, reordering it or losing a cell. The
//! specification is `docs/torchestra.md`; this is its state machine, fed
//! the cells read from either connection and the switches asked for, and
//! answering with the cells to hand to the node (in order) and the control
//! cells to send. No I/O, no clock: the property tests drive it with any
//! interleaving of the two connections.
//!
//! Per circuit and direction the rule is: a side that moves its sending
//! from connection A to connection B writes an end marker on A (SWITCH if
//! it started the switch, SWITCHED if it answers one) and a start marker
//! (SWITCHED_CONN) first on B. Its peer takes the circuit's cells from A
//! until the end marker, and holds those that arrive on B meanwhile; at
//! the end marker it releases them. Only the node for which the link is
//! the circuit's inbound channel (the exit on its link to the middle, the
//! middle on its link to the entrance) starts switches, so two switches of
//! one circuit never cross.

use std::collections::{BTreeMap, HashSet, VecDeque};

use onionlab_cell::chan::{AnyChanCell, AnyChanMsg, ChanCell, ChanCmd, ChanMsg, CircId};
use tor_cell::chancell::msg::Unrecognized;

use crate::WireError;

/// Command of SWITCH (fixed-length, link-level; not assigned by
/// tor-spec, which leaves 13-127 free: the top of that range, to stay clear
/// of tor's future commands).
pub const CMD_SWITCH: u8 = 125;
/// Command of SWITCHED_CONN.
pub const CMD_SWITCHED_CONN: u8 = 126;
/// Command of SWITCHED.
pub const CMD_SWITCHED: u8 = 127;
/// SWITCH flag: the receiver switches the circuit on its own inbound link
/// too (set by the exit, clear from the middle).
pub const FLAG_PROPAGATE: u8 = 1;

/// One of a link's two connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Conn {
    /// The light connection: the link's first, every circuit starts here.
    Light,
    /// The heavy connection.
    Heavy,
}

impl Conn {
    /// The other connection.
    pub fn other(self) -> Conn {
        match self {
            Conn::Light => Conn::Heavy,
            Conn::Heavy => Conn::Light,
        }
    }

    fn byte(self) -> u8 {
        match self {
            Conn::Light => 0,
            Conn::Heavy => 1,
        }
    }

    fn from_byte(b: u8) -> Option<Conn> {
        match b {
            0 => Some(Conn::Light),
            1 => Some(Conn::Heavy),
            _ => None,
        }
    }
}

/// A switch control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// End of the sender's cells of the circuit on this connection; they
    /// continue on `to`. Starts a switch.
    Switch {
        /// The connection the circuit moves to.
        to: Conn,
        /// Whether the receiver switches the circuit on its inbound link too.
        propagate: bool,
    },
    /// First cell of the circuit on the connection it moved to (`to`).
    SwitchedConn {
        /// The connection this is sent on.
        to: Conn,
    },
    /// End of the answering side's cells on this connection: it has
    /// switched to `to` too. Completes a switch.
    Switched {
        /// The connection the circuit moved to.
        to: Conn,
    },
}

impl Control {
    /// The channel cell carrying this message for circuit `circ`.
    pub fn cell(self, circ: CircId) -> AnyChanCell {
        let (cmd, body) = match self {
            Control::Switch { to, propagate } => (
                CMD_SWITCH,
                vec![to.byte(), if propagate { FLAG_PROPAGATE } else { 0 }],
            ),
            Control::SwitchedConn { to } => (CMD_SWITCHED_CONN, vec![to.byte()]),
            Control::Switched { to } => (CMD_SWITCHED, vec![to.byte()]),
        };
        ChanCell::new(
            Some(circ),
            AnyChanMsg::Unrecognized(Unrecognized::new(ChanCmd::from(cmd), body)),
        )
    }

    /// The switch message in `msg`: `None` if it is another cell,
    /// `Some(Err)` if it is a switch command with a bad body.
    pub fn parse(msg: &AnyChanMsg) -> Option<Result<Control, WireError>> {
        let cmd = u8::from(msg.cmd());
        if !(CMD_SWITCH..=CMD_SWITCHED).contains(&cmd) {
            return None;
        }
        let AnyChanMsg::Unrecognized(u) = msg.clone() else {
            return Some(Err(WireError::KnownCommand(cmd)));
        };
        let mut body = Vec::new();
        // An unrecognized body re-encodes to the bytes received.
        if tor_cell::chancell::msg::Body::encode_onto(u, &mut body).is_err() {
            return Some(Err(WireError::UnreadableSwitch));
        }
        let to = body.first().copied().and_then(Conn::from_byte);
        let Some(to) = to else {
            return Some(Err(WireError::NoConnection(cmd)));
        };
        let flags = body.get(1).copied().unwrap_or(0);
        Some(Ok(match cmd {
            CMD_SWITCH => {
                if flags & !FLAG_PROPAGATE != 0 {
                    return Some(Err(WireError::UnknownSwitchFlags(flags)));
                }
                Control::Switch {
                    to,
                    propagate: flags & FLAG_PROPAGATE != 0,
                }
            }
            CMD_SWITCHED_CONN => Control::SwitchedConn { to },
            _ => Control::Switched { to },
        }))
    }
}

/// A circuit's switch state, on one side of the link.
#[derive(Debug, Default)]
struct Circuit {
    /// Where our cells of the circuit go.
    send_on: Option<Conn>,
    /// Where we take the peer's cells of the circuit from.
    recv_on: Option<Conn>,
    /// The peer's end marker on the old connection arrived: its start
    /// marker must be the circuit's next cell on `recv_on`.
    expect_start: bool,
    /// The peer's start marker of its next switch arrived on the other
    /// connection before the end marker on `recv_on`: the cells behind it
    /// are held.
    early_start: bool,
    /// Cells read from the other connection, waiting for the end marker on
    /// `recv_on`.
    held: VecDeque<AnyChanCell>,
    /// We started a switch and wait for SWITCHED.
    awaiting_switched: bool,
    /// A switch asked for while one was in progress: done after it.
    next: Option<(Conn, bool)>,
}

impl Circuit {
    fn send_on(&self) -> Conn {
        self.send_on.unwrap_or(Conn::Light)
    }
    fn recv_on(&self) -> Conn {
        self.recv_on.unwrap_or(Conn::Light)
    }
    /// What it holds against the bound: its cells, and an early start
    /// marker.
    fn pending(&self) -> usize {
        self.held.len() + usize::from(self.early_start)
    }
}

/// Why a circuit's switch failed; the circuit must be closed with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The circuit.
    pub circ: CircId,
    /// What happened.
    pub what: SwitchViolation,
}

/// How the peer broke the switch protocol, or which bound its switches
/// would pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SwitchViolation {
    /// A switch cell that cannot be read.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// More circuits with a switch state than the bound.
    #[error("more than {max} circuits with a switch state")]
    TooManyCircuits {
        /// The bound.
        max: usize,
    },
    /// More cells held for switches than the bound.
    #[error("more than {max} cells held for switches")]
    TooManyHeld {
        /// The bound.
        max: usize,
    },
    /// A cell on the connection the circuit moves to, before the start
    /// marker.
    #[error("a {cmd} cell on the {conn:?} connection before SWITCHED_CONN")]
    BeforeStart {
        /// The cell's command.
        cmd: String,
        /// The connection.
        conn: Conn,
    },
    /// The peer's SWITCH crossed ours.
    #[error("SWITCH while our own switch is in progress")]
    CrossedSwitch,
    /// A SWITCHED answering no switch of ours.
    #[error("SWITCHED without a switch of ours")]
    UnaskedSwitched,
    /// An end marker on a connection the circuit does not use.
    #[error("an end marker on the {conn:?} connection, which the circuit does not use")]
    StrayEndMarker {
        /// The connection.
        conn: Conn,
    },
    /// A start marker naming another connection than its own.
    #[error("SWITCHED_CONN for {to:?} on the {conn:?} connection")]
    MisplacedStartMarker {
        /// The connection it names.
        to: Conn,
        /// The connection it came on.
        conn: Conn,
    },
    /// A start marker the circuit's state does not expect.
    #[error("unexpected SWITCHED_CONN on the {conn:?} connection")]
    UnexpectedStartMarker {
        /// The connection.
        conn: Conn,
    },
}

/// What the link must do after [`Switches::receive`].
#[derive(Debug, Default)]
pub struct Received {
    /// Cells for the node, in order.
    pub deliver: Vec<AnyChanCell>,
    /// Control cells to queue, each on its connection, in this order
    /// (after what is already queued there).
    pub send: Vec<(Conn, AnyChanCell)>,
    /// A switch the peer started completed on our side: the circuit now
    /// runs on the connection given, and if the flag is set the node
    /// switches it on its inbound link as well.
    pub switched: Option<(CircId, Conn, bool)>,
    /// The peer broke the protocol for this circuit: close it.
    pub violation: Option<Violation>,
}

/// Circuits remembered as destroyed, at most (the oldest is forgotten
/// first).
pub const TOMBSTONES: usize = 4096;

/// The switch state of every circuit of one link, one side.
#[derive(Debug)]
pub struct Switches {
    circuits: BTreeMap<u32, Circuit>,
    /// Circuits destroyed recently (either way), oldest first: the switch
    /// messages and heavy-connection cells of theirs still in flight are
    /// stale (the peer may have answered a switch, or started one, before
    /// it read the DESTROY). A new circuit with the same ID (its CREATE
    /// cell) clears it; IDs are not reused soon by honest nodes.
    tombstones: VecDeque<u32>,
    /// Lookups only (the order is `tombstones`').
    tombstoned: HashSet<u32>,
    /// Cells held and early start markers, over all circuits.
    pending: usize,
    /// Bound on `pending` (the receiver's buffer).
    max_pending: usize,
    /// Bound on circuits with a switch state.
    max_circuits: usize,
    /// Cells dropped because they belonged to a circuit already forgotten
    /// (in flight on the other connection when it was destroyed).
    stale: u64,
}

impl Switches {
    /// No circuit switched yet; at most `max_pending` cells held at once
    /// over all circuits, and switch states for at most `max_circuits`
    /// circuits (a peer exceeding either loses the circuit concerned).
    pub fn new(max_pending: usize, max_circuits: usize) -> Self {
        Switches {
            circuits: BTreeMap::new(),
            tombstones: VecDeque::new(),
            tombstoned: HashSet::new(),
            pending: 0,
            max_pending,
            max_circuits,
            stale: 0,
        }
    }

    /// Cells held now, and early start markers (for the memory cap).
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Cells dropped as belonging to circuits already forgotten.
    pub fn stale(&self) -> u64 {
        self.stale
    }

    /// Circuits with a switch state.
    pub fn circuits(&self) -> usize {
        self.circuits.len()
    }

    /// Where circuit `circ`'s outgoing cells go now.
    pub fn send_on(&self, circ: CircId) -> Conn {
        self.circuits
            .get(&u32::from(circ))
            .map_or(Conn::Light, Circuit::send_on)
    }

    /// Whether a switch of `circ` we started is in progress.
    pub fn switching(&self, circ: CircId) -> bool {
        self.circuits
            .get(&u32::from(circ))
            .is_some_and(|c| c.awaiting_switched)
    }

    /// We queue `cell`: the connection it goes on. A DESTROY ends the
    /// circuit's switch state (the peer forgets it when it reads it).
    pub fn route(&mut self, cell: &AnyChanCell) -> Conn {
        let Some(circ) = cell.circid() else {
            return Conn::Light;
        };
        let conn = self.send_on(circ);
        match cell.msg() {
            AnyChanMsg::Destroy(_) => self.forget(circ),
            AnyChanMsg::Create2(_) | AnyChanMsg::CreateFast(_) => self.revive(circ),
            _ => {}
        }
        conn
    }

    /// Move our sending of `circ` to `to` (the link is the circuit's
    /// inbound channel here: we start its switches). Returns the
    /// control cells to queue, in order; nothing if it is there already.
    /// While a switch is in progress the request waits for its end.
    pub fn start(&mut self, circ: CircId, to: Conn, propagate: bool) -> Vec<(Conn, AnyChanCell)> {
        let id = u32::from(circ);
        if self.tombstoned.contains(&id) {
            // A move decided before the circuit was destroyed.
            return Vec::new();
        }
        if !self.circuits.contains_key(&id) && self.circuits.len() >= self.max_circuits {
            return Vec::new();
        }
        let c = self.circuits.entry(id).or_default();
        if c.awaiting_switched {
            c.next = Some((to, propagate));
            return Vec::new();
        }
        let from = c.send_on();
        if from == to {
            return Vec::new();
        }
        c.send_on = Some(to);
        c.awaiting_switched = true;
        vec![
            (from, Control::Switch { to, propagate }.cell(circ)),
            (to, Control::SwitchedConn { to }.cell(circ)),
        ]
    }

    /// A cell read from connection `conn`.
    pub fn receive(&mut self, conn: Conn, cell: AnyChanCell) -> Received {
        let mut out = Received::default();
        let Some(circ) = cell.circid() else {
            out.deliver.push(cell);
            return out;
        };
        if self.tombstoned.contains(&u32::from(circ)) {
            self.receive_destroyed(conn, circ, cell, &mut out);
            return out;
        }
        let result = match Control::parse(cell.msg()) {
            None => self.data(conn, circ, cell, &mut out),
            Some(Err(e)) => Err(e.into()),
            Some(Ok(control)) => self.control(conn, circ, control, &mut out),
        };
        if let Err(what) = result {
            self.forget(circ);
            out.violation = Some(Violation { circ, what });
            return out;
        }
        // A DESTROY handed over ends the circuit's state: cells of it
        // still in flight on the other connection are stale.
        let destroyed: Vec<CircId> = out
            .deliver
            .iter()
            .filter(|c| matches!(c.msg(), AnyChanMsg::Destroy(_)))
            .filter_map(ChanCell::circid)
            .collect();
        for circ in destroyed {
            self.forget(circ);
        }
        out
    }

    /// The circuit is gone: forget its state and what it held, and
    /// remember it as destroyed.
    pub fn forget(&mut self, circ: CircId) {
        let id = u32::from(circ);
        if let Some(c) = self.circuits.remove(&id) {
            self.pending -= c.pending();
        }
        if self.tombstoned.insert(id) {
            self.tombstones.push_back(id);
            if self.tombstones.len() > TOMBSTONES {
                if let Some(old) = self.tombstones.pop_front() {
                    self.tombstoned.remove(&old);
                }
            }
        }
    }

    /// A new circuit takes `circ`'s ID: it starts on the light
    /// connection with no switch state.
    fn revive(&mut self, circ: CircId) {
        let id = u32::from(circ);
        if self.tombstoned.remove(&id) {
            self.tombstones.retain(|t| *t != id);
        }
        if let Some(c) = self.circuits.remove(&id) {
            self.pending -= c.pending();
        }
    }

    /// A cell of a destroyed circuit: the light connection's go to the
    /// node (a new circuit's CREATE, or cells the node drops as for an
    /// unknown circuit); switch messages and heavy-connection cells are
    /// stale.
    fn receive_destroyed(
        &mut self,
        conn: Conn,
        circ: CircId,
        cell: AnyChanCell,
        out: &mut Received,
    ) {
        let creates = matches!(
            cell.msg(),
            AnyChanMsg::Create2(_) | AnyChanMsg::CreateFast(_)
        );
        if conn == Conn::Light && Control::parse(cell.msg()).is_none() {
            if creates {
                self.revive(circ);
            }
            out.deliver.push(cell);
        } else {
            self.stale += 1;
        }
    }

    /// The state of `circ`, made if the bound allows.
    fn state(&mut self, circ: CircId) -> Result<&mut Circuit, SwitchViolation> {
        let id = u32::from(circ);
        if !self.circuits.contains_key(&id) && self.circuits.len() >= self.max_circuits {
            return Err(SwitchViolation::TooManyCircuits {
                max: self.max_circuits,
            });
        }
        Ok(self.circuits.entry(id).or_default())
    }

    fn data(
        &mut self,
        conn: Conn,
        circ: CircId,
        cell: AnyChanCell,
        out: &mut Received,
    ) -> Result<(), SwitchViolation> {
        let (recv_on, expect_start, early_start) = match self.circuits.get(&u32::from(circ)) {
            Some(c) => (c.recv_on(), c.expect_start, c.early_start),
            None => (Conn::Light, false, false),
        };
        if conn == recv_on {
            if expect_start {
                return Err(SwitchViolation::BeforeStart {
                    cmd: cell.msg().cmd().to_string(),
                    conn,
                });
            }
            out.deliver.push(cell);
            return Ok(());
        }
        if !early_start {
            // Sent before the circuit (or this ID's previous circuit) was
            // destroyed: nobody wants it.
            self.stale += 1;
            return Ok(());
        }
        if self.pending >= self.max_pending {
            return Err(SwitchViolation::TooManyHeld {
                max: self.max_pending,
            });
        }
        self.pending += 1;
        self.state(circ)?.held.push_back(cell);
        Ok(())
    }

    fn control(
        &mut self,
        conn: Conn,
        circ: CircId,
        control: Control,
        out: &mut Received,
    ) -> Result<(), SwitchViolation> {
        match control {
            Control::SwitchedConn { to } => self.start_marker(conn, circ, to),
            Control::Switch { to, propagate } => {
                let c = self.state(circ)?;
                if c.awaiting_switched {
                    return Err(SwitchViolation::CrossedSwitch);
                }
                let released = self.end_marker(conn, circ, to)?;
                out.deliver.extend(released);
                // Our cells follow the peer's.
                let c = self.state(circ)?;
                let from = c.send_on();
                if from != to {
                    c.send_on = Some(to);
                    out.send.push((from, Control::Switched { to }.cell(circ)));
                    out.send.push((to, Control::SwitchedConn { to }.cell(circ)));
                }
                out.switched = Some((circ, to, propagate));
                Ok(())
            }
            Control::Switched { to } => {
                let Some(c) = self.circuits.get(&u32::from(circ)) else {
                    // Our switch of a circuit we destroyed since.
                    self.stale += 1;
                    return Ok(());
                };
                if !c.awaiting_switched || to != c.send_on() {
                    return Err(SwitchViolation::UnaskedSwitched);
                }
                let released = self.end_marker(conn, circ, to)?;
                out.deliver.extend(released);
                let c = self.state(circ)?;
                c.awaiting_switched = false;
                if let Some((next, propagate)) = c.next.take() {
                    out.send.extend(self.start(circ, next, propagate));
                }
                Ok(())
            }
        }
    }

    /// The peer's end marker for its direction on `conn`: its cells
    /// continue on `to`. Returns the held cells, now in order.
    fn end_marker(
        &mut self,
        conn: Conn,
        circ: CircId,
        to: Conn,
    ) -> Result<Vec<AnyChanCell>, SwitchViolation> {
        let c = self.state(circ)?;
        if conn != c.recv_on() || to != conn.other() || c.expect_start {
            return Err(SwitchViolation::StrayEndMarker { conn });
        }
        c.recv_on = Some(to);
        if !c.early_start {
            c.expect_start = true;
            return Ok(Vec::new());
        }
        c.early_start = false;
        let released: Vec<AnyChanCell> = c.held.drain(..).collect();
        self.pending -= released.len() + 1;
        Ok(released)
    }

    /// The peer's start marker, on the connection it moves to.
    fn start_marker(&mut self, conn: Conn, circ: CircId, to: Conn) -> Result<(), SwitchViolation> {
        if to != conn {
            return Err(SwitchViolation::MisplacedStartMarker { to, conn });
        }
        let pending_full = self.pending >= self.max_pending;
        let max = self.max_pending;
        let c = self.state(circ)?;
        if conn == c.recv_on() && c.expect_start {
            c.expect_start = false;
            return Ok(());
        }
        if conn != c.recv_on() && !c.early_start {
            if pending_full {
                return Err(SwitchViolation::TooManyHeld { max });
            }
            c.early_start = true;
            self.pending += 1;
            return Ok(());
        }
        Err(SwitchViolation::UnexpectedStartMarker { conn })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use onionlab_cell::codec::CellCodec;

    /// The control cells cross the link codec unchanged: encoded as
    /// fixed-length cells, decoded as unrecognized commands, parsed back.
    #[test]
    fn control_cells_cross_the_link_codec() {
        let circ = CircId::new(0x8000_0007).expect("nonzero");
        for control in [
            Control::Switch {
                to: Conn::Heavy,
                propagate: true,
            },
            Control::Switch {
                to: Conn::Light,
                propagate: false,
            },
            Control::SwitchedConn { to: Conn::Heavy },
            Control::Switched { to: Conn::Light },
        ] {
            for version in [4, 5] {
                let mut codec = CellCodec::new(version);
                let mut wire = BytesMut::new();
                codec
                    .encode(control.cell(circ), &mut wire)
                    .expect("encodes");
                assert_eq!(wire.len(), 514, "a fixed-length cell");
                let cell = codec.decode(&mut wire).expect("decodes").expect("whole");
                assert_eq!(cell.circid(), Some(circ));
                assert_eq!(Control::parse(cell.msg()), Some(Ok(control)));
            }
        }
        // Bad bodies.
        let bad = |cmd: u8, body: Vec<u8>| {
            AnyChanMsg::Unrecognized(Unrecognized::new(ChanCmd::from(cmd), body))
        };
        assert!(matches!(
            Control::parse(&bad(CMD_SWITCH, vec![2, 0])),
            Some(Err(_))
        ));
        assert!(matches!(
            Control::parse(&bad(CMD_SWITCH, vec![1, 2])),
            Some(Err(_))
        ));
        assert!(matches!(
            Control::parse(&bad(CMD_SWITCHED, vec![])),
            Some(Err(_))
        ));
        assert!(Control::parse(&bad(124, vec![0])).is_none());
    }
}
