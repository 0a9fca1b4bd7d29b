//! Two muxes joined by a simulated link (delay, a rate, chosen losses) in
//! simulated time: lanes carry bytes intact, a loss delays only its own
//! lane, and hostile segments harm nobody.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use onionlab_utcp::tortp::{Segment, ACK, RST, SYN};
use onionlab_utcp::{LaneEvent, LaneId, LaneState, Mux, Role, Settings};

/// One direction: segments in flight, serialised at `rate` bytes/s.
struct Link {
    delay: Duration,
    rate: f64,
    busy_until: Instant,
    in_flight: VecDeque<(Instant, Vec<u8>)>,
    /// Drop this segment? (lane, sequence number, payload length)
    drop: Box<dyn FnMut(LaneId, u32, usize) -> bool>,
    dropped: usize,
}

impl Link {
    fn new(delay_ms: u64, rate: f64, now: Instant) -> Link {
        Link {
            delay: Duration::from_millis(delay_ms),
            rate,
            busy_until: now,
            in_flight: VecDeque::new(),
            drop: Box::new(|_, _, _| false),
            dropped: 0,
        }
    }

    fn send(&mut self, now: Instant, seg: Vec<u8>) {
        let s = Segment::parse(&seg).expect("the mux sends TORTP");
        if (self.drop)(s.lane, s.seq, s.payload.len()) {
            self.dropped += 1;
            return;
        }
        let start = self.busy_until.max(now);
        self.busy_until = start + Duration::from_secs_f64(seg.len() as f64 / self.rate);
        self.in_flight
            .push_back((self.busy_until + self.delay, seg));
    }
}

struct Pair {
    now: Instant,
    a: Mux,
    b: Mux,
    ab: Link,
    ba: Link,
}

impl Pair {
    fn new(settings: Settings) -> Pair {
        let now = Instant::now();
        Pair {
            now,
            a: Mux::new(settings.clone(), Role::Initiator, 1, now).expect("mux a"),
            b: Mux::new(settings, Role::Responder, 2, now).expect("mux b"),
            // 20 ms each way, 10 Mbit/s.
            ab: Link::new(20, 1.25e6, now),
            ba: Link::new(20, 1.25e6, now),
        }
    }

    fn flush(&mut self) {
        while let Some(s) = self.a.poll_transmit() {
            self.ab.send(self.now, s);
        }
        while let Some(s) = self.b.poll_transmit() {
            self.ba.send(self.now, s);
        }
    }

    /// Advance to the next event (an arrival or a timer), at most `limit`.
    fn step(&mut self, limit: Instant) {
        self.flush();
        let next = [
            self.ab.in_flight.front().map(|x| x.0),
            self.ba.in_flight.front().map(|x| x.0),
            self.a.poll_timeout(),
            self.b.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(limit)
        .min(limit);
        self.now = self.now.max(next);
        while self.ab.in_flight.front().is_some_and(|x| x.0 <= self.now) {
            let (_, seg) = self.ab.in_flight.pop_front().expect("front");
            self.b.handle_segment(&seg, self.now).expect("valid");
        }
        while self.ba.in_flight.front().is_some_and(|x| x.0 <= self.now) {
            let (_, seg) = self.ba.in_flight.pop_front().expect("front");
            self.a.handle_segment(&seg, self.now).expect("valid");
        }
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        self.flush();
    }
}

fn pattern(lane: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ lane)
        .collect()
}

