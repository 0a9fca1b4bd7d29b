//! The end-to-end transport over a set of datagram circuits
//! (`docs/datagram.md` section 4): one user-space TCP per stream
//! (`onionlab_utcp::Mux`, smoltcp) between the client and the exit, its
//! segments carried in SEGMENT messages on the set's circuits, each
//! segment on the circuit the leg scheduler picks (mUDP-OR: round robin
//! with `cells_per_leg`, or random). The circuits may lose, duplicate and
//! reorder segments; the TCP recovers, reorders and controls congestion.
//!
//! A set is 1 to m circuits to one exit, joined by a 32-byte nonce the
//! client sends in a LINK message on each (as Conflux links its legs).
//! A stream is a lane: its first bytes from the client are its target
//! (one length byte, then `host:port`), the exit's first byte back is its
//! answer (0: connected; else tor-spec's END reason), then the stream's
//! bytes both ways.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use onionlab_circuit::conflux::sched::{LegScheduler, LegSchedulerKind, LegView};
use onionlab_utcp::{Mux, MuxStats, Role, Settings};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::wire::{RelayCommand, RelayMsg, MSG_DATA_LEN};
use crate::{CircuitId, Error};

/// Bytes of a set's nonce.
pub const NONCE_LEN: usize = 32;

/// Keep-alive probes on an idle stream: a peer that forgot it answers
/// with a reset, so a stream whose reset was lost ends anyway.
pub const STREAM_KEEP_ALIVE: Duration = Duration::from_secs(30);

/// The lanes' TCP settings for segments of `max_segment` bytes (what a
/// relay message or a MORE packet holds): the given settings with that
/// segment size, keep-alive at [`STREAM_KEEP_ALIVE`] and Nagle's
/// algorithm on.
///
/// Nagle's algorithm, because every segment costs a whole cell (or a
/// whole MORE packet) however little it carries. smoltcp counts its
/// congestion window in bytes and, without Nagle, sends whatever an ACK
/// freed: once one segment is short, the ACK clock keeps the sizes
/// ragged, and a download's segments carried 259 to 356 bytes on
/// average where 397 or 471 fit (lab trials of `seed004-datagram`,
/// `op` alone: MORE and mUDP-OR). Linux counts its window in segments
/// and sends full ones; with Nagle, smoltcp holds a short segment while
/// data is in flight, unless the lane is closing, so only a stream's
/// last bytes before a pause wait, for at most a round trip.
pub fn segment_settings(base: &Settings, max_segment: usize) -> Settings {
    Settings {
        max_segment,
        keep_alive: Some(STREAM_KEEP_ALIVE),
        nagle: true,
        ..base.clone()
    }
}

/// Packets a kernel set queues each way, at most: the kernel's TCP
/// takes a full queue as loss, as it would a full router's.
pub const KERNEL_QUEUE: usize = 256;

/// One end of a set: its streams' TCP and the circuits it sends on.
pub struct E2eSet {
    mux: Mux,
    legs: Vec<CircuitId>,
    sched: LegScheduler<CircuitId>,
    /// A kernel set ([`crate::tunnel`]): segments pass between the
    /// circuits and the driver's TUN device, and `mux` never has a lane.
    kernel: Option<KernelQueues>,
}

/// A kernel set's segments: from the node's kernel, waiting for a leg,
/// and from the peer, waiting for the driver.
#[derive(Default)]
struct KernelQueues {
    to_peer: VecDeque<Vec<u8>>,
    to_kernel: VecDeque<Vec<u8>>,
}

impl std::fmt::Debug for E2eSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2eSet")
            .field("legs", &self.legs)
            .finish_non_exhaustive()
    }
}

impl E2eSet {
    /// A set's end: the client's (`Role::Initiator`) or the exit's;
    /// `dispatch` is mUDP-OR's round robin or random.
    ///
    /// # Errors
    ///
    /// [`Error::Transport`] for settings the TCP refuses;
    /// [`Error::Settings`] for a leg scheduler that needs the legs' RTT or
    /// windows, which datagram circuits do not have.
    pub fn new(
        settings: &Settings,
        role: Role,
        dispatch: LegSchedulerKind,
        seed: u64,
        now: Instant,
    ) -> Result<Self, Error> {
        Self::with_segment(settings, role, dispatch, seed, now, MSG_DATA_LEN)
    }

