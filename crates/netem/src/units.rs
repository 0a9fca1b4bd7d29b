//! Human-friendly values used in topology files and on the command line:
//! rates (`"10Mbit"`), durations (`"20ms"`), queue limits (`"100 packets"`,
//! `"64KiB"`, `"50ms"`) and probabilities (`0.01` or `"1%"`).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

fn value_err(what: &'static str, value: &str, reason: impl Into<String>) -> Error {
    Error::Value {
        what,
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Splits `"12.5 ms"` into `(12.5, "ms")`.
fn split_number(s: &str) -> Option<(f64, String)> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    let num: String = s[..end].chars().filter(|&c| c != '_').collect();
    let v: f64 = num.parse().ok()?;
    Some((v, s[end..].trim().to_ascii_lowercase()))
}

/// Parses a duration such as `"20ms"`, `"500us"`, `"1.5s"`, `"0"`.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let (v, unit) = split_number(s).ok_or_else(|| value_err("duration", s, "expected a number"))?;
    let scale = match unit.as_str() {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" | "sec" => 1.0,
        "" if v == 0.0 => 0.0,
        "" => return Err(value_err("duration", s, "missing unit (ns, us, ms, s)")),
        _ => return Err(value_err("duration", s, "unknown unit (ns, us, ms, s)")),
    };
    let secs = v * scale;
    if !secs.is_finite() || !(0.0..=3600.0).contains(&secs) {
        return Err(value_err("duration", s, "out of range (0 to 3600 s)"));
    }
    Ok(Duration::from_nanos((secs * 1e9).round() as u64))
}

/// Formats a duration the way [`parse_duration`] reads it.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        "0ms".into()
    } else if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else if ns.is_multiple_of(1_000) {
        format!("{}us", ns / 1_000)
    } else {
        format!("{ns}ns")
    }
}

/// A link rate in bits per second; `None` means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rate(pub Option<u64>);

impl Rate {
    /// No rate limit.
    pub const UNLIMITED: Rate = Rate(None);

    /// Parses `"10Mbit"`, `"1.5 Gbit"`, `"800kbit"`, `"100bit"`, `"2MB"` (bytes/s), `"unlimited"`.
    pub fn parse(s: &str) -> Result<Rate> {
        let t = s.trim().to_ascii_lowercase();
        if t == "unlimited" || t == "none" || t == "inf" {
            return Ok(Rate(None));
        }
        let (v, unit) =
            split_number(&t).ok_or_else(|| value_err("rate", s, "expected a number"))?;
        let unit = unit
            .trim_end_matches("/s")
            .trim_end_matches("ps")
            .to_string();
        let scale: f64 = match unit.as_str() {
            "bit" | "b" => 1.0,
            "kbit" | "kb" => 1e3,
            "mbit" | "mb" => 1e6,
            "gbit" | "gb" => 1e9,
            "byte" => 8.0,
            "kbyte" | "kib" => 8.0 * 1e3,
            "mbyte" | "mib" => 8.0 * 1e6,
            "gbyte" | "gib" => 8.0 * 1e9,
            _ => {
                return Err(value_err(
                    "rate",
                    s,
                    "unknown unit (bit, kbit, Mbit, Gbit, kbyte, Mbyte, or unlimited)",
                ))
            }
        };
        let bps = v * scale;
        if !bps.is_finite() || !(1000.0..=1e12).contains(&bps) {
            return Err(value_err("rate", s, "out of range (1 kbit/s to 1 Tbit/s)"));
        }
        Ok(Rate(Some(bps.round() as u64)))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => write!(f, "unlimited"),
            Some(b) if b % 1_000_000_000 == 0 => write!(f, "{}Gbit", b / 1_000_000_000),
            Some(b) if b % 1_000_000 == 0 => write!(f, "{}Mbit", b / 1_000_000),
            Some(b) if b % 1_000 == 0 => write!(f, "{}kbit", b / 1_000),
            Some(b) => write!(f, "{b}bit"),
        }
    }
}