/// Send `data` on each of `lanes` (opened on a) and read them on b; the
/// time each lane's last byte arrived, from the start.
fn transfer(p: &mut Pair, lanes: &[(LaneId, Vec<u8>)]) -> Vec<Duration> {
    let start = p.now;
    let mut sent = vec![0usize; lanes.len()];
    let mut got: Vec<Vec<u8>> = vec![Vec::new(); lanes.len()];
    let mut done: Vec<Option<Duration>> = vec![None; lanes.len()];
    let deadline = start + Duration::from_secs(120);
    let mut buf = vec![0u8; 64 * 1024];
    while done.iter().any(Option::is_none) {
        assert!(p.now < deadline, "transfer did not finish in 120 s");
        for (i, (lane, data)) in lanes.iter().enumerate() {
            if sent[i] < data.len() {
                sent[i] += p.a.send(*lane, &data[sent[i]..], p.now).expect("send");
            }
            while p.b.lane_state(*lane).is_some() {
                let n = p.b.recv(*lane, &mut buf, p.now).expect("recv");
                if n == 0 {
                    break;
                }
                got[i].extend_from_slice(&buf[..n]);
            }
            if done[i].is_none() && got[i].len() == data.len() {
                assert_eq!(&got[i], data, "lane {lane} corrupted");
                done[i] = Some(p.now - start);
            }
        }
        p.step(deadline);
        while let Some(e) = p.b.poll_event() {
            assert!(matches!(e, LaneEvent::Accepted(_)), "{e:?}");
        }
    }
    done.into_iter().map(|d| d.expect("done")).collect()
}

#[test]
fn a_lane_carries_a_megabyte_intact_and_closes() {
    let mut p = Pair::new(Settings::default());
    let lane = p.a.open(p.now).expect("open");
    assert_eq!(p.a.lane_state(lane), Some(LaneState::Connecting));
    let t = transfer(&mut p, &[(lane, pattern(1, 1 << 20))]);
    // 1 MiB at 10 Mbit/s is 0.84 s; slow start from 2 KB adds a few RTTs.
    assert!(t[0] < Duration::from_secs(4), "{t:?}");
    assert_eq!(p.b.poll_event(), None);
    p.a.close(lane, p.now).expect("close");
    let limit = p.now + Duration::from_secs(5);
    while p.b.lane_state(lane) != Some(LaneState::PeerClosed) {
        assert!(p.now < limit, "FIN did not arrive");
        p.step(limit);
    }
    p.b.close(lane, p.now).expect("close");
    let limit = p.now + Duration::from_secs(30);
    while p.a.lanes() + p.b.lanes() > 0 {
        assert!(p.now < limit, "lanes not forgotten");
        p.step(limit);
    }
    assert_eq!(
        p.a.poll_event(),
        Some(LaneEvent::Closed {
            lane,
            reset: false,
            refused: false
        })
    );
}

#[test]
fn a_loss_on_one_lane_does_not_delay_another() {
    let run = |lossy: bool| {
        let mut p = Pair::new(Settings::default());
        let bulk = p.a.open(p.now).expect("bulk");
        let light = p.a.open(p.now).expect("light");
        if lossy {
            // Every 20th data segment of the bulk lane is lost once.
            let mut seen = std::collections::HashSet::new();
            let mut n = 0;
            p.ab.drop = Box::new(move |lane, seq, len| {
                if lane != bulk || len == 0 || !seen.insert(seq) {
                    return false;
                }
                n += 1;
                n % 20 == 0
            });
        }
        let t = transfer(
            &mut p,
            &[(bulk, pattern(1, 2 << 20)), (light, pattern(2, 64 * 1024))],
        );
        (t, p.ab.dropped)
    };
    let (clean, none) = run(false);
    let (lossy, dropped) = run(true);
    assert_eq!(none, 0);
    assert!(dropped > 20, "the bulk lane lost {dropped}");
    assert!(
        lossy[0] > clean[0],
        "losses slow the bulk lane: {lossy:?} vs {clean:?}"
    );
    // The light lane's bytes never wait for the bulk lane's
    // retransmissions: within 10% (the link is shared, so the bulk lane
    // backing off can only help it).
    assert!(
        lossy[1].as_secs_f64() <= clean[1].as_secs_f64() * 1.1,
        "the light lane was held back: {lossy:?} vs {clean:?}"
    );
}

#[test]
fn lanes_open_from_both_sides_without_colliding() {
    let mut p = Pair::new(Settings::default());
    let from_a = p.a.open(p.now).expect("a");
    let from_b = p.b.open(p.now).expect("b");
    assert_ne!(from_a, from_b);
    assert!(from_a.opened_by_initiator() && !from_b.opened_by_initiator());
    let limit = p.now + Duration::from_secs(2);
    while p.now < limit {
        p.step(limit);
    }
    assert_eq!(p.b.poll_event(), Some(LaneEvent::Accepted(from_a)));
    assert_eq!(p.a.poll_event(), Some(LaneEvent::Accepted(from_b)));
    for lane in [from_a, from_b] {
        assert_eq!(p.a.lane_state(lane), Some(LaneState::Open));
        assert_eq!(p.b.lane_state(lane), Some(LaneState::Open));
    }
}

