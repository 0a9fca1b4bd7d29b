#!/usr/bin/env python3
"""Summarise a seed 002 run in the paper's terms (tables 1, 2, 4, 5, 6).

seed002-exp1 (stream workloads only): per variant, the network throughput
(the eight streams' throughput summed per repetition), the circuit
throughput (the mean per stream: network / 8; the paper's tables divide by
6, see docs/results/seed002.md), the degradation against the same
transport without drops, the latency (the mean delay of the probes that
travel beside the streams, the paper's measure), the streams' own records'
mean delay (sampled every 100 ms), and the effective drop rate (packets the links' loss model
dropped over all packets on all links, as the paper counts it; queue drops
at the bottleneck are given apart).

seed002-exp3 (`base` and `loaded` probes, `bulk` stream): per variant, the
bulk stream's throughput, the circuit delay (mean delay of the `loaded`
probes; and the median and 99th percentile of all of them, pooled) and
the base delay (mean of the `base` probes).

Each value is a mean with a 95% Student-t confidence interval over
repetitions, as the paper's (the streams of one repetition share the
bottleneck, so they are not independent samples): of the per-repetition
network throughput, circuit throughput (network / 8), mean latency and drop
rates; for exp3, of each repetition's bulk throughput and mean probe
delays. A repetition with a failed stream has no network or circuit
throughput; failed transfers are counted. Prints Markdown tables.

Usage: scripts/seed002-summary.py RUN_DIR
Standard library only.
"""
import json
import math
import os
import statistics
import sys
from collections import defaultdict

# Two-sided 95% Student-t quantiles by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365,
       8: 2.306, 9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086,
       30: 2.042, 60: 2.000}


def t95(df):
    if df <= 0:
        return math.nan
    keys = sorted(k for k in T95 if k <= df)
    return T95[keys[-1]] if df < 120 else 1.96


