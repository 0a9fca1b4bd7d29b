//! Torchestra's switch protocol (`torchestra::switch`) between two sides
//! in simulated time, with property tests: any interleaving of the two
//! connections (each in order, as TCP is), switches of several circuits
//! at random moments (concurrent, and asked for again mid-switch), and the
//! loss of either connection. Every data cell of every circuit arrives
//! exactly once and in order, or (after a loss) an in-order prefix does;
//! the cells held for switches never exceed their bound; and a hostile
//! peer's out-of-protocol cells close only the circuit they name.

use std::collections::{BTreeMap, VecDeque};

use onionlab_cell::chan::{
    AnyChanCell, AnyChanMsg, ChanCell, CircId, Destroy, DestroyReason, Relay,
};
use onionlab_transport::torchestra::switch::{Conn, Control, SwitchViolation, Switches};
use proptest::prelude::*;

const MAX_PENDING: usize = 4096;

fn data(circ: u32, seq: u32) -> AnyChanCell {
    let mut body = [0u8; 509];
    body[..4].copy_from_slice(&seq.to_be_bytes());
    ChanCell::new(CircId::new(circ), AnyChanMsg::Relay(Relay::new(body)))
}

fn seq_of(cell: &AnyChanCell) -> Option<(u32, u32)> {
    let AnyChanMsg::Relay(r) = cell.msg().clone() else {
        return None;
    };
    let body = r.into_relay_body();
    Some((
        u32::from(cell.circid()?),
        u32::from_be_bytes(body[..4].try_into().ok()?),
    ))
}

/// One side: its switch state, what it sent per circuit, what it got.
struct Side {
    sw: Switches,
    next_seq: BTreeMap<u32, u32>,
    got: BTreeMap<u32, Vec<u32>>,
}

impl Side {
    fn new() -> Self {
        Side {
            sw: Switches::new(MAX_PENDING, 1024),
            next_seq: BTreeMap::new(),
            got: BTreeMap::new(),
        }
    }
}

/// The two connections' queues in each direction: `queues[from][conn]`.
struct Net {
    sides: [Side; 2],
    queues: [[VecDeque<AnyChanCell>; 2]; 2],
    lost: [bool; 2],
    max_pending_seen: usize,
}

fn idx(c: Conn) -> usize {
    match c {
        Conn::Light => 0,
        Conn::Heavy => 1,
    }
}

impl Net {
    fn new() -> Self {
        Net {
            sides: [Side::new(), Side::new()],
            queues: Default::default(),
            lost: [false; 2],
            max_pending_seen: 0,
        }
    }

    fn push(&mut self, from: usize, conn: Conn, cell: AnyChanCell) {
        if !self.lost[idx(conn)] {
            self.queues[from][idx(conn)].push_back(cell);
        }
    }

    /// Side `from` sends its next data cell of `circ`.
    fn send_data(&mut self, from: usize, circ: u32) {
        let s = &mut self.sides[from];
        let seq = s.next_seq.entry(circ).or_insert(0);
        let cell = data(circ, *seq);
        *seq += 1;
        let conn = s.sw.route(&cell);
        self.push(from, conn, cell);
    }

    /// Side 0 (for which the link is the circuits' inbound channel) starts
    /// a switch of `circ`.
    fn switch(&mut self, circ: u32, to: Conn) {
        let circ_id = CircId::new(circ).expect("nonzero");
        for (conn, cell) in self.sides[0].sw.start(circ_id, to, true) {
            self.push(0, conn, cell);
        }
    }

    /// Deliver the next cell on connection `conn` from side `from`.
    fn deliver(&mut self, from: usize, conn: Conn) {
        let Some(cell) = self.queues[from][idx(conn)].pop_front() else {
            return;
        };
        let to = 1 - from;
        let r = self.sides[to].sw.receive(conn, cell);
        assert!(r.violation.is_none(), "violation: {:?}", r.violation);
        for cell in r.deliver {
            if let Some((circ, seq)) = seq_of(&cell) {
                self.sides[to].got.entry(circ).or_default().push(seq);
            }
        }
        for (conn, cell) in r.send {
            self.push(to, conn, cell);
        }
        let pending = self.sides[to].sw.pending();
        assert!(pending <= MAX_PENDING);
        self.max_pending_seen = self.max_pending_seen.max(pending);
    }

    fn lose(&mut self, conn: Conn) {
        self.lost[idx(conn)] = true;
        for q in &mut self.queues {
            q[idx(conn)].clear();
        }
    }

    fn drain(&mut self, rng: &mut impl FnMut(usize) -> usize) {
        loop {
            let ready: Vec<(usize, Conn)> = [
                (0, Conn::Light),
                (0, Conn::Heavy),
                (1, Conn::Light),
                (1, Conn::Heavy),
            ]
            .into_iter()
            .filter(|(f, c)| !self.queues[*f][idx(*c)].is_empty())
            .collect();
            if ready.is_empty() {
                return;
            }
            let (f, c) = ready[rng(ready.len())];
            self.deliver(f, c);
        }
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// A side sends a data cell of a circuit.
    Send(usize, u32),
    /// Side 0 switches a circuit.
    Switch(u32, bool),
    /// One cell of a connection arrives.
    Deliver(usize, bool),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => (0usize..2, 1u32..5).prop_map(|(s, c)| Step::Send(s, c)),
        1 => (1u32..5, any::<bool>()).prop_map(|(c, h)| Step::Switch(c, h)),
        4 => (0usize..2, any::<bool>()).prop_map(|(s, h)| Step::Deliver(s, h)),
    ];
    prop::collection::vec(step, 1..600)
}

