//! The results' parsers from arbitrary bytes: a results page's markers and
//! their commands, and a stored run whose files (manifest, compressed
//! records and repetitions, scenario) are hostile. A clean error or data
//! that passed every check; never a panic.
#![no_main]

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use libfuzzer_sys::fuzz_target;
use onionlab_lab::rundata::RunData;
use onionlab_results::pages::{parse_command, parse_page};

/// Stored-run files, in the order the input's parts fill them.
const FILES: [&str; 5] = [
    "stored.json",
    "records.jsonl.zst",
    "repetitions.jsonl.zst",
    "scenario.toml",
    "segments.jsonl",
];

fn page(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(page) = parse_page(Path::new("fuzz.md"), text) else {
        return;
    };
    for b in &page.blocks {
        assert!(text.contains(&b.body));
        let _ = parse_command(&page.path, b);
    }
}

fn stored_run(data: &[u8]) {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "onionlab-fuzz-stored-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    // Parts separated by 0xff (a byte UTF-8 text never holds).
    let mut parts = data.split(|&b| b == 0xff);
    for f in FILES {
        if let Some(p) = parts.next() {
            let _ = std::fs::write(dir.join(f), p);
        }
    }
    if let Ok(run) = RunData::load(&dir) {
        // Whatever loads passed the manifest's digests and the checks.
        assert!(run.manifest.is_some());
        let _ = run.variants();
        let _ = run.repetitions_done();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        Some((0, rest)) => page(rest),
        Some((_, rest)) => stored_run(rest),
        None => {}
    }
});
