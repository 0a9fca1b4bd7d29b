//! Protocol violations close the offending circuit (DESTROY with a reason)
//! and nothing else. A hand-driven peer (raw ntor + relay crypto) sends what
//! an honest implementation never would.

use std::time::{Duration, Instant};

use onionlab_cell::chan::{
    AnyChanCell, AnyChanMsg, ChanCell, CircId, Create2, DestroyReason, HandshakeType, Relay,
};
use onionlab_cell::msg::{
    AnyRelayMsg, Begin, BeginFlags, Connected, Data, End, EndReason, Extend2, Sendme, StreamId,
};
use onionlab_cell::relay;
use onionlab_circuit::client::{ClientCircuit, ClientConfig, ClientEvent};
use onionlab_circuit::node::{ChannelPeer, NodeConfig, NodeEvent, RelayNode};
use onionlab_circuit::relay::RelayConfig;
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_circuit::stream::StreamEvent;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_crypto::ntor::NtorClient;
use onionlab_crypto::relay_crypto::{ClientCircuitCrypto, RelayLayer};
use rand::rngs::StdRng;
use rand::SeedableRng;

const CHAN: u64 = 1;

/// A relay node with one channel from a hand-driven client.
struct Bench {
    node: RelayNode,
    keys: RelaySecretKeys,
    rng: StdRng,
    now: Instant,
}

/// A one-hop circuit driven by hand from the client side.
struct RawCirc {
    id: CircId,
    crypto: ClientCircuitCrypto,
}

impl Bench {
    fn new(exit: bool) -> Bench {
        let mut rng = StdRng::seed_from_u64(42);
        let keys = RelaySecretKeys::generate(&mut rng);
        let copy = RelaySecretKeys::from_bytes(&keys.to_bytes()).expect("keys");
        let config = NodeConfig {
            circuit: RelayConfig {
                exit,
                // The tests drive one-hop circuits.
                allow_one_hop_streams: true,
                ..RelayConfig::default()
            },
            scheduler: SchedulerKind::RoundRobin,
            ..NodeConfig::default()
        };
        let mut node = RelayNode::new(copy, config, StdRng::seed_from_u64(1));
        node.add_channel(CHAN, false, ChannelPeer::Client);
        Bench {
            node,
            keys,
            rng,
            now: Instant::now(),
        }
    }

    fn send(&mut self, id: CircId, msg: AnyChanMsg) {
        self.node
            .handle_cell(self.now, CHAN, ChanCell::new(Some(id), msg));
    }

    /// Everything the node wants to send to the client now.
    fn drain(&mut self) -> Vec<AnyChanCell> {
        let mut out = Vec::new();
        while let Some(c) = self.node.poll_transmit(self.now, CHAN) {
            out.push(c);
        }
        out
    }

    fn events(&mut self) -> Vec<NodeEvent> {
        std::iter::from_fn(|| self.node.poll_event()).collect()
    }

    /// Open a circuit, dropping (not checking) whatever the node answers.
    fn open_without_reading(&mut self, raw_id: u32) -> RawCirc {
        let id = CircId::new(raw_id).expect("id");
        let pk = self.keys.public();
        let (_hs, onionskin) = NtorClient::start(&mut self.rng, &pk.ntor_node_id(), &pk.onion_key);
        self.send(
            id,
            Create2::new(HandshakeType::NTOR, onionskin.to_vec()).into(),
        );
        RawCirc {
            id,
            crypto: ClientCircuitCrypto::new(),
        }
    }

