#!/usr/bin/env python3
"""Did running several runs at once (`lab run --jobs N`) change the
results? Per variant and workload, the median TTFB and TTLB of the runs
made beside others (jobs > 1) against those made alone (jobs = 1), with
the ratio's 95% bootstrap confidence interval (4000 resamples,
percentile). Runs on a saturated CPU and failed transfers are left out.

The runs made alone may be in the same directory (a run started with
--jobs 1 and resumed with --jobs 4) or in further directories of the same
variants (for example a copy of the preset with part of its matrix, run
with --jobs 1). Variants found in only one group are skipped.

Usage: scripts/jobs-check.py RUN_DIR [MORE_RUN_DIRS...] [--markdown]
Standard library only.
"""
import argparse
import json
import statistics
from collections import defaultdict

from bootstrap import ratio_ci


def load(run, data, busy, late):
    """Adds the run's transfers to data[(variant, workload, alone)][metric],
    each run's busy fraction to busy[alone] and its emulator's 99th
    percentile of release lateness to late[alone]."""
    jobs = {}
    with open(f"{run}/repetitions.jsonl") as f:
        for line in f:
            r = json.loads(line)
            key = (r["variant"], r["repetition"])
            jobs[key] = None if r.get("cpu_saturated") else r.get("jobs", 1)
            if jobs[key] is not None:
                alone = jobs[key] == 1
                busy[alone].append(r["cpu_busy_fraction"])
                if r.get("emulator"):
                    late[alone].append(r["emulator"]["late_p99_us"])
    with open(f"{run}/records.jsonl") as f:
        for line in f:
            r = json.loads(line)
            j = jobs.get((r["variant"], r["repetition"]))
            if j is None or r.get("error") or r.get("ttlb_ms") is None:
                continue
            key = (r["variant"], r["workload"], j == 1)
            data[key]["ttfb"].append(r["ttfb_ms"])
            data[key]["ttlb"].append(r["ttlb_ms"])
            data[key]["reps"].append((run, r["repetition"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    data = defaultdict(lambda: defaultdict(list))
    busy = defaultdict(list)
    late = defaultdict(list)
    for run in args.runs:
        load(run, data, busy, late)
    groups = sorted({(v, w) for (v, w, _) in data})
    head = ["variant", "workload"]
    for m in ("TTFB", "TTLB"):
        head += [f"{m} alone ms (runs)", f"{m} beside others ms (runs)", "beside / alone"]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print("  ".join(head))
    for v, w in groups:
        alone, beside = data[(v, w, True)], data[(v, w, False)]
        if not alone["ttlb"] or not beside["ttlb"]:
            continue
        cells = [v, w]
        for m in ("ttfb", "ttlb"):
            runs = lambda d: len(set(d["reps"]))
            cells.append(f"{statistics.median(alone[m]):.0f} ({runs(alone)})")
            cells.append(f"{statistics.median(beside[m]):.0f} ({runs(beside)})")
            r, lo, hi = ratio_ci(beside[m], alone[m])
            s = f"{r:.2f} [{lo:.2f}, {hi:.2f}]"
            cells.append(f"**{s}**" if args.markdown and (lo > 1 or hi < 1) else s)
        if args.markdown:
            print("| " + " | ".join(cells) + " |")
        else:
            print("  ".join(cells))
    for alone, label in ((True, "alone"), (False, "beside others")):
        b = busy[alone]
        if b:
            print(
                f"\nruns {label}: {len(b)}, machine busy median {statistics.median(b):.2f}, "
                f"max {max(b):.2f}"
            )
        if late[alone]:
            l = late[alone]
            print(
                f"  emulator release lateness, p99 per run: median {statistics.median(l):.0f} us, "
                f"max {max(l):.0f} us ({len(l)} runs recorded it)"
            )


if __name__ == "__main__":
    main()
