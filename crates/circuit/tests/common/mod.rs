//! A relay node driven by hand: clients that speak raw ntor + relay crypto
//! on any number of channels, next hops that are just channels whose cells
//! the test reads (or never reads).

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use onionlab_cell::chan::{
    AnyChanCell, AnyChanMsg, ChanCell, CircId, Create2, DestroyReason, HandshakeType, Relay,
};
use onionlab_cell::msg::{AnyRelayMsg, Begin, BeginFlags, Data, Extend2, StreamId};
use onionlab_cell::relay::{self, BoxedCellBody, CELL_DATA_LEN};
use onionlab_circuit::node::{ChannelId, ChannelPeer, CircKey, NodeConfig, NodeEvent, RelayNode};
use onionlab_circuit::CloseReason;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_crypto::ntor::NtorClient;
use onionlab_crypto::relay_crypto::ClientCircuitCrypto;
use onionlab_crypto::SendmeTag;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A one-hop circuit driven by hand from the client side.
#[derive(Debug)]
pub struct RawCirc {
    /// The client's channel to the relay.
    pub chan: ChannelId,
    /// Its circuit ID on that channel.
    pub id: CircId,
    /// The client's crypto (one layer: the relay's).
    pub crypto: ClientCircuitCrypto,
    /// The node's key for the circuit.
    pub key: CircKey,
}

/// What the relay sent a client on one circuit, decrypted where possible.
pub type Received = Vec<Result<(Option<StreamId>, AnyRelayMsg), AnyChanMsg>>;

/// A relay node, its keys (for clients' handshakes), and everything it sent.
pub struct TestRelay {
    /// The node under test.
    pub node: RelayNode,
    /// The node's keys.
    pub keys: RelaySecretKeys,
    /// Randomness of the clients.
    pub rng: StdRng,
    /// The time given to the node.
    pub now: Instant,
    /// Cells the node wrote, by channel and circuit ID, not yet taken.
    inbox: HashMap<(ChannelId, CircId), Vec<AnyChanMsg>>,
    /// Node events seen so far.
    pub events: Vec<NodeEvent>,
}

impl TestRelay {
    /// A relay with `config`; `seed` makes keys and randomness repeatable.
    pub fn new(config: NodeConfig, seed: u64) -> TestRelay {
        let mut rng = StdRng::seed_from_u64(seed);
        let keys = RelaySecretKeys::generate(&mut rng);
        let copy = RelaySecretKeys::from_bytes(&keys.to_bytes()).expect("keys");
        let node = RelayNode::new(copy, config, StdRng::seed_from_u64(seed ^ 0x5eed));
        TestRelay {
            node,
            keys,
            rng,
            now: Instant::now(),
            inbox: HashMap::new(),
            events: Vec::new(),
        }
    }

    /// A channel a client opened to the relay (clients' circuit IDs have
    /// the high bit set).
    pub fn add_client_channel(&mut self, chan: ChannelId) {
        self.node.add_channel(chan, false, ChannelPeer::Client);
    }

    /// A channel another relay opened to this one (circuits it creates
    /// have a previous hop that is a relay).
    #[allow(dead_code)]
    pub fn add_relay_channel(&mut self, chan: ChannelId) {
        self.node.add_channel(chan, false, ChannelPeer::Relay);
    }

    /// A channel the relay opened to a next hop.
    pub fn add_next_hop_channel(&mut self, chan: ChannelId) {
        self.node.add_channel(chan, true, ChannelPeer::Relay);
    }

    /// Hand the node a cell read from `chan`.
    pub fn send(&mut self, chan: ChannelId, id: CircId, msg: AnyChanMsg) {
        self.node
            .handle_cell(self.now, chan, ChanCell::new(Some(id), msg));
        self.collect_events();
    }

    /// Move node events into [`events`](Self::events).
    pub fn collect_events(&mut self) {
        while let Some(e) = self.node.poll_event() {
            self.events.push(e);
        }
    }

    /// File one cell the node wrote on `chan`.
    pub fn file(&mut self, chan: ChannelId, cell: AnyChanCell) {
        let (id, msg) = cell.into_circid_and_msg();
        let id = id.expect("no link cells after the handshake");
        self.inbox.entry((chan, id)).or_default().push(msg);
    }