    fn open(&mut self, raw_id: u32) -> RawCirc {
        let id = CircId::new(raw_id).expect("id");
        let pk = self.keys.public();
        let (hs, onionskin) = NtorClient::start(&mut self.rng, &pk.ntor_node_id(), &pk.onion_key);
        self.send(
            id,
            Create2::new(HandshakeType::NTOR, onionskin.to_vec()).into(),
        );
        let out = self.drain();
        assert_eq!(out.len(), 1);
        let (cid, msg) = out.into_iter().next().expect("cell").into_circid_and_msg();
        assert_eq!(cid, Some(id));
        let AnyChanMsg::Created2(c) = msg else {
            panic!("expected CREATED2, got {msg:?}")
        };
        let keys = hs.finish(&c.into_body()).expect("handshake");
        let mut crypto = ClientCircuitCrypto::new();
        crypto.add_layer(&keys);
        RawCirc { id, crypto }
    }

    /// Encrypt and send a relay message on `c`.
    fn relay(&mut self, c: &mut RawCirc, stream: Option<u16>, msg: AnyRelayMsg, early: bool) {
        let mut body =
            relay::encode(stream.and_then(StreamId::new), msg, &mut self.rng).expect("encode");
        c.crypto.encrypt_outbound(&mut body, 0).expect("encrypt");
        let cell = Relay::from(body);
        let msg = if early {
            cell.into_early()
        } else {
            cell.into()
        };
        self.send(c.id, msg);
    }

    /// Decrypt the relay cells the node sent on `c`; other cells as-is.
    fn receive(
        &mut self,
        c: &mut RawCirc,
    ) -> Vec<Result<(Option<StreamId>, AnyRelayMsg), AnyChanMsg>> {
        let mut out = Vec::new();
        for cell in self.drain() {
            let (cid, msg) = cell.into_circid_and_msg();
            if cid != Some(c.id) {
                continue;
            }
            match msg {
                AnyChanMsg::Relay(r) => {
                    let mut body = r.into_relay_body();
                    c.crypto.decrypt_inbound(&mut body).expect("recognized");
                    out.push(Ok(relay::decode(body).expect("decode")));
                }
                other => out.push(Err(other)),
            }
        }
        out
    }

    fn begin(&mut self, c: &mut RawCirc, stream: u16) {
        let begin = Begin::new("example.com", 80, BeginFlags::empty()).expect("begin");
        self.relay(c, Some(stream), begin.into(), false);
        let ev = self.events();
        let Some((circ, s)) = ev.iter().find_map(|e| match e {
            NodeEvent::ExitConnect { circ, stream, .. } => Some((circ, stream)),
            _ => None,
        }) else {
            panic!("expected ExitConnect, got {ev:?}")
        };
        self.node
            .exit_connected(self.now, *circ, *s, None)
            .expect("connected");
        let got = self.receive(c);
        assert!(
            matches!(got.as_slice(), [Ok((Some(_), AnyRelayMsg::Connected(_)))]),
            "{got:?}"
        );
    }
}

/// The circuit was destroyed with `reason`, and said so to the client.
fn assert_destroyed(
    got: &[Result<(Option<StreamId>, AnyRelayMsg), AnyChanMsg>],
    reason: DestroyReason,
) {
    let destroyed = got
        .iter()
        .any(|m| matches!(m, Err(AnyChanMsg::Destroy(d)) if d.reason() == reason));
    assert!(destroyed, "expected DESTROY({reason}), got {got:?}");
}

/// After a violation on circuit `a`, circuit `b` on the same channel still
/// works: a stream opens and its data reaches the exit application.
fn assert_still_works(bench: &mut Bench, b: &mut RawCirc, stream: u16) {
    bench.begin(b, stream);
    bench.relay(
        b,
        Some(stream),
        Data::new(b"still here").expect("data").into(),
        false,
    );
    assert_eq!(bench.receive(b).len(), 0);
    let readable = bench.events().into_iter().find_map(|e| match e {
        NodeEvent::ExitStream {
            circ,
            event: StreamEvent::Readable { stream },
        } => Some((circ, stream)),
        _ => None,
    });
    let (circ, sid) = readable.expect("data for the exit application");
    let mut buf = [0u8; 64];
    let n = bench
        .node
        .exit_read(bench.now, circ, sid, &mut buf)
        .expect("read");
    assert_eq!(&buf[..n], b"still here");
}

