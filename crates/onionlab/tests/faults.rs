//! Relay crashes with real processes on 127.0.0.1, over tls and quic: a
//! relay on the path is killed (SIGKILL) in the middle of a download whose
//! length the application does not know (as an HTTP response without
//! Content-Length), then started again on the same address.
//!
//! - The application must see an error (a reset), never a clean EOF that
//!   would make the partial download look complete, and soon.
//! - Once the relay is back, a new request must succeed soon.
//! - A relay restarted at once, before its QUIC peers' idle timeout, is
//!   recognised by its stateless reset: the error comes within seconds,
//!   not at the idle timeout (`restarted_*`).
//!
//! Each test runs the fault once. With `ONIONLAB_FAULT_RUNS=N` it runs it
//! N times and prints one JSON line per run and the medians (this is how
//! the numbers in `docs/faults.md` were measured):
//!
//!     ONIONLAB_FAULT_RUNS=10 cargo nextest run -p onionlab --test faults \
//!         --test-threads 1 --no-capture

use std::path::PathBuf;
use std::time::{Duration, Instant};

use onionlab_testnet::{self as testnet, LocalNetwork};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const KIB: u64 = 1 << 10;
/// Bound on kill-to-error in these tests: generous for a loaded CI machine
/// (the goal, checked by the measurement, is 10 s); with QUIC's former
/// 60 s idle timeout the stream stalled for 78 s.
const KILL_TO_ERROR_LIMIT: Duration = Duration::from_secs(20);
/// Bound on kill-to-error when the relay is restarted at once: QUIC peers
/// learn of it from its stateless reset at their next packet (a keep-alive
/// after 2 s at the latest), well before the 8 s idle timeout.
const AT_ONCE_KILL_TO_ERROR_LIMIT: Duration = Duration::from_secs(5);
/// Bound on restart-to-success (goal 5 s).
const RESTART_TO_SUCCESS_LIMIT: Duration = Duration::from_secs(15);

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_onionlab"))
}

/// Relay indexes in a 3-relay network with one exit: relay2 is the exit.
const MIDDLE: usize = 1;
const EXIT: usize = 2;

/// A 3-relay network over `transport`, and a client pinned to
/// relay0,relay1,relay2.
fn network(name: &str, transport: &str) -> LocalNetwork {
    let dir = std::env::temp_dir().join(format!(
        "onionlab-faults-{}-{name}-{transport}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    net.set_transport(transport).expect("transport");
    net.set_log_filter("info,onionlab_client=debug");
    net.start_relays().expect("relays start");
    net.start_client(Some(&["relay0", "relay1", "relay2"]), "")
        .expect("client starts");
    net
}

/// Open a download of (practically) unbounded length through SOCKS and
/// read `first` bytes of it.
async fn open_endless_download(net: &LocalNetwork, server: std::net::SocketAddr) -> TcpStream {
    let mut s = testnet::endless_download(net.socks_addr(), server)
        .await
        .expect("download request");
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    while got < 512 * KIB {
        match s.read(&mut buf).await {
            Ok(0) => panic!("EOF before the fault"),
            Ok(n) => got += n as u64,
            Err(e) => panic!("error before the fault: {e}"),
        }
    }
    s
}

/// How reading `s` to its end went.
#[derive(Debug)]
enum Ending {
    /// A clean EOF: what a truncated download must never look like.
    Eof,
    /// A read error (a reset), after this long.
    Error(std::io::ErrorKind),
    /// Nothing within the limit.
    Hang,
}

/// Read `s` until EOF, an error, or `limit` after `t0`; how it ended and
/// when, counted from `t0`.
async fn read_to_end(mut s: TcpStream, t0: Instant, limit: Duration) -> (Ending, Duration) {
    let mut buf = vec![0u8; 64 * 1024];
    let ending = tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return Ending::Eof,
                Ok(_) => {}
                Err(e) => return Ending::Error(e.kind()),
            }
        }
    })
    .await
    .unwrap_or(Ending::Hang);
    (ending, t0.elapsed())
}

/// Try small downloads until one succeeds; the time from the first try.
async fn time_to_success(net: &LocalNetwork, server: std::net::SocketAddr) -> Duration {
    let t0 = Instant::now();
    let mut last = String::new();
    while t0.elapsed() < RESTART_TO_SUCCESS_LIMIT {
        let attempt = tokio::time::timeout(
            Duration::from_secs(5),
            testnet::download(net.socks_addr(), server, 64 * KIB, None),
        )
        .await;
        match attempt {
            Ok(Ok(_)) => return t0.elapsed(),
            Ok(Err(e)) => last = e,
            Err(_) => last = "attempt timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no request succeeded within {RESTART_TO_SUCCESS_LIMIT:?}: last error: {last}");
}

/// When the killed relay comes back.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Restart {
    /// Once the application has seen its error.
    AfterTheError,
    /// At once (before any peer's idle timeout): over QUIC its peers
    /// learn from its stateless reset at their next packet.
    AtOnce,
}

