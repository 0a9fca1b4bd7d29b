"""The bootstrap interval the lab's summary scripts share (imported from
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