fn syn(lane: LaneId) -> Vec<u8> {
    let mut out = Vec::new();
    Segment {
        lane,
        seq: 1000,
        ack: 0,
        flags: SYN,
        window: 1024,
        options: &[],
        payload: &[],
    }
    .encode(&mut out)
    .expect("encode");
    out
}

#[test]
fn hostile_segments_are_refused_without_harm() {
    let now = Instant::now();
    let settings = Settings {
        max_lanes: 4,
        ..Settings::default()
    };
    let mut b = Mux::new(settings, Role::Responder, 2, now).expect("mux");
    // Not TORTP.
    assert!(b.handle_segment(&[1, 2, 3], now).is_err());
    // A SYN for a lane number of our own side: refused with a reset.
    let ours = LaneId::new(1, false).expect("lane");
    b.handle_segment(&syn(ours), now).expect("handled");
    assert_eq!(b.lanes(), 0);
    let reset = b.poll_transmit().expect("a reset");
    let r = Segment::parse(&reset).expect("TORTP");
    assert_eq!((r.lane, r.flags, r.ack), (ours, RST | ACK, 1001));
    // Data for no lane: a reset; a reset for no lane: nothing.
    let mut data = syn(LaneId::new(9, true).expect("lane"));
    data[12] = ACK;
    b.handle_segment(&data, now).expect("handled");
    assert!(b.poll_transmit().is_some_and(|s| s[12] == RST));
    data[12] = RST;
    b.handle_segment(&data, now).expect("handled");
    assert_eq!(b.poll_transmit(), None);
    // A SYN flood: max_lanes lanes, then refusals; a repeated SYN of a
    // lane number already used opens nothing.
    for n in 1..=10 {
        b.handle_segment(&syn(LaneId::new(n, true).expect("lane")), now)
            .expect("handled");
    }
    assert_eq!(b.lanes(), 4);
    assert_eq!(b.stats().lanes_refused, 6);
    let first = LaneId::new(1, true).expect("lane");
    b.abort(first, now).expect("abort");
    assert_eq!(b.lanes(), 3);
    b.handle_segment(&syn(first), now).expect("handled");
    assert_eq!(b.lanes(), 3, "a used lane number opened again");
}

#[test]
fn a_reset_during_the_handshake_frees_the_lane() {
    let now = Instant::now();
    let mut b = Mux::new(Settings::default(), Role::Responder, 2, now).expect("mux");
    let lane = LaneId::new(1, true).expect("lane");
    b.handle_segment(&syn(lane), now).expect("SYN");
    assert_eq!(b.poll_event(), Some(LaneEvent::Accepted(lane)));
    let syn_ack = Segment::parse(&b.poll_transmit().expect("SYN-ACK"))
        .expect("TORTP")
        .flags;
    assert_eq!(syn_ack, SYN | ACK);
    // The opener gives up: a reset at the next sequence number.
    let mut reset = syn(lane);
    reset[4..8].copy_from_slice(&1001u32.to_be_bytes());
    reset[12] = RST;
    b.handle_segment(&reset, now).expect("RST");
    assert_eq!(b.lanes(), 0, "a half-open lane stayed");
    assert_eq!(
        b.poll_event(),
        Some(LaneEvent::Closed {
            lane,
            reset: true,
            refused: false
        })
    );
    // A SYN with FIN opens nothing.
    let mut synfin = syn(LaneId::new(2, true).expect("lane"));
    synfin[12] = SYN | 0x01;
    b.handle_segment(&synfin, now).expect("handled");
    assert_eq!(b.lanes(), 0);
}

