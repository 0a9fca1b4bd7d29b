//! Guard channels: one TLS link per guard, shared by every circuit through
//! that guard, with a reader task and a writer task.
//!
//! * The **reader** awaits batches of cells and hands each to its circuit
//!   by circuit ID (`State::handle_cells`).
//! * The **writer** sleeps on the channel's `Notify` until a circuit has
//!   cells. It then pulls cells from the circuits, in the order the
//!   channel's circuit scheduler gives (EWMA by default), only while the
//!   link's writer has room ([`CellWriter::has_room`]), and flushes. A slow
//!   guard connection thus leaves cells in the circuits' queues, where the
//!   circuit windows bound them, and stream writes there are refused until
//!   a `Writable` event: back-pressure reaches the application socket.
//!
//! If either direction fails, the channel closes: its circuits close and
//! their streams are told, and the next circuit to that guard opens a new
//! channel.

use std::rc::Rc;

use onionlab_transport::addrs::EndpointAddrs;
use onionlab_transport::{CellReader, CellWriter, Error as TransportError};
use tokio::sync::Notify;
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use crate::state::{ChanKey, Fill, Shared};

/// Open the link of channel `chan` and start its tasks; on failure, close
/// the channel (its circuits fail).
pub(crate) async fn connect(
    shared: Shared,
    chan: ChanKey,
    addrs: EndpointAddrs,
    identity: Ed25519Identity,
) {
    let connector = shared.borrow().connector();
    let result = connector.connect(&addrs, identity).await;
    match result {
        Ok(link) => {
            let Some(wake) = shared.borrow().channel_wake(chan) else {
                // Closed meanwhile (shutdown): drop the link.
                return;
            };
            let transport = link.writer.kind().name();
            tracing::debug!(
                addr = %link.peer.addr,
                transport,
                link_version = link.link_version,
                "link handshake done"
            );
            let addr = link.peer.addr;
            let reader = tokio::task::spawn_local(read_loop(shared.clone(), chan, link.reader));
            let writer =
                tokio::task::spawn_local(write_loop(shared.clone(), chan, link.writer, wake));

            shared.borrow_mut().channel_opened(
                chan,
                reader.abort_handle(),
                writer,
                &format!("{addr} over {transport}"),
            );
        }
        Err(e) => {
            let mut st = shared.borrow_mut();
            let guard = st.channel_guard_name(chan);
            tracing::warn!(%guard, ?addrs, "cannot open channel: {e}");
            st.close_channel(chan, &format!("cannot connect to {guard}: {e}"));
        }
    }
}

/// The reader task of a channel.
async fn read_loop<R: CellReader>(shared: Shared, chan: ChanKey, mut reader: R) {
    let mut cells = Vec::new();
    loop {
        cells.clear();
        match reader.read_cells(&mut cells).await {
            Ok(()) => shared.borrow_mut().handle_cells(chan, cells.drain(..)),
            Err(e) => {
                let why = match e {
                    TransportError::Closed => "closed by the guard".to_string(),
                    other => other.to_string(),
                };
                shared.borrow_mut().close_channel(chan, &why);
                return;
            }
        }
    }
}

/// The writer task of a channel.
async fn write_loop<W: CellWriter>(shared: Shared, chan: ChanKey, mut writer: W, wake: Rc<Notify>) {
    loop {
        // Yield now and then even if woken at once every time, so a bug in
        // what counts as work costs CPU, not the whole client.
        tokio::task::consume_budget().await;
        let filled = shared.borrow_mut().fill(chan, &mut writer);
        match filled {
            Err(e) => {
                shared.borrow_mut().close_channel(chan, &e.to_string());
                return;
            }
            Ok(Fill::Gone) => return,
            Ok(Fill::Done) => {
                // Shutdown: the DESTROYs are queued; flush and close.
                let _ = writer.shutdown().await;
                shared.borrow_mut().close_channel(chan, "shutting down");
                return;
            }
            Ok(Fill::Continue) => {}
        }
        if writer.has_pending() {
            if let Err(e) = writer.flush().await {
                shared.borrow_mut().close_channel(chan, &e.to_string());
                return;
            }
            continue;
        }
        tokio::select! {
            () = wake.notified() => {}
            () = writer.writable() => {}
        }
    }
}
