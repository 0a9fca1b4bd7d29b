#!/usr/bin/env python3
"""Seed 001's Shadow-style metrics for a `seed001-toy` run, each transport
against a baseline (tls by default): for the web clients' 320 KiB downloads
the median time to first byte, the median, 75th and 95th percentile time to
last byte (the thesis's "slowest 25% and 5%"), and the median over clients
of each client's median download time (its "about 20% better median");
for the bulk clients the median 5 MiB download time.

Random paths make repetitions differ far more than transfers within one,
and repetition r of every variant builds the same network from the same
seed, so the intervals come from a paired cluster bootstrap: 4000 times,
draw repetitions with replacement (the same draw for both transports),
pool their transfers and take the ratio of the statistic; 95% percentile
interval. Repetitions on a saturated CPU are left out (and counted), and so
are failed transfers (counted); a repetition left out for one transport is
left out for both.

Variants are named by their transport and other parameters ("tls",
"tls slow_start_after_idle=off"); --baseline names one, or a transport
that only one variant has.

Usage: scripts/seed001-toy-table.py RUN_DIR [--baseline tls] [--markdown]
Standard library only.
"""
import argparse
import json
import random
import statistics
import tomllib
from collections import defaultdict


def arm_of(variant):
    """A variant's short name: its transport, then its other parameters
    (for example "tls slow_start_after_idle=off")."""
    params = dict(p.split("=", 1) for p in variant.split())
    transport = params.pop("transport", "tls")
    return " ".join([transport] + [f"{k}={v}" for k, v in sorted(params.items())])


def pick_baseline(arms, wanted):
    """The arm named `wanted`, or the only arm whose transport it is."""
    if wanted in arms:
        return wanted
    matches = [a for a in arms if a.split()[0] == wanted]
    if len(matches) != 1:
        raise SystemExit(f"--baseline {wanted!r} names none or several of {sorted(arms)}")
    return matches[0]


def percentile(xs, k):
    """The k-th percentile of xs, interpolated between order statistics."""
    return statistics.quantiles(xs, n=100, method="inclusive")[k - 1]


def per_client_median(recs):
    """The median over clients (workload and repetition) of each client's
    median download time."""
    by_client = defaultdict(list)
    for r in recs:
        by_client[(r["workload"], r["repetition"])].append(r["ttlb_ms"])
    return statistics.median(statistics.median(v) for v in by_client.values())


# (label, record kind, statistic over a list of records)
METRICS = [
    ("web TTFB median", "web", lambda rs: statistics.median(r["ttfb_ms"] for r in rs)),
    ("web TTLB median", "web", lambda rs: statistics.median(r["ttlb_ms"] for r in rs)),
    ("web TTLB p75", "web", lambda rs: percentile([r["ttlb_ms"] for r in rs], 75)),
    ("web TTLB p95", "web", lambda rs: percentile([r["ttlb_ms"] for r in rs], 95)),
    ("web median of client medians", "web", per_client_median),
    ("bulk TTLB median", "bulk", lambda rs: statistics.median(r["ttlb_ms"] for r in rs)),
]


def workload_kinds(run):
    """Workload name -> "web" or "bulk", from the run's scenario.toml
    (records say only "download" for both)."""
    with open(f"{run}/scenario.toml", "rb") as f:
        scenario = tomllib.load(f)
    return {w["name"]: w["kind"] for w in scenario.get("workload", [])}


def load(run):
    """Records per transport and repetition (each with its workload's kind
    as `toy_kind`), the repetitions left out as saturated, and failed
    transfers per transport."""
    kinds = workload_kinds(run)
    saturated = set()
    with open(f"{run}/repetitions.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r.get("cpu_saturated"):
                saturated.add(r["repetition"])
    recs = defaultdict(lambda: defaultdict(list))
    failed = defaultdict(int)
    with open(f"{run}/records.jsonl") as f:
        for line in f:
            r = json.loads(line)
            t = arm_of(r["variant"])
            r["toy_kind"] = kinds.get(r["workload"])
            if r.get("error") or r.get("ttlb_ms") is None or r.get("timed_out"):
                failed[t] += 1
                continue
            recs[t][r["repetition"]].append(r)
    return recs, saturated, failed


def paired_ci(a, b, reps, stat, resamples=4000, seed=1):
    """stat(pooled a) / stat(pooled b) over `reps`, with a 95% paired
    cluster-bootstrap interval: (point, low, high)."""
    rng = random.Random(seed)

    def pooled(side, draw):
        return [r for rep in draw for r in side[rep]]

    point = stat(pooled(a, reps)) / stat(pooled(b, reps))
    boot = []
    for _ in range(resamples):
        draw = rng.choices(reps, k=len(reps))
        boot.append(stat(pooled(a, draw)) / stat(pooled(b, draw)))
    boot.sort()
    return point, boot[int(0.025 * resamples)], boot[int(0.975 * resamples) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run")
    ap.add_argument("--baseline", default="tls")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    recs, saturated, failed = load(args.run)
    baseline = pick_baseline(recs, args.baseline)
    transports = sorted(recs, key=lambda t: (t != baseline, t))
    # Only repetitions every transport finished, and none on a saturated CPU.
    reps = sorted(set.intersection(*(set(recs[t]) for t in transports)) - saturated)
    if not reps:
        raise SystemExit("no repetition that every transport finished")
    kinds = {
        t: {k: {rep: [r for r in recs[t][rep] if r["toy_kind"] == k] for rep in reps} for k in ("web", "bulk")}
        for t in transports
    }
    head = ["metric (ms)"] + [f"{t}" for t in transports]
    head += [f"{t} / {baseline} [95% CI]" for t in transports if t != baseline]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print("  ".join(head))
    for label, kind, stat in METRICS:
        cells = [label]
        for t in transports:
            pooled = [r for rep in reps for r in kinds[t][kind][rep]]
            cells.append(f"{stat(pooled):.0f}" if pooled else "-")
        base = kinds[baseline][kind]
        for t in transports:
            if t == baseline:
                continue
            point, lo, hi = paired_ci(kinds[t][kind], base, reps, stat)
            s = f"{point:.2f} [{lo:.2f}, {hi:.2f}]"
            cells.append(f"**{s}**" if args.markdown and (lo > 1 or hi < 1) else s)
        print(("| " + " | ".join(cells) + " |") if args.markdown else "  ".join(cells))
    counts = {t: sum(len(kinds[t]["web"][r]) for r in reps) for t in transports}
    bulk = {t: sum(len(kinds[t]["bulk"][r]) for r in reps) for t in transports}
    print(f"\n{len(reps)} repetitions; web downloads {counts}; bulk downloads {bulk}")
    if saturated:
        print(f"repetitions left out, saturated CPU: {sorted(saturated)}")
    for t, n in sorted(failed.items()):
        print(f"{n} failed transfer(s) left out: {t}")


if __name__ == "__main__":
    main()
