#!/usr/bin/env python3
"""Summarise a seed 004 run (seed004-local or seed004-scale) in the form of
the paper's Table 1: per variant (legs, leg scheduler), relay CPU as a
percentage of one core over each repetition (entry, middle, exit) and the
entry's CPU seconds per repetition (its total work: a repetition ends when
its transfers do, so faster variants have shorter ones), time to
first byte, and download time of the web (320 KiB) and bulk (1 MiB)
transfers, each as mean with a 95% bootstrap confidence interval of the
mean (4000 resamples, percentile), as the paper gives mean +- 95% CI;
medians too, and the share of the measured client's bytes each guard
delivered (how the scheduler spread the set over its legs).

Transfers: workloads named `web` or `web-*` are web, `bulk` or `bulk-*`
bulk; others (load) are left out. Relays: `g1`, `m1` and `exit` when the
run has them (seed004-local: the measured client's first leg, as the
paper shows one circuit's routers), else the mean over the relays whose
names start with `g`, `m` and `e` (seed004-scale). Failed transfers and
CPU-saturated repetitions are counted and left out.

A run that crosses transports (seed004-ctor: tls and C tor) gets a
transport column, and each transport's multi-path rows are set against
its own one-path row.

The default bootstrap resamples values as independent draws. The web and
bulk transfers of one repetition share its network, so they are not
independent: --cluster draws repetitions instead (the same draw for a
variant and its one-path baseline, whose repetition r has the same seed)
and pools their values, for the means' intervals and the ratios'.

Usage: scripts/seed004-table.py RUN_DIR [--markdown] [--cluster]
Standard library only.
"""
import json
import random
import statistics
import sys
from collections import defaultdict

from bootstrap import cluster_ci, ratio_ci_by_repetition

RESAMPLES = 4000


def mean_ci(xs, seed=1):
    rng = random.Random(seed)
    boot = sorted(statistics.fmean(rng.choices(xs, k=len(xs))) for _ in range(RESAMPLES))
    return statistics.fmean(xs), boot[int(0.025 * RESAMPLES)], boot[int(0.975 * RESAMPLES) - 1]


def ratio_ci(a, b, seed=2):
    """Ratio of the means of a and b, with a 95% bootstrap interval."""
    rng = random.Random(seed)
    boot = sorted(
        statistics.fmean(rng.choices(a, k=len(a))) / statistics.fmean(rng.choices(b, k=len(b)))
        for _ in range(RESAMPLES)
    )
    return statistics.fmean(a) / statistics.fmean(b), boot[int(0.025 * RESAMPLES)], boot[int(0.975 * RESAMPLES) - 1]


def label(variant):
    """(legs, leg scheduler, transport) of a variant."""
    p = dict(kv.split("=", 1) for kv in variant.split())
    return int(p.get("legs", "1")), p.get("leg_scheduler", "lowrtt"), p.get("transport", "tls")


def kind(workload):
    base = workload.split("-")[0]
    return base if base in ("web", "bulk") else None


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def relay_roles(names):
    if {"g1", "m1", "exit"} <= set(names):
        return {"entry": ["g1"], "middle": ["m1"], "exit": ["exit"]}
    return {
        "entry": [n for n in names if n.startswith("g")],
        "middle": [n for n in names if n.startswith("m")],
        "exit": [n for n in names if n.startswith("e")],
    }


def load(run):
    """(out, by_rep): out[variant][key] lists the values in the run's
    order, by_rep[variant][key][repetition] the same values by repetition."""
    reps = read_jsonl(f"{run}/repetitions.jsonl")
    records = read_jsonl(f"{run}/records.jsonl")
    saturated = {(r["variant"], r["repetition"]) for r in reps if r.get("cpu_saturated")}
    out = defaultdict(lambda: defaultdict(list))
    by_rep = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))

    def add(v, key, rep, x):
        out[v][key].append(x)
        by_rep[v][key][rep].append(x)

    for r in reps:
        v = r["variant"]
        if (v, r["repetition"]) in saturated:
            out[v]["saturated"].append(1)
            continue
        cpu = dict(r["relay_cpu_s"])
        for role, names in relay_roles(list(cpu)).items():
            if names and r["wall_s"] > 0:
                seconds = statistics.fmean(cpu[n] for n in names)
                add(v, f"cpu_{role}", r["repetition"], seconds / r["wall_s"] * 100)
                add(v, f"cpus_{role}", r["repetition"], seconds)
        # Bytes each guard sent to the measured client (seed004-local).
        to_op = {a: b for a, dst, b, _ in r["links"] if dst == "op" and a.startswith("g")}
        total = sum(to_op.values())
        for g, b in to_op.items():
            if total > 0:
                out[v][f"share_{g}"].append(100 * b / total)
    for t in records:
        v, k = t["variant"], kind(t["workload"])
        if k is None:
            continue
        if (v, t["repetition"]) in saturated:
            continue
        if t.get("error") or t.get("timed_out") or t.get("ttlb_ms") is None:
            out[v][f"failed_{k}"].append(1)
            continue
        add(v, f"ttfb_{k}", t["repetition"], t["ttfb_ms"] / 1000)
        add(v, f"dt_{k}", t["repetition"], t["ttlb_ms"] / 1000)
    return out, by_rep


