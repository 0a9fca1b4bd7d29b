//! A tiny HTTP/1.1 directory: serve the signed network document, and fetch
//! it.
//!
//! The server answers `GET` (and `HEAD`) for [`DOCUMENT_PATH`] with the
//! document as `text/plain`, any other path with 404, other methods on the
//! document with 405, and any request that carries a body with 413. Each
//! connection serves one request (no keep-alive) and is closed after
//! [`CONNECTION_TIMEOUT`]; the request head must arrive within
//! [`HEADER_READ_TIMEOUT`].
//!
//! The client fetches only `http://` URLs whose host is an IP literal or
//! `localhost` (no DNS lookups: it connects to exactly the address in the
//! URL), gives up after [`FETCH_TIMEOUT`], and refuses answers larger than
//! [`MAX_DOCUMENT_LEN`]. The document is authenticated by its signature,
//! not by the transport, so plain HTTP is enough.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

use crate::error::{Error, Result};
pub use onionlab_netdoc::doc::MAX_DOCUMENT_LEN;

/// The path the document is served at.
pub const DOCUMENT_PATH: &str = "/network.doc";

/// Time limit of [`fetch`], from connecting to the last byte.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Time a client has to send its request head to the server.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a server connection may last.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);

/// Most connections the server handles at once; more are closed at once.
pub const MAX_CONNECTIONS: usize = 256;

/// How long [`serve`] waits for open connections after shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Holds the document so a [`Bytes`] can share it without copying.
struct SharedText(Arc<str>);

impl AsRef<[u8]> for SharedText {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// Serve `doc_text` at [`DOCUMENT_PATH`] on `listener` until `shutdown`
/// completes. Then stop accepting, let open connections finish for up to
/// five seconds, and return.
///
/// Errors of single connections are logged (at debug level) and do not
/// stop the server.
pub async fn serve(listener: TcpListener, doc_text: Arc<str>, shutdown: impl Future<Output = ()>) {
    let body = Bytes::from_owner(SharedText(doc_text));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    let mut backoff = onionlab_ops::AcceptBackoff::new("directory");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    backoff.on_success();
                    if conns.len() >= MAX_CONNECTIONS {
                        tracing::debug!(%peer, "directory: too many connections, closing");
                        continue;
                    }
                    conns.spawn(serve_connection(stream, peer, body.clone(), stop_rx.clone()));
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait (growing
                    // delays) rather than spin; the log is rate-limited.
                    let delay = backoff.on_error(std::time::Instant::now(), &e);
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            },
        }
    }
    let _ = stop_tx.send(true);
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
        conns.abort_all();
    }
}

/// Serve one request on `stream` exactly as the directory serves a TCP
/// connection, for the fuzz targets (`fuzz/fuzz_targets/dir_http.rs`).
#[doc(hidden)]
pub async fn serve_stream_for_fuzzing<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    doc_text: Arc<str>,
) {
    let body = Bytes::from_owner(SharedText(doc_text));
    // Kept alive: a dropped sender would start a graceful shutdown.
    let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let peer = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
    serve_connection(stream, peer, body, stop_rx).await;
}

