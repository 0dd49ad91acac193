"""Inter-rater agreement: Cohen's kappa (scikit-learn) and Fleiss' kappa (statsmodels).

kappa = (p_o - p_e) / (1 - p_e): the observed agreement beyond the agreement expected by chance from
the raters' marginal distributions. Every function returns NaN where kappa is undefined (no item, a
single category) rather than raising or warning.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from sklearn.metrics import cohen_kappa_score
from statsmodels.stats.inter_rater import aggregate_raters
from statsmodels.stats.inter_rater import fleiss_kappa as _statsmodels_fleiss_kappa


def cohen_kappa(a: Collection[Any], b: Collection[Any], sample_weight: npt.ArrayLike | None = None) -> float:
    """Cohen's kappa of two raters' categorical labels (``sklearn.metrics.cohen_kappa_score``), labels
    compared as strings (None or a number is a category like any other). ``sample_weight``: optional
    weight per item. NaN when undefined: no item, one category only, or weights summing to 0."""
    if len(a) == 0 or len(set(a) | set(b)) < 2:
        return float("nan")
    if sample_weight is not None and not np.sum(sample_weight) > 0:
        return float("nan")
    return float(cohen_kappa_score(list(map(str, a)), list(map(str, b)), sample_weight=sample_weight))


def weighted_kappa(
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    labels: Sequence[Any],
    weights: Literal["linear", "quadratic"] = "quadratic",
) -> float:
    """Weighted Cohen's kappa 1 - sum w_ij O_ij / sum w_ij E_ij of ratings on the ordered scale
    ``labels`` (``cohen_kappa_score(a, b, weights=..., labels=...)``; quadratic: w_ij = (i - j)^2 over
    the scale's positions, so scale values never observed still count in the distances). NaN when the
    ratings hold one value only."""
    if len(np.unique(np.r_[np.asarray(a), np.asarray(b)])) < 2:
        return float("nan")
    return float(cohen_kappa_score(a, b, weights=weights, labels=list(labels)))


def quadratic_kappa(h: npt.ArrayLike, a: npt.ArrayLike, weights: npt.ArrayLike | None = None) -> np.ndarray:
    """Quadratic-weighted Cohen's kappa of ratings ``h`` and ``a`` on an interval scale, for each row of
    ``weights`` (resamples x items; None = one unweighted row).

    Hand-written because bootstrap intervals need thousands of them at once: with quadratic weights,
    kappa = 1 - E_obs[(h - a)^2] / E_indep[(h - a')^2], and the chance term is
    var(h) + var(a) + (mean h - mean a)^2 under the same weights. It equals
    ``cohen_kappa_score(h, a, weights="quadratic")`` on the full scale (tested), whose pairwise weights
    (i - j)^2 / (k - 1)^2 differ by a constant that cancels. NaN where the chance term is 0."""
    h, a = np.asarray(h, float), np.asarray(a, float)
    w = np.ones((1, len(h))) if weights is None else np.atleast_2d(np.asarray(weights, float))
    total = w.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mh, ma = w @ h / total, w @ a / total
        vh = w @ h**2 / total - mh**2
        va = w @ a**2 / total - ma**2
        observed = w @ (h - a) ** 2 / total
        chance = vh + va + (mh - ma) ** 2
        return np.where(chance > 0, 1.0 - observed / chance, np.nan)


def quadratic_kappa_fixed_chance(h: np.ndarray, a: np.ndarray, a_rows: np.ndarray) -> np.ndarray:
    """Quadratic-weighted kappa of ``h`` against each row of ``a_rows`` (R x items) with the chance term
    of ``h`` and ``a``: 1 - mean_i (h_i - a_ri)^2 / (var h + var a + (mean h - mean a)^2).

    For rows that rearrange ``a`` (a permutation null), whose marginals, and so the chance term, they
    leave (nearly) as they are: only the observed term is recomputed per row. NaN rows when the chance
    term is 0."""
    observed = ((h - a_rows) ** 2).mean(1)
    chance = h.var() + a.var() + (h.mean() - a.mean()) ** 2
    return 1.0 - observed / chance if chance > 0 else np.full(len(a_rows), np.nan)


def fleiss_kappa_counts(table: npt.ArrayLike) -> float:
    """Fleiss' kappa (P_bar - P_e) / (1 - P_e) of an items x categories table of rating counts, every item
    rated the same number of times (``statsmodels.stats.inter_rater.fleiss_kappa``, method "fleiss").
    NaN with fewer than two categories or no item."""
    counts = np.asarray(table)
    if counts.ndim != 2 or counts.shape[0] == 0 or counts.shape[1] < 2:
        return float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(_statsmodels_fleiss_kappa(counts, method="fleiss"))


def fleiss_kappa(ratings: Sequence[Sequence[Any]]) -> float:
    """Fleiss' kappa of items x raters categorical ratings, labels compared as strings, counted per
    category with ``statsmodels.stats.inter_rater.aggregate_raters`` (see :func:`fleiss_kappa_counts`).
    NaN when undefined (no item, one category only)."""
    if len(ratings) == 0:
        return float("nan")
    table, _ = aggregate_raters(np.asarray([[str(v) for v in row] for row in ratings], dtype=object))
    return fleiss_kappa_counts(table)
