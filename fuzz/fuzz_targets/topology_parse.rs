//! Arbitrary text as a topology file: parsing must return a topology or an
//! error naming a position, never panic; whatever parses must also build a
//! link model.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onionlab_netem::topology::Topology;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(topology) = Topology::from_toml_str(text, "fuzz") {
        let _ = onionlab_netem::model::LinkModel::<u32>::new(&topology);
    }
});
