//! Signing, verifying and parsing network documents.

use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_netdoc::doc::{sign_body, verify_signed_text_at, MAX_DOCUMENT_LEN};
use onionlab_netdoc::policy::ExitPolicy;
use onionlab_netdoc::{Error, Flags, NetworkDocument, RelayEntry, TransportAddress};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::time::Duration;
use tor_llcrypto::pk::ed25519::Keypair;

fn network_key(seed: u8) -> Keypair {
    Keypair::from_bytes(&[seed; 32])
}

/// A valid document with `n` relays, the last one an exit.
fn sample_doc(n: usize) -> NetworkDocument {
    let mut rng = StdRng::seed_from_u64(7);
    let relays = (0..n)
        .map(|i| {
            let keys = RelaySecretKeys::generate(&mut rng);
            let mut e = RelayEntry::new(format!("relay{i}"), &keys.public());
            e.addresses.push(TransportAddress {
                transport: "tls".into(),
                addr: format!("127.0.0.1:{}", 9001 + i).parse().unwrap(),
            });
            let exit = i + 1 == n;
            e.flags = Flags { guard: !exit, exit };
            e.bandwidth = 1000 + i as u64;
            e.exit_policy = if exit {
                ExitPolicy::parse("reject 10.0.0.0/8:*, accept *:80-443, accept [::1]:22").unwrap()
            } else {
                ExitPolicy::reject_all()
            };
            e
        })
        .collect();
    NetworkDocument {
        network_name: "test-net".into(),
        created_unix: 1_700_000_000,
        valid_after_unix: 1_700_000_000,
        valid_until_unix: 1_700_000_000 + 86_400,
        params: Default::default(),
        relays,
    }
}

fn body_of(text: &str) -> &str {
    let end = text[..text.len() - 1].rfind('\n').unwrap() + 1;
    &text[..end]
}

#[test]
fn round_trip() {
    let key = network_key(1);
    let doc = sample_doc(3);
    doc.validate().unwrap();
    let text = doc.to_signed_text(&key);
    let back = NetworkDocument::from_signed_text(&text, &key.verifying_key()).unwrap();
    assert_eq!(back, doc);
    // Signing again gives the same text (Ed25519 is deterministic).
    assert_eq!(back.to_signed_text(&key), text);
    assert!(text.ends_with('\n'));
    let last = text.lines().last().unwrap();
    assert!(last.starts_with("signature ed25519 "));
    assert_eq!(last.len(), "signature ed25519 ".len() + 128);
    // Helpers.
    let r = back.relay_by_nickname("RELAY2").unwrap();
    assert!(r.flags.exit);
    assert_eq!(r.address("tls"), Some("127.0.0.1:9003".parse().unwrap()));
    assert_eq!(r.address("quic"), None);
    assert_eq!(
        back.relay_by_identity(&r.ed_identity).unwrap().nickname,
        "relay2"
    );
    let mut rng = StdRng::seed_from_u64(7);
    let keys0 = RelaySecretKeys::generate(&mut rng);
    assert_eq!(back.relays[0].public_keys(), keys0.public());
}

#[test]
fn flipping_any_byte_is_detected() {
    let key = network_key(1);
    let pk = key.verifying_key();
    let text = sample_doc(2).to_signed_text(&key);
    assert!(text.is_ascii());
    let mut bytes = text.clone().into_bytes();
    for i in 0..bytes.len() {
        for flip in [0x01u8, 0x20] {
            let orig = bytes[i];
            bytes[i] ^= flip;
            let tampered = std::str::from_utf8(&bytes).unwrap();
            let result = NetworkDocument::from_signed_text(tampered, &pk);
            assert!(
                result.is_err(),
                "byte {i} ({:?} -> {:?}) changed without detection",
                orig as char,
                bytes[i] as char
            );
            bytes[i] = orig;
        }
    }
}

#[test]
fn body_changes_fail_the_signature_check() {
    let key = network_key(1);
    let pk = key.verifying_key();
    let text = sample_doc(2).to_signed_text(&key);
    // A semantically harmless change (a comment) still breaks the signature.
    let tampered = format!("# hello\n{text}");
    assert!(matches!(
        NetworkDocument::from_signed_text(&tampered, &pk),
        Err(Error::BadSignature { .. })
    ));
    let tampered = text.replacen("bandwidth = 1000", "bandwidth = 9000", 1);
    assert_ne!(tampered, text);
    let err = NetworkDocument::from_signed_text(&tampered, &pk).unwrap_err();
    assert!(matches!(err, Error::BadSignature { .. }), "{err}");
    assert!(err.to_string().contains("does not verify"), "{err}");
}