def mean_ci(xs):
    """Mean and half-width of its 95% t interval (nan with one value)."""
    if not xs:
        return math.nan, math.nan
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, math.nan
    return m, t95(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def load(run):
    records = [json.loads(l) for l in open(os.path.join(run, "records.jsonl")) if l.strip()]
    reps = [json.loads(l) for l in open(os.path.join(run, "repetitions.jsonl")) if l.strip()]
    return records, reps


def params(variant):
    return dict(kv.split("=", 1) for kv in variant.split())


def drops_of(variant):
    p = params(variant)
    shared = p.get("loss:or5-or6", "0%") != "0%"
    remaining = any(k.startswith("loss:c1-") and v != "0%" for k, v in p.items())
    return "shared" if shared else "remaining" if remaining else "none"


def fmt(m, h, digits=0):
    if math.isnan(m):
        return "-"
    if math.isnan(h):
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {h:.{digits}f}"


def kib_s(r):
    """Throughput of one stream record in KiB/s (bytes over SOCKS success
    to last byte)."""
    return r["size"] / 1024 / (r["ttlb_ms"] / 1e3)


def exp1(records, reps):
    by_variant = defaultdict(list)
    probes = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r["kind"] == "stream":
            by_variant[r["variant"]].append(r)
        elif r["kind"] == "probe" and r.get("error") is None:
            probes[r["variant"]][r["repetition"]].extend(r["probe_latency_ms"])
    n_streams = len({r["workload"] for rs in by_variant.values() for r in rs})
    rows = []
    for v, rs in by_variant.items():
        failed = sum(1 for r in rs if r.get("error") is not None)
        per_rep = defaultdict(list)
        for r in rs:
            per_rep[r["repetition"]].append(r)
        network, stream_latency = [], []
        for rep_records in per_rep.values():
            ok = [r for r in rep_records if r.get("error") is None]
            if len(ok) == n_streams:
                network.append(sum(kib_s(r) for r in ok))
            samples = [x for r in ok for x in r["probe_latency_ms"]]
            if samples:
                stream_latency.append(statistics.fmean(samples))
        latency = [statistics.fmean(x) for x in probes[v].values() if x]
        eff, queue = [], []
        for rep in reps:
            if rep["variant"] != v or not rep.get("link_packets"):
                continue
            packets = sum(l["packets"] for l in rep["link_packets"])
            if packets == 0:
                continue
            eff.append(100 * sum(l["lost"] for l in rep["link_packets"]) / packets)
            queue.append(100 * sum(l["queue_dropped"] for l in rep["link_packets"]) / packets)
        rows.append({
            "transport": params(v).get("transport", "tls"),
            "drops": drops_of(v),
            "network": mean_ci(network),
            "circuit": mean_ci([x / n_streams for x in network]),
            "latency": mean_ci(latency),
            "stream_latency": mean_ci(stream_latency),
            "effective": mean_ci(eff),
            "queue": mean_ci(queue),
            "failed": failed,
            "reps": len(per_rep),
        })
    base = {r["transport"]: r for r in rows if r["drops"] == "none"}
    for r in rows:
        b = base.get(r["transport"])
        tput = b and b["circuit"][0] > 0
        lat = b and b["latency"][0] > 0
        r["degradation"] = 100 * (1 - r["circuit"][0] / b["circuit"][0]) if tput else math.nan
        r["latency_increase"] = 100 * (r["latency"][0] / b["latency"][0] - 1) if lat else math.nan
    order = {"none": 0, "remaining": 1, "shared": 2}
    transports = ["dtls-utcp", "tls", "pctcp", "quic", "quic-conn-per-circuit"]
    rows.sort(key=lambda r: (transports.index(r["transport"]) if r["transport"] in transports else 9,
                             order[r["drops"]]))
    return rows


def pct(x, digits=0):
    return "-" if math.isnan(x) else f"{x:.{digits}f} %"


def exp3(records):
    by_variant = defaultdict(lambda: defaultdict(list))
    for r in records:
        by_variant[r["variant"]][r["workload"]].append(r)
    rows = []
    for v, w in by_variant.items():
        failed = sum(1 for rs in w.values() for r in rs if r.get("error") is not None)
        ok = {k: [r for r in rs if r.get("error") is None] for k, rs in w.items()}
        bulk = [kib_s(r) for r in ok.get("bulk", [])]
        loaded = [statistics.fmean(r["probe_latency_ms"]) for r in ok.get("loaded", [])]
        pooled = sorted(x for r in ok.get("loaded", []) for x in r["probe_latency_ms"])
        base = [statistics.fmean(r["probe_latency_ms"]) for r in ok.get("base", [])]
        p = params(v)
        # Other matrix parameters (tcp_notsent_lowat, ...) follow the
        # transport's name.
        others = " ".join(f"{k}={x}" for k, x in sorted(p.items()) if k != "transport")
        rows.append({
            "transport": p.get("transport", "tls"),
            "label": p.get("transport", "tls") + (f" ({others})" if others else ""),
            "bulk": mean_ci(bulk),
            "loaded": mean_ci(loaded),
            "loaded_p50": statistics.median(pooled) if pooled else math.nan,
            "loaded_p99": pooled[int(0.99 * (len(pooled) - 1))] if pooled else math.nan,
            "base": mean_ci(base),
            "failed": failed,
            "reps": len(ok.get("bulk", [])),
        })
    transports = ["tls", "dtls-utcp", "pctcp", "quic", "quic-conn-per-circuit"]
    rows.sort(key=lambda r: (transports.index(r["transport"]) if r["transport"] in transports else 9,
                             r["label"]))
    return rows


def main():
    args = sys.argv[1:]
    if len(args) != 1 or args[0].startswith("-"):
        sys.exit(__doc__)
    records, reps = load(args[0])
    if any(r["workload"] == "loaded" for r in records):
        rows = exp3(records)
        print("| transport | bulk throughput (KiB/s) | circuit delay (ms) | median, 99th percentile (ms) "
              "| base delay (ms) | runs | failed |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['label']} | {fmt(*r['bulk'])} | {fmt(*r['loaded'])} | "
                  f"{fmt(r['loaded_p50'], math.nan)}, {fmt(r['loaded_p99'], math.nan)} | "
                  f"{fmt(*r['base'])} | {r['reps']} | {r['failed']} |")
        return
    rows = exp1(records, reps)
    print("| transport | drops | network throughput (KiB/s) | circuit throughput (KiB/s) "
          "| degradation | latency (ms) | latency increase | stream records' delay (ms) "
          "| effective drop rate | queue drops | runs | failed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['transport']} | {r['drops']} | {fmt(*r['network'])} | {fmt(*r['circuit'], 1)} | "
              f"{pct(r['degradation'])} | {fmt(*r['latency'])} | {pct(r['latency_increase'], 1)} | "
              f"{fmt(*r['stream_latency'])} | "
              f"{fmt(*r['effective'], 3)} % | {fmt(*r['queue'], 2)} % | {r['reps']} | {r['failed']} |")


if __name__ == "__main__":
    main()
