//! Network-wide parameters: the `[params]` table of the network document,
//! onionlab's counterpart of a consensus's parameters.
//!
//! ```text
//! [params]
//! circuit_cc = "vegas"     # or "fixed" (the default when absent)
//! cc_sendme_inc = 31       # any of proposal 324's cc_* parameters
//! cfx_enabled = 1          # exits link multi-path sets (default 0)
//! cfx_scheduler = "round-robin" # leg scheduler of both ends (default "lowrtt")
//! ```
//!
//! `circuit_cc` chooses the circuit-level flow control of every circuit of
//! the network ([`CircuitCc`]): tor-spec's fixed windows, or proposal 324's
//! Vegas with XON/XOFF. onionlab speaks ntor v1, which cannot carry the
//! congestion-control extension that C tor negotiates per circuit in
//! ntor v3, so both ends of a circuit read the choice here. The `cc_*`
//! keys override C tor's defaults by their consensus names (see
//! [`CircuitCc::set_param`]) and are checked against the proposal's ranges;
//! they are only allowed with `circuit_cc = "vegas"`.
//!
//! `cfx_enabled` (C tor's consensus parameter of that name) says whether
//! the network's exits link circuits into multi-path sets (proposal 329,
//! docs/conflux.md). Clients ask for sets only when it is 1: every relay
//! of an onionlab network runs the same software, so the network, not each
//! relay, announces it.
//!
//! `cfx_scheduler` (onionlab's own) names the leg scheduler both ends of
//! every set use for the cells they send ([`LegSchedulerKind::parse`]). In
//! C tor the exit derives its scheduler from the UX the client asks for
//! in CONFLUX_LINK (lowRTT for high throughput, the default); a lab
//! compares schedulers, so the network chooses one for everybody and a
//! client may override its own side (`leg_scheduler` in its
//! configuration).

use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_circuit::flow::CircuitCc;
use onionlab_circuit::ParamError;
use std::collections::BTreeMap;

/// Why a `[params]` table is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ParamsError {
    /// `circuit_cc` names no circuit-level flow control.
    #[error("circuit_cc must be \"fixed\" or \"vegas\", not {0:?}")]
    UnknownCircuitCc(String),
    /// `cfx_scheduler` names no leg scheduler.
    #[error("cfx_scheduler {name:?} is not a leg scheduler ({known})")]
    UnknownScheduler {
        /// The name given.
        name: String,
        /// The schedulers there are.
        known: String,
    },
    /// A key's value has the wrong type or form.
    #[error("{key} must be {expected}, not {got}")]
    WrongValue {
        /// The key.
        key: String,
        /// What it must be.
        expected: &'static str,
        /// The value given, as TOML.
        got: String,
    },
    /// A `cc_*` key is unknown, not allowed, or out of its range.
    #[error(transparent)]
    Circuit(#[from] ParamError),
}

/// Network-wide parameters of a document.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetworkParams {
    /// Circuit-level flow control of every circuit (default fixed windows).
    pub circuit_cc: CircuitCc,
    /// Exits link multi-path sets (`cfx_enabled = 1`; default off).
    pub cfx_enabled: bool,
    /// The leg scheduler of both ends of every set (`cfx_scheduler`;
    /// default lowRTT, C tor's for high throughput).
    pub cfx_scheduler: LegSchedulerKind,
}

impl NetworkParams {
    /// The defaults with `circuit_cc` set by name (`"fixed"` or `"vegas"`,
    /// Vegas with C tor's parameters).
    ///
    /// # Errors
    ///
    /// Another name.
    pub fn with_circuit_cc(name: &str) -> Result<Self, ParamsError> {
        let circuit_cc = match name {
            "fixed" => CircuitCc::Fixed,
            "vegas" => CircuitCc::vegas(),
            other => return Err(ParamsError::UnknownCircuitCc(other.to_string())),
        };
        Ok(NetworkParams {
            circuit_cc,
            ..NetworkParams::default()
        })
    }

    /// The choices in one line, for messages: `circuit_cc=vegas
    /// cfx_enabled=1 cfx_scheduler=lowrtt` (not the `cc_*` overrides).
    pub fn summary(&self) -> String {
        format!(
            "circuit_cc={} cfx_enabled={} cfx_scheduler={}",
            self.circuit_cc.name(),
            u8::from(self.cfx_enabled),
            self.cfx_scheduler
        )
    }