/// Limit of a drop-tail queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueLimit {
    /// At most this many packets queued (including the one being sent).
    Packets(u32),
    /// At most this many bytes queued (including the one being sent).
    Bytes(u64),
    /// A packet is dropped if it would wait longer than this before being sent.
    Delay(Duration),
}

impl Default for QueueLimit {
    fn default() -> Self {
        QueueLimit::Packets(1000)
    }
}

impl QueueLimit {
    /// Parses `"100 packets"`, `"100p"`, `"64KiB"`, `"150000 bytes"`, `"50ms"`.
    pub fn parse(s: &str) -> Result<QueueLimit> {
        let (v, unit) =
            split_number(s).ok_or_else(|| value_err("queue", s, "expected a number"))?;
        let int = |scale: f64| -> Result<u64> {
            let x = v * scale;
            if x.is_finite() && (0.0..=1e12).contains(&x) {
                Ok(x.round() as u64)
            } else {
                Err(value_err("queue", s, "out of range"))
            }
        };
        Ok(match unit.as_str() {
            "p" | "pkt" | "pkts" | "packet" | "packets" => QueueLimit::Packets(
                u32::try_from(int(1.0)?).map_err(|_| value_err("queue", s, "too many packets"))?,
            ),
            "b" | "byte" | "bytes" => QueueLimit::Bytes(int(1.0)?),
            "kb" => QueueLimit::Bytes(int(1e3)?),
            "kib" => QueueLimit::Bytes(int(1024.0)?),
            "mb" => QueueLimit::Bytes(int(1e6)?),
            "mib" => QueueLimit::Bytes(int(1024.0 * 1024.0)?),
            "ns" | "us" | "µs" | "ms" | "s" => QueueLimit::Delay(parse_duration(s)?),
            _ => {
                return Err(value_err(
                    "queue",
                    s,
                    "unknown unit (packets, bytes, KiB, MiB, KB, MB, or a duration like 50ms)",
                ))
            }
        })
    }
}

impl fmt::Display for QueueLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueLimit::Packets(n) => write!(f, "{n} packets"),
            QueueLimit::Bytes(n) => write!(f, "{n} bytes"),
            QueueLimit::Delay(d) => write!(f, "{}", format_duration(*d)),
        }
    }
}

/// Parses a probability given as a number in [0, 1] or a percentage string.
pub fn parse_probability(s: &str) -> Result<f64> {
    let t = s.trim();
    let v = if let Some(p) = t.strip_suffix('%') {
        p.trim()
            .parse::<f64>()
            .map_err(|_| value_err("probability", s, "expected a number"))?
            / 100.0
    } else {
        t.parse::<f64>()
            .map_err(|_| value_err("probability", s, "expected a number or a percentage"))?
    };
    check_probability(v).map_err(|reason| value_err("probability", s, reason))
}

fn check_probability(v: f64) -> std::result::Result<f64, String> {
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err("must lie between 0 and 1 (or 0% and 100%)".into())
    }
}

/// Serde adapters so the types above can be written as strings in TOML/JSON.
pub mod serde_impls {
    use super::*;

    /// Serde adapter for [`Duration`] written as `"20ms"`.
    pub mod duration {
        use super::*;

        /// Serializes as a string.
        pub fn serialize<S: Serializer>(
            d: &Duration,
            s: S,
        ) -> std::result::Result<S::Ok, S::Error> {
            s.serialize_str(&format_duration(*d))
        }

        /// Deserializes from a string (or the integer 0).
        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> std::result::Result<Duration, D::Error> {
            d.deserialize_any(StrOrNum {
                what: "a duration such as \"20ms\"",
                parse: |s| parse_duration(s).map_err(|e| e.to_string()),
                num: |v| {
                    if v == 0.0 {
                        Ok(Duration::ZERO)
                    } else {
                        Err("durations need a unit, e.g. \"20ms\"".into())
                    }
                },
            })
        }
    }

    /// Serde adapter for an optional duration.
    pub mod opt_duration {
        use super::*;