def fmt(xs, digits, reps=None):
    """Mean [95% CI] of xs, by repetition where `reps` (repetition to
    values) is given."""
    if not xs:
        return "n/a"
    m, lo, hi = cluster_ci(reps, statistics.fmean) if reps else mean_ci(xs)
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    run = sys.argv[1]
    cluster = "--cluster" in sys.argv
    data, by_rep = load(run)
    order = sorted(
        data,
        key=lambda v: (label(v)[2] == "ctor", not label(v)[1].startswith("round-robin"), label(v)),
    )
    # A transport column (and one-path baselines per transport) when the
    # run crosses transports (seed004-ctor: tls and C tor).
    several = len({label(v)[2] for v in order}) > 1
    first = ["transport"] if several else []
    cols = [
        ("legs", None),
        ("scheduler", None),
        ("CPU entry %", ("cpu_entry", 1)),
        ("CPU middle %", ("cpu_middle", 1)),
        ("CPU exit %", ("cpu_exit", 1)),
        ("CPU s entry", ("cpus_entry", 2)),
        ("TTFB web s", ("ttfb_web", 3)),
        ("TTFB bulk s", ("ttfb_bulk", 3)),
        ("DT web s", ("dt_web", 3)),
        ("DT bulk s", ("dt_bulk", 3)),
    ]
    print("| " + " | ".join(first + [c for c, _ in cols]) + " | median DT web / bulk s | guard shares of op's bytes % | n web / bulk | failed | saturated reps |")
    print("|" + "---|" * (len(first) + len(cols) + 5))
    ratios = []
    for v in order:
        legs, sched, transport = label(v)
        d = data[v]
        cells = ([transport] if several else []) + [str(legs), sched]
        for _, spec in cols[2:]:
            key, digits = spec
            cells.append(fmt(d[key], digits, by_rep[v][key] if cluster else None))
        med = " / ".join(
            f"{statistics.median(d[k]):.3f}" if d[k] else "n/a" for k in ("dt_web", "dt_bulk")
        )
        shares = " / ".join(
            f"{statistics.fmean(d[k]):.0f}" for k in sorted(d) if k.startswith("share_") and d[k]
        )
        n = f"{len(d['dt_web'])} / {len(d['dt_bulk'])}"
        failed = len(d["failed_web"]) + len(d["failed_bulk"])
        cells += [med, shares or "n/a", n, str(failed), str(len(d["saturated"]))]
        print("| " + " | ".join(cells) + " |")
        base_v = next(
            (b for b in order if label(b)[0] == 1 and label(b)[2] == transport), None
        )
        if base_v is not None and legs > 1:
            base = data[base_v]
            row = ([transport] if several else []) + [str(legs), sched]
            for key in ("cpu_entry", "cpus_entry", "ttfb_web", "ttfb_bulk", "dt_web", "dt_bulk"):
                ratio = None
                if d[key] and base[key]:
                    if cluster:
                        ratio = ratio_ci_by_repetition(
                            by_rep[v][key], by_rep[base_v][key], statistics.fmean)
                    else:
                        ratio = ratio_ci(d[key], base[key])
                if ratio:
                    r, lo, hi = ratio
                    bold = "**" if hi < 1 or lo > 1 else ""
                    row.append(f"{bold}{r:.2f} [{lo:.2f}, {hi:.2f}]{bold}")
                else:
                    row.append("n/a")
            ratios.append(row)
    if ratios:
        print()
        how = "by repetition" if cluster else "of transfers"
        print(f"Against one path (ratio of means, 95% bootstrap interval {how}; bold where it excludes 1):")
        print()
        print("| " + " | ".join(first + ["legs", "scheduler", "CPU % entry", "CPU s entry", "TTFB web", "TTFB bulk", "DT web", "DT bulk"]) + " |")
        print("|" + "---|" * (len(first) + 8))
        for row in ratios:
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
