#!/usr/bin/env python3
"""Seed 001's Chutney metric for a lab run: the goodput of the slowest of the
clients that transfer at the same time, per variant, QUIC against TLS.

For each variant and repetition the slowest client's goodput (MiB/s) is
taken; a repetition in which any transfer failed or timed out counts as
failed and is left out (and counted). Per variant: the median over
repetitions with its range, and the transports' ratio of medians with a 95%
bootstrap confidence interval (4000 resamples, percentile). Also the goodput
at each loss rate relative to the same transport's at 0% loss ("degrades
more slowly under loss"), and the wire overhead of QUIC over TLS (IP bytes
on the clients' access links per payload byte, from repetitions.jsonl).

Usage: scripts/slowest-client.py RUN_DIR [--markdown]
Variant labels must contain transport=tls and transport=quic (other
parameters pair them). Standard library only.
"""
import json
import statistics
import sys
from collections import defaultdict

from bootstrap import ratio_ci


def params(label):
    return dict(p.split("=", 1) for p in label.split())


def others(label):
    """The label without its transport, the key that pairs the transports."""
    return " ".join(p for p in label.split() if not p.startswith("transport="))


def load(run):
    per_rep = defaultdict(lambda: defaultdict(list))
    with open(f"{run}/records.jsonl") as f:
        for line in f:
            r = json.loads(line)
            per_rep[r["variant"]][r["repetition"]].append(r)
    slowest = defaultdict(list)
    failed = defaultdict(int)
    for variant, reps in per_rep.items():
        for rep in sorted(reps):
            recs = reps[rep]
            if any(r.get("error") or r.get("timed_out") for r in recs):
                failed[variant] += 1
                continue
            slowest[variant].append(min(r["goodput_mib_s"] for r in recs))
    overhead = defaultdict(list)
    with open(f"{run}/repetitions.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r.get("wire_overhead") is not None:
                overhead[r["variant"]].append(r["wire_overhead"])
    return slowest, failed, overhead


def loss_value(text):
    return float(text.rstrip("%"))


def sort_key(key):
    p = params(key)
    loss = next((v for k, v in p.items() if k.startswith("loss")), "0%")
    return (int(p.get("clients", 0)), loss_value(loss), key)


def fmt_ratio(a, b):
    if not a or not b:
        return "n/a"
    r, lo, hi = ratio_ci(a, b)
    text = f"{r:.2f} [{lo:.2f}, {hi:.2f}]"
    # Bold where the interval excludes 1, with at least 3 repetitions a side
    # (with fewer the bootstrap interval says nothing).
    decided = min(len(a), len(b)) >= 3 and (lo > 1 or hi < 1)
    return f"**{text}**" if decided else text


def fmt_goodput(v):
    if not v:
        return "n/a"
    return f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        sys.exit(__doc__)
    run = args[0]
    slowest, failed, overhead = load(run)
    keys = sorted({others(v) for v in slowest} | {others(v) for v in failed}, key=sort_key)
    by = {}
    for v in set(slowest) | set(failed):
        by[(others(v), params(v)["transport"])] = v

    def side(key, transport):
        v = by.get((key, transport))
        return (slowest.get(v, []), failed.get(v, 0), overhead.get(v, [])) if v else ([], 0, [])

    zero = {}
    for key in keys:
        p = params(key)
        if all(v in ("0%",) for k, v in p.items() if k.startswith("loss")):
            rest = " ".join(x for x in key.split() if not x.startswith("loss"))
            for t in ("tls", "quic"):
                zero[(rest, t)] = side(key, t)[0]

    print(
        "| variant | TLS slowest MiB/s, median (range) | QUIC | QUIC/TLS [95% CI] "
        "| TLS vs own 0% | QUIC vs own 0% | failed reps TLS/QUIC | QUIC wire overhead over TLS |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for key in keys:
        tls, tls_failed, tls_oh = side(key, "tls")
        quic, quic_failed, quic_oh = side(key, "quic")
        rest = " ".join(x for x in key.split() if not x.startswith("loss"))
        rel = []
        for t, v in (("tls", tls), ("quic", quic)):
            z = zero.get((rest, t))
            rel.append(f"{statistics.median(v) / statistics.median(z):.2f}" if v and z else "n/a")
        oh = (
            f"{(statistics.median(quic_oh) / statistics.median(tls_oh) - 1) * 100:+.1f}%"
            if tls_oh and quic_oh
            else "n/a"
        )
        print(
            f"| {key} | {fmt_goodput(tls)} | {fmt_goodput(quic)} | {fmt_ratio(quic, tls)} "
            f"| {rel[0]} | {rel[1]} | {tls_failed}/{quic_failed} | {oh} |"
        )


if __name__ == "__main__":
    main()
