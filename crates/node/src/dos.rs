//! Denial-of-service limits on what clients may ask of a relay, modelled on
//! C tor's `dos.c` (its defaults in brackets): connections per source
//! address (`DoSConnectionMaxConcurrentCount` 50) and their rate
//! (`DoSConnectionConnectRate` 20/s, burst 40), connections in total and
//! link handshakes in progress (no tor counterpart: tor relies on
//! `ConnLimit` and descriptors), and circuit creation per source address
//! (`DoSCircuitCreationRate` 3/s, `DoSCircuitCreationBurst` 90, applied to
//! addresses with at least `DoSCircuitCreationMinConnections` 3 open
//! connections, so a client on its one connection is never limited).
//!
//! Addresses of the network's relays (from the network document) are
//! exempt from every per-address limit, as tor ignores addresses in its
//! node list: transports that open a connection per circuit (pctcp,
//! QUIC connection per circuit) open one per circuit between relays, and
//! a busy relay pair would otherwise trip the connection rate. The total
//! and handshake caps still apply to them. The price, as in tor, is that
//! anyone sharing a relay's address shares its exemption.
//!
//! Sans-IO: the relay asks [`DosGuard::admit`] when it accepts a
//! connection, tells it when the handshake ends and when the connection
//! closes, and asks [`DosGuard::allow_create`] for each CREATE2 on a
//! client channel. Connections that authenticate as relays of the network
//! are [`DosGuard::exempt`]: they stop counting against their address, as
//! tor exempts known relays.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use onionlab_ops::TokenBucket;
use onionlab_transport::endpoint::Admission;

/// The limits (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct DosLimits {
    /// Most connections from one address at once (not counting relays').
    pub max_conns_per_address: usize,
    /// New connections per second from one address, refilled continuously.
    pub conn_rate: f64,
    /// Burst of new connections from one address.
    pub conn_burst: f64,
    /// Most connections at once, from every address (relays' included).
    pub max_conns_total: usize,
    /// Most link handshakes in progress at once.
    pub max_handshakes: usize,
    /// CREATE2 cells per second from one address.
    pub create_rate: f64,
    /// Burst of CREATE2 cells from one address.
    pub create_burst: f64,
    /// The CREATE2 limit applies to addresses with at least this many
    /// connections open.
    pub create_min_conns: usize,
    /// Handshakes per second, in total, above which peers that have not
    /// proved their address are asked to first (QUIC's Retry; the
    /// configuration's `dos_quic_retry_rate`).
    pub handshake_retry_rate: f64,
}

impl DosLimits {
    /// What the relay's endpoints admit before any cryptography under
    /// these limits: the handshake cap, the per-address connection rate
    /// (`exempt` addresses aside) and the Retry rate.
    pub fn admission(&self, exempt: Vec<IpAddr>) -> Admission {
        Admission {
            max_pending: self.max_handshakes,
            per_address_rate: self.conn_rate,
            per_address_burst: self.conn_burst,
            retry_rate: self.handshake_retry_rate,
            exempt,
        }
    }
}

impl Default for DosLimits {
    fn default() -> Self {
        DosLimits {
            max_conns_per_address: 50,
            conn_rate: 20.0,
            conn_burst: 40.0,
            max_conns_total: 8192,
            max_handshakes: 256,
            create_rate: 3.0,
            create_burst: 90.0,
            create_min_conns: 3,
            handshake_retry_rate: 100.0,
        }
    }
}

/// Why a connection was refused at accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnRefusal {
    /// Too many connections from its address.
    PerAddress,
    /// Its address opens connections too fast.
    Rate,
    /// Too many connections in total.
    Total,
    /// Too many handshakes in progress.
    Handshakes,
}

impl std::fmt::Display for ConnRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConnRefusal::PerAddress => "too many connections from one address",
            ConnRefusal::Rate => "one address opens connections too fast",
            ConnRefusal::Total => "too many connections",
            ConnRefusal::Handshakes => "too many handshakes in progress",
        })
    }
}

/// What is known of one source address.
#[derive(Debug)]
struct AddressState {
    /// Client (non-exempt) connections open.
    conns: usize,
    connects: TokenBucket,
    creates: TokenBucket,
}

