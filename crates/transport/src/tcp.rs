//! The kernel's TCP congestion control, chosen per socket.
//!
//! A comparison of TLS over TCP with QUIC measures the two congestion
//! controllers as much as the transports: Linux may default to BBR while
//! quinn runs Cubic. Every TCP socket a node opens or accepts therefore
//! gets the algorithm its configuration names ([`TcpCongestion`]), with
//! `setsockopt(TCP_CONGESTION)`; the default matches the QUIC congestion
//! control (cubic with cubic, reno with newreno, bbr with bbr).
//!
//! Pacing is the other half of what a congestion controller puts on the
//! wire: quinn paces every connection (at 1.25 congestion windows per
//! RTT), while Linux paces a Cubic or Reno socket only when asked
//! ([`enable_pacing`]; BBR paces itself).

use std::fmt;
use std::io;
use std::os::fd::AsRawFd;

use socket2::SockRef;

use crate::SettingError;

/// The kernel's list of algorithms that can be set.
const AVAILABLE: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";
/// Longest algorithm name the kernel takes (`TCP_CA_NAME_MAX` less the NUL).
const MAX_NAME_LEN: usize = 15;

/// Which congestion control a node's TCP sockets use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TcpCongestion {
    /// Leave the kernel's default (`net.ipv4.tcp_congestion_control`).
    #[default]
    System,
    /// Set this algorithm (a kernel name: `cubic`, `reno`, `bbr`, ...).
    Named(String),
}

impl TcpCongestion {
    /// Parse a setting: `system`, or a kernel algorithm name (lower-case
    /// letters, digits and `_`, at most 15). Whether the kernel has it is
    /// checked by [`check_available`](Self::check_available).
    ///
    /// # Errors
    ///
    /// The bad value, and what is expected.
    pub fn parse(s: &str) -> Result<Self, SettingError> {
        if s == "system" {
            return Ok(TcpCongestion::System);
        }
        let valid = !s.is_empty()
            && s.len() <= MAX_NAME_LEN
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if valid {
            Ok(TcpCongestion::Named(s.to_string()))
        } else {
            Err(SettingError::UnknownName {
                setting: "TCP congestion control",
                value: s.to_string(),
                expected:
                    "\"system\" or a kernel algorithm name such as \"cubic\", \"reno\", \"bbr\""
                        .into(),
            })
        }
    }

    /// The algorithm's name, if one is set.
    pub fn name(&self) -> Option<&str> {
        match self {
            TcpCongestion::System => None,
            TcpCongestion::Named(n) => Some(n),
        }
    }

    /// Check that the kernel can set this algorithm, by setting it on a
    /// throwaway socket (which also loads its module when allowed).
    ///
    /// # Errors
    ///
    /// The algorithm, what the kernel offers, and why it refused (or why
    /// no socket could be opened to ask).
    pub fn check_available(&self) -> Result<(), SettingError> {
        let Some(name) = self.name() else {
            return Ok(());
        };
        let probe = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .map_err(|source| SettingError::CannotCheck {
                name: name.to_string(),
                source,
            })?;
        probe
            .set_tcp_congestion(name.as_bytes())
            .map_err(|source| SettingError::Unavailable {
                name: name.to_string(),
                offered: available().join(" "),
                source,
            })
    }

    /// Apply to `socket` (nothing for [`System`](Self::System)).
    ///
    /// # Errors
    ///
    /// The kernel's refusal.
    pub fn apply<'s>(&self, socket: impl Into<SockRef<'s>>) -> io::Result<()> {
        match self.name() {
            None => Ok(()),
            Some(name) => socket.into().set_tcp_congestion(name.as_bytes()),
        }
    }
}

impl fmt::Display for TcpCongestion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name().unwrap_or("system"))
    }
}

impl std::str::FromStr for TcpCongestion {
    type Err = SettingError;

    /// As [`TcpCongestion::parse`].
    fn from_str(s: &str) -> Result<Self, SettingError> {
        Self::parse(s)
    }
}

/// Options of every TCP socket of a node's links, and of an exit's
/// connections to its targets: the `[link.tcp]` section of relay and
/// client configuration files.
#[serde_with::serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TcpOptions {
    /// The kernel's congestion control (`"system"`: the kernel's default);
    /// absent: the match of the QUIC congestion control
    /// ([`LinkSettings::tcp_congestion`](crate::LinkSettings::tcp_congestion)).
    #[serde_as(as = "Option<serde_with::DisplayFromStr>")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub congestion: Option<TcpCongestion>,
    /// KIST-like write limit: most bytes each TCP socket of a channel holds
    /// written and not yet sent (`TCP_NOTSENT_LOWAT`, at least 1); absent:
    /// the kernel's `net.ipv4.tcp_notsent_lowat` (unlimited by default).
    /// 16384 is what `docs/results/seed003.md` found to behave like C
    /// tor's KIST.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsent_limit: Option<u32>,
    /// Make Linux pace every TCP socket of a channel
    /// ([`enable_pacing`]), as quinn paces every QUIC connection; default
    /// false: Linux paces a Cubic or Reno socket only when asked, BBR
    /// always.
    pub pacing: bool,
}

