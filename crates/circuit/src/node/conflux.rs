//! Linked sets at the exit (proposal 329, generalised to m legs; see
//! [`crate::conflux`]).
//!
//! A CONFLUX_LINK on an exit circuit names a set by its nonce: the first
//! LINK makes the set, later ones with the same nonce join it (at most
//! [`MAX_LEGS_PER_SET`] legs, and only while no stream data has moved:
//! resuming a set is not supported). Each leg answers CONFLUX_LINKED at
//! once. The set gets a [`CircKey`] of its own: its streams' events carry
//! it, and the driver's `exit_*` calls with it reach the set's streams.
//!
//! When a leg closes, the whole set closes (its other legs are destroyed
//! and [`NodeEvent::CircuitClosed`] names the set), as C tor does when
//! data may have been in flight: no stream is left waiting for bytes that
//! went down with a leg.
//!
//! Memory: a set's stream buffers and out-of-order queue count toward the
//! node's total ([`RelayNode::total_queued_bytes`]).

use std::time::Instant;

use onionlab_cell::chan::DestroyReason;
use onionlab_cell::msg::{V1DesiredUx, V1LinkPayload, V1Nonce};
use rand::SeedableRng;
use tor_bytes::Writeable;

use super::{CircEntry, CircKey, NodeEvent, RelayNode};
use crate::conflux::set::{LegMap, SetCore, SetLeg};
use crate::conflux::DEFAULT_MAX_OUT_OF_ORDER;
use crate::err::CloseReason;
use crate::relay::exit_streams::ExitStreams;
use crate::relay::RelayCircEvent;

/// Most legs one set may have.
pub const MAX_LEGS_PER_SET: usize = 8;

/// One set at this exit.
pub(super) struct ExitSet {
    core: SetCore<CircKey>,
    streams: ExitStreams,
    nonce: [u8; 32],
    /// Bytes last added to the node's total for this set.
    accounted: usize,
}

/// The node's circuit table as the set reaches its legs.
struct NodeLegs<'a>(&'a mut std::collections::BTreeMap<CircKey, CircEntry>);

impl LegMap<CircKey> for NodeLegs<'_> {
    fn leg(&mut self, key: CircKey) -> Option<&mut dyn SetLeg> {
        self.0.get_mut(&key).map(|e| &mut e.circ as &mut dyn SetLeg)
    }
}

/// What the node keeps for its sets.
#[derive(Default)]
pub(super) struct ExitSets {
    sets: std::collections::BTreeMap<CircKey, ExitSet>,
    by_nonce: std::collections::BTreeMap<[u8; 32], CircKey>,
    /// The set of each linked leg.
    leg_set: std::collections::BTreeMap<CircKey, CircKey>,
    /// LINKs seen by `refresh_events`, handled after it.
    pending_links: Vec<(CircKey, V1Nonce)>,
    /// Linked legs that closed, handled after `refresh_events`.
    closed_legs: Vec<(CircKey, CloseReason)>,
    /// Set while the sets are being settled (no re-entry from the legs'
    /// refreshes).
    busy: bool,
}

impl ExitSets {
    /// Note a circuit event that concerns sets; true if it was one.
    pub(super) fn note(&mut self, key: CircKey, ev: &RelayCircEvent) -> bool {
        match ev {
            RelayCircEvent::Link { nonce, .. } => {
                self.pending_links.push((key, *nonce));
                true
            }
            RelayCircEvent::Closed { reason, .. } => {
                if self.leg_set.contains_key(&key) {
                    self.closed_legs.push((key, reason.clone()));
                }
                false
            }
            _ => false,
        }
    }

    /// Whether `circ` names a set.
    pub(super) fn contains(&self, circ: CircKey) -> bool {
        self.sets.contains_key(&circ)
    }

    /// The streams of set `circ`.
    pub(super) fn streams(&mut self, circ: CircKey) -> Option<&mut ExitStreams> {
        self.sets.get_mut(&circ).map(|s| &mut s.streams)
    }

    /// The streams of set `circ`, to look at.
    pub(super) fn streams_ref(&self, circ: CircKey) -> Option<&ExitStreams> {
        self.sets.get(&circ).map(|s| &s.streams)
    }

    /// Sets at this node.
    pub(super) fn len(&self) -> usize {
        self.sets.len()
    }
}

/// The nonce as a map key.
fn nonce_key(nonce: &V1Nonce) -> [u8; 32] {
    let mut bytes = Vec::with_capacity(32);
    // Writing 32 bytes into a Vec cannot fail.
    let _ = nonce.write_onto(&mut bytes);
    let mut key = [0u8; 32];
    let n = bytes.len().min(32);
    key[..n].copy_from_slice(&bytes[..n]);
    key
}

impl RelayNode {
    /// After circuit `key` was refreshed: link the legs that asked, close
    /// the sets whose legs closed, and move the messages of `key`'s set.
    pub(super) fn settle_sets(&mut self, now: Instant, key: CircKey) {
        // Every circuit refresh (the per-cell path) passes here: O(1) when
        // the node has no sets and no links pending.
        let s = &self.sets;
        if s.busy || (s.leg_set.is_empty() && s.pending_links.is_empty()) {
            return;
        }
        self.sets.busy = true;
        for (leg, nonce) in std::mem::take(&mut self.sets.pending_links) {
            self.link_leg(now, leg, nonce);
        }
        for (leg, reason) in std::mem::take(&mut self.sets.closed_legs) {
            if let Some(set) = self.sets.leg_set.remove(&leg) {
                self.close_set(now, set, reason);
            }
        }
        if let Some(&set) = self.sets.leg_set.get(&key) {
            self.pump_set(now, set);
        }
        self.sets.busy = false;
    }

