//! The HTTP directory (`onionlab_config::directory`), both sides, on an
//! in-memory stream: byte 0 chooses what the rest is and the read size.
//! * **Request** bytes to the server, served by the directory's own
//!   connection handler (`serve_stream_for_fuzzing`: hyper with the
//!   directory's limits, `respond`);
//! * **Response** bytes to the client, after it wrote its `GET` for
//!   `http://127.0.0.1:7000/network.doc` (`fetch_over_stream_for_fuzzing`,
//!   what `fetch` runs once connected), with a size cap of 64 bytes or
//!   1 MiB;
//! * **URL** text for `HttpUrl::parse`.
//!
//! Each stream input is delivered twice, in one read and in small reads.
//! Tokio's clock is paused, so a timer that would fire (the server's
//! header timeout) fires at once, but nothing may wait: every exchange
//! finishes without the virtual clock passing 60 s.
//!
//! Checked besides "no panic":
//! * server: at most one response, which starts with `HTTP/1.`; a 200
//!   answers a `GET` or `HEAD` of `/network.doc` and carries exactly the
//!   document (nothing for `HEAD`); a 413 answers a request announcing a
//!   body; whole and chunked delivery give the same status line when the
//!   directory answers (hyper's own refusals of malformed requests, a 400
//!   or no answer, may depend on where its parser stopped);
//! * client: it writes one `GET /network.doc HTTP/1.1` with a `Host`
//!   header; it returns text only for a `200` response, never more than
//!   the cap or than it received; errors are `Http` or `TooLarge`; whole
//!   and chunked delivery give the same text or both an error;
//! * URL: one that parses prints (`Display`) to a URL that parses back
//!   equal, with a path starting with `/` and a port above 0.
#![no_main]

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use onionlab_config::directory::{
    fetch_over_stream_for_fuzzing, serve_stream_for_fuzzing, HttpUrl,
};
use onionlab_config::Error;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::runtime::Runtime;

const DOC: &str = "network_name = \"fuzz\"\ncreated_unix = 1\n# relays...\nsignature abc\n";
const URL: &str = "http://127.0.0.1:7000/network.doc";

fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime")
    })
}

#[derive(Default)]
struct Shared {
    written: Vec<u8>,
    /// The request head was written (client side: answers come after it).
    requested: bool,
    waker: Option<Waker>,
}

/// The other end: hands out `input` in reads of at most `chunk` bytes, then
/// EOF; records what is written.
struct Wire {
    input: Vec<u8>,
    pos: usize,
    chunk: usize,
    /// Hold the answer back until a request head was written.
    answer: bool,
    shared: Arc<Mutex<Shared>>,
}

