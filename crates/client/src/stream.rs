//! One task per SOCKS connection: the handshake, a circuit for the
//! target, BEGIN, the SOCKS reply, then bytes both ways.
//!
//! # Back-pressure and memory
//!
//! Upstream, the task reads at most [`CHUNK`] bytes from the application
//! and offers them to the circuit stream (`State::stream_write`), which
//! takes what fits in its bounded send buffer. Until it has taken all of
//! them, the task does not read the application socket again; it waits for
//! the stream's `Writable` event (or, when the exit's XON rate held the
//! bytes back, until the rate allows more). Downstream, it reads at most [`CHUNK`]
//! bytes from the stream and reads again only once the application socket
//! took them all; the stream's receive window (and SENDMEs sent as the task
//! reads) bounds what waits in the circuit. So a stream holds at most two
//! chunks here plus the circuit's bounded buffers.
//!
//! # Closing
//!
//! * Application EOF: the stream is closed (END after the queued bytes).
//!   As in tor, END closes both directions: the task hands the
//!   application what it has already read, then closes the connection.
//! * END from the exit with reason DONE (the exit saw its target close
//!   cleanly): the task delivers the remaining bytes, then closes the
//!   application socket with a FIN.
//! * Anything else (END with another reason, such as CONNRESET or
//!   TIMEOUT; the circuit closed under the stream; the stream lost): the
//!   application socket is reset (RST, by closing it with `SO_LINGER` 0),
//!   so that an application reading to EOF (an HTTP response without
//!   Content-Length, say) sees an error and never a truncated transfer
//!   that looks complete.

use std::net::SocketAddr;
use std::rc::Rc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tor_socksproto::SocksAddr;

use onionlab_cell::msg::EndReason;

use crate::path::Target;
use crate::socks::{self, reply, IsolationKey, StreamFailure};
use crate::state::{ReadResult, Shared, StreamRef, StreamView};

/// Largest read from the application or the stream in one go.
pub(crate) const CHUNK: usize = 16 * 1024;

/// Serve one SOCKS connection to its end.
pub(crate) async fn serve(shared: Shared, mut sock: TcpStream, peer: SocketAddr) {
    let hs_timeout = shared.borrow().settings.socks_handshake_timeout;
    let accepted = match socks::handshake(&mut sock, hs_timeout).await {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(%peer, "SOCKS handshake failed: {e}");
            return;
        }
    };
    let request = accepted.request;
    let port = request.port();
    let target = match request.addr() {
        SocksAddr::Ip(ip) => Target::ip(*ip, port),
        SocksAddr::Hostname(h) => Target::from_host(h.as_ref(), port),
    };
    let iso = socks::isolation_key(request.auth());
    tracing::debug!(%peer, %target, "SOCKS CONNECT");
    let (opened, notify) = open_stream(&shared, &target, &iso).await;
    let sref = match opened {
        Ok(s) => s,
        Err(failure) => {
            let code = socks::reply_code(&failure);
            tracing::debug!(%peer, %target, code, "stream failed: {failure}");
            if failure != StreamFailure::ShuttingDown {
                shared.borrow_mut().log_stream_failure(&format!(
                    "stream to {target} failed (SOCKS reply {:#04x}): {failure}",
                    code
                ));
            }
            let _ = sock.write_all(&socks::reply_bytes(&request, code)).await;
            return;
        }
    };
    tracing::debug!(%peer, %target, circ = sref.circ.0, stream = %sref.id, "stream connected");
    if sock
        .write_all(&socks::reply_bytes(&request, reply::SUCCEEDED))
        .await
        .is_ok()
    {
        let end = relay(&shared, sock, &sref, &notify, accepted.early_data).await;
        if let StreamEnd::Broken(why) = &end {
            shared.borrow_mut().log_stream_failure(&format!(
                "stream to {target} broke: {why} (application reset)"
            ));
        }
    }
    shared.borrow_mut().detach(&sref);
    tracing::debug!(%peer, %target, "stream done");
}

/// How a stream that had connected ended, as the application is told.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StreamEnd {
    /// A clean end (the application closed first, or the exit sent END
    /// DONE): the application socket was closed with a FIN.
    Clean,
    /// The stream failed: the application socket was reset.
    Broken(String),
}

/// Close the application's socket abortively: with `SO_LINGER` 0 the
/// kernel sends RST instead of FIN and drops unsent bytes, so the
/// application reads an error (ECONNRESET), never a clean EOF.
fn reset(app_rd: tokio::net::tcp::OwnedReadHalf, app_wr: tokio::net::tcp::OwnedWriteHalf) {
    match app_rd.reunite(app_wr) {
        Ok(sock) => {
            if let Err(e) = sock.set_zero_linger() {
                tracing::debug!("setting SO_LINGER 0 on the application socket: {e}");
            }
            drop(sock);
        }
        Err(e) => tracing::debug!("cannot reset the application socket: {e}"),
    }
}

