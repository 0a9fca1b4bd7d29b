#!/usr/bin/env python3
"""A table of every transport against a baseline transport, for each
combination of a run's other matrix parameters: per workload, the median
TTFB and TTLB of each transport with the repetitions counted, and each
transport's ratio to the baseline's median with a 95% bootstrap confidence
interval (4000 resamples, percentile). Made for seed 000's presets with C
tor (seed000-s1-ctor, seed000-s3-ctor), usable on any run whose matrix has
`transport`.

Repetitions that ran on a saturated CPU are left out and counted (they
measured the machine; `lab run --resume --redo-saturated` runs them
again), as are failed transfers.

With --alone, runs made beside others (`lab run --jobs`) are left out
(`lab run --resume --redo-shared` runs them again alone).

The interval resamples transfers as independent draws, which fits one
transfer per workload and repetition (seed000-s1, -s2). Where a workload
makes several per repetition (the light and bulk clients of seed000-s3 and
-s4), they share the repetition's network and are not independent:
--cluster draws repetitions instead, the same draw for both transports
(repetition r of every variant has the same seed), over the repetitions
both have, and pools their transfers.

With --pool, every workload of a variant is one row ("all"), for clients
that do the same thing (seed000-s2's two); use it with --cluster, since a
repetition then has a transfer of each.

Usage: scripts/transport-table.py RUN_DIR [--baseline tls] [--markdown] [--alone] [--cluster] [--pool]
Standard library only.
"""
import argparse
import json
import statistics
from collections import defaultdict

from bootstrap import paired_cluster_ratio_ci, ratio_ci


def split(variant):
    """(transport, the other parameters as one string) of a label."""
    params = dict(p.split("=", 1) for p in variant.split())
    transport = params.pop("transport", "tls")
    rest = " ".join(f"{k.split(':')[0]}={v}" for k, v in sorted(params.items()))
    return transport, rest


def load(run, alone=False, pool=False):
    """With alone, runs made beside others (`lab run --jobs`) are left out
    too, uncounted; with pool, every workload counts as one, "all"."""
    saturated = set()
    beside = set()
    with open(f"{run}/repetitions.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r.get("cpu_saturated"):
                saturated.add((r["variant"], r["repetition"]))
            if alone and r.get("jobs", 1) > 1:
                beside.add((r["variant"], r["repetition"]))
    # data[(parameters, workload, transport)][metric] = values in file order
    data = defaultdict(lambda: defaultdict(list))
    # by_rep[(parameters, workload, transport)][metric][repetition] = values
    by_rep = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    reps = defaultdict(set)
    left_out = defaultdict(int)
    failed = defaultdict(int)
    with open(f"{run}/records.jsonl") as f:
        for line in f:
            r = json.loads(line)
            transport, rest = split(r["variant"])
            key = (rest, "all" if pool else r["workload"], transport)
            if (r["variant"], r["repetition"]) in beside:
                continue
            if (r["variant"], r["repetition"]) in saturated:
                left_out[key] += 1
                continue
            if r.get("error") or r.get("ttlb_ms") is None:
                failed[key] += 1
                continue
            for metric in ("ttfb", "ttlb"):
                data[key][metric].append(r[f"{metric}_ms"])
                by_rep[key][metric][r["repetition"]].append(r[f"{metric}_ms"])
            reps[key].add(r["repetition"])
    return data, by_rep, reps, left_out, failed


def ratio_cell(data, by_rep, key, base_key, metric, args):
    """The table cell of key's median against base_key's: ratio [95% CI],
    bold in markdown where the interval excludes 1; "-" with no data."""
    xs, base = data[key][metric], data[base_key][metric]
    if not base:
        return "-"
    if args.cluster:
        a, b = by_rep[key][metric], by_rep[base_key][metric]
        common = sorted(set(a) & set(b))
        if not common:
            return "-"
        if len(common) < 2:
            return f"{statistics.median(xs) / statistics.median(base):.2f} (one repetition)"
        r, lo, hi = paired_cluster_ratio_ci(a, b, common)
    else:
        r, lo, hi = ratio_ci(xs, base)
    text = f"{r:.2f} [{lo:.2f}, {hi:.2f}]"
    return f"**{text}**" if args.markdown and (lo > 1 or hi < 1) else text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run")
    ap.add_argument("--baseline", default="tls")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument(
        "--alone",
        action="store_true",
        help="only runs made alone (jobs = 1), not beside others (lab run --jobs)",
    )
    ap.add_argument(
        "--cluster",
        action="store_true",
        help="paired bootstrap over repetitions, for workloads with several transfers per repetition",
    )
    ap.add_argument(
        "--pool",
        action="store_true",
        help='every workload of a variant as one row ("all"), for clients that do the same',
    )
    args = ap.parse_args()
    data, by_rep, reps, left_out, failed = load(args.run, args.alone, args.pool)
    groups = sorted({(rest, w) for (rest, w, _) in data})
    transports = sorted({t for (_, _, t) in data}, key=lambda t: (t != args.baseline, t))
    for metric in ("ttfb", "ttlb"):
        if args.markdown:
            head = ["parameters", "workload"]
            for t in transports:
                head.append(f"{t} {metric.upper()} ms (reps)")
                if t != args.baseline:
                    head.append(f"{t} / {args.baseline}")
            print("| " + " | ".join(head) + " |")
            print("|" + "---|" * len(head))
        else:
            print(f"\n{metric.upper()} (ms): median (repetitions), ratio to {args.baseline} [95% CI]")
        for rest, w in groups:
            cells = [rest, w]
            for t in transports:
                xs = data[(rest, w, t)][metric]
                if not xs:
                    cells.append("-")
                    if t != args.baseline:
                        cells.append("-")
                    continue
                cells.append(f"{statistics.median(xs):.0f} ({len(reps[(rest, w, t)])})")
                if t != args.baseline:
                    key, base_key = (rest, w, t), (rest, w, args.baseline)
                    cells.append(ratio_cell(data, by_rep, key, base_key, metric, args))
            if args.markdown:
                print("| " + " | ".join(cells) + " |")
            else:
                print("  " + "  ".join(cells))
    dropped = sum(left_out.values())
    if dropped:
        print(f"\n{dropped} transfers of repetitions on a saturated CPU left out")
    for key, n in sorted(failed.items()):
        print(f"{n} failed transfer(s) left out: {key}")


if __name__ == "__main__":
    main()
