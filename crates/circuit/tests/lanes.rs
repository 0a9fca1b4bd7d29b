//! Sending per circuit through the channel's scheduler
//! (`lanes_writable` + `poll_transmit_lanes`, and `lane_priority`), for
//! transports that give each circuit its own lane: the scheduler chooses
//! among the circuits whose lane has room, a full lane's circuit is set
//! aside (and its channel stops counting as busy) until its lanes drain,
//! DESTROYs go out whatever the room, and every lane gets its circuit's
//! cells complete and in order.
//!
//! Then a deterministic simulation of a QUIC-like connection that sends
//! one cell per millisecond from its lanes by stream priority: with EWMA
//! priorities a light circuit's cells go out at once past any number of
//! bulk circuits; with round robin (every lane equal) they wait their turn.

mod common;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use common::{assert_pattern, data_of, decrypt_with_tag, RawCirc, TestRelay};
use onionlab_cell::chan::{AnyChanMsg, CircId, Create2, DestroyReason, HandshakeType};
use onionlab_cell::msg::{AnyRelayMsg, Sendme, StreamId};
use onionlab_cell::relay::MAX_DATA_LEN;
use onionlab_circuit::node::{ChannelId, NodeConfig};
use onionlab_circuit::relay::RelayConfig;
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_circuit::CloseReason;

const CLIENTS: ChannelId = 1;

fn relay(scheduler: SchedulerKind) -> TestRelay {
    let config = NodeConfig {
        scheduler,
        circuit: RelayConfig {
            exit: true,
            // The tests drive one-hop circuits.
            allow_one_hop_streams: true,
            ..RelayConfig::default()
        },
        ..NodeConfig::default()
    };
    let mut r = TestRelay::new(config, 33);
    r.add_client_channel(CLIENTS);
    r
}

const KINDS: [SchedulerKind; 2] = [
    SchedulerKind::RoundRobin,
    SchedulerKind::Ewma {
        half_life: Duration::from_secs(30),
    },
];

/// The lanes of one channel by circuit ID (its value: `CircId` is not
/// `Ord`): cells written, not yet sent.
type Lanes = BTreeMap<u32, VecDeque<AnyChanMsg>>;

fn raw(id: CircId) -> u32 {
    u32::from(id)
}

/// The driver's fill: put back every circuit whose lane may have drained,
/// then write what the scheduler gives while lanes have room
/// (`room(id, cells in the lane)`). Returns how many cells were written.
fn fill(r: &mut TestRelay, lanes: &mut Lanes, room: &dyn Fn(CircId, usize) -> bool) -> usize {
    r.node.lanes_writable(r.now, CLIENTS);
    let mut n = 0;
    loop {
        let mut has_room = |id: CircId| room(id, lanes.get(&raw(id)).map_or(0, VecDeque::len));
        let next = r.node.poll_transmit_lanes(r.now, CLIENTS, &mut has_room);
        let Some(cell) = next else {
            break;
        };
        let (id, msg) = cell.into_circid_and_msg();
        let id = id.expect("no link cells after the handshake");
        lanes.entry(raw(id)).or_default().push_back(msg);
        n += 1;
    }
    r.collect_events();
    n
}

fn lanes_deliver_every_circuit_in_order(scheduler: SchedulerKind) {
    let mut r = relay(scheduler);
    let lens = [20_000, 30_000, 40_000];
    let mut circs = r.open_exit_circuits(CLIENTS, 0x8000_0001, &lens);
    let index: BTreeMap<u32, usize> = circs
        .iter()
        .enumerate()
        .map(|(i, c)| (raw(c.id), i))
        .collect();
    // Lanes of different capacities: 1, 3 and any number of cells; each
    // round the transport empties them all.
    let capacity = [1, 3, usize::MAX];
    let room = |id: CircId, len: usize| len < capacity[index[&raw(id)]];
    let mut got = vec![Vec::new(); 3];
    let mut rounds = 0;
    let mut lanes = Lanes::new();
    while fill(&mut r, &mut lanes, &room) > 0 {
        rounds += 1;
        assert!(rounds < 1000);
        // The fill stopped with work left only behind full lanes: the
        // channel must not count as busy (its writer would spin).
        assert!(
            r.node.channels_with_work().next().is_none(),
            "{scheduler:?}: busy with every lane full"
        );
        for (id, lane) in &mut lanes {
            let i = index[id];
            assert!(lane.len() <= capacity[i]);
            data_of(&mut circs[i], lane.drain(..).collect(), &mut got[i]);
        }
    }
    for (i, bytes) in got.iter().enumerate() {
        assert_pattern(bytes, i, lens[i]);
    }
    // The smallest lane set the pace: one cell per round.
    assert_eq!(rounds, lens[0].div_ceil(MAX_DATA_LEN));
    assert_eq!(r.node.total_queued_bytes(), 0);
    assert!(r.node.channels_with_work().next().is_none());
    assert!(r.node.poll_transmit(r.now, CLIENTS).is_none());
    assert!(r.node.circuits_with_work(CLIENTS).next().is_none());
}

