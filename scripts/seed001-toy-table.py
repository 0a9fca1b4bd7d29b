#!/usr/bin/env python3
"""Seed 001's Shadow-style metrics for a `seed001-toy` run, each transport
against a baseline (tls by default): for the web clients' 320 KiB downloads
the median time to first byte, the median, 75th and 95th percentile time to
last byte (the thesis's "slowest 25% and 5%"), and the median over clients
of each client's median download time (its "about 20% better median");
for the bulk clients the median 5 MiB download time, or, where the bulk
clients are `stream` workloads (seed001-toy-loaded's background load of a
fixed duration), their median throughput. With streams, only the web
downloads that ended before the repetition's first stream ended count
(the network was loaded throughout them); the others are counted and left
out.

Random paths make repetitions differ far more than transfers within one,
so the intervals come from a cluster bootstrap over repetitions: 4000
times, draw repetitions with replacement (the same draw for both
variants), pool their transfers and take the ratio of the statistic; 95%
percentile interval. Repetition r of every variant builds the same network,
relay keys and think times from the same seed, and (runs made with the lab
of 0e6f60a or later: clients' `path_seed`) the same paths for onionlab's
variants, so the draw is paired; C tor chooses its own paths, and in
earlier runs every variant drew its paths independently, where the shared
draw pairs nothing and the interval is an unpaired one. Repetitions on a
saturated CPU are left out (and counted), and so are failed transfers
(counted); a repetition left out for one transport is left out for both.

Variants are named by their transport and the other parameters that
differ between variants ("tls", "tls slow_start_after_idle=off");
--baseline names one, or a transport that only one variant has.

Several run directories of presets with the same seed and workloads
(seed001-toy-loaded and seed001-toy-loaded-tcp) are read as one run: their
repetition r shares network, think times and onionlab's paths.

--by-sharing (runs with their raw/ directories, made with clients'
`path_seed`): classes the web clients of each repetition by what their
circuit shares with a bulk client's: a relay pair, so a TLS or QUIC
connection ("connection"), only a relay and its capped links ("relay"),
or nothing ("apart"), and prints per class the median of client medians
of each variant against the baseline, with a bootstrap over clients
(paired: a client has the same path in every onionlab variant). C tor's
variants choose their own paths and are left out.

Usage: scripts/seed001-toy-table.py RUN_DIR [RUN_DIR...] [--baseline tls] [--markdown] [--by-sharing]
Standard library only.
"""
import argparse
import glob
import json
import os
import re
import random
import statistics
import tomllib
from collections import defaultdict

from bootstrap import paired_cluster_ratio_ci


def arm_names(variants):
    """Each variant's short name: its transport, then the parameters whose
    value differs between variants (for example "tls
    slow_start_after_idle=off"); parameters every variant shares (a
    preset's relay rate) are left out."""
    params = {v: dict(p.split("=", 1) for p in v.split()) for v in variants}
    shared = set.intersection(*(set(p.items()) for p in params.values())) if params else set()
    names = {}
    for v, p in params.items():
        transport = p.pop("transport", "tls")
        rest = [f"{k}={x}" for k, x in sorted(p.items()) if (k, x) not in shared]
        names[v] = " ".join([transport] + rest)
    return names


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
    (
        "bulk stream Mbit/s median",
        "stream",
        lambda rs: statistics.median(r["size"] * 8 / 1e3 / r["ttlb_ms"] for r in rs),
    ),
]


def end_ms(r):
    """When a transfer ended (Unix ms)."""
    return r["start_unix_ms"] + r["ttlb_ms"]


def under_load(kinds):
    """Keep only the web downloads that ended before the first stream of
    their repetition ended (when the variant has streams); returns how many
    were left out."""
    dropped = 0
    for rep, streams in kinds["stream"].items():
        if not streams:
            continue
        load_end = min(end_ms(r) for r in streams)
        web = kinds["web"][rep]
        kinds["web"][rep] = [r for r in web if end_ms(r) <= load_end]
        dropped += len(web) - len(kinds["web"][rep])
    return dropped