    /// [`new`](Self::new) with segments of at most `max_segment` bytes
    /// (a MORE set's are smaller than a relay message's).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn with_segment(
        settings: &Settings,
        role: Role,
        dispatch: LegSchedulerKind,
        seed: u64,
        now: Instant,
        max_segment: usize,
    ) -> Result<Self, Error> {
        if !matches!(
            dispatch,
            LegSchedulerKind::RoundRobin { .. } | LegSchedulerKind::Random
        ) {
            return Err(Error::Settings(format!(
                "leg scheduler {dispatch:?}: datagram sets take round robin or random"
            )));
        }
        Ok(E2eSet {
            mux: Mux::new(segment_settings(settings, max_segment), role, seed, now)?,
            legs: Vec::new(),
            sched: LegScheduler::new(dispatch, StdRng::seed_from_u64(seed ^ 0x5eed)),
            kernel: None,
        })
    }

    /// A kernel set's end ([`crate::tunnel`]): the nodes' kernels run the
    /// TCP, and this end only spreads their segments over the legs.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn kernel(
        role: Role,
        dispatch: LegSchedulerKind,
        seed: u64,
        now: Instant,
    ) -> Result<Self, Error> {
        let mut set = Self::new(&Settings::default(), role, dispatch, seed, now)?;
        set.kernel = Some(KernelQueues::default());
        Ok(set)
    }

    /// Whether the nodes' kernels run this set's TCP.
    pub fn is_kernel(&self) -> bool {
        self.kernel.is_some()
    }

    /// A kernel set: a segment from the node's kernel to send; `false`
    /// if it was dropped (the queue is full, or the set is not a kernel
    /// set).
    pub fn send_kernel_segment(&mut self, segment: Vec<u8>) -> bool {
        match self.kernel.as_mut() {
            Some(k) if k.to_peer.len() < KERNEL_QUEUE => {
                k.to_peer.push_back(segment);
                true
            }
            _ => false,
        }
    }

    /// A kernel set: the next segment from the peer, for the node's
    /// kernel.
    pub fn poll_kernel_segment(&mut self) -> Option<Vec<u8>> {
        self.kernel.as_mut()?.to_kernel.pop_front()
    }

    /// Send on `circuit` too.
    pub fn add_leg(&mut self, circuit: CircuitId) {
        if !self.legs.contains(&circuit) {
            self.legs.push(circuit);
        }
    }

    /// Stop sending on `circuit` (it ended); `true` if no leg is left.
    pub fn remove_leg(&mut self, circuit: CircuitId) -> bool {
        self.legs.retain(|&c| c != circuit);
        self.legs.is_empty()
    }

    /// The circuits it sends on.
    pub fn legs(&self) -> &[CircuitId] {
        &self.legs
    }

    /// Its streams' lanes.
    pub fn lanes(&self) -> usize {
        self.mux.lanes()
    }

    /// Bytes this end holds: its lanes' TCP buffers (`lane_bytes` each,
    /// allocated whole when a lane opens) and a kernel set's queued
    /// segments.
    pub fn held_bytes(&self, lane_bytes: usize) -> usize {
        let queued: usize = self.kernel.as_ref().map_or(0, |k| {
            k.to_peer.iter().chain(&k.to_kernel).map(Vec::len).sum()
        });
        self.mux.lanes() * lane_bytes + queued
    }

    /// Its TCP's counters.
    pub fn stats(&self) -> MuxStats {
        self.mux.stats()
    }

    /// The streams.
    pub fn mux(&mut self) -> &mut Mux {
        &mut self.mux
    }

    /// When the TCP's timers must next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.mux.poll_timeout()
    }

    /// A SEGMENT message's data from any of the set's circuits.
    pub fn handle_segment(&mut self, data: &[u8], now: Instant) {
        if let Some(k) = self.kernel.as_mut() {
            // Dropped when the driver falls behind: the kernel's TCP
            // resends it.
            if k.to_kernel.len() < KERNEL_QUEUE {
                k.to_kernel.push_back(data.to_vec());
            }
            return;
        }
        // A malformed segment harms no stream; the TCP counts it.
        let _ = self.mux.handle_segment(data, now);
    }

    /// The next segment to send and the circuit it goes on; `None` when
    /// nothing is to be sent or no leg is left.
    pub fn poll_transmit(&mut self) -> Option<(CircuitId, RelayMsg)> {
        let pending = match &self.kernel {
            Some(k) => !k.to_peer.is_empty(),
            None => self.mux.has_transmit(),
        };
        if self.legs.is_empty() || !pending {
            return None;
        }
        let views: Vec<LegView<CircuitId>> = self
            .legs
            .iter()
            .map(|&leg| LegView {
                leg,
                // Datagram circuits have no window of their own: the
                // end-to-end TCP's is the only one.
                can_send: true,
                window_room: u64::MAX,
                rtt_us: None,
                cwnd: 0,
                inflight: 0,
                in_slow_start: false,
                sendme_delay_us: None,
            })
            .collect();
        // The leg first: a segment taken from the TCP must go out, and a
        // leg chosen must carry one (round robin counts it).
        let leg = self.sched.choose(&views)?;
        let segment = match self.kernel.as_mut() {
            Some(k) => k.to_peer.pop_front()?,
            None => self.mux.poll_transmit()?,
        };
        Some((
            leg,
            RelayMsg {
                command: RelayCommand::Segment,
                data: segment,
            },
        ))
    }
}