/// Serve one connection.
async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    peer: SocketAddr,
    body: Bytes,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let svc = service_fn(move |req: Request<Incoming>| {
        let body = body.clone();
        async move { Ok::<_, Infallible>(respond(&req, body)) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(false)
        // A client may close its sending side right after the request
        // (`nc -N`, `shutdown(SHUT_WR)`): still answer it. Without this,
        // hyper drops the connection at the EOF and the answer is lost
        // whenever the EOF is read before the answer is written.
        .half_close(true)
        .max_buf_size(16 * 1024)
        .serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    let run = async {
        tokio::select! {
            r = conn.as_mut() => r,
            () = async { let _ = stop.wait_for(|s| *s).await.map(|_| ()); } => {
                conn.as_mut().graceful_shutdown();
                conn.as_mut().await
            }
        }
    };
    match tokio::time::timeout(CONNECTION_TIMEOUT, run).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(%peer, "directory: connection error: {e}"),
        Err(_) => tracing::debug!(%peer, "directory: connection timed out"),
    }
}

/// The answer to one request.
fn respond(req: &Request<Incoming>, doc: Bytes) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, msg: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(msg.as_bytes())));
        *r.status_mut() = status;
        r
    };
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    if has_body {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request bodies are not accepted\n",
        );
    }
    if req.uri().path() != DOCUMENT_PATH {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let mut r = Response::new(Full::new(doc));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The host of an [`HttpUrl`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UrlHost {
    /// An IP address literal.
    Ip(IpAddr),
    /// `localhost`: 127.0.0.1, then ::1.
    Localhost,
}

/// An `http://` URL of the restricted kind [`fetch`] accepts:
/// `http://HOST[:PORT][/PATH]` with `HOST` an IPv4 literal, a bracketed IPv6
/// literal or `localhost`, `PORT` 1-65535 (default 80), and `PATH` (default
/// `/`) of visible ASCII characters without `#`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpUrl {
    /// Host.
    host: UrlHost,
    /// Port.
    port: u16,
    /// Path and query, starting with `/`.
    path: String,
}

impl HttpUrl {
    /// Parse a URL.
    ///
    /// # Errors
    ///
    /// [`Error::Url`] saying what is wrong or unsupported.
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |reason: &str| Error::Url {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected http://HOST:PORT/PATH"))?;
        if !scheme.eq_ignore_ascii_case("http") {
            return Err(bad(
                "only http:// URLs are supported (the document is signed, so TLS adds nothing)",
            ));
        }
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(split);
        let path = if path.is_empty() {
            "/".to_string()
        } else if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_string()
        };
        if !path.bytes().all(|b| b.is_ascii_graphic() && b != b'#') {
            return Err(bad(
                "the path may only hold visible ASCII characters, without #",
            ));
        }
        if authority.contains('@') {
            return Err(bad("user names and passwords are not supported"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (ip, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("missing ] after the IPv6 address"))?;
            let ip: Ipv6Addr = ip.parse().map_err(|_| bad("bad IPv6 address"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("expected :PORT after the IPv6 address"))?,
                ),
            };
            (UrlHost::Ip(IpAddr::V6(ip)), port)
        } else {
            let (host, port) = match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            };
            let host = if host.eq_ignore_ascii_case("localhost") {
                UrlHost::Localhost
            } else if let Ok(ip) = host.parse::<Ipv4Addr>() {
                UrlHost::Ip(IpAddr::V4(ip))
            } else if host.contains(':') {
                return Err(bad("an IPv6 address must be in brackets"));
            } else {
                return Err(bad(
                    "the host must be an IP address or localhost (host names are not looked up)",
                ));
            };
            (host, port)
        };
        let port = match port {
            None => 80,
            Some(p) => {
                if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad("the port must be a number"));
                }
                match p.parse::<u16>() {
                    Ok(n) if n > 0 => n,
                    _ => return Err(bad("the port must be 1-65535")),
                }
            }
        };
        Ok(HttpUrl { host, port, path })
    }

    /// The host.
    pub fn host(&self) -> &UrlHost {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The path (with query, if any), starting with `/`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The addresses to connect to, in order.
    pub fn socket_addrs(&self) -> Vec<SocketAddr> {
        match self.host {
            UrlHost::Ip(ip) => vec![SocketAddr::new(ip, self.port)],
            UrlHost::Localhost => vec![
                SocketAddr::new(Ipv4Addr::LOCALHOST.into(), self.port),
                SocketAddr::new(Ipv6Addr::LOCALHOST.into(), self.port),
            ],
        }
    }

    /// `HOST:PORT` as in a `Host` header.
    pub fn authority(&self) -> String {
        match self.host {
            UrlHost::Ip(IpAddr::V4(ip)) => format!("{ip}:{}", self.port),
            UrlHost::Ip(IpAddr::V6(ip)) => format!("[{ip}]:{}", self.port),
            UrlHost::Localhost => format!("localhost:{}", self.port),
        }
    }
}

impl fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.authority(), self.path)
    }
}

impl std::str::FromStr for HttpUrl {
    type Err = Error;

