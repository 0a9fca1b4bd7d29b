//! What anyone can send to a dtls-utcp UDP port (`onionlab_utcp::Endpoint`,
//! accepting), mixed into an honest client's session with it, so inputs
//! reach every state: the cookie check, DTLS, the identity exchange,
//! lanes. Records of 4 + n bytes: an operation byte, a sender byte, a
//! two-byte length n, then n bytes (cut short at the input's end).
//!
//! - operation below 128: advance that many milliseconds (timers run),
//!   then the n bytes arrive as a datagram from sender (one of 8
//!   addresses; 0 is the honest client's);
//! - 128 to 254: advance (operation - 128) milliseconds and deliver every
//!   datagram waiting between the client and the relay, each way; the
//!   client opens a lane once authenticated and writes the n bytes on it;
//! - 255: the n bytes arrive from sender wrapped as a `HELLO` with the
//!   cookie the relay last gave anyone.
//!
//! Checked besides "no panic": sessions stay within the limits (4 half-
//! open, 6 in all); an address that has no session, before or after the
//! step, gets nothing but a 17-byte RETRY.
#![no_main]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use onionlab_dtls::endpoint::{COOKIE_LEN, HELLO, RETRY};
use onionlab_utcp::{Certificate, Endpoint, EndpointConfig, LaneConfig, SessionConfig, Settings};
use tor_llcrypto::pk::ed25519::{Ed25519Identity, Keypair};

fn addr(i: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 2], 1000 + u16::from(i % 8)))
}

/// One certificate for every run (key generation would dominate).
fn certificate() -> Certificate {
    static CERT: OnceLock<Certificate> = OnceLock::new();
    CERT.get_or_init(|| Certificate::generate().expect("a certificate"))
        .clone()
}

fn config(identity: Option<Arc<Keypair>>, accept: bool) -> EndpointConfig {
    EndpointConfig {
        session: SessionConfig {
            carrier: LaneConfig::new(Settings {
                max_lanes: 4,
                rx_buffer: 16 * 1024,
                tx_buffer: 16 * 1024,
                ..Settings::default()
            }),
            datagram: 1280,
            identity,
            expect_peer: None,
            handshake_timeout: Duration::from_secs(10),
            certificate: Some(certificate()),
        },
        accept,
        max_sessions: 6,
        max_handshakes: 4,
        max_handshakes_per_ip: onionlab_dtls::endpoint::DEFAULT_MAX_HANDSHAKES_PER_IP,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut now = Instant::now();
    let key = Arc::new(Keypair::from_bytes(&[1; 32]));
    let relay_addr = SocketAddr::from(([10, 0, 0, 1], 443));
    let mut relay = Endpoint::new(config(Some(key.clone()), true), 3, now).expect("valid");
    let mut client = Endpoint::new(config(None, false), 4, now).expect("valid");
    client
        .connect(relay_addr, Ed25519Identity::from(key.verifying_key()), now)
        .expect("a first session");
    let mut cookie = [0u8; COOKIE_LEN];
    let mut lane = None;
    let mut rest = data;
    while let [op, who, hi, lo, tail @ ..] = rest {
        let n = usize::from(u16::from_be_bytes([*hi, *lo])).min(tail.len());
        let (bytes, after) = tail.split_at(n);
        rest = after;
        let before: Vec<SocketAddr> = (0..8).map(addr).filter(|a| relay.has_session(*a)).collect();
        match *op {
            0..=127 => {
                now += Duration::from_millis(u64::from(*op));
                relay.handle_datagram(addr(*who), bytes, now);
            }
            128..=254 => {
                now += Duration::from_millis(u64::from(*op - 128));
                for e in [&mut relay, &mut client] {
                    if e.poll_timeout().is_some_and(|t| t <= now) {
                        e.handle_timeout(now);
                    }
                }
                while let Some((_, d)) = client.poll_transmit() {
                    relay.handle_datagram(addr(0), &d, now);
                }
                while let Some((to, d)) = relay.poll_transmit() {
                    if d.first() == Some(&RETRY) {
                        cookie.copy_from_slice(&d[1..]);
                    }
                    if to == addr(0) {
                        client.handle_datagram(relay_addr, &d, now);
                    }
                }
                if lane.is_none() {
                    lane = client
                        .with_carrier(relay_addr, now, |m| m.open(now).ok())
                        .flatten();
                }
                if let Some(id) = lane {
                    let _ = client.with_carrier(relay_addr, now, |m| m.send(id, bytes, now));
                }
                while client.poll_event().is_some() {}
                continue;
            }
            255 => {
                let mut d = vec![HELLO];
                d.extend_from_slice(&cookie);
                d.extend_from_slice(bytes);
                relay.handle_datagram(addr(*who), &d, now);
            }
        }
        if relay.poll_timeout().is_some_and(|t| t <= now) {
            relay.handle_timeout(now);
        }
        assert!(relay.half_open() <= 4);
        assert!(relay.sessions() <= 6);
        while let Some((to, d)) = relay.poll_transmit() {
            if d.first() == Some(&RETRY) {
                assert_eq!(d.len(), 1 + COOKIE_LEN);
                cookie.copy_from_slice(&d[1..]);
            } else {
                assert!(
                    before.contains(&to) || relay.has_session(to),
                    "an answer to {to}, which has no session"
                );
            }
            if to == addr(0) {
                client.handle_datagram(relay_addr, &d, now);
            }
        }
        while relay.poll_event().is_some() {}
        while client.poll_event().is_some() {}
    }
});
