//! What the long-running node commands share: a current-thread runtime
//! (nodes are single-threaded, like tor) and shutdown on SIGINT/SIGTERM.

use tokio::signal::unix::{signal, SignalKind};

use crate::error::{Error, Result};

/// A current-thread tokio runtime with I/O and timers.
pub fn current_thread() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)
}

/// Completes on the first SIGINT or SIGTERM. Must be polled inside the
/// runtime.
pub async fn shutdown_signal() {
    let term = signal(SignalKind::terminate());
    match term {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutting down");
}

/// A multi-threaded tokio runtime (for load generators, not nodes).
pub fn multi_thread() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(Error::Runtime)
}