#[test]
fn other_network_key_is_refused() {
    let text = sample_doc(2).to_signed_text(&network_key(1));
    let err =
        NetworkDocument::from_signed_text(&text, &network_key(2).verifying_key()).unwrap_err();
    assert!(matches!(err, Error::BadSignature { .. }), "{err}");
}

#[test]
fn signature_line_problems() {
    let key = network_key(1);
    let pk = key.verifying_key();
    let text = sample_doc(1).to_signed_text(&key);
    let body = body_of(&text);
    let sig_line = &text[body.len()..];
    let lines = text.lines().count();

    let check = |t: &str, want: &str| {
        let err = NetworkDocument::from_signed_text(t, &pk).unwrap_err();
        assert!(err.to_string().contains(want), "{want}: got {err}");
        err
    };
    // Missing.
    let err = check(body, "no signature");
    assert!(matches!(err, Error::MissingSignature { .. }));
    check("", "no signature");
    // No final newline.
    let err = check(&text[..text.len() - 1], "must end with a newline");
    assert!(
        matches!(err, Error::BadSignatureLine { line, .. } if line == lines),
        "{err}"
    );
    // Trailing blank line or text after the signature line.
    check(&format!("{text}\n"), "must be the last line");
    check(&format!("{text}x = 1\n"), "must be the last line");
    // Two signature lines.
    let err = check(&format!("{body}{sig_line}{sig_line}"), "only once");
    assert!(
        matches!(err, Error::ExtraSignature { line, .. } if line == lines),
        "{err}"
    );
    // Bad hex, wrong length, uppercase, other algorithm, extra fields.
    let sig_hex = sig_line.trim_end().rsplit(' ').next().unwrap();
    check(
        &format!("{body}signature ed25519 {}\n", "zz".repeat(64)),
        "128 lowercase hex",
    );
    check(
        &format!("{body}signature ed25519 {}\n", &sig_hex[..126]),
        "128 lowercase hex",
    );
    check(
        &format!("{body}signature ed25519 {}\n", sig_hex.to_uppercase()),
        "128 lowercase hex",
    );
    check(
        &format!("{body}signature rsa {sig_hex}\n"),
        "unsupported signature algorithm",
    );
    check(
        &format!("{body}signature ed25519 {sig_hex} extra\n"),
        "single spaces",
    );
    check(
        &format!("{body}signature  ed25519 {sig_hex}\n"),
        "single spaces",
    );
    // CRLF line ending on the signature line.
    check(
        &format!("{body}signature ed25519 {sig_hex}\r\n"),
        "128 lowercase hex",
    );
    // A valid signature over other text.
    let other = sample_doc(2).to_signed_text(&key);
    let other_sig = other.lines().last().unwrap();
    check(&format!("{body}{other_sig}\n"), "does not verify");
}

#[test]
fn oversized_documents_are_refused_before_parsing() {
    let key = network_key(1);
    let big = "#".repeat(MAX_DOCUMENT_LEN + 1);
    let err = NetworkDocument::from_signed_text(&big, &key.verifying_key()).unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
}

/// Sign an arbitrary body and parse it.
fn parse_signed_body(body: &str) -> Result<NetworkDocument, Error> {
    let key = network_key(1);
    NetworkDocument::from_signed_text(&sign_body(body, &key), &key.verifying_key())
}

#[test]
fn sign_body_and_verify() {
    let key = network_key(1);
    let text = sign_body("a = 1", &key);
    assert!(text.starts_with("a = 1\nsignature ed25519 "));
    assert_eq!(
        verify_signed_text_at(&text, &key.verifying_key(), "x").unwrap(),
        "a = 1\n"
    );
}