        /// Serializes as a string or nothing.
        pub fn serialize<S: Serializer>(
            d: &Option<Duration>,
            s: S,
        ) -> std::result::Result<S::Ok, S::Error> {
            match d {
                Some(d) => s.serialize_some(&format_duration(*d)),
                None => s.serialize_none(),
            }
        }

        /// Deserializes from a string.
        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> std::result::Result<Option<Duration>, D::Error> {
            super::duration::deserialize(d).map(Some)
        }
    }

    /// Serde adapter for an optional probability (number or `"1%"`).
    pub mod opt_probability {
        use super::*;

        /// Serializes as a number.
        pub fn serialize<S: Serializer>(
            p: &Option<f64>,
            s: S,
        ) -> std::result::Result<S::Ok, S::Error> {
            match p {
                Some(p) => s.serialize_some(p),
                None => s.serialize_none(),
            }
        }

        /// Deserializes from a number or a percentage string.
        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> std::result::Result<Option<f64>, D::Error> {
            d.deserialize_any(StrOrNum {
                what: "a probability such as 0.01 or \"1%\"",
                parse: |s| parse_probability(s).map_err(|e| e.to_string()),
                num: check_probability,
            })
            .map(Some)
        }
    }

    pub(crate) struct StrOrNum<T> {
        pub(crate) what: &'static str,
        pub(crate) parse: fn(&str) -> std::result::Result<T, String>,
        pub(crate) num: fn(f64) -> std::result::Result<T, String>,
    }

    impl<'de, T> Visitor<'de> for StrOrNum<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.what)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<T, E> {
            (self.parse)(v).map_err(E::custom)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<T, E> {
            (self.num)(v as f64).map_err(E::custom)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<T, E> {
            (self.num)(v as f64).map_err(E::custom)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<T, E> {
            (self.num)(v).map_err(E::custom)
        }
    }
}

impl Serialize for Rate {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(serde_impls::StrOrNum {
            what: "a rate such as \"10Mbit\" or \"unlimited\"",
            parse: |s| Rate::parse(s).map_err(|e| e.to_string()),
            num: |_| Err("rates need a unit, e.g. \"10Mbit\"".into()),
        })
    }
}

impl Serialize for QueueLimit {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for QueueLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(serde_impls::StrOrNum {
            what: "a queue limit such as \"100 packets\", \"64KiB\" or \"50ms\"",
            parse: |s| QueueLimit::parse(s).map_err(|e| e.to_string()),
            num: |_| Err("queue limits need a unit, e.g. \"100 packets\"".into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_values() {
        assert_eq!(parse_duration("20ms").unwrap(), Duration::from_millis(20));
        assert_eq!(
            parse_duration("1.5 ms").unwrap(),
            Duration::from_micros(1500)
        );
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("20").is_err());
        assert!(parse_duration("20 parsecs").is_err());
        assert_eq!(Rate::parse("10Mbit").unwrap(), Rate(Some(10_000_000)));
        assert_eq!(Rate::parse("1.5 Gbit").unwrap(), Rate(Some(1_500_000_000)));
        assert_eq!(Rate::parse("unlimited").unwrap(), Rate(None));
        assert!(Rate::parse("10").is_err());
        assert_eq!(
            QueueLimit::parse("100 packets").unwrap(),
            QueueLimit::Packets(100)
        );
        assert_eq!(
            QueueLimit::parse("64KiB").unwrap(),
            QueueLimit::Bytes(65536)
        );
        assert_eq!(
            QueueLimit::parse("50ms").unwrap(),
            QueueLimit::Delay(Duration::from_millis(50))
        );
        assert!((parse_probability("1%").unwrap() - 0.01).abs() < 1e-12);
        assert!((parse_probability("0.05").unwrap() - 0.05).abs() < 1e-12);
        assert!(parse_probability("120%").is_err());
        for r in ["10Mbit", "1Gbit", "unlimited", "1500kbit"] {
            assert_eq!(
                Rate::parse(&Rate::parse(r).unwrap().to_string()).unwrap(),
                Rate::parse(r).unwrap()
            );
        }
    }
}
