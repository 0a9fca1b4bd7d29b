//! The SOCKS side: the server handshake (parsed by Arti's
//! `tor-socksproto`), stream isolation keys, and the reply codes that tell
//! the application what failed.
//!
//! # Accepted requests
//!
//! SOCKS5 (RFC 1928) CONNECT to an IPv4 address, an IPv6 address or a
//! domain name, with "no authentication" or username/password (RFC 1929;
//! any username and password are accepted, they only isolate streams).
//! SOCKS4 and SOCKS4a CONNECT come for free from `tor-socksproto`. Other
//! commands (BIND, UDP ASSOCIATE, tor's RESOLVE and RESOLVE_PTR) get reply
//! 0x07.
//!
//! # Reply codes
//!
//! | what happened | SOCKS5 reply |
//! |---|---|
//! | the exit answered CONNECTED | 0x00 succeeded |
//! | END reason EXITPOLICY; or no exit's policy allows the target; or the pinned exit's policy does not | 0x02 connection not allowed by ruleset |
//! | END reason RESOLVEFAILED, NOROUTE | 0x04 host unreachable |
//! | END reason CONNECTREFUSED, CONNRESET | 0x05 connection refused |
//! | END reason TIMEOUT; circuit build timed out (after the retries); no CONNECTED within the stream timeout | 0x06 TTL expired |
//! | END reason MISC, DESTROY, DONE, HIBERNATING, INTERNAL, RESOURCELIMIT, TORPROTOCOL, NOTDIRECTORY or unknown; circuit build failed (after the retries); circuit closed before CONNECTED; not enough relays for a path; a target the BEGIN cell cannot carry | 0x01 general failure |
//! | a command other than CONNECT | 0x07 command not supported |
//! | an address type other than 1, 3, 4 | 0x08 address type not supported |
//! | any other malformed request | 0x01 general failure |
//!
//! Tor's END reasons have no "network unreachable": an exit reports both
//! `ENETUNREACH` and `EHOSTUNREACH` as NOROUTE, which tor's client maps to
//! 0x04, as here. A greeting that offers neither "no authentication" nor
//! username/password gets method 0xFF (no acceptable methods); a malformed
//! username/password message gets status 0x01 (RFC 1929). A connection that
//! does not start with version 4 or 5 is closed without a reply. SOCKS4
//! replies carry only success (0x5A) or failure (0x5B).

use std::io;
use std::time::Duration;

use onionlab_cell::msg::EndReason;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tor_socksproto::{Handshake, NextStep, SocksAuth, SocksProxyHandshake, SocksRequest};

/// Reply codes of SOCKS5 (RFC 1928, section 6).
pub mod reply {
    /// Succeeded.
    pub const SUCCEEDED: u8 = 0x00;
    /// General SOCKS server failure.
    pub const GENERAL_FAILURE: u8 = 0x01;
    /// Connection not allowed by ruleset.
    pub const NOT_ALLOWED: u8 = 0x02;
    /// Network unreachable.
    pub const NETWORK_UNREACHABLE: u8 = 0x03;
    /// Host unreachable.
    pub const HOST_UNREACHABLE: u8 = 0x04;
    /// Connection refused.
    pub const CONNECTION_REFUSED: u8 = 0x05;
    /// TTL expired (used for timeouts, as tor does).
    pub const TTL_EXPIRED: u8 = 0x06;
    /// Command not supported.
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x07;
    /// Address type not supported.
    pub const ADDRTYPE_NOT_SUPPORTED: u8 = 0x08;
}

/// The SOCKS5 reply code for a stream the exit ended with `reason` before
/// it connected (see the module's table).
pub fn end_reason_reply(reason: EndReason) -> u8 {
    match reason {
        EndReason::EXITPOLICY => reply::NOT_ALLOWED,
        EndReason::RESOLVEFAILED | EndReason::NOROUTE => reply::HOST_UNREACHABLE,
        EndReason::CONNECTREFUSED | EndReason::CONNRESET => reply::CONNECTION_REFUSED,
        EndReason::TIMEOUT => reply::TTL_EXPIRED,
        _ => reply::GENERAL_FAILURE,
    }
}

