//! The receive order of a link's lanes: when a circuit ID is reused, the
//! new circuit's lane is read only after the old one's reading ended, so
//! the node never sees a new circuit's cells before the old circuit's
//! last ones (its DESTROY). Shared by the lane links of pctcp and
//! dtls-utcp (`lanes`) and by QUIC's streams (`quic::lanes`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::sendbuf::{Reading, Readings};

/// The latest receive slot of each circuit ID of a link, and how many
/// lanes are being read.
#[derive(Default)]
pub(crate) struct ReadOrder {
    slots: Mutex<HashMap<u32, (u64, oneshot::Receiver<()>)>>,
    next_serial: AtomicU64,
    reading: Arc<Readings>,
}

/// A lane's place in its circuit ID's receive order, held while the lane
/// is read.
pub(crate) struct ReadSlot {
    circ_id: u32,
    serial: u64,
    /// Dropped when the lane's reading ends, releasing the next one.
    _done: oneshot::Sender<()>,
    /// Counts the lane's reading until it ends.
    _reading: Reading,
}

impl ReadOrder {
    fn slots(&self) -> MutexGuard<'_, HashMap<u32, (u64, oneshot::Receiver<()>)>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take the receive slot of a new lane of `circ_id`: the previous
    /// lane's end to wait for (if one is still read), and our own slot.
    pub(crate) fn take(&self, circ_id: u32) -> (Option<oneshot::Receiver<()>>, ReadSlot) {
        let (tx, rx) = oneshot::channel();
        let serial = self.next_serial.fetch_add(1, AtomicOrdering::Relaxed);
        let prev = self.slots().insert(circ_id, (serial, rx));
        let slot = ReadSlot {
            circ_id,
            serial,
            _done: tx,
            _reading: self.reading.start(),
        };
        (prev.map(|p| p.1), slot)
    }

    /// Forget `slot` as its circuit ID's latest (its lane's reading ended;
    /// a later lane of the ID took its own slot already if there is one).
    pub(crate) fn release(&self, slot: &ReadSlot) {
        let mut slots = self.slots();
        if slots.get(&slot.circ_id).map(|s| s.0) == Some(slot.serial) {
            slots.remove(&slot.circ_id);
        }
    }

    /// The count of lanes being read (those holding a slot, and those a
    /// caller counts while they wait for one).
    pub(crate) fn reading(&self) -> &Arc<Readings> {
        &self.reading
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_id_waits_for_the_previous_lane_and_a_released_slot_is_forgotten() {
        let order = ReadOrder::default();
        let (prev, first) = order.take(7);
        assert!(prev.is_none());
        let (mut prev, second) = order.take(7);
        let waiting = prev.as_mut().expect("the first lane is still read");
        assert!(waiting.try_recv().is_err(), "not before the first ends");
        order.release(&first);
        assert_eq!(order.slots().len(), 1, "the second is the latest");
        drop(first);
        assert!(matches!(
            waiting.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
        order.release(&second);
        assert!(order.slots().is_empty());
    }
}