impl AsyncRead for Wire {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.answer {
            let mut sh = self.shared.lock().expect("lock");
            if !sh.requested {
                sh.waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
        let n = (self.input.len() - self.pos)
            .min(buf.remaining())
            .min(self.chunk);
        let start = self.pos;
        buf.put_slice(&self.input[start..start + n]);
        self.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut sh = self.shared.lock().expect("lock");
        sh.written.extend_from_slice(buf);
        if !sh.requested && sh.written.windows(4).any(|w| w == b"\r\n\r\n") {
            sh.requested = true;
            if let Some(w) = sh.waker.take() {
                w.wake();
            }
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn wire(input: &[u8], chunk: usize, answer: bool) -> (Wire, Arc<Mutex<Shared>>) {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let w = Wire {
        input: input.to_vec(),
        pos: 0,
        chunk,
        answer,
        shared: shared.clone(),
    };
    (w, shared)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Serve `request`; the response's status line, checked.
fn serve(request: &[u8], chunk: usize) -> Option<String> {
    let (stream, shared) = wire(request, chunk, false);
    runtime().block_on(async {
        tokio::time::timeout(
            Duration::from_secs(60),
            serve_stream_for_fuzzing(stream, Arc::from(DOC)),
        )
        .await
        .expect("the server waits with a ready peer");
    });
    let out = std::mem::take(&mut shared.lock().expect("lock").written);
    if out.is_empty() {
        return None;
    }
    assert!(
        out.starts_with(b"HTTP/1."),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    let head_end = find(&out, b"\r\n\r\n").expect("a whole response head") + 4;
    let head = String::from_utf8(out[..head_end].to_vec()).expect("ASCII head");
    let status_line = head.lines().next().expect("a status line").to_string();
    let status = &status_line[9..12];
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |v| v.trim().parse().expect("numeric content-length"));
    let body = &out[head_end..];
    // HTTP/1.1 servers skip empty lines before the request line.
    let start = request
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(request.len());
    let request = &request[start..];
    let req_line_end = find(request, b"\r\n").or_else(|| find(request, b"\n"));
    let req_line = req_line_end.map(|e| &request[..e]).unwrap_or(request);
    let head_lower = request.to_ascii_lowercase();
    match status {
        "200" => {
            let is_get = req_line.starts_with(b"GET ");
            assert!(
                is_get || req_line.starts_with(b"HEAD "),
                "200 for {req_line:?}"
            );
            assert!(find(req_line, b"/network.doc").is_some());
            if is_get {
                assert_eq!(len, DOC.len());
                assert_eq!(body, DOC.as_bytes(), "the document is served whole");
            } else {
                assert!(body.is_empty(), "HEAD answered with a body");
            }
        }
        "413" => assert!(
            find(&head_lower, b"content-length").is_some()
                || find(&head_lower, b"transfer-encoding").is_some(),
            "413 without a body"
        ),
        _ => {}
    }
    // One response: its head and its body (none for HEAD), nothing after.
    if req_line.starts_with(b"HEAD ") {
        assert!(body.is_empty(), "HEAD answered with a body");
    } else {
        assert_eq!(body.len(), len, "more than one response or a short body");
    }
    Some(status_line)
}

/// Fetch from a server answering `response`.
fn fetch(response: &[u8], chunk: usize, max_len: usize) -> Result<String, String> {
    let (stream, shared) = wire(response, chunk, true);
    let url = HttpUrl::parse(URL).expect("URL");
    let result = runtime().block_on(async {
        tokio::time::timeout(
            Duration::from_secs(60),
            fetch_over_stream_for_fuzzing(stream, &url, max_len),
        )
        .await
        .expect("the client waits with a ready peer")
    });
    let sent = std::mem::take(&mut shared.lock().expect("lock").written);
    let sent = String::from_utf8(sent).expect("ASCII request");
    assert!(
        sent.starts_with("GET /network.doc HTTP/1.1\r\n"),
        "{sent:?}"
    );
    assert!(sent
        .to_ascii_lowercase()
        .contains("\r\nhost: 127.0.0.1:7000\r\n"));
    assert_eq!(sent.matches("\r\n\r\n").count(), 1, "{sent:?}");
    match result {
        Ok(text) => {
            assert!(
                response.starts_with(b"HTTP/1."),
                "text from a non-HTTP answer"
            );
            assert_eq!(
                response.get(9..12),
                Some(&b"200"[..]),
                "text from a non-200 answer"
            );
            assert!(text.len() <= max_len && text.len() <= response.len());
            Ok(text)
        }
        Err(e @ (Error::Http { .. } | Error::TooLarge { .. })) => Err(e.to_string()),
        Err(e) => panic!("unexpected error kind: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&setup, input)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(setup >> 3) + 1;
    match setup & 3 {
        0 => {
            // Requests hyper refuses (400, 431... or no answer, depending
            // on where its parser stopped) count as one outcome; the
            // answers of `respond` must not depend on read boundaries.
            let ours =
                |s: Option<String>| s.filter(|l| ["200", "404", "405", "413"].contains(&&l[9..12]));
            let whole = ours(serve(input, usize::MAX));
            let chunked = ours(serve(input, chunk));
            assert_eq!(whole, chunked, "reads of {chunk} bytes change the answer");
        }
        1 | 3 => {
            let max_len = if setup & 4 == 0 { 64 } else { 1 << 20 };
            // hyper's error messages (and so ours) name where its parser
            // stopped, which depends on the reads: compare text or error.
            let whole = fetch(input, usize::MAX, max_len).map_err(|_| ());
            let chunked = fetch(input, chunk, max_len).map_err(|_| ());
            assert_eq!(whole, chunked, "reads of {chunk} bytes change the result");
        }
        _ => {
            let Ok(text) = std::str::from_utf8(input) else {
                return;
            };
            if let Ok(url) = HttpUrl::parse(text) {
                assert!(url.path().starts_with('/'));
                assert!(url.port() > 0);
                let printed = url.to_string();
                let back = HttpUrl::parse(&printed).expect("a printed URL parses");
                assert_eq!(back, url, "{text:?} printed as {printed:?}");
            }
        }
    }
});