def workload_kinds(run):
    """Workload name -> "web", "bulk" or "stream", from the run's
    scenario.toml (records say only "download" for web and bulk)."""
    with open(f"{run}/scenario.toml", "rb") as f:
        scenario = tomllib.load(f)
    return {w["name"]: w["kind"] for w in scenario.get("workload", [])}


def workload_clients(run):
    """Workload name -> its client's name, from the run's scenario.toml."""
    with open(f"{run}/scenario.toml", "rb") as f:
        scenario = tomllib.load(f)
    return {w["name"]: w["client"] for w in scenario.get("workload", [])}


def load(runs):
    """Records per transport and repetition (each with its workload's kind
    as `toy_kind`), the repetitions left out as saturated, and failed
    transfers per transport, from one or more run directories."""
    kinds = workload_kinds(runs[0])
    if any(workload_kinds(run) != kinds for run in runs[1:]):
        raise SystemExit(f"the runs {runs} have different workloads")
    saturated = set()
    records = []
    for run in runs:
        with open(f"{run}/repetitions.jsonl") as f:
            for line in f:
                r = json.loads(line)
                if r.get("cpu_saturated"):
                    saturated.add(r["repetition"])
        with open(f"{run}/records.jsonl") as f:
            records += [json.loads(line) for line in f]
    recs = defaultdict(lambda: defaultdict(list))
    failed = defaultdict(int)
    arm_of = arm_names({r["variant"] for r in records})
    for r in records:
        t = arm_of[r["variant"]]
        r["toy_kind"] = kinds.get(r["workload"])
        if r.get("error") or r.get("ttlb_ms") is None or r.get("timed_out"):
            failed[t] += 1
            continue
        recs[t][r["repetition"]].append(r)
    return recs, saturated, failed


def circuit_paths(runs):
    """(repetition, client) -> its circuit's relays, from the client logs
    of every onionlab run directory; exits if two variants of a
    repetition disagree (a run made before clients had `path_seed`)."""
    paths = {}
    for run in runs:
        for d in sorted(glob.glob(f"{run}/raw/rep*-v*")):
            rep = int(re.search(r"rep(\d+)-v", d).group(1))
            for log in glob.glob(f"{d}/client-*.log"):
                client = os.path.basename(log)[len("client-"):-len(".log")]
                with open(log) as f:
                    m = re.search(r"circuit built .*? path=(\S+)", f.read())
                if not m:
                    continue
                hops = m.group(1).split(",")
                if paths.setdefault((rep, client), hops) != hops:
                    raise SystemExit(
                        f"{d}: {client}'s path differs between variants of repetition {rep} "
                        "(a run made before clients had path_seed?)"
                    )
    return paths


def sharing_classes(paths, bulk_clients):
    """(repetition, web client) -> "connection", "relay" or "apart": what
    its circuit shares with the bulk clients' circuits of its repetition."""
    classes = {}
    for rep in {r for r, _ in paths}:
        bulk = [paths[(rep, b)] for b in bulk_clients if (rep, b) in paths]
        relays = {h for hops in bulk for h in hops}
        pairs = {frozenset(p) for hops in bulk for p in zip(hops, hops[1:])}
        for (r, client), hops in paths.items():
            if r != rep or client in bulk_clients:
                continue
            if {frozenset(p) for p in zip(hops, hops[1:])} & pairs:
                classes[(rep, client)] = "connection"
            elif set(hops) & relays:
                classes[(rep, client)] = "relay"
            else:
                classes[(rep, client)] = "apart"
    return classes


