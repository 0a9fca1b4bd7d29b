//! Operational helpers shared by onionlab's processes (relay, client,
//! directory, lab agents).
//!
//! - [`LogLimiter`]: at most one log line per interval for a repeated
//!   condition, with the count of the occurrences it held back.
//! - [`AcceptBackoff`]: what an accept loop does when `accept` fails: on
//!   descriptor or memory exhaustion (EMFILE, ENFILE, ENOBUFS, ENOMEM) it
//!   waits a growing, capped delay before accepting again, instead of
//!   spinning at full CPU on an error that will not go away by itself.
//!
//! - [`TokenBucket`]: `rate` events per second with a burst, for the
//!   relay's denial-of-service limits and the QUIC handshake gate.
//!
//! All are sans-IO: the caller passes the time in and sleeps itself.

#![warn(missing_docs)]

use std::io;
use std::time::{Duration, Instant};

/// Default interval of [`LogLimiter`]: one line per condition per 10 s.
pub const DEFAULT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Rate limit for one repeated log line.
///
/// ```
/// use std::time::{Duration, Instant};
/// use onionlab_ops::LogLimiter;
/// let mut limit = LogLimiter::new(Duration::from_secs(10));
/// let t0 = Instant::now();
/// assert_eq!(limit.check(t0), Some(0)); // first time: log, nothing held back
/// assert_eq!(limit.check(t0 + Duration::from_secs(1)), None); // held back
/// assert_eq!(limit.check(t0 + Duration::from_secs(2)), None); // held back
/// // next interval: log, and say two more happened in between
/// assert_eq!(limit.check(t0 + Duration::from_secs(11)), Some(2));
/// ```
#[derive(Debug, Clone)]
pub struct LogLimiter {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimiter {
    /// A limiter allowing one line per `interval`.
    pub fn new(interval: Duration) -> Self {
        LogLimiter {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// The condition happened at `now`. `Some(n)`: write the line now, and
    /// mention the `n` occurrences held back since the last line; `None`:
    /// stay quiet (the occurrence is counted).
    pub fn check(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.interval => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

impl Default for LogLimiter {
    fn default() -> Self {
        LogLimiter::new(DEFAULT_LOG_INTERVAL)
    }
}

/// Whether `e` says the process or the system ran out of descriptors or
/// buffer memory: an error that repeats at once if retried at once.
pub fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Back-off of an accept loop.
///
/// After each failed `accept`, call [`on_error`](Self::on_error) and sleep
/// the delay it returns; after each success call
/// [`on_success`](Self::on_success). On resource exhaustion the delay
/// starts at `min` and doubles up to `max`; other errors (a connection
/// reset before it was accepted, say) get `min` so that even an unexpected
/// persistent error cannot spin. Log lines are limited to one per
/// [`DEFAULT_LOG_INTERVAL`] with the count of failures since the last.
#[derive(Debug, Clone)]
pub struct AcceptBackoff {
    what: &'static str,
    min: Duration,
    max: Duration,
    current: Option<Duration>,
    log: LogLimiter,
    failures: u64,
}

impl AcceptBackoff {
    /// Default first delay after a failed accept.
    pub const MIN: Duration = Duration::from_millis(10);
    /// Default longest delay.
    pub const MAX: Duration = Duration::from_secs(1);

    /// Back-off for the accept loop of `what` (for logs, e.g. "OR port")
    /// with the default delays.
    pub fn new(what: &'static str) -> Self {
        Self::with_delays(what, Self::MIN, Self::MAX)
    }

    /// Back-off with delays from `min` doubling up to `max`.
    pub fn with_delays(what: &'static str, min: Duration, max: Duration) -> Self {
        AcceptBackoff {
            what,
            min,
            max: max.max(min),
            current: None,
            log: LogLimiter::default(),
            failures: 0,
        }
    }

    /// `accept` failed with `e` at `now`: log (rate-limited) and return how
    /// long to wait before accepting again.
    pub fn on_error(&mut self, now: Instant, e: &io::Error) -> Duration {
        self.failures += 1;
        let exhausted = is_resource_exhaustion(e);
        let delay = if exhausted {
            let next = self.current.map_or(self.min, |d| (d * 2).min(self.max));
            self.current = Some(next);
            next
        } else {
            self.min
        };
        if let Some(held_back) = self.log.check(now) {
            if exhausted {
                tracing::warn!(
                    failures_since_last_line = held_back,
                    delay_ms = delay.as_millis() as u64,
                    "{}: accept failed: {e} (out of descriptors or memory: backing off)",
                    self.what
                );
            } else {
                tracing::warn!(
                    failures_since_last_line = held_back,
                    "{}: accept failed: {e}",
                    self.what
                );
            }
        }
        delay
    }

    /// `accept` succeeded: the next failure starts from the first delay.
    pub fn on_success(&mut self) {
        self.current = None;
    }

    /// Failed accepts since this back-off was made.
    pub fn failures(&self) -> u64 {
        self.failures
    }
}

/// A token bucket: `rate` tokens per second, holding at most `burst`.
/// The rate and burst are passed to each call, so one set of limits can
/// serve many buckets (one per source address) without copies.
///
/// ```
/// use std::time::{Duration, Instant};
/// use onionlab_ops::TokenBucket;
/// let t0 = Instant::now();
/// let mut b = TokenBucket::full(2.0, t0);
/// assert!(b.take(1.0, 2.0, t0) && b.take(1.0, 2.0, t0));
/// assert!(!b.take(1.0, 2.0, t0)); // empty
/// assert!(b.take(1.0, 2.0, t0 + Duration::from_secs(1))); // one refilled
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TokenBucket {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A bucket holding `burst` tokens at `now`.
    pub fn full(burst: f64, now: Instant) -> Self {
        TokenBucket {
            tokens: burst,
            last: now,
        }
    }

    /// Take one token if there is one.
    pub fn take(&mut self, rate: f64, burst: f64, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Put back one token taken for something that turned out not to
    /// count (never above `burst`).
    pub fn give_back(&mut self, burst: f64) {
        self.tokens = (self.tokens + 1.0).min(burst);
    }

    /// Would the bucket be full by `now` (so forgetting it changes nothing)?
    pub fn refilled(&self, rate: f64, burst: f64, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens + elapsed * rate >= burst
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emfile() -> io::Error {
        io::Error::from_raw_os_error(libc::EMFILE)
    }

    #[test]
    fn exhaustion_doubles_up_to_the_cap_and_success_resets() {
        let mut b = AcceptBackoff::with_delays(
            "test",
            Duration::from_millis(10),
            Duration::from_millis(50),
        );
        let t = Instant::now();
        let delays: Vec<u128> = (0..5)
            .map(|_| b.on_error(t, &emfile()).as_millis())
            .collect();
        assert_eq!(delays, [10, 20, 40, 50, 50]);
        b.on_success();
        assert_eq!(b.on_error(t, &emfile()), Duration::from_millis(10));
        assert_eq!(b.failures(), 6);
    }

    #[test]
    fn other_errors_wait_the_minimum() {
        let mut b = AcceptBackoff::new("test");
        let reset = io::Error::from(io::ErrorKind::ConnectionAborted);
        assert!(!is_resource_exhaustion(&reset));
        assert!(is_resource_exhaustion(&emfile()));
        assert!(is_resource_exhaustion(&io::Error::from_raw_os_error(
            libc::ENFILE
        )));
        for _ in 0..3 {
            assert_eq!(b.on_error(Instant::now(), &reset), AcceptBackoff::MIN);
        }
    }

    #[test]
    fn limiter_counts_what_it_holds_back_per_interval() {
        let mut l = LogLimiter::new(Duration::from_secs(1));
        let t0 = Instant::now();
        let mut lines = Vec::new();
        // 1000 occurrences over 3 s: one line per second.
        for i in 0..1000u64 {
            if let Some(n) = l.check(t0 + Duration::from_millis(i * 3)) {
                lines.push(n);
            }
        }
        assert_eq!(lines.len(), 3, "{lines:?}");
        // Occurrences 1..=333 are held back and reported with the second
        // line (at 1000 ms), 335..=666 with the third.
        assert_eq!(lines, [0, 333, 333]);
    }
}
