//! What the kernel of each emulated host does to a result: its TCP
//! settings (set for the variant, then recorded) and the packets it
//! dropped itself rather than the emulated links.
//!
//! Everything here runs on a thread inside a host's network namespace
//! (`Network::run_in`). The network sysctls under `/proc/sys/net` follow
//! the calling thread's namespace; `/proc/net` follows the process's
//! main thread, so the per-namespace counters are read from
//! `/proc/thread-self/net`.

use std::collections::BTreeMap;
use std::io;

use serde::{Deserialize, Serialize};

/// TCP sysctls that can change a result, recorded for every host (the
/// name under `/proc/sys`, with dots).
pub const RECORDED_SYSCTLS: &[&str] = &[
    "net.ipv4.tcp_congestion_control",
    "net.ipv4.tcp_available_congestion_control",
    "net.ipv4.tcp_no_metrics_save",
    "net.ipv4.tcp_ecn",
    "net.ipv4.tcp_sack",
    "net.ipv4.tcp_timestamps",
    "net.ipv4.tcp_window_scaling",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_mtu_probing",
    "net.ipv4.tcp_base_mss",
    "net.ipv4.tcp_recovery",
    "net.ipv4.tcp_early_retrans",
    "net.ipv4.tcp_frto",
    "net.ipv4.tcp_autocorking",
    "net.ipv4.tcp_notsent_lowat",
    "net.ipv4.tcp_pacing_ss_ratio",
    "net.ipv4.tcp_pacing_ca_ratio",
    "net.core.rmem_max",
    "net.core.wmem_max",
    "net.core.rmem_default",
    "net.core.wmem_default",
];

/// The TCP set-up of one host in one repetition.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct HostTcp {
    /// Host name.
    pub host: String,
    /// The congestion control the host's nodes set on each of their TCP
    /// sockets (the namespace's default if `system`).
    pub congestion: String,
    /// The namespace's default, `net.ipv4.tcp_congestion_control`, which
    /// no node socket uses unless `congestion` is `system`.
    pub kernel_default: String,
    /// `net.ipv4.tcp_no_metrics_save` as read back.
    pub no_metrics_save: String,
    /// `net.ipv4.tcp_slow_start_after_idle` as read back (`1`: an idle
    /// connection restarts from its initial window).
    #[serde(default)]
    pub slow_start_after_idle: String,
    /// `net.ipv4.tcp_notsent_lowat` as read back: the most unsent bytes a
    /// socket's send buffer holds before it stops being writable.
    #[serde(default)]
    pub notsent_lowat: String,
}

/// Kernel TCP settings a variant may set on every host (`None`: the
/// kernel's own, recorded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelTcp {
    /// `net.ipv4.tcp_slow_start_after_idle`.
    pub slow_start_after_idle: Option<bool>,
    /// `net.ipv4.tcp_notsent_lowat`, bytes.
    pub notsent_lowat: Option<u64>,
}

fn sysctl_path(name: &str) -> String {
    format!("/proc/sys/{}", name.replace('.', "/"))
}

/// Read sysctl `name` (trimmed; `None` if this kernel lacks it).
pub fn read_sysctl(name: &str) -> Option<String> {
    std::fs::read_to_string(sysctl_path(name))
        .ok()
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
}

fn write_sysctl(name: &str, value: &str) -> io::Result<()> {
    std::fs::write(sysctl_path(name), value)
        .map_err(|e| io::Error::new(e.kind(), format!("setting {name} = {value}: {e}")))
}

/// Every [`RECORDED_SYSCTLS`] this kernel has, in this namespace.
pub fn recorded_sysctls() -> BTreeMap<String, String> {
    RECORDED_SYSCTLS
        .iter()
        .filter_map(|n| read_sysctl(n).map(|v| (n.to_string(), v)))
        .collect()
}

/// Parameters of the kernel's TCP congestion control modules that can
/// change a result (`/sys/module/tcp_cubic/parameters/hystart`: Linux's
/// Cubic leaves slow start early on rising delay, quinn's has no HyStart),
/// as `tcp_cubic.hystart`. Machine-wide, not per namespace; modules not
/// loaded are absent.
pub fn recorded_tcp_module_parameters() -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    for module in ["tcp_cubic", "tcp_bbr"] {
        let Ok(dir) = std::fs::read_dir(format!("/sys/module/{module}/parameters")) else {
            continue;
        };
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Ok(value) = std::fs::read_to_string(entry.path()) {
                found.insert(format!("{module}.{name}"), value.trim().to_string());
            }
        }
    }
    found
}

