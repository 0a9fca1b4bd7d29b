//! Feed a relay node (with an exit) and a client circuit arbitrary cell
//! sequences: raw channel cells decoded from the input, and relay messages
//! that pass the relay crypto (so the state machines see well-authenticated
//! but arbitrary, out-of-order, hostile messages). Neither may panic, and
//! every queue must stay bounded. The first byte chooses the circuits' flow
//! control: fixed windows (even) or Vegas with XON/XOFF (odd).
#![no_main]

use std::time::{Duration, Instant};

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use onionlab_cell::chan::{AnyChanMsg, ChanCell, CircId, Create2, HandshakeType, Relay};
use onionlab_cell::codec::CellCodec;
use onionlab_cell::msg::StreamId;
use onionlab_circuit::client::{ClientCircuit, ClientConfig};
use onionlab_circuit::flow::CircuitCc;
use onionlab_circuit::node::{CircKey, NodeConfig, RelayNode};
use onionlab_circuit::relay::RelayConfig;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_crypto::ntor::NtorClient;
use onionlab_crypto::relay_crypto::{ClientCircuitCrypto, RelayLayer};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Most bytes a node may hold: generous, but bounded whatever the input.
const MEMORY_BOUND: usize = 64 * 1024 * 1024;

fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let n = n.min(data.len());
    let (a, b) = data.split_at(n);
    *data = b;
    a
}

fn body_from(chunk: &[u8]) -> [u8; 509] {
    let mut body = [0u8; 509];
    let n = chunk.len().min(509);
    body[..n].copy_from_slice(&chunk[..n]);
    // Recognized and digest must be zero before sealing.
    body[1] = 0;
    body[2] = 0;
    body[5..9].fill(0);
    body
}

