"""Whether a run could have seen a published association: the power of the run's own table to detect a
published cell's effect (``published_comparison``'s ``missed`` against ``underpowered``).

The published effect is planted in a table with the run's margins: every row draws its stories from the
run's column shares q (the null), except the published base value's row, whose share of the published
compared value becomes lift x q_c (capped at 0.99; the published fraction where the run never saw the
value), the other columns scaled down in proportion. Each simulated table is decided by bounds that are
never more lenient than the stage's tests, so the power is a lower bound and "missed" (power >= 80 %)
is never claimed for a table that could not see the effect:

- the pair: Pearson's chi-square p < alpha / m, m the run's family size (Bonferroni, which rejects no
  more than Benjamini-Hochberg). The asymptotic p-value stands in for the Monte-Carlo Fisher test to
  keep thousands of tables fast (deliberately not the stage's Monte-Carlo test);
- the cell: one-sided Fisher (hypergeometric) p < alpha / (K c(K)) over the table's K cells,
  c(K) = sum 1/i (each Benjamini-Yekutieli adjusted p is at most p K c(K));
- the stated rule besides: lift >= 2 and a medium or large bias-corrected Cramer's V.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

POWER_TARGET = 0.8  # "missed" needs the run's table to see the published effect this often
POWER_SIMULATIONS = 400
MAX_SHARE = 0.99


def planted_probabilities(counts: np.ndarray, row: int, col: int, lift: float, fraction: float) -> np.ndarray:
    """Per row of ``counts`` (r x k), the probabilities of its k columns with the published effect planted
    in cell (``row``, ``col``): q = the run's column shares; row ``row`` gets lift x q_col (``fraction``
    where q_col is 0), capped at MAX_SHARE, its other columns q scaled to the rest."""
    counts = np.asarray(counts, float)
    if counts.ndim != 2 or counts.sum() <= 0:
        raise ValueError("counts must be a non-empty r x k table of stories")
    share = counts.sum(0) / counts.sum()
    target = lift * share[col] if share[col] > 0 else fraction
    if not np.isfinite(target) or target <= 0:
        raise ValueError(f"lift {lift} and fraction {fraction} give no share to plant")
    target = min(float(target), MAX_SHARE)
    probs = np.tile(share, (counts.shape[0], 1))
    rest = 1.0 - share[col]
    planted = share * ((1.0 - target) / rest) if rest > 0 else np.full_like(share, (1.0 - target) / (len(share) - 1))
    planted[col] = target
    probs[row] = planted
    return probs


def _corrected_v(chi2: np.ndarray, n: float, r: int, k: np.ndarray) -> np.ndarray:
    """Bergsma's bias-corrected Cramer's V (``stats.contingency.cramers_v_corrected``), vectorized."""
    phi2 = np.maximum(0.0, chi2 / n - (k - 1) * (r - 1) / (n - 1))
    k_c, r_c = k - (k - 1) ** 2 / (n - 1), r - (r - 1) ** 2 / (n - 1)
    denominator = np.minimum(k_c - 1, r_c - 1)
    return np.where(denominator > 0, np.sqrt(phi2 / np.where(denominator > 0, denominator, 1)), 0.0)


def detection_power(
    counts: np.ndarray,
    row: int,
    col: int,
    lift: float,
    fraction: float,
    family_size: int,
    alpha: float = 0.05,
    n_simulations: int = POWER_SIMULATIONS,
    seed: int = 0,
) -> tuple[float, float]:
    """(power under the files' rule, power under the stated rule) of the run's table ``counts`` (its row
    totals kept) to detect the published cell (``row``, ``col``) of effect ``lift`` (module docstring)."""
    if family_size < 1:
        raise ValueError("family_size must be >= 1")
    counts = np.asarray(counts, np.int64)
    probs = planted_probabilities(counts, row, col, lift, fraction)
    totals = counts.sum(1)
    rng = np.random.default_rng(seed)
    sims = rng.multinomial(totals, probs, size=(n_simulations, len(totals))).astype(float)  # S x r x k
    n = float(totals.sum())
    col_totals = sims.sum(1)  # S x k
    expected = totals[None, :, None] * col_totals[:, None, :] / n
    seen = col_totals > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        chi2 = np.where(expected > 0, (sims - expected) ** 2 / expected, 0.0).sum((1, 2))
    k = seen.sum(1)
    df = (len(totals) - 1) * (k - 1)
    pair_p = np.where(df > 0, stats.chi2.sf(chi2, np.maximum(df, 1)), 1.0)
    a = sims[:, row, col]
    cell_p = stats.hypergeom.sf(a - 1, n, col_totals[:, col], totals[row])
    cells = len(totals) * k
    harmonic = np.array([np.sum(1.0 / np.arange(1, c + 1)) for c in range(1, int(cells.max()) + 1)])
    files = (pair_p < alpha / family_size) & (cell_p < alpha / (cells * harmonic[cells - 1])) & (df > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lift_seen = a / expected[:, row, col]
    v = _corrected_v(chi2, n, len(totals), k)
    medium = v >= 0.3 / np.sqrt(np.maximum(np.minimum(len(totals), k) - 1, 1))
    stated = files & (lift_seen >= 2) & medium
    return float(files.mean()), float(stated.mean())
