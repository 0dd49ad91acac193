"""Bootstrap resampling (with replacement) of items and of groups, and the percentile interval.

Two ways of drawing resamples of n units, each its own random stream for a given seed (a caller keeps
the one its results were computed with):

- :func:`bootstrap_indices`: the indices drawn, an (n_boot x n) matrix (``Generator.integers``), for
  statistics that need the resampled rows themselves;
- :func:`bootstrap_group_counts`: how often each unit is drawn, an (n_boot x n) matrix of multinomial
  counts, for statistics that are weighted sums over units: every resample at once by a matrix product
  (:func:`paired_bootstrap_difference`: two scorings of the same units, resampled together).

The percentile interval at ``level`` is the (50 (1 - level), 50 (1 + level)) percentiles of the
resampled statistic (numpy's linear interpolation).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt


def bootstrap_indices(n: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` resamples of ``n`` items: the (n_boot x n) matrix of drawn indices,
    ``rng.integers(0, n, size=(n_boot, n))``. Takes the generator, so that two resamplings can share
    one stream (drawn in the order of the calls)."""
    return rng.integers(0, n, size=(n_boot, n))


def bootstrap_group_counts(n_groups: int, n_boot: int, seed: int) -> np.ndarray:
    """Resample ``n_groups`` groups with replacement ``n_boot`` times: the (n_boot x n_groups) float
    matrix of how often each group is drawn, each row one multinomial(n_groups, uniform) draw of
    ``np.random.default_rng(seed)``. Row b weighs group g by counts[b, g]; all-ones is the sample."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=n_boot).astype(np.float64)


def percentile_bounds(level: float = 0.95) -> tuple[float, float]:
    """The two percentiles (0-100) of a two-sided ``level`` percentile interval: 50 (1 - level) and
    50 (1 + level), e.g. 2.5 and 97.5 for 0.95 (up to rounding)."""
    return 50 * (1 - level), 50 * (1 + level)


def percentile_interval(values: npt.ArrayLike, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval (:func:`percentile_bounds`) of the finite bootstrap ``values``; NaN, NaN if
    none is finite."""
    finite = np.asarray(values, float)
    finite = finite[np.isfinite(finite)]
    if not len(finite):
        return float("nan"), float("nan")
    lo, hi = np.percentile(finite, percentile_bounds(level))
    return float(lo), float(hi)


def bootstrap_mean_interval(values: npt.ArrayLike, n_boot: int, seed: int, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean, resampling the items with replacement
    (:func:`bootstrap_group_counts` of the items, seeded ``seed``); NaN, NaN for fewer than 2 items."""
    x = np.asarray(values, float)
    if len(x) < 2:
        return float("nan"), float("nan")
    counts = bootstrap_group_counts(len(x), n_boot, seed)
    return percentile_interval(counts @ x / len(x), level)


def paired_bootstrap_difference(
    counts_base: npt.ArrayLike,
    counts_new: npt.ArrayLike,
    measures: Callable[[np.ndarray], np.ndarray],
    n_boot: int,
    seed: int,
    level: float = 0.95,
) -> dict[str, np.ndarray]:
    """Paired bootstrap of ``measures(new) - measures(base)`` over units scored by both.

    ``counts_base`` and ``counts_new``: (n_units x k) per-unit counts, row i the same unit under both;
    ``measures``: maps summed counts, a (b x k) matrix, to (b x m) measures (ratios of sums, so a
    resample is the count-weighted sum). The units are resampled together (:func:`bootstrap_group_counts`,
    seeded ``seed``), which keeps each unit's two scores paired. Returns ``difference`` (on the sample),
    ``lower`` and ``upper`` (the percentile interval at ``level`` of the resampled differences, over the
    finite ones), each of length m. Written here rather than with scipy.stats.bootstrap: every measure
    and both variants share one set of resamples, computed as one matrix product."""
    base, new = np.asarray(counts_base, float), np.asarray(counts_new, float)
    if base.shape != new.shape or base.ndim != 2:
        raise ValueError(f"counts_base {base.shape} and counts_new {new.shape}: two (units x counts) matrices alike")
    if len(base) < 2:
        raise ValueError("counts_base: at least 2 units to resample")
    weights = bootstrap_group_counts(len(base), n_boot, seed)
    resampled = measures(weights @ new) - measures(weights @ base)
    difference = measures(new.sum(0, keepdims=True))[0] - measures(base.sum(0, keepdims=True))[0]
    bounds = np.array([percentile_interval(resampled[:, j], level) for j in range(resampled.shape[1])])
    return {"difference": difference, "lower": bounds[:, 0], "upper": bounds[:, 1]}
