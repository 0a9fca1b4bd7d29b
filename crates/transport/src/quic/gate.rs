//! The QUIC handshake gate: what a relay decides about an incoming QUIC
//! connection *before* any cryptography, from its source address alone.
//!
//! A QUIC handshake costs the relay an x25519 exchange and an Ed25519
//! signature, and the relay's per-address connection limits
//! (`onionlab_node::DosGuard`) only see a QUIC link once that handshake and
//! its preamble are done; lane connections (conn-per-circuit mode) never
//! reach them. So the acceptor asks this gate first:
//!
//! - at most [`HandshakeLimits::max_pending`] handshakes in progress at
//!   once, from everyone: the rest are refused (`CONNECTION_REFUSED`);
//! - each source address may start [`HandshakeLimits::per_address_rate`]
//!   handshakes per second (burst [`HandshakeLimits::per_address_burst`]),
//!   the same defaults as the TLS connection rate (C tor's
//!   `DoSConnectionConnectRate`); addresses of the network's relays are
//!   exempt, as tor exempts known relays' addresses, because a relay in
//!   conn-per-circuit mode opens one connection per circuit;
//! - above [`HandshakeLimits::retry_rate`] handshakes per second in total,
//!   a peer that has not proved its address gets a stateless QUIC Retry
//!   (RFC 9000 section 8.1.2): one round trip for an honest client, while
//!   a flood from spoofed addresses costs the relay one small packet each
//!   and no state.
//!
//! Sans-IO: the acceptor passes the time in.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use onionlab_ops::TokenBucket;

use crate::SettingError;

/// The gate's limits (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HandshakeLimits {
    /// Most QUIC handshakes in progress at once.
    pub max_pending: usize,
    /// Handshakes per second one (non-relay) source address may start.
    pub per_address_rate: f64,
    /// Burst of handshakes from one source address.
    pub per_address_burst: f64,
    /// Handshakes per second, in total, above which peers that have not
    /// validated their address are sent a Retry.
    pub retry_rate: f64,
}

impl Default for HandshakeLimits {
    fn default() -> Self {
        HandshakeLimits {
            max_pending: 256,
            per_address_rate: 20.0,
            per_address_burst: 40.0,
            retry_rate: 100.0,
        }
    }
}

impl HandshakeLimits {
    /// Check that every limit is positive and finite.
    pub(crate) fn validate(&self) -> Result<(), SettingError> {
        let limits = [
            ("per-address handshake rate", self.per_address_rate),
            ("per-address handshake burst", self.per_address_burst),
            ("QUIC retry rate", self.retry_rate),
            ("most pending QUIC handshakes", self.max_pending as f64),
        ];
        for (setting, value) in limits {
            if !(value.is_finite() && value > 0.0) {
                return Err(SettingError::NotPositive { setting, value });
            }
        }
        Ok(())
    }
}

/// What to do with an incoming QUIC connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go on with the handshake; call [`HandshakeGate::done`] when it ends.
    Accept,
    /// Send a stateless Retry (the peer comes back with a token).
    Retry,
    /// Refuse the connection.
    Refuse(Refusal),
}

/// Why the gate refused a handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Too many handshakes in progress.
    Pending,
    /// Its address starts handshakes too fast.
    Rate,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::Pending => "too many QUIC handshakes in progress",
            Refusal::Rate => "one address starts QUIC handshakes too fast",
        })
    }
}

/// What the gate did, for stats and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateCounters {
    /// Handshakes refused.
    pub refused: u64,
    /// Retries sent.
    pub retried: u64,
}

/// How often address entries whose buckets are full again are forgotten.
const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// The gate (see the module docs).
#[derive(Debug)]
pub struct HandshakeGate {
    limits: HandshakeLimits,
    exempt: HashSet<IpAddr>,
    per_address: HashMap<IpAddr, TokenBucket>,
    total: Option<TokenBucket>,
    pending: usize,
    counters: GateCounters,
    last_sweep: Option<Instant>,
}

impl HandshakeGate {
    /// A gate with `limits` and no exempt address.
    pub fn new(limits: HandshakeLimits) -> Self {
        HandshakeGate {
            limits,
            exempt: HashSet::new(),
            per_address: HashMap::new(),
            total: None,
            pending: 0,
            counters: GateCounters::default(),
            last_sweep: None,
        }
    }

    /// Replace the addresses exempt from the per-address rate (the
    /// network's relays).
    pub fn set_exempt(&mut self, addrs: impl IntoIterator<Item = IpAddr>) {
        self.exempt = addrs.into_iter().collect();
    }

    /// Decide about a connection from `ip`; `validated` says whether the
    /// peer proved its address (it came back with a Retry token).
    pub fn decide(&mut self, ip: IpAddr, validated: bool, now: Instant) -> Verdict {
        self.sweep(now);
        let l = self.limits;
        let total = self
            .total
            .get_or_insert_with(|| TokenBucket::full(l.retry_rate, now));
        let busy = !total.take(l.retry_rate, l.retry_rate, now);
        let verdict = if busy && !validated {
            self.counters.retried += 1;
            return Verdict::Retry;
        } else if self.pending >= l.max_pending {
            Verdict::Refuse(Refusal::Pending)
        } else if !self.exempt.contains(&ip)
            && !self
                .per_address
                .entry(ip)
                .or_insert_with(|| TokenBucket::full(l.per_address_burst, now))
                .take(l.per_address_rate, l.per_address_burst, now)
        {
            Verdict::Refuse(Refusal::Rate)
        } else {
            self.pending += 1;
            Verdict::Accept
        };
        if matches!(verdict, Verdict::Refuse(_)) {
            self.counters.refused += 1;
        }
        verdict
    }

