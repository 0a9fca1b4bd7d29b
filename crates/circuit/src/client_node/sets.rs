//! Linked sets at the client (proposal 329, generalised to m legs; see
//! [`crate::conflux`]).
//!
//! [`ClientNode::launch_set`] builds one circuit (leg) per path, all to the
//! same exit. Each leg sends CONFLUX_LINK with the set's nonce once its
//! path is built, and CONFLUX_LINKED_ACK when LINKED comes back (its build
//! deadline runs until then). When every leg is linked the set is built:
//! [`ClientNodeEvent::Built`] names the set's own [`CircKey`], and the
//! stream calls (`begin`, `write`, `read`...) with that key use the set.
//! The legs themselves never appear in the node's events.
//!
//! If a leg closes, the set closes with it ([`ClientNodeEvent::Closed`]
//! names the set; a build failure if it was not built yet), and its other
//! legs are destroyed: streams fail where the application sees it, never
//! lose bytes silently.

use std::collections::BTreeSet;
use std::time::Instant;

use onionlab_cell::chan::DestroyReason;
use onionlab_cell::msg::{V1DesiredUx, V1LinkPayload, V1Nonce};
use rand::SeedableRng;

use super::{BuildFailure, Circ, ClientNode, ClientNodeEvent, PathHop};
use crate::client::streams::ClientStreams;
use crate::client::ClientEvent;
use crate::conflux::sched::LegSchedulerKind;
use crate::conflux::set::{LegMap, SetCore, SetLeg};
use crate::conflux::DEFAULT_MAX_OUT_OF_ORDER;
use crate::err::{CloseReason, Error};
use crate::flow::CircuitCc;
use crate::node::CircKey;

/// One set of the client.
pub(super) struct ClientSet {
    pub(super) core: SetCore<CircKey>,
    pub(super) streams: ClientStreams,
    legs: Vec<CircKey>,
    payload: V1LinkPayload,
    linked: BTreeSet<CircKey>,
    started: Instant,
    pub(super) built: bool,
}

/// The node's circuit table as a set reaches its legs.
struct NodeLegs<'a>(&'a mut std::collections::BTreeMap<CircKey, Circ>);

impl LegMap<CircKey> for NodeLegs<'_> {
    fn leg(&mut self, key: CircKey) -> Option<&mut dyn SetLeg> {
        self.0
            .get_mut(&key)
            .filter(|c| !c.closed)
            .map(|c| &mut c.circ as &mut dyn SetLeg)
    }
}

impl ClientNode {
    /// Start a linked set: one leg per path in `paths` (each guard first,
    /// all ending at the same exit), circuit congestion control `cc`,
    /// `scheduler` choosing the leg of each cell this end sends. Returns
    /// the set's key.
    pub fn launch_set(
        &mut self,
        now: Instant,
        paths: Vec<Vec<PathHop>>,
        cc: CircuitCc,
        scheduler: LegSchedulerKind,
    ) -> Result<CircKey, Error> {
        let exits: BTreeSet<_> = paths
            .iter()
            .map(|p| p.last().map(|h| h.keys.ed_identity))
            .collect();
        if paths.is_empty() || exits.len() != 1 || exits.contains(&None) {
            return Err(Error::BadState(
                "a set needs paths that all end at the same exit",
            ));
        }
        let set = CircKey(self.next_circ);
        self.next_circ += 1;
        let nonce = V1Nonce::new(&mut self.rng);
        let streams = ClientStreams::new(
            self.config.circuit.streams.clone(),
            crate::stream::StreamFlowKind::at(cc, crate::xonxoff::EdgePosition::Client),
            self.config.circuit.max_control_queue,
        );
        let core = SetCore::new(
            scheduler,
            rand::rngs::StdRng::from_rng(&mut self.rng),
            DEFAULT_MAX_OUT_OF_ORDER,
        );
        self.sets.insert(
            set,
            ClientSet {
                core,
                streams,
                legs: Vec::new(),
                payload: V1LinkPayload::new(nonce, V1DesiredUx::HIGH_THROUGHPUT),
                linked: BTreeSet::new(),
                started: now,
                built: false,
            },
        );
        for path in paths {
            let leg = self.launch_leg(now, path, cc, set);
            if let Some(s) = self.sets.get_mut(&set) {
                s.legs.push(leg);
            }
        }
        Ok(set)
    }

    /// Launch one leg of `set` (its events go to the set).
    fn launch_leg(
        &mut self,
        now: Instant,
        path: Vec<PathHop>,
        cc: CircuitCc,
        set: CircKey,
    ) -> CircKey {
        // `launch` only refuses an empty path, which launch_set excluded.
        let leg = self.launch(now, path, cc).unwrap_or(CircKey(0));
        if let Some(c) = self.circuits.get_mut(&leg) {
            c.set = Some(set);
        }
        leg
    }