#[test]
fn lanes_deliver_every_circuit_in_order_with_the_scheduler() {
    for kind in KINDS {
        lanes_deliver_every_circuit_in_order(kind);
    }
}

#[test]
fn a_full_lane_is_set_aside_until_lanes_writable() {
    for kind in KINDS {
        let mut r = relay(kind);
        let lens = [5_000, 6_000, 7_000];
        let mut circs = r.open_exit_circuits(CLIENTS, 0x8000_0001, &lens);
        let full = circs[0].id;
        let mut lanes = Lanes::new();
        fill(&mut r, &mut lanes, &|id, _| id != full);
        assert!(
            !lanes.contains_key(&raw(full)),
            "{kind:?}: a full lane got a cell"
        );
        for i in 1..3 {
            let mut got = Vec::new();
            let cells = lanes.remove(&raw(circs[i].id)).unwrap_or_default();
            data_of(&mut circs[i], cells.into(), &mut got);
            assert_pattern(&got, i, lens[i]);
        }
        // Its cells wait, but the channel does not count as busy, and the
        // scheduler offers nothing until the lane is said to be writable.
        assert!(r.node.channels_with_work().next().is_none(), "{kind:?}");
        assert_eq!(
            r.node.circuits_with_work(CLIENTS).collect::<Vec<_>>(),
            [full]
        );
        assert!(r
            .node
            .poll_transmit_lanes(r.now, CLIENTS, &mut |_| true)
            .is_none());
        // Idempotent.
        r.node.lanes_writable(r.now, CLIENTS);
        r.node.lanes_writable(r.now, CLIENTS);
        assert_eq!(r.node.channels_with_work().collect::<Vec<_>>(), [CLIENTS]);
        fill(&mut r, &mut lanes, &|_, _| true);
        let mut got = Vec::new();
        let cells = lanes.remove(&raw(full)).unwrap_or_default();
        data_of(&mut circs[0], cells.into(), &mut got);
        assert_pattern(&got, 0, lens[0]);
        assert!(lanes.values().all(VecDeque::is_empty));
        assert!(r.node.channels_with_work().next().is_none());
        assert_eq!(r.node.total_queued_bytes(), 0);
    }
}

#[test]
fn destroys_come_out_whatever_the_room() {
    for kind in KINDS {
        let mut r = relay(kind);
        let circs = r.open_exit_circuits(CLIENTS, 0x8000_0001, &[3000, 0, 3000]);
        r.node.close_circuit(
            r.now,
            circs[1].key,
            CloseReason::local(DestroyReason::FINISHED, "test"),
        );
        r.collect_events();
        // A CREATE2 refused (garbage onionskin) also leaves a DESTROY.
        let refused = CircId::new(0x8000_0100).expect("id");
        r.send(
            CLIENTS,
            refused,
            Create2::new(HandshakeType::NTOR, vec![0; 84]).into(),
        );
        // DESTROYs first, in the order queued, then circuits by ID.
        let busy: Vec<CircId> = r.node.circuits_with_work(CLIENTS).collect();
        assert_eq!(busy, [circs[1].id, refused, circs[0].id, circs[2].id]);

        // Every lane full: only the DESTROYs come out.
        let mut lanes = Lanes::new();
        assert_eq!(fill(&mut r, &mut lanes, &|_, _| false), 2, "{kind:?}");
        for id in [circs[1].id, refused] {
            let lane = lanes.remove(&raw(id)).unwrap_or_default();
            assert!(
                matches!(
                    lane.iter().collect::<Vec<_>>()[..],
                    [AnyChanMsg::Destroy(_)]
                ),
                "{kind:?}: {lane:?}"
            );
        }
        assert!(lanes.is_empty());
        assert_eq!(r.node.queued_destroys(CLIENTS), 0);
        assert!(r.node.channels_with_work().next().is_none(), "{kind:?}");
        let busy: Vec<CircId> = r.node.circuits_with_work(CLIENTS).collect();
        assert_eq!(busy, [circs[0].id, circs[2].id]);
        // Unknown channels give nothing and are not an error.
        r.node.lanes_writable(r.now, 99);
        assert!(r
            .node
            .poll_transmit_lanes(r.now, 99, &mut |_| true)
            .is_none());
        assert_eq!(r.node.lane_priority(r.now, 99, circs[0].id), 0);
        assert_eq!(r.node.lane_priority(r.now, CLIENTS, refused), 0);
    }
}