/// Where Linux's Cubic keeps its HyStart switch (machine-wide).
const CUBIC_HYSTART: &str = "/sys/module/tcp_cubic/parameters/hystart";

/// Linux's Cubic with HyStart on or off while this lives (matrix parameter
/// `cubic_hystart`); dropping it writes back the value it found. HyStart
/// leaves slow start early when the RTT rises (a queue builds) or ACK
/// trains stretch; quinn's Cubic has none, so with it off both Cubics
/// leave slow start only on loss. The module parameter is machine-wide
/// (every namespace and Cubic socket, C tor's too), so runs that differ in
/// it must not overlap (the lab refuses `--jobs` above 1 with it).
pub struct CubicHystart {
    previous: String,
}

impl CubicHystart {
    /// Turn HyStart on or off.
    ///
    /// # Errors
    ///
    /// The parameter cannot be read (no `tcp_cubic`) or written (not root).
    pub fn set(on: bool) -> io::Result<CubicHystart> {
        let previous = std::fs::read_to_string(CUBIC_HYSTART)
            .map_err(|e| io::Error::new(e.kind(), format!("reading {CUBIC_HYSTART}: {e}")))?
            .trim()
            .to_string();
        let want = if on { "1" } else { "0" };
        std::fs::write(CUBIC_HYSTART, want).map_err(|e| {
            io::Error::new(e.kind(), format!("setting {CUBIC_HYSTART} = {want}: {e}"))
        })?;
        Ok(CubicHystart { previous })
    }
}

impl Drop for CubicHystart {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(CUBIC_HYSTART, &self.previous) {
            tracing::warn!(
                "{CUBIC_HYSTART} left changed, not restored to {}: {e}",
                self.previous
            );
        }
    }
}

/// Prepare this namespace for a repetition: TCP does not reuse what an
/// earlier connection learnt of a path (`tcp_no_metrics_save = 1`: no
/// cached ssthresh or RTT carried from one connection to the next).
/// Returns the host's set-up, its nodes using `congestion` per socket.
/// What `kernel` sets is written to the namespace's sysctls (otherwise the
/// kernel's values stay, and are recorded).
///
/// Best effort: every repetition's namespaces are new, so their metrics
/// cache starts empty anyway; a kernel that refuses the setting (an
/// unprivileged user namespace) is logged, and the value read back is
/// what the record shows.
pub fn prepare_host(host: &str, congestion: &str, kernel: KernelTcp) -> HostTcp {
    if let Err(e) = write_sysctl("net.ipv4.tcp_no_metrics_save", "1") {
        tracing::warn!(
            host,
            "{e}; the namespace is new, so no metrics are cached yet"
        );
    }
    let writes = [
        (
            "net.ipv4.tcp_slow_start_after_idle",
            kernel
                .slow_start_after_idle
                .map(|on| if on { "1" } else { "0" }.to_string()),
        ),
        (
            "net.ipv4.tcp_notsent_lowat",
            kernel.notsent_lowat.map(|b| b.to_string()),
        ),
    ];
    for (name, value) in writes {
        if let Some(value) = value {
            if let Err(e) = write_sysctl(name, &value) {
                tracing::warn!(host, "{e}; the record shows the value in force");
            }
        }
    }
    let read = |n| read_sysctl(n).unwrap_or_default();
    let kernel_default = read("net.ipv4.tcp_congestion_control");
    HostTcp {
        host: host.to_string(),
        congestion: match congestion {
            "system" => kernel_default.clone(),
            named => named.to_string(),
        },
        kernel_default,
        no_metrics_save: read("net.ipv4.tcp_no_metrics_save"),
        slow_start_after_idle: read("net.ipv4.tcp_slow_start_after_idle"),
        notsent_lowat: read("net.ipv4.tcp_notsent_lowat"),
    }
}