    /// What leg `leg` of `set` reported: extend it, link it, or close the
    /// set.
    pub(super) fn on_leg_events(
        &mut self,
        now: Instant,
        leg: CircKey,
        set: CircKey,
        events: Vec<ClientEvent>,
    ) {
        for event in events {
            match event {
                ClientEvent::HopAdded { hops } => self.leg_hop_added(leg, set, hops),
                ClientEvent::HopFailed { hop, detail } => {
                    if let Some(c) = self.circuits.get_mut(&leg) {
                        let name = c.path.get(hop).map_or("?", |h| h.name.as_str());
                        c.failure
                            .get_or_insert_with(|| format!("relay {name} failed: {detail}"));
                    }
                    let index = self
                        .sets
                        .get(&set)
                        .and_then(|s| s.legs.iter().position(|&l| l == leg));
                    if let Some(index) = index {
                        self.events.push_back(ClientNodeEvent::LegHopFailed {
                            set,
                            leg: index,
                            hop,
                        });
                    }
                }
                ClientEvent::Linked { .. } => self.leg_linked(now, leg, set),
                ClientEvent::Closed(reason) => {
                    let (timed_out, detail) = self
                        .circuits
                        .get(&leg)
                        .map_or((false, None), |c| (c.timed_out, c.failure.clone()));
                    self.close_set(now, set, reason, timed_out, detail);
                }
                // A leg has no streams of its own.
                ClientEvent::Stream(_) | ClientEvent::Resolved { .. } => {}
            }
        }
    }

    fn leg_hop_added(&mut self, leg: CircKey, set: CircKey, hops: usize) {
        let payload = self.sets.get(&set).map(|s| s.payload.clone());
        let Some(c) = self.circuits.get_mut(&leg) else {
            return;
        };
        if hops < c.path.len() {
            c.extend_to_next();
        } else if let Some(payload) = payload {
            // The path is there: link (the build deadline runs on until
            // LINKED).
            if let Err(e) = c.circ.start_leg(payload) {
                c.failure.get_or_insert_with(|| format!("cannot link: {e}"));
                c.circ.destroy();
            }
        }
    }

    fn leg_linked(&mut self, now: Instant, leg: CircKey, set: CircKey) {
        if let Some(c) = self.circuits.get_mut(&leg) {
            c.build_deadline = None;
            if c.circ.send_linked_ack().is_err() {
                return;
            }
        }
        let Some(s) = self.sets.get_mut(&set) else {
            return;
        };
        s.linked.insert(leg);
        s.core.add_leg(leg);
        if !s.built && s.linked.len() == s.legs.len() {
            s.built = true;
            self.events.push_back(ClientNodeEvent::Built {
                circ: set,
                elapsed: now.saturating_duration_since(s.started),
            });
        }
    }

    /// Move set `set`'s messages both ways, pass its streams' events on,
    /// and let the legs' channels know about their cells.
    pub(super) fn pump_set(&mut self, now: Instant, set: CircKey) {
        if self.pumping {
            return;
        }
        let Some(s) = self.sets.get_mut(&set) else {
            return;
        };
        self.pumping = true;
        let mut legs = NodeLegs(&mut self.circuits);
        let moved = s
            .core
            .pump_in(now, &mut s.streams, &mut legs)
            .and_then(|()| s.core.pump_out(now, &mut s.streams, &mut legs));
        while let Some(event) = s.streams.poll_event() {
            self.events
                .push_back(ClientNodeEvent::Circuit { circ: set, event });
        }
        let legs = s.legs.clone();
        match moved {
            Ok(_) => {
                for leg in legs {
                    self.touch(now, leg, true);
                }
            }
            Err(e) => {
                let reason = CloseReason::violation(e.to_string());
                self.close_set(now, set, reason, false, None);
            }
        }
        self.pumping = false;
    }

    /// Close set `set` (say so, destroy its legs).
    pub(super) fn close_set(
        &mut self,
        now: Instant,
        set: CircKey,
        reason: CloseReason,
        timed_out: bool,
        detail: Option<String>,
    ) {
        let Some(s) = self.sets.remove(&set) else {
            return;
        };
        let build_failure = (!s.built).then(|| {
            if timed_out {
                BuildFailure::Timeout
            } else {
                BuildFailure::Failed(detail.clone().unwrap_or_else(|| reason.to_string()))
            }
        });
        self.events.push_back(ClientNodeEvent::Closed {
            circ: set,
            reason,
            build_failure,
            detail,
        });
        for leg in s.legs {
            if let Some(c) = self.circuits.get_mut(&leg) {
                c.circ.destroy();
            }
            self.touch(now, leg, true);
        }
    }

    /// The streams of set `circ`, if it is a built set.
    pub(super) fn set_streams(
        &mut self,
        circ: CircKey,
    ) -> Option<Result<&mut ClientStreams, Error>> {
        let s = self.sets.get_mut(&circ)?;
        Some(if s.built {
            Ok(&mut s.streams)
        } else {
            Err(Error::NotBuilt)
        })
    }

    /// Close set `circ` because its stream control queue overflowed.
    pub(super) fn set_overflow(&mut self, now: Instant, circ: CircKey) {
        let reason = CloseReason::local(DestroyReason::RESOURCELIMIT, "control queue overflow");
        self.close_set(now, circ, reason, false, None);
    }
}
