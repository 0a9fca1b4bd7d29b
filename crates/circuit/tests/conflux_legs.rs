//! A client circuit and an exit circuit as legs of a linked set, driven
//! against each other with real cells and crypto (one hop, no node): the
//! LINK / LINKED / LINKED_ACK handshake with its RTTs, stream messages kept
//! for the set in arrival order with the SWITCHes between them, circuit
//! windows and SENDMEs still per leg, and the refusals.

use std::time::{Duration, Instant};

use onionlab_cell::chan::AnyChanMsg;
use onionlab_cell::msg::{
    AnyRelayMsg, Begin, BeginFlags, Connected, Data, StreamId, V1DesiredUx, V1LinkPayload, V1Nonce,
};
use onionlab_circuit::client::{ClientCircuit, ClientConfig, ClientEvent};
use onionlab_circuit::conflux::LegInput;
use onionlab_circuit::relay::{RelayCircEvent, RelayCircuit, RelayConfig, Side};
use onionlab_crypto::identity::RelaySecretKeys;
use rand::rngs::StdRng;
use rand::SeedableRng;

struct Pair {
    client: ClientCircuit,
    exit: RelayCircuit,
    now: Instant,
    exit_events: Vec<RelayCircEvent>,
    client_events: Vec<ClientEvent>,
}

impl Pair {
    /// A built one-hop circuit to an exit with `conflux` on or off.
    fn new(conflux: bool) -> Pair {
        let keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(1));
        let mut client = ClientCircuit::new(
            ClientConfig::default(),
            &keys.public(),
            StdRng::seed_from_u64(2),
        );
        let now = Instant::now();
        let Some(AnyChanMsg::Create2(create)) = client.poll_transmit(now) else {
            panic!("expected CREATE2");
        };
        let config = RelayConfig {
            exit: true,
            allow_one_hop_streams: true,
            conflux,
            ..RelayConfig::default()
        };
        let mut exit = RelayCircuit::accept(config, &keys, &create, StdRng::seed_from_u64(3))
            .expect("handshake");
        exit.set_first_hop(true);
        let mut p = Pair {
            client,
            exit,
            now,
            exit_events: Vec::new(),
            client_events: Vec::new(),
        };
        p.pump();
        assert_eq!(p.client.n_hops(), 1);
        assert_eq!(p.client_events, [ClientEvent::HopAdded { hops: 1 }]);
        p.client_events.clear();
        p
    }

    /// Move cells both ways until both sides are quiet.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            while let Some(cell) = self.client.poll_transmit(self.now) {
                self.exit.handle_inbound(self.now, cell);
                moved = true;
            }
            while let Some(cell) = self.exit.poll_transmit(self.now, Side::Inbound) {
                self.client.handle_cell(self.now, cell);
                moved = true;
            }
            while let Some(ev) = self.exit.poll_event() {
                self.exit_events.push(ev);
            }
            while let Some(ev) = self.client.poll_event() {
                self.client_events.push(ev);
            }
            if !moved {
                return;
            }
        }
    }

    /// LINK, LINKED and LINKED_ACK with `delay` each way.
    fn link(&mut self, delay: Duration) {
        let nonce = V1Nonce::new(&mut StdRng::seed_from_u64(9));
        let payload = V1LinkPayload::new(nonce, V1DesiredUx::HIGH_THROUGHPUT);
        self.client.start_leg(payload.clone()).expect("start leg");
        let link = self.client.poll_transmit(self.now).expect("LINK");
        self.now += delay;
        self.exit.handle_inbound(self.now, link);
        let Some(RelayCircEvent::Link {
            nonce: got,
            last_seqno_sent: 0,
            last_seqno_recv: 0,
        }) = self.exit.poll_event()
        else {
            panic!("expected a Link event");
        };
        assert_eq!(got, nonce);
        self.exit.accept_leg(self.now, payload).expect("accept");
        let linked = self
            .exit
            .poll_transmit(self.now, Side::Inbound)
            .expect("LINKED");
        self.now += delay;
        self.client.handle_cell(self.now, linked);
        assert!(matches!(
            self.client.poll_event(),
            Some(ClientEvent::Linked { .. })
        ));
        self.client.send_linked_ack().expect("ack");
        let ack = self.client.poll_transmit(self.now).expect("LINKED_ACK");
        self.now += delay;
        self.exit.handle_inbound(self.now, ack);
        assert!(self.client.is_leg() && self.exit.is_leg());
    }
}

fn sid(n: u16) -> StreamId {
    StreamId::new(n).expect("nonzero")
}

