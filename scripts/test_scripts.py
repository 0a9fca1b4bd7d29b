#!/usr/bin/env python3
"""Tests of the summary scripts' statistics (bootstrap.py) and of the
seed 003 and seed 004 tables on a small synthetic run directory, with and
without --cluster. Run by scripts/test.sh; standard library only.

Usage: python3 scripts/test_scripts.py
"""
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bootstrap  # noqa: E402

REPS = 6


class Bootstrap(unittest.TestCase):
    def test_a_consistent_paired_difference_is_decided(self):
        # Repetitions differ a lot from one another, but b is always twice a.
        a = {r: [10 * (r + 1), 10 * (r + 1) + 1] for r in range(REPS)}
        b = {r: [2 * x for x in a[r]] for r in range(REPS)}
        point, low, high = bootstrap.paired_cluster_ratio_ci(a, b, list(range(REPS)))
        self.assertAlmostEqual(point, 0.5)
        self.assertAlmostEqual(low, 0.5)
        self.assertAlmostEqual(high, 0.5)

    def test_alike_values_in_a_repetition_count_once(self):
        # Ten identical values per repetition: the cluster interval is as
        # wide as six draws allow, the iid one pretends to have sixty.
        side = {r: [float(r)] * 10 for r in range(REPS)}
        values = [x for r in range(REPS) for x in side[r]]
        _, c_low, c_high = bootstrap.cluster_ci(side)
        iid = sorted(
            statistics.median(random.Random(s).choices(values, k=len(values)))
            for s in range(400)
        )
        self.assertGreater(c_high - c_low, iid[389] - iid[10])

    def test_zero_baselines_are_left_out(self):
        a = {r: [1.0] for r in range(REPS)}
        b = {r: [float(r % 2)] for r in range(REPS)}  # half the draws are 0
        self.assertIsNone(bootstrap.ratio_ci_by_repetition(a, {0: [0.0], 1: [0.0]}))
        point, low, high = bootstrap.ratio_ci_by_repetition(a, b, statistics.fmean)
        self.assertAlmostEqual(point, 2.0)
        self.assertGreaterEqual(low, 1.0)

    def test_one_common_repetition_is_not_enough(self):
        self.assertIsNone(bootstrap.ratio_ci_by_repetition({0: [1], 1: [2]}, {1: [2], 2: [3]}))


def write_run(path, records, reps):
    """A run directory with records.jsonl and repetitions.jsonl."""
    with open(os.path.join(path, "records.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    with open(os.path.join(path, "repetitions.jsonl"), "w") as f:
        for r in reps:
            f.write(json.dumps(r) + "\n")


def transfer(variant, rep, workload, index, ttfb, ttlb, size=327680):
    return {"variant": variant, "repetition": rep, "workload": workload, "index": index,
            "kind": "echo", "size": size, "ttfb_ms": ttfb, "ttlb_ms": ttlb,
            "error": None, "timed_out": False}


def run_script(name, run, *flags):
    out = subprocess.run([sys.executable, os.path.join(HERE, name), run, *flags],
                         check=True, capture_output=True, text=True)
    return out.stdout


class SummaryTables(unittest.TestCase):
    def test_loss_cost_finds_the_cost_per_lost_packet(self):
        with tempfile.TemporaryDirectory() as run:
            records, reps = [], []
            for rep in range(REPS):
                for transport, cost in (("tls", 20.0), ("quic", 50.0)):
                    v = f"size=320KiB transport={transport}"
                    lost = rep % 4
                    reps.append({"variant": v, "repetition": rep, "link_packets": [
                        {"src": "a", "dst": "b", "packets": 500, "lost": lost},
                        {"src": "b", "dst": "a", "packets": 300, "lost": 0}]})
                    records.append(transfer(v, rep, "client1", 0, 100.0, 400.0 + cost * lost))
            write_run(run, records, reps)
            out = run_script("loss-cost.py", run, "--size", "320KiB")
            quic = next(l for l in out.splitlines() if "transport=quic" in l)
            tls = next(l for l in out.splitlines() if "transport=tls" in l)
            self.assertIn("50.0 [50.0, 50.0]", quic, out)
            self.assertIn("20.0 [20.0, 20.0]", tls, out)


if __name__ == "__main__":
    unittest.main()
