#!/usr/bin/env python3
"""Compare two variants of a lab run that the report does not put side by
side (it compares each variant with its TLS counterpart of the same other
parameters): per workload, the median TTFB and TTLB of each, and the ratio
A/B with a 95% bootstrap confidence interval (4000 resamples, percentile).

Usage: scripts/compare-variants.py RUN_DIR "VARIANT A" "VARIANT B"
(variant labels as in records.jsonl, e.g. "congestion=cubic
loss:guard-middle=1% transport=quic"). Failed transfers are left out and
counted. Standard library only.
"""
import json
import statistics
import sys
from collections import defaultdict

from bootstrap import ratio_ci


def load(run):
    data = defaultdict(lambda: defaultdict(list))
    failed = defaultdict(int)
    with open(f"{run}/records.jsonl") as f:
        for line in f:
            r = json.loads(line)
            key = (r["variant"], r["workload"])
            if r.get("error"):
                failed[key] += 1
                continue
            data[key]["ttfb"].append(r["ttfb_ms"])
            data[key]["ttlb"].append(r["ttlb_ms"])
    return data, failed


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    run, va, vb = sys.argv[1:]
    data, failed = load(run)
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
