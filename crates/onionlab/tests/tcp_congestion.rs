//! The configured TCP congestion control is what live relay sockets use:
//! relays and client run with `tcp_congestion = "reno"` (the kernel's
//! default here is another algorithm), a download goes through, and every
//! TCP socket each relay holds (listener, links to the client and to the
//! other relays) reads back `reno` with `getsockopt(TCP_CONGESTION)` on a
//! duplicate of the relay's own descriptor (`pidfd_getfd`). So does the
//! KIST-like `channel_unsent_limit` (`TCP_NOTSENT_LOWAT`) and
//! `tcp_pacing` (`SO_MAX_PACING_RATE`) on every link socket of relays and
//! client.

use std::fs;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;

use onionlab_testnet::{self as testnet, LocalNetwork};
use onionlab_transport::tcp::{congestion_of, max_pacing_rate, PACING_UNCAPPED};

const PATH: [&str; 3] = ["relay0", "relay1", "relay2"];
const WANT: &str = "reno";
/// A `channel_unsent_limit` no kernel has by default.
const LIMIT: u32 = 12_345;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_onionlab"))
}

/// A duplicate of descriptor `fd` of process `pid` (needs the right to
/// ptrace it: the test's own child, as root).
fn steal_fd(pid: u32, fd: i32) -> Option<OwnedFd> {
    // SAFETY: plain syscalls on integers; the returned descriptors are ours.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0);
        if pidfd < 0 {
            return None;
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as i32);
        let got = libc::syscall(
            libc::SYS_pidfd_getfd,
            std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            fd,
            0,
        );
        (got >= 0).then(|| OwnedFd::from_raw_fd(got as i32))
    }
}

/// The congestion control of every TCP socket of process `pid`.
fn tcp_congestion_of_process(pid: u32) -> Vec<String> {
    tcp_sockets_of_process(pid)
        .iter()
        .filter_map(|s| congestion_of(s).ok())
        .collect()
}

/// `TCP_NOTSENT_LOWAT` of every connected (not listening) TCP socket of
/// process `pid`.
fn unsent_limits_of_process(pid: u32) -> Vec<u32> {
    tcp_sockets_of_process(pid)
        .iter()
        .filter(|s| s.is_listener().ok() == Some(false))
        .filter_map(|s| s.tcp_notsent_lowat().ok())
        .collect()
}

/// `SO_MAX_PACING_RATE` of every connected TCP socket of process `pid`.
fn pacing_of_process(pid: u32) -> Vec<u64> {
    tcp_sockets_of_process(pid)
        .iter()
        .filter(|s| s.is_listener().ok() == Some(false))
        .filter_map(|s| max_pacing_rate(s).ok())
        .collect()
}

/// Duplicates of every TCP socket of process `pid`.
fn tcp_sockets_of_process(pid: u32) -> Vec<socket2::Socket> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in dir.flatten() {
        let is_socket =
            fs::read_link(entry.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if !is_socket {
            continue;
        }
        let Some(owned) = steal_fd(pid, fd) else {
            continue;
        };
        let sock = socket2::Socket::from(owned);
        let tcp = sock.r#type().ok() == Some(socket2::Type::STREAM)
            && matches!(
                sock.domain().ok(),
                Some(socket2::Domain::IPV4 | socket2::Domain::IPV6)
            );
        if tcp {
            found.push(sock);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_sockets_use_the_configured_congestion_control() {
    let dir = std::env::temp_dir().join(format!("onionlab-tcp-cc-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    for i in 0..3 {
        net.set_relay_config(
            i,
            &format!(
                "[link.tcp]\ncongestion = \"{WANT}\"\nunsent_limit = {LIMIT}\npacing = true\n"
            ),
        )
        .expect("relay config");
    }
    net.set_transport("tls").expect("tls");
    net.start_relays().expect("relays start");
    net.start_client(
        Some(&PATH),
        &format!("[link.tcp]\ncongestion = \"{WANT}\"\nunsent_limit = {LIMIT}\npacing = true"),
    )
    .expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    testnet::download(net.socks_addr(), server, 1 << 20, None)
        .await
        .expect("a download through the relays");

    for (i, relay) in net.relays.iter().enumerate() {
        let pid = relay.pid().expect("relay alive");
        let ccs = tcp_congestion_of_process(pid);
        // The listener, and at least one link (guard: the client and the
        // middle; middle: both neighbours; exit: the middle).
        assert!(ccs.len() >= 2, "relay{i}: TCP sockets {ccs:?}");
        assert!(ccs.iter().all(|c| c == WANT), "relay{i}: {ccs:?}");
        let limits = unsent_limits_of_process(pid);
        let pacing = pacing_of_process(pid);
        if i < 2 {
            // Guard and middle hold only links.
            assert!(!limits.is_empty(), "relay{i}: no link sockets");
            assert!(limits.iter().all(|l| *l == LIMIT), "relay{i}: {limits:?}");
            assert!(
                !pacing.is_empty() && pacing.iter().all(|p| *p == PACING_UNCAPPED),
                "relay{i}: {pacing:?}"
            );
        } else {
            // The exit's connection to the server is no channel.
            assert!(limits.contains(&LIMIT), "relay{i}: {limits:?}");
            assert!(pacing.contains(&PACING_UNCAPPED), "relay{i}: {pacing:?}");
        }
    }
    let client = net
        .client
        .as_ref()
        .and_then(|c| c.pid())
        .expect("client alive");
    let ccs = tcp_congestion_of_process(client);
    assert!(
        ccs.iter().filter(|c| *c == WANT).count() >= 1,
        "client: {ccs:?}"
    );
    assert!(
        unsent_limits_of_process(client).contains(&LIMIT),
        "client: its link to the guard"
    );
    assert!(
        pacing_of_process(client).contains(&PACING_UNCAPPED),
        "client: its link to the guard"
    );
    net.stop();
    let _ = fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_congestion_control_the_kernel_lacks_stops_the_relay_with_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("onionlab-tcp-cc-bad-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init(&bin(), &dir, 1, 1).expect("network init");
    net.remove_when_done();
    net.set_relay_config(0, "link.tcp.congestion = \"no_such_cc\"\n")
        .expect("relay config");
    let err = net.start_relays().expect_err("the relay must not start");
    let log_path = net
        .relays
        .first()
        .map(|r| r.log.clone())
        .unwrap_or_default();
    let log = fs::read_to_string(log_path).unwrap_or_default();
    let text = format!("{err} {log}");
    assert!(
        text.contains("no_such_cc") && text.contains("cannot be set"),
        "{text}"
    );
    net.stop();
    let _ = fs::remove_dir_all(&dir);
}