#[test]
fn linking_measures_the_rtt_at_both_ends() {
    let mut p = Pair::new(true);
    p.link(Duration::from_millis(20));
    let ms = |d: Option<Duration>| d.map(|d| d.as_millis());
    assert_eq!(ms(p.client.leg_state().expect("leg").link_rtt), Some(40));
    assert_eq!(ms(p.exit.leg_state().expect("leg").link_rtt), Some(40));
    assert!(p.exit_events.is_empty() && p.client_events.is_empty());
}

#[test]
fn stream_messages_go_to_the_set_in_order_with_their_switches() {
    let mut p = Pair::new(true);
    p.link(Duration::ZERO);
    let begin = Begin::new("example.com", 443, BeginFlags::empty()).expect("begin");
    p.client.leg_send(&[], sid(1), begin.into()).expect("send");
    let data = Data::new(b"after a gap").expect("data");
    p.client.leg_send(&[7], sid(1), data.into()).expect("send");
    p.pump();
    let got: Vec<LegInput> = std::iter::from_fn(|| p.exit.take_leg_input()).collect();
    assert!(
        matches!(
            got.as_slice(),
            [
                LegInput::Sequenced(s1, AnyRelayMsg::Begin(_)),
                LegInput::Switch(7),
                LegInput::Sequenced(s2, AnyRelayMsg::Data(_)),
            ] if *s1 == sid(1) && *s2 == sid(1)
        ),
        "{got:?}"
    );
    // No Connect event: the exit's own streams are not used by a leg.
    assert!(p.exit_events.is_empty(), "{:?}", p.exit_events);
    // And back.
    let now = p.now;
    p.exit
        .leg_send(now, &[], sid(1), Connected::new_empty().into())
        .expect("send");
    p.pump();
    assert!(matches!(
        p.client.take_leg_input(),
        Some(LegInput::Sequenced(_, AnyRelayMsg::Connected(_)))
    ));
    assert!(p.client_events.is_empty(), "{:?}", p.client_events);
}

#[test]
fn data_on_a_leg_still_moves_its_circuit_window() {
    let mut p = Pair::new(true);
    p.link(Duration::ZERO);
    let before = p.client.leg_state().expect("leg").window_room;
    for _ in 0..100 {
        assert!(p.client.leg_state().expect("leg").can_send);
        let data = Data::new(&[0x5a; 498]).expect("data");
        p.client.leg_send(&[], sid(1), data.into()).expect("send");
        let cell = p.client.poll_transmit(p.now).expect("the DATA");
        p.now += Duration::from_millis(1);
        p.exit.handle_inbound(p.now, cell);
    }
    assert_eq!(p.client.leg_state().expect("leg").window_room, before - 100);
    // The exit's circuit SENDME for those 100 cells.
    p.pump();
    let state = p.client.leg_state().expect("leg");
    assert_eq!(state.window_room, before);
    assert!(state.sendme_delay.is_some());
    assert_eq!(
        std::iter::from_fn(|| p.exit.take_leg_input()).count(),
        100,
        "every DATA kept for the set"
    );
}

#[test]
fn refusals() {
    // An exit without conflux closes the circuit on LINK.
    let mut p = Pair::new(false);
    let nonce = V1Nonce::new(&mut StdRng::seed_from_u64(1));
    p.client
        .start_leg(V1LinkPayload::new(nonce, V1DesiredUx::NO_OPINION))
        .expect("start");
    p.pump();
    assert!(p.exit.is_closed());

    // A leg carries no streams of its own, and cannot be linked twice.
    let mut p = Pair::new(true);
    p.link(Duration::ZERO);
    assert!(p.client.begin("example.com", 80).is_err());
    assert!(p
        .client
        .start_leg(V1LinkPayload::new(nonce, V1DesiredUx::NO_OPINION))
        .is_err());

    // A circuit that is not a leg refuses leg_send.
    let mut plain = Pair::new(true);
    assert!(plain
        .client
        .leg_send(&[], sid(1), Connected::new_empty().into())
        .is_err());
    assert!(plain
        .exit
        .leg_send(plain.now, &[], sid(1), Connected::new_empty().into())
        .is_err());

    // Stream messages before the exit answered the LINK break the
    // protocol.
    let mut early = Pair::new(true);
    early
        .client
        .start_leg(V1LinkPayload::new(nonce, V1DesiredUx::NO_OPINION))
        .expect("start");
    let link = early.client.poll_transmit(early.now).expect("LINK");
    early.exit.handle_inbound(early.now, link);
    assert!(!early.exit.is_closed());
    let begin = Begin::new("example.com", 80, BeginFlags::empty()).expect("begin");
    early
        .client
        .leg_send(&[], sid(1), begin.into())
        .expect("the client side queues it");
    early.pump();
    assert!(early.exit.is_closed(), "BEGIN before LINKED closes the leg");
}
