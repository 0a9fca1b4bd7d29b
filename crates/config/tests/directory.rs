//! Serving and fetching the document over HTTP on loopback.

use std::sync::Arc;
use std::time::Duration;

use onionlab_config::directory::{self, fetch, fetch_with_limits, serve, MAX_DOCUMENT_LEN};
use onionlab_config::Error;
use onionlab_config::NetworkSource;
use onionlab_config::{load_network, InitOptions};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// Start a directory serving `text`; returns its address, a shutdown
/// trigger and its task.
async fn start(
    text: &str,
) -> (
    std::net::SocketAddr,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, Arc::from(text), async {
        let _ = rx.await;
    }));
    (addr, tx, task)
}

/// Send a raw request and read the whole answer.
async fn raw(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn serve_and_fetch() {
    let text = "hello\nsignature ed25519 00\nünïcode\n";
    let (addr, stop, task) = start(text).await;
    let url = format!("http://{addr}/network.doc");
    assert_eq!(fetch(&url).await.unwrap(), text);
    // Again (one request per connection), and via localhost.
    assert_eq!(fetch(&url).await.unwrap(), text);
    let local = format!("http://localhost:{}/network.doc", addr.port());
    assert_eq!(fetch(&local).await.unwrap(), text);
    // A query string is ignored.
    assert_eq!(fetch(&format!("{url}?x=1")).await.unwrap(), text);

    for path in ["/", "/network.doc/", "/other", "/NETWORK.DOC"] {
        let err = fetch(&format!("http://{addr}{path}")).await.unwrap_err();
        assert!(matches!(err, Error::Http { .. }), "{path}: {err}");
        assert!(err.to_string().contains("404"), "{path}: {err}");
    }

    let answer = raw(addr, b"POST /network.doc HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("allow: get, head"),
        "{answer}"
    );
    let answer = raw(
        addr,
        b"GET /network.doc HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let answer = raw(addr, b"HEAD /network.doc HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(!answer.contains("hello"), "{answer}");
    let answer = raw(addr, b"GET /network.doc HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("content-type: text/plain"), "{answer}");
    assert!(answer.ends_with(text), "{answer}");
    let answer = raw(addr, b"garbage\r\n\r\n").await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 400"),
        "{answer}"
    );

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
    // Closed after shutdown.
    assert!(fetch(&url).await.is_err());
}

/// Found by the `dir_http` fuzz target: a client that closes its sending
/// side right after its request got no answer when the server read the
/// EOF before it wrote (hyper closes at once on EOF unless half-closed
/// connections are allowed).
#[tokio::test]
async fn requests_followed_by_eof_are_answered() {
    let text = "doc\n";
    let (addr, stop, task) = start(text).await;
    for (request, status) in [
        (&b"GET /network.doc HTTP/1.1\r\nHost: x\r\n\r\n"[..], "200"),
        (b"HEAD /network.doc HTTP/1.0\r\n\r\n", "200"),
        (b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n", "404"),
        (
            b"POST /network.doc HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc",
            "413",
        ),
    ] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        s.shutdown().await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        let answer = String::from_utf8_lossy(&out);
        // hyper answers in the request's HTTP version (1.0 or 1.1).
        assert!(
            answer.starts_with("HTTP/1.") && answer.get(9..12) == Some(status),
            "{request:?}: {answer:?}"
        );
        if request.starts_with(b"GET /network.doc") {
            assert!(answer.ends_with(text), "{answer}");
        }
    }
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn oversized_answers_are_refused() {
    // By Content-Length.
    let (addr, _stop, _task) = start(&"x".repeat(1000)).await;
    let url = format!("http://{addr}/network.doc");
    let err = fetch_with_limits(&url, Duration::from_secs(10), 999)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLarge {
                size: 1000,
                max: 999,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        fetch_with_limits(&url, Duration::from_secs(10), 1000)
            .await
            .unwrap()
            .len(),
        1000
    );

    // The real cap: a document one byte over 16 MiB.
    let (addr, _stop, _task) = start(&"y".repeat(MAX_DOCUMENT_LEN + 1)).await;
    let err = fetch(&format!("http://{addr}/network.doc"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");

    // Chunked, with no length announced: counted while reading.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf).await;
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            .await;
        let chunk = format!("{:x}\r\n{}\r\n", 4096, "z".repeat(4096));
        for _ in 0..64 {
            if s.write_all(chunk.as_bytes()).await.is_err() {
                return;
            }
        }
        let _ = s.write_all(b"0\r\n\r\n").await;
    });
    let err = fetch_with_limits(
        &format!("http://{addr}/network.doc"),
        Duration::from_secs(10),
        100_000,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
}

#[tokio::test]
async fn fetch_times_out_and_reports_connection_errors() {
    // A server that accepts and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (_s, _) = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
    });
    let err = fetch_with_limits(
        &format!("http://{addr}/network.doc"),
        Duration::from_millis(200),
        1000,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");

    // Nothing listens on a port we just released.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let err = fetch(&format!("http://127.0.0.1:{port}/network.doc"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Http { .. }), "{err}");
    assert!(err.to_string().contains("cannot connect"), "{err}");

    let err = fetch("https://127.0.0.1/network.doc").await.unwrap_err();
    assert!(matches!(err, Error::Url { .. }), "{err}");
}

#[tokio::test]
async fn load_network_from_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let summary = onionlab_config::init_network(
        &InitOptions {
            out: tmp.path().to_path_buf(),
            ..InitOptions::default()
        },
        &mut rng,
    )
    .unwrap();
    let text = std::fs::read_to_string(&summary.network_doc).unwrap();
    let public =
        onionlab_netdoc::keys::load_network_public_key(&summary.network_key_public).unwrap();
    let (addr, _stop, _task) = start(&text).await;
    let source =
        NetworkSource::parse(&format!("http://{addr}{}", directory::DOCUMENT_PATH)).unwrap();
    let doc = load_network(&source, &public).await.unwrap();
    assert_eq!(doc.relays.len(), 3);

    // With another key, the error names the URL.
    let other = tor_llcrypto::pk::ed25519::Keypair::from_bytes(&[1; 32]).verifying_key();
    let err = load_network(&source, &other).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Document(onionlab_netdoc::Error::BadSignature { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains(&addr.to_string()), "{err}");

    // A tampered file names the file.
    let path = tmp.path().join("tampered.doc");
    std::fs::write(&path, text.replacen("relay0", "relayX", 1)).unwrap();
    let err = load_network(&NetworkSource::File(path.clone()), &public)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("tampered.doc"), "{err}");
    let err = load_network(
        &NetworkSource::File(tmp.path().join("missing.doc")),
        &public,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
}