#[test]
fn corrupted_cell_closes_only_its_circuit() {
    let mut bench = Bench::new(true);
    let mut a = bench.open(0x8000_0001);
    let mut b = bench.open(0x8000_0002);
    let mut body = relay::encode(None, Sendme::new_empty().into(), &mut bench.rng).expect("encode");
    a.crypto.encrypt_outbound(&mut body, 0).expect("encrypt");
    body[100] ^= 0x40;
    bench.send(a.id, Relay::from(body).into());
    let got = bench.receive(&mut a);
    assert_destroyed(&got, DestroyReason::PROTOCOL);
    assert!(bench
        .events()
        .iter()
        .any(|e| matches!(e, NodeEvent::CircuitClosed { .. })));
    assert_eq!(bench.node.n_circuits(), 1);
    assert_still_works(&mut bench, &mut b, 1);
}

#[test]
fn data_for_unknown_stream_closes_circuit() {
    let mut bench = Bench::new(true);
    let mut a = bench.open(0x8000_0001);
    let mut b = bench.open(0x8000_0002);
    bench.begin(&mut a, 1);
    bench.relay(
        &mut a,
        Some(7),
        Data::new(b"who?").expect("data").into(),
        false,
    );
    assert_destroyed(&bench.receive(&mut a), DestroyReason::PROTOCOL);
    assert_still_works(&mut bench, &mut b, 1);
}

#[test]
fn stream_window_violation_closes_circuit() {
    let mut bench = Bench::new(true);
    let mut a = bench.open(0x8000_0001);
    let mut b = bench.open(0x8000_0002);
    bench.begin(&mut a, 1);
    // The exit never reads, so it never sends a stream SENDME: 500 cells
    // fill the window, the 501st violates it.
    for i in 0..500 {
        bench.relay(
            &mut a,
            Some(1),
            Data::new(&[i as u8; 498]).expect("data").into(),
            false,
        );
    }
    let got = bench.receive(&mut a);
    assert!(
        got.iter()
            .all(|m| matches!(m, Ok((None, AnyRelayMsg::Sendme(_))))),
        "{got:?}"
    );
    assert_eq!(got.len(), 5, "a circuit SENDME per 100 cells");
    bench.relay(
        &mut a,
        Some(1),
        Data::new(b"one too many").expect("data").into(),
        false,
    );
    assert_destroyed(&bench.receive(&mut a), DestroyReason::PROTOCOL);
    assert_still_works(&mut bench, &mut b, 1);
}

#[test]
fn unexpected_circuit_sendme_closes_circuit() {
    let mut bench = Bench::new(true);
    let mut a = bench.open(0x8000_0001);
    bench.begin(&mut a, 1);
    bench.relay(&mut a, None, Sendme::new_tag([7; 20]).into(), false);
    assert_destroyed(&bench.receive(&mut a), DestroyReason::PROTOCOL);
}

#[test]
fn forged_sendme_tag_closes_circuit() {
    let mut bench = Bench::new(true);
    let mut a = bench.open(0x8000_0001);
    bench.begin(&mut a, 1);
    let ev = bench.events();
    assert!(ev.is_empty());
    let circ = onionlab_circuit::node::CircKey(1);
    let sid = StreamId::new(1).expect("id");
    bench
        .node
        .exit_write(bench.now, circ, sid, &vec![0u8; 100 * 498])
        .expect("write");
    let got = bench.receive(&mut a);
    assert_eq!(got.len(), 100);
    // A SENDME for those 100 cells, but with the wrong digest.
    bench.relay(&mut a, None, Sendme::new_tag([1; 20]).into(), false);
    assert_destroyed(&bench.receive(&mut a), DestroyReason::PROTOCOL);
}