fuzz_target!(|input: &[u8]| {
    let mut data = input;
    let cc = match take(&mut data, 1).first() {
        Some(b) if b & 1 == 1 => CircuitCc::vegas(),
        _ => CircuitCc::Fixed,
    };
    let mut rng = StdRng::seed_from_u64(0);
    let keys = RelaySecretKeys::generate(&mut rng);
    let public = keys.public();
    let config = NodeConfig {
        circuit: RelayConfig {
            exit: true,
            // The fuzzed client is one hop away: keep its streams served.
            allow_one_hop_streams: true,
            ..RelayConfig::default()
        }
        .with_cc(cc),
        ..NodeConfig::default()
    };
    let mut node = RelayNode::new(keys, config, StdRng::seed_from_u64(1));
    node.add_channel(1, false, onionlab_circuit::node::ChannelPeer::Client);
    let mut now = Instant::now();

    // An honest one-hop circuit, so fuzzed relay messages get recognized.
    let id = CircId::new(0x8000_0001).expect("nonzero");
    let (hs, skin) = NtorClient::start(&mut rng, &public.ntor_node_id(), &public.onion_key);
    node.handle_cell(
        now,
        1,
        ChanCell::new(
            Some(id),
            Create2::new(HandshakeType::NTOR, skin.to_vec()).into(),
        ),
    );
    let Some(created) = node.poll_transmit(now, 1) else {
        return;
    };
    let AnyChanMsg::Created2(c) = created.into_circid_and_msg().1 else {
        return;
    };
    let Ok(lk) = hs.finish(&c.into_body()) else {
        return;
    };
    let mut crypto = ClientCircuitCrypto::new();
    crypto.add_layer(&lk);

    // A client circuit facing a fake exit, fed the same way.
    let client_config = ClientConfig {
        cc,
        ..ClientConfig::default()
    };
    let mut client = ClientCircuit::new(client_config, &public, StdRng::seed_from_u64(2));
    let mut fake_exit: Option<RelayLayer> = None;
    if let Some(AnyChanMsg::Create2(c)) = client.poll_transmit(now) {
        let exit_keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(0));
        if let Ok((reply, lk)) = exit_keys.ntor_server_handshake(&mut rng, c.body()) {
            client.handle_cell(
                now,
                onionlab_cell::chan::Created2::new(reply.to_vec()).into(),
            );
            fake_exit = Some(RelayLayer::new(&lk));
        }
    }
    let _ = client.begin("example.com", 80);

    let mut codec = CellCodec::new(5);
    let mut buf = vec![0u8; 4096];
    while !data.is_empty() {
        let op = take(&mut data, 1)[0];
        let len = usize::from(take(&mut data, 1).first().copied().unwrap_or(0)) * 4;
        let chunk = take(&mut data, len);
        now += Duration::from_millis(u64::from(op >> 4));
        match op % 8 {
            0 => {
                // A raw channel cell on the relay's channel.
                let mut bytes = BytesMut::from(chunk);
                if let Ok(Some(cell)) = codec.decode(&mut bytes) {
                    node.handle_cell(now, 1, cell);
                }
            }
            1 => {
                // A recognized relay message with arbitrary content.
                let mut body = body_from(chunk);
                if crypto.encrypt_outbound(&mut body, 0).is_ok() {
                    let early = op & 0x80 != 0;
                    let relay = Relay::from(Box::new(body));
                    let msg = if early {
                        relay.into_early()
                    } else {
                        relay.into()
                    };
                    node.handle_cell(now, 1, ChanCell::new(Some(id), msg));
                }
            }
            2 => {
                // Exit application actions on whatever streams exist.
                let circ = CircKey(1);
                let sid = StreamId::new(u16::from(chunk.first().copied().unwrap_or(1)).max(1));
                if let Some(s) = sid {
                    let _ = node.exit_connected(now, circ, s, None);
                    let _ = node.exit_write(now, circ, s, chunk);
                    let _ = node.exit_read(now, circ, s, &mut buf);
                    if op & 0x40 != 0 {
                        let _ = node.exit_close(now, circ, s);
                    }
                }
            }
            3 => {
                // Drain what the relay sends, decrypting what we can.
                while let Some(cell) = node.poll_transmit(now, 1) {
                    if let AnyChanMsg::Relay(r) = cell.into_circid_and_msg().1 {
                        let mut b = r.into_relay_body();
                        let _ = crypto.decrypt_inbound(&mut b);
                    }
                }
                while node.poll_event().is_some() {}
            }
            4 => {
                // The fake exit originates an arbitrary message to the client.
                if let Some(layer) = &mut fake_exit {
                    let mut body = body_from(chunk);
                    layer.originate_inbound(&mut body);
                    client.handle_cell(now, Relay::from(Box::new(body)).into());
                }
            }
            5 => {
                // A raw channel cell for the client circuit.
                let mut bytes = BytesMut::from(chunk);
                if let Ok(Some(cell)) = codec.decode(&mut bytes) {
                    client.handle_cell(now, cell.into_circid_and_msg().1);
                }
            }
            6 => {
                // Client application actions.
                let sid = StreamId::new(1).expect("nonzero");
                let _ = client.write(now, sid, chunk);
                let _ = client.read(now, sid, &mut buf);
                client.handle_timeout(now);
                while let Some(cell) = client.poll_transmit(now) {
                    if let (Some(layer), AnyChanMsg::Relay(r)) = (&mut fake_exit, cell) {
                        let mut b = r.into_relay_body();
                        let _ = layer.decrypt_outbound(&mut b);
                    }
                }
                while client.poll_event().is_some() {}
            }
            _ => {
                node.remove_channel(now, 1);
                node.add_channel(1, false, onionlab_circuit::node::ChannelPeer::Client);
            }
        }
        let held: usize = node.queued_bytes().map(|(_, b)| b).sum();
        assert!(held < MEMORY_BOUND, "relay holds {held} bytes");
        assert!(
            client.queued_bytes() < MEMORY_BOUND,
            "client holds too much"
        );
    }
});
