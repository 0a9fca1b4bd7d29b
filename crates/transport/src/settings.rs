//! How a node makes its links: [`LinkSettings`], the `[link]` section
//! that relay and client configuration files share, declared once here
//! as serde types with their defaults and checked by
//! [`LinkSettings::check`]. Each transport owns its subsection's type
//! (`[link.tcp]` [`TcpOptions`], `[link.quic]` [`QuicSettings`],
//! `[link.pctcp]` [`PctcpSettings`], `[link.utcp]` [`LaneTcp`],
//! `[link.datagram]` [`DatagramSettings`]); a node
//! takes them as they are, with no mapping of its own.
//!
//! ```toml
//! [link]
//! transport = "auto"              # or a transport's name
//! handshake_timeout_ms = 10000
//!
//! [link.tcp]
//! congestion = "cubic"            # default: the QUIC one's match
//! unsent_limit = 16384            # default: the kernel's
//! pacing = false
//!
//! [link.quic]
//! congestion = "cubic"            # or "newreno", "bbr"
//! keep_alive_ms = 2000
//! idle_timeout_ms = 8000
//! initial_mtu = 1200
//!
//! [link.pctcp]
//! max_lanes = 512
//!
//! [link.utcp]
//! congestion = "cubic"            # or "reno"
//! max_segment = 1200
//! rx_buffer = 262144
//! tx_buffer = 65536
//! ack_delay_ms = 10               # 0: none
//!
//! [link.datagram]
//! end_to_end = "user"             # or "kernel" (TUN devices)
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::datagram::tunnel::DatagramSettings;
use crate::endpoint::EndpointKind;
use crate::pctcp::PctcpSettings;
use crate::quic::QuicSettings;
use crate::registry::Choice;
use crate::tcp::{TcpCongestion, TcpOptions};
use crate::utcp::LaneTcp;
use crate::Error;

/// Default [`LinkSettings::handshake_timeout`]: 10 s.
pub const DEFAULT_LINK_HANDSHAKE_TIMEOUT: Duration = crate::tls::DEFAULT_HANDSHAKE_TIMEOUT;

/// How a node makes its links, whatever their transport.
#[serde_with::serde_as]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkSettings {
    /// Transport of the links this node opens: `"auto"` or the name of a
    /// registered transport (see [`Choice`]).
    #[serde_as(as = "serde_with::DisplayFromStr")]
    pub transport: Choice,
    /// Bound on a link's handshake (the transport's, then
    /// VERSIONS/NETINFO), either direction; positive.
    #[serde(rename = "handshake_timeout_ms")]
    #[serde_as(as = "serde_with::DurationMilliSeconds<u64>")]
    pub handshake_timeout: Duration,
    /// The TCP sockets' options (every TCP-based transport's).
    pub tcp: TcpOptions,
    /// The QUIC transports'.
    pub quic: QuicSettings,
    /// pctcp's.
    pub pctcp: PctcpSettings,
    /// dtls-utcp's user-space TCP, per lane.
    pub utcp: LaneTcp,
    /// The datagram transports' (mUDP-OR's end-to-end TCP).
    pub datagram: DatagramSettings,
}

impl Default for LinkSettings {
    fn default() -> Self {
        LinkSettings {
            transport: Choice::Auto,
            handshake_timeout: DEFAULT_LINK_HANDSHAKE_TIMEOUT,
            tcp: TcpOptions::default(),
            quic: QuicSettings::default(),
            pctcp: PctcpSettings::default(),
            utcp: LaneTcp::default(),
            datagram: DatagramSettings::default(),
        }
    }
}

impl LinkSettings {
    /// Fit the packets of the transports this choice may use to links of
    /// `mtu` bytes, as TCP's segments fit them: QUIC's first packets
    /// ([`crate::quic::initial_mtu_for_link`]) and dtls-utcp's segments
    /// ([`crate::utcp::segment_for_link`]). The sections of transports
    /// the choice does not use keep their defaults (and so stay out of a
    /// written configuration).
    pub fn fit_to_link_mtu(&mut self, mtu: u32) {
        if self.transport.uses(EndpointKind::QUIC) {
            self.quic.initial_mtu = crate::quic::initial_mtu_for_link(mtu);
        }
        if self.transport.uses(EndpointKind::UTCP) {
            self.utcp.max_segment = crate::utcp::segment_for_link(mtu);
        }
    }

    /// Set congestion control as an experiment does for every transport
    /// this choice may use: the kernel's `tcp` for the TCP sockets; `own`
    /// for transports with a user-space algorithm of their own (QUIC's
    /// `cubic`, `newreno`, `bbr`); and for dtls-utcp's lanes, which imitate
    /// the kernel's TCP, `tcp` again ([`crate::utcp::lanes_imitating`]).
    ///
    /// # Errors
    ///
    /// [`Error::Setting`] or [`Error::Config`] naming an algorithm a
    /// transport in use lacks.
    pub fn set_congestion(&mut self, tcp: TcpCongestion, own: &str) -> Result<(), Error> {
        if self.transport.uses(EndpointKind::QUIC) {
            self.quic.congestion = own.parse()?;
        }
        if self.transport.uses(EndpointKind::UTCP) {
            self.utcp.congestion = crate::utcp::lanes_imitating(&tcp)?;
        }
        self.tcp.congestion = Some(tcp);
        Ok(())
    }