/// The congestion control `socket` uses now (`getsockopt(TCP_CONGESTION)`).
///
/// # Errors
///
/// The kernel's.
pub fn congestion_of<'s>(socket: impl Into<SockRef<'s>>) -> io::Result<String> {
    let raw = socket.into().tcp_congestion()?;
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    Ok(String::from_utf8_lossy(&raw[..end]).into_owned())
}

/// The algorithms this kernel offers (empty if it does not say).
pub fn available() -> Vec<String> {
    std::fs::read_to_string(AVAILABLE)
        .map(|s| s.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// `SO_MAX_PACING_RATE` (asm-generic/socket.h). Written by hand: neither
/// socket2 nor libc offers it for every architecture.
#[cfg(not(target_arch = "sparc64"))]
const SO_MAX_PACING_RATE: libc::c_int = 47;
#[cfg(target_arch = "sparc64")]
const SO_MAX_PACING_RATE: libc::c_int = 0x31;

/// The `SO_MAX_PACING_RATE` that turns pacing on without capping it: any
/// value but "unlimited" (`u64::MAX`) makes Linux pace the socket itself
/// (`SK_PACING_NEEDED`, since 4.13) at the rate TCP computes from its
/// window and RTT (`net.ipv4.tcp_pacing_ss_ratio`, 200% in slow start;
/// `tcp_pacing_ca_ratio`, 120% after), with no `fq` qdisc needed.
pub const PACING_UNCAPPED: u64 = u64::MAX - 1;

/// Make Linux pace `socket`'s sends ([`PACING_UNCAPPED`]). Set it before
/// the connection carries data.
///
/// # Errors
///
/// The kernel's refusal.
pub fn enable_pacing(socket: &impl AsRawFd) -> io::Result<()> {
    let rate: u64 = PACING_UNCAPPED;
    // SAFETY: a valid descriptor and an 8-byte value with its length.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_MAX_PACING_RATE,
            std::ptr::from_ref(&rate).cast(),
            std::mem::size_of::<u64>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `socket`'s `SO_MAX_PACING_RATE`, bytes per second (`u64::MAX`: not
/// capped and not asked to pace, the default).
///
/// # Errors
///
/// The kernel's.
pub fn max_pacing_rate(socket: &impl AsRawFd) -> io::Result<u64> {
    let mut rate: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a valid descriptor, an 8-byte buffer and its length.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_MAX_PACING_RATE,
            std::ptr::from_mut(&mut rate).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_is_asked_for_and_read_back() {
        let s = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        assert_eq!(max_pacing_rate(&s).expect("get"), u64::MAX, "default");
        enable_pacing(&s).expect("set");
        assert_eq!(max_pacing_rate(&s).expect("get"), PACING_UNCAPPED);
    }

    #[test]
    fn settings_parse() {
        assert_eq!(
            TcpCongestion::parse("system").ok(),
            Some(TcpCongestion::System)
        );
        assert_eq!(
            TcpCongestion::parse("cubic").ok(),
            Some(TcpCongestion::Named("cubic".into()))
        );
        for bad in ["", "Cubic", "cu bic", "a_name_far_too_long", "bbr\0"] {
            assert!(TcpCongestion::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reno_is_set_and_read_back() {
        // Reno is built into every Linux kernel.
        let reno = TcpCongestion::parse("reno").expect("parse");
        reno.check_available().expect("reno available");
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        reno.apply(&s).expect("set");
        assert_eq!(congestion_of(&s).expect("get"), "reno");
        // Accepted sockets inherit the listener's.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        reno.apply(&listener).expect("set on the listener");
        let addr = listener.local_addr().expect("addr");
        let _client = std::net::TcpStream::connect(addr).expect("connect");
        let (accepted, _) = listener.accept().expect("accept");
        assert_eq!(congestion_of(&accepted).expect("get"), "reno");
        let missing = TcpCongestion::parse("no_such_cc").expect("parse");
        let e = missing
            .check_available()
            .expect_err("not a kernel algorithm");
        assert!(
            matches!(&e, SettingError::Unavailable { name, offered, .. }
                if name == "no_such_cc" && offered.contains("reno")),
            "{e}"
        );
    }
}