    /// Write at most `max` cells of `chan` (as the transport would); returns
    /// how many were written.
    pub fn pump(&mut self, chan: ChannelId, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            let Some(cell) = self.node.poll_transmit(self.now, chan) else {
                break;
            };
            self.file(chan, cell);
            n += 1;
        }
        self.collect_events();
        n
    }

    /// Write everything `chan` has.
    pub fn drain(&mut self, chan: ChannelId) -> usize {
        self.pump(chan, usize::MAX)
    }

    /// Cells written so far on `chan` for circuit `id`.
    pub fn take(&mut self, chan: ChannelId, id: CircId) -> Vec<AnyChanMsg> {
        self.inbox.remove(&(chan, id)).unwrap_or_default()
    }

    /// Every cell written so far on `chan`, whatever its circuit.
    pub fn take_all(&mut self, chan: ChannelId) -> Vec<(CircId, AnyChanMsg)> {
        let keys: Vec<_> = self
            .inbox
            .keys()
            .filter(|(c, _)| *c == chan)
            .copied()
            .collect();
        let mut out = Vec::new();
        for k in keys {
            for msg in self.inbox.remove(&k).unwrap_or_default() {
                out.push((k.1, msg));
            }
        }
        out
    }

    fn circuit_keys(&self) -> HashSet<CircKey> {
        self.node.queued_bytes().map(|(k, _)| k).collect()
    }

    /// Send a CREATE2 on `chan` and complete the handshake.
    pub fn open(&mut self, chan: ChannelId, raw_id: u32) -> RawCirc {
        self.try_open(chan, raw_id).expect("a new circuit")
    }

    /// [`open`](Self::open), or None if the circuit is gone at once (the
    /// out-of-memory handler may kill it for its CREATED2).
    pub fn try_open(&mut self, chan: ChannelId, raw_id: u32) -> Option<RawCirc> {
        let id = CircId::new(raw_id).expect("id");
        let before = self.circuit_keys();
        let pk = self.keys.public();
        let (hs, onionskin) = NtorClient::start(&mut self.rng, &pk.ntor_node_id(), &pk.onion_key);
        self.send(
            chan,
            id,
            Create2::new(HandshakeType::NTOR, onionskin.to_vec()).into(),
        );
        let key = self.circuit_keys().difference(&before).next().copied();
        self.drain(chan);
        let got = self.take(chan, id);
        let key = key?;
        let [AnyChanMsg::Created2(c)] = <[AnyChanMsg; 1]>::try_from(got).expect("one cell") else {
            panic!("expected CREATED2")
        };
        let layer = hs.finish(&c.into_body()).expect("handshake");
        let mut crypto = ClientCircuitCrypto::new();
        crypto.add_layer(&layer);
        Some(RawCirc {
            chan,
            id,
            crypto,
            key,
        })
    }

    /// Encrypt and send a relay message on `c`.
    pub fn relay(&mut self, c: &mut RawCirc, stream: Option<u16>, msg: AnyRelayMsg, early: bool) {
        let mut body =
            relay::encode(stream.and_then(StreamId::new), msg, &mut self.rng).expect("encode");
        c.crypto.encrypt_outbound(&mut body, 0).expect("encrypt");
        let cell = Relay::from(body);
        let msg = if early {
            cell.into_early()
        } else {
            cell.into()
        };
        self.send(c.chan, c.id, msg);
    }

    /// Write everything on `c`'s channel and decrypt what came for `c`.
    pub fn receive(&mut self, c: &mut RawCirc) -> Received {
        self.drain(c.chan);
        self.take(c.chan, c.id)
            .into_iter()
            .map(|msg| decrypt(c, msg))
            .collect()
    }

    /// EXTEND2 on `c`; the driver attaches the outbound side to
    /// `next_chan` at once (its CREATE2 is then queued there).
    pub fn extend(&mut self, c: &mut RawCirc, next_chan: ChannelId) {
        let ext = Extend2::new(Vec::new(), HandshakeType::NTOR, vec![7; 84]);
        let seen = self.events.len();
        self.relay(c, None, ext.into(), true);
        let asked = self.events[seen..]
            .iter()
            .any(|e| matches!(e, NodeEvent::ConnectRelay { circ, .. } if *circ == c.key));
        assert!(asked, "expected ConnectRelay for {:?}", c.key);
        self.node.extend_channel_ready(self.now, c.key, next_chan);
        self.collect_events();
    }

    /// `n` RELAY cells on `c` meant for hops beyond the relay (random
    /// bodies: the relay does not recognize them and forwards them).
    pub fn send_onward(&mut self, c: &RawCirc, n: usize) {
        for _ in 0..n {
            let mut body: BoxedCellBody = Box::new([0; CELL_DATA_LEN]);
            self.rng.fill_bytes(&mut body[..]);
            self.send(c.chan, c.id, Relay::from(body).into());
        }
    }

    /// BEGIN on `c`; the driver connects it at once. The CONNECTED is left
    /// for [`receive`](Self::receive).
    pub fn begin(&mut self, c: &mut RawCirc, stream: u16) -> StreamId {
        self.try_begin(c, stream).expect("stream connected")
    }

    /// [`begin`](Self::begin), or None if the circuit is gone.
    pub fn try_begin(&mut self, c: &mut RawCirc, stream: u16) -> Option<StreamId> {
        let begin = Begin::new("example.com", 80, BeginFlags::empty()).expect("begin");
        let seen = self.events.len();
        self.relay(c, Some(stream), begin.into(), false);
        let sid = self.events[seen..]
            .iter()
            .find_map(|e| match e {
                NodeEvent::ExitConnect { circ, stream, .. } if *circ == c.key => Some(*stream),
                _ => None,
            })
            .expect("ExitConnect");
        let r = self.node.exit_connected(self.now, c.key, sid, None);
        self.collect_events();
        r.ok().map(|()| sid)
    }

    /// DATA from the client on `stream` of `c`.
    pub fn data(&mut self, c: &mut RawCirc, stream: u16, bytes: &[u8]) {
        self.relay(
            c,
            Some(stream),
            Data::new(bytes).expect("data").into(),
            false,
        );
    }

    /// Circuits closed so far, with their reasons.
    pub fn closed(&self) -> Vec<(CircKey, CloseReason)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                NodeEvent::CircuitClosed { circ, reason } => Some((*circ, reason.clone())),
                _ => None,
            })
            .collect()
    }

    /// [`RelayNode::total_queued_bytes`] recomputed the slow way: every
    /// circuit's queued bytes plus the DESTROYs waiting on `chans`.
    pub fn recount(&self, chans: &[ChannelId]) -> usize {
        self.node.queued_bytes().map(|(_, b)| b).sum::<usize>()
            + chans
                .iter()
                .map(|c| self.node.queued_destroys(*c))
                .sum::<usize>()
                * onionlab_circuit::QUEUED_CELL_BYTES
    }

    /// Open one-hop exit circuits on `chan` (IDs from `first_id` up) with
    /// one stream each (its CONNECTED taken), then queue `lens[i]` bytes of
    /// [`pattern`]`(i, ..)` from the target on circuit `i` (after all are
    /// open: opening writes the whole channel). Needs an exit that allows
    /// one-hop streams.
    pub fn open_exit_circuits(
        &mut self,
        chan: ChannelId,
        first_id: u32,
        lens: &[usize],
    ) -> Vec<RawCirc> {
        let mut circs = Vec::new();
        for i in 0..lens.len() {
            let mut c = self.open(chan, first_id + i as u32);
            let sid = self.begin(&mut c, 1);
            let got = self.receive(&mut c);
            assert!(
                matches!(got.as_slice(), [Ok((Some(_), AnyRelayMsg::Connected(_)))]),
                "{got:?}"
            );
            circs.push((c, sid));
        }
        for (i, (c, sid)) in circs.iter().enumerate() {
            let n = self
                .node
                .exit_write(self.now, c.key, *sid, &pattern(i, lens[i]))
                .expect("write");
            assert_eq!(n, lens[i]);
        }
        self.collect_events();
        circs.into_iter().map(|(c, _)| c).collect()
    }

    /// Bytes queued by circuit `key` (0 if gone).
    pub fn circ_bytes(&self, key: CircKey) -> usize {
        self.node
            .queued_bytes()
            .find(|(k, _)| *k == key)
            .map_or(0, |(_, b)| b)
    }
}

