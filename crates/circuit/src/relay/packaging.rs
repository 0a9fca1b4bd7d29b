//! When an exit turns the bytes its streams read from their targets into
//! DATA cells, and so when its circuit congestion control counts a cell
//! as in flight and starts timing it.
//!
//! Proposal 324 times the RTT "from when a cell is sent"; the two
//! implementations read "sent" differently, and a delay-based algorithm
//! (Vegas) sees the difference: whatever waits between packaging and the
//! wire is queueing in its RTT.
//!
//! Eager packaging follows C tor 0.4.9's `relay.c` where it matters for
//! when cells count: it packages when bytes arrive, when a SENDME opens a
//! window and when the target's connection ends ([`Trigger`]), stops at
//! the `cellq_high` watermark until the queue drains to `cellq_low`, and
//! passes that state to Vegas as C tor does. It differs where the driver
//! does: onionlab's exit keeps reading its target into a 64 KiB stream
//! buffer while packaging is stopped (C tor stops reading, so the bytes
//! wait in the kernel), and packages that buffer when the queue drains
//! (C tor, one read per read event); it stops exactly at the high
//! watermark (C tor packages the rest of the read that crossed it, up to
//! about 32 cells, and a circuit SENDME up to it); a stream's last
//! partial cell waits until the circuit's queue is empty or a flush (C
//! tor sends it at the end of each read event, an approximation here,
//! and the same departure for a cell that would queue behind the others
//! anyway); the watermarks are C tor's defaults, not consensus
//! parameters; and the occasional shortened cell C tor sends to make
//! SENDMEs unpredictable is not imitated.
//!
//! A multi-path set at an eager exit (conflux) does as C tor's does
//! (`relay_send_command_from_edge_` calling `conflux_decide_circ_for_send`
//! for every cell): its leg scheduler picks a leg for each cell when the
//! cell is made, the leg queues it at once and counts it in flight from
//! then (a SWITCH before it when the set changes legs, queued, not
//! counted), and a leg whose queue is blocked (the watermarks above) is
//! not picked, as C tor's `circuit_ready_to_send` passes over a circuit
//! blocked on its channel; the set stops when no leg is ready, exactly (C
//! tor too, its window check asking the same question). The set makes
//! cells whenever the node moves its messages (bytes arrived, a cell
//! left, a SENDME), partial cells too, as onionlab's lazy sets do; C tor
//! sends a partial cell at the end of a read or at a SENDME, and a leg
//! draining to `cellq_low` only lets it read again (the buffer waits for
//! the next read), the departure single circuits make too. A lazy set
//! gives each leg at most `LEG_OUTPUT_DEPTH` messages ahead of its
//! channel, uncounted until the channel takes them.

/// How an exit packages its streams' bytes into DATA cells
/// ([`RelayConfig::exit_packaging`](super::RelayConfig::exit_packaging)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ExitPackaging {
    /// onionlab's own: a DATA cell is made (and counted in flight) when
    /// the channel scheduler asks the circuit for its next cell, so bytes
    /// wait in the stream buffers, not in the circuit's queue, and the
    /// circuit's RTT leaves out the wait for the scheduler.
    #[default]
    Lazy,
    /// C tor's (0.4.9, `connection_edge_package_raw_inbuf` in `relay.c`):
    /// bytes are packaged as they arrive, as far as the window allows,
    /// into the circuit's queue; they count in flight from then, so the
    /// wait in that queue is part of the RTT. Once [`CELLQ_HIGH`] cells
    /// wait the exit packages nothing more (C tor stops reading its
    /// streams) until [`CELLQ_LOW`] are left, and the congestion control
    /// takes that "blocked on its channel" state as its blocked-channel
    /// signal, as C tor's Vegas does (`circuit_blocked_on_p_chan`). When
    /// it packages, and whether partial cells go, follows C tor
    /// (`Trigger` in `packaging.rs`). The legs of a multi-path set queue
    /// each cell the set gives them at once, counted from then, and take
    /// none while their queue is blocked (see the module's docs).
    Eager,
}