#[test]
fn toml_errors_have_lines() {
    let err = parse_signed_body("network_name = \"x\"\ncreated_unix = \n").unwrap_err();
    let Error::Parse { line, origin, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!((*line, origin.as_str()), (2, "network document"));

    let err =
        parse_signed_body("network_name = \"x\"\ncreated_unix = -5\nrelays = []\n").unwrap_err();
    assert!(matches!(err, Error::Parse { line: 2, .. }), "{err}");

    let err =
        parse_signed_body("network_name = \"x\"\ncreated_unix = 5\ncolour = 1\nrelays = []\n")
            .unwrap_err();
    assert!(matches!(err, Error::Parse { line: 3, .. }), "{err}");
    assert!(err.to_string().contains("unknown field"), "{err}");
}

/// The body of `sample_doc(3)` with `edit` applied.
fn edited_body(edit: impl FnOnce(&mut NetworkDocument)) -> String {
    let mut doc = sample_doc(3);
    edit(&mut doc);
    let text = doc.to_signed_text(&network_key(9));
    body_of(&text).to_string()
}

/// The line of the `n`-th (0-based) `[[relays]]` header in `body`.
fn relay_line(body: &str, n: usize) -> usize {
    body.lines()
        .enumerate()
        .filter(|(_, l)| *l == "[[relays]]")
        .nth(n)
        .unwrap()
        .0
        + 1
}

#[test]
fn document_rules_are_enforced_with_lines() {
    type Edit = Box<dyn FnOnce(&mut NetworkDocument)>;
    let cases: Vec<(Edit, Option<usize>, &str)> = vec![
        (
            Box::new(|d| d.relays[2].nickname = "Relay0".into()),
            Some(2),
            "duplicate nickname",
        ),
        (
            Box::new(|d| d.relays[1].ed_identity = d.relays[0].ed_identity),
            Some(1),
            "duplicate ed_identity",
        ),
        (
            Box::new(|d| d.relays[1].addresses.clear()),
            Some(1),
            "at least one address",
        ),
        (
            Box::new(|d| d.relays[0].nickname = "has space".into()),
            Some(0),
            "nickname",
        ),
        (
            Box::new(|d| d.relays[0].nickname = "a".repeat(20)),
            Some(0),
            "nickname",
        ),
        (
            Box::new(|d| d.relays[1].addresses[0].transport = "TLS".into()),
            Some(1),
            "transport name",
        ),
        (
            Box::new(|d| d.relays[1].addresses[0].addr = "0.0.0.0:9001".parse().unwrap()),
            Some(1),
            "cannot be connected to",
        ),
        (
            Box::new(|d| d.relays[1].addresses[0].addr = "127.0.0.1:0".parse().unwrap()),
            Some(1),
            "cannot be connected to",
        ),
        (
            Box::new(|d| d.network_name = "a b".into()),
            None,
            "network_name",
        ),
    ];
    for (edit, relay, want) in cases {
        let body = edited_body(edit);
        let err = parse_signed_body(&body).unwrap_err();
        let Error::Parse { line, message, .. } = &err else {
            panic!("{want}: {err}")
        };
        assert!(message.contains(want), "{want}: {err}");
        let want_line = relay.map_or(2, |r| relay_line(&body, r));
        assert_eq!(*line, want_line, "{want}: {err}");
    }
    // Documents built in code are checked by validate().
    let mut doc = sample_doc(2);
    doc.relays[1].nickname = "relay0".into();
    let err = doc.validate().unwrap_err();
    assert!(err.to_string().contains("duplicate nickname"), "{err}");
    doc.relays.clear();
    assert!(doc.validate().is_err());
}

#[test]
fn zero_relays_is_refused() {
    let body = edited_body(|d| d.relays.clear());
    assert!(body.contains("relays = []"));
    let err = parse_signed_body(&body).unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err}");
    assert!(err.to_string().contains("no relays"), "{err}");
}

#[test]
fn numbers_beyond_toml_integers_are_refused() {
    let mut doc = sample_doc(1);
    doc.relays[0].bandwidth = u64::MAX;
    assert!(doc.validate().is_err());
    let key = network_key(1);
    let err = NetworkDocument::from_signed_text(&doc.to_signed_text(&key), &key.verifying_key())
        .unwrap_err();
    assert!(matches!(err, Error::Parse { .. }), "{err}");
}

#[test]
fn unknown_transports_are_kept() {
    let body = edited_body(|d| {
        d.relays[0].addresses.insert(
            0,
            TransportAddress {
                transport: "quic".into(),
                addr: "127.0.0.1:9443".parse().unwrap(),
            },
        );
        d.relays[1].addresses[0].transport = "future-transport-9".into();
    });
    let doc = parse_signed_body(&body).unwrap();
    assert_eq!(
        doc.relays[0].address("quic"),
        Some("127.0.0.1:9443".parse().unwrap())
    );
    assert_eq!(
        doc.relays[0].address("tls"),
        Some("127.0.0.1:9001".parse().unwrap())
    );
    assert_eq!(doc.relays[1].address("tls"), None);
}