    /// Same as [`HttpUrl::parse`].
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

/// Fetch a text document (such as the network document) from an `http://`
/// URL (see [`HttpUrl`]), within [`FETCH_TIMEOUT`] and at most
/// [`MAX_DOCUMENT_LEN`] bytes. The answer must be `200 OK` and UTF-8.
///
/// # Errors
///
/// [`Error::Url`], [`Error::Http`], [`Error::Timeout`] or
/// [`Error::TooLarge`].
pub async fn fetch(url: &str) -> Result<String> {
    fetch_with_limits(url, FETCH_TIMEOUT, MAX_DOCUMENT_LEN).await
}

/// [`fetch`] with another time limit and size cap.
///
/// # Errors
///
/// As [`fetch`].
pub async fn fetch_with_limits(url: &str, timeout: Duration, max_len: usize) -> Result<String> {
    let parsed = HttpUrl::parse(url)?;
    match tokio::time::timeout(timeout, fetch_inner(&parsed, max_len)).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout {
            url: parsed.to_string(),
            after: timeout,
        }),
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// [`fetch_with_limits`] without the time limit.
async fn fetch_inner(url: &HttpUrl, max_len: usize) -> Result<String> {
    let fail = |reason: String| Error::Http {
        url: url.to_string(),
        reason,
    };
    let mut stream = None;
    let mut last_err = None;
    for addr in url.socket_addrs() {
        match TcpStream::connect(addr).await {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last_err = Some(format!("cannot connect to {addr}: {e}")),
        }
    }
    let stream = stream.ok_or_else(|| fail(last_err.unwrap_or_else(|| "no address".into())))?;
    let _ = stream.set_nodelay(true);
    fetch_over(stream, url, max_len).await
}

/// [`fetch_over`] for the fuzz targets (`fuzz/fuzz_targets/dir_http.rs`):
/// the request for `url` written to `stream`, the answer read from it.
#[doc(hidden)]
pub async fn fetch_over_stream_for_fuzzing<S>(
    stream: S,
    url: &HttpUrl,
    max_len: usize,
) -> Result<String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    fetch_over(stream, url, max_len).await
}

/// The HTTP exchange of [`fetch_inner`] on a connected stream.
async fn fetch_over<S>(stream: S, url: &HttpUrl, max_len: usize) -> Result<String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let fail = |reason: String| Error::Http {
        url: url.to_string(),
        reason,
    };
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(64 * 1024)
        .handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(|e| fail(format!("HTTP handshake: {e}")))?;
    let _conn = AbortOnDrop(tokio::spawn(conn).abort_handle());

    let req = Request::builder()
        .method(Method::GET)
        .uri(url.path())
        .header(header::HOST, url.authority())
        .header(header::USER_AGENT, "onionlab-netdoc")
        .body(Empty::<Bytes>::new())
        .map_err(|e| fail(format!("cannot build the request: {e}")))?;
    let mut resp = sender
        .send_request(req)
        .await
        .map_err(|e| fail(format!("request failed: {e}")))?;
    if resp.status() != StatusCode::OK {
        return Err(fail(format!("server answered {}", resp.status())));
    }
    let too_large = |size: u64| Error::TooLarge {
        what: format!("answer from {url}"),
        size,
        max: max_len as u64,
    };
    if let Some(len) = resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > max_len as u64 {
            return Err(too_large(len));
        }
    }
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = resp.body_mut().frame().await {
        let frame = frame.map_err(|e| fail(format!("reading the answer: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max_len {
                return Err(too_large((buf.len() + data.len()) as u64));
            }
            buf.extend_from_slice(&data);
        }
    }
    String::from_utf8(buf).map_err(|_| fail("the answer is not UTF-8 text".into()))
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn urls() {
        let u = HttpUrl::parse("http://127.0.0.1:8080/network.doc").unwrap();
        assert_eq!(u.socket_addrs(), vec!["127.0.0.1:8080".parse().unwrap()]);
        assert_eq!(u.path(), "/network.doc");
        assert_eq!(u.to_string(), "http://127.0.0.1:8080/network.doc");

        let u = HttpUrl::parse("HTTP://[::1]/x?y=1").unwrap();
        assert_eq!(u.port(), 80);
        assert_eq!(u.authority(), "[::1]:80");
        assert_eq!(u.path(), "/x?y=1");

        let u = HttpUrl::parse("http://LocalHost:9").unwrap();
        assert_eq!(u.host(), &UrlHost::Localhost);
        assert_eq!(u.path(), "/");
        assert_eq!(u.socket_addrs().len(), 2);

        let u = HttpUrl::parse("http://10.0.0.1?q").unwrap();
        assert_eq!(u.path(), "/?q");

        for bad in [
            "https://127.0.0.1/",
            "ftp://127.0.0.1/",
            "127.0.0.1:80/x",
            "http://example.com/x",
            "http://::1/x",
            "http://[::1/x",
            "http://[::1]x/",
            "http://127.0.0.1:0/",
            "http://127.0.0.1:65536/",
            "http://127.0.0.1:/",
            "http://127.0.0.1:+80/",
            "http://user@127.0.0.1/",
            "http://127.0.0.1/a b",
            "http://127.0.0.1/a#frag",
            "http://",
        ] {
            let err = HttpUrl::parse(bad).unwrap_err();
            assert!(matches!(err, Error::Url { .. }), "{bad}: {err}");
        }
    }
}