/// Counters of refusals, for stats and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DosCounters {
    /// Connections refused at accept.
    pub conns_refused: u64,
    /// CREATE2 cells refused (DESTROY RESOURCELIMIT).
    pub creates_refused: u64,
}

/// The limiter (see the module docs).
#[derive(Debug)]
pub struct DosGuard {
    limits: DosLimits,
    addresses: HashMap<IpAddr, AddressState>,
    /// Addresses of the network's relays: no per-address limits.
    relay_addresses: HashSet<IpAddr>,
    total: usize,
    handshakes: usize,
    counters: DosCounters,
    last_sweep: Option<Instant>,
}

/// How often address entries that hold nothing are forgotten.
const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

impl DosGuard {
    /// A limiter with `limits`.
    pub fn new(limits: DosLimits) -> Self {
        DosGuard {
            limits,
            addresses: HashMap::new(),
            relay_addresses: HashSet::new(),
            total: 0,
            handshakes: 0,
            counters: DosCounters::default(),
            last_sweep: None,
        }
    }

    /// The addresses of the network's relays, exempt from per-address
    /// limits (see the module docs). Set before the first connection.
    pub fn set_relay_addresses(&mut self, ips: impl IntoIterator<Item = IpAddr>) {
        self.relay_addresses = ips.into_iter().collect();
    }

    /// Refusal counters.
    pub fn counters(&self) -> DosCounters {
        self.counters
    }

    /// Connections counted now (total) and handshakes in progress.
    pub fn load(&self) -> (usize, usize) {
        (self.total, self.handshakes)
    }

    fn entry(&mut self, ip: IpAddr, now: Instant) -> &mut AddressState {
        let limits = &self.limits;
        self.addresses.entry(ip).or_insert_with(|| AddressState {
            conns: 0,
            connects: TokenBucket::full(limits.conn_burst, now),
            creates: TokenBucket::full(limits.create_burst, now),
        })
    }

    /// A connection from `ip` was accepted: admit it (it counts as open and
    /// handshaking until [`handshake_done`](Self::handshake_done) and
    /// [`closed`](Self::closed)) or refuse it.
    pub fn admit(&mut self, ip: IpAddr, now: Instant) -> Result<(), ConnRefusal> {
        self.sweep(now);
        let refusal = if self.total >= self.limits.max_conns_total {
            Some(ConnRefusal::Total)
        } else if self.handshakes >= self.limits.max_handshakes {
            Some(ConnRefusal::Handshakes)
        } else if self.relay_addresses.contains(&ip) {
            None
        } else {
            let (max, rate, burst) = (
                self.limits.max_conns_per_address,
                self.limits.conn_rate,
                self.limits.conn_burst,
            );
            let a = self.entry(ip, now);
            if a.conns >= max {
                Some(ConnRefusal::PerAddress)
            } else if !a.connects.take(rate, burst, now) {
                Some(ConnRefusal::Rate)
            } else {
                a.conns += 1;
                None
            }
        };
        match refusal {
            Some(r) => {
                self.counters.conns_refused += 1;
                Err(r)
            }
            None => {
                self.total += 1;
                self.handshakes += 1;
                Ok(())
            }
        }
    }

    /// The handshake of an admitted connection ended (either way).
    pub fn handshake_done(&mut self) {
        self.handshakes = self.handshakes.saturating_sub(1);
    }

    /// The admitted connection from `ip` authenticated as a relay of the
    /// network: it no longer counts against its address.
    pub fn exempt(&mut self, ip: IpAddr) {
        if self.relay_addresses.contains(&ip) {
            return; // never counted
        }
        if let Some(a) = self.addresses.get_mut(&ip) {
            a.conns = a.conns.saturating_sub(1);
        }
    }

    /// An admitted connection from `ip` closed; `exempt` says whether it
    /// had been [`exempt`](Self::exempt)ed.
    pub fn closed(&mut self, ip: IpAddr, exempt: bool) {
        self.total = self.total.saturating_sub(1);
        if !exempt && !self.relay_addresses.contains(&ip) {
            if let Some(a) = self.addresses.get_mut(&ip) {
                a.conns = a.conns.saturating_sub(1);
            }
        }
    }

