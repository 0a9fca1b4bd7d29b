#!/usr/bin/env python3
"""The comparisons of a seed004-ctor-kist run (docs/results/seed004.md,
"Why they differ"): per leg count, onionlab tls with the kernel's unsent
bytes limited against unlimited, C tor with KIST and with Vanilla against
each other and against both tls variants. Ratios of medians with 95%
bootstrap intervals (bold where the interval excludes 1) of TTFB and
download time (TTLB) of the measured client's web and bulk downloads
and of the load clients' downloads pooled. Failed transfers are left
out. Prints markdown table rows.

Also reads runs of seed004-ctor-nagle, -fixed, -cellq, -packaging and
-packaging-legs, which have no tls with limited unsent bytes (and
-cellq and the -packaging ones no Vanilla; -packaging adds tls with C
tor's eager exit packaging, with and without the 16 KiB limit, and
-packaging-legs the same at two legs without the limit; a run that
does not set tcp_notsent_lowat ran with the kernel's):
comparisons whose variants the run lacks are skipped. A run must have one circuit_cc; it
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
# Variants by their parameters; exit_packaging is what each implementation
# does when the run does not set it (onionlab lazy, C tor eager).
KEYS = ("ctor_scheduler", "legs", "tcp_notsent_lowat", "transport", "exit_packaging")
d = defaultdict(list)
ccs = set()
for l in open(f"{run}/records.jsonl"):
    r = json.loads(l)
    if r.get("error"): continue
    p = dict(kv.split("=", 1) for kv in r["variant"].split(" "))
    if "circuit_cc" not in p:
        sys.exit(f"{run}: variant {r['variant']} has no circuit_cc")
    ccs.add(p["circuit_cc"])
    p.setdefault("exit_packaging", "eager" if p["transport"] == "ctor" else "lazy")
    p.setdefault("tcp_notsent_lowat", "kernel")
    v = tuple(p.get(k) for k in KEYS)
    g = r["workload"] if r["workload"] in ("web", "bulk") else "load"
    d[(v, g, "ttfb")].append(r["ttfb_ms"])
    d[(v, g, "ttlb")].append(r["ttlb_ms"])
if len(ccs) != 1:
    sys.exit(f"expected one circuit_cc in {run}, found {sorted(ccs)}")
params = [l.strip() for l in open(f"{run}/scenario.toml") if l.startswith("consensus_params")]
print(f"{run}: circuit_cc={ccs.pop()} {' '.join(params)}", file=sys.stderr)
# (ctor_scheduler, tcp_notsent_lowat, transport, exit_packaging) of each side.
TLS, TLS16 = ("kist", "kernel", "tls", "lazy"), ("kist", "16KiB", "tls", "lazy")
TLS_EAGER, TLS16_EAGER = ("kist", "kernel", "tls", "eager"), ("kist", "16KiB", "tls", "eager")
KIST, VANILLA = ("kist", "kernel", "ctor", "eager"), ("vanilla", "kernel", "ctor", "eager")
pairs = [("tls 16KiB / tls kernel", TLS16, TLS),
         ("tls eager / tls lazy", TLS_EAGER, TLS),
         ("tls 16KiB eager / tls 16KiB", TLS16_EAGER, TLS16),
         ("ctor vanilla / ctor kist", VANILLA, KIST),
         ("ctor kist / tls kernel", KIST, TLS),
         ("ctor kist / tls 16KiB", KIST, TLS16),
         ("ctor kist / tls eager", KIST, TLS_EAGER),
         ("ctor kist / tls 16KiB eager", KIST, TLS16_EAGER),
         ("ctor vanilla / tls kernel", VANILLA, TLS)]
for L in ("1", "2"):
    for name, a, b in pairs:
        va, vb = ((s[0], L, s[1], s[2], s[3]) for s in (a, b))
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
