//! A [`Mux`] as what a DTLS session carries: dtls-utcp's sessions carry
//! TORTP segments, one per record, and start their lanes once the peer is
//! authenticated.

use std::time::Instant;

use onionlab_dtls::{Carrier, Role};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use crate::{Error, LaneBudget, LaneEvent, Mux, Settings};

/// Default [`LaneConfig::anonymous_max_lanes`].
pub const DEFAULT_ANONYMOUS_MAX_LANES: usize = 64;

/// What a dtls-utcp relay's `AUTH` signature covers first.
pub const AUTH_LABEL: &[u8] = b"onionlab dtls-utcp auth v1\0";

/// What a dtls-utcp endpoint's cookie MAC covers first.
pub const COOKIE_LABEL: &[u8] = b"onionlab dtls-utcp cookie v1\0";

/// How a session's lanes run.
#[derive(Clone, Debug)]
pub struct LaneConfig {
    /// The lanes' TCP settings. Their `max_segment` must fit one record of
    /// one datagram: at most the datagram less
    /// [`onionlab_dtls::RECORD_OVERHEAD`].
    pub utcp: Settings,
    /// The node's budget of lanes across its sessions (`None`: only the
    /// per-session [`Settings::max_lanes`]).
    pub lane_budget: Option<LaneBudget>,
    /// Most lanes of a session with an anonymous peer (a client), below
    /// `utcp.max_lanes`: a client needs a lane per circuit through this
    /// guard, a handful, and each lane holds its buffers.
    pub anonymous_max_lanes: usize,
}

impl LaneConfig {
    /// Lanes with these TCP settings, no node budget, and the default
    /// limit for clients.
    pub fn new(utcp: Settings) -> LaneConfig {
        LaneConfig {
            utcp,
            lane_budget: None,
            anonymous_max_lanes: DEFAULT_ANONYMOUS_MAX_LANES,
        }
    }
}

impl Carrier for Mux {
    type Config = LaneConfig;
    type Event = LaneEvent;
    type Error = Error;
    const AUTH_LABEL: &'static [u8] = AUTH_LABEL;
    const COOKIE_LABEL: &'static [u8] = COOKIE_LABEL;

    fn check(config: &LaneConfig, max_message: usize) -> Result<(), Error> {
        config.utcp.check()?;
        if config.utcp.max_segment > max_message {
            return Err(Error::Settings(format!(
                "max_segment {} does not fit one record of a datagram ({max_message} bytes at most)",
                config.utcp.max_segment
            )));
        }
        Ok(())
    }

    fn start(
        config: &LaneConfig,
        role: Role,
        peer: Option<Ed25519Identity>,
        seed: u64,
        now: Instant,
    ) -> Result<Mux, Error> {
        let mut utcp = config.utcp.clone();
        if peer.is_none() {
            utcp.max_lanes = utcp.max_lanes.min(config.anonymous_max_lanes.max(1));
        }
        let mut mux = Mux::new(utcp, role, seed, now)?;
        if let Some(b) = &config.lane_budget {
            mux.set_budget(b.clone());
        }
        Ok(mux)
    }

    fn handle_message(&mut self, message: &[u8], now: Instant) -> Result<(), Error> {
        self.handle_segment(message, now)
    }

    fn poll_message(&mut self) -> Option<Vec<u8>> {
        self.poll_transmit()
    }

    fn poll_event(&mut self) -> Option<LaneEvent> {
        Mux::poll_event(self)
    }

    fn handle_timeout(&mut self, now: Instant) {
        Mux::handle_timeout(self, now);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        Mux::poll_timeout(self)
    }
}