    /// Join circuit `leg` to the set `nonce` names (made if new), and
    /// answer CONFLUX_LINKED; or destroy it if it may not join.
    fn link_leg(&mut self, now: Instant, leg: CircKey, nonce: V1Nonce) {
        let key = nonce_key(&nonce);
        let set = match self.sets.by_nonce.get(&key) {
            Some(&set) => set,
            None => {
                let set = CircKey(self.next_key);
                self.next_key += 1;
                let cc = self.config.circuit.cc;
                let streams = ExitStreams::new(
                    self.config.circuit.streams.clone(),
                    crate::stream::StreamFlowKind::at(cc, crate::xonxoff::EdgePosition::Exit),
                );
                let core = SetCore::new(
                    self.config.conflux_scheduler,
                    rand::rngs::StdRng::from_rng(&mut self.rng),
                    DEFAULT_MAX_OUT_OF_ORDER,
                );
                self.sets.sets.insert(
                    set,
                    ExitSet {
                        core,
                        streams,
                        nonce: key,
                        accounted: 0,
                    },
                );
                self.sets.by_nonce.insert(key, set);
                set
            }
        };
        let refusal = match self.sets.sets.get(&set) {
            Some(s) if s.core.legs().len() >= MAX_LEGS_PER_SET => Some("too many legs in the set"),
            Some(s) if s.core.has_moved_data() => Some("the set already carried data"),
            Some(_) => None,
            None => Some("no such set"),
        };
        let accepted = match (refusal, self.circuits.get_mut(&leg)) {
            (None, Some(entry)) => entry
                .circ
                .accept_leg(now, V1LinkPayload::new(nonce, V1DesiredUx::NO_OPINION))
                .is_ok(),
            (Some(why), Some(entry)) => {
                entry
                    .circ
                    .destroy(CloseReason::local(DestroyReason::PROTOCOL, why));
                false
            }
            (_, None) => false,
        };
        if accepted {
            if let Some(s) = self.sets.sets.get_mut(&set) {
                s.core.add_leg(leg);
            }
            self.sets.leg_set.insert(leg, set);
        } else if self
            .sets
            .sets
            .get(&set)
            .is_some_and(|s| s.core.legs().is_empty())
        {
            self.forget_set(set);
        }
        self.refresh_circuit(now, leg);
    }

    /// Move set `set`'s messages: what its legs received to its streams,
    /// what its streams have onto its legs; pass its streams' events on.
    pub(super) fn pump_set(&mut self, now: Instant, set: CircKey) {
        let Some(s) = self.sets.sets.get_mut(&set) else {
            return;
        };
        let mut legs = NodeLegs(&mut self.circuits);
        let moved = s
            .core
            .pump_in(now, &mut s.streams, &mut legs)
            .and_then(|()| s.core.pump_out(now, &mut s.streams, &mut legs));
        while let Some(ev) = s.streams.poll_event() {
            self.events.push_back(match ev {
                RelayCircEvent::Connect { stream, host, port } => NodeEvent::ExitConnect {
                    circ: set,
                    stream,
                    host,
                    port,
                },
                RelayCircEvent::Resolve { stream, host } => NodeEvent::ExitResolve {
                    circ: set,
                    stream,
                    host,
                },
                RelayCircEvent::Stream(event) => NodeEvent::ExitStream { circ: set, event },
                // The streams make no other events.
                _ => continue,
            });
        }
        let bytes =
            s.streams.buffered_bytes() + s.core.out_of_order_len() * crate::QUEUED_CELL_BYTES;
        self.circ_bytes = self.circ_bytes - s.accounted + bytes;
        s.accounted = bytes;
        let legs = s.core.legs().to_vec();
        match moved {
            Ok(_) => {
                for leg in legs {
                    self.refresh_circuit(now, leg);
                }
            }
            Err(e) => self.close_set(now, set, CloseReason::violation(e.to_string())),
        }
    }

    /// Close set `set`: destroy its legs, and say so.
    fn close_set(&mut self, now: Instant, set: CircKey, reason: CloseReason) {
        let Some(s) = self.forget_set(set) else {
            return;
        };
        for &leg in s.core.legs() {
            self.sets.leg_set.remove(&leg);
            if let Some(entry) = self.circuits.get_mut(&leg) {
                entry.circ.destroy(reason.clone());
            }
            self.refresh_circuit(now, leg);
        }
        self.events
            .push_back(NodeEvent::CircuitClosed { circ: set, reason });
    }

    fn forget_set(&mut self, set: CircKey) -> Option<ExitSet> {
        let s = self.sets.sets.remove(&set)?;
        self.sets.by_nonce.remove(&s.nonce);
        self.circ_bytes -= s.accounted;
        Some(s)
    }

    /// Messages set `set` holds behind a gap (None: no such set).
    pub fn set_out_of_order_len(&self, set: CircKey) -> Option<usize> {
        self.sets.sets.get(&set).map(|s| s.core.out_of_order_len())
    }

    /// Linked sets at this node.
    pub fn n_sets(&self) -> usize {
        self.sets.len()
    }
}

#[cfg(test)]
mod tests;
