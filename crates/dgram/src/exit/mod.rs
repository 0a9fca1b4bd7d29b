//! The exit's end of datagram sets (`docs/datagram.md` sections 4 and
//! 5), sans-IO. Fed what the exit's [`DgramRelay`](crate::DgramRelay)
//! delivers (LINK and SEGMENT messages, circuits that ended) and time, it
//! joins circuits into sets by their nonce (answering each LINK, repeats
//! included, with LINKED), runs each set's end-to-end TCP and streams
//! ([`crate::streams`]), and asks its driver to connect each new stream.

mod memory;
mod more;

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_utcp::{LaneBudget, MuxStats, Role, Settings};

use crate::e2e::{linked_msg, parse_link, E2eSet, NONCE_LEN};
use crate::streams::{Recv, SetStreams, StreamEvent, StreamKey};
use crate::wire::{RelayCommand, RelayMsg};
use crate::{CircuitId, Error};

/// An exit's limits and end-to-end settings.
#[derive(Debug, Clone)]
pub struct ExitSetSettings {
    /// The end-to-end TCP's settings (its segment size is set to fit a
    /// message, its lanes to `max_streams_per_set`).
    pub tcp: Settings,
    /// How this end spreads segments over a set's circuits.
    pub dispatch: LegSchedulerKind,
    /// Sets at most (a LINK for a new one beyond is refused).
    pub max_sets: usize,
    /// Circuits in one set at most.
    pub max_legs: usize,
    /// Streams in one set at most.
    pub max_streams_per_set: usize,
    /// Streams in all sets at most: each holds its TCP's buffers (by
    /// default 320 KiB) from its first segment on, so this bounds the
    /// exit's memory for streams.
    pub max_streams: usize,
    /// Kernel sets ([`crate::tunnel`]) are served: the driver has a TUN
    /// device and a listener on its tunnel port. Else a LINK for one is
    /// refused.
    pub kernel: bool,
}

impl Default for ExitSetSettings {
    fn default() -> Self {
        ExitSetSettings {
            tcp: Settings::default(),
            dispatch: LegSchedulerKind::RoundRobin { cells_per_leg: 1 },
            max_sets: 4096,
            max_legs: 3,
            max_streams_per_set: 64,
            max_streams: 1024,
            kernel: false,
        }
    }
}

struct Set {
    nonce: [u8; NONCE_LEN],
    streams: SetStreams,
    /// A MORE set: no circuits; replies go on the client's SURBs.
    more: Option<more::MoreExitSet>,
}

/// What a kernel set ([`crate::tunnel`]) asks of the exit's driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelOutput {
    /// A segment from the client, for the exit's kernel (through
    /// [`crate::tunnel::to_kernel`]).
    Segment {
        /// The set.
        set: u64,
        /// The TCP segment.
        data: Vec<u8>,
    },
    /// The set ended: reset its connections, free its address.
    Closed(u64),
}

/// Every set of one exit (see the module docs).
pub struct ExitSets {
    settings: ExitSetSettings,
    sets: HashMap<u64, Set>,
    by_nonce: HashMap<[u8; NONCE_LEN], u64>,
    by_circuit: HashMap<CircuitId, u64>,
    /// MORE sets, by their identifier.
    by_more: HashMap<[u8; crate::more::wire::SET_ID_LEN], u64>,
    /// SURBs held for every MORE set.
    more_surbs: usize,
    next_set: u64,
    seed: u64,
    events: VecDeque<StreamEvent>,
    /// Circuits whose client broke the protocol.
    refuse: VecDeque<CircuitId>,
    /// LINKED answers to send.
    answers: VecDeque<(CircuitId, RelayMsg)>,
    /// Streams of every set, counted against `max_streams`.
    budget: LaneBudget,
    /// The end-to-end TCP counters of the sets that ended.
    ended: MuxStats,
    /// Kernel sets that ended, for the driver.
    kernel_closed: VecDeque<u64>,
    /// Circuits of sets ended for memory, to destroy.
    shed_circuits: VecDeque<CircuitId>,
}

