#!/usr/bin/env python3
"""Tests of the statistics (bootstrap.py) of the table script left
(seed001-toy-table.py; the others are `onionlab lab table`). Run by
scripts/test.sh; standard library only.

Usage: python3 scripts/test_scripts.py
"""
import os
import random
import statistics
import sys
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


if __name__ == "__main__":
    unittest.main()
