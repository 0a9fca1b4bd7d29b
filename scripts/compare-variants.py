#!/usr/bin/env python3
"""Compare two variants of a lab run that the report does not put side by
side (it compares each variant with its TLS counterpart of the same other
parameters): per workload, the median TTFB and TTLB of each, and the ratio
A/B with a 95% bootstrap confidence interval (4000 resamples, percentile).

Usage: scripts/compare-variants.py RUN_DIR "VARIANT A" "VARIANT B" [--pool] [--cluster]
(variant labels as in records.jsonl, e.g. "congestion=cubic
loss:guard-middle=1% transport=quic"). Failed transfers are left out and
counted. --pool counts every workload as one ("all"); --cluster draws
repetitions instead of transfers, the same draw for A and B (as
transport-table.py --cluster). Standard library only.
"""
import json
import statistics
import sys
from collections import defaultdict

from bootstrap import ratio_ci, ratio_ci_by_repetition


def load(run, pool=False):
    """(data, by_rep, failed): data[(variant, workload)][metric] lists the
    values, by_rep[(variant, workload)][metric][repetition] the same by
    repetition."""
    data = defaultdict(lambda: defaultdict(list))
    by_rep = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    failed = defaultdict(int)
    with open(f"{run}/records.jsonl") as f:
        for line in f:
            r = json.loads(line)
            key = (r["variant"], "all" if pool else r["workload"])
            if r.get("error"):
                failed[key] += 1
                continue
            for metric in ("ttfb", "ttlb"):
                data[key][metric].append(r[f"{metric}_ms"])
                by_rep[key][metric][r["repetition"]].append(r[f"{metric}_ms"])
    return data, by_rep, failed


def main():
    flags = {a for a in sys.argv[1:] if a.startswith("--")}
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 3 or not flags <= {"--pool", "--cluster"}:
        sys.exit(__doc__)
    run, va, vb = args
    data, by_rep, failed = load(run, "--pool" in flags)
    workloads = sorted({w for (v, w) in data if v in (va, vb)})
    if not workloads:
        sys.exit(f"no records of {va!r} or {vb!r} in {run}")
    print(f"A = {va}\nB = {vb}")
    for w in workloads:
        for metric in ("ttfb", "ttlb"):
            a, b = data[(va, w)][metric], data[(vb, w)][metric]
            if not a or not b:
                print(f"{w} {metric}: no data for one side")
                continue
            if "--cluster" in flags:
                ratio = ratio_ci_by_repetition(by_rep[(va, w)][metric], by_rep[(vb, w)][metric])
                if ratio is None:
                    print(f"{w} {metric}: fewer than two repetitions in common")
                    continue
                r, lo, hi = ratio
            else:
                r, lo, hi = ratio_ci(a, b)
            print(
                f"{w:8s} {metric}: median A {statistics.median(a):9.1f} ms (n {len(a)}), "
                f"B {statistics.median(b):9.1f} ms (n {len(b)}), A/B {r:.3f} [95% CI {lo:.3f}, {hi:.3f}]"
            )
        for v in (va, vb):
            if failed[(v, w)]:
                print(f"{w}: {failed[(v, w)]} failed transfer(s) of {v} left out")


if __name__ == "__main__":
    main()
