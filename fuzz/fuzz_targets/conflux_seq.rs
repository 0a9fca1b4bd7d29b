//! Fuzz the linking and switch messages into a set's sequencing: the
//! input is a series of relay cell bodies, each on one of three legs; each
//! body goes to `relay::decode`, and what decodes drives a
//! `SeqReceiver` as a linked set's receiving end would (SWITCH moves the
//! leg's counter, multiplexed messages take the next sequence number,
//! LINK / LINKED carry a nonce and counters that are read back and
//! re-encoded).
//!
//! Checked besides "no panic": the out-of-order queue never exceeds its
//! bound, and messages come out strictly in sequence.
//!
//! Input: repeated [leg byte, length byte, `length` bytes of body].
#![no_main]

use libfuzzer_sys::fuzz_target;
use onionlab_cell::msg::{AnyRelayMsg, RelayMsg};
use onionlab_cell::relay::{self, CELL_DATA_LEN};
use onionlab_circuit::conflux::is_multiplexed;
use onionlab_circuit::conflux::seq::SeqReceiver;
use rand::rngs::StdRng;
use rand::SeedableRng;

const BOUND: usize = 64;

fuzz_target!(|data: &[u8]| {
    let mut rx: SeqReceiver<u8, u64> = SeqReceiver::new(BOUND);
    for leg in 0..3 {
        rx.add_leg(leg, 0);
    }
    let mut next_id = 0u64;
    let mut released = 0u64;
    let mut rest = data;
    while let [leg, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (chunk, after) = tail.split_at(n);
        rest = after;
        let leg = leg % 3;
        let mut body = Box::new([0_u8; CELL_DATA_LEN]);
        body[..chunk.len()].copy_from_slice(chunk);
        let Ok((stream, msg)) = relay::decode(body) else {
            continue;
        };
        let outcome = match &msg {
            AnyRelayMsg::ConfluxSwitch(s) => rx.on_switch(leg, s.seqno()),
            AnyRelayMsg::ConfluxLink(_) | AnyRelayMsg::ConfluxLinked(_) => {
                // Read the payload back and encode it again.
                let again = relay::encode(stream, msg.clone(), &mut StdRng::seed_from_u64(1))
                    .expect("a decoded LINK encodes");
                let (_, back) = relay::decode(again).expect("and decodes");
                assert_eq!(back.cmd(), msg.cmd());
                Ok(())
            }
            m if is_multiplexed(m.cmd()) => {
                next_id += 1;
                rx.on_message(leg, next_id)
            }
            _ => Ok(()),
        };
        if outcome.is_err() {
            // A real set closes here.
            return;
        }
        assert!(rx.out_of_order_len() <= BOUND);
        while rx.poll_ready().is_some() {
            released += 1;
            assert_eq!(rx.delivered() >= released, true);
        }
    }
});