pub use onionlab_client_core::{IsolationKey, StreamFailure};

/// The SOCKS5 reply code that says what failed (see the module's table).
pub fn reply_code(failure: &StreamFailure) -> u8 {
    match failure {
        StreamFailure::Ended(reason) => end_reason_reply(*reason),
        StreamFailure::NotAllowed => reply::NOT_ALLOWED,
        StreamFailure::BuildTimeout | StreamFailure::ConnectTimeout => reply::TTL_EXPIRED,
        StreamFailure::NoPath(_)
        | StreamFailure::BuildFailed(_)
        | StreamFailure::CircuitClosed
        | StreamFailure::BadTarget
        | StreamFailure::Attach(_)
        | StreamFailure::ShuttingDown => reply::GENERAL_FAILURE,
    }
}

/// The isolation key of a request's credentials (streams isolated as
/// tor's `IsolateSOCKSAuth`).
pub fn isolation_key(auth: &SocksAuth) -> IsolationKey {
    match auth {
        SocksAuth::Socks4(id) => IsolationKey::Socks4(id.clone()),
        SocksAuth::Username(user, pass) => IsolationKey::UserPass {
            user: user.clone(),
            pass: pass.clone(),
        },
        // NoAuth, and whatever later versions add.
        _ => IsolationKey::None,
    }
}

/// Where the SOCKS exchange is, to know how to say "no".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing received yet.
    Start,
    /// SOCKS5 method selection (greeting) or a SOCKS4 request.
    Greeting(u8),
    /// SOCKS5 username/password sub-negotiation.
    Auth,
    /// SOCKS5 request.
    Request,
}

