#!/usr/bin/env python3
"""Summarise a seed 003 run (seed003-downloads or seed003-trace): per
variant, the light clients' time to first byte and time per KB, or the
trace's per-message delay, the heavy clients' goodput, relay CPU and peak
memory, the relay hosts' TCP retransmission timeouts, and Torchestra's
moves; each median with a 95% bootstrap confidence
interval, and the ratio of medians against "Normal Tor" (tls, round robin)
and "Prioritized Tor" (tls, EWMA) with a 95% bootstrap interval (4000
resamples, percentile). Variants that set more matrix parameters (preset
seed003-ttfb) compare with tls at the same settings.

Workloads named `light-*` (downloads) or `interactive` (trace) are light,
`heavy-*` heavy; every light (or heavy) workload of a variant is pooled.
Failed transfers are left out and counted.

The default bootstrap resamples values as independent draws. A variant's
light (or heavy) transfers of one repetition share its network, so they
are not independent: --cluster draws repetitions instead (the same draw
for a variant and its baseline, whose repetition r has the same seed) and
pools their values, for the medians' intervals and the ratios'.

Usage: scripts/seed003-summary.py RUN_DIR [--markdown] [--cluster]
Standard library only.
"""
import glob
import json
import os
import random
import statistics
import sys
from collections import defaultdict

from bootstrap import cluster_ci, ratio_ci_by_repetition

RESAMPLES = 4000


def median_ci(xs, seed=1):
    rng = random.Random(seed)
    boot = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(RESAMPLES))
    return statistics.median(xs), boot[int(0.025 * RESAMPLES)], boot[int(0.975 * RESAMPLES) - 1]


def ratio_ci(a, b, seed=2):
    rng = random.Random(seed)
    boot = sorted(
        statistics.median(rng.choices(a, k=len(a))) / m
        for _ in range(RESAMPLES)
        if (m := statistics.median(rng.choices(b, k=len(b)))) > 0
    )
    point = statistics.median(a) / statistics.median(b)
    n = len(boot)  # resamples whose baseline median is 0 are left out
    return point, boot[int(0.025 * n)], boot[int(0.975 * n) - 1]


def label(variant):
    p = dict(kv.split("=", 1) for kv in variant.split())
    out = f"{p.get('transport', 'tls')}, {p.get('scheduler', 'ewma')}"
    for key, value in sorted(p.items()):
        if key not in ("transport", "scheduler"):
            out += f", {key.replace('_', ' ')} {value}"
    return out


def baseline(v, scheduler):
    """The tls variant with `scheduler` and v's other settings."""
    parts = v.split(", ")
    return ", ".join(["tls", scheduler] + parts[2:])


RELAY_HOSTS = ("guard", "middle", "exit")


def load(run):
    """(metrics, by_rep, failed): metrics[variant][metric] lists the values
    in the run's order, by_rep[variant][metric][repetition] the same
    values by repetition."""
    metrics = defaultdict(lambda: defaultdict(list))
    by_rep = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    failed = defaultdict(int)

    def add(v, metric, rep, x):
        metrics[v][metric].append(x)
        by_rep[v][metric][rep].append(x)

    with open(os.path.join(run, "records.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            v, rep = label(r["variant"]), r["repetition"]
            if r.get("error") or r.get("timed_out"):
                failed[v] += 1
                continue
            w = r["workload"]
            if w.startswith("light"):
                add(v, "light TTFB (ms)", rep, r["ttfb_ms"])
                which = "first" if r["index"] == 0 else "second"
                add(v, f"light TTFB, {which} download (ms)", rep, r["ttfb_ms"])
                add(v, "light time per KB (ms)", rep, r["ttlb_ms"] / (r["size"] / 1000))
            elif w.startswith("heavy"):
                add(v, "heavy goodput (KB/s)", rep, r["size"] / 1000 / (r["ttlb_ms"] / 1000))
            elif r.get("kind") == "trace":
                for d in r.get("probe_latency_ms") or []:
                    add(v, "trace delay per message (ms)", rep, d)
    with open(os.path.join(run, "repetitions.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            v, rep = label(r["variant"]), r["repetition"]
            add(v, "relay CPU (s, sum of 3)", rep, sum(c for _, c in r["relay_cpu_s"]))
            add(v, "relay peak RSS (MiB, max)", rep,
                max(m for _, m in r["relay_peak_rss"]) / 2**20)
            counters = [c for c in r.get("tcp_counters", []) if c["host"] in RELAY_HOSTS]
            if counters:
                add(v, "relay hosts' TCP timeouts (sum of 3)", rep,
                    sum(c["timeouts"] for c in counters))
                add(v, "relay hosts' TCP retransmitted segments (sum of 3)", rep,
                    sum(c["retrans_segs"] for c in counters))
    return metrics, by_rep, failed


def moves(run):
    """Torchestra moves per variant label: (exit's, middle's) log lines."""
    out = defaultdict(lambda: [0, 0])
    variants = {}
    with open(os.path.join(run, "repetitions.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            variants[(r["repetition"], r["variant"])] = label(r["variant"])
    for d in glob.glob(os.path.join(run, "raw", "rep*-v*")):
        for i, relay in enumerate(["exit", "middle"]):
            path = os.path.join(d, f"{relay}.log")
            if not os.path.exists(path):
                continue
            with open(path, errors="replace") as f:
                n = sum("torchestra: moving a circuit" in l for l in f)
            out[os.path.basename(d)][i] += n
    return out


def main():
    run = sys.argv[1]
    md = "--markdown" in sys.argv
    cluster = "--cluster" in sys.argv
    metrics, by_rep, failed = load(run)
    order = sorted(metrics, key=lambda v: (
        v.split(", ")[2:], v.split(", ")[1], v.split(", ")[0] != "tls", v))
    names = sorted({m for v in metrics.values() for m in v}, key=lambda m: (
        not m.startswith("light") and not m.startswith("trace"), not m.startswith("heavy"), m))
    for m in names:
        if md:
            print(f"\n**{m}**\n")
            print("| variant | n | median [95% CI] | / tls, round robin [95% CI] | / tls, ewma [95% CI] |")
            print("|---|---|---|---|---|")
        else:
            print(f"\n{m}")
        for v in order:
            xs = metrics[v].get(m)
            if not xs:
                continue
            med, lo, hi = cluster_ci(by_rep[v][m]) if cluster else median_ci(xs)
            cells = [f"{med:.4g} [{lo:.4g}, {hi:.4g}]"]
            for sched in ("round-robin", "ewma"):
                base = baseline(v, sched)
                b = metrics.get(base, {}).get(m)
                ratio = None
                if b and v != base and statistics.median(b) > 0:
                    if cluster:
                        ratio = ratio_ci_by_repetition(by_rep[v][m], by_rep[base][m])
                    else:
                        ratio = ratio_ci(xs, b)
                if ratio:
                    r, rlo, rhi = ratio
                    cells.append(f"{r:.3f} [{rlo:.3f}, {rhi:.3f}]")
                else:
                    cells.append("")
            if md:
                print(f"| {v} | {len(xs)} | " + " | ".join(cells) + " |")
            else:
                print(f"  {v:32} n={len(xs):3}  " + "  ".join(cells))
    if failed:
        print("\nfailed transfers:", dict(failed))
    mv = moves(run)
    if any(sum(x) for x in mv.values()):
        print("\nTorchestra moves (exit, middle) per repetition directory:")
        for d in sorted(mv):
            if sum(mv[d]):
                print(f"  {d}: {mv[d][0]}, {mv[d][1]}")


if __name__ == "__main__":
    main()
