//! A running client reloads its network document (`network_refresh_s`)
//! and keeps the newest valid one, with real processes: a document renewed
//! with `onionlab network resign` is picked up, the older one written back
//! (a replay) is refused with a WARN, and a newer one listing the relays
//! in another order is picked up too; downloads work throughout.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use onionlab_netdoc::keys::load_network_key;
use onionlab_netdoc::NetworkDocument;
use onionlab_testnet::{self as testnet, LocalNetwork};

const REPLACED: &str = "network document replaced by a newer one";
const REFUSED_OLDER: &str = "refused a network document: older than the one held";

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_onionlab"))
}

/// How many lines of `log` contain `what`.
fn count(log: &Path, what: &str) -> usize {
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(what))
        .count()
}

/// Wait (up to 10 s) until `log` has `n` lines containing `what`.
fn wait_for(log: &Path, what: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(log, what) < n {
        assert!(
            Instant::now() < deadline,
            "no {n} line(s) {what:?} in the client's log:\n{}",
            fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Replace the document file at once (written aside, then renamed), as
/// `network resign` does.
fn write_doc(dir: &Path, text: &str) {
    let tmp = dir.join("network.doc.test");
    fs::write(&tmp, text).expect("write the document");
    fs::rename(&tmp, dir.join("network.doc")).expect("rename the document");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_client_keeps_the_newest_valid_document() {
    let dir = std::env::temp_dir().join(format!("onionlab-netdoc-refresh-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    net.start_relays().expect("relays start");
    let server = testnet::workload_server().await.expect("workload server");
    net.start_client(None, "network_refresh_s = 1")
        .expect("client starts");
    let log = net.client.as_ref().expect("client").log.clone();
    let socks = net.socks_addr();
    let download = || async {
        let t = testnet::download(socks, server, 256 * 1024, None).await;
        t.expect("a download through the client");
    };
    download().await;

    let key = load_network_key(&dir.join("network-key.secret")).expect("network key");
    let original_text = fs::read_to_string(dir.join("network.doc")).expect("the document");
    let original = net.document().expect("the original document");

    // Renewed by the operator: strictly newer (`resign` signs from now, so
    // wait for the clock to pass the original's second).
    while onionlab_config::unix_now() <= original.valid_after_unix {
        std::thread::sleep(Duration::from_millis(100));
    }
    net.resign().expect("resign runs");
    let renewed = net.document().expect("renewed document");
    assert!(renewed.valid_after_unix > original.valid_after_unix);
    wait_for(&log, REPLACED, 1);
    download().await;

    // The original written back, as a replay from a directory would be:
    // still valid, but older than the one held: refused, once.
    write_doc(&dir, &original_text);
    wait_for(&log, REFUSED_OLDER, 1);
    let line = fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .find(|l| l.contains(REFUSED_OLDER))
        .map(str::to_string)
        .unwrap_or_default();
    assert!(line.contains("WARN"), "{line}");
    for t in [original.valid_after_unix, renewed.valid_after_unix] {
        assert!(line.contains(&t.to_string()), "{line} lacks {t}");
    }
    download().await;
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        count(&log, REFUSED_OLDER),
        1,
        "the same replay is warned about once"
    );
    assert_eq!(
        count(&log, REPLACED),
        1,
        "the older document was never used"
    );

    // A newer document listing the relays backwards: relay indexes change
    // under the client, which must still build correct paths (the exit
    // last) by identity.
    let reordered = NetworkDocument {
        created_unix: renewed.valid_after_unix + 1,
        valid_after_unix: renewed.valid_after_unix + 1,
        relays: renewed.relays.iter().rev().cloned().collect(),
        ..renewed.clone()
    };
    write_doc(&dir, &reordered.to_signed_text(&key));
    wait_for(&log, REPLACED, 2);
    // New streams use fresh circuits chosen from the reordered document
    // (isolated credentials, so no earlier circuit is reused).
    for i in 0..3 {
        let user = format!("user{i}");
        testnet::download(socks, server, 256 * 1024, Some((user.as_str(), "pw")))
            .await
            .expect("a download on a circuit chosen from the reordered document");
    }
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("cannot load the network document"), "{text}");
    assert!(
        net.client.as_mut().expect("client").exited().is_none(),
        "the client still runs"
    );
    net.stop();
    let _ = fs::remove_dir_all(&dir);
}