#[test]
fn too_many_relay_early_cells_close_circuit() {
    let mut bench = Bench::new(true);
    let mut a = bench.open(0x8000_0001);
    for _ in 0..8 {
        bench.relay(
            &mut a,
            None,
            onionlab_cell::msg::Drop::default().into(),
            true,
        );
    }
    assert!(bench.receive(&mut a).is_empty());
    bench.relay(
        &mut a,
        None,
        onionlab_cell::msg::Drop::default().into(),
        true,
    );
    assert_destroyed(&bench.receive(&mut a), DestroyReason::PROTOCOL);
}

#[test]
fn extend2_outside_relay_early_closes_circuit() {
    let mut bench = Bench::new(false);
    let mut a = bench.open(0x8000_0001);
    let ext = Extend2::new(Vec::new(), HandshakeType::NTOR, vec![0; 84]);
    bench.relay(&mut a, None, ext.into(), false);
    assert_destroyed(&bench.receive(&mut a), DestroyReason::PROTOCOL);
}

#[test]
fn wrong_direction_message_closes_circuit() {
    let mut bench = Bench::new(true);
    let mut a = bench.open(0x8000_0001);
    bench.relay(&mut a, Some(1), Connected::new_empty().into(), false);
    assert_destroyed(&bench.receive(&mut a), DestroyReason::PROTOCOL);
}

#[test]
fn begin_at_non_exit_is_refused_with_end() {
    let mut bench = Bench::new(false);
    let mut a = bench.open(0x8000_0001);
    let begin = Begin::new("example.com", 80, BeginFlags::empty()).expect("begin");
    bench.relay(&mut a, Some(1), begin.into(), false);
    let got = bench.receive(&mut a);
    assert!(
        matches!(got.as_slice(), [Ok((Some(_), AnyRelayMsg::End(e)))] if e.reason() == EndReason::EXITPOLICY),
        "{got:?}"
    );
    assert_eq!(bench.node.n_circuits(), 1);
}

#[test]
fn bad_create2_gets_destroy_and_channel_lives_on() {
    let mut bench = Bench::new(true);
    let id = CircId::new(0x8000_0005).expect("id");
    bench.send(id, Create2::new(HandshakeType::NTOR, vec![1; 84]).into());
    let out = bench.drain();
    assert!(
        matches!(out.first().map(|c| c.msg()), Some(AnyChanMsg::Destroy(_))),
        "{out:?}"
    );
    let mut b = bench.open(0x8000_0006);
    assert_still_works(&mut bench, &mut b, 1);
}

#[test]
fn create2_with_wrong_id_half_is_a_channel_violation() {
    let mut bench = Bench::new(true);
    // The client initiated the channel, so its circuit IDs have the high bit set.
    let id = CircId::new(5).expect("id");
    bench.send(id, Create2::new(HandshakeType::NTOR, vec![1; 84]).into());
    assert!(matches!(
        bench.events().first(),
        Some(NodeEvent::ChannelViolation { .. })
    ));
}

#[test]
fn cells_for_unknown_circuits_are_dropped_and_counted() {
    let mut bench = Bench::new(true);
    let mut b = bench.open(0x8000_0002);
    let junk = Relay::from_raw([0u8; 509]);
    bench.send(CircId::new(0x8000_0077).expect("id"), junk.into());
    assert!(bench.drain().is_empty());
    assert_eq!(bench.node.unknown_circuit_cells(CHAN), 1);
    assert_still_works(&mut bench, &mut b, 1);
}

/// A client circuit facing a hand-driven exit.
struct RawExit {
    client: ClientCircuit,
    layer: RelayLayer,
    keys: RelaySecretKeys,
    rng: StdRng,
    now: Instant,
}

