//! Arbitrary text as a C tor consensus for the anonymity analysis: parsing
//! must return relays or an error naming a line, never panic; whatever
//! parses has at most `MAX_RELAYS` relays and can be simulated over (or is
//! refused with an error) without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onionlab_anonymity::consensus::{parse, MAX_RELAYS};
use onionlab_anonymity::{simulate, Error, Experiment};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse(text) {
        Ok(relays) => {
            assert!(!relays.is_empty() && relays.len() <= MAX_RELAYS);
            let e = Experiment {
                f_g: 0.1,
                f_x: 0.1,
                adversary_relays: 2,
                paths: 2,
                clients: 50,
                seed: 1,
            };
            let _ = simulate(&relays, &e);
        }
        Err(Error::Consensus { line, .. }) => assert!(line >= 1),
        Err(other) => panic!("not a consensus error: {other}"),
    }
});
