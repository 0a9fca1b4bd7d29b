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

Usage: scripts/transport-table.py RUN_DIR [--baseline tls] [--markdown] [--alone]
Standard library only.
"""
import argparse
import json
import statistics
from collections import defaultdict

from bootstrap import ratio_ci


def split(variant):
    """(transport, the other parameters as one string) of a label."""
    params = dict(p.split("=", 1) for p in variant.split())
    transport = params.pop("transport", "tls")
    rest = " ".join(f"{k.split(':')[0]}={v}" for k, v in sorted(params.items()))
    return transport, rest


def load(run, alone=False):
    """With alone, runs made beside others (`lab run --jobs`) are left out
    too, uncounted."""
    saturated = set()
    beside = set()
    with open(f"{run}/repetitions.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r.get("cpu_saturated"):
                saturated.add((r["variant"], r["repetition"]))
            if alone and r.get("jobs", 1) > 1:
                beside.add((r["variant"], r["repetition"]))
    data = defaultdict(lambda: defaultdict(list))
    reps = defaultdict(set)
    left_out = defaultdict(int)
    failed = defaultdict(int)
    with open(f"{run}/records.jsonl") as f:
        for line in f:
            r = json.loads(line)
            transport, rest = split(r["variant"])
            key = (rest, r["workload"], transport)
            if (r["variant"], r["repetition"]) in beside:
                continue
            if (r["variant"], r["repetition"]) in saturated:
                left_out[key] += 1
                continue
            if r.get("error") or r.get("ttlb_ms") is None:
                failed[key] += 1
                continue
            data[key]["ttfb"].append(r["ttfb_ms"])
            data[key]["ttlb"].append(r["ttlb_ms"])
            reps[key].add(r["repetition"])
    return data, reps, left_out, failed


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
    args = ap.parse_args()
    data, reps, left_out, failed = load(args.run, args.alone)
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
            base = data[(rest, w, args.baseline)][metric]
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
                    if base:
                        r, lo, hi = ratio_ci(xs, base)
                        bold = args.markdown and (lo > 1 or hi < 1)
                        s = f"{r:.2f} [{lo:.2f}, {hi:.2f}]"
                        cells.append(f"**{s}**" if bold else s)
                    else:
                        cells.append("-")
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