impl RawExit {
    fn new() -> RawExit {
        let mut rng = StdRng::seed_from_u64(9);
        let keys = RelaySecretKeys::generate(&mut rng);
        let mut client = ClientCircuit::new(
            ClientConfig::default(),
            &keys.public(),
            StdRng::seed_from_u64(3),
        );
        let now = Instant::now();
        let Some(AnyChanMsg::Create2(c)) = client.poll_transmit(now) else {
            panic!("CREATE2")
        };
        let (reply, lk) = keys
            .ntor_server_handshake(&mut rng, c.body())
            .expect("handshake");
        client.handle_cell(
            now,
            onionlab_cell::chan::Created2::new(reply.to_vec()).into(),
        );
        assert_eq!(client.poll_event(), Some(ClientEvent::HopAdded { hops: 1 }));
        RawExit {
            client,
            layer: RelayLayer::new(&lk),
            keys,
            rng,
            now,
        }
    }

    fn send(&mut self, stream: Option<StreamId>, msg: AnyRelayMsg) {
        let mut body = relay::encode(stream, msg, &mut self.rng).expect("encode");
        self.layer.originate_inbound(&mut body);
        self.client.handle_cell(self.now, Relay::from(body).into());
    }

    fn closed_with(&mut self) -> Option<DestroyReason> {
        let mut reason = None;
        while let Some(ev) = self.client.poll_event() {
            if let ClientEvent::Closed(r) = ev {
                reason = Some(r.reason);
            }
        }
        // A DESTROY goes to the guard.
        if reason.is_some() {
            let out: Vec<_> = std::iter::from_fn(|| self.client.poll_transmit(self.now)).collect();
            assert!(
                matches!(out.last(), Some(AnyChanMsg::Destroy(_))),
                "{out:?}"
            );
        }
        reason
    }

    /// Open a stream and answer it with CONNECTED.
    fn connected_stream(&mut self) -> StreamId {
        let s = self.client.begin("example.com", 443).expect("begin");
        while let Some(cell) = self.client.poll_transmit(self.now) {
            let AnyChanMsg::Relay(r) = cell else { continue };
            let mut body = r.into_relay_body();
            assert!(self.layer.decrypt_outbound(&mut body).is_some());
        }
        self.send(Some(s), Connected::new_empty().into());
        assert_eq!(
            self.client.poll_event(),
            Some(ClientEvent::Stream(
                onionlab_circuit::stream::StreamEvent::Connected { stream: s }
            ))
        );
        s
    }
}

#[test]
fn client_closes_on_connected_for_unknown_stream() {
    let mut x = RawExit::new();
    let _ = &x.keys;
    x.connected_stream();
    x.send(StreamId::new(99), Connected::new_empty().into());
    assert_eq!(x.closed_with(), Some(DestroyReason::PROTOCOL));
}

#[test]
fn client_closes_on_stream_window_violation() {
    let mut x = RawExit::new();
    let s = x.connected_stream();
    for _ in 0..500 {
        x.send(Some(s), Data::new(&[1; 498]).expect("data").into());
    }
    assert_eq!(x.closed_with(), None);
    x.send(Some(s), Data::new(&[1; 498]).expect("data").into());
    assert_eq!(x.closed_with(), Some(DestroyReason::PROTOCOL));
}

#[test]
fn client_closes_on_forged_sendme() {
    let mut x = RawExit::new();
    let s = x.connected_stream();
    x.client
        .write(x.now, s, &vec![5u8; 100 * 498])
        .expect("write");
    let sent = std::iter::from_fn(|| x.client.poll_transmit(x.now)).count();
    assert_eq!(sent, 100);
    x.send(None, Sendme::new_tag([0; 20]).into());
    assert_eq!(x.closed_with(), Some(DestroyReason::PROTOCOL));
}

#[test]
fn client_tolerates_cells_for_half_closed_stream() {
    let mut x = RawExit::new();
    let s = x.connected_stream();
    x.client.close_stream(s).expect("close");
    let _ = std::iter::from_fn(|| x.client.poll_transmit(x.now)).count();
    // Data and END the exit sent before it saw our END.
    x.send(Some(s), Data::new(b"late").expect("data").into());
    x.send(Some(s), End::new_with_reason(EndReason::DONE).into());
    assert_eq!(x.closed_with(), None);
    assert!(!x.client.is_closed());
}