#[test]
fn lane_priorities_favour_light_circuits_under_ewma_only() {
    for kind in KINDS {
        let mut r = relay(kind);
        // 40, 44 and 2 DATA cells.
        let lens = [40 * MAX_DATA_LEN, 44 * MAX_DATA_LEN, 2 * MAX_DATA_LEN];
        let circs = r.open_exit_circuits(CLIENTS, 0x8000_0001, &lens);
        let mut lanes = Lanes::new();
        fill(&mut r, &mut lanes, &|_, _| true);
        let p: Vec<i32> = circs
            .iter()
            .map(|c| r.node.lane_priority(r.now, CLIENTS, c.id))
            .collect();
        match kind {
            SchedulerKind::RoundRobin => assert_eq!(p, [0, 0, 0]),
            SchedulerKind::Ewma { .. } => {
                // log2 levels: 40 and 44 cells share a level (plus the
                // same setup cells), 2 is well above.
                assert_eq!(p[0], p[1], "{p:?}");
                assert!(p[2] > p[0], "{p:?}");
                assert!(p.iter().all(|x| (-31..=0).contains(x)), "{p:?}");
                // Decay: after ten half-lives, everything is light again.
                let later = r.now + Duration::from_secs(300);
                let q = r.node.lane_priority(later, CLIENTS, circs[0].id);
                assert_eq!(q, 0);
            }
        }
    }
}

/// A client end of one circuit in the simulation: decrypts what reaches
/// it, in order, and acknowledges as tor-spec's fixed windows want (a
/// circuit SENDME per 100 DATA cells, a stream SENDME per 50) at once.
struct Client {
    c: RawCirc,
    /// The exit's ID of the stream (the client's is [`STREAM`]).
    sid: StreamId,
    data_cells: u64,
}

impl Client {
    fn receive(&mut self, r: &mut TestRelay, msg: AnyChanMsg) {
        let (_, m, tag) = decrypt_with_tag(&mut self.c, msg).expect("a relay cell");
        assert!(matches!(m, AnyRelayMsg::Data(_)), "{m:?}");
        self.data_cells += 1;
        if self.data_cells.is_multiple_of(100) {
            r.relay(&mut self.c, None, Sendme::new_tag(tag).into(), false);
        }
        if self.data_cells.is_multiple_of(50) {
            r.relay(&mut self.c, Some(STREAM), Sendme::new_empty().into(), false);
        }
    }
}

/// The client's stream on each circuit of the simulation.
const STREAM: u16 = 1;

/// Cells a lane holds in the simulation (a QUIC stream's send buffer).
const LANE_CELLS: usize = 4;
const SLOT: Duration = Duration::from_millis(1);

/// What a lane simulation measured.
struct LaneRun {
    /// Slots each of the light circuit's cells waited from the target's
    /// write to the wire.
    light_delays: Vec<u64>,
    /// Cells each bulk circuit sent.
    bulk_cells: Vec<u64>,
}

/// A connection that sends from its lanes by priority as quinn does: of
/// the lanes with cells, the one of highest priority goes first; among
/// equals, lanes take turns in the order they became ready, a lane that
/// sent going to the back while it has more.
#[derive(Default)]
struct Connection {
    /// Lanes with cells, in turn order.
    ready: VecDeque<u32>,
}

impl Connection {
    /// Note lanes that got cells since the last call.
    fn update(&mut self, lanes: &Lanes) {
        for (id, lane) in lanes {
            if !lane.is_empty() && !self.ready.contains(id) {
                self.ready.push_back(*id);
            }
        }
    }

    /// Take the next cell to send, with its lane.
    fn send(&mut self, r: &TestRelay, lanes: &mut Lanes) -> Option<(u32, AnyChanMsg)> {
        let priority =
            |id: u32| CircId::new(id).map_or(0, |c| r.node.lane_priority(r.now, CLIENTS, c));
        let best = self.ready.iter().map(|id| priority(*id)).max()?;
        let pos = self.ready.iter().position(|id| priority(*id) == best)?;
        let id = self.ready.remove(pos)?;
        let lane = lanes.get_mut(&id)?;
        let cell = lane.pop_front()?;
        if !lane.is_empty() {
            self.ready.push_back(id);
        }
        Some((id, cell))
    }
}