    /// The settings of nodes built in code (tests, benchmarks): TLS only
    /// and the kernel's TCP congestion control, where a configuration
    /// file's defaults are `"auto"` and the QUIC algorithm's match.
    pub fn tls_only() -> Self {
        let mut link = LinkSettings {
            transport: Choice::Only(crate::TransportKind::TLS),
            ..LinkSettings::default()
        };
        link.tcp.congestion = Some(TcpCongestion::System);
        link
    }

    /// Check every value's range and how they fit together (the QUIC
    /// keep-alive below its idle timeout, for example).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the setting.
    pub fn check(&self) -> Result<(), Error> {
        if self.handshake_timeout.is_zero() {
            return Err(Error::Config(
                "link.handshake_timeout_ms must be positive".into(),
            ));
        }
        if self.tcp.unsent_limit == Some(0) {
            return Err(Error::Config(
                "link.tcp.unsent_limit must be at least 1 (leave it out for the kernel's)".into(),
            ));
        }
        self.quic_settings()
            .validate()
            .map_err(|e| Error::Config(format!("link.quic: {e}")))?;
        if self.pctcp.max_lanes == 0 {
            return Err(Error::Config(
                "link.pctcp.max_lanes must be at least 1".into(),
            ));
        }
        self.utcp
            .check()
            .map_err(|e| Error::Config(format!("link.utcp: {e}")))
    }

    /// The kernel congestion control of the node's TCP sockets: the one
    /// set, or the match of the QUIC one ([`Congestion::tcp_match`]), so
    /// that TCP and QUIC transports compare on the same algorithm.
    ///
    /// [`Congestion::tcp_match`]: crate::quic::Congestion::tcp_match
    pub fn tcp_congestion(&self) -> TcpCongestion {
        self.tcp
            .congestion
            .clone()
            .unwrap_or_else(|| TcpCongestion::Named(self.quic.congestion.tcp_match().into()))
    }

    /// The QUIC settings with the link handshake timeout in force.
    pub fn quic_settings(&self) -> QuicSettings {
        QuicSettings {
            handshake_timeout: self.handshake_timeout,
            ..self.quic
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TransportKind;

    #[test]
    fn defaults_round_trip_and_check() {
        let d = LinkSettings::default();
        d.check().expect("defaults are valid");
        let text = toml::to_string(&d).expect("serialise");
        let back: LinkSettings = toml::from_str(&text).expect("parse");
        assert_eq!(back, d);
        let empty: LinkSettings = toml::from_str("").expect("empty section");
        assert_eq!(empty, d);
        assert_eq!(d.tcp_congestion(), TcpCongestion::Named("cubic".into()));
    }

    #[test]
    fn every_section_is_read() {
        let text = r#"
transport = "pctcp"
handshake_timeout_ms = 5000
[tcp]
congestion = "system"
unsent_limit = 16384
pacing = true
[quic]
congestion = "newreno"
keep_alive_ms = 1000
idle_timeout_ms = 4000
initial_mtu = 1472
[pctcp]
max_lanes = 3
[utcp]
congestion = "reno"
ack_delay_ms = 0
[datagram]
end_to_end = "kernel"
"#;
        let s: LinkSettings = toml::from_str(text).expect("parse");
        assert_eq!(s.transport, Choice::Only(TransportKind::PCTCP));
        assert_eq!(s.handshake_timeout, Duration::from_secs(5));
        assert_eq!(s.tcp_congestion(), TcpCongestion::System);
        assert_eq!(s.tcp.unsent_limit, Some(16384));
        assert!(s.tcp.pacing);
        assert_eq!(s.quic.congestion, crate::quic::Congestion::NewReno);
        assert_eq!(s.quic.keep_alive, Duration::from_secs(1));
        assert_eq!(s.quic_settings().handshake_timeout, Duration::from_secs(5));
        assert_eq!(s.quic.initial_mtu, 1472);
        assert_eq!(s.pctcp.max_lanes, 3);
        assert_eq!(s.utcp.congestion, crate::utcp::LaneCongestion::Reno);
        assert_eq!(s.utcp.ack_delay, None);
        assert_eq!(
            s.datagram.end_to_end,
            crate::datagram::tunnel::EndToEnd::Kernel
        );
        s.check().expect("valid");
        let back: LinkSettings = toml::from_str(&toml::to_string(&s).expect("ser")).expect("de");
        assert_eq!(back, s);
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        for (text, needle) in [
            ("bogus = 1", "unknown field `bogus`"),
            ("transport = \"carrier-pigeon\"", "carrier-pigeon"),
            ("[quic]\nmode = 1", "unknown field `mode`"),
            ("[tcp]\ncongestion = \"Cubic!\"", "Cubic!"),
            ("[utcp]\ncongestion = \"none\"", "none"),
            ("[datagram]\nend_to_end = \"both\"", "both"),
        ] {
            let err = toml::from_str::<LinkSettings>(text).expect_err(text);
            assert!(err.to_string().contains(needle), "{text}: {err}");
        }
        for (text, needle) in [
            ("handshake_timeout_ms = 0", "handshake_timeout_ms"),
            ("[tcp]\nunsent_limit = 0", "unsent_limit"),
            ("[quic]\nkeep_alive_ms = 9000", "keep-alive"),
            ("[quic]\ninitial_mtu = 1000", "MTU"),
            ("[pctcp]\nmax_lanes = 0", "max_lanes"),
            ("[utcp]\nmax_segment = 50", "max_segment"),
            ("[utcp]\nack_delay_ms = 5000", "ack_delay_ms"),
        ] {
            let s: LinkSettings = toml::from_str(text).expect(text);
            let err = s.check().expect_err(text);
            assert!(err.to_string().contains(needle), "{text}: {err}");
        }
    }
}
