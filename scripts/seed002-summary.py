#!/usr/bin/env python3
"""Summarise a seed 002 run in the paper's terms (tables 1, 2, 4, 5, 6).

seed002-exp1 (stream workloads only): per variant, the network throughput
(the eight streams' throughput summed per repetition), the circuit
throughput (the mean per stream: network / 8; the paper's tables divide by
6, see docs/results/seed002.md), the degradation against the same
transport without drops, the mean latency of the streams' records (sampled
every 100 ms), and the effective drop rate (packets the links' loss model
dropped over all packets on all links, as the paper counts it; queue drops
at the bottleneck are given apart).

seed002-exp3 (`base` and `loaded` probes, `bulk` stream): per variant, the
bulk stream's throughput, the circuit delay (mean delay of the `loaded`
probes) and the base delay (mean of the `base` probes).

Each value is a mean with a 95% Student-t confidence interval, as the
paper's: over repetitions for network throughput and the drop rate, over
streams (8 per repetition) for circuit throughput and latency, over
repetitions (per-repetition means) for exp3's delays. Failed transfers are
left out and counted.

Usage: scripts/seed002-summary.py RUN_DIR [--markdown]
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
    for r in records:
        if r["kind"] == "stream":
            by_variant[r["variant"]].append(r)
    rows = []
    for v, rs in by_variant.items():
        ok = [r for r in rs if r.get("error") is None]
        failed = len(rs) - len(ok)
        per_rep = defaultdict(list)
        for r in ok:
            per_rep[r["repetition"]].append(kib_s(r))
        n_streams = max((len(x) for x in per_rep.values()), default=0)
        # A repetition missing a stream has no network throughput.
        network = [sum(x) for x in per_rep.values() if len(x) == n_streams]
        circuit = [kib_s(r) for r in ok]
        latency = [statistics.fmean(r["probe_latency_ms"]) for r in ok if r["probe_latency_ms"]]
        eff, queue = [], []
        for rep in reps:
            if rep["variant"] != v or not rep.get("link_packets"):
                continue
            packets = sum(l["packets"] for l in rep["link_packets"])
            eff.append(100 * sum(l["lost"] for l in rep["link_packets"]) / packets)
            queue.append(100 * sum(l["queue_dropped"] for l in rep["link_packets"]) / packets)
        rows.append({
            "transport": params(v).get("transport", "tls"),
            "drops": drops_of(v),
            "network": mean_ci(network),
            "circuit": mean_ci(circuit),
            "latency": mean_ci(latency),
            "effective": mean_ci(eff),
            "queue": mean_ci(queue),
            "failed": failed,
            "reps": len(per_rep),
        })
    base = {r["transport"]: r for r in rows if r["drops"] == "none"}
    for r in rows:
        b = base.get(r["transport"])
        r["degradation"] = 100 * (1 - r["circuit"][0] / b["circuit"][0]) if b else math.nan
        r["latency_increase"] = 100 * (r["latency"][0] / b["latency"][0] - 1) if b else math.nan
    order = {"none": 0, "remaining": 1, "shared": 2}
    transports = ["dtls-utcp", "tls", "pctcp", "quic", "quic-conn-per-circuit"]
    rows.sort(key=lambda r: (transports.index(r["transport"]) if r["transport"] in transports else 9,
                             order[r["drops"]]))
    return rows


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
        base = [statistics.fmean(r["probe_latency_ms"]) for r in ok.get("base", [])]
        rows.append({
            "transport": params(v).get("transport", "tls"),
            "bulk": mean_ci(bulk),
            "loaded": mean_ci(loaded),
            "base": mean_ci(base),
            "failed": failed,
            "reps": len(ok.get("bulk", [])),
        })
    transports = ["tls", "dtls-utcp", "pctcp", "quic", "quic-conn-per-circuit"]
    rows.sort(key=lambda r: transports.index(r["transport"]) if r["transport"] in transports else 9)
    return rows


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        sys.exit(__doc__)
    records, reps = load(args[0])
    if any(r["workload"] == "loaded" for r in records):
        rows = exp3(records)
        print("| transport | bulk throughput (KiB/s) | circuit delay (ms) | base delay (ms) | runs | failed |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['transport']} | {fmt(*r['bulk'])} | {fmt(*r['loaded'])} | "
                  f"{fmt(*r['base'])} | {r['reps']} | {r['failed']} |")
        return
    rows = exp1(records, reps)
    print("| transport | drops | network throughput (KiB/s) | circuit throughput (KiB/s) "
          "| degradation | latency (ms) | latency increase | effective drop rate | queue drops | runs | failed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['transport']} | {r['drops']} | {fmt(*r['network'])} | {fmt(*r['circuit'], 1)} | "
              f"{r['degradation']:.0f} % | {fmt(*r['latency'])} | {r['latency_increase']:.1f} % | "
              f"{fmt(*r['effective'], 3)} % | {fmt(*r['queue'], 2)} % | {r['reps']} | {r['failed']} |")


if __name__ == "__main__":
    main()
