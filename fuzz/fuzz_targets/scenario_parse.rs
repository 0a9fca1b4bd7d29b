//! Scenario files and trace CSVs from arbitrary text: a clean error or a
//! scenario whose variants all resolve; never a panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use onionlab_lab::Scenario;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = onionlab_lab::traffic::read_trace(text, "fuzz.csv");
    // Scenarios name files relative to the scenarios directory; keep the
    // fuzzer away from absolute paths and `..` (devices, /proc).
    if text.contains("/dev")
        || text.contains("/proc")
        || text.contains("/sys")
        || text.contains("..")
    {
        return;
    }
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    if let Ok(s) = Scenario::from_toml_str(text, "fuzz.toml", &base) {
        // Bound the work: a matrix can multiply out.
        let n: usize = s.matrix.iter().map(|(_, v)| v.len()).product();
        if n <= 256 {
            assert_eq!(s.variants().len(), n);
        }
    }
});
