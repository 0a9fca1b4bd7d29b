//! A misspelt transport name is an error everywhere a transport is named:
//! relay.toml and client.toml (real processes refuse to start, naming the
//! file and the valid names), the command line, and the `--help` texts
//! list every registered transport. (The scenario matrix is checked in
//! the lab crate's tests.)

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use onionlab_testnet::LocalNetwork;
use onionlab_transport::{Choice, TransportKind};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_onionlab"))
}

/// The error lists every valid name.
fn assert_lists_every_name(text: &str) {
    for name in Choice::names() {
        assert!(text.contains(name), "{name} missing from: {text}");
    }
}

#[test]
fn a_misspelt_transport_in_a_node_config_stops_the_node() {
    let dir = std::env::temp_dir().join(format!("onionlab-names-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    // Written by hand: the test network's own setter refuses such names.
    for (config, name) in [
        (net.relay_config(0), "quick"),
        (dir.join("client.toml"), "TLS"),
    ] {
        let mut text = fs::read_to_string(&config).expect("config");
        assert!(!text.lines().any(|l| l.starts_with("[link")), "{text}");
        text.push_str(&format!("\n[link]\ntransport = \"{name}\"\n"));
        fs::write(&config, text).expect("config");
    }
    assert!(net.set_node_transport(Some(1), "quick").is_err());
    for (config, name) in [
        (net.relay_config(0), "quick"),
        (dir.join("client.toml"), "TLS"),
    ] {
        let command = if name == "quick" { "relay" } else { "client" };
        let out = Command::new(bin())
            .args([command, "--config"])
            .arg(&config)
            .output()
            .expect("the node runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command} started: {stderr}");
        let file = config.file_name().and_then(|f| f.to_str()).expect("name");
        assert!(stderr.contains(file), "{stderr}");
        assert!(
            stderr.contains(&format!("unknown transport `{name}`")),
            "{stderr}"
        );
        assert_lists_every_name(&stderr);
    }
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_misspelt_transport_on_the_command_line_is_refused() {
    let out = Command::new(bin())
        .args(["bench", "chain", "--transport", "quick"])
        .output()
        .expect("onionlab runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("quick"), "{stderr}");
    assert_lists_every_name(&stderr);
}

#[test]
fn help_lists_every_transport_with_its_settings() {
    for args in [
        &["relay", "--help"][..],
        &["client", "--help"],
        &["lab", "run", "--help"],
        &["bench", "chain", "--help"],
    ] {
        let out = Command::new(bin()).args(args).output().expect("help");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}");
        for kind in TransportKind::all() {
            let info = kind.info();
            assert!(stdout.contains(info.about), "{args:?}: {stdout}");
            for setting in info.settings {
                assert!(stdout.contains(setting.key), "{args:?}: {stdout}");
            }
        }
    }
}
