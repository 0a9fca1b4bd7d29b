//! What a dtls-utcp peer sends inside its DTLS records: TORTP segments
//! for the lanes of one session (`onionlab_utcp::Mux::handle_segment`),
//! with time passing between them. Records of 2 + n bytes: byte 0 is the
//! milliseconds to advance (the mux's timers run), byte 1 the length n of
//! the segment that follows (cut short at the input's end). Every fourth
//! record (byte 0 divisible by 4) the owner also opens a lane, writes to
//! every lane and reads what they received.
//!
//! Checked besides "no panic": `Segment::parse` accepts exactly what
//! `handle_segment` does not refuse as malformed, and what parses
//! re-encodes to the same bytes; lanes stay within `max_lanes` (8 here);
//! what the mux sends back parses as TORTP, is never longer than the
//! largest segment, and is never a reset answering a reset.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use onionlab_utcp::tortp::{Segment, RST};
use onionlab_utcp::{LaneEvent, LaneId, Mux, Role, Settings};

fuzz_target!(|data: &[u8]| {
    let settings = Settings {
        max_lanes: 8,
        rx_buffer: 16 * 1024,
        tx_buffer: 16 * 1024,
        ..Settings::default()
    };
    let max_segment = settings.max_segment;
    let mut now = Instant::now();
    let mut mux = Mux::new(settings, Role::Responder, 7, now).expect("settings are valid");
    let mut lanes: Vec<LaneId> = Vec::new();
    let mut rest = data;
    let mut buf = [0u8; 4096];
    while let [ms, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (bytes, after) = tail.split_at(n);
        rest = after;
        now += Duration::from_millis(u64::from(*ms));
        mux.handle_timeout(now);
        let parsed = Segment::parse(bytes);
        let handled = mux.handle_segment(bytes, now);
        assert_eq!(parsed.is_ok(), handled.is_ok(), "parse and mux disagree");
        if let Ok(seg) = parsed {
            let mut again = Vec::new();
            seg.encode(&mut again).expect("a parsed segment encodes");
            assert_eq!(again, bytes, "re-encoding differs");
        }
        if ms % 4 == 0 {
            if let Ok(lane) = mux.open(now) {
                lanes.push(lane);
            }
            for &lane in &lanes {
                let _ = mux.send(lane, &buf[..512], now);
                let _ = mux.recv(lane, &mut buf, now);
            }
        }
        while let Some(e) = mux.poll_event() {
            match e {
                LaneEvent::Accepted(lane) => lanes.push(lane),
                LaneEvent::Closed { lane, .. } => lanes.retain(|l| *l != lane),
            }
        }
        assert!(mux.lanes() <= 8, "{} lanes", mux.lanes());
        let answering_reset = parsed.is_ok_and(|s| s.flags & RST != 0);
        while let Some(out) = mux.poll_transmit() {
            let s = Segment::parse(&out).expect("the mux sends TORTP");
            assert!(out.len() <= max_segment, "{} bytes", out.len());
            assert!(
                !(answering_reset && s.flags & RST != 0 && !lanes.contains(&s.lane)),
                "a reset answered a reset"
            );
        }
    }
});