def by_sharing(runs, kinds, reps, transports, baseline, client_of):
    """Prints, per sharing class, each onionlab variant's median of web
    client medians against the baseline's, with a paired bootstrap over
    (repetition, client)."""
    bulk_clients = {client_of[w] for w, k in workload_kinds(runs[0]).items() if k != "web"}
    classes = sharing_classes(circuit_paths(runs), bulk_clients)
    medians = {
        t: {
            (rep, client_of[w]): statistics.median(r["ttlb_ms"] for r in rs)
            for rep in reps
            for w in {r["workload"] for r in kinds[t]["web"][rep]}
            for rs in [[r for r in kinds[t]["web"][rep] if r["workload"] == w]]
        }
        for t in transports
        if not t.startswith("ctor")
    }
    print("\nweb median of client medians (ms) by what the client's circuit shares with a bulk circuit:")
    rng = random.Random(1)
    for cls in ("connection", "relay", "apart"):
        keys = [k for k, c in sorted(classes.items()) if c == cls and k[0] in reps]
        keys = [k for k in keys if all(k in m for m in medians.values())]
        if not keys:
            continue
        base = statistics.median(medians[baseline][k] for k in keys)
        cells = [f"{cls}: {len(keys)} clients, {baseline} {base:.0f}"]
        for t, m in medians.items():
            if t == baseline:
                continue
            point = statistics.median(m[k] for k in keys) / base
            boot = sorted(
                statistics.median(m[k] for k in draw) / statistics.median(medians[baseline][k] for k in draw)
                for draw in (rng.choices(keys, k=len(keys)) for _ in range(4000))
            )
            cells.append(f"{t} {point:.2f} [{boot[100]:.2f}, {boot[3899]:.2f}]")
        print("  " + "; ".join(cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="run")
    ap.add_argument("--baseline", default="tls")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--by-sharing", action="store_true")
    args = ap.parse_args()
    recs, saturated, failed = load(args.runs)
    baseline = pick_baseline(recs, args.baseline)
    transports = sorted(recs, key=lambda t: (t != baseline, t))
    # Only repetitions every transport finished, and none on a saturated CPU.
    reps = sorted(set.intersection(*(set(recs[t]) for t in transports)) - saturated)
    if not reps:
        raise SystemExit("no repetition that every transport finished")
    kinds = {
        t: {k: {rep: [r for r in recs[t][rep] if r["toy_kind"] == k] for rep in reps} for k in ("web", "bulk", "stream")}
        for t in transports
    }
    after_load = {t: under_load(kinds[t]) for t in transports}
    head = ["metric (ms unless said)"] + [f"{t}" for t in transports]
    head += [f"{t} / {baseline} [95% CI]" for t in transports if t != baseline]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print("  ".join(head))
    for label, kind, stat in METRICS:
        # A metric of a kind some variant lacks (bulk downloads where the
        # load is streams) has no row.
        if any(not all(kinds[t][kind][rep] for rep in reps) for t in transports):
            continue
        cells = [label]
        for t in transports:
            pooled = [r for rep in reps for r in kinds[t][kind][rep]]
            cells.append(f"{stat(pooled):.1f}" if kind == "stream" else f"{stat(pooled):.0f}")
        base = kinds[baseline][kind]
        for t in transports:
            if t == baseline:
                continue
            point, lo, hi = paired_cluster_ratio_ci(kinds[t][kind], base, reps, stat)
            s = f"{point:.2f} [{lo:.2f}, {hi:.2f}]"
            cells.append(f"**{s}**" if args.markdown and (lo > 1 or hi < 1) else s)
        print(("| " + " | ".join(cells) + " |") if args.markdown else "  ".join(cells))
    counts = {t: sum(len(kinds[t]["web"][r]) for r in reps) for t in transports}
    bulk = {t: sum(len(kinds[t]["bulk"][r]) for r in reps) for t in transports}
    streams = {t: sum(len(kinds[t]["stream"][r]) for r in reps) for t in transports}
    print(f"\n{len(reps)} repetitions; web downloads {counts}; bulk downloads {bulk}; bulk streams {streams}")
    if any(after_load.values()):
        print(f"web downloads left out, ended after the load (first stream) ended: {after_load}")
    if saturated:
        print(f"repetitions left out, saturated CPU: {sorted(saturated)}")
    for t, n in sorted(failed.items()):
        print(f"{n} failed transfer(s) left out: {t}")
    if args.by_sharing:
        client_of = workload_clients(args.runs[0])
        by_sharing(args.runs, kinds, reps, transports, baseline, client_of)


if __name__ == "__main__":
    main()
