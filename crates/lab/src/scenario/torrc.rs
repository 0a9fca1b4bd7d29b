//! A scenario's `[ctor]` section: more torrc lines and consensus
//! parameters for C tor variants, none of those the lab writes itself.

use toml::Spanned;

use super::raw::RawCtor;
use super::Ctx;
use crate::error::Result;

/// The `[ctor]` section checked: the relays' and clients' torrc lines and
/// the authority's consensus parameters (all empty without the section).
pub(super) fn ctor_section(
    ctx: &Ctx<'_>,
    raw: Option<&Spanned<RawCtor>>,
) -> Result<(Vec<String>, Vec<String>, Vec<String>)> {
    let Some(c) = raw else {
        return Ok((Vec::new(), Vec::new(), Vec::new()));
    };
    let err = |m| ctx.err(c.span(), m);
    Ok((
        torrc_lines(&c.get_ref().relay_torrc, "relay_torrc").map_err(err)?,
        torrc_lines(&c.get_ref().client_torrc, "client_torrc").map_err(err)?,
        consensus_params(&c.get_ref().consensus_params).map_err(err)?,
    ))
}

/// Consensus parameters the lab's authority sets from the variant
/// (`circuit_cc`, `legs`) or that would overrule it (`cfx_enabled`), which
/// `[ctor] consensus_params` may not set.
const LAB_CONSENSUS_PARAMS: &[&str] = &[
    "cc_alg",
    "cfx_enabled",
    "cfx_num_legs_set",
    "cfx_max_prebuilt_set",
    "cfx_max_linked_set",
];

/// `[ctor] consensus_params`: each `name=value` as C tor's
/// `ConsensusParams` takes it (a name of letters, digits and `_`, a
/// 32-bit integer value), none of the lab's own and no name twice.
fn consensus_params(params: &[String]) -> std::result::Result<Vec<String>, String> {
    let mut names: Vec<&str> = Vec::new();
    params
        .iter()
        .map(|param| {
            let param = param.trim();
            let valid = param.split_once('=').filter(|(name, value)| {
                !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && value.parse::<i32>().is_ok()
            });
            let Some((name, _)) = valid else {
                return Err(format!(
                    "[ctor] consensus_params: {param:?} is not `name=integer` (for example \
                     \"cellq_high=1000\")"
                ));
            };
            if LAB_CONSENSUS_PARAMS.contains(&name) {
                return Err(format!(
                    "[ctor] consensus_params may not set {name}: the lab sets it from the matrix \
                     (circuit_cc, legs)"
                ));
            }
            if names.contains(&name) {
                return Err(format!("[ctor] consensus_params: {name} set twice"));
            }
            names.push(name);
            Ok(param.to_string())
        })
        .collect()
}

/// torrc options the lab writes for C tor variants, which `[ctor]` lines
/// may not set: they place the tors in the lab's network and hosts.
const LAB_TORRC_OPTIONS: &[&str] = &[
    "DataDirectory",
    "DirAuthority",
    "Address",
    "ORPort",
    "DirPort",
    "SocksPort",
    "ControlPort",
    "Nickname",
    "TestingTorNetwork",
    "EntryNodes",
    "MiddleNodes",
    "ExitNodes",
    "StrictNodes",
    "RunAsDaemon",
    "Log",
    "CookieAuthentication",
    // What the matrix sets (`ctor_scheduler`).
    "Schedulers",
];

/// A `[ctor]` list of torrc lines, checked: one option per line, none the
/// lab writes itself.
fn torrc_lines(lines: &[String], what: &str) -> std::result::Result<Vec<String>, String> {
    lines
        .iter()
        .map(|line| {
            let line = line.trim();
            // torrc's `+Option` appends to and `/Option` clears an option:
            // the same option all the same.
            let option = line
                .split_whitespace()
                .next()
                .unwrap_or("")
                .trim_start_matches(['+', '/']);
            if option.is_empty() || line.contains('\n') || option.starts_with('#') {
                return Err(format!(
                    "[ctor] {what}: {line:?} is not one torrc line (`Option value`)"
                ));
            }
            if let Some(own) = LAB_TORRC_OPTIONS
                .iter()
                .find(|o| o.eq_ignore_ascii_case(option))
            {
                return Err(format!(
                    "[ctor] {what} may not set {own}: the lab writes it (to place the tors, or \
                     from the matrix)"
                ));
            }
            Ok(line.to_string())
        })
        .collect()
}