impl std::fmt::Debug for ExitSets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExitSets")
            .field("sets", &self.sets.len())
            .field("circuits", &self.by_circuit.len())
            .finish_non_exhaustive()
    }
}

impl ExitSets {
    /// An exit's sets; `seed` seeds their TCPs' initial sequence numbers
    /// and leg choices (take it from a CSPRNG outside tests).
    ///
    /// # Errors
    ///
    /// [`Error::Settings`] for a dispatch rule datagram sets cannot run,
    /// or the TCP's settings' error.
    pub fn new(mut settings: ExitSetSettings, seed: u64) -> Result<Self, Error> {
        settings.tcp.max_lanes = settings.max_streams_per_set;
        // Refuse bad settings now, not at the first LINK.
        E2eSet::new(
            &settings.tcp,
            Role::Responder,
            settings.dispatch,
            seed,
            Instant::now(),
        )?;
        Ok(ExitSets {
            sets: HashMap::new(),
            by_nonce: HashMap::new(),
            by_circuit: HashMap::new(),
            by_more: HashMap::new(),
            more_surbs: 0,
            next_set: 1,
            seed,
            events: VecDeque::new(),
            refuse: VecDeque::new(),
            answers: VecDeque::new(),
            budget: LaneBudget::new(settings.max_streams),
            ended: MuxStats::default(),
            kernel_closed: VecDeque::new(),
            shed_circuits: VecDeque::new(),
            settings,
        })
    }

    /// Sets held.
    pub fn sets(&self) -> usize {
        self.sets.len()
    }

    /// The end-to-end TCP counters of every set, ended or not.
    pub fn e2e_stats(&self) -> MuxStats {
        SetStreams::total_stats(self.ended, self.sets.values().map(|s| &s.streams))
    }

    /// Streams the driver holds, in every set.
    pub fn streams(&self) -> usize {
        self.sets.values().map(|s| s.streams.held()).sum()
    }

    /// A message the client sent on `circuit` (the relay's
    /// `RelayOutput::Delivered`).
    pub fn handle_msg(&mut self, now: Instant, circuit: CircuitId, msg: RelayMsg) {
        match msg.command {
            RelayCommand::Link => self.on_link(now, circuit, &msg.data),
            RelayCommand::Segment => {
                // A segment before its circuit's LINK (lost, or behind)
                // is dropped: the client resends the LINK until answered,
                // and the TCP its segment.
                if let Some(&id) = self.by_circuit.get(&circuit) {
                    if let Some(set) = self.sets.get_mut(&id) {
                        set.streams.e2e.handle_segment(&msg.data, now);
                        set.streams.after_tcp(now, id, true, &mut self.events);
                    }
                }
            }
            _ => self.refuse.push_back(circuit),
        }
    }

    /// `circuit` ended (the relay's `RelayOutput::Closed`): its set sends
    /// on the others; a set left with none ends, and its streams read as
    /// reset.
    pub fn circuit_closed(&mut self, circuit: CircuitId) {
        let Some(id) = self.by_circuit.remove(&circuit) else {
            return;
        };
        let empty = self
            .sets
            .get_mut(&id)
            .is_some_and(|set| set.streams.e2e.remove_leg(circuit));
        if empty {
            self.remove_set(id);
        }
    }

    /// Forget set `id` and every index to it; a kernel set is closed, the
    /// streams read as reset. Returns its circuits (none if it had ended).
    fn remove_set(&mut self, id: u64) -> Vec<CircuitId> {
        let Some(set) = self.sets.remove(&id) else {
            return Vec::new();
        };
        let legs = set.streams.e2e.legs().to_vec();
        for circuit in &legs {
            self.by_circuit.remove(circuit);
        }
        if set.streams.e2e.is_kernel() {
            self.kernel_closed.push_back(id);
        }
        match &set.more {
            Some(more) => {
                self.by_more.remove(&more.id);
                self.more_surbs -= more.surbs.len();
            }
            // (A MORE set has no nonce.)
            None => {
                self.by_nonce.remove(&set.nonce);
            }
        }
        self.ended += set.streams.fail(id, &mut self.events);
        legs
    }

