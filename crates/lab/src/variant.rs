//! Variants: one combination of the matrix's values, resolved into what
//! the lab runs (the implementation, transport, settings, topology and
//! workloads of one run).

use std::collections::BTreeMap;

use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_circuit::relay::ExitPackaging;
use onionlab_netem::Topology;
use onionlab_transport::datagram::tunnel::EndToEnd;
use onionlab_transport::tcp::TcpCongestion;
use onionlab_transport::{Choice as TransportChoice, LinkSettings};

use crate::error::{Error, Result};
use crate::hostnet::KernelTcp;
use crate::workload::Workload;

/// Which onion-routing implementation runs a variant's relays and clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Implementation {
    /// onionlab's relays and clients, over the variant's transport.
    #[default]
    Onionlab,
    /// C tor (Debian's `tor`) in a private network with a directory
    /// authority of its own (`transport = "ctor"`; docs/ctor.md). Its
    /// channels are TLS over TCP.
    Ctor,
}

/// One combination of matrix values, resolved.
#[derive(Debug, Clone)]
pub struct Variant {
    /// Short label such as `scheduler=ewma latency=20ms`.
    pub label: String,
    /// Parameter values of this variant.
    pub params: Vec<(String, String)>,
    /// Transport of every channel: the nodes' `transport` setting (`auto`
    /// or a registered transport; TLS for C tor).
    pub transport: TransportChoice,
    /// Which implementation runs the relays and clients.
    pub implementation: Implementation,
    /// QUIC congestion control of every node (one of [`CONGESTIONS`](crate::matrix::CONGESTIONS);
    /// default `cubic`; no effect on TLS).
    pub congestion: String,
    /// Circuit scheduler of every relay.
    pub scheduler: String,
    /// Circuit-level flow control of the network (one of [`CIRCUIT_CCS`](crate::matrix::CIRCUIT_CCS)).
    pub circuit_cc: String,
    /// Circuits per multi-path set (`legs`; 1: plain circuits, and the
    /// document does not enable sets).
    pub legs: usize,
    /// The sets' leg scheduler (`leg_scheduler`; the document's
    /// `cfx_scheduler`).
    pub leg_scheduler: LegSchedulerKind,
    /// The TCP a datagram variant runs end to end (`end_to_end`: the
    /// user-space one, or the kernel's through TUN devices).
    pub end_to_end: EndToEnd,
    /// When the exits package DATA cells (`exit_packaging`; onionlab's
    /// lazy packaging unless the matrix says otherwise).
    pub exit_packaging: ExitPackaging,
    /// C tor's channel scheduler (one of [`CTOR_SCHEDULERS`](crate::matrix::CTOR_SCHEDULERS); `None`:
    /// tor's default). Only for `ctor` variants.
    pub ctor_scheduler: Option<String>,
    /// TCP congestion control of every host, if the matrix sets it (one of
    /// [`TCP_CONGESTIONS`](crate::matrix::TCP_CONGESTIONS)); see [`Variant::tcp_congestion_of`].
    pub tcp_congestion: Option<String>,
    /// TCP congestion control of single hosts (`tcp_congestion:HOST`).
    pub tcp_congestion_hosts: BTreeMap<String, String>,
    /// Kernel TCP settings of every host the matrix sets
    /// (`slow_start_after_idle`, `tcp_notsent_lowat`).
    pub kernel_tcp: KernelTcp,
    /// Whether onionlab's nodes have Linux pace their channel TCP sockets
    /// (`tcp_pacing`, the nodes' setting of that name).
    pub tcp_pacing: bool,
    /// Linux Cubic's HyStart on or off during this variant's runs
    /// (`cubic_hystart`; `None`: the machine's, left alone).
    pub cubic_hystart: Option<bool>,
    /// Only the first this many clients (file order) run, with their
    /// workloads (`clients`); `None`: all.
    pub clients: Option<usize>,
    /// The topology with this variant's changes.
    pub topology: Topology,
    /// The workloads with this variant's changes.
    pub workloads: Vec<Workload>,
    /// The scenario's `[relay_settings]`, set over every `relay.toml`
    /// (its `[link]` part over every `client.toml` too).
    pub relay_settings: toml::Table,
}

impl Variant {
    /// The clients this variant runs: the first
    /// [`clients`](Self::clients) of `all`, or all of them.
    pub fn active_clients<'a, T>(&self, all: &'a [T]) -> &'a [T] {
        &all[..self.clients.unwrap_or(all.len()).min(all.len())]
    }

    /// The kernel TCP congestion control of `host`'s sockets: its own
    /// setting, else every host's, else the match of the QUIC congestion
    /// control (cubic with cubic, reno with newreno, bbr with bbr), so
    /// that TLS and QUIC run the same algorithm unless asked otherwise.
    pub fn tcp_congestion_of(&self, host: &str) -> &str {
        self.tcp_congestion_hosts
            .get(host)
            .or(self.tcp_congestion.as_ref())
            .map_or_else(|| tcp_match(&self.congestion), String::as_str)
    }

    /// The `[link]` section of a variant's node on `host`: the variant's
    /// transport; congestion control, the node's TCP one
    /// ([`Variant::tcp_congestion_of`]) and the variant's for transports with
    /// their own ([`LinkSettings::set_congestion`]; the scenario refuses one a
    /// transport lacks); TCP pacing; packets that fill the links' MTU
    /// ([`LinkSettings::fit_to_link_mtu`]). The scenario's `[relay_settings.link]` is set
    /// over it last, so it may change what the matrix does not set.
    ///
    /// # Errors
    ///
    /// [`Error::Link`] or [`Error::LinkTable`] naming the bad value
    /// (checked when the scenario was read).
    pub fn link_settings(&self, host: &str) -> Result<LinkSettings> {
        let mut link = LinkSettings {
            transport: self.transport,
            ..LinkSettings::default()
        };
        let tcp = TcpCongestion::parse(self.tcp_congestion_of(host))
            .map_err(onionlab_transport::Error::from)?;
        link.set_congestion(tcp, &self.congestion)?;
        link.tcp.pacing = self.tcp_pacing;
        link.datagram.end_to_end = self.end_to_end;
        link.fit_to_link_mtu(self.topology.mtu);
        let Some(extra) = self
            .relay_settings
            .get("link")
            .and_then(toml::Value::as_table)
        else {
            link.check()?;
            return Ok(link);
        };
        let mut table = toml::Table::try_from(&link).map_err(|e| Error::Config(e.to_string()))?;
        onionlab_config::merge_tables(&mut table, extra);
        let link: LinkSettings = table.try_into()?;
        link.check()?;
        Ok(link)
    }
}

/// The Linux TCP congestion control matching a QUIC one.
fn tcp_match(quic: &str) -> &'static str {
    match quic {
        "newreno" => "reno",
        "bbr" => "bbr",
        _ => "cubic",
    }
}
