//! Fuzz the exit's end of datagram sets (`onionlab_dgram::ExitSets`): a
//! script of a client's messages on four circuits (LINKs with any data,
//! SEGMENTs of the end-to-end TCP with any bytes, its handshake and a
//! stream's target among them, circuits ending, time passing), the
//! driver connecting or refusing every target asked for and reading and
//! writing every stream, memory pressure now and then (sets shed, the
//! streams' limit moved). Nothing may panic; sets stay within their
//! limit, and shedding reaches its target.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use onionlab_dgram::exit::{ExitSetSettings, ExitSets};
use onionlab_dgram::wire::{RelayCommand, RelayMsg, MSG_DATA_LEN};
use onionlab_dgram::{CircuitId, Recv, StreamEvent};

const MAX_SETS: usize = 2;

fuzz_target!(|data: &[u8]| {
    let settings = ExitSetSettings {
        max_sets: MAX_SETS,
        ..ExitSetSettings::default()
    };
    let mut sets = ExitSets::new(settings, 1).expect("valid settings");
    let mut now = Instant::now();
    let mut streams = Vec::new();
    let mut rest = data;
    let mut connect = false;
    while let [op, arg, tail @ ..] = rest {
        let circuit = CircuitId(u64::from(arg % 4));
        let len = usize::from(*arg).min(tail.len()).min(MSG_DATA_LEN);
        let (body, after) = tail.split_at(len);
        rest = after;
        match op % 4 {
            0 => sets.handle_msg(
                now,
                circuit,
                RelayMsg {
                    command: RelayCommand::Link,
                    // A nonce of 32 bytes, or what the input gives.
                    data: if body.len() >= 32 { body[..32].to_vec() } else { body.to_vec() },
                },
            ),
            1 => sets.handle_msg(
                now,
                circuit,
                RelayMsg {
                    command: RelayCommand::Segment,
                    data: body.to_vec(),
                },
            ),
            2 => sets.circuit_closed(circuit),
            _ => {
                now += Duration::from_millis(u64::from(*arg) * 10);
                sets.handle_timeout(now);
                // Memory pressure now and then: shedding brings what the
                // sets hold down to the target; the stream limit moves.
                match arg % 7 {
                    0 => {
                        let target = usize::from(*arg) * 8192;
                        sets.shed(target);
                        assert!(sets.held_bytes() <= target, "shed above its target");
                    }
                    1 => sets.limit_streams(usize::from(arg % 5)),
                    2 => sets.limit_streams(usize::MAX),
                    _ => {}
                }
            }
        }
        while sets.poll_refused().is_some() {}
        while sets.poll_shed().is_some() {}
        while sets.poll_transmit().is_some() {}
        while let Some(ev) = sets.poll_event() {
            match ev {
                StreamEvent::Connect { stream, .. } => {
                    connect = !connect;
                    if connect {
                        sets.connected(now, stream);
                        streams.push(stream);
                    } else {
                        sets.refused(now, stream, 4);
                    }
                }
                StreamEvent::Wake(_) => {}
            }
        }
        for &s in &streams {
            let mut buf = [0u8; 512];
            while let Recv::Data(_) = sets.recv(now, s, &mut buf) {}
            let _ = sets.send(now, s, body);
        }
        assert!(sets.sets() <= MAX_SETS, "{} sets", sets.sets());
    }
});
