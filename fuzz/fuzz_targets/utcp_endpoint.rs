//! What anyone can send to a dtls-utcp UDP port: datagrams from any
//! address to an accepting endpoint (`onionlab_utcp::Endpoint`), with time
//! passing. Records of 3 + n bytes: byte 0 the milliseconds to advance
//! (timers run), byte 1 the sender (one of 8 addresses), byte 2 the length
//! n of the datagram that follows (cut short at the input's end). A
//! record whose byte 0 is 255 instead replays, as its datagram, the
//! endpoint's last RETRY cookie wrapped as a HELLO around the bytes (so
//! inputs reach the sessions behind the cookie check).
//!
//! Checked besides "no panic": sessions stay within the limits (4 half-
//! open, 6 in all); an address that has no session, before or after the
//! step, gets nothing but a 17-byte RETRY.
#![no_main]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use onionlab_utcp::endpoint::{COOKIE_LEN, HELLO, RETRY};
use onionlab_utcp::{Endpoint, EndpointConfig, SessionConfig, Settings};
use tor_llcrypto::pk::ed25519::Keypair;

fuzz_target!(|data: &[u8]| {
    let mut now = Instant::now();
    let config = EndpointConfig {
        session: SessionConfig {
            utcp: Settings {
                max_lanes: 4,
                rx_buffer: 16 * 1024,
                tx_buffer: 16 * 1024,
                ..Settings::default()
            },
            datagram: 1280,
            identity: Some(Arc::new(Keypair::from_bytes(&[1; 32]))),
            expect_peer: None,
            handshake_timeout: Duration::from_secs(10),
            certificate: None,
        },
        accept: true,
        max_sessions: 6,
        max_handshakes: 4,
    };
    let mut endpoint = Endpoint::new(config, 3, now).expect("valid config");
    let mut cookie = [0u8; COOKIE_LEN];
    let mut rest = data;
    while let [ms, who, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (bytes, after) = tail.split_at(n);
        rest = after;
        let from = SocketAddr::from(([10, 0, 0, 2], 1000 + u16::from(*who % 8)));
        let datagram = if *ms == 255 {
            let mut d = vec![HELLO];
            d.extend_from_slice(&cookie);
            d.extend_from_slice(bytes);
            d
        } else {
            now += Duration::from_millis(u64::from(*ms));
            bytes.to_vec()
        };
        let addrs: Vec<SocketAddr> = (0..8)
            .map(|i| SocketAddr::from(([10, 0, 0, 2], 1000 + i)))
            .collect();
        let before: Vec<SocketAddr> = addrs
            .iter()
            .copied()
            .filter(|a| endpoint.has_session(*a))
            .collect();
        endpoint.handle_datagram(from, &datagram, now);
        if endpoint.poll_timeout().is_some_and(|t| t <= now) {
            endpoint.handle_timeout(now);
        }
        assert!(endpoint.half_open() <= 4);
        assert!(endpoint.sessions() <= 6);
        while let Some((to, d)) = endpoint.poll_transmit() {
            if d.first() == Some(&RETRY) {
                assert_eq!(d.len(), 1 + COOKIE_LEN);
                cookie.copy_from_slice(&d[1..]);
            } else {
                assert!(
                    before.contains(&to) || endpoint.has_session(to),
                    "an answer to {to}, which has no session"
                );
            }
        }
        while endpoint.poll_event().is_some() {}
    }
});