    /// The admitted connection from `ip` joined an authenticated link as
    /// one of its per-circuit connections (a pctcp lane) and closed as a
    /// connection of its own: it stops counting, and its connection token
    /// is given back, so a client's circuits are limited by the circuit
    /// limits, not by the connection rate.
    pub fn lane_joined(&mut self, ip: IpAddr) {
        self.closed(ip, false);
        let burst = self.limits.conn_burst;
        if let Some(a) = self.addresses.get_mut(&ip) {
            a.connects.give_back(burst);
        }
    }

    /// May a client channel from `ip` create one more circuit?
    pub fn allow_create(&mut self, ip: IpAddr, now: Instant) -> bool {
        let (rate, burst, min) = (
            self.limits.create_rate,
            self.limits.create_burst,
            self.limits.create_min_conns,
        );
        if self.relay_addresses.contains(&ip) {
            return true;
        }
        let a = self.entry(ip, now);
        if a.conns < min {
            return true;
        }
        if a.creates.take(rate, burst, now) {
            true
        } else {
            self.counters.creates_refused += 1;
            false
        }
    }

    /// Forget addresses with no connection whose buckets are full again,
    /// so memory follows the addresses active now, not every address ever
    /// seen.
    fn sweep(&mut self, now: Instant) {
        if self
            .last_sweep
            .is_some_and(|t| now.saturating_duration_since(t) < SWEEP_INTERVAL)
        {
            return;
        }
        self.last_sweep = Some(now);
        let l = &self.limits;
        self.addresses.retain(|_, a| {
            a.conns > 0
                || !a.connects.refilled(l.conn_rate, l.conn_burst, now)
                || !a.creates.refilled(l.create_rate, l.create_burst, now)
        });
    }

