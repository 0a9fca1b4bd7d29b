//! Moving a datagram set's stream to and from a TCP connection (the
//! application's at the client, the target's at the exit), one task per
//! stream, both ways at once, with back-pressure: the lane is read only
//! as fast as the socket takes it, the socket read only as fast as the
//! lane takes it, and neither direction waits for the other.
//!
//! How a stream ends reaches the socket: the peer's clean close (FIN
//! after all its data) becomes a FIN; a reset, or a set that lost every
//! circuit, becomes an RST (`SO_LINGER` 0), so the application reads an
//! error, never a clean end of a truncated stream.

use std::rc::Rc;

use onionlab_dgram::Recv;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Bytes read from the socket at a time.
const CHUNK: usize = 16 * 1024;

/// One stream of a set, as the pump sees it: each call borrows the node's
/// state for the moment of the call (the node's `ExitSets` or `Proxy`).
pub trait StreamSide {
    /// Queue bytes on the lane; how many fit (0: wait for a wake);
    /// `None` if the stream cannot send any more.
    fn send(&self, data: &[u8]) -> Option<usize>;
    /// Read the lane.
    fn recv(&self, buf: &mut [u8]) -> Recv;
    /// FIN after what is queued.
    fn close(&self);
    /// Reset the stream.
    fn abort(&self);
    /// The pump is done: the node may forget the stream once its lane
    /// ends.
    fn forget(&self);
}

/// How a stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PumpEnd {
    /// Both sides closed cleanly: every byte arrived both ways.
    Clean,
    /// The lane was reset or its set failed: the socket was reset.
    Reset,
    /// The socket failed: the lane was reset.
    Socket(String),
}

/// Move bytes between `tcp` and the stream until both directions end;
/// `wake` is notified by the node whenever the stream may move. `early`
/// is what the socket sent before the stream opened (SOCKS optimistic
/// data).
pub async fn pump(
    mut tcp: TcpStream,
    side: &impl StreamSide,
    wake: Rc<Notify>,
    early: Vec<u8>,
) -> PumpEnd {
    let end = run(&mut tcp, side, &wake, early).await;
    match &end {
        PumpEnd::Clean => {}
        PumpEnd::Reset => {
            // RST, not FIN: what arrived was not all.
            let _ = tcp.set_zero_linger();
        }
        PumpEnd::Socket(_) => side.abort(),
    }
    side.forget();
    end
}

async fn run(
    tcp: &mut TcpStream,
    side: &impl StreamSide,
    wake: &Notify,
    early: Vec<u8>,
) -> PumpEnd {
    let (mut rd, mut wr) = tcp.split();
    // The socket's bytes not yet on the lane.
    let mut up = early;
    let mut up_off = 0;
    let mut up_eof = false;
    let mut fin_sent = false;
    // The lane's bytes not yet on the socket.
    let mut down = vec![0u8; CHUNK];
    let (mut down_off, mut down_len) = (0, 0);
    let mut down_done = false;
    let mut shut = false;
    let mut chunk = vec![0u8; CHUNK];
    loop {
        if down_off == down_len && !down_done {
            match side.recv(&mut down) {
                Recv::Data(n) => (down_off, down_len) = (0, n),
                Recv::Pending => {}
                Recv::End => down_done = true,
                Recv::Reset => return PumpEnd::Reset,
            }
        }
        if down_done && down_off == down_len && !shut {
            // FIN after everything: the peer's clean end.
            let _ = wr.shutdown().await;
            shut = true;
        }
        if up_off < up.len() {
            match side.send(&up[up_off..]) {
                Some(n) => up_off += n,
                None => return PumpEnd::Reset,
            }
        }
        if up_off == up.len() && up_eof && !fin_sent {
            side.close();
            fin_sent = true;
        }
        if shut && fin_sent {
            return PumpEnd::Clean;
        }
        let want_read = up_off == up.len() && !up_eof;
        let want_write = down_off < down_len;
        tokio::select! {
            r = wr.write(&down[down_off..down_len]), if want_write => match r {
                Ok(0) => return PumpEnd::Socket("the socket took no bytes".into()),
                Ok(n) => down_off += n,
                Err(e) => return PumpEnd::Socket(e.to_string()),
            },
            r = rd.read(&mut chunk), if want_read => match r {
                Ok(0) => up_eof = true,
                Ok(n) => {
                    up.clear();
                    up.extend_from_slice(&chunk[..n]);
                    up_off = 0;
                }
                Err(e) => return PumpEnd::Socket(e.to_string()),
            },
            () = wake.notified() => {}
        }
    }
}

/// Move bytes both ways between two TCP connections (a kernel set's: the
/// application's and the tunnel's at the client, the tunnel's and the
/// target's at the exit) until both directions end cleanly, each side's
/// FIN passed on as a FIN. An error on either connection, or `ended`
/// (the set failed), resets both (`SO_LINGER` 0), so no side reads a
/// clean end of a truncated stream.
pub async fn splice(
    mut a: TcpStream,
    mut b: TcpStream,
    ended: impl std::future::Future<Output = ()>,
) -> PumpEnd {
    let end = {
        let (mut ar, mut aw) = a.split();
        let (mut br, mut bw) = b.split();
        let one_way = async {
            tokio::io::copy(&mut ar, &mut bw).await?;
            bw.shutdown().await
        };
        let other_way = async {
            tokio::io::copy(&mut br, &mut aw).await?;
            aw.shutdown().await
        };
        tokio::select! {
            r = async { tokio::try_join!(one_way, other_way) } => match r {
                Ok(_) => PumpEnd::Clean,
                Err(e) => PumpEnd::Socket(e.to_string()),
            },
            () = ended => PumpEnd::Reset,
        }
    };
    if end != PumpEnd::Clean {
        let _ = a.set_zero_linger();
        let _ = b.set_zero_linger();
    }
    end
}
