//! Torchestra's switch protocol (`onionlab_transport::torchestra::switch`)
//! fed whatever a peer sends on the two connections of a link: byte 0 of
//! each record picks the connection (bit 0) and whether our side starts a
//! switch first (bit 1, with bit 2 as the target); the record's cell is
//! decoded by the link codec (link protocol 4) and handed to
//! `Switches::receive`. Records are 1 + 514 bytes.
//!
//! Checked besides "no panic":
//! * the held cells never exceed the bound, and the switch states never
//!   exceed theirs;
//! * a cell of a circuit handed to the node is never a switch control cell;
//! * a cell without a circuit (circuit ID 0) is handed to the node as it
//!   is, with nothing sent and no state touched. tor-cell accepts any
//!   circuit ID on commands it does not know, so this includes SWITCH,
//!   SWITCHED_CONN and SWITCHED with circuit ID 0: they name no circuit,
//!   and the node refuses them as link cells (a channel violation);
//! * a parsed control message with a circuit re-encodes (`Control::cell`)
//!   to a cell that parses back equal;
//! * a violation names the circuit of the cell that caused it, and leaves
//!   no state for that circuit.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use onionlab_cell::chan::ChanMsg;
use onionlab_cell::codec::CellCodec;
use onionlab_transport::torchestra::switch::{Conn, Control, Switches};

const MAX_PENDING: usize = 64;
const MAX_CIRCUITS: usize = 8;
const RECORD: usize = 1 + 514;

fuzz_target!(|data: &[u8]| {
    let mut sw = Switches::new(MAX_PENDING, MAX_CIRCUITS);
    let mut codec = CellCodec::new(4);
    for record in data.chunks(RECORD) {
        let Some((&setup, bytes)) = record.split_first() else {
            return;
        };
        let conn = if setup & 1 == 0 {
            Conn::Light
        } else {
            Conn::Heavy
        };
        let mut buf = BytesMut::from(bytes);
        let Ok(Some(cell)) = codec.decode(&mut buf) else {
            continue;
        };
        let circ = cell.circid();
        if setup & 2 != 0 {
            if let Some(c) = circ {
                let to = if setup & 4 == 0 {
                    Conn::Light
                } else {
                    Conn::Heavy
                };
                for (_, out) in sw.start(c, to, setup & 8 != 0) {
                    let parsed = Control::parse(out.msg())
                        .expect("a control cell")
                        .expect("valid");
                    let again = parsed.cell(c);
                    assert_eq!(Control::parse(again.msg()), Some(Ok(parsed)));
                }
            }
        }
        if let (Some(Ok(control)), Some(c)) = (Control::parse(cell.msg()), circ) {
            assert_eq!(Control::parse(control.cell(c).msg()), Some(Ok(control)));
        }
        let before = (sw.pending(), sw.circuits(), sw.stale());
        let cmd = cell.msg().cmd();
        let r = sw.receive(conn, cell);
        if circ.is_none() {
            assert_eq!(r.deliver.len(), 1, "a link cell is handed over");
            assert_eq!(r.deliver[0].msg().cmd(), cmd);
            assert!(r.send.is_empty() && r.switched.is_none() && r.violation.is_none());
            assert_eq!((sw.pending(), sw.circuits(), sw.stale()), before);
        }
        for d in &r.deliver {
            if d.circid().is_some() {
                assert!(Control::parse(d.msg()).is_none(), "control cell delivered");
            }
        }
        if let Some(v) = &r.violation {
            assert_eq!(Some(v.circ), circ);
            assert!(!sw.switching(v.circ));
        }
        assert!(sw.pending() <= MAX_PENDING, "{} held", sw.pending());
        assert!(sw.circuits() <= MAX_CIRCUITS);
    }
});
