//! A scenario's `[[workload]]` entries: what each client's transfers do,
//! with the defaults of each kind and the settings that belong to it.

use std::path::Path;
use std::time::Duration;

use onionlab_netem::units::parse_duration;

use super::raw::RawWorkload;
use super::{check_small_file, ClientSpec, Ctx, ServerSpec};
use crate::error::Result;
use crate::workload::{parse_size, Workload, WorkloadKind};

/// Largest trace file read.
const MAX_TRACE_FILE_LEN: u64 = 16 << 20;

/// Time a stream workload needs beyond its duration (circuit, SOCKS,
/// draining): `transfer_timeout` must leave at least this much.
const STREAM_MARGIN: Duration = Duration::from_secs(10);

/// What the scenario's workloads are checked against.
pub(super) struct WorkloadContext<'a> {
    /// The scenario's clients.
    pub(super) clients: &'a [ClientSpec],
    /// The scenario's servers.
    pub(super) servers: &'a [ServerSpec],
    /// Where trace files are relative to.
    pub(super) base: &'a Path,
    /// The scenario's transfer deadline.
    pub(super) transfer_timeout: Duration,
}

/// The `[[workload]]` entries: at least one, distinct names, each with a
/// known client and server.
pub(super) fn workloads(
    ctx: &Ctx<'_>,
    raw: &[RawWorkload],
    wc: &WorkloadContext<'_>,
) -> Result<Vec<Workload>> {
    let mut workloads: Vec<Workload> = Vec::new();
    for w in raw {
        let workload = workload(ctx, w, wc)?;
        if workloads.iter().any(|x| x.name == workload.name) {
            let span = w.name.as_ref().map_or(w.client.span(), |n| n.span());
            return Err(ctx.err(
                span,
                format!("duplicate workload name {:?} (set `name`)", workload.name),
            ));
        }
        workloads.push(workload);
    }
    if workloads.is_empty() {
        return Err(ctx.err(0..0, "no [[workload]]"));
    }
    Ok(workloads)
}

/// One `[[workload]]` entry, checked.
fn workload(ctx: &Ctx<'_>, w: &RawWorkload, wc: &WorkloadContext<'_>) -> Result<Workload> {
    let client = wc
        .clients
        .iter()
        .find(|c| &c.name == w.client.get_ref())
        .ok_or_else(|| {
            ctx.err(
                w.client.span(),
                format!("unknown client {:?}", w.client.get_ref()),
            )
        })?;
    if !wc.servers.iter().any(|s| &s.name == w.server.get_ref()) {
        return Err(ctx.err(
            w.server.span(),
            format!("unknown server {:?}", w.server.get_ref()),
        ));
    }
    let (kind, default_size, default_think) = kind_defaults(ctx, w)?;
    let size = match &w.size {
        None => default_size,
        Some(s) => parse_size(s.get_ref()).map_err(|m| ctx.err(s.span(), m))?,
    };
    let (think_min, think_max) = match &w.think {
        None => parse_think(default_think).map_err(|m| ctx.err(w.kind.span(), m))?,
        Some(s) => parse_think(s.get_ref()).map_err(|m| ctx.err(s.span(), m))?,
    };
    let start = ctx.duration(&w.start, Duration::ZERO)?;
    let until = until_of(ctx, w, kind, start)?;
    let count = match &w.count {
        // A workload that runs for a time is bounded by its time alone.
        None if until.is_some() => u32::MAX,
        None => 1,
        Some(c) if *c.get_ref() == 0 => return Err(ctx.err(c.span(), "count must be at least 1")),
        Some(c) => *c.get_ref(),
    };
    let name = w
        .name
        .as_ref()
        .map_or_else(|| client.name.clone(), |n| n.get_ref().clone());
    let (probes, probe_interval) = probe_settings(ctx, w, kind)?;
    let trace = trace_of(ctx, w, kind, wc.base)?;
    let stream_duration = stream_duration(ctx, w, kind, wc.transfer_timeout)?;
    let size = match kind {
        WorkloadKind::Stream => 0,
        WorkloadKind::Probe => u64::from(probes) * crate::traffic::PROBE_LEN as u64,
        WorkloadKind::Trace => trace.iter().map(|(_, b)| u64::from(*b)).sum(),
        _ => size,
    };
    Ok(Workload {
        trace,
        stream_duration,
        probes,
        probe_interval,
        name,
        kind,
        client: client.name.clone(),
        server: w.server.get_ref().clone(),
        size,
        count,
        think_min,
        think_max,
        start,
        until,
    })
}

/// A workload's `until`: after `start`, for download-like kinds only
/// (a trace or a stream has its own length).
fn until_of(
    ctx: &Ctx<'_>,
    w: &RawWorkload,
    kind: WorkloadKind,
    start: Duration,
) -> Result<Option<Duration>> {
    let Some(raw) = &w.until else {
        return Ok(None);
    };
    let until = ctx.duration(&w.until, Duration::ZERO)?;
    if matches!(kind, WorkloadKind::Trace | WorkloadKind::Stream) {
        return Err(ctx.err(
            raw.span(),
            "`until` is for transfers repeated with think times, not a trace or a stream",
        ));
    }
    if until <= start {
        return Err(ctx.err(
            raw.span(),
            format!("until ({until:?}) must come after start ({start:?})"),
        ));
    }
    Ok(Some(until))
}