    /// Parameters from the raw `[params]` table.
    ///
    /// # Errors
    ///
    /// The key at fault: an unknown key or `circuit_cc` value, a value of
    /// the wrong type or out of range.
    pub(crate) fn from_table(table: &BTreeMap<String, toml::Value>) -> Result<Self, ParamsError> {
        let wrong = |key: &str, expected, got: &toml::Value| ParamsError::WrongValue {
            key: key.to_string(),
            expected,
            got: got.to_string(),
        };
        let mut cc = match table.get("circuit_cc") {
            None => CircuitCc::Fixed,
            Some(toml::Value::String(s)) => Self::with_circuit_cc(s)?.circuit_cc,
            Some(other) => return Err(wrong("circuit_cc", "a string", other)),
        };
        let cfx_enabled = match table.get("cfx_enabled") {
            None => false,
            Some(toml::Value::Integer(0)) => false,
            Some(toml::Value::Integer(1)) => true,
            Some(other) => return Err(wrong("cfx_enabled", "0 or 1", other)),
        };
        let cfx_scheduler = match table.get("cfx_scheduler") {
            None => LegSchedulerKind::default(),
            Some(toml::Value::String(s)) => {
                LegSchedulerKind::parse(s).ok_or_else(|| ParamsError::UnknownScheduler {
                    name: s.clone(),
                    known: LegSchedulerKind::names(),
                })?
            }
            Some(other) => return Err(wrong("cfx_scheduler", "a string", other)),
        };
        let cc_keys = table
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "circuit_cc" | "cfx_enabled" | "cfx_scheduler"));
        for (key, value) in cc_keys {
            let v = value
                .as_integer()
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| wrong(key, "an integer in 0..=4294967295", value))?;
            cc.set_param(key, v)?;
        }
        cc.validate()?;
        Ok(NetworkParams {
            circuit_cc: cc,
            cfx_enabled,
            cfx_scheduler,
        })
    }

    /// The `[params]` table as TOML lines (empty for the defaults): the
    /// choice and every parameter that differs from C tor's default.
    pub(crate) fn to_toml(self) -> String {
        if self == NetworkParams::default() {
            return String::new();
        }
        let mut out = format!("\n[params]\ncircuit_cc = \"{}\"\n", self.circuit_cc.name());
        let defaults = CircuitCc::vegas().params();
        for ((name, value), (_, default)) in self.circuit_cc.params().into_iter().zip(defaults) {
            if value != default {
                out.push_str(&format!("{name} = {value}\n"));
            }
        }
        if self.cfx_enabled {
            out.push_str("cfx_enabled = 1\n");
        }
        if self.cfx_scheduler != LegSchedulerKind::default() {
            out.push_str(&format!("cfx_scheduler = \"{}\"\n", self.cfx_scheduler));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> BTreeMap<String, toml::Value> {
        toml::from_str(text).expect("toml")
    }

    #[test]
    fn absent_means_fixed_and_vegas_takes_overrides() {
        assert_eq!(
            NetworkParams::from_table(&table("")),
            Ok(NetworkParams::default())
        );
        let p = NetworkParams::from_table(&table("circuit_cc = \"vegas\"\ncc_sendme_inc = 20"))
            .expect("valid");
        let CircuitCc::Vegas { vegas, .. } = p.circuit_cc else {
            panic!("vegas expected")
        };
        assert_eq!(vegas.sendme_inc, 20);
        assert_eq!(
            p.to_toml(),
            "\n[params]\ncircuit_cc = \"vegas\"\ncc_sendme_inc = 20\n"
        );
    }

    /// `p` written as the document writes it reads back the same.
    fn assert_round_trip(p: NetworkParams) {
        let written = table(&p.to_toml());
        let inner: BTreeMap<String, toml::Value> = written["params"]
            .as_table()
            .expect("a [params] table")
            .clone()
            .into_iter()
            .collect();
        assert_eq!(NetworkParams::from_table(&inner), Ok(p));
    }

    #[test]
    fn cfx_enabled_round_trips_and_only_takes_0_or_1() {
        let p = NetworkParams::from_table(&table("cfx_enabled = 1")).expect("valid");
        assert!(p.cfx_enabled);
        assert_eq!(p.circuit_cc, CircuitCc::Fixed);
        assert_eq!(
            p.to_toml(),
            "\n[params]\ncircuit_cc = \"fixed\"\ncfx_enabled = 1\n"
        );
        assert_round_trip(p);
        let off = NetworkParams::from_table(&table("cfx_enabled = 0")).expect("valid");
        assert_eq!(off, NetworkParams::default());
        for bad in [
            "cfx_enabled = 2",
            "cfx_enabled = true",
            "cfx_enabled = \"1\"",
        ] {
            let e = NetworkParams::from_table(&table(bad))
                .expect_err(bad)
                .to_string();
            assert!(e.contains("cfx_enabled"), "{bad}: {e}");
        }
    }

    #[test]
    fn cfx_scheduler_round_trips_and_names_the_choices() {
        assert_eq!(
            NetworkParams::default().cfx_scheduler,
            LegSchedulerKind::LowRtt
        );
        let p =
            NetworkParams::from_table(&table("cfx_enabled = 1\ncfx_scheduler = \"round-robin:4\""))
                .expect("valid");
        assert_eq!(
            p.cfx_scheduler,
            LegSchedulerKind::RoundRobin { cells_per_leg: 4 }
        );
        assert_round_trip(p);
        for bad in ["cfx_scheduler = \"fastest\"", "cfx_scheduler = 3"] {
            let e = NetworkParams::from_table(&table(bad))
                .expect_err(bad)
                .to_string();
            assert!(e.contains("cfx_scheduler"), "{bad}: {e}");
        }
        let e = NetworkParams::from_table(&table("cfx_scheduler = \"fastest\""))
            .expect_err("unknown")
            .to_string();
        assert!(e.contains("mtor") && e.contains("round-robin:N"), "{e}");
    }

    #[test]
    fn bad_params_are_named() {
        for (text, needle) in [
            ("circuit_cc = \"reno\"", "circuit_cc"),
            (
                "circuit_cc = \"vegas\"\ncc_sendme_incc = 3",
                "cc_sendme_incc",
            ),
            ("cc_sendme_inc = 20", "fixed"),
            ("circuit_cc = \"vegas\"\ncc_sendme_inc = 0", "cc_sendme_inc"),
            ("circuit_cc = \"vegas\"\ncc_ss_max = -1", "cc_ss_max"),
            (
                "circuit_cc = \"vegas\"\ncc_cwnd_full_per_cwnd = 2",
                "cc_cwnd_full_per_cwnd",
            ),
        ] {
            let e = NetworkParams::from_table(&table(text))
                .expect_err(text)
                .to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
