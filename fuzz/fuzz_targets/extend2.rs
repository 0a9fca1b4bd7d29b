//! EXTEND2 as a relay receives it: arbitrary bytes as the body of a RELAY
//! EXTEND2 message (`onionlab_cell::relay::decode` of a recognized relay
//! cell with command 14, stream 0 and the input as its data), or, when
//! byte 0 is odd, as a bare list of link specifiers (`type | len | body`);
//! the link specifiers then go to the relay's `extend_target`
//! (`onionlab_node::fuzzing`), which picks the next hop against a fixed
//! network document of four relays (TLS only, QUIC only, both, IPv6).
//!
//! Checked besides "no panic":
//! * a decoded EXTEND2 encodes again (`relay::encode`), its encoding is a
//!   prefix of the bytes it was decoded from (nothing reordered or
//!   normalized; only trailing bytes dropped), and it decodes to the same
//!   link specifiers, handshake type and handshake data;
//! * every link specifier that parses encodes back to the same type and
//!   body;
//! * `extend_target` agrees with the rule it documents: it goes to the
//!   relay named by the (last) Ed25519 link specifier that parses, only if
//!   the document lists it, with the document's TLS and QUIC addresses, and
//!   only if no OR-port specifier is given or one of them is an address the
//!   document lists; otherwise it refuses.
#![no_main]

use std::net::{IpAddr, SocketAddr};

use libfuzzer_sys::fuzz_target;
use onionlab_cell::msg::{AnyRelayMsg, EncodedLinkSpec, LinkSpec, LinkSpecType};
use onionlab_cell::relay::{self, CELL_DATA_LEN};
use onionlab_netdoc::doc::TRANSPORT_TLS;
use onionlab_netdoc::{ExitPolicy, Flags, NetworkDocument, RelayEntry, TransportAddress};
use onionlab_node::fuzzing::extend_target;
use onionlab_transport::endpoint::EndpointKind;
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Relay header: command, recognized (2), stream ID (2), digest (4),
/// length (2).
const HEADER: usize = 11;
/// RELAY_EXTEND2.
const CMD_EXTEND2: u8 = 14;

/// The QUIC endpoint's address name in the document.
const TRANSPORT_QUIC: &str = EndpointKind::QUIC.doc_name();

fn entry(n: u8, addrs: &[(&str, &str)]) -> RelayEntry {
    RelayEntry {
        nickname: format!("relay{n}"),
        ed_identity: [n; 32],
        ntor_onion_key: [0x40 + n; 32],
        sphinx_key: None,
        addresses: addrs
            .iter()
            .map(|(t, a)| TransportAddress {
                transport: (*t).into(),
                addr: a.parse().expect("literal address"),
            })
            .collect(),
        flags: Flags::default(),
        bandwidth: 100,
        exit_policy: ExitPolicy::reject_all(),
    }
}

fn document() -> NetworkDocument {
    let doc = NetworkDocument {
        network_name: "fuzz".into(),
        created_unix: 1,
        valid_after_unix: 1,
        valid_until_unix: 2,
        params: Default::default(),
        relays: vec![
            entry(1, &[(TRANSPORT_TLS, "10.0.0.1:9001")]),
            entry(2, &[(TRANSPORT_QUIC, "10.0.0.2:9002")]),
            entry(
                3,
                &[
                    (TRANSPORT_TLS, "10.0.0.3:9001"),
                    (TRANSPORT_QUIC, "10.0.0.3:9001"),
                ],
            ),
            entry(4, &[(TRANSPORT_TLS, "[2001:db8::4]:443")]),
        ],
    };
    doc.validate().expect("the fixed document is valid");
    doc
}

/// Link specifiers read as a bare list; stops at the first incomplete one.
fn bare_linkspecs(mut data: &[u8]) -> Vec<EncodedLinkSpec> {
    let mut out = Vec::new();
    while let [t, len, rest @ ..] = data {
        let len = usize::from(*len);
        let Some(body) = rest.get(..len) else { break };
        out.push(EncodedLinkSpec::new(LinkSpecType::from(*t), body.to_vec()));
        data = &rest[len..];
    }
    out
}