    /// An accepted handshake ended, either way.
    pub fn done(&mut self) {
        self.pending = self.pending.saturating_sub(1);
    }

    /// Handshakes in progress.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// What the gate did so far.
    pub fn counters(&self) -> GateCounters {
        self.counters
    }

    /// Addresses remembered now (for tests).
    pub fn tracked_addresses(&self) -> usize {
        self.per_address.len()
    }

    fn sweep(&mut self, now: Instant) {
        if self
            .last_sweep
            .is_some_and(|t| now.saturating_duration_since(t) < SWEEP_INTERVAL)
        {
            return;
        }
        self.last_sweep = Some(now);
        let l = self.limits;
        self.per_address
            .retain(|_, b| !b.refilled(l.per_address_rate, l.per_address_burst, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, last])
    }

    fn limits() -> HandshakeLimits {
        HandshakeLimits {
            max_pending: 4,
            per_address_rate: 1.0,
            per_address_burst: 3.0,
            retry_rate: 1000.0,
        }
    }

    #[test]
    fn pending_handshakes_are_capped_and_freed() {
        let mut g = HandshakeGate::new(HandshakeLimits {
            per_address_burst: 100.0,
            ..limits()
        });
        let t = Instant::now();
        for _ in 0..4 {
            assert_eq!(g.decide(ip(1), false, t), Verdict::Accept);
        }
        assert_eq!(g.decide(ip(2), false, t), Verdict::Refuse(Refusal::Pending));
        g.done();
        assert_eq!(g.decide(ip(2), false, t), Verdict::Accept);
        assert_eq!(g.pending(), 4);
        assert_eq!(g.counters().refused, 1);
    }

    #[test]
    fn per_address_rate_refuses_one_address_not_others_nor_relays() {
        let mut g = HandshakeGate::new(HandshakeLimits {
            max_pending: 1000,
            ..limits()
        });
        g.set_exempt([ip(9)]);
        let t = Instant::now();
        for _ in 0..3 {
            assert_eq!(g.decide(ip(1), false, t), Verdict::Accept);
        }
        assert_eq!(g.decide(ip(1), false, t), Verdict::Refuse(Refusal::Rate));
        assert_eq!(g.decide(ip(2), false, t), Verdict::Accept);
        for _ in 0..50 {
            assert_eq!(g.decide(ip(9), false, t), Verdict::Accept);
        }
        let later = t + Duration::from_secs(1);
        assert_eq!(g.decide(ip(1), false, later), Verdict::Accept);
        assert_eq!(
            g.decide(ip(1), false, later),
            Verdict::Refuse(Refusal::Rate)
        );
    }

    #[test]
    fn above_the_total_rate_unvalidated_peers_get_a_retry() {
        let mut g = HandshakeGate::new(HandshakeLimits {
            max_pending: 1000,
            per_address_burst: 1000.0,
            retry_rate: 5.0,
            ..limits()
        });
        let t = Instant::now();
        for _ in 0..5 {
            assert_eq!(g.decide(ip(1), false, t), Verdict::Accept);
        }
        assert_eq!(g.decide(ip(1), false, t), Verdict::Retry);
        assert_eq!(g.decide(ip(1), true, t), Verdict::Accept);
        assert_eq!(g.counters().retried, 1);
        // A Retry takes no token from the address: it is not the peer's fault.
        let mut g = HandshakeGate::new(HandshakeLimits {
            max_pending: 1000,
            retry_rate: 1.0,
            ..limits()
        });
        assert_eq!(g.decide(ip(1), false, t), Verdict::Accept);
        for _ in 0..10 {
            assert_eq!(g.decide(ip(1), false, t), Verdict::Retry);
        }
        assert_eq!(g.decide(ip(1), true, t), Verdict::Accept);
        assert_eq!(g.decide(ip(1), true, t), Verdict::Accept);
    }

    #[test]
    fn idle_addresses_are_forgotten() {
        let mut g = HandshakeGate::new(limits());
        let t = Instant::now();
        for i in 0..100 {
            g.decide(ip(i), false, t);
            g.done();
        }
        assert_eq!(g.tracked_addresses(), 100);
        g.decide(ip(200), false, t + Duration::from_secs(120));
        assert_eq!(g.tracked_addresses(), 1);
    }

    #[test]
    fn limits_are_validated() {
        assert!(HandshakeLimits::default().validate().is_ok());
        let bad = HandshakeLimits {
            retry_rate: f64::NAN,
            ..HandshakeLimits::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(SettingError::NotPositive {
                setting: "QUIC retry rate",
                ..
            })
        ));
        let bad = HandshakeLimits {
            max_pending: 0,
            ..HandshakeLimits::default()
        };
        assert!(bad.validate().is_err());
    }
}