    /// Addresses remembered now (for tests).
    pub fn tracked_addresses(&self) -> usize {
        self.addresses.len()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_default_limits_admit_as_the_endpoints_default() {
        assert_eq!(
            DosLimits::default().admission(Vec::new()),
            Admission::default()
        );
    }

    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, last])
    }

    #[test]
    fn connections_per_address_are_capped_and_freed_on_close() {
        let mut g = DosGuard::new(DosLimits {
            max_conns_per_address: 3,
            conn_burst: 100.0,
            ..DosLimits::default()
        });
        let t = Instant::now();
        for _ in 0..3 {
            g.admit(ip(1), t).expect("under the cap");
            g.handshake_done();
        }
        assert_eq!(g.admit(ip(1), t), Err(ConnRefusal::PerAddress));
        // Another address is not affected.
        g.admit(ip(2), t).expect("other address");
        g.closed(ip(1), false);
        g.admit(ip(1), t).expect("a slot was freed");
        assert_eq!(g.counters().conns_refused, 1);
    }

    #[test]
    fn relays_stop_counting_against_their_address() {
        let mut g = DosGuard::new(DosLimits {
            max_conns_per_address: 1,
            ..DosLimits::default()
        });
        let t = Instant::now();
        g.admit(ip(1), t).expect("first");
        g.handshake_done();
        g.exempt(ip(1));
        g.admit(ip(1), t)
            .expect("the relay's connection does not count");
        g.closed(ip(1), true);
        assert_eq!(g.admit(ip(1), t), Err(ConnRefusal::PerAddress));
    }

    #[test]
    fn relay_addresses_have_no_per_address_limits() {
        let mut g = DosGuard::new(DosLimits {
            max_conns_per_address: 2,
            conn_burst: 2.0,
            create_min_conns: 1,
            create_burst: 1.0,
            max_conns_total: 1000,
            ..DosLimits::default()
        });
        g.set_relay_addresses([ip(1)]);
        let t = Instant::now();
        // A relay opening a connection per circuit: far past the rate,
        // the burst and the per-address cap in one instant.
        for _ in 0..500 {
            g.admit(ip(1), t).expect("a relay's address is not limited");
            g.handshake_done();
            assert!(g.allow_create(ip(1), t));
        }
        g.exempt(ip(1));
        for _ in 0..500 {
            g.closed(ip(1), false);
        }
        // Another address still is.
        g.admit(ip(2), t).expect("1");
        g.admit(ip(2), t).expect("2");
        assert_eq!(g.admit(ip(2), t), Err(ConnRefusal::PerAddress));
        // The total cap applies to relays too.
        g.set_relay_addresses([ip(1)]);
        let mut admitted = 0;
        while g.admit(ip(1), t).is_ok() {
            g.handshake_done();
            admitted += 1;
        }
        assert_eq!(admitted, 998, "up to max_conns_total with ip(2)'s two");
        assert_eq!(g.counters().conns_refused, 2);
    }

    #[test]
    fn lanes_joining_a_link_give_their_connection_token_back() {
        let mut g = DosGuard::new(DosLimits {
            conn_rate: 0.001,
            conn_burst: 2.0,
            ..DosLimits::default()
        });
        let t = Instant::now();
        g.admit(ip(1), t).expect("the link");
        g.handshake_done();
        // A client's per-circuit connections: far more than the burst.
        for _ in 0..100 {
            g.admit(ip(1), t).expect("a lane");
            g.handshake_done();
            g.lane_joined(ip(1));
        }
        assert_eq!(g.load(), (1, 0), "only the link counts");
        // Connections of their own still spend the burst.
        g.admit(ip(1), t).expect("second");
        assert_eq!(g.admit(ip(1), t), Err(ConnRefusal::Rate));
    }

    #[test]
    fn the_connect_rate_refills_over_time() {
        let mut g = DosGuard::new(DosLimits {
            conn_rate: 10.0,
            conn_burst: 2.0,
            ..DosLimits::default()
        });
        let t = Instant::now();
        for _ in 0..2 {
            g.admit(ip(1), t).expect("burst");
            g.handshake_done();
            g.closed(ip(1), false);
        }
        assert_eq!(g.admit(ip(1), t), Err(ConnRefusal::Rate));
        g.admit(ip(1), t + Duration::from_millis(100))
            .expect("one token after 100 ms at 10/s");
    }

    #[test]
    fn total_and_handshake_caps() {
        let mut g = DosGuard::new(DosLimits {
            max_handshakes: 2,
            max_conns_total: 3,
            ..DosLimits::default()
        });
        let t = Instant::now();
        g.admit(ip(1), t).expect("1");
        g.admit(ip(2), t).expect("2");
        assert_eq!(g.admit(ip(3), t), Err(ConnRefusal::Handshakes));
        g.handshake_done();
        g.admit(ip(3), t).expect("3");
        g.handshake_done();
        g.handshake_done();
        assert_eq!(g.admit(ip(4), t), Err(ConnRefusal::Total));
        assert_eq!(g.load(), (3, 0));
    }

    #[test]
    fn circuit_creation_is_limited_only_for_addresses_with_several_connections() {
        let mut g = DosGuard::new(DosLimits {
            create_burst: 5.0,
            create_rate: 1.0,
            create_min_conns: 2,
            ..DosLimits::default()
        });
        let t = Instant::now();
        g.admit(ip(1), t).expect("conn");
        for _ in 0..100 {
            assert!(g.allow_create(ip(1), t), "one connection: never limited");
        }
        g.admit(ip(1), t).expect("second conn");
        let allowed = (0..100).filter(|_| g.allow_create(ip(1), t)).count();
        assert_eq!(allowed, 5, "the burst, then nothing");
        assert!(g.allow_create(ip(1), t + Duration::from_secs(1)));
        assert_eq!(g.counters().creates_refused, 95);
    }

    #[test]
    fn idle_addresses_are_forgotten() {
        let mut g = DosGuard::new(DosLimits::default());
        let t = Instant::now();
        for i in 0..200u8 {
            g.admit(ip(i), t).expect("admit");
            g.handshake_done();
            g.closed(ip(i), false);
        }
        assert_eq!(g.tracked_addresses(), 200);
        g.admit(ip(250), t + Duration::from_secs(3600))
            .expect("admit");
        assert_eq!(g.tracked_addresses(), 1);
    }
}
