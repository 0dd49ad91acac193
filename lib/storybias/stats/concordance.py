"""Whether two bias measures rank the same cells alike (issue #30; redesigned in issue #41 item 7).

A *cell* is one model x language; each lens gives it a headline measure. For a pair of measures a and b,
let C_l be the models with both measures in language l, R^a_lm the rank of a among the cells of C_l
(average ranks for ties) and k_l = |C_l|. The statistic is the **within-language rank correlation**

    r_within_language = sum_l sum_{m in C_l} (R^a_lm - (k_l + 1)/2) (R^b_lm - (k_l + 1)/2)
                        / sqrt( sum_l sum_m (R^a_lm - (k_l + 1)/2)^2 * sum_l sum_m (R^b_lm - (k_l + 1)/2)^2 )

that is, Spearman's rho computed on ranks centred within each language and pooled over languages
((k_l + 1)/2 is the mean rank of k_l cells). A language effect (every lens reads more in French) moves
all of a language's cells together and drops out of the centred ranks, and the statistic is 0 in
expectation when the two measures order models independently. One statistic for every pair: no
switch between Kendall and Spearman.

**The test.** Cells of one model share that model's effect in every language of a lens, so cells are
not exchangeable; models are. Under the null hypothesis (the two lenses' model effects are unrelated),
relabelling the models of measure b -- the *same* relabelling in every language: cell (m, l) of b takes
the value of cell (pi(m), l) -- leaves the joint distribution unchanged. The two-sided p-value is
(1 + #{|r*| >= |r|}) / (1 + B) over B random relabellings drawn with the seed, or the exact share of
all M! relabellings when M! does not exceed the requested number (8 models: 40,320). Cells where
either measure is missing drop out, in the data as in every relabelling. ``scipy.stats.permutation_test``
cannot permute by a grouping key, but it can permute one sample of model indices
(``permutation_type='pairings'``), and the statistic applies those indices to the model x language
matrix of b: that is how the same relabelling is used in every language, with scipy's enumeration
when it is cheaper and its p-value.

**Lenses and multiplicity.** Measures of one lens (two readings of the same stories, e.g. M_s and M_b)
are labelled ``within one lens``; their agreement is a consistency check, never agreement between
lenses. Benjamini-Hochberg (``scipy.stats.false_discovery_control``) adjusts the p-values of the
cross-lens pairs as one family, and those of the within-lens pairs as another. A verdict claims
agreement (or disagreement, r < 0) only when the adjusted p is below ``ALPHA``.

**No interval for the correlation.** A confidence interval would need a joint bootstrap: resample the
stories of every cell and recompute every lens on the same resample. The association lens alone takes
minutes per resample, so this is not done. Redrawing each cell inside its own interval (the previous
design) gives a measurement-error band, not a confidence interval: it can exclude its own estimate.
The cross-lens table keeps a per-cell interval only where a simulation shows that it covers
(``storybias.stages.crosslens.measures.INTERVALS``).

**The measurement behind the design** (``tests/test_concordance.py``, generator seed 41; 8 models x 4
languages; each lens its own model effect, sd 1, plus a language effect shared by both lenses, sd 2,
plus noise, sd 0.5; 10% of each measure's cells missing; 300 relabellings per data set). On 1,000 null
data sets a verdict claimed agreement or disagreement in 5.7% (57; over six generator seeds, 285 of
6,000 = 4.75%; nominal 5%). A shuffle of the cells within each language, which ignores that cells of
one model share its effect, claimed 19.0% of the same data sets; the previous design (raw correlation,
within-language cell shuffle, measurement-error band), run on 200 data sets of the same generator,
claimed 14% (issue #41 measured 24% on its own generator). Power when
lens b's model effect is rho x lens a's + sqrt(1 - rho^2) x an independent one, 400 data sets each:
64.0% at rho = 0.9, 33.5% at rho = 0.7, 18.0% at rho = 0.5. Eight models are eight units of evidence,
however many languages they are read in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from math import factorial

import numpy as np
import pandas as pd
from scipy.stats import false_discovery_control, permutation_test, rankdata

MIN_CELLS = 4  # fewer cells with both measures: no correlation (the reason is stated)
# Fewer models with both measures in every language: no test. With 4 models there are 24 relabellings,
# so no two-sided p can fall below 1/24 = 0.042 even before the multiplicity adjustment; 5 give 120.
MIN_MODELS = 5
ALPHA = 0.05  # the Benjamini-Hochberg-adjusted p below which a verdict claims (dis)agreement
ACROSS = "across lenses"
WITHIN = "within one lens"

AGREEMENT_COLUMNS = [
    "measure_a",
    "measure_b",
    "lens_a",
    "lens_b",
    "kind",  # ACROSS or WITHIN
    "n_cells",  # cells with both measures
    "n_models",  # models with both measures in at least one language
    "n_languages",  # languages with both measures for at least one model
    "r_within_language",
    "n_permutations",  # relabellings in the null distribution (all of them when exact)
    "exact",  # every relabelling enumerated
    "p_permutation",  # two-sided, whole-model relabellings
    "p_bh",  # Benjamini-Hochberg over the pairs of the same kind
    "finding",  # see FINDINGS
    "verdict",  # one sentence with the numbers
]
# What a pair's ``finding`` can say (the first two only across lenses, the next two only within one lens).
FINDINGS = (
    "agreement",
    "disagreement",
    "consistent within the lens",
    "inconsistent within the lens",
    "no evidence",
    "not assessed",
)


def _labelled_matrices(
    cells: pd.DataFrame, a: str, b: str, group: str, unit: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The groups, the units, and the two measures as (group x unit) matrices (see model_language_matrices)."""
    x_values, y_values = cells[a].to_numpy(float), cells[b].to_numpy(float)
    keep = np.isfinite(x_values) | np.isfinite(y_values)
    units, column = np.unique(cells[unit].to_numpy()[keep], return_inverse=True)
    groups, row = np.unique(cells[group].to_numpy()[keep], return_inverse=True)
    if np.unique(row * len(units) + column).size < keep.sum():
        raise ValueError(f"cells: more than one row for some {unit} x {group}; one row per cell is needed")
    x = np.full((len(groups), len(units)), np.nan)
    y = np.full((len(groups), len(units)), np.nan)
    x[row, column] = np.where(np.isfinite(x_values[keep]), x_values[keep], np.nan)
    y[row, column] = np.where(np.isfinite(y_values[keep]), y_values[keep], np.nan)
    return groups, units, x, y