    /// A kernel set: a segment from the exit's kernel for the client (the
    /// payload of a packet [`crate::tunnel::from_kernel`] let through);
    /// `false` if it was dropped (no such kernel set, or its queue is
    /// full).
    pub fn send_kernel_segment(&mut self, set: u64, segment: &[u8]) -> bool {
        self.sets
            .get_mut(&set)
            .is_some_and(|s| s.streams.e2e.send_kernel_segment(segment.to_vec()))
    }

    /// What the kernel sets ask next: segments for the exit's kernel,
    /// and sets that ended.
    pub fn poll_kernel(&mut self) -> Option<KernelOutput> {
        if let Some(set) = self.kernel_closed.pop_front() {
            return Some(KernelOutput::Closed(set));
        }
        self.sets.iter_mut().find_map(|(&set, s)| {
            let data = s.streams.e2e.poll_kernel_segment()?;
            Some(KernelOutput::Segment { set, data })
        })
    }

    /// The next circuit whose client broke the protocol: end it (the
    /// relay's `refuse`).
    pub fn poll_refused(&mut self) -> Option<CircuitId> {
        self.refuse.pop_front()
    }

    /// The next thing for the driver.
    pub fn poll_event(&mut self) -> Option<StreamEvent> {
        self.events.pop_front()
    }

    /// The next message to send and its circuit (for the relay's
    /// `send_to_client`): LINKED answers, then segments.
    pub fn poll_transmit(&mut self) -> Option<(CircuitId, RelayMsg)> {
        if let Some(answer) = self.answers.pop_front() {
            return Some(answer);
        }
        self.sets
            .values_mut()
            .find_map(|s| s.streams.e2e.poll_transmit())
    }

    /// Run the TCPs' timers; forget MORE sets gone silent.
    pub fn handle_timeout(&mut self, now: Instant) {
        for (&id, set) in self.sets.iter_mut() {
            if set.streams.e2e.poll_timeout().is_some_and(|t| t <= now) {
                set.streams.e2e.mux().handle_timeout(now);
                set.streams.after_tcp(now, id, true, &mut self.events);
            }
        }
        self.forget_silent_more(now);
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.sets
            .values()
            .flat_map(|s| {
                let silent = s.more.as_ref().map(more::MoreExitSet::silent_at);
                s.streams.e2e.poll_timeout().into_iter().chain(silent)
            })
            .min()
    }

    /// The driver connected `stream`: the answer 0 goes to the client and
    /// bytes may flow.
    pub fn connected(&mut self, now: Instant, stream: StreamKey) {
        self.with_set(now, stream, |s, now| {
            s.connected(now, stream.lane);
        });
        self.events.push_back(StreamEvent::Wake(stream));
    }

    /// The driver could not connect `stream`: `reason` (tor-spec's END
    /// reason, not 0) goes to the client, the lane closes, and the
    /// stream is no longer the driver's.
    pub fn refused(&mut self, now: Instant, stream: StreamKey, reason: u8) {
        self.with_set(now, stream, |s, now| s.refused(now, stream.lane, reason));
    }

    /// Queue the target's bytes on `stream`; how many fit (0: wait for a
    /// [`StreamEvent::Wake`]).
    ///
    /// # Errors
    ///
    /// [`Error::Transport`] if the stream cannot send any more.
    pub fn send(&mut self, now: Instant, stream: StreamKey, data: &[u8]) -> Result<usize, Error> {
        self.with_set(now, stream, |s, now| s.send(now, stream.lane, data))
            .unwrap_or_else(|| Err(onionlab_utcp::Error::NoLane(stream.lane).into()))
    }