/// The byte after a LINK's nonce that makes its set a kernel set.
pub const LINK_KERNEL: u8 = 1;

/// A LINK message joining a circuit to the set of `nonce`; a kernel
/// set's ([`crate::tunnel`]) says so in one more byte.
pub fn link_msg(nonce: &[u8; NONCE_LEN], kernel: bool) -> RelayMsg {
    let mut data = nonce.to_vec();
    if kernel {
        data.push(LINK_KERNEL);
    }
    RelayMsg {
        command: RelayCommand::Link,
        data,
    }
}

/// A LINK message's nonce, and whether its set is a kernel set; `None`
/// for any other length or flag.
pub fn parse_link(data: &[u8]) -> Option<([u8; NONCE_LEN], bool)> {
    let nonce = <[u8; NONCE_LEN]>::try_from(data.get(..NONCE_LEN)?).ok()?;
    match data.get(NONCE_LEN..)? {
        [] => Some((nonce, false)),
        [LINK_KERNEL] => Some((nonce, true)),
        _ => None,
    }
}

/// The exit's answer to a LINK message: the set's nonce again.
pub fn linked_msg(nonce: &[u8; NONCE_LEN]) -> RelayMsg {
    RelayMsg {
        command: RelayCommand::Linked,
        data: nonce.to_vec(),
    }
}

/// A stream's opening bytes: its target's length and `host:port`.
///
/// # Errors
///
/// [`Error::Protocol`] for a target over 255 bytes.
pub fn stream_preamble(target: &str) -> Result<Vec<u8>, Error> {
    let len = u8::try_from(target.len()).map_err(|_| Error::Protocol("a target over 255 bytes"))?;
    let mut out = vec![len];
    out.extend_from_slice(target.as_bytes());
    Ok(out)
}

/// A stream's target, once its opening bytes are all in `buf`: the target
/// and how many bytes it took; `Ok(None)` if more are needed.
///
/// # Errors
///
/// [`Error::Protocol`] for a target that is not UTF-8 `host:port`.
pub fn parse_stream_preamble(buf: &[u8]) -> Result<Option<(String, usize)>, Error> {
    let Some((&len, rest)) = buf.split_first() else {
        return Ok(None);
    };
    let len = usize::from(len);
    let Some(target) = rest.get(..len) else {
        return Ok(None);
    };
    let target = std::str::from_utf8(target).map_err(|_| Error::Protocol("a target not UTF-8"))?;
    let ok = target
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0));
    if !ok {
        return Err(Error::Protocol("a target not host:port"));
    }
    Ok(Some((target.to_string(), 1 + len)))
}
