//! A relay on a thread of its own ([`RelayThread`]): its own
//! current-thread runtime, stopped on request. For tests and for programs
//! that embed relays beside other work.

use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::relay::{CircuitGauge, Relay, RelaySettings, RelayStats};
use crate::Error;

/// A relay running on a thread of its own; stopped (its connections
/// closed) by [`stop`](Self::stop) or when dropped.
pub struct RelayThread {
    circuits: CircuitGauge,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<RelayStats, Error>>>,
}

impl RelayThread {
    /// Bind the relay and run it on a new thread; returns once it is
    /// bound.
    ///
    /// # Errors
    ///
    /// What [`Relay::bind`] refuses, or a runtime that cannot be built.
    pub fn spawn(settings: RelaySettings) -> Result<RelayThread, Error> {
        let (stop, stopped) = oneshot::channel::<()>();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = bound_tx.send(Err(Error::Runtime(e)));
                    return Ok(RelayStats::default());
                }
            };
            rt.block_on(async move {
                let relay = match Relay::bind(settings).await {
                    Ok(relay) => relay,
                    Err(e) => {
                        let _ = bound_tx.send(Err(e));
                        return Ok(RelayStats::default());
                    }
                };
                let _ = bound_tx.send(Ok(relay.circuit_gauge()));
                relay
                    .run(async {
                        let _ = stopped.await;
                    })
                    .await
            })
        });
        let circuits = match bound_rx.recv() {
            Ok(bound) => bound?,
            Err(_) => return Err(Error::Thread("ended before the relay was bound")),
        };
        Ok(RelayThread {
            circuits,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The relay's circuit count, live.
    pub fn circuits(&self) -> &CircuitGauge {
        &self.circuits
    }

    /// Stop the relay and wait for its thread: its counters, or why it
    /// failed (`None` if it was already stopped).
    pub fn stop(&mut self) -> Option<Result<RelayStats, Error>> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let thread = self.thread.take()?;
        Some(
            thread
                .join()
                .unwrap_or(Err(Error::Thread("panicked while the relay ran"))),
        )
    }
}

impl Drop for RelayThread {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
