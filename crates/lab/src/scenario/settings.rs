//! A scenario's `[relay_settings]`: relay.toml settings set over every
//! relay's (its `[link]` part over every client's too), checked when the
//! scenario is read.

use std::net::SocketAddr;

use onionlab_config::ConfigFile;

use super::{table_header_span, Ctx};
use crate::error::Result;

/// Settings the lab writes itself into every `relay.toml`, as key paths:
/// a scenario's `[relay_settings]` may not set them (the matrix does).
const LAB_RELAY_SETTINGS: &[&str] = &[
    "nickname",
    "keys",
    "listen",
    "network",
    "network_key",
    "scheduler",
    "exit_packaging",
    "exit_allow_private",
    "link.transport",
    "link.quic.congestion",
    "link.quic.initial_mtu",
    "link.tcp.congestion",
    "link.tcp.pacing",
];

/// A scenario's `[relay_settings]`, checked now: the lab's own keys are
/// refused, and the table set over a relay configuration must make a
/// valid one (unknown keys, wrong types and ranges are errors here, not
/// when the relays start). Its `[link]` part goes to clients too
/// ([`crate::Variant::link_settings`]).
pub(super) fn relay_settings(
    ctx: &Ctx<'_>,
    raw: Option<&toml::Table>,
    src: &str,
) -> Result<toml::Table> {
    let Some(table) = raw else {
        return Ok(toml::Table::new());
    };
    let span = table_header_span(src, "relay_settings");
    let set = |path: &str| {
        let mut at = Some(table);
        let mut keys = path.split('.').peekable();
        while let Some(key) = keys.next() {
            let value = at.and_then(|t| t.get(key));
            if keys.peek().is_none() {
                return value.is_some();
            }
            at = value.and_then(toml::Value::as_table);
        }
        false
    };
    if let Some(key) = LAB_RELAY_SETTINGS.iter().find(|k| set(k)) {
        return Err(ctx.err(
            span,
            format!("[relay_settings] may not set {key:?}: the lab writes it (use the matrix)"),
        ));
    }
    relay_settings_config(table).map_err(|e| ctx.err(span, format!("[relay_settings]: {e}")))?;
    Ok(table.clone())
}

/// A relay configuration with placeholders for what the lab writes and
/// `settings` (a scenario's `[relay_settings]`) set over it.
fn relay_settings_config(
    settings: &toml::Table,
) -> std::result::Result<onionlab_config::RelayConfig, onionlab_config::Error> {
    onionlab_config::RelayConfig::new(
        "probe",
        "k".into(),
        SocketAddr::from(([127, 0, 0, 1], 1)),
        onionlab_config::NetworkSource::File("n".into()),
        &"0".repeat(64),
    )?
    .with_overrides(settings, "[relay_settings]")
}
