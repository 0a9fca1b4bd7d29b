//! `onionlab analyze`: the paper's figures from the command line, a Monte
//! Carlo over a consensus, and clear errors for bad input.

use std::process::Command;

fn analyze(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_onionlab"))
        .arg("analyze")
        .args(args)
        .output()
        .expect("run onionlab");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn the_papers_footnote_and_guard_estimate() {
    let (ok, text) = analyze(&[]);
    assert!(ok, "{text}");
    // Footnote 14: P(c) = 4%, P_3(c) = 9.8% at 20%; 1000 clients per guard.
    let row = |m: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(m))
            .unwrap_or_else(|| panic!("no row {m}: {text}"))
            .to_string()
    };
    assert!(
        row("1").contains("4.00%") && row("1").contains("1000.0000"),
        "{text}"
    );
    assert!(row("3").contains("9.76%"), "{text}");
}

#[test]
fn a_monte_carlo_over_a_consensus_and_bad_input() {
    let dir = std::env::temp_dir().join(format!("onionlab-analyze-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    // 30 equal guards and 30 equal exits.
    let mut consensus = String::from("network-status-version 3\n");
    for i in 0..60 {
        let flags = if i < 30 {
            "Guard Running"
        } else {
            "Exit Running"
        };
        consensus.push_str(&format!(
            "r r{i} X Y 2026-11-26 00:00:00 10.0.0.{i} 9001 0\ns {flags}\nw Bandwidth=100\n"
        ));
    }
    let path = dir.join("consensus");
    std::fs::write(&path, consensus).expect("write");
    let path = path.to_str().expect("utf-8");
    let (ok, text) = analyze(&[
        "--consensus",
        path,
        "--paths",
        "1,2",
        "--sim-clients",
        "20000",
    ]);
    assert!(ok, "{text}");
    assert!(
        text.contains("Monte Carlo over") && text.contains("60 relays"),
        "{text}"
    );
    // The Monte Carlo's one-path row: about f_g f_x = 4% correlated, 20%
    // with an adversarial entry, each client sharing its guard with about
    // 20 000 / 30 others.
    let simulated = text.split("Monte Carlo over").nth(1).expect("section");
    let row: Vec<f64> = simulated
        .lines()
        .find(|l| l.split_whitespace().next() == Some("1"))
        .expect("row 1")
        .split_whitespace()
        .map(|w| w.trim_end_matches('%').parse().expect("a number"))
        .collect();
    assert!((3.0..5.0).contains(&row[1]), "{row:?}");
    assert!((18.0..22.0).contains(&row[2]), "{row:?}");
    assert!((600.0..740.0).contains(&row[4]), "{row:?}");
    let broken = dir.join("broken");
    std::fs::write(&broken, "r a\nw Bandwidth=lots\n").expect("write");
    let (ok, text) = analyze(&["--consensus", broken.to_str().expect("utf-8")]);
    assert!(!ok && text.contains("line 2"), "{text}");
    let (ok, text) = analyze(&["--fg", "1.5"]);
    assert!(!ok && text.contains("[0, 1)"), "{text}");
    let (ok, text) = analyze(&["--consensus", path, "--paths", "31"]);
    assert!(!ok && text.contains("1 to 8"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
