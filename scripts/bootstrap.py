"""The bootstrap intervals the lab's summary scripts share (imported from
the scripts beside it; standard library only)."""
import random
import statistics


def ratio_ci(a, b, resamples=4000, seed=1):
    """The ratio of medians median(a) / median(b) with a 95% percentile
    bootstrap interval: (point, low, high)."""
    rng = random.Random(seed)
    boot = sorted(
        statistics.median(rng.choices(a, k=len(a)))
        / statistics.median(rng.choices(b, k=len(b)))
        for _ in range(resamples)
    )
    point = statistics.median(a) / statistics.median(b)
    return point, boot[int(0.025 * resamples)], boot[int(0.975 * resamples) - 1]


def paired_cluster_ratio_ci(a, b, reps, stat=statistics.median, resamples=4000, seed=1):
    """stat(pooled a) / stat(pooled b) over the repetitions `reps`, with a
    95% paired cluster-bootstrap interval: (point, low, high).

    `a` and `b` map a repetition to its list of values (or records `stat`
    understands). Transfers of one repetition share its network, so they
    are not independent draws: each resample draws repetitions with
    replacement, the same draw for both sides (repetition r of every
    variant has the same seed), pools their values and takes the ratio.
    Resamples whose `b` statistic is 0 are left out (a count that is
    mostly 0, such as TCP timeouts)."""
    rng = random.Random(seed)
    point = stat(_pooled(a, reps)) / stat(_pooled(b, reps))
    boot = []
    for _ in range(resamples):
        draw = rng.choices(reps, k=len(reps))
        denominator = stat(_pooled(b, draw))
        if denominator != 0:
            boot.append(stat(_pooled(a, draw)) / denominator)
    boot.sort()
    n = len(boot)
    return point, boot[int(0.025 * n)], boot[int(0.975 * n) - 1]


def cluster_ci(side, stat=statistics.median, resamples=4000, seed=1):
    """stat of all the values of `side` (a map from repetition to its
    values) with a 95% cluster-bootstrap interval: each resample draws
    repetitions with replacement and pools their values. (point, low, high)."""
    rng = random.Random(seed)
    reps = sorted(side)
    boot = sorted(
        stat(_pooled(side, rng.choices(reps, k=len(reps)))) for _ in range(resamples)
    )
    return stat(_pooled(side, reps)), boot[int(0.025 * resamples)], boot[int(0.975 * resamples) - 1]


def ratio_ci_by_repetition(a, b, stat=statistics.median):
    """paired_cluster_ratio_ci over the repetitions `a` and `b` (maps from
    repetition to values) both have; None with fewer than two of them or a
    baseline statistic of 0."""
    common = sorted(set(a) & set(b))
    if len(common) < 2 or stat(_pooled(b, common)) == 0:
        return None
    return paired_cluster_ratio_ci(a, b, common, stat)


def _pooled(side, draw):
    return [x for rep in draw for x in side[rep]]
