"""Whether two bias measures rank the same cells alike (issue #30: the three studies' lenses side by side).

A *cell* is one model x language (x design); each lens gives it a headline measure with an interval. For a
pair of measures over the cells where both exist:

- the rank correlation: Spearman's rho, or Kendall's tau-b when there are fewer than ``KENDALL_BELOW``
  cells (its null distribution is better behaved on few ranks); both from scipy;
- a permutation p-value that shuffles one measure's values among the cells **of the same language**
  only, so that a language effect shared by both measures (say, every lens finds more in French) cannot
  by itself make them agree: two-sided, ``(1 + #{|r*| >= |r|}) / (1 + n_permutations)``;
- an interval from the cells' own uncertainty: each replicate draws every cell's value from a normal
  distribution whose 95% interval is the cell's bootstrap (over stories) interval, then recomputes the
  correlation; the percentile interval of the replicates. This propagates the story-level bootstrap of
  each lens without rerunning the lenses (the association tests alone take minutes per resample); it
  assumes a symmetric interval, which storybias' percentile intervals are only approximately.

scipy has the correlations but no within-group permutation test over paired cells; the loop is small
and written here.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np
import pandas as pd
from scipy.stats import kendalltau, spearmanr

KENDALL_BELOW = 10  # fewer cells than this: Kendall's tau-b instead of Spearman's rho
MIN_CELLS = 4  # fewer cells with both measures: no correlation (the reason is stated)
Z95 = 1.959963984540054  # the normal quantile of a 95% interval's half-width


def rank_correlation(x: np.ndarray, y: np.ndarray, method: str) -> float:
    """Spearman's rho or Kendall's tau-b of the paired values (NaN when either is constant)."""
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    result = spearmanr(x, y) if method == "spearman" else kendalltau(x, y)
    return float(result.statistic)


def within_group_permutation_p(
    x: np.ndarray, y: np.ndarray, groups: Sequence[str], method: str, n_permutations: int, seed: int
) -> float:
    """Two-sided p of the rank correlation when ``y`` is shuffled among the cells of each group only."""
    observed = rank_correlation(x, y, method)
    if np.isnan(observed):
        return float("nan")
    rng = np.random.default_rng(seed)
    labels = np.asarray(groups)
    members = [np.flatnonzero(labels == g) for g in pd.unique(labels)]
    hits = 0
    for _ in range(n_permutations):
        shuffled = y.copy()
        for index in members:
            shuffled[index] = y[rng.permutation(index)]
        r = rank_correlation(x, shuffled, method)
        hits += bool(np.abs(r) >= abs(observed) - 1e-12) if not np.isnan(r) else 0
    return (1 + hits) / (1 + n_permutations)


def interval_from_cells(
    x: np.ndarray,
    y: np.ndarray,
    x_bounds: tuple[np.ndarray, np.ndarray],
    y_bounds: tuple[np.ndarray, np.ndarray],
    method: str,
    n_replicates: int,
    seed: int,
) -> tuple[float, float]:
    """The 95% percentile interval of the correlation when each cell's value is redrawn within its own
    interval (a normal with that 95% half-width; a cell without an interval keeps its value)."""
    rng = np.random.default_rng(seed)

    def spread(bounds: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        sd = (np.asarray(bounds[1], float) - np.asarray(bounds[0], float)) / (2 * Z95)
        return np.nan_to_num(np.clip(sd, 0, None), nan=0.0)

    sx, sy = spread(x_bounds), spread(y_bounds)
    draws = [
        rank_correlation(x + rng.normal(size=len(x)) * sx, y + rng.normal(size=len(y)) * sy, method)
        for _ in range(n_replicates)
    ]
    finite = np.asarray([d for d in draws if not np.isnan(d)])
    if not len(finite):
        return float("nan"), float("nan")
    return float(np.percentile(finite, 2.5)), float(np.percentile(finite, 97.5))


def verdict(n: int, r: float, p: float, low: float, high: float) -> str:
    """One sentence on a pair: too few cells, agree, disagree, or no evidence either way."""
    if n < MIN_CELLS:
        have = "1 cell has" if n == 1 else f"{n} cells have"
        return f"not assessed: {have} both measures (at least {MIN_CELLS} needed)"
    if np.isnan(r):
        return f"not assessed: a measure is constant over the {n} cells"
    direction = "agree" if r > 0 else "disagree (rank cells in opposite orders)"
    if p < 0.05 and (low > 0 or high < 0):
        return f"{direction}: r = {r:.2f} over {n} cells, within-language permutation p = {p:.3f}"
    return f"no evidence of agreement: r = {r:.2f} over {n} cells, p = {p:.2f}, interval [{low:.2f}, {high:.2f}]"


AGREEMENT_COLUMNS = [
    "measure_a",
    "measure_b",
    "n_cells",
    "method",
    "r",
    "ci_low",
    "ci_high",
    "p_permutation",
    "verdict",
]


def lens_agreement(
    cells: pd.DataFrame,
    measures: Sequence[str],
    group: str = "language",
    n_permutations: int = 2000,
    n_replicates: int = 1000,
    seed: int = 42,
) -> pd.DataFrame:
    """Every pair of ``measures`` (columns of ``cells``, with ``<measure>_low`` / ``<measure>_high``
    interval columns where they exist) over the cells where both are finite: rank correlation,
    within-``group`` permutation p, interval from the cells' intervals and a verdict (``AGREEMENT_COLUMNS``)."""
    rows = []
    for a, b in combinations(measures, 2):
        both = cells[np.isfinite(cells[a].astype(float)) & np.isfinite(cells[b].astype(float))]
        n = len(both)
        method = "kendall" if n < KENDALL_BELOW else "spearman"
        r = p = low = high = float("nan")
        if n >= MIN_CELLS:
            x, y = both[a].to_numpy(float), both[b].to_numpy(float)
            r = rank_correlation(x, y, method)
            p = within_group_permutation_p(x, y, list(both[group]), method, n_permutations, seed)
            low, high = interval_from_cells(x, y, _bounds(both, a), _bounds(both, b), method, n_replicates, seed)
        rows.append(
            {
                "measure_a": a,
                "measure_b": b,
                "n_cells": n,
                "method": method,
                "r": r,
                "ci_low": low,
                "ci_high": high,
                "p_permutation": p,
                "verdict": verdict(n, r, p, low, high),
            }
        )
    return pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)


def _bounds(cells: pd.DataFrame, measure: str) -> tuple[np.ndarray, np.ndarray]:
    """A measure's interval columns, or its value on both sides (no interval) when absent."""
    value = cells[measure].to_numpy(float)
    low = cells[f"{measure}_low"].to_numpy(float) if f"{measure}_low" in cells else value
    high = cells[f"{measure}_high"].to_numpy(float) if f"{measure}_high" in cells else value
    return low, high
