//! The datagram engine's side of the relay's memory cap
//! ([`crate::memory`]): every [`MEMORY_CHECK`] it adds up what its
//! circuits, MORE and sets hold and publishes it for the circuit node.
//! Its allowance is the cap less what the node's queues hold, never less
//! than half the cap (`onionlab_circuit::node::allowance`). Over it, it
//! ends the sets holding the most until it is down to 3/4 of it; below,
//! it lets new streams open only while their buffers keep it under 3/4.

use std::time::Duration;

use onionlab_circuit::node::allowance;
use tracing::warn;

use super::State;

/// How often the datagram engine weighs what it holds against its
/// allowance: between two looks, new streams fit the room left at the
/// last one.
pub(super) const MEMORY_CHECK: Duration = Duration::from_millis(100);

/// Publish what the engine holds; over its allowance, end sets; set how
/// many streams may open.
pub(super) fn check(st: &mut State) {
    let sets_held = st.exit.as_ref().map_or(0, |(sets, ..)| sets.held_bytes());
    let held = st.relay.held_bytes() + st.more.held_bytes() + sets_held;
    st.memory.set_datagram(held);
    let limit = st.memory.limit();
    let Some((sets, ..)) = st.exit.as_mut() else {
        return;
    };
    if limit == 0 {
        return;
    }
    let tor1 = st.memory.tor1();
    let allowed = allowance(limit, tor1);
    let low_water = allowed - allowed / 4;
    // Only the sets can be freed here: circuits, replay tags and MORE's
    // packets are bounded on their own.
    let others = held - sets_held;
    let mut held_now = held;
    if held > allowed {
        let ended = sets.shed(low_water.saturating_sub(others));
        held_now = others + sets.held_bytes();
        st.memory.set_datagram(held_now);
        if ended > 0 {
            st.sets_ended_oom += ended as u64;
            warn!(
                nickname = %st.nickname,
                before = held,
                after = held_now,
                allowance = allowed,
                tor1,
                limit,
                sets_ended = ended,
                "datagram state over its share of the relay's memory limit: ended the sets \
                 holding the most"
            );
        }
    }
    let room = low_water.saturating_sub(held_now);
    sets.limit_streams(sets.open_streams() + room / sets.stream_bytes().max(1));
}
