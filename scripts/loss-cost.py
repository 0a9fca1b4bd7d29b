#!/usr/bin/env python3
"""What each transport pays per lost packet: for every variant of a run,
the packets the emulated network carried and lost in a run (all links,
both directions, from `link_packets` in repetitions.jsonl), the median
TTLB, and the slope of a run's mean TTLB over its lost packets
(least squares over the runs, ms per lost packet) with a 95% bootstrap
interval over runs (4000 resamples, percentile).

Made for seed000-s2 and seed000-s2-loss, where quic's connections lose no
more packets than tls's but its transfers take longer: is it more losses
or a higher cost per loss? Runs on a saturated CPU and failed transfers
are left out.

Usage: scripts/loss-cost.py RUN_DIR [--size 320KiB] [--markdown]
Standard library only.
"""
import argparse
import json
import random
import statistics
from collections import defaultdict


def slope(points):
    """Least-squares slope of y over x; None when x does not vary."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def slope_ci(points, resamples=4000, seed=1):
    rng = random.Random(seed)
    boot = sorted(
        s for _ in range(resamples)
        if (s := slope(rng.choices(points, k=len(points)))) is not None
    )
    if len(boot) < resamples // 2:
        return None
    return boot[int(0.025 * len(boot))], boot[int(0.975 * len(boot)) - 1]


def load(run, size):
    runs = {}
    with open(f"{run}/repetitions.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r.get("cpu_saturated"):
                continue
            lost = sum(p["lost"] for p in r["link_packets"])
            packets = sum(p["packets"] for p in r["link_packets"])
            runs[(r["variant"], r["repetition"])] = {"lost": lost, "packets": packets, "ttlb": []}
    with open(f"{run}/records.jsonl") as f:
        for line in f:
            t = json.loads(line)
            key = (t["variant"], t["repetition"])
            if key not in runs or t.get("error") or t.get("ttlb_ms") is None:
                continue
            if size and f"size={size}" not in t["variant"] and t["size"] != parse_size(size):
                continue
            runs[key]["ttlb"].append(t["ttlb_ms"])
    by_variant = defaultdict(list)
    for (variant, _), r in runs.items():
        if r["ttlb"]:
            by_variant[variant].append(r)
    return by_variant


def parse_size(text):
    units = {"KiB": 1024, "MiB": 1 << 20, "B": 1}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def short(variant):
    """The variant's parameters without their link lists."""
    return " ".join(f"{kv.split('=', 1)[0].split(':')[0]}={kv.split('=', 1)[1]}" for kv in variant.split())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run")
    ap.add_argument("--size", help="only transfers of this size (as in the matrix: 320KiB)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    data = load(args.run, args.size)
    head = ["variant", "runs", "packets / run", "lost / run", "lost %", "TTLB ms", "ms per lost packet [95% CI]"]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    for v in sorted(data, key=short):
        runs = data[v]
        points = [(r["lost"], statistics.fmean(r["ttlb"])) for r in runs]
        s = slope(points)
        ci = slope_ci(points)
        per_loss = "-" if s is None else f"{s:.1f}" + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")
        packets = statistics.median(r["packets"] for r in runs)
        lost = statistics.median(r["lost"] for r in runs)
        share = 100 * sum(r["lost"] for r in runs) / max(1, sum(r["packets"] for r in runs))
        ttlb = statistics.median(t for r in runs for t in r["ttlb"])
        cells = [short(v), str(len(runs)), f"{packets:.0f}", f"{lost:.0f}", f"{share:.2f}", f"{ttlb:.0f}", per_loss]
        if args.markdown:
            print("| " + " | ".join(cells) + " |")
        else:
            print("  ".join(cells))


if __name__ == "__main__":
    main()