/// Let namespaces use `algorithm` as their default TCP congestion control
/// (for programs that set none per socket, such as C tor): outside the
/// initial namespace Linux accepts only the algorithms listed in the
/// machine-wide `net.ipv4.tcp_allowed_congestion_control`, so it is added
/// there if missing. Call from the initial namespace (as root). Returns
/// whether the list changed. The change stays after the run: it only lets
/// unprivileged programs pick an algorithm the kernel already has.
pub fn allow_congestion(algorithm: &str) -> io::Result<bool> {
    // A read-modify-write of a machine-wide file: concurrent runs
    // (`lab run --jobs`) must not lose each other's additions.
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let name = "net.ipv4.tcp_allowed_congestion_control";
    // Unreadable: writing only `algorithm` would drop what was allowed.
    let allowed = read_sysctl(name)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("cannot read {name}")))?;
    if allowed.split_whitespace().any(|a| a == algorithm) {
        return Ok(false);
    }
    write_sysctl(name, &format!("{allowed} {algorithm}"))?;
    tracing::info!("added {algorithm} to {name} (C tor sets no congestion control per socket)");
    Ok(true)
}

/// Make `algorithm` this namespace's default TCP congestion control (it
/// must be allowed: [`allow_congestion`]).
pub fn set_default_congestion(algorithm: &str) -> io::Result<()> {
    write_sysctl("net.ipv4.tcp_congestion_control", algorithm)
}

/// What one host's TCP did during a repetition, from the namespace's
/// counters (`/proc/net/snmp`, `/proc/net/netstat`): how much it
/// retransmitted and why. A retransmission timeout is what a connection
/// with too few packets in flight for fast retransmit pays for a loss.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq, Eq)]
pub struct HostTcpCounters {
    /// Host name.
    pub host: String,
    /// Segments sent (`Tcp: OutSegs`).
    pub out_segs: u64,
    /// Segments retransmitted (`Tcp: RetransSegs`).
    pub retrans_segs: u64,
    /// Retransmission timeouts (`TcpExt: TCPTimeouts`).
    pub timeouts: u64,
    /// Tail loss probes sent (`TcpExt: TCPLossProbes`).
    pub loss_probes: u64,
    /// Fast retransmits (`TcpExt: TCPFastRetrans`).
    pub fast_retrans: u64,
}

/// This namespace's TCP counters, for the host named `host`. Counters this
/// kernel lacks read as 0.
pub fn read_tcp_counters(host: &str) -> HostTcpCounters {
    let read = |f: &str| std::fs::read_to_string(format!("/proc/thread-self/net/{f}"));
    let snmp = read("snmp").unwrap_or_default();
    let netstat = read("netstat").unwrap_or_default();
    let ext = |name| proto_counter(&netstat, "TcpExt", name).unwrap_or(0);
    HostTcpCounters {
        host: host.to_string(),
        out_segs: proto_counter(&snmp, "Tcp", "OutSegs").unwrap_or(0),
        retrans_segs: proto_counter(&snmp, "Tcp", "RetransSegs").unwrap_or(0),
        timeouts: ext("TCPTimeouts"),
        loss_probes: ext("TCPLossProbes"),
        fast_retrans: ext("TCPFastRetrans"),
    }
}

/// Packets one host's kernel dropped by itself during a repetition (not
/// the emulated links' losses): a sign that the machine, not the
/// network under study, limited the result.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq, Eq)]
pub struct HostDrops {
    /// Host name.
    pub host: String,
    /// Packets the host's TUN could not queue for the emulator
    /// (`tx_dropped`: the emulator fell behind).
    pub tun_tx_dropped: u64,
    /// UDP datagrams dropped for a full socket receive buffer
    /// (`Udp: RcvbufErrors`: a QUIC endpoint fell behind).
    pub udp_rcvbuf_errors: u64,
    /// TCP segments dropped for a full receive queue or backlog
    /// (`TcpExt: TCPRcvQDrop` plus `TCPBacklogDrop`).
    pub tcp_queue_drops: u64,
}

impl HostDrops {
    /// Whether the host dropped anything.
    pub fn any(&self) -> bool {
        self.tun_tx_dropped + self.udp_rcvbuf_errors + self.tcp_queue_drops > 0
    }
}

