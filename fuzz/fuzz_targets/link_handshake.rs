//! The link handshake (VERSIONS, NETINFO) and then the cell reader, fed
//! arbitrary bytes as what the peer sent: every input must end in a clean
//! error or a clean end of stream, never a panic or unbounded buffering.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onionlab_transport::link::{self, Role, StreamCellReader};
use onionlab_transport::CellReader;

fuzz_target!(|data: &[u8]| {
    let rt = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(rt) => rt,
        Err(_) => return,
    };
    let peer = "127.0.0.1:1".parse().expect("literal");
    rt.block_on(async {
        let relay = data.first().is_some_and(|b| b & 1 == 1);
        let role = if relay {
            Role::Responder { my_addrs: vec![] }
        } else {
            Role::Initiator {
                my_addrs: vec![],
                relay: false,
            }
        };
        let mut io = tokio::io::join(data, tokio::io::sink());
        let Ok(negotiated) = link::handshake(&mut io, role, peer).await else {
            return;
        };
        let (rest, _) = io.into_inner();
        let mut reader =
            StreamCellReader::new(rest, negotiated.link_version, negotiated.leftover, peer);
        let mut cells = Vec::new();
        // Each successful call consumes input, so this ends.
        while reader.read_cells(&mut cells).await.is_ok() {
            // Every cell takes at least a 7-byte header off the input.
            assert!(cells.len() <= data.len() / 7 + 1);
        }
    });
});