/// One fault: kill `victim` mid-download; check the application sees an
/// error; restart it (`when`); time the first success. Returns (kill to
/// error, restart to success).
async fn kill_and_restart(
    net: &mut LocalNetwork,
    server: std::net::SocketAddr,
    victim: usize,
    when: Restart,
) -> (Duration, Duration) {
    let s = open_endless_download(net, server).await;
    let killed = Instant::now();
    net.relays[victim].kill();
    if when == Restart::AtOnce {
        net.restart_relay(victim).expect("restart");
    }
    let limit = match when {
        Restart::AfterTheError => KILL_TO_ERROR_LIMIT,
        // Well below the 8 s idle timeout: the reset must be what ends it.
        Restart::AtOnce => AT_ONCE_KILL_TO_ERROR_LIMIT,
    };
    let (ending, kill_to_error) = read_to_end(s, killed, limit).await;
    let client_log =
        std::fs::read_to_string(&net.client.as_ref().expect("client").log).unwrap_or_default();
    match ending {
        Ending::Error(kind) => assert_eq!(
            kind,
            std::io::ErrorKind::ConnectionReset,
            "the application must see a reset"
        ),
        Ending::Eof => panic!(
            "relay{victim} killed: the application saw a clean EOF (a truncated download that looks complete)\n{client_log}"
        ),
        Ending::Hang => panic!(
            "relay{victim} killed ({when:?}): the application saw nothing for {limit:?}\n{client_log}"
        ),
    }
    // The relay before the victim tells its operator which channel it
    // lost and how many circuits were on it.
    let before = &net.relays[victim - 1];
    let before_log = std::fs::read_to_string(&before.log).unwrap_or_default();
    assert!(
        before_log
            .lines()
            .any(|l| l.contains(&format!("channel with relay{victim} "))
                && l.contains("closed")
                && l.contains("circuits=")),
        "relay{} did not log the loss of its channel to relay{victim}:\n{before_log}",
        victim - 1
    );
    if when == Restart::AfterTheError {
        net.restart_relay(victim).expect("restart");
    }
    let restart_to_success = time_to_success(net, server).await;
    (kill_to_error, restart_to_success)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn relay_killed_mid_download(victim: usize, transport: &str, when: Restart) {
    let runs: usize = std::env::var("ONIONLAB_FAULT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let role = if victim == EXIT { "exit" } else { "middle" };
    let mut net = network(role, transport);
    let server = testnet::workload_server().await.expect("server");
    let (mut to_error, mut to_success) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let (e, s) = kill_and_restart(&mut net, server, victim, when).await;
        eprintln!(
            "{{\"transport\":\"{transport}\",\"killed\":\"{role}\",\"restart\":\"{when:?}\",\"run\":{run},\"kill_to_error_ms\":{},\"restart_to_success_ms\":{}}}",
            e.as_millis(),
            s.as_millis()
        );
        to_error.push(e);
        to_success.push(s);
    }
    eprintln!(
        "{transport}, {role} killed, restart {when:?}, {runs} runs: median kill to error {:?}, restart to success {:?}",
        median(to_error),
        median(to_success)
    );
    net.stop();
}

macro_rules! fault_tests {
    ($($name:ident: $victim:expr, $when:expr),* $(,)?) => {$(
        mod $name {
            use super::Restart;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tls() {
                super::relay_killed_mid_download($victim, "tls", $when).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn quic() {
                super::relay_killed_mid_download($victim, "quic", $when).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn quic_conn_per_circuit() {
                super::relay_killed_mid_download($victim, "quic-conn-per-circuit", $when).await
            }
        }
    )*};
}

/// dtls-utcp: a killed relay is noticed by silence (8 s, no reset over
/// UDP and no stateless reset yet), so only the cases where it comes back
/// after the error.
mod killed_middle_dtls_utcp {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dtls_utcp() {
        super::relay_killed_mid_download(super::MIDDLE, "dtls-utcp", super::Restart::AfterTheError)
            .await
    }
}

mod killed_exit_dtls_utcp {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dtls_utcp() {
        super::relay_killed_mid_download(super::EXIT, "dtls-utcp", super::Restart::AfterTheError)
            .await
    }
}

fault_tests!(
    killed_middle: super::MIDDLE, Restart::AfterTheError,
    killed_exit: super::EXIT, Restart::AfterTheError,
    restarted_middle: super::MIDDLE, Restart::AtOnce,
    restarted_exit: super::EXIT, Restart::AtOnce,
);

/// A middle that answers every EXTENDED2 with a TRUNCATED as well, keeping
/// its link to the exit (built into test binaries only, see the node
/// crate's `fault-injection` feature): the client must close the circuit
/// instead of treating the middle as its last hop, so no stream ever ends
/// at the middle (before the fix, BEGIN went to it and it refused it).
async fn hostile_middle_never_sees_a_stream(transport: &str) {
    let dir = std::env::temp_dir().join(format!(
        "onionlab-faults-{}-hostile-{transport}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    net.set_transport(transport).expect("transport");
    net.set_log_filter("info,onionlab_circuit=debug,onionlab_client=debug");
    net.set_node_env("relay1", "ONIONLAB_FAULT_HOSTILE_TRUNCATE", "1");
    net.start_relays().expect("relays start");
    net.start_client(Some(&["relay0", "relay1", "relay2"]), "")
        .expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    for _ in 0..3 {
        let r = testnet::download(net.socks_addr(), server, 64 * KIB, None).await;
        assert!(
            r.is_err(),
            "a download through a truncating middle succeeded"
        );
    }
    net.stop();
    let read = |p: &testnet::NodeProcess| std::fs::read_to_string(&p.log).unwrap_or_default();
    let middle = read(&net.relays[MIDDLE]);
    let client = read(net.client.as_ref().expect("client"));
    assert!(
        middle.contains("fault injection"),
        "the middle did not play its part:\n{middle}"
    );
    assert!(
        !middle.contains("BEGIN refused"),
        "a stream was sent to the middle:\n{middle}\n{client}"
    );
    assert!(
        client.contains("sent TRUNCATED"),
        "the client did not close on TRUNCATED:\n{client}"
    );
}

mod hostile_middle {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tls() {
        super::hostile_middle_never_sees_a_stream("tls").await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn quic() {
        super::hostile_middle_never_sees_a_stream("quic").await
    }
}