/// One light circuit (a cell every 100 slots) and `n_bulk` always
/// backlogged ones on one channel whose lanes hold [`LANE_CELLS`] cells;
/// each slot the driver refills the lanes through the scheduler and the
/// [`Connection`] sends one cell, by lane priority.
fn lane_sim(kind: SchedulerKind, n_bulk: usize, seconds: u64) -> LaneRun {
    let mut r = relay(kind);
    let start = r.now;
    let mut clients: Vec<Client> = (0..=n_bulk)
        .map(|i| {
            let mut c = r.open(CLIENTS, 0x8000_0001 + i as u32);
            let sid = r.begin(&mut c, STREAM);
            r.receive(&mut c);
            Client {
                c,
                sid,
                data_cells: 0,
            }
        })
        .collect();
    let index: BTreeMap<u32, usize> = clients
        .iter()
        .enumerate()
        .map(|(i, cl)| (raw(cl.c.id), i))
        .collect();
    let bulk_chunk = vec![0x42u8; 16 * MAX_DATA_LEN];
    let mut light_queued = VecDeque::new();
    let mut light_delays = Vec::new();
    let mut lanes = Lanes::new();
    let mut conn = Connection::default();
    for slot in 0..seconds * 1000 {
        r.now = start + SLOT * u32::try_from(slot).expect("slot");
        for cl in &clients[1..] {
            let room = r
                .node
                .exit_write_room(r.now, cl.c.key, cl.sid)
                .expect("room");
            let n = room.min(bulk_chunk.len());
            r.node
                .exit_write(r.now, cl.c.key, cl.sid, &bulk_chunk[..n])
                .expect("write");
        }
        if slot % 100 == 0 {
            let light = &clients[0];
            let n = r
                .node
                .exit_write(r.now, light.c.key, light.sid, &[7; MAX_DATA_LEN])
                .expect("write");
            assert_eq!(n, MAX_DATA_LEN);
            light_queued.push_back(slot);
        }
        fill(&mut r, &mut lanes, &|_, len| len < LANE_CELLS);
        conn.update(&lanes);
        let Some((id, msg)) = conn.send(&r, &mut lanes) else {
            continue;
        };
        let i = index[&id];
        clients[i].receive(&mut r, msg);
        if i == 0 {
            light_delays.push(slot - light_queued.pop_front().expect("queued"));
        }
    }
    LaneRun {
        light_delays,
        bulk_cells: clients[1..].iter().map(|c| c.data_cells).collect(),
    }
}

fn mean(v: &[u64]) -> f64 {
    v.iter().sum::<u64>() as f64 / v.len() as f64
}

#[test]
fn ewma_lane_priorities_favour_the_light_circuit() {
    let seconds = 20;
    for n_bulk in [1, 4, 16] {
        let rr = lane_sim(SchedulerKind::RoundRobin, n_bulk, seconds);
        let ew = lane_sim(KINDS[1], n_bulk, seconds);
        for run in [&rr, &ew] {
            assert_eq!(run.light_delays.len(), 200, "every light cell went out");
        }
        // After its first cell (when every circuit's history is nearly
        // empty and they may share the top level), the light circuit's
        // cells go out in the slot they are written.
        let warm = &ew.light_delays[1..];
        assert!(
            warm.iter().all(|d| *d == 0),
            "EWMA delays with {n_bulk} bulk: {:?}",
            ew.light_delays
        );
        // Lanes of equal priority (round robin) make it wait for the bulk
        // lanes ahead of it: about one slot per bulk circuit.
        let (m_rr, m_ew) = (mean(&rr.light_delays), mean(&ew.light_delays));
        assert!(m_ew < 0.1, "{n_bulk} bulk: EWMA mean {m_ew}");
        assert!(
            m_rr >= n_bulk as f64 / 2.0,
            "{n_bulk} bulk: RR {m_rr} vs EWMA {m_ew}"
        );
        // Bulk circuits share fairly under both (log2 levels put similar
        // bulk circuits at the same priority).
        for run in [&rr, &ew] {
            let total: u64 = run.bulk_cells.iter().sum();
            let fair = total / n_bulk as u64;
            assert!(
                run.bulk_cells.iter().all(|c| *c >= fair * 3 / 4),
                "{n_bulk} bulk: {:?}",
                run.bulk_cells
            );
        }
    }
}
