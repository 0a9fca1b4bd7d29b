#!/usr/bin/env python3
"""The comparisons of a seed004-ctor-kist run (docs/results/seed004.md,
"Why they differ"): per leg count, onionlab tls with the kernel's unsent
bytes limited against unlimited, C tor with KIST and with Vanilla against
each other and against both tls variants. Ratios of medians with 95%
bootstrap intervals (bold where the interval excludes 1) of TTFB and
download time (TTLB) of the measured client's web and bulk downloads
and of the load clients' downloads pooled. Failed transfers are left
out. Prints markdown table rows.

Also reads runs of seed004-ctor-nagle, -fixed and -cellq, which have no
tls with limited unsent bytes (and -cellq no Vanilla): comparisons whose
variants the run lacks are skipped. A run must have one circuit_cc; it
is named on standard error with the scenario's [ctor] consensus_params,
if any.

Usage: scripts/seed004-kist-table.py RUN_DIR
Standard library only.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bootstrap import ratio_ci  # noqa: E402
from collections import defaultdict

if len(sys.argv) != 2:
    sys.exit(__doc__)
run = sys.argv[1]
V = "ctor_scheduler=%s leg_scheduler=lowrtt legs=%s tcp_notsent_lowat=%s transport=%s"
d = defaultdict(list)
ccs = set()
for l in open(f"{run}/records.jsonl"):
    r = json.loads(l)
    if r.get("error"): continue
    cc, r["variant"] = r["variant"].split(" ", 1)
    if not cc.startswith("circuit_cc="):
        sys.exit(f"{run}: variant {cc} ... has no circuit_cc first")
    ccs.add(cc)
    g = r["workload"] if r["workload"] in ("web", "bulk") else "load"
    d[(r["variant"], g, "ttfb")].append(r["ttfb_ms"])
    d[(r["variant"], g, "ttlb")].append(r["ttlb_ms"])
if len(ccs) != 1:
    sys.exit(f"expected one circuit_cc in {run}, found {sorted(ccs)}")
params = [l.strip() for l in open(f"{run}/scenario.toml") if l.startswith("consensus_params")]
print(f"{run}: {ccs.pop()} {' '.join(params)}", file=sys.stderr)
pairs = [("tls 16KiB / tls kernel", ("kist","%s","16KiB","tls"), ("kist","%s","kernel","tls")),
         ("ctor vanilla / ctor kist", ("vanilla","%s","kernel","ctor"), ("kist","%s","kernel","ctor")),
         ("ctor kist / tls kernel", ("kist","%s","kernel","ctor"), ("kist","%s","kernel","tls")),
         ("ctor kist / tls 16KiB", ("kist","%s","kernel","ctor"), ("kist","%s","16KiB","tls")),
         ("ctor vanilla / tls kernel", ("vanilla","%s","kernel","ctor"), ("kist","%s","kernel","tls"))]
for L in ("1", "2"):
    for name, a, b in pairs:
        va = V % tuple(x % L if x == "%s" else x for x in a)
        vb = V % tuple(x % L if x == "%s" else x for x in b)
        if not all(d[(v, g, m)] for v in (va, vb) for g in ("web", "bulk", "load")
                   for m in ("ttfb", "ttlb")):
            continue
        cells = []
        for g in ("web", "bulk", "load"):
            for m in ("ttfb", "ttlb"):
                A, B = d[(va, g, m)], d[(vb, g, m)]
                r, lo, hi = ratio_ci(A, B)
                star = "**" if lo > 1 or hi < 1 else ""
                cells.append(f"{star}{r:.2f} [{lo:.2f}, {hi:.2f}]{star}")
        print(f"| {L} | {name} | " + " | ".join(cells) + " |")
