//! Fuzz MORE's formats (`onionlab_dgram::more::wire`) and a relay's
//! handling of them: arbitrary bytes as a link message and as an
//! end-to-end message (whatever parses re-encodes to the same bytes), as
//! a Sphinx packet peeled by a relay, and, cut into messages, at an exit
//! relay with a client link and at an exit's sets. Nothing may panic, and
//! a relay's output per message stays bounded.
#![no_main]

use std::sync::OnceLock;
use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_dgram::more::wire::{E2eMsg, LinkMsg, LINK_MSG_MAX};
use onionlab_dgram::more::{sphinx, MoreRelay, MoreRelaySettings, SphinxKey};
use onionlab_dgram::{ExitSetSettings, ExitSets};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// The relay's keys, made once (key generation would dominate a run).
fn keys() -> &'static RelaySecretKeys {
    static KEYS: OnceLock<RelaySecretKeys> = OnceLock::new();
    KEYS.get_or_init(|| RelaySecretKeys::generate(&mut StdRng::seed_from_u64(1)))
}

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = LinkMsg::parse(data) {
        assert_eq!(msg.encode(), data);
    }
    if let Ok(msg) = E2eMsg::parse(data) {
        assert_eq!(msg.encode().expect("a parsed message encodes"), data);
    }
    let key = SphinxKey::new(keys().sphinx_secret());
    let _ = sphinx::peel(&key, data, |_| false);

    let now = Instant::now();
    let identity = keys().public().ed_identity;
    let settings = MoreRelaySettings {
        exit: true,
        ..MoreRelaySettings::default()
    };
    let mut relay = MoreRelay::new(identity, key, [], settings, now);
    relay.link_up(1, None);
    let mut sets = ExitSets::new(ExitSetSettings::default(), 1).expect("default settings");
    for message in data.chunks(LINK_MSG_MAX) {
        relay.handle_message(now, 1, message);
        let mut out = 0;
        while relay.poll_output().is_some() {
            out += 1;
        }
        // A REGISTERED answer, a packet sent on, or a delivery.
        assert!(out <= 1, "{out} outputs for one message");
        sets.handle_more(now, message);
        while sets.poll_more_reply(now).is_some() {}
    }
});
