//! The process's log filter: `--log` (or `ONIONLAB_LOG`) when given, else
//! the `log` setting of the node's config file, else `info`.

use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

use crate::error::{Error, Result};

/// Set when the command line gave no filter, so a config file may.
static CONFIG_MAY_SET: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Install the subscriber (stderr) with `cli_filter` if given, else `info`
/// until a config file says otherwise (see [`apply_config_filter`]). An
/// invalid command-line filter falls back to `info` with a warning.
pub fn init(cli_filter: Option<&str>) {
    let (filter, bad) = match EnvFilter::try_new(cli_filter.unwrap_or("info")) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e)),
    };
    let (filter, handle) = reload::Layer::new(filter);
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .init();
    if let Some(e) = bad {
        tracing::warn!("invalid --log filter ({e}): using \"info\"");
    }
    if cli_filter.is_none() {
        let _ = CONFIG_MAY_SET.set(handle);
    }
}

/// Apply the `log` setting of the config file `file`, unless the command
/// line set a filter (which wins).
///
/// # Errors
///
/// [`Error::Usage`] naming the file if the filter does not parse.
pub fn apply_config_filter(file: &std::path::Path, filter: Option<&str>) -> Result<()> {
    let (Some(filter), Some(handle)) = (filter, CONFIG_MAY_SET.get()) else {
        return Ok(());
    };
    let parsed = EnvFilter::try_new(filter).map_err(|e| {
        Error::Usage(format!(
            "{}: invalid log filter {filter:?}: {e}",
            file.display()
        ))
    })?;
    handle.reload(parsed).map_err(|e| {
        Error::Usage(format!(
            "applying the log filter of {}: {e}",
            file.display()
        ))
    })
}