#[test]
fn hand_written_body_with_defaults() {
    let id = hex::encode([1u8; 32]);
    let onion = hex::encode([2u8; 32]);
    let body = format!(
        "network_name = \"hand\"\ncreated_unix = 0\nvalid_after_unix = 0\nvalid_until_unix = 10\n\n\
         [[relays]]\nnickname = \"a\"\ned_identity = \"{id}\"\nntor_onion_key = \"{onion}\"\n\
         addresses = [{{ transport = \"tls\", addr = \"[::1]:9001\" }}]\n"
    );
    let doc = parse_signed_body(&body).unwrap();
    let r = &doc.relays[0];
    assert_eq!(r.flags, Flags::default());
    assert_eq!(r.bandwidth, 0);
    assert_eq!(r.exit_policy, ExitPolicy::reject_all());
    assert_eq!(r.address("tls"), Some("[::1]:9001".parse().unwrap()));

    // A bad hex key and a bad policy rule are reported on their line.
    let err = parse_signed_body(&body.replace(&id, "xyz")).unwrap_err();
    assert!(matches!(err, Error::Parse { line: 8, .. }), "{err}");
    assert!(err.to_string().contains("64 hex digits"), "{err}");
    let err = parse_signed_body(&format!(
        "{body}exit_policy = [\"accept *:*\", \"allow *:*\"]\n"
    ))
    .unwrap_err();
    assert!(matches!(err, Error::Parse { line: 11, .. }), "{err}");
    assert!(err.to_string().contains("allow *:*"), "{err}");
}

#[test]
fn the_validity_window_is_signed_checked_and_required() {
    let doc = sample_doc(2);
    let (after, until) = (doc.valid_after_unix, doc.valid_until_unix);
    let skew = Duration::from_secs(300);
    assert!(doc.check_time(after, skew, "d").is_ok());
    assert!(doc.check_time(until, skew, "d").is_ok());
    assert!(doc.check_time(after - 300, skew, "d").is_ok());
    assert!(doc.check_time(until + 300, skew, "d").is_ok());
    let early = doc.check_time(after - 301, skew, "d").unwrap_err();
    assert!(matches!(early, Error::NotYetValid { .. }), "{early}");
    assert!(early.to_string().contains("not valid yet"), "{early}");
    let late = doc.check_time(until + 301, skew, "doc.txt").unwrap_err();
    assert!(matches!(late, Error::Expired { .. }), "{late}");
    assert!(late.to_string().starts_with("doc.txt: expired"), "{late}");

    // The window is under the signature: moving it breaks the signature.
    let key = network_key(3);
    let text = doc.to_signed_text(&key);
    let extended = text.replace(
        &format!("valid_until_unix = {until}"),
        &format!("valid_until_unix = {}", until + 365 * 86_400),
    );
    assert_ne!(extended, text);
    let err = NetworkDocument::from_signed_text(&extended, &key.verifying_key()).unwrap_err();
    assert!(matches!(err, Error::BadSignature { .. }), "{err}");

    // An inverted window is invalid; a body without one is refused.
    let mut inverted = doc.clone();
    inverted.valid_after_unix = until + 1;
    assert!(inverted.validate().is_err());
    let without = body_of(&text).replace(&format!("valid_until_unix = {until}\n"), "");
    let err = parse_signed_body(&without).unwrap_err();
    assert!(err.to_string().contains("valid_until_unix"), "{err}");
}

#[test]
fn params_round_trip_and_bad_params_name_their_line() {
    let key = network_key(1);
    let mut doc = sample_doc(2);
    doc.params = onionlab_netdoc::NetworkParams::with_circuit_cc("vegas").unwrap();
    let text = doc.to_signed_text(&key);
    assert!(
        text.contains("\n[params]\ncircuit_cc = \"vegas\"\n"),
        "{text}"
    );
    let back = NetworkDocument::from_signed_text(&text, &key.verifying_key()).unwrap();
    assert_eq!(back, doc);
    // A default document writes no [params] at all (older readers accept it).
    assert!(!sample_doc(2).to_signed_text(&key).contains("[params]"));

    let body = body_of(&text).replace(
        "circuit_cc = \"vegas\"\n",
        "circuit_cc = \"vegas\"\ncc_vegas_beta_exit = 5000\n",
    );
    let err = parse_signed_body(&body).unwrap_err();
    let params_line = body.lines().position(|l| l == "[params]").unwrap() + 1;
    let Error::Parse { line, message, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(*line, params_line, "{err}");
    assert!(message.contains("cc_vegas_beta_exit"), "{err}");
}