#[test]
fn client_hop_timeout_closes_circuit() {
    let mut rng = StdRng::seed_from_u64(5);
    let keys = RelaySecretKeys::generate(&mut rng);
    let mut c = ClientCircuit::new(
        ClientConfig::default(),
        &keys.public(),
        StdRng::seed_from_u64(6),
    );
    let now = Instant::now();
    assert!(c.poll_transmit(now).is_some());
    let deadline = c.poll_timeout().expect("deadline armed");
    c.handle_timeout(deadline - Duration::from_millis(1));
    assert!(!c.is_closed());
    c.handle_timeout(deadline);
    assert!(c.is_closed());
}

#[test]
fn client_refuses_unencodable_targets_without_closing() {
    let mut x = RawExit::new();
    assert!(x.client.begin("[[x]", 80).is_err());
    assert!(x.client.begin("a\0b", 80).is_err());
    assert!(x.client.begin("", 80).is_err());
    let s = x.client.begin("[::1]", 80).expect("bracketed IPv6 literal");
    let cell = x.client.poll_transmit(x.now).expect("BEGIN");
    let AnyChanMsg::Relay(r) = cell else {
        panic!("{cell:?}")
    };
    let mut body = r.into_relay_body();
    assert!(x.layer.decrypt_outbound(&mut body).is_some());
    let (sid, msg) = relay::decode(body).expect("decode");
    assert_eq!(sid, Some(s));
    let AnyRelayMsg::Begin(b) = msg else {
        panic!("{msg:?}")
    };
    assert_eq!(b.addr(), b"::1");
    assert!(!x.client.is_closed());
}

#[test]
fn create2_flood_without_reading_loses_the_channel_not_memory() {
    let mut bench = Bench::new(true);
    for i in 0..2000u32 {
        let id = CircId::new(0x8000_0000 | (i + 10)).expect("id");
        bench.send(id, Create2::new(HandshakeType::NTOR, vec![1; 84]).into());
    }
    let violations = bench
        .events()
        .into_iter()
        .filter(|e| matches!(e, NodeEvent::ChannelViolation { .. }))
        .count();
    assert!(violations > 0);
    assert!(bench.drain().len() <= 1024);
}

#[test]
fn destroy_flood_from_failing_circuits_loses_the_channel_not_memory() {
    // Valid CREATE2s followed by junk: every circuit closes and queues a
    // DESTROY. A peer that never reads must not grow that queue forever.
    let mut bench = Bench::new(true);
    let mut violation = false;
    for i in 0..1500u32 {
        let c = bench.open_without_reading(0x8000_0000 | (i + 10));
        bench.send(c.id, Relay::from_raw([0xee; 509]).into());
        violation |= bench
            .events()
            .iter()
            .any(|e| matches!(e, NodeEvent::ChannelViolation { .. }));
    }
    assert!(violation);
    // CREATED2s ride in circuit queues (gone with their circuits); the
    // channel's own queue of DESTROYs stays at its cap.
    assert!(bench.drain().len() <= 1024);
}

#[test]
fn exit_accepts_optimistic_data_before_connected() {
    let mut bench = Bench::new(true);
    let mut a = bench.open(0x8000_0001);
    let begin = Begin::new("example.com", 80, BeginFlags::empty()).expect("begin");
    bench.relay(&mut a, Some(1), begin.into(), false);
    bench.relay(
        &mut a,
        Some(1),
        Data::new(b"GET / HTTP/1.0").expect("data").into(),
        false,
    );
    let ev = bench.events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, NodeEvent::ExitConnect { .. })),
        "{ev:?}"
    );
    assert!(
        !ev.iter()
            .any(|e| matches!(e, NodeEvent::CircuitClosed { .. })),
        "{ev:?}"
    );
    let sid = StreamId::new(1).expect("id");
    let circ = onionlab_circuit::node::CircKey(1);
    bench
        .node
        .exit_connected(bench.now, circ, sid, None)
        .expect("connected");
    let mut buf = [0u8; 64];
    let n = bench
        .node
        .exit_read(bench.now, circ, sid, &mut buf)
        .expect("read");
    assert_eq!(&buf[..n], b"GET / HTTP/1.0");
}