fn run(net: &mut Net, steps: &[Step]) {
    for step in steps {
        match *step {
            Step::Send(s, c) => net.send_data(s, c),
            Step::Switch(c, heavy) => net.switch(c, if heavy { Conn::Heavy } else { Conn::Light }),
            Step::Deliver(s, heavy) => {
                net.deliver(s, if heavy { Conn::Heavy } else { Conn::Light })
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Without loss, everything arrives once and in order, whatever the
    /// interleaving and however often circuits switch.
    #[test]
    fn every_cell_arrives_once_and_in_order(steps in steps(), seed in any::<u64>()) {
        let mut net = Net::new();
        run(&mut net, &steps);
        let mut state = seed | 1;
        let mut rng = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        net.drain(&mut rng);
        for from in 0..2 {
            let sent = &net.sides[from].next_seq;
            let got = &net.sides[1 - from].got;
            for (circ, n) in sent {
                let want: Vec<u32> = (0..*n).collect();
                prop_assert_eq!(got.get(circ).cloned().unwrap_or_default(), want, "circuit {} from side {}", circ, from);
            }
            prop_assert_eq!(net.sides[1 - from].sw.pending(), 0);
        }
        // Every switch finished.
        for c in 1..5 {
            prop_assert!(!net.sides[0].sw.switching(CircId::new(c).unwrap()));
        }
    }

    /// A connection lost at a random moment: what arrived is an in-order
    /// prefix of what was sent, never a gap, a duplicate or a reordering.
    #[test]
    fn after_a_lost_connection_what_arrived_is_an_in_order_prefix(
        steps in steps(),
        cut in 0usize..600,
        heavy in any::<bool>(),
    ) {
        let mut net = Net::new();
        let cut = cut.min(steps.len());
        run(&mut net, &steps[..cut]);
        net.lose(if heavy { Conn::Heavy } else { Conn::Light });
        run(&mut net, &steps[cut..]);
        let mut i = 0usize;
        net.drain(&mut |n| { i += 1; i % n });
        for side in &net.sides {
            for (circ, got) in &side.got {
                let want: Vec<u32> = (0..got.len() as u32).collect();
                prop_assert_eq!(got, &want, "circuit {}", circ);
            }
        }
    }
}

#[test]
fn a_switch_asked_for_mid_switch_waits_for_the_first() {
    let mut net = Net::new();
    net.send_data(0, 1);
    net.switch(1, Conn::Heavy);
    // Back to light before SWITCHED came: deferred.
    net.switch(1, Conn::Light);
    assert!(net.sides[0].sw.switching(CircId::new(1).unwrap()));
    assert_eq!(
        net.sides[0].sw.send_on(CircId::new(1).unwrap()),
        Conn::Heavy
    );
    net.send_data(0, 1);
    let mut i = 0;
    net.drain(&mut |n| {
        i += 1;
        i % n
    });
    let c = CircId::new(1).unwrap();
    assert_eq!(net.sides[0].sw.send_on(c), Conn::Light);
    assert!(!net.sides[0].sw.switching(c));
    assert_eq!(net.sides[1].got[&1], vec![0, 1]);
}

#[test]
fn heavy_cells_wait_for_the_end_marker_and_are_bounded() {
    // The start marker and cells on heavy arrive long before SWITCH on
    // light (which sits behind light's backlog): held, in order.
    let mut b = Switches::new(8, 16);
    let c = CircId::new(9).unwrap();
    assert!(b
        .receive(
            Conn::Heavy,
            Control::SwitchedConn { to: Conn::Heavy }.cell(c)
        )
        .violation
        .is_none());
    for i in 0..7 {
        let r = b.receive(Conn::Heavy, data(9, 100 + i));
        assert!(r.deliver.is_empty() && r.violation.is_none());
    }
    assert_eq!(b.pending(), 8);
    // The bound: one more is a violation that closes this circuit only.
    let r = b.receive(Conn::Heavy, data(9, 107));
    assert!(matches!(
        r.violation.unwrap().what,
        SwitchViolation::TooManyHeld { .. }
    ));
    assert_eq!(b.pending(), 0);
    // Another circuit still works, and holds again up to the bound.
    let d = CircId::new(10).unwrap();
    let r = b.receive(Conn::Light, data(10, 0));
    assert_eq!(r.deliver.len(), 1);
    assert!(b
        .receive(
            Conn::Heavy,
            Control::SwitchedConn { to: Conn::Heavy }.cell(d)
        )
        .violation
        .is_none());
    let r = b.receive(Conn::Heavy, data(10, 2));
    assert!(r.deliver.is_empty());
    let r = b.receive(Conn::Light, data(10, 1));
    assert_eq!(r.deliver.len(), 1);
    let r = b.receive(
        Conn::Light,
        Control::Switch {
            to: Conn::Heavy,
            propagate: false,
        }
        .cell(d),
    );
    let seqs: Vec<u32> = r.deliver.iter().filter_map(seq_of).map(|x| x.1).collect();
    assert_eq!(seqs, vec![2]);
    assert_eq!(r.switched, Some((d, Conn::Heavy, false)));
    // Our own direction follows: SWITCHED on light, SWITCHED_CONN on heavy.
    let sent: Vec<(Conn, Option<Control>)> = r
        .send
        .iter()
        .map(|(conn, cell)| (*conn, Control::parse(cell.msg()).and_then(Result::ok)))
        .collect();
    assert_eq!(
        sent,
        vec![
            (Conn::Light, Some(Control::Switched { to: Conn::Heavy })),
            (Conn::Heavy, Some(Control::SwitchedConn { to: Conn::Heavy })),
        ]
    );
    assert_eq!(b.pending(), 0);
}

#[test]
fn out_of_protocol_cells_close_only_their_circuit() {
    let c = CircId::new(5).unwrap();
    let cases: Vec<(Conn, AnyChanCell)> = vec![
        // SWITCHED without a switch of ours.
        (Conn::Heavy, Control::Switched { to: Conn::Light }.cell(c)),
        // An end marker on a connection the circuit does not use.
        (
            Conn::Light,
            Control::Switch {
                to: Conn::Heavy,
                propagate: false,
            }
            .cell(c),
        ),
        // SWITCHED_CONN naming the other connection.
        (
            Conn::Light,
            Control::SwitchedConn { to: Conn::Heavy }.cell(c),
        ),
    ];
    for (conn, cell) in cases {
        // b answered a switch of circuit 5 to heavy: its state is known.
        let mut b = Switches::new(8, 16);
        let r = b.receive(
            Conn::Light,
            Control::Switch {
                to: Conn::Heavy,
                propagate: false,
            }
            .cell(c),
        );
        assert!(r.violation.is_none());
        let r = b.receive(
            Conn::Heavy,
            Control::SwitchedConn { to: Conn::Heavy }.cell(c),
        );
        assert!(r.violation.is_none());
        let r = b.receive(Conn::Heavy, data(5, 1));
        assert_eq!(r.deliver.len(), 1);
        let what = format!("{:?} on {conn:?}", cell.msg());
        let r = b.receive(conn, cell);
        assert!(r.violation.is_some(), "{what} accepted");
        assert_eq!(b.circuits(), 0, "{what}: the circuit's state stays");
        // Other circuits carry on.
        let r2 = b.receive(Conn::Light, data(6, 0));
        assert!(r2.violation.is_none() && r2.deliver.len() == 1);
    }
    // A SWITCHED for a circuit without a switch state (ours was
    // destroyed since) is stale, not a violation.
    let mut b = Switches::new(8, 16);
    let r = b.receive(Conn::Light, Control::Switched { to: Conn::Heavy }.cell(c));
    assert!(r.violation.is_none());
    assert_eq!(b.stale(), 1);
    // A data cell after the end marker but before the start marker.
    let mut b = Switches::new(8, 16);
    let r = b.receive(
        Conn::Light,
        Control::Switch {
            to: Conn::Heavy,
            propagate: true,
        }
        .cell(c),
    );
    assert_eq!(r.switched, Some((c, Conn::Heavy, true)));
    let r = b.receive(Conn::Heavy, data(5, 1));
    assert!(matches!(
        r.violation.unwrap().what,
        SwitchViolation::BeforeStart { .. }
    ));
}

#[test]
fn a_destroy_ends_the_switch_state_and_the_id_starts_on_light_again() {
    let mut net = Net::new();
    net.switch(3, Conn::Heavy);
    net.send_data(0, 3);
    let mut i = 0;
    net.drain(&mut |n| {
        i += 1;
        i % n
    });
    let c = CircId::new(3).unwrap();
    assert_eq!(net.sides[0].sw.send_on(c), Conn::Heavy);
    // Side 0 destroys the circuit on heavy; side 1 forgets it on reading.
    let destroy = ChanCell::new(
        Some(c),
        AnyChanMsg::Destroy(Destroy::new(DestroyReason::FINISHED)),
    );
    let conn = net.sides[0].sw.route(&destroy);
    assert_eq!(conn, Conn::Heavy);
    net.push(0, conn, destroy);
    // Side 1 sent a cell before it read the DESTROY: stale, dropped.
    net.send_data(1, 3);
    net.drain(&mut |_| 0);
    assert_eq!(net.sides[1].sw.circuits(), 0);
    assert_eq!(net.sides[0].sw.stale(), 1);
    // The ID again: light on both sides.
    assert_eq!(net.sides[0].sw.send_on(c), Conn::Light);
    assert_eq!(net.sides[1].sw.send_on(c), Conn::Light);
}
