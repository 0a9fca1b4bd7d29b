//! Multi-path circuits (seed 004): Conflux as tor proposal 329 specifies
//! it, generalised to m legs, and mTor, which differs only in how legs are
//! chosen.
//!
//! A client builds m circuits (legs) to one exit, with distinct guards and
//! middles, and links them into a set with CONFLUX_LINK / LINKED /
//! LINKED_ACK carrying one random nonce. Streams then belong to the set:
//! each end picks a leg for every multiplexed message it sends (BEGIN,
//! DATA, END, CONNECTED, RESOLVE, RESOLVED, XON, XOFF), and the other end
//! puts what arrives on all legs back in order. Circuit-level flow control
//! (SENDMEs, Vegas) stays per leg.
//!
//! * [`seq`]: sequence numbers and the bounded out-of-order queue;
//! * [`sched`]: which leg carries the next cell (round robin, random,
//!   Conflux 2013, mTor, and C tor's minRTT, lowRTT and cwndRTT).
//!
//! Messages that are not multiplexed (SENDME, the linking messages,
//! SWITCH, DROP) stay on their own leg and have no sequence number.

pub mod sched;
pub mod seq;

use onionlab_cell::msg::RelayCmd;

/// Default bound of a set's out-of-order queue, in messages (at most one
/// cell each, so about 4.3 MB). Flow control keeps an honest peer well
/// below it (at most the cells in flight on the other legs); a peer that
/// leaves a gap open on purpose reaches it and loses the set.
pub const DEFAULT_MAX_OUT_OF_ORDER: usize = 8192;

/// Whether messages with command `cmd` travel in the set's sequence
/// (proposal 329, 2.8: the commands that carry a stream ID).
pub fn is_multiplexed(cmd: RelayCmd) -> bool {
    [
        RelayCmd::BEGIN,
        RelayCmd::DATA,
        RelayCmd::END,
        RelayCmd::CONNECTED,
        RelayCmd::RESOLVE,
        RelayCmd::RESOLVED,
        RelayCmd::XOFF,
        RelayCmd::XON,
    ]
    .contains(&cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_messages_are_multiplexed_and_circuit_messages_are_not() {
        assert!(is_multiplexed(RelayCmd::DATA));
        assert!(is_multiplexed(RelayCmd::XON));
        for cmd in [
            RelayCmd::SENDME,
            RelayCmd::EXTEND2,
            RelayCmd::CONFLUX_LINK,
            RelayCmd::CONFLUX_SWITCH,
            RelayCmd::DROP,
        ] {
            assert!(!is_multiplexed(cmd), "{cmd}");
        }
    }
}