/// A SOCKS5 failure reply with an unspecified IPv4 bound address.
pub(crate) fn socks5_failure(code: u8) -> [u8; 10] {
    [5, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

/// The reply code for a SOCKS5 request (`raw`, as received) that
/// `tor-socksproto` refused: 0x07 for an unsupported command (including
/// tor's RESOLVE extensions, which this client does not serve), 0x08 for an
/// unknown address type, else 0x01. A request that is not SOCKS5 gets 0x01
/// whatever follows its version byte: the parser stopped there, and how
/// much of the rest has arrived depends on how the reads fell.
pub(crate) fn request_error_reply(raw: &[u8]) -> u8 {
    if raw.first() != Some(&5) {
        return reply::GENERAL_FAILURE;
    }
    match raw.get(1) {
        Some(&cmd) if cmd != 1 => reply::COMMAND_NOT_SUPPORTED,
        _ => match raw.get(3) {
            Some(1 | 3 | 4) | None => reply::GENERAL_FAILURE,
            Some(_) => reply::ADDRTYPE_NOT_SUPPORTED,
        },
    }
}

/// Why the SOCKS handshake did not give a request.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The socket failed.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    /// The client closed its connection before its request was whole.
    #[error("closed during the SOCKS handshake")]
    Closed,
    /// The client broke the protocol or asked for something unsupported;
    /// it got an error reply where the protocol has one.
    #[error("{0}")]
    Refused(String),
    /// The client was too slow.
    #[error("SOCKS handshake timed out")]
    Timeout,
}

/// A request the handshake accepted: a CONNECT, with the bytes the client
/// sent after it (optimistic data).
#[derive(Debug)]
pub(crate) struct Accepted {
    pub(crate) request: SocksRequest,
    pub(crate) early_data: Vec<u8>,
}

/// Run the server side of the SOCKS handshake on `sock`, within `limit`.
/// Unsupported commands and malformed messages get their error reply here.
pub(crate) async fn handshake(
    sock: &mut TcpStream,
    limit: Duration,
) -> Result<Accepted, HandshakeError> {
    match tokio::time::timeout(limit, handshake_inner(sock)).await {
        Ok(r) => r,
        Err(_) => Err(HandshakeError::Timeout),
    }
}

/// The handshake on any byte stream, without a time limit, for the fuzz
/// targets (`fuzz/fuzz_targets/socks_request.rs`): the accepted request
/// and the bytes read after it, or why the handshake failed. Replies are
/// written to `sock` exactly as [`handshake`] writes them.
#[doc(hidden)]
pub async fn handshake_for_fuzzing<S: AsyncRead + AsyncWrite + Unpin>(
    sock: &mut S,
) -> Result<(SocksRequest, Vec<u8>), HandshakeError> {
    handshake_inner(sock)
        .await
        .map(|a| (a.request, a.early_data))
}

async fn handshake_inner<S: AsyncRead + AsyncWrite + Unpin>(
    sock: &mut S,
) -> Result<Accepted, HandshakeError> {
    let mut hs = SocksProxyHandshake::new();
    let mut buf = tor_socksproto::Buffer::new();
    let mut phase = Phase::Start;
    loop {
        let failure = match hs.step(&mut buf) {
            Ok(NextStep::Send(data)) => {
                phase = match data.as_slice() {
                    [5, 2] => Phase::Auth,
                    _ => Phase::Request,
                };
                sock.write_all(&data).await?;
                continue;
            }
            Ok(NextStep::Recv(mut recv)) => {
                let n = sock.read(recv.buf()).await?;
                if n == 0 {
                    return Err(HandshakeError::Closed);
                }
                if phase == Phase::Start {
                    phase = Phase::Greeting(recv.buf()[0]);
                }
                // Cannot fail for n > 0.
                let _ = recv.note_received(n);
                continue;
            }
            Ok(NextStep::Finished(done)) => {
                let (request, early_data) = done.into_output_and_vec();
                if request.command() != tor_socksproto::SocksCmd::CONNECT {
                    let code = reply::COMMAND_NOT_SUPPORTED;
                    let bytes = request
                        .reply(code.into(), None)
                        .unwrap_or_else(|_| socks5_failure(code).to_vec());
                    sock.write_all(&bytes).await?;
                    return Err(HandshakeError::Refused(format!(
                        "unsupported command {}",
                        request.command()
                    )));
                }
                return Ok(Accepted {
                    request,
                    early_data,
                });
            }
            Err(e) => e,
        };
        let raw = buf.filled_slice();
        let answer: Option<Vec<u8>> = match phase {
            Phase::Greeting(4) => Some(vec![0, 0x5B, 0, 0, 0, 0, 0, 0]),
            Phase::Greeting(5) => Some(vec![5, 0xFF]),
            Phase::Start | Phase::Greeting(_) => None,
            Phase::Auth => Some(vec![1, 1]),
            Phase::Request => Some(socks5_failure(request_error_reply(raw)).to_vec()),
        };
        if let Some(a) = answer {
            sock.write_all(&a).await?;
        }
        return Err(HandshakeError::Refused(format!(
            "bad SOCKS message: {failure}"
        )));
    }
}

/// The reply to send for `request` with SOCKS5 code `code` (SOCKS4
/// requests get 0x5A or 0x5B).
pub(crate) fn reply_bytes(request: &SocksRequest, code: u8) -> Vec<u8> {
    request
        .reply(code.into(), None)
        .unwrap_or_else(|_| socks5_failure(code).to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_reasons_map_to_what_failed() {
        let cases = [
            (EndReason::EXITPOLICY, 0x02),
            (EndReason::RESOLVEFAILED, 0x04),
            (EndReason::NOROUTE, 0x04),
            (EndReason::CONNECTREFUSED, 0x05),
            (EndReason::CONNRESET, 0x05),
            (EndReason::TIMEOUT, 0x06),
            (EndReason::MISC, 0x01),
            (EndReason::DESTROY, 0x01),
            (EndReason::DONE, 0x01),
            (EndReason::HIBERNATING, 0x01),
            (EndReason::INTERNAL, 0x01),
            (EndReason::RESOURCELIMIT, 0x01),
            (EndReason::TORPROTOCOL, 0x01),
            (EndReason::from(200), 0x01),
        ];
        for (reason, code) in cases {
            assert_eq!(end_reason_reply(reason), code, "{reason}");
            assert_eq!(reply_code(&StreamFailure::Ended(reason)), code);
        }
    }

    #[test]
    fn local_failures_map_to_codes() {
        assert_eq!(reply_code(&StreamFailure::NotAllowed), 0x02);
        assert_eq!(reply_code(&StreamFailure::BuildTimeout), 0x06);
        assert_eq!(reply_code(&StreamFailure::ConnectTimeout), 0x06);
        assert_eq!(reply_code(&StreamFailure::BuildFailed("x".into())), 0x01);
        assert_eq!(reply_code(&StreamFailure::NoPath("x".into())), 0x01);
        assert_eq!(reply_code(&StreamFailure::CircuitClosed), 0x01);
        assert_eq!(reply_code(&StreamFailure::BadTarget), 0x01);
        assert_eq!(reply_code(&StreamFailure::ShuttingDown), 0x01);
        assert_eq!(reply_code(&StreamFailure::Attach("x".into())), 0x01);
    }

    #[test]
    fn malformed_requests_get_specific_codes() {
        // BIND, UDP ASSOCIATE, RESOLVE: command not supported.
        assert_eq!(request_error_reply(&[5, 2, 0, 1]), 0x07);
        assert_eq!(request_error_reply(&[5, 3, 0, 1]), 0x07);
        assert_eq!(request_error_reply(&[5, 0xF0, 0, 3]), 0x07);
        // Unknown address type.
        assert_eq!(request_error_reply(&[5, 1, 0, 9, 1, 2]), 0x08);
        // Something else (a port of 0, a bad version byte...).
        assert_eq!(request_error_reply(&[5, 1, 0, 1, 0, 0, 0, 0, 0, 0]), 0x01);
        assert_eq!(request_error_reply(&[5]), 0x01);
        assert_eq!(request_error_reply(&[]), 0x01);
    }

    /// Found by the `socks_request` fuzz target: a request with a wrong
    /// version byte after username/password authentication
    /// (`05 01 02 | 01 05 alice 00 | 01 26 64 05 01 00 01 7f 00 00 01 1f 90`)
    /// got reply 0x07 when the bytes after the version had arrived with it
    /// (byte 1 read as a command), and 0x01 when they had not.
    #[test]
    fn bad_version_reply_does_not_depend_on_read_boundaries() {
        let raw = [1, 0x26, 0x64, 5, 1, 0, 1, 0x7f, 0, 0, 1, 0x1f, 0x90];
        for n in 1..=raw.len() {
            assert_eq!(request_error_reply(&raw[..n]), 0x01, "{n} bytes");
        }
        assert_eq!(request_error_reply(&[4, 2, 0, 9]), 0x01);
        assert_eq!(socks5_failure(8), [5, 8, 0, 1, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn isolation_keys() {
        let none = isolation_key(&SocksAuth::NoAuth);
        let alice = isolation_key(&SocksAuth::Username(b"alice".to_vec(), b"x".to_vec()));
        let alice2 = isolation_key(&SocksAuth::Username(b"alice".to_vec(), b"x".to_vec()));
        let alice_other_pass =
            isolation_key(&SocksAuth::Username(b"alice".to_vec(), b"y".to_vec()));
        let bob = isolation_key(&SocksAuth::Username(b"bob".to_vec(), b"x".to_vec()));
        let s4 = isolation_key(&SocksAuth::Socks4(b"alice".to_vec()));
        assert_eq!(none, IsolationKey::None);
        assert!(none.compatible(&IsolationKey::None));
        assert!(alice.compatible(&alice2));
        assert!(!alice.compatible(&alice_other_pass));
        assert!(!alice.compatible(&bob));
        assert!(!alice.compatible(&none));
        assert!(!none.compatible(&alice));
        assert!(!s4.compatible(&alice));
    }
}