/// This namespace's drop counters, for the host named `host` whose TUN
/// is `tun`. Counters this kernel lacks read as 0.
pub fn read_drops(host: &str, tun: &str) -> HostDrops {
    let read = |f: &str| std::fs::read_to_string(format!("/proc/thread-self/net/{f}"));
    let snmp = read("snmp").unwrap_or_default();
    let netstat = read("netstat").unwrap_or_default();
    let dev = read("dev").unwrap_or_default();
    HostDrops {
        host: host.to_string(),
        tun_tx_dropped: dev_tx_dropped(&dev, tun).unwrap_or(0),
        udp_rcvbuf_errors: proto_counter(&snmp, "Udp", "RcvbufErrors").unwrap_or(0),
        tcp_queue_drops: proto_counter(&netstat, "TcpExt", "TCPRcvQDrop").unwrap_or(0)
            + proto_counter(&netstat, "TcpExt", "TCPBacklogDrop").unwrap_or(0),
    }
}

/// A counter of `/proc/net/snmp` or `/proc/net/netstat`: a line of names
/// `Proto: A B C` followed by a line of values `Proto: 1 2 3`.
fn proto_counter(text: &str, proto: &str, name: &str) -> Option<u64> {
    let prefix = format!("{proto}:");
    let mut lines = text.lines().filter(|l| l.starts_with(&prefix));
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        let i = names.split_whitespace().position(|n| n == name);
        if let Some(i) = i {
            return values.split_whitespace().nth(i)?.parse().ok();
        }
    }
    None
}

/// The transmit `drop` column of interface `iface` in `/proc/net/dev`.
fn dev_tx_dropped(text: &str, iface: &str) -> Option<u64> {
    let line = text
        .lines()
        .find(|l| l.split(':').next().map(str::trim) == Some(iface))?;
    let fields: Vec<&str> = line.split(':').nth(1)?.split_whitespace().collect();
    // receive: bytes packets errs drop fifo frame compressed multicast,
    // transmit: bytes packets errs drop ...
    fields.get(11)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_found_by_name() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\nUdp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors\nUdp: 10 0 3 9 7\n";
        assert_eq!(proto_counter(snmp, "Udp", "RcvbufErrors"), Some(7));
        assert_eq!(proto_counter(snmp, "Udp", "Missing"), None);
        assert_eq!(proto_counter(snmp, "Tcp", "RcvbufErrors"), None);
        let dev = "Inter-|   Receive |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop fifo colls carrier compressed\n    lo: 100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  tun0: 5000 40 0 2 0 0 0 0 6000 50 0 13 0 0 0 0\n";
        assert_eq!(dev_tx_dropped(dev, "tun0"), Some(13));
        assert_eq!(dev_tx_dropped(dev, "lo"), Some(0));
        assert_eq!(dev_tx_dropped(dev, "eth0"), None);
    }

    #[test]
    fn this_kernel_has_the_counters_and_settings() {
        // The running kernel's own files parse (values vary).
        let dev = std::fs::read_to_string("/proc/thread-self/net/dev").expect("dev");
        assert!(dev_tx_dropped(&dev, "lo").is_some(), "{dev}");
        let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").expect("snmp");
        assert!(proto_counter(&snmp, "Udp", "RcvbufErrors").is_some());
        let netstat = std::fs::read_to_string("/proc/thread-self/net/netstat").expect("netstat");
        assert!(proto_counter(&netstat, "TcpExt", "TCPTimeouts").is_some());
        assert!(proto_counter(&snmp, "Tcp", "RetransSegs").is_some());
        let recorded = recorded_sysctls();
        assert!(recorded.contains_key("net.ipv4.tcp_congestion_control"));
        assert!(recorded.contains_key("net.ipv4.tcp_no_metrics_save"));
        if std::path::Path::new(CUBIC_HYSTART).exists() {
            let modules = recorded_tcp_module_parameters();
            assert!(modules.contains_key("tcp_cubic.hystart"), "{modules:?}");
        }
    }

    /// `cubic_hystart` flips the machine's HyStart for as long as the guard
    /// lives, then puts back what it found (root only; microseconds).
    #[test]
    fn cubic_hystart_is_set_and_restored() {
        let Ok(before) = std::fs::read_to_string(CUBIC_HYSTART) else {
            return;
        };
        let before = before.trim().to_string();
        let flipped = before == "0";
        let Ok(guard) = CubicHystart::set(flipped) else {
            return; // not root
        };
        let now = std::fs::read_to_string(CUBIC_HYSTART).expect("read");
        drop(guard);
        assert_eq!(now.trim(), if flipped { "1" } else { "0" });
        let after = std::fs::read_to_string(CUBIC_HYSTART).expect("read");
        assert_eq!(after.trim(), before);
    }
}