/// Bytes circuit `i` sends: a pattern that shows reordering.
pub fn pattern(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| ((i * 7 + j) % 251) as u8).collect()
}

/// `got` is circuit `i`'s [`pattern`] of `len` bytes.
pub fn assert_pattern(got: &[u8], i: usize, len: usize) {
    assert_eq!(got.len(), len, "circuit {i}");
    assert!(
        got == pattern(i, len).as_slice(),
        "circuit {i}: bytes differ"
    );
}

/// Append the stream bytes of DATA cells to `into`, decrypting in order.
pub fn data_of(c: &mut RawCirc, msgs: Vec<AnyChanMsg>, into: &mut Vec<u8>) {
    for m in msgs {
        match decrypt(c, m) {
            Ok((Some(_), AnyRelayMsg::Data(d))) => into.extend_from_slice(d.as_ref()),
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Was a DESTROY with `reason` among `msgs`?
pub fn has_destroy(msgs: &[AnyChanMsg], reason: DestroyReason) -> bool {
    msgs.iter()
        .any(|m| matches!(m, AnyChanMsg::Destroy(d) if d.reason() == reason))
}

/// Decrypt a cell the relay sent on `c` (in order: the relay crypto is a
/// stream cipher with a running digest, so a cell out of order or from
/// another circuit fails); other cells as they are.
pub fn decrypt(
    c: &mut RawCirc,
    msg: AnyChanMsg,
) -> Result<(Option<StreamId>, AnyRelayMsg), AnyChanMsg> {
    decrypt_with_tag(c, msg).map(|(id, m, _)| (id, m))
}

/// [`decrypt`], also giving the cell's SENDME tag (what a circuit SENDME
/// acknowledging it must carry).
pub fn decrypt_with_tag(
    c: &mut RawCirc,
    msg: AnyChanMsg,
) -> Result<(Option<StreamId>, AnyRelayMsg, SendmeTag), AnyChanMsg> {
    match msg {
        AnyChanMsg::Relay(r) => {
            let mut body = r.into_relay_body();
            let (_, tag) = c.crypto.decrypt_inbound(&mut body).expect("recognized");
            let (id, m) = relay::decode(body).expect("decode");
            Ok((id, m, tag))
        }
        other => Err(other),
    }
}
