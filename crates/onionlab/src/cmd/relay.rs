//! `onionlab relay`: run a relay (or exit) from its config file.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use onionlab_circuit::node::NodeConfig;
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_netdoc::{load_network, RelayConfig, Scheduler};
use onionlab_node::{Relay, RelaySettings};
use onionlab_transport::any::Choice;
use onionlab_transport::quic::Congestion;

use crate::cmd::runtime;
use crate::error::Result;

/// Arguments of `onionlab relay`.
#[derive(Args, Debug)]
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
    NodeConfig {
        scheduler,
        max_mem_in_queues: usize::try_from(cfg.max_mem_in_queues).unwrap_or(usize::MAX),
        ..NodeConfig::default()
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
        let mut settings = RelaySettings::from_document(keys, cfg.listen, doc, node_config(&cfg))?;
        settings.quic_listen = cfg.quic_listen;
        // The configuration's names are the transport crate's.
        settings.transport = Choice::from_name(cfg.transport.as_str()).unwrap_or_default();
        settings.quic.congestion =
            Congestion::from_name(cfg.quic_congestion.as_str()).unwrap_or_default();
        settings.quic.keep_alive = Duration::from_millis(cfg.quic_keep_alive_ms);
        settings.quic.idle_timeout = Duration::from_millis(cfg.quic_idle_timeout_ms);
        settings.link_handshake_timeout = Duration::from_millis(cfg.link_handshake_timeout_ms);
        settings.exit_connect_timeout = Duration::from_millis(cfg.exit_connect_timeout_ms);
        let relay = Relay::bind(settings).await?;
        relay.run(runtime::shutdown_signal()).await?;
        Ok(ExitCode::SUCCESS)
    })
}
