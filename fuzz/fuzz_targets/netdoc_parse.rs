//! Arbitrary text as a network document and as an exit policy.
//!
//! * `NetworkDocument::from_signed_text` on the text as it is, with a fixed
//!   network key: must return an error (forging is out of reach), never
//!   panic;
//! * the text signed with that key as a document body: the signature must
//!   verify (only the body may be refused), and a document that parses must
//!   validate and survive `to_signed_text` -> `from_signed_text` unchanged;
//! * `ExitPolicy::parse`: a policy that parses must print (`Display`) to text
//!   that parses back to an equal policy, and `allows_port_somewhere` must
//!   agree with `allows` on the addresses named in the rules.
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use onionlab_netdoc::doc::sign_body;
use onionlab_netdoc::policy::AddrPattern;
use onionlab_netdoc::{Error, ExitPolicy, NetworkDocument};
use tor_llcrypto::pk::ed25519::Keypair;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let key = Keypair::from_bytes(&[0x42; 32]);
    let public = key.verifying_key();

    // Unsigned (or wrongly signed) text.
    assert!(NetworkDocument::from_signed_text(text, &public).is_err());

    // The text as a signed body.
    let signed = sign_body(text, &key);
    match NetworkDocument::from_signed_text(&signed, &public) {
        Ok(doc) => {
            doc.validate().expect("a parsed document validates");
            let again = doc.to_signed_text(&key);
            let back = NetworkDocument::from_signed_text(&again, &public)
                .expect("a re-signed document parses");
            assert_eq!(back, doc);
        }
        Err(
            e @ (Error::BadSignature { .. }
            | Error::MissingSignature { .. }
            | Error::BadSignatureLine { .. }),
        ) => panic!("a genuine signature was refused: {e}"),
        Err(_) => {}
    }

    // The text as an exit policy.
    if let Ok(policy) = ExitPolicy::parse(text) {
        let printed = policy.to_string();
        let reparsed = ExitPolicy::parse(&printed).expect("Display output parses");
        assert_eq!(reparsed, policy);
        let mut addrs: Vec<IpAddr> = Vec::new();
        let mut ports: Vec<u16> = vec![1, 80, 65535];
        for r in policy.rules().iter().take(32) {
            match r.addr {
                AddrPattern::V4 { addr, .. } => addrs.push(addr.into()),
                AddrPattern::V6 { addr, .. } => addrs.push(addr.into()),
                _ => {}
            }
            ports.push(r.ports.lo());
            ports.push(r.ports.hi());
        }
        addrs.push("1.2.3.4".parse().expect("literal"));
        addrs.push("2001:db8::1".parse().expect("literal"));
        for &port in ports.iter().take(16) {
            let somewhere = policy.allows_port_somewhere(port);
            for &ip in &addrs {
                if policy.allows(ip, port) {
                    assert!(somewhere, "{ip}:{port} allowed but not somewhere");
                }
            }
        }
    }
});