#[test]
fn gaps_in_lane_numbers_do_not_block_new_lanes() {
    let now = Instant::now();
    let settings = Settings {
        max_lanes: 2,
        ..Settings::default()
    };
    let mut b = Mux::new(settings, Role::Responder, 2, now).expect("mux");
    // Lane 1 never arrives; lanes 2.. open and are reset, far past the
    // 4 x max_lanes numbers remembered above a gap.
    for n in 2..200 {
        let lane = LaneId::new(n, true).expect("lane");
        b.handle_segment(&syn(lane), now).expect("SYN");
        assert_eq!(b.lanes(), 1, "lane {n} refused");
        b.abort(lane, now).expect("abort");
    }
    while b.poll_transmit().is_some() {}
    assert_eq!(b.stats().lanes_refused, 0);
}

#[test]
fn a_reset_by_the_peer_is_reported_as_one() {
    let mut p = Pair::new(Settings::default());
    let lane = p.a.open(p.now).expect("open");
    let limit = p.now + Duration::from_secs(1);
    while p.b.lane_state(lane) != Some(LaneState::Open) {
        assert!(p.now < limit, "not open");
        p.step(limit);
    }
    p.b.abort(lane, p.now).expect("abort");
    let limit = p.now + Duration::from_secs(1);
    while p.a.lanes() > 0 {
        assert!(p.now < limit, "the reset did not arrive");
        p.step(limit);
    }
    let events: Vec<LaneEvent> = std::iter::from_fn(|| p.a.poll_event()).collect();
    assert_eq!(
        events,
        [LaneEvent::Closed {
            lane,
            reset: true,
            refused: false
        }]
    );
}

/// A lane the peer refuses (over its lane limit) is reported as refused.
#[test]
fn a_lane_over_the_peers_limit_is_reported_as_refused() {
    let mut p = Pair::new(Settings::default());
    let one_lane = Settings {
        max_lanes: 1,
        ..Settings::default()
    };
    p.b = Mux::new(one_lane, Role::Responder, 2, p.now).expect("mux b");
    let first = p.a.open(p.now).expect("open");
    let limit = p.now + Duration::from_secs(1);
    while p.b.lane_state(first) != Some(LaneState::Open) {
        assert!(p.now < limit, "not open");
        p.step(limit);
    }
    let second = p.a.open(p.now).expect("open");
    let limit = p.now + Duration::from_secs(1);
    while p.a.lanes() > 1 {
        assert!(p.now < limit, "the refusal did not arrive");
        p.step(limit);
    }
    assert_eq!(p.b.stats().lanes_refused, 1);
    let events: Vec<LaneEvent> = std::iter::from_fn(|| p.a.poll_event()).collect();
    assert_eq!(
        events,
        [LaneEvent::Closed {
            lane: second,
            reset: true,
            refused: true
        }]
    );
    // (A lane reset after it opened is not refused: the test above.)
}

/// A lane idle far longer than any timeout stays open and carries data
/// again (smoltcp's timeout counts from the last segment received; set on
/// an established lane it reset circuits that were merely idle).
#[test]
fn an_idle_lane_outlives_any_timeout() {
    let mut p = Pair::new(Settings::default());
    let lane = p.a.open(p.now).expect("open");
    transfer(&mut p, &[(lane, pattern(1, 10_000))]);
    let later = p.now + Duration::from_secs(600);
    while p.now < later {
        p.step(later);
    }
    assert_eq!(p.a.lane_state(lane), Some(LaneState::Open));
    assert_eq!(p.b.lane_state(lane), Some(LaneState::Open));
    assert_eq!(p.a.poll_event(), None);
    assert_eq!(p.b.poll_event(), None);
    // Both ways still work.
    transfer(&mut p, &[(lane, pattern(2, 10_000))]);
    let mut buf = [0u8; 64];
    assert_eq!(p.b.send(lane, b"back", p.now).expect("send"), 4);
    let limit = p.now + Duration::from_secs(5);
    while p.a.recv_queued(lane) < 4 {
        assert!(p.now < limit, "nothing came back");
        p.step(limit);
    }
    assert_eq!(p.a.recv(lane, &mut buf, p.now).expect("recv"), 4);
    assert_eq!(&buf[..4], b"back");
}
