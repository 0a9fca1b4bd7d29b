//! Torchestra at a relay (`docs/torchestra.md`): the exit classifies the
//! circuits it is the exit of, on each link to a middle, every window,
//! and asks that link's transport to move the ones whose class changed
//! (with the propagate flag); a middle told by its exit that a circuit
//! moved moves it on its own link to the entrance (without the flag); a
//! client's link is never split. The transport does the switch itself
//! and reports it back ([`RelayNode::transport_switched`]).

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use onionlab_cell::chan::CircId;

use super::{side_index, ChannelId, ChannelPeer, RelayNode};
use crate::err::CloseReason;
use crate::relay::Side;
use crate::torchestra::{Class, ClassifierParams, ConnClassifier};

/// A circuit the driver should move on a link
/// ([`RelayNode::poll_move`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitMove {
    /// The circuit's ID on the link.
    pub circ_id: CircId,
    /// To the heavy connection, or back to the light one.
    pub heavy: bool,
    /// Whether the peer moves it on its own inward link too.
    pub propagate: bool,
}

/// The exit's classifiers (when the node classifies).
#[derive(Debug)]
pub(super) struct Torchestra {
    params: ClassifierParams,
    next_window: Option<Instant>,
    classifiers: BTreeMap<ChannelId, ConnClassifier<u32>>,
}

impl Torchestra {
    pub(super) fn new(params: ClassifierParams) -> Self {
        Torchestra {
            params,
            next_window: None,
            classifiers: BTreeMap::new(),
        }
    }
}

/// Circuits to move, per channel (a middle passes switches on whether or
/// not it classifies).
pub(super) type Moves = BTreeMap<ChannelId, VecDeque<CircuitMove>>;

impl RelayNode {
    /// Run the classifier if a window ended by `now`; returns when the
    /// next one ends (`None`: Torchestra is off). Call it at that time.
    pub fn torchestra_tick(&mut self, now: Instant) -> Option<Instant> {
        let t = self.torchestra.as_mut()?;
        let window = t.params.window;
        let due = *t.next_window.get_or_insert(now + window);
        if now < due {
            return Some(due);
        }
        let next = due + window;
        t.next_window = Some(if next > now { next } else { now + window });
        self.classify_window();
        self.torchestra.as_ref().and_then(|t| t.next_window)
    }

    /// The window ended: feed every link to a relay's counts to its
    /// classifier, and queue the moves of the circuits whose class changed.
    fn classify_window(&mut self) {
        let Some(t) = self.torchestra.as_mut() else {
            return;
        };
        let params = t.params;
        t.classifiers
            .retain(|chan, _| self.channels.contains_key(chan));
        self.moves
            .retain(|chan, _| self.channels.contains_key(chan));
        for (&chan, ch) in &self.channels {
            if ch.peer != ChannelPeer::Relay {
                continue;
            }
            let k = t
                .classifiers
                .entry(chan)
                .or_insert_with(|| ConnClassifier::new(params));
            for (circ_id, (key, side)) in ch.circuits.iter() {
                let Some(entry) = self.circuits.get_mut(&key) else {
                    continue;
                };
                let cells = std::mem::take(&mut entry.window_cells[side_index(side)]);
                // We are the exit of a circuit whose inbound side is here
                // and that goes no further.
                let ours = side == Side::Inbound && entry.outbound.is_none();
                k.count(u32::from(circ_id), cells, ours);
            }
            k.retain(|id| CircId::new(*id).is_some_and(|c| ch.circuits.contains_key(&c)));
            for (id, class) in k.end_window() {
                let Some(circ_id) = CircId::new(id) else {
                    continue;
                };
                self.moves.entry(chan).or_default().push_back(CircuitMove {
                    circ_id,
                    heavy: class == Class::Heavy,
                    propagate: true,
                });
            }
        }
    }

    /// The next circuit to move on `chan`'s link (the driver hands it to
    /// the link's writer).
    pub fn poll_move(&mut self, chan: ChannelId) -> Option<CircuitMove> {
        let queue = self.moves.get_mut(&chan)?;
        let m = queue.pop_front();
        if queue.is_empty() {
            self.moves.remove(&chan);
        }
        m
    }

    pub(super) fn has_moves(&self, chan: ChannelId) -> bool {
        self.moves.contains_key(&chan)
    }

    /// The transport of `chan` completed a switch of `circ_id` the peer
    /// started. The peer must be the circuit's next hop (switches start
    /// at the exit's end): with `propagate`, the circuit moves on its
    /// inbound link too, unless that link is a client's. A switch started
    /// from the client's side is a violation that closes the circuit.
    pub fn transport_switched(
        &mut self,
        now: Instant,
        chan: ChannelId,
        circ_id: CircId,
        heavy: bool,
        propagate: bool,
    ) {
        let Some(&(key, side)) = self
            .channels
            .get(&chan)
            .and_then(|c| c.circuits.get(&circ_id))
        else {
            // The circuit is gone (its DESTROY crossed the switch).
            return;
        };
        if side == Side::Inbound {
            self.close_circuit(
                now,
                key,
                CloseReason::violation("a Torchestra switch from the circuit's previous hop"),
            );
            return;
        }
        if !propagate {
            return;
        }
        let Some(&(in_chan, in_id)) = self.circuits.get(&key).map(|e| &e.inbound) else {
            return;
        };
        let relay = self
            .channels
            .get(&in_chan)
            .is_some_and(|c| c.peer == ChannelPeer::Relay);
        if relay {
            self.moves
                .entry(in_chan)
                .or_default()
                .push_back(CircuitMove {
                    circ_id: in_id,
                    heavy,
                    propagate: false,
                });
        }
    }

    /// The transport of `chan` reports that the peer broke the switch
    /// protocol for `circ_id`: close that circuit.
    pub fn transport_violation(
        &mut self,
        now: Instant,
        chan: ChannelId,
        circ_id: CircId,
        detail: &str,
    ) {
        let key = self
            .channels
            .get(&chan)
            .and_then(|c| c.circuits.get(&circ_id))
            .map(|(key, _)| *key);
        if let Some(key) = key {
            self.close_circuit(now, key, CloseReason::violation(detail.to_string()));
        }
    }
}