/// A workload's kind and that kind's default size and think time.
fn kind_defaults(ctx: &Ctx<'_>, w: &RawWorkload) -> Result<(WorkloadKind, u64, &'static str)> {
    Ok(match w.kind.get_ref().as_str() {
        "download" => (WorkloadKind::Download, 320 * 1024, "0s"),
        "upload" => (WorkloadKind::Upload, 1 << 20, "0s"),
        "echo" => (WorkloadKind::Echo, 320 * 1024, "0s"),
        // Seed 004's web clients: 320 KiB with 0-20 s think time.
        "web" => (WorkloadKind::Download, 320 * 1024, "0s-20s"),
        // Back-to-back downloads.
        "bulk" => (WorkloadKind::Download, 5 << 20, "0s"),
        "probe" => (WorkloadKind::Probe, 0, "0s"),
        "trace" => (WorkloadKind::Trace, 0, "0s"),
        "stream" => (WorkloadKind::Stream, 0, "0s"),
        other => {
            return Err(ctx.err(
                w.kind.span(),
                format!(
                    "unknown workload kind {other:?} (download, upload, echo, web, bulk, \
                     probe, trace, stream)"
                ),
            ))
        }
    })
}

/// A probe workload's probes per transfer and time between them (the
/// defaults for other kinds, which may not set them).
fn probe_settings(ctx: &Ctx<'_>, w: &RawWorkload, kind: WorkloadKind) -> Result<(u32, Duration)> {
    let probes = match &w.probes {
        None => 100,
        Some(p) if *p.get_ref() == 0 || u64::from(*p.get_ref()) > crate::traffic::MAX_PROBES => {
            return Err(ctx.err(p.span(), "probes must be 1 to 1000000"))
        }
        Some(p) => *p.get_ref(),
    };
    let probe_interval = ctx.duration(&w.interval, Duration::from_millis(100))?;
    if probe_interval.is_zero() || probe_interval > Duration::from_secs(3600) {
        let span = w.interval.as_ref().map_or(w.kind.span(), |i| i.span());
        return Err(ctx.err(span, "interval must be between 1 ms and 1 h"));
    }
    if kind != WorkloadKind::Probe && (w.probes.is_some() || w.interval.is_some()) {
        let span = w
            .probes
            .as_ref()
            .map_or_else(|| w.kind.span(), |p| p.span());
        return Err(ctx.err(span, "`probes` and `interval` belong to kind = \"probe\""));
    }
    Ok((probes, probe_interval))
}

/// A trace workload's schedule, read from its file (relative to `base`);
/// empty for other kinds, which may not name one.
fn trace_of(
    ctx: &Ctx<'_>,
    w: &RawWorkload,
    kind: WorkloadKind,
    base: &Path,
) -> Result<Vec<(Duration, u32)>> {
    match (&w.trace, kind) {
        (Some(t), WorkloadKind::Trace) => {
            let path = base.join(t.get_ref());
            let cannot = |m: String| {
                ctx.err(
                    t.span(),
                    format!("cannot read trace {}: {m}", path.display()),
                )
            };
            check_small_file(&path, MAX_TRACE_FILE_LEN).map_err(cannot)?;
            let text = std::fs::read_to_string(&path).map_err(|e| cannot(e.to_string()))?;
            crate::traffic::read_trace(&text, &path.display().to_string())
                .map_err(|m| ctx.err(t.span(), m))
        }
        (None, WorkloadKind::Trace) => Err(ctx.err(
            w.kind.span(),
            "kind = \"trace\" needs `trace = \"FILE.csv\"`",
        )),
        (Some(t), _) => Err(ctx.err(t.span(), "`trace` belongs to kind = \"trace\"")),
        (None, _) => Ok(Vec::new()),
    }
}

/// A stream workload's duration: 1 ms to 1 h and, with its margin,
/// within `transfer_timeout`. Other kinds may not set one, nor a stream a
/// size.
fn stream_duration(
    ctx: &Ctx<'_>,
    w: &RawWorkload,
    kind: WorkloadKind,
    transfer_timeout: Duration,
) -> Result<Duration> {
    let stream_duration = ctx.duration(&w.duration, Duration::from_secs(60))?;
    match (&w.duration, kind) {
        (Some(d), WorkloadKind::Stream)
            if stream_duration.as_millis() == 0
                || stream_duration.as_millis() > u128::from(crate::stream::MAX_STREAM_MS) =>
        {
            return Err(ctx.err(d.span(), "duration must be between 1 ms and 1 h"));
        }
        (d, WorkloadKind::Stream) if stream_duration + STREAM_MARGIN > transfer_timeout => {
            let span = d.as_ref().map_or(w.kind.span(), |d| d.span());
            return Err(ctx.err(
                span,
                format!(
                    "a {stream_duration:?} stream cannot finish within transfer_timeout \
                     ({transfer_timeout:?}; allow {STREAM_MARGIN:?} more for the circuit)"
                ),
            ));
        }
        (Some(d), k) if k != WorkloadKind::Stream => {
            return Err(ctx.err(d.span(), "`duration` belongs to kind = \"stream\""));
        }
        _ => {}
    }
    if kind == WorkloadKind::Stream && w.size.is_some() {
        let span = w.size.as_ref().map_or(w.kind.span(), |s| s.span());
        return Err(ctx.err(
            span,
            "a stream has no size: it runs for `duration` as fast as the circuit goes",
        ));
    }
    Ok(stream_duration)
}

/// A think time: `2s`, or a range `0s-20s` (uniform).
fn parse_think(s: &str) -> std::result::Result<(Duration, Duration), String> {
    let (lo, hi) = match s.split_once('-') {
        Some((a, b)) => (a, b),
        None => (s, s),
    };
    let lo = parse_duration(lo.trim()).map_err(|e| e.to_string())?;
    let hi = parse_duration(hi.trim()).map_err(|e| e.to_string())?;
    if lo > hi {
        return Err(format!("think range {s:?} goes backwards"));
    }
    Ok((lo, hi))
}