    /// Read what the client sent on `stream`.
    pub fn recv(&mut self, now: Instant, stream: StreamKey, buf: &mut [u8]) -> Recv {
        self.with_set(now, stream, |s, now| s.recv(now, stream.lane, buf))
            .unwrap_or(Recv::Reset)
    }

    /// The target closed its side cleanly: FIN after what is queued.
    pub fn close(&mut self, now: Instant, stream: StreamKey) {
        self.with_set(now, stream, |s, now| s.close(now, stream.lane));
    }

    /// The target's connection failed, or the driver gives up: reset the
    /// stream and forget it.
    pub fn abort(&mut self, now: Instant, stream: StreamKey) {
        self.with_set(now, stream, |s, now| s.abort(now, stream.lane));
    }

    /// The driver is done with a stream that ended: forget it.
    pub fn forget(&mut self, stream: StreamKey) {
        if let Some(set) = self.sets.get_mut(&stream.set) {
            set.streams.forget(stream.lane);
        }
    }

    /// Run `f` on `stream`'s set between two looks at its TCP (a lane
    /// that just ended is marked before `f` reads it); `None` if the set
    /// is gone.
    fn with_set<T>(
        &mut self,
        now: Instant,
        stream: StreamKey,
        f: impl FnOnce(&mut SetStreams, Instant) -> T,
    ) -> Option<T> {
        let set = self.sets.get_mut(&stream.set)?;
        set.streams
            .after_tcp(now, stream.set, false, &mut self.events);
        let out = f(&mut set.streams, now);
        set.streams
            .after_tcp(now, stream.set, false, &mut self.events);
        Some(out)
    }

    fn on_link(&mut self, now: Instant, circuit: CircuitId, data: &[u8]) {
        let Some((nonce, kernel)) = parse_link(data) else {
            return self.refuse.push_back(circuit);
        };
        if kernel && !self.settings.kernel {
            // This exit has no TUN device for the kernel's TCP.
            return self.refuse.push_back(circuit);
        }
        let same_kind = |set: &Set| set.streams.e2e.is_kernel() == kernel;
        let id = match (self.by_circuit.get(&circuit), self.by_nonce.get(&nonce)) {
            // A repeated LINK (our LINKED was lost).
            (Some(&a), Some(&b)) if a == b && self.sets.get(&a).is_some_and(same_kind) => a,
            // A circuit already in another set.
            (Some(_), _) => return self.refuse.push_back(circuit),
            (None, Some(&id)) => {
                let Some(set) = self.sets.get_mut(&id) else {
                    return;
                };
                if set.streams.e2e.legs().len() >= self.settings.max_legs || !same_kind(set) {
                    return self.refuse.push_back(circuit);
                }
                set.streams.e2e.add_leg(circuit);
                id
            }
            (None, None) => {
                if self.sets.len() >= self.settings.max_sets {
                    return self.refuse.push_back(circuit);
                }
                let id = self.next_set;
                self.next_set += 1;
                let seed = self.seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let e2e = if kernel {
                    E2eSet::kernel(Role::Responder, self.settings.dispatch, seed, now)
                } else {
                    E2eSet::new(
                        &self.settings.tcp,
                        Role::Responder,
                        self.settings.dispatch,
                        seed,
                        now,
                    )
                };
                let Ok(mut e2e) = e2e else {
                    return self.refuse.push_back(circuit);
                };
                e2e.mux().set_budget(self.budget.clone());
                e2e.add_leg(circuit);
                self.sets.insert(
                    id,
                    Set {
                        nonce,
                        streams: SetStreams::new(e2e),
                        more: None,
                    },
                );
                self.by_nonce.insert(nonce, id);
                id
            }
        };
        self.by_circuit.insert(circuit, id);
        self.answers.push_back((circuit, linked_msg(&nonce)));
    }
}