/// Ask the core for a stream and wait for its answer (the core tries
/// other circuits and waits for CONNECTED, within the settings' retries
/// and timeouts). Also returns the notifier that wakes this task on news
/// of the stream.
async fn open_stream(
    shared: &Shared,
    target: &Target,
    iso: &IsolationKey,
) -> (Result<StreamRef, StreamFailure>, Rc<Notify>) {
    let (id, notify) = shared.borrow_mut().open_stream(target.clone(), iso.clone());
    loop {
        if let Some(outcome) = shared.borrow_mut().take_outcome(id) {
            return (outcome, notify);
        }
        notify.notified().await;
    }
}

/// Move bytes between the application and the stream until both are
/// done; close the application socket cleanly or reset it (see the
/// module docs) and say which.
async fn relay(
    shared: &Shared,
    sock: TcpStream,
    sref: &StreamRef,
    notify: &Notify,
    early_data: Vec<u8>,
) -> StreamEnd {
    let (mut app_rd, mut app_wr) = sock.into_split();
    // Bytes read from the application that the stream has not taken yet.
    let mut up = early_data;
    let mut up_off = 0;
    let mut read_buf = vec![0u8; CHUNK];
    // Bytes read from the stream that the application has not taken yet.
    let mut down = vec![0u8; CHUNK];
    let (mut down_start, mut down_end) = (0, 0);
    let mut app_eof = false;
    let mut closed_by_app = false;
    loop {
        let (view, gone, resume) = {
            let mut st = shared.borrow_mut();
            let mut gone = false;
            let mut resume = None;
            if up_off < up.len() {
                match st.stream_write(sref, &up[up_off..]) {
                    Some(n) => up_off += n,
                    None => gone = true,
                }
                if up_off == up.len() {
                    up.clear();
                    up_off = 0;
                } else {
                    // Held back by the exit's XON rate: no event comes
                    // when it allows more.
                    resume = st.stream_write_resumes_at(sref);
                }
            }
            if app_eof && up.is_empty() && !closed_by_app {
                st.detach(sref);
                closed_by_app = true;
            }
            if down_start == down_end && !closed_by_app {
                match st.stream_read(sref, &mut down) {
                    ReadResult::Data(n) => (down_start, down_end) = (0, n),
                    ReadResult::Gone => gone = true,
                }
            }
            (st.stream_view(sref), gone, resume)
        };
        let drained = down_start == down_end;
        let peer_end = match view {
            StreamView::Live { ended, .. } => ended,
            StreamView::Lost => None,
        };
        let peer_done = peer_end.is_some();
        if closed_by_app && drained {
            // END sent (or queued); what the exit sends now is dropped.
            let _ = app_wr.shutdown().await;
            return StreamEnd::Clean;
        }
        if !closed_by_app && view == StreamView::Lost {
            reset(app_rd, app_wr);
            return StreamEnd::Broken("the circuit closed".into());
        }
        // A failure END need not wait for the bytes before it: the
        // transfer is broken either way.
        let failed_end = peer_end.filter(|r| *r != EndReason::DONE);
        if let Some(reason) = failed_end {
            reset(app_rd, app_wr);
            return StreamEnd::Broken(format!("the exit ended it with reason {reason}"));
        }
        if drained && (gone || peer_done) {
            if peer_done {
                let _ = app_wr.shutdown().await;
                return StreamEnd::Clean;
            }
            reset(app_rd, app_wr);
            return StreamEnd::Broken("the stream was lost".into());
        }
        let want_read = !app_eof && up.is_empty() && !peer_done && !gone;
        tokio::select! {
            r = app_rd.read(&mut read_buf), if want_read => match r {
                Ok(0) => app_eof = true,
                Ok(n) => up.extend_from_slice(&read_buf[..n]),
                Err(e) => {
                    // The application is gone; it sees nothing more.
                    tracing::debug!(stream = %sref.id, "application read failed: {e}");
                    return StreamEnd::Clean;
                }
            },
            r = app_wr.write(&down[down_start..down_end]), if !drained => match r {
                Ok(n) if n > 0 => down_start += n,
                Ok(_) => return StreamEnd::Clean,
                Err(e) => {
                    tracing::debug!(stream = %sref.id, "application write failed: {e}");
                    return StreamEnd::Clean;
                }
            },
            _ = notify.notified() => {}
            () = sleep_until_some(resume), if resume.is_some() => {}
        }
    }
}

/// Sleep until `at` (forever without one; the caller's guard keeps that
/// branch out).
async fn sleep_until_some(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