def model_language_matrices(
    cells: pd.DataFrame, a: str, b: str, group: str = "language", unit: str = "model"
) -> tuple[np.ndarray, np.ndarray]:
    """The two measures as (group x unit) matrices, NaN where a cell is missing, over the units and the
    groups with a finite value of either measure. One row of ``cells`` per unit x group."""
    _, _, x, y = _labelled_matrices(cells, a, b, group, unit)
    return x, y


def centred_rank_cells(
    cells: pd.DataFrame, a: str, b: str, group: str = "language", unit: str = "model"
) -> pd.DataFrame:
    """The cells with both measures and their ranks within their group minus the group's mean rank
    (columns ``unit``, ``group``, ``rank_a``, ``rank_b``): the points ``r_within_language`` correlates."""
    groups, units, x, y = _labelled_matrices(cells, a, b, group, unit)
    cx, cy = centred_ranks(x, y)
    row, column = np.nonzero(np.isfinite(x) & np.isfinite(y))
    return pd.DataFrame({unit: units[column], group: groups[row], "rank_a": cx[row, column], "rank_b": cy[row, column]})


def centred_ranks(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranks within each row (the last axis: the models of one language) of the cells where both are
    finite, minus the row's mean rank; 0 where either is missing. Leading axes are batches."""
    both = np.isfinite(x) & np.isfinite(y)
    half = (both.sum(axis=-1, keepdims=True) + 1) / 2  # the mean of k average ranks is (k + 1) / 2
    # a missing cell is set to +inf, so that it ranks after every finite one and leaves their ranks alone
    rx = rankdata(np.where(both, x, np.inf), axis=-1)
    ry = rankdata(np.where(both, y, np.inf), axis=-1)
    return np.where(both, rx - half, 0.0), np.where(both, ry - half, 0.0)


def within_language_rank_correlation(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``r_within_language`` of (..., language, model) matrices (see the module docstring): NaN where a
    measure is constant within every language or no language has two cells with both."""
    cx, cy = centred_ranks(x, y)
    numerator = (cx * cy).sum(axis=(-2, -1))
    denominator = np.sqrt((cx**2).sum(axis=(-2, -1)) * (cy**2).sum(axis=(-2, -1)))
    safe = np.where(denominator > 0, denominator, 1.0)
    return np.where(denominator > 0, numerator / safe, np.nan)


def model_permutation_p(x: np.ndarray, y: np.ndarray, n_permutations: int, seed: int) -> tuple[float, int, bool]:
    """Two-sided p of ``r_within_language`` of (language x model) matrices when the models of ``y`` are
    relabelled the same way in every language; (p, relabellings in the null distribution, exact)."""
    n_models = x.shape[-1]

    def statistic(index: np.ndarray, axis: int = -1) -> np.ndarray:
        relabelled = np.moveaxis(y[:, np.asarray(index, int)], 0, -2)  # (..., language, model)
        return np.nan_to_num(np.abs(within_language_rank_correlation(x, relabelled)), nan=0.0)

    result = permutation_test(
        (np.arange(n_models),),
        statistic,
        permutation_type="pairings",
        vectorized=True,
        n_resamples=n_permutations,
        batch=min(n_permutations, 5000),
        alternative="greater",  # on |r|: the two-sided test of the module docstring
        rng=seed,
    )
    exact = factorial(n_models) <= n_permutations
    return float(result.pvalue), len(result.null_distribution), exact


def _unassessed_reason(n_cells: int, most_models: int, r: float) -> str:
    """Why a pair gets no test ("" when it gets one)."""
    if n_cells < MIN_CELLS:
        have = "1 cell has" if n_cells == 1 else f"{n_cells} cells have"
        return f"{have} both measures (at least {MIN_CELLS} needed)"
    if np.isnan(r):
        return "a measure is constant within every language, or no language has two cells with both"
    if most_models < MIN_MODELS:
        return (
            f"at most {most_models} models have both measures in one language "
            f"(at least {MIN_MODELS} needed for a relabelling test)"
        )
    return ""


def verdict(kind: str, r: float, p_bh: float, n_cells: int, reason: str = "") -> tuple[str, str]:
    """The pair's finding (one of ``FINDINGS``) and a sentence with its numbers. Agreement and
    disagreement are only said of pairs across lenses, and only when the adjusted p is below ``ALPHA``."""
    if reason:
        return "not assessed", f"not assessed: {reason}"
    numbers = f"r_within_language = {r:.2f} over {n_cells} cells, Benjamini-Hochberg-adjusted p = {p_bh:.3f}"
    if not p_bh < ALPHA:
        family = "the cross-lens pairs" if kind == ACROSS else "the within-lens pairs"
        return "no evidence", f"no evidence either way: {numbers} (adjusted over {family})"
    if kind == ACROSS:
        finding = "agreement" if r > 0 else "disagreement"
        said = "agreement between lenses" if r > 0 else "disagreement between lenses (opposite orders)"
    else:
        finding = "consistent within the lens" if r > 0 else "inconsistent within the lens"
        said = f"{finding} (two readings of one lens, not agreement between lenses)"
    return finding, f"{said}: {numbers}"


def _pair_row(cells: pd.DataFrame, a: str, b: str, group: str, unit: str, n_permutations: int, seed: int) -> dict:
    """One pair's counts, statistic and raw p (NaN when not assessed, with the reason)."""
    x, y = model_language_matrices(cells, a, b, group, unit)
    both = np.isfinite(x) & np.isfinite(y)
    n_cells = int(both.sum())
    most_models = int(both.sum(axis=1).max()) if both.size else 0
    r = p = float("nan")
    n_used, exact = 0, False
    if n_cells >= MIN_CELLS:
        r = float(within_language_rank_correlation(x, y))
        if not np.isnan(r) and most_models >= MIN_MODELS:
            p, n_used, exact = model_permutation_p(x, y, n_permutations, seed)
    return {
        "n_cells": n_cells,
        "n_models": int(both.any(axis=0).sum()),
        "n_languages": int(both.any(axis=1).sum()),
        "r_within_language": r,
        "n_permutations": n_used,
        "exact": exact,
        "p_permutation": p,
        "reason": _unassessed_reason(n_cells, most_models, r),
    }


def lens_agreement(
    cells: pd.DataFrame,
    measures: Sequence[str],
    group: str = "language",
    n_permutations: int = 2000,
    seed: int = 42,
    *,
    unit: str = "model",
    lenses: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Every pair of ``measures`` (columns of ``cells``, one row per ``unit`` x ``group``) over the cells
    where both are finite: ``r_within_language``, the p of ``n_permutations`` whole-``unit`` relabellings
    (all of them when fewer), its Benjamini-Hochberg adjustment within the pair's kind, and a verdict
    (``AGREEMENT_COLUMNS``). ``lenses``: measure -> lens (None: every measure is its own lens)."""
    lens_of = {m: (lenses or {}).get(m, m) for m in measures}
    rows = []
    for a, b in combinations(measures, 2):
        kind = WITHIN if lens_of[a] == lens_of[b] else ACROSS
        pair = {"measure_a": a, "measure_b": b, "lens_a": lens_of[a], "lens_b": lens_of[b], "kind": kind}
        rows.append(pair | _pair_row(cells, a, b, group, unit, n_permutations, seed) | {"p_bh": float("nan")})
    for kind in (ACROSS, WITHIN):  # Benjamini-Hochberg within each family of pairs
        tested = [row for row in rows if row["kind"] == kind and not np.isnan(row["p_permutation"])]
        adjusted = false_discovery_control([row["p_permutation"] for row in tested]) if tested else []
        for row, p_bh in zip(tested, adjusted):
            row["p_bh"] = float(p_bh)
    for row in rows:
        row["finding"], row["verdict"] = verdict(
            row["kind"], row["r_within_language"], row["p_bh"], row["n_cells"], row.pop("reason")
        )
    return pd.DataFrame(rows, columns=AGREEMENT_COLUMNS).astype({"n_permutations": int, "exact": bool})
