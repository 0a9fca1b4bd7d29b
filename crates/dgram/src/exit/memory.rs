//! What an exit's sets hold in memory, and how a relay's memory cap
//! (`max_mem_in_queues`, shared with its tor1 queues; `docs/datagram.md`
//! section 7) bounds it: new streams are refused when their buffers
//! would not fit ([`ExitSets::limit_streams`]), and when the relay is
//! over its cap the sets holding the most are ended first
//! ([`ExitSets::shed`]), as tor1's out-of-memory handler kills the
//! circuits holding the most.

use super::{ExitSets, Set};
use crate::CircuitId;

impl ExitSets {
    /// What one stream holds from its first segment on: its TCP's
    /// receive and send buffers.
    pub fn stream_bytes(&self) -> usize {
        self.settings.tcp.rx_buffer + self.settings.tcp.tx_buffer
    }

    /// Bytes the sets hold: their streams' TCP buffers, kernel sets'
    /// queued segments and MORE sets' SURBs. O(sets and their queues).
    pub fn held_bytes(&self) -> usize {
        self.sets.values().map(|s| self.set_bytes(s)).sum()
    }

    fn set_bytes(&self, set: &Set) -> usize {
        set.streams.e2e.held_bytes(self.stream_bytes())
            + set
                .more
                .as_ref()
                .map_or(0, super::more::MoreExitSet::held_bytes)
    }

    /// Streams allowed open in all sets from now on: at most `max`, and
    /// never more than [`ExitSetSettings::max_streams`](super::ExitSetSettings).
    /// A new stream beyond is refused; open ones stay.
    pub fn limit_streams(&mut self, max: usize) {
        self.budget.set_max(max.min(self.settings.max_streams));
    }

    /// Streams open in all sets.
    pub fn open_streams(&self) -> usize {
        self.budget.used()
    }

    /// Out of memory: end the sets holding the most, largest first, until
    /// the sets hold at most `target` bytes (sets holding nothing are
    /// spared: ending them frees nothing). Their circuits are to be
    /// destroyed ([`poll_shed`](Self::poll_shed)), kernel sets are closed
    /// ([`poll_kernel`](Self::poll_kernel)) and their streams read as
    /// reset. Returns how many sets ended.
    pub fn shed(&mut self, target: usize) -> usize {
        let mut by_size: Vec<(usize, u64)> = self
            .sets
            .iter()
            .map(|(&id, s)| (self.set_bytes(s), id))
            .filter(|&(bytes, _)| bytes > 0)
            .collect();
        let mut held: usize = by_size.iter().map(|&(bytes, _)| bytes).sum();
        // Largest last, for pop; among equals the newest set goes first.
        by_size.sort_unstable();
        let mut ended = 0;
        while held > target {
            let Some((bytes, id)) = by_size.pop() else {
                break;
            };
            self.end_set(id);
            held -= bytes;
            ended += 1;
        }
        ended
    }

    /// The next circuit of a set ended for memory: destroy it with
    /// reason RESOURCELIMIT (the relay's
    /// [`end_for_memory`](crate::DgramRelay::end_for_memory)).
    pub fn poll_shed(&mut self) -> Option<CircuitId> {
        self.shed_circuits.pop_front()
    }

    /// End set `id` now: its circuits to destroy, its streams reset.
    fn end_set(&mut self, id: u64) {
        let legs = self.remove_set(id);
        self.shed_circuits.extend(legs);
    }
}