impl ExitPackaging {
    /// Every choice by its name, for messages.
    pub const NAMES: &'static [&'static str] = &["lazy", "eager"];

    /// The choice named `name` (`"lazy"` or `"eager"`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "lazy" => Some(ExitPackaging::Lazy),
            "eager" => Some(ExitPackaging::Eager),
            _ => None,
        }
    }

    /// Its name, as [`parse`](Self::parse) takes it.
    pub fn name(self) -> &'static str {
        match self {
            ExitPackaging::Lazy => "lazy",
            ExitPackaging::Eager => "eager",
        }
    }
}

impl std::fmt::Display for ExitPackaging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Cells in an eager exit's queue at which it stops packaging: C tor's
/// `cellq_high` consensus parameter at its default (`relay.c`,
/// `cell_queue_highwatermark`).
pub const CELLQ_HIGH: usize = 256;

/// Cells left in an eager exit's queue at which it packages again: C tor's
/// `cellq_low` at its default.
pub const CELLQ_LOW: usize = 10;

/// What makes an eager exit package, and whether a stream's last partial
/// cell goes with it, as in C tor (`relay.c`, `connection_edge.c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Trigger {
    /// Bytes arrived from the target, the queue drained to [`CELLQ_LOW`],
    /// or an XON (C tor reads again): whole cells only. A stream's last
    /// partial cell waits for more bytes, a SENDME, the target's end, or
    /// the channel asking for a cell when the queue is empty.
    Read,
    /// A circuit or stream SENDME opened a window, or the target's
    /// connection ended: partial cells too.
    Flush,
}

impl Trigger {
    /// Whether a stream's last partial cell goes now.
    pub(super) fn takes_partial_cells(self) -> bool {
        self == Trigger::Flush
    }
}

/// An eager exit's "blocked on its channel" state, kept from the length
/// of its circuit queue with C tor's two watermarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct QueueBlock {
    blocked: bool,
}

impl QueueBlock {
    /// Is packaging stopped (C tor: are the circuit's streams blocked)?
    pub(super) fn blocked(self) -> bool {
        self.blocked
    }

    /// The queue holds `queued` cells now. Returns the new state when it
    /// changed: blocked at [`CELLQ_HIGH`] or more, unblocked at
    /// [`CELLQ_LOW`] or fewer, unchanged in between.
    pub(super) fn update(&mut self, queued: usize) -> Option<bool> {
        let next = if self.blocked {
            queued > CELLQ_LOW
        } else {
            queued >= CELLQ_HIGH
        };
        (next != self.blocked).then(|| {
            self.blocked = next;
            next
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in ExitPackaging::NAMES {
            let p = ExitPackaging::parse(name).expect("a name it lists");
            assert_eq!(p.name(), *name);
        }
        assert_eq!(ExitPackaging::parse("ctor"), None);
        assert_eq!(ExitPackaging::default(), ExitPackaging::Lazy);
    }

    #[test]
    fn blocks_at_the_high_watermark_and_unblocks_at_the_low_one() {
        let mut q = QueueBlock::default();
        assert_eq!(q.update(CELLQ_HIGH - 1), None);
        assert!(!q.blocked());
        assert_eq!(q.update(CELLQ_HIGH + 20), Some(true), "past it at once");
        assert!(q.blocked());
        // Draining to anything above the low watermark keeps it blocked.
        assert_eq!(q.update(CELLQ_LOW + 1), None);
        assert!(q.blocked());
        assert_eq!(q.update(CELLQ_LOW), Some(false));
        // Between the two, an unblocked queue stays unblocked.
        assert_eq!(q.update(CELLQ_HIGH / 2), None);
        assert!(!q.blocked());
    }

    #[test]
    fn only_a_read_waits_for_whole_cells() {
        assert!(!Trigger::Read.takes_partial_cells());
        assert!(Trigger::Flush.takes_partial_cells());
    }
}
