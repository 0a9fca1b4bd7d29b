//! A user-space TCP connection per circuit between two relays, for the
//! `dtls-utcp` transport (seed 002: Reardon and Goldberg, "Improving Tor
//! using a TCP-over-DTLS Tunnel", 2009). Sans-IO throughout: a [`Mux`]
//! holds one DTLS session's lanes (one TCP connection each, run by
//! smoltcp) and is fed TORTP segments ([`tortp`]) and time; it is what an
//! `onionlab_dtls` session carries ([`carrier`]), so a [`Session`] is DTLS
//! 1.3 with the relays' identities bound inside, fed datagrams and time,
//! and an [`Endpoint`] sorts one UDP socket's datagrams to its sessions,
//! behind a stateless cookie. The transport crate owns the socket.
//!
//! smoltcp is used as it comes; what it lacks against Linux TCP, and what
//! that costs, is measured and written down in `docs/dtls-utcp.md`:
//! its minimum retransmission timeout is 1 s and not configurable, its
//! initial window is 2048 bytes, it retransmits one segment per three
//! duplicate ACKs (no SACK-based recovery: it sends SACK blocks but
//! ignores the peer's), and it holds at most 32 out-of-order ranges (the
//! largest `assembler-max-segment-count` feature). It also drops a whole
//! segment whose ACK is below what it already had acknowledged, data and
//! all; the `Mux` gives such a segment the peer's newest ACK instead
//! (`mux::newest_ack`), since reordering paths deliver them.

pub mod carrier;
pub mod mux;
pub mod tortp;

use std::time::Duration;

pub use carrier::{LaneConfig, DEFAULT_ANONYMOUS_MAX_LANES};
pub use mux::{LaneBudget, LaneEvent, LaneState, Mux, MuxStats, Role};
pub use onionlab_dtls::{Certificate, EndpointStats, RECORD_OVERHEAD};
pub use tortp::{LaneId, Segment, TortpError};

/// A dtls-utcp session: DTLS 1.3 carrying a [`Mux`]'s lanes.
pub type Session = onionlab_dtls::Session<Mux>;
/// How a dtls-utcp session starts.
pub type SessionConfig = onionlab_dtls::SessionConfig<Mux>;
/// What a dtls-utcp session reports.
pub type SessionEvent = onionlab_dtls::SessionEvent<LaneEvent>;
/// A UDP socket's dtls-utcp sessions.
pub type Endpoint = onionlab_dtls::Endpoint<Mux>;
/// How a dtls-utcp endpoint runs its sessions.
pub type EndpointConfig = onionlab_dtls::EndpointConfig<Mux>;
/// What a dtls-utcp endpoint reports.
pub type EndpointEvent = onionlab_dtls::EndpointEvent<LaneEvent>;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A segment that is not TORTP.
    #[error(transparent)]
    Tortp(#[from] TortpError),
    /// [`Settings::max_lanes`] lanes are open.
    #[error("{0} lanes are open, the most a session may have")]
    TooManyLanes(usize),
    /// All 2^31 lane numbers of this side were used.
    #[error("lane numbers exhausted")]
    LaneNumbersExhausted,
    /// No such lane (never opened, or closed and forgotten).
    #[error("no lane {0}")]
    NoLane(LaneId),
    /// The lane cannot send or receive any more.
    #[error("lane {0} is closed")]
    LaneClosed(LaneId),
    /// Settings out of range.
    #[error("utcp settings: {0}")]
    Settings(String),
    /// The TCP stack refused an operation.
    #[error("user-space TCP: {0}")]
    Stack(String),
}

/// The user-space TCP's congestion control (smoltcp's); in configuration
/// files `"cubic"` or `"reno"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Congestion {
    /// CUBIC (RFC 9438), Linux's default.
    Cubic,
    /// Reno.
    Reno,
    /// None: the window is the receiver's. For tests only (no
    /// configuration file can ask for it).
    #[serde(skip)]
    None,
}

impl From<Congestion> for smoltcp::socket::tcp::CongestionControl {
    fn from(c: Congestion) -> Self {
        match c {
            Congestion::Cubic => Self::Cubic,
            Congestion::Reno => Self::Reno,
            Congestion::None => Self::None,
        }
    }
}

/// What shapes a lane's TCP; every lab run records them. It is also the
/// `[link.utcp]` section of relay and client configuration files (the
/// fields not named there keep their defaults).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Largest TORTP segment (header, options and data): what fits in one
    /// DTLS record of one UDP datagram. The MSS is this less 16.
    pub max_segment: usize,
    /// Receive buffer per lane: the largest window it advertises.
    pub rx_buffer: usize,
    /// Send buffer per lane: data accepted and not yet acknowledged.
    pub tx_buffer: usize,
    /// Congestion control.
    pub congestion: Congestion,
    /// Delayed ACK (`None`: every segment is acknowledged at once); in
    /// files `ack_delay_ms`, 0 for none, at most [`MAX_ACK_DELAY`].
    #[serde(rename = "ack_delay_ms", with = "ack_delay_ms")]
    pub ack_delay: Option<Duration>,
    /// Nagle's algorithm (tor sets TCP_NODELAY: off).
    #[serde(skip)]
    pub nagle: bool,
    /// Most lanes at once per session.
    #[serde(skip)]
    pub max_lanes: usize,
    /// TCP keep-alive on idle lanes (`None`: off, dtls-utcp's lanes,
    /// whose session has a heartbeat of its own). A peer that forgot the
    /// lane answers a probe with a reset, so a lane whose reset was lost
    /// ends anyway.
    #[serde(skip)]
    pub keep_alive: Option<Duration>,
}

/// Longest delayed ACK [`Settings::check`] accepts.
pub const MAX_ACK_DELAY: Duration = Duration::from_secs(1);

/// [`Settings::ack_delay`] as whole milliseconds, 0 for none.
mod ack_delay_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let ms = u64::deserialize(d)?;
        Ok((ms > 0).then(|| Duration::from_millis(ms)))
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            // A 1280-byte IPv6-safe datagram less UDP/IP headers and a
            // DTLS 1.3 record's overhead leaves about 1200.
            max_segment: 1200,
            rx_buffer: 256 * 1024,
            tx_buffer: 64 * 1024,
            congestion: Congestion::Cubic,
            ack_delay: Some(Duration::from_millis(10)),
            nagle: false,
            max_lanes: 512,
            keep_alive: None,
        }
    }
}

impl Settings {
    /// Check the ranges: a segment of 100 to 65000 bytes, buffers of at
    /// least 4 segments and at most 64 MiB, at least one lane, a delayed ACK
    /// of at most [`MAX_ACK_DELAY`].
    pub fn check(&self) -> Result<(), Error> {
        if !(100..=65_000).contains(&self.max_segment) {
            return Err(Error::Settings(format!(
                "max_segment {} (100 to 65000)",
                self.max_segment
            )));
        }
        for (name, v) in [("rx_buffer", self.rx_buffer), ("tx_buffer", self.tx_buffer)] {
            if v < 4 * self.max_segment || v > 64 << 20 {
                return Err(Error::Settings(format!(
                    "{name} {v} (4 segments to 64 MiB)"
                )));
            }
        }
        if self.max_lanes == 0 {
            return Err(Error::Settings("max_lanes 0".into()));
        }
        if self.ack_delay.is_some_and(|d| d > MAX_ACK_DELAY) {
            return Err(Error::Settings(format!(
                "ack_delay_ms {} (at most {})",
                self.ack_delay.unwrap_or_default().as_millis(),
                MAX_ACK_DELAY.as_millis()
            )));
        }
        Ok(())
    }
}
