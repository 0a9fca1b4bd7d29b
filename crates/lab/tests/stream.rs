//! Seed 002's timestamp stream against the workload server: whole
//! records, latency samples, and a stream cut or corrupted on the way is
//! a failure, never a shorter success.

use std::time::Duration;

use onionlab_lab::stream::{stream_on, STREAM_RECORD_LEN};
use onionlab_lab::traffic::workload_server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test]
async fn a_stream_delivers_whole_records_for_its_duration() {
    let server = workload_server().await.expect("server");
    let s = TcpStream::connect(server).await.expect("connect");
    let (t, bytes) = stream_on(s, Duration::from_millis(400))
        .await
        .expect("stream");
    assert!(
        bytes > 0 && bytes % STREAM_RECORD_LEN as u64 == 0,
        "{bytes}"
    );
    assert!(
        t.last_byte >= Duration::from_millis(390),
        "ended after {:?}",
        t.last_byte
    );
    // One sample per 100 ms of receiving: about four.
    assert!(
        (3..=6).contains(&t.probe_latencies.len()),
        "{} samples",
        t.probe_latencies.len()
    );
    assert!(t
        .probe_latencies
        .iter()
        .all(|d| *d < Duration::from_secs(1)));
}

/// A fake server that answers a stream request with `body` and closes.
async fn fake_server(body: Vec<u8>) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.expect("accept");
        let mut req = [0u8; 9];
        s.read_exact(&mut req).await.expect("request");
        s.write_all(&body).await.expect("write");
        let _ = s.shutdown().await;
    });
    addr
}

fn record(seq: u64) -> Vec<u8> {
    let mut r = vec![0u8; STREAM_RECORD_LEN];
    r[..8].copy_from_slice(&seq.to_be_bytes());
    onionlab_lab::traffic::fill_pattern(0, &mut r[16..]);
    r
}

async fn stream_from(body: Vec<u8>) -> Result<u64, String> {
    let addr = fake_server(body).await;
    let s = TcpStream::connect(addr).await.expect("connect");
    stream_on(s, Duration::from_millis(100))
        .await
        .map(|(_, bytes)| bytes)
        .map_err(|e| e.message)
}

#[tokio::test]
async fn a_stream_cut_before_its_end_record_fails() {
    let body: Vec<u8> = (0..10).flat_map(record).collect();
    let e = stream_from(body).await.expect_err("a cut stream");
    assert!(e.contains("without its end record after 10 records"), "{e}");
    // Cut inside a record, too.
    let mut body: Vec<u8> = (0..3).flat_map(record).collect();
    body.extend_from_slice(&record(3)[..100]);
    let e = stream_from(body).await.expect_err("a cut record");
    assert!(e.contains("without its end record"), "{e}");
}

#[tokio::test]
async fn a_complete_stream_counts_its_records_not_the_end() {
    let mut body: Vec<u8> = (0..5).flat_map(record).collect();
    body.extend(record(u64::MAX));
    assert_eq!(stream_from(body).await, Ok(5 * STREAM_RECORD_LEN as u64));
}

#[tokio::test]
async fn missing_corrupt_or_trailing_records_fail() {
    let body: Vec<u8> = [0, 1, 3].into_iter().flat_map(record).collect();
    let e = stream_from(body).await.expect_err("a gap");
    assert!(e.contains("record 3 arrived where 2 was due"), "{e}");

    let mut body: Vec<u8> = (0..2).flat_map(record).collect();
    body[STREAM_RECORD_LEN + 100] ^= 1;
    let e = stream_from(body).await.expect_err("corrupt");
    assert!(e.contains("corrupt record 1"), "{e}");

    let mut body: Vec<u8> = record(0);
    body.extend(record(u64::MAX));
    body.extend(record(1));
    let e = stream_from(body).await.expect_err("after the end");
    assert!(e.contains("after the end record"), "{e}");
}