#[test]
fn pending_resolves_count_against_the_stream_limit() {
    let mut bench = Bench::new(true);
    let mut a = bench.open(0x8000_0001);
    // Nobody answers: each RESOLVE keeps its ID reserved.
    for id in 1..=1024u16 {
        let msg = onionlab_cell::msg::Resolve::new("example.com");
        bench.relay(&mut a, Some(id), msg.into(), false);
    }
    assert!(bench.receive(&mut a).is_empty());
    let msg = onionlab_cell::msg::Resolve::new("example.com");
    bench.relay(&mut a, Some(2000), msg.into(), false);
    assert_destroyed(&bench.receive(&mut a), DestroyReason::PROTOCOL);
}

#[test]
fn a_failed_handshake_with_a_new_hop_kills_the_circuit() {
    // Hop 1 is real; the answer to the extend is a forged EXTENDED2.
    let mut x = RawExit::new();
    let second = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(77)).public();
    x.client.extend(&second, Vec::new()).expect("extend");
    let _ = std::iter::from_fn(|| x.client.poll_transmit(x.now)).count();
    x.send(
        None,
        onionlab_cell::msg::Extended2::new(vec![0x42; 64]).into(),
    );
    let ev: Vec<_> = std::iter::from_fn(|| x.client.poll_event()).collect();
    assert!(
        matches!(
            ev.as_slice(),
            [
                ClientEvent::HopFailed { hop: 1, .. },
                ClientEvent::Closed(_)
            ]
        ),
        "{ev:?}"
    );
    // No TRUNCATE and re-extend: the circuit is gone, DESTROY goes out.
    assert!(x.client.is_closed());
    assert!(x.client.extend(&second, Vec::new()).is_err());
    let out: Vec<_> = std::iter::from_fn(|| x.client.poll_transmit(x.now)).collect();
    assert!(
        matches!(out.as_slice(), [AnyChanMsg::Destroy(_)]),
        "{out:?}"
    );
}

#[test]
fn a_hop_that_never_answers_is_named_when_the_build_times_out() {
    let mut x = RawExit::new();
    let second = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(78)).public();
    x.client.extend(&second, Vec::new()).expect("extend");
    let _ = std::iter::from_fn(|| x.client.poll_transmit(x.now)).count();
    let deadline = x.client.poll_timeout().expect("a deadline while extending");
    x.client.handle_timeout(deadline - Duration::from_millis(1));
    assert!(!x.client.is_closed());
    x.client.handle_timeout(deadline);
    let ev: Vec<_> = std::iter::from_fn(|| x.client.poll_event()).collect();
    assert!(
        matches!(
            ev.as_slice(),
            [
                ClientEvent::HopFailed { hop: 1, .. },
                ClientEvent::Closed(_)
            ]
        ),
        "{ev:?}"
    );
}

#[test]
fn truncated_from_the_last_hop_with_streams_closes_the_circuit() {
    // A one-hop "circuit" whose only hop claims its (non-existent) next
    // hop failed: the client must not keep a circuit a hop has cut.
    let mut x = RawExit::new();
    let s = x.client.begin("example.com", 80).expect("begin");
    let _ = std::iter::from_fn(|| x.client.poll_transmit(x.now)).count();
    x.send(
        None,
        onionlab_cell::msg::Truncated::new(DestroyReason::CHANNEL_CLOSED).into(),
    );
    assert!(x.client.is_closed());
    assert!(x.client.write(x.now, s, b"x").is_err());
    let out: Vec<_> = std::iter::from_fn(|| x.client.poll_transmit(x.now)).collect();
    assert!(
        matches!(out.as_slice(), [AnyChanMsg::Destroy(_)]),
        "{out:?}"
    );
}