/// Decode `payload` as the data of a RELAY EXTEND2 message, checking the
/// re-encoding; the link specifiers if it decodes.
fn decode_extend2(payload: &[u8]) -> Option<Vec<EncodedLinkSpec>> {
    let len = payload.len().min(CELL_DATA_LEN - HEADER);
    let payload = &payload[..len];
    let mut body = Box::new([0_u8; CELL_DATA_LEN]);
    body[0] = CMD_EXTEND2;
    body[9..11].copy_from_slice(&u16::try_from(len).expect("fits").to_be_bytes());
    body[HEADER..HEADER + len].copy_from_slice(payload);
    let (stream, msg) = relay::decode(body).ok()?;
    let AnyRelayMsg::Extend2(ext) = msg else {
        panic!("command 14 decoded as {:?}", msg);
    };
    assert_eq!(stream, None, "EXTEND2 with a stream ID");
    let specs = ext.linkspecs().to_vec();
    let htype = ext.handshake_type();
    let hdata = ext.handshake().to_vec();
    let again = relay::encode(
        None,
        AnyRelayMsg::Extend2(ext),
        &mut StdRng::seed_from_u64(1),
    )
    .expect("a decoded EXTEND2 encodes");
    assert_eq!(again[0], CMD_EXTEND2);
    let new_len = usize::from(u16::from_be_bytes([again[9], again[10]]));
    assert!(new_len <= len, "re-encoding grew from {len} to {new_len}");
    assert_eq!(
        &again[HEADER..HEADER + new_len],
        &payload[..new_len],
        "re-encoding differs from the decoded bytes"
    );
    let (_, msg2) = relay::decode(again).expect("a re-encoded EXTEND2 decodes");
    let AnyRelayMsg::Extend2(ext2) = msg2 else {
        panic!("re-encoded EXTEND2 decoded as something else");
    };
    assert_eq!(ext2.linkspecs(), &specs[..]);
    assert_eq!(ext2.handshake_type(), htype);
    assert_eq!(ext2.handshake(), &hdata[..]);
    Some(specs)
}

fuzz_target!(|data: &[u8]| {
    let Some((&setup, payload)) = data.split_first() else {
        return;
    };
    let specs = if setup & 1 == 1 {
        bare_linkspecs(payload)
    } else {
        match decode_extend2(payload) {
            Some(specs) => specs,
            None => return,
        }
    };

    // What the specifiers say, parsed one by one.
    let mut ids = Vec::new();
    let mut addrs = Vec::new();
    for spec in &specs {
        let Ok(parsed) = spec.parse() else { continue };
        let back = parsed.encode().expect("a parsed link specifier encodes");
        assert_eq!(
            &back, spec,
            "link specifier {parsed:?} re-encodes differently"
        );
        match parsed {
            LinkSpec::Ed25519Id(id) => ids.push(id),
            LinkSpec::OrPort(ip, port) => addrs.push(SocketAddr::new(ip, port)),
            _ => {}
        }
    }

    let doc = document();
    let result = extend_target(&doc, &specs);
    let expected = ids.last().and_then(|id| {
        let mut raw = [0_u8; 32];
        raw.copy_from_slice(id.as_bytes());
        let entry = doc.relay_by_identity(&raw)?;
        let listed: Vec<SocketAddr> = entry.addresses.iter().map(|a| a.addr).collect();
        (addrs.is_empty() || addrs.iter().any(|a| listed.contains(a))).then_some((
            *id,
            entry.address(TRANSPORT_TLS),
            entry.address(TRANSPORT_QUIC),
        ))
    });
    match (result, expected) {
        (Ok((id, peer)), Some((want_id, tls, quic))) => {
            assert_eq!(id, want_id);
            let (peer_tls, peer_quic) = (peer.get(EndpointKind::TCP), peer.get(EndpointKind::QUIC));
            assert_eq!((peer_tls, peer_quic), (tls, quic));
            assert!(
                peer_tls.is_some() || peer_quic.is_some(),
                "no address to go to"
            );
            if let Some(a) = peer_tls.or(peer_quic) {
                assert!(!matches!(a.ip(), IpAddr::V4(v4) if v4.is_unspecified()));
            }
        }
        (Err(why), None) => assert!(!why.is_empty()),
        (Ok(got), None) => panic!("extend_target accepted {got:?} against its rule"),
        (Err(why), Some(want)) => panic!("extend_target refused {want:?}: {why}"),
    }
});
