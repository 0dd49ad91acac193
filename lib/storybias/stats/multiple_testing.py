"""Multiple testing: Benjamini-Hochberg and Benjamini-Yekutieli adjusted p-values (scipy's
``false_discovery_control``; other methods statsmodels' ``multipletests``) and the Benjamini-Hochberg
step-up procedure written out as thresholds.

BH at level alpha over m p-values p_(1) <= ... <= p_(m): with thresholds t_k = k/m * alpha, reject the
k* smallest, k* = max{k : p_(k) < t_k} (strict: the rejected ones are those with adjusted p < alpha,
the decision rule of this project). The adjusted p-value is p~_(i) = min_{j >= i} min(1, p_(j) m / j);
BY multiplies p_(j) m / j by c(m) = sum_{k=1}^m 1/k, valid under any dependence.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.stats import false_discovery_control
from statsmodels.stats.multitest import multipletests

ALPHA = 0.05


# BH and BY through scipy's false_discovery_control, the call of StereoTales' reference pipeline, so a
# re-test of its released data gives its adjusted p-values to the last digit (statsmodels' multipletests
# orders its floating-point operations differently); every other method through statsmodels.
SCIPY_FDR = {"fdr_bh": "bh", "fdr_by": "by"}


def adjust(p_values: npt.ArrayLike, method: str) -> np.ndarray:
    """Adjusted p-values, in the input's order: ``method`` ``fdr_bh`` (Benjamini-Hochberg) or ``fdr_by``
    (Benjamini-Yekutieli), or any other method of ``statsmodels.stats.multitest.multipletests``. An
    empty input gives an empty array; NaN is not allowed (callers decide what a missing p-value is)."""
    p = np.asarray(p_values, float)
    if p.size == 0:
        return p
    if method in SCIPY_FDR:
        return np.asarray(false_discovery_control(p, method=SCIPY_FDR[method]), float)
    return multipletests(p, method=method)[1]


def bh_thresholds(m: int, alpha: float = ALPHA) -> list[float]:
    """Every rank's Benjamini-Hochberg threshold t_k = k/m * alpha, k = 1..m: the only values a
    p-value is compared with."""
    return [alpha * k / m for k in range(1, m + 1)]


def bh_rejections(p_values: npt.ArrayLike, thresholds: np.ndarray) -> int:
    """How many hypotheses Benjamini-Hochberg rejects (adjusted p < alpha) given its ``thresholds``
    (:func:`bh_thresholds`): k* = max{k : #{p < t_k} >= k}, 0 if none; the rejected ones are those
    with p < t_k*."""
    below = (np.asarray(p_values)[None, :] < thresholds[:, None]).sum(1)
    k = np.flatnonzero(below >= np.arange(1, len(thresholds) + 1))
    return int(k[-1]) + 1 if k.size else 0


def bh_open(lo: np.ndarray, hi: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Which p-values must be narrowed before BH's decisions are known, each p_i known only to lie in
    [lo_i, hi_i].

    k* falls as any p rises, so it lies in [k_lo, k_hi] = [k*(hi), k*(lo)]. Hypothesis i is surely
    rejected when hi_i < t_k_lo, surely not when lo_i >= t_k_hi (t_0 = 0); the others are open, and so
    is every one whose interval holds a threshold t_k, k_lo <= k <= k_hi, since those decide k*.
    """
    k_lo, k_hi = bh_rejections(hi, thresholds), bh_rejections(lo, thresholds)
    t_lo = thresholds[k_lo - 1] if k_lo else 0.0
    t_hi = thresholds[k_hi - 1] if k_hi else 0.0
    open_ = ~((hi < t_lo) | (lo >= t_hi))
    relevant = thresholds[max(k_lo, 1) - 1 : k_hi]
    if relevant.size:
        open_ |= ((lo[:, None] < relevant[None, :]) & (hi[:, None] >= relevant[None, :])).any(1)
    return open_
