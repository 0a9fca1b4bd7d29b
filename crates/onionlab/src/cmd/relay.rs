//! `onionlab relay`: run a relay (or exit) from its config file.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use onionlab_circuit::node::NodeConfig;
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_config::{load_network, ConfigFile, RelayConfig, Scheduler};
use onionlab_node::{DosLimits, Relay, RelaySettings};
use onionlab_transport::{Choice, TransportKind};

use crate::cmd::runtime;
use crate::error::Result;

/// Arguments of `onionlab relay`.
#[derive(Args, Debug)]
#[command(after_long_help = onionlab_transport::registry::help_text())]
pub struct RelayArgs {
    /// The relay's config file (written by `onionlab network init`).
    #[arg(long)]
    config: PathBuf,
}

/// The circuit-layer settings a relay config asks for.
pub fn node_config(cfg: &RelayConfig) -> NodeConfig {
    let scheduler = match cfg.scheduler {
        Scheduler::Ewma => SchedulerKind::Ewma {
            half_life: Duration::from_millis(cfg.ewma_half_life_ms),
        },
        Scheduler::RoundRobin => SchedulerKind::RoundRobin,
    };
    // The exit's classifier runs when the relay opens torchestra links
    // (the lab gives every node the same transport).
    let torchestra =
        (cfg.link.transport == Choice::Only(TransportKind::TORCHESTRA)).then_some(cfg.torchestra);
    NodeConfig {
        scheduler,
        circuit: onionlab_circuit::relay::RelayConfig {
            exit_packaging: cfg.exit_packaging,
            ..Default::default()
        },
        max_mem_in_queues: usize::try_from(cfg.max_mem_in_queues).unwrap_or(usize::MAX),
        torchestra,
        ..NodeConfig::default()
    }
}

/// The denial-of-service limits a relay config asks for.
pub fn dos_limits(cfg: &RelayConfig) -> DosLimits {
    let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    DosLimits {
        max_conns_per_address: count(cfg.dos_max_conns_per_address),
        conn_rate: cfg.dos_conn_rate as f64,
        conn_burst: cfg.dos_conn_burst as f64,
        max_conns_total: count(cfg.dos_max_conns_total),
        max_handshakes: count(cfg.dos_max_handshakes),
        create_rate: cfg.dos_create_rate as f64,
        create_burst: cfg.dos_create_burst as f64,
        create_min_conns: count(cfg.dos_create_min_conns),
        handshake_retry_rate: cfg.dos_quic_retry_rate as f64,
    }
}

/// Run a relay until SIGINT/SIGTERM.
pub fn run(args: RelayArgs) -> Result<ExitCode> {
    let cfg = RelayConfig::load(&args.config)?;
    super::logging::apply_config_filter(&args.config, cfg.log.as_deref())?;
    let keys = onionlab_netdoc::keys::load_relay_keys(&cfg.keys)?;
    let network_key = cfg.network_public_key()?;
    runtime::current_thread()?.block_on(async {
        let doc = load_network(&cfg.network, &network_key).await?;
        let listen = cfg.listen.clone();
        let mut settings = RelaySettings::from_document(keys, listen, doc, node_config(&cfg))?;
        settings.link = cfg.link.clone();
        settings.exit.connect_timeout = Duration::from_millis(cfg.exit_connect_timeout_ms);
        settings.exit.reject_private = cfg.exit_reject_private;
        settings.exit.allow_private = cfg.exit_allow_private.clone();
        settings.exit.max_concurrent_lookups =
            usize::try_from(cfg.exit_max_concurrent_lookups).unwrap_or(usize::MAX);
        settings.exit.max_pending_connects =
            usize::try_from(cfg.exit_max_pending_connects).unwrap_or(usize::MAX);
        settings.dos = dos_limits(&cfg);
        settings.channel_idle_timeout = Duration::from_millis(cfg.channel_idle_timeout_ms);
        let relay = Relay::bind(settings).await?;
        relay.run(runtime::shutdown_signal()).await?;
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use onionlab_config::{self as config, ConfigFile};

    /// The file's defaults and the node crate's are the same numbers.
    #[test]
    fn config_defaults_match_the_node_defaults() {
        assert_eq!(
            config::DEFAULT_EXIT_CONNECT_TIMEOUT_MS,
            onionlab_node::DEFAULT_EXIT_CONNECT_TIMEOUT.as_millis() as u64
        );
        assert_eq!(
            config::DEFAULT_EXIT_MAX_CONCURRENT_LOOKUPS,
            onionlab_node::DEFAULT_MAX_CONCURRENT_LOOKUPS as u64
        );
        assert_eq!(
            config::DEFAULT_EXIT_MAX_PENDING_CONNECTS,
            onionlab_node::DEFAULT_MAX_PENDING_CONNECTS as u64
        );
        let key = onionlab_netdoc::keys::generate_network_key(&mut rand::rng());
        let text = format!(
            "nickname = \"r\"\nkeys = \"k\"\nlisten = {{ tls = \"127.0.0.1:1\" }}\nnetwork = \"n\"\nnetwork_key = \"{}\"\n",
            onionlab_netdoc::keys::public_key_hex(&key.verifying_key())
        );
        let cfg = config::RelayConfig::from_toml_str(&text, "r", Path::new(".")).expect("valid");
        assert_eq!(super::dos_limits(&cfg), onionlab_node::DosLimits::default());
        let quic = onionlab_transport::quic::gate::HandshakeLimits::default();
        assert_eq!(cfg.dos_quic_retry_rate as f64, quic.retry_rate);
        let admission = onionlab_transport::endpoint::Admission::default();
        assert_eq!(cfg.dos_quic_retry_rate as f64, admission.retry_rate);
        assert_eq!(
            Duration::from_millis(cfg.channel_idle_timeout_ms),
            onionlab_node::DEFAULT_CHANNEL_IDLE_TIMEOUT
        );
        assert!(cfg.exit_reject_private);
        assert!(cfg.exit_allow_private.is_empty());
        assert_eq!(
            cfg.link.quic.initial_mtu,
            onionlab_transport::quic::DEFAULT_INITIAL_MTU
        );
    }
}
