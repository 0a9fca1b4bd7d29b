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
    variant has the same seed), pools their values and takes the ratio."""
    rng = random.Random(seed)

    def pooled(side, draw):
        return [x for rep in draw for x in side[rep]]

    point = stat(pooled(a, reps)) / stat(pooled(b, reps))
    boot = []
    for _ in range(resamples):
        draw = rng.choices(reps, k=len(reps))
        boot.append(stat(pooled(a, draw)) / stat(pooled(b, draw)))
    boot.sort()
    return point, boot[int(0.025 * resamples)], boot[int(0.975 * resamples) - 1]
