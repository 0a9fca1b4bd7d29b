//! Replay of an old network document, with real processes: the document
//! of a network from `network init`, signed again by the genuine network
//! key but with a validity period that ended ten days ago (as an old
//! document replayed from a directory's plain HTTP would be), is refused
//! by relays, clients and the directory with an "expired" error, at once.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use onionlab_netdoc::keys::load_network_key;
use onionlab_netdoc::NetworkDocument;
use onionlab_testnet::LocalNetwork;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_onionlab"))
}

#[test]
fn an_expired_document_signed_by_the_network_key_is_refused_by_every_node() {
    let dir = std::env::temp_dir().join(format!("onionlab-abuse-netdoc-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    let key = load_network_key(&dir.join("network-key.secret")).expect("network key");
    let doc = NetworkDocument::load_file(&dir.join("network.doc"), &key.verifying_key())
        .expect("the fresh document");
    let day = 86_400;
    let now = onionlab_config::unix_now();
    assert!(doc.valid_after_unix <= now && now + 29 * day < doc.valid_until_unix);
    let old = NetworkDocument {
        created_unix: now - 40 * day,
        valid_after_unix: now - 40 * day,
        valid_until_unix: now - 10 * day,
        ..doc.clone()
    };
    fs::write(dir.join("network.doc"), old.to_signed_text(&key)).expect("replayed document");

    let err = net
        .start_relays()
        .expect_err("a relay refuses it")
        .to_string();
    assert!(err.contains("expired"), "{err}");
    let err = net
        .start_client(None, "")
        .expect_err("the client refuses it")
        .to_string();
    assert!(err.contains("expired"), "{err}");
    let out = Command::new(bin())
        .args(["directory", "--doc"])
        .arg(dir.join("network.doc"))
        .arg("--network-key")
        .arg(dir.join("network-key.pub"))
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .expect("directory runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("expired"),
        "{stderr}"
    );

    // The operator renews it with the network key (same keys, same
    // relays); every node accepts it again.
    net.resign().expect("resign runs");
    let renewed = net.document().expect("renewed document");
    assert_eq!(renewed.relays, doc.relays);
    assert!(renewed.valid_after_unix >= now && renewed.valid_until_unix > now + 29 * day);
    for i in 0..3 {
        net.restart_relay(i)
            .expect("relays start with the renewed document");
    }
}
