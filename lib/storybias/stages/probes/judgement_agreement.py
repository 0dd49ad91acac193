"""Human validation of the automated judgements (Feng et al., *Beyond Surface Cues*, arXiv:2608.23026, App. D.2).

Two CSV files, both optional (``probes.human_validation``), described in
``storybias.evidence.judgement_ratings`` and checked by the one checker of human-input files
(``storybias.evidence.human_files``) when the profile loads, before any work; every problem names the
file, the row (as a spreadsheet shows it: the header is row 1) and the column.

**Cultural-marker ratings** (App. D.2.1), one row per rater x marker comparison:

========== ==================================================================================
marker_id  the marker (any string; one marker has one language and one automated score)
language   its source language (the rater's language-linked context)
rater_id   the rater (pseudonymous)
human      the rater's relevance of the marker to their own context, integer 1-7
automated  the automated relevance of the marker to its source-linked context, integer 1-7
keep       optional: the rater's inclusion decision, ``keep`` or ``remove``
automated_en, automated_fr, automated_zh
           optional, all three or none: the marker's automated relevance to each context, 1-7
========== ==================================================================================

Statistics: agreement within two scale points, quadratic-weighted Cohen's kappa and mean absolute error
over comparisons, and the Spearman correlation of each marker's mean human rating with its automated
score; 95% percentile intervals from 2,000 bootstrap resamples of markers and p-values against 10,000
within-language permutations of the automated scores across markers; the pooled human-human baseline
(every pair of raters of the same marker: kappa, MAE, within two points); the human endorsement of the
automated Keep decisions when ``keep`` is given; with the three context scores, the high-agreement
subset (markers with at least two ratings whose human ratings span at most one scale point): the
mean automated self-context advantage of its markers and the share whose own context scores strictly
highest (the paper: 54 markers, 3.28 and 77.8%).

**Protagonist labels** (App. D.2.2), one row per rater x narrative:

========== ==================================================================================
item_id    the narrative
language   its language
genre      ``story`` or ``news``
automated  the automated label: ``female``, ``male`` or ``unknown``
rater_id   the rater
human      ``female``, ``male``, ``unknown`` or one of the finer outcomes that count as unknown:
           ``unclear``, ``non_binary``, ``multiple``, ``no_individual``, ``unable``
========== ==================================================================================

Statistics per language: the item-level human reference (a label held by more than half of at least
two ratings; otherwise unresolved), automated-human agreement and Cohen's kappa post-stratified to the
genre x automated-label distribution of the full implicit corpus, and Fleiss' kappa among the raters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from storybias.evidence.judgement_ratings import CONTEXT_SCORES, CONTEXTS, GENRES, LABELS, SCALE
from storybias.evidence.judgement_ratings import load_label_ratings as load_label_ratings
from storybias.evidence.judgement_ratings import load_marker_ratings as load_marker_ratings
from storybias.stats.agreement import (
    cohen_kappa,
    fleiss_kappa_counts,
    quadratic_kappa,
    quadratic_kappa_fixed_chance,
    weighted_kappa,
)
from storybias.stats.bootstrap import bootstrap_group_counts, percentile_interval

SUBSET_ADVANTAGE = "high_agreement_advantage"  # rows of marker_agreement (figure 19 reads these names)
SUBSET_SELF_HIGHEST = "high_agreement_self_highest"
MARKER_METRICS: tuple[str, ...] = ("within_two", "kappa_quadratic", "mae", "spearman")
HIGHER_IS_BETTER: Mapping[str, bool] = {"within_two": True, "kappa_quadratic": True, "mae": False, "spearman": True}


# --- cultural markers (App. D.2.1) -------------------------------------------------------------


def _marker_stats(h: np.ndarray, a: np.ndarray, marker: np.ndarray, weights: np.ndarray) -> dict[str, np.ndarray]:
    """The four agreement metrics for each row of comparison ``weights`` (resamples x comparisons)."""
    total = weights.sum(1)
    diff = np.abs(h - a)
    out = {
        "within_two": weights @ (diff <= 2) / total,
        "mae": weights @ diff / total,
        "kappa_quadratic": quadratic_kappa(h, a, weights),
    }
    rho = np.full(len(weights), np.nan)
    for b, w in enumerate(weights):
        n_m = np.bincount(marker, weights=w)
        used = n_m > 0
        mean_h = np.bincount(marker, weights=w * h)[used] / n_m[used]
        auto = np.bincount(marker, weights=w * a)[used] / n_m[used]
        reps = np.rint(n_m[used] / np.bincount(marker)[used]).astype(int)  # times the marker was drawn
        x, y = np.repeat(mean_h, reps), np.repeat(auto, reps)
        if len(x) > 2 and np.ptp(x) > 0 and np.ptp(y) > 0:
            rho[b] = stats.spearmanr(x, y).statistic
    out["spearman"] = rho
    return out


def marker_agreement(ratings: pd.DataFrame, n_boot: int = 2000, n_perm: int = 10_000, seed: int = 42) -> pd.DataFrame:
    """Automated-human agreement on the marker ratings (Feng et al. Table 3) and its baselines.

    One row per metric: ``within_two`` (share of comparisons within two scale points), ``kappa_quadratic``
    (sklearn's quadratic-weighted Cohen's kappa over comparisons), ``mae``, ``spearman`` (marker level:
    mean human rating against the automated score), with the 95% interval from ``n_boot`` resamples of
    markers, the mean of the ``n_perm`` within-language permutations of the automated scores across
    markers and the permutation p-value (1 + #permutations as good or better) / (1 + n_perm).
    Rows ``human_human_*`` give the pooled human-human baseline over every pair of raters of a marker
    (pairs ordered by rater_id), and ``keep_endorsement`` the share of comparisons where the rater kept
    the marker (when the CSV has ``keep``), both with marker-bootstrap intervals."""
    data = ratings.sort_values(["marker_id", "rater_id"]).reset_index(drop=True)
    marker_codes, marker_ids = pd.factorize(data["marker_id"])
    h, a = data["human"].to_numpy(float), data["automated"].to_numpy(float)
    n_markers = len(marker_ids)
    point = _marker_stats(h, a, marker_codes, np.ones((1, len(data))))
    point["kappa_quadratic"] = np.array([weighted_kappa(data["human"], data["automated"], SCALE)])
    counts = bootstrap_group_counts(n_markers, n_boot, seed)
    boot = _marker_stats(h, a, marker_codes, counts[:, marker_codes])
    null = _permutation_null(data, h, a, marker_codes, marker_ids, n_perm, seed)
    rows = [
        _metric_row(metric, float(point[metric][0]), boot[metric], null[metric], len(data), n_markers)
        for metric in MARKER_METRICS
    ]
    rows += human_human(data, counts, marker_codes, n_markers)
    if "keep" in data.columns and data["keep"].notna().any():
        rows.append(_keep_endorsement(data, counts, marker_codes))
    if all(c in data.columns for c in CONTEXT_SCORES):
        rows += high_agreement_subset(data, n_boot, seed)
    return pd.DataFrame(rows)


def high_agreement_subset(ratings: pd.DataFrame, n_boot: int = 2000, seed: int = 42) -> list[dict[str, Any]]:
    """Feng et al. App. D.2.1's high-agreement subset: markers with at least two ratings whose human
    ratings span at most one scale point. On them, the automated self-context advantage (the score of
    the marker's own language's context minus the mean of the other two, Eq. 5 at the marker level)
    averaged over markers, and the share of markers whose own context scores strictly highest; 95%
    intervals from ``n_boot`` resamples of the subset's markers. Source languages outside en/fr/zh are
    left out (no own context)."""
    per_marker = ratings.groupby("marker_id").agg(
        language=("language", "first"),
        n=("human", "size"),
        spread=("human", lambda h: h.max() - h.min()),
        **{c: (c, "first") for c in CONTEXT_SCORES},
    )
    subset = per_marker[(per_marker["n"] >= 2) & (per_marker["spread"] <= 1) & per_marker["language"].isin(CONTEXTS)]
    scores = subset[list(CONTEXT_SCORES)].to_numpy(float)
    own_index = np.array([CONTEXTS.index(lang) for lang in subset["language"]], dtype=int)
    own = scores[np.arange(len(subset)), own_index] if len(subset) else np.zeros(0)
    others = (scores.sum(axis=1) - own) / 2 if len(subset) else np.zeros(0)
    masked = scores.copy()
    masked[np.arange(len(subset)), own_index] = -np.inf
    highest = (own > masked.max(axis=1)).astype(float) if len(subset) else np.zeros(0)
    counts = bootstrap_group_counts(len(subset), n_boot, seed) if len(subset) else np.zeros((0, 0))
    rows = []
    for metric, values in ((SUBSET_ADVANTAGE, own - others), (SUBSET_SELF_HIGHEST, highest)):
        boot = counts @ values / counts.sum(axis=1) if len(subset) else np.array([np.nan])
        lo, hi = percentile_interval(boot)
        rows.append(
            {
                "metric": metric,
                "estimate": float(values.mean()) if len(subset) else np.nan,
                "ci_low": lo,
                "ci_high": hi,
                "permutation_mean": np.nan,
                "permutation_p": np.nan,
                "n_comparisons": int(ratings["marker_id"].isin(subset.index).sum()),
                "n_markers": int(len(subset)),
            }
        )
    return rows


def _permutation_null(
    data: pd.DataFrame,
    h: np.ndarray,
    a: np.ndarray,
    marker_codes: np.ndarray,
    marker_ids: pd.Index,
    n_perm: int,
    seed: int,
) -> dict[str, np.ndarray]:
    """The four metrics under ``n_perm`` permutations: each marker's automated score shuffled among
    the markers of its language (in chunks of 500 permutations)."""
    per_marker = data.drop_duplicates("marker_id").set_index("marker_id").loc[marker_ids]
    auto_m, lang_m = per_marker["automated"].to_numpy(float), per_marker["language"].to_numpy()
    rng = np.random.default_rng(seed + 1)
    null: dict[str, list[np.ndarray]] = {k: [] for k in MARKER_METRICS}  # one array per chunk of permutations
    chunk = 500
    for start in range(0, n_perm, chunk):
        size = min(chunk, n_perm - start)
        shuffled = np.tile(auto_m, (size, 1))
        for lang in np.unique(lang_m):
            idx = np.flatnonzero(lang_m == lang)
            shuffled[:, idx] = rng.permuted(np.tile(auto_m[idx], (size, 1)), axis=1)
        a_perm = shuffled[:, marker_codes]  # (size x comparisons)
        diff = np.abs(h - a_perm)
        null["within_two"].append((diff <= 2).mean(1))
        null["mae"].append(diff.mean(1))
        # the marginals do not change under permutation: only E[(h - a)^2] moves
        null["kappa_quadratic"].append(quadratic_kappa_fixed_chance(h, a, a_perm))
        mean_h = np.bincount(marker_codes, weights=h) / np.bincount(marker_codes)
        rh = stats.rankdata(mean_h)
        ra = stats.rankdata(shuffled, axis=1)
        rh_c, ra_c = rh - rh.mean(), ra - ra.mean(1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            null["spearman"].append(ra_c @ rh_c / np.sqrt((ra_c**2).sum(1) * (rh_c**2).sum()))
    return {metric: np.concatenate(null[metric]) if n_perm else np.array([]) for metric in MARKER_METRICS}


def _metric_row(
    metric: str, value: float, boot: np.ndarray, nulls: np.ndarray, n_comparisons: int, n_markers: int
) -> dict[str, Any]:
    """One automated-human row: the estimate, its marker-bootstrap interval and the permutation test."""
    finite = nulls[np.isfinite(nulls)]
    better = (finite >= value - 1e-12) if HIGHER_IS_BETTER[metric] else (finite <= value + 1e-12)
    lo, hi = percentile_interval(boot)
    return {
        "metric": metric,
        "estimate": value,
        "ci_low": lo,
        "ci_high": hi,
        "permutation_mean": float(finite.mean()) if len(finite) else np.nan,
        "permutation_p": float((1 + better.sum()) / (1 + len(finite))) if len(finite) else np.nan,
        "n_comparisons": int(n_comparisons),
        "n_markers": int(n_markers),
    }


def _keep_endorsement(data: pd.DataFrame, counts: np.ndarray, marker_codes: np.ndarray) -> dict[str, Any]:
    """The share of comparisons where the rater kept the marker, with its marker-bootstrap interval."""
    kept = data["keep"].notna().to_numpy()
    y = (data["keep"] == "keep").to_numpy(float)
    w = counts[:, marker_codes] * kept
    lo, hi = percentile_interval(w @ y / w.sum(1))
    return {
        "metric": "keep_endorsement",
        "estimate": float(y[kept].mean()),
        "ci_low": lo,
        "ci_high": hi,
        "permutation_mean": np.nan,
        "permutation_p": np.nan,
        "n_comparisons": int(kept.sum()),
        "n_markers": int(len(np.unique(marker_codes[kept]))),
    }


def human_human(
    data: pd.DataFrame, counts: np.ndarray, marker_codes: np.ndarray, n_markers: int
) -> list[dict[str, Any]]:
    """The pooled human-human baseline (App. D.2.1): every pair of raters of one marker (ordered by
    rater_id); quadratic-weighted kappa, MAE and within-two agreement over pairs, intervals from the
    same marker resamples (``counts``)."""
    first, second, pair_marker = [], [], []
    for code, g in data.groupby(marker_codes, sort=True):
        values = g.sort_values("rater_id")["human"].to_numpy(float)
        for i in range(len(values)):
            for j in range(i + 1, len(values)):
                first.append(values[i])
                second.append(values[j])
                pair_marker.append(code)
    if not first:
        return [
            {
                "metric": f"human_human_{m}",
                "estimate": np.nan,
                "ci_low": np.nan,
                "ci_high": np.nan,
                "permutation_mean": np.nan,
                "permutation_p": np.nan,
                "n_comparisons": 0,
                "n_markers": 0,
            }
            for m in ("kappa_quadratic", "mae", "within_two")
        ]
    x, y, pm = np.array(first), np.array(second), np.array(pair_marker)
    w = counts[:, pm]
    diff = np.abs(x - y)
    with np.errstate(invalid="ignore", divide="ignore"):  # a resample without any rated pair: NaN, left out
        values = {
            "kappa_quadratic": (weighted_kappa(x.astype(int), y.astype(int), SCALE), quadratic_kappa(x, y, w)),
            "mae": (diff.mean(), w @ diff / w.sum(1)),
            "within_two": ((diff <= 2).mean(), w @ (diff <= 2) / w.sum(1)),
        }
    rows = []
    for metric, (value, boot) in values.items():
        lo, hi = percentile_interval(boot)
        rows.append(
            {
                "metric": f"human_human_{metric}",
                "estimate": float(value),
                "ci_low": lo,
                "ci_high": hi,
                "permutation_mean": np.nan,
                "permutation_p": np.nan,
                "n_comparisons": int(len(x)),
                "n_markers": int(len(np.unique(pm))),
            }
        )
    return rows


# --- protagonist labels (App. D.2.2) -------------------------------------------------------------


def item_reference(ratings: pd.DataFrame) -> pd.DataFrame:
    """One row per item: language, genre, automated, n_ratings and ``reference``, the human label held by
    more than half of at least two ratings (None when unresolved)."""
    rows = []
    for item, g in ratings.groupby("item_id", sort=True):
        counts = g["human"].value_counts()
        top = counts.index[0] if len(counts) else None
        resolved = len(g) >= 2 and counts.iloc[0] * 2 > len(g)
        rows.append(
            {
                "item_id": item,
                "language": g["language"].iloc[0],
                "genre": g["genre"].iloc[0],
                "automated": g["automated"].iloc[0],
                "n_ratings": int(len(g)),
                "reference": top if resolved else None,
            }
        )
    return pd.DataFrame(rows)


def poststratification_weights(items: pd.DataFrame, corpus: pd.DataFrame | None) -> pd.Series:
    """Item weights that give each genre x automated-label cell of a language its share of the full
    implicit corpus (``corpus``: language, genre, label, n), split equally among the cell's resolved
    items; cells of the corpus without a resolved item drop out and the rest are renormalised. Without
    a corpus every resolved item weighs 1."""
    weights = pd.Series(0.0, index=items.index)
    resolved = items["reference"].notna()
    if corpus is None or corpus.empty:
        weights[resolved] = 1.0
        return weights
    share = corpus.groupby(["language", "genre", "label"])["n"].sum()
    cells = items[resolved].groupby(["language", "genre", "automated"]).groups
    for (lang, genre, label), index in cells.items():
        weights[index] = float(share.get((lang, genre, label), 0.0)) / len(index)
    for lang in items["language"].unique():
        mask = (items["language"] == lang).to_numpy()
        total = weights[mask].sum()
        if total > 0:
            weights[mask] /= total
    return weights


def fleiss(ratings: pd.DataFrame, seed: int = 42) -> tuple[float, int, int]:
    """Fleiss' kappa among the raters of one language (statsmodels), on the items with the most common
    number k >= 2 of ratings or more (items with more keep a seeded random k of them, since Fleiss' kappa
    needs the same number per item); a single category used is perfect agreement, 1. Returns (kappa,
    items used, k)."""
    per_item = ratings.groupby("item_id").size()
    eligible = per_item[per_item >= 2]
    if eligible.empty:
        return float("nan"), 0, 0
    k = int(eligible.mode().max())
    rng = np.random.default_rng(seed)
    counts = []
    for _item, g in ratings[ratings["item_id"].isin(per_item[per_item >= k].index)].groupby("item_id", sort=True):
        labels = g.sort_values("rater_id")["human"].to_numpy()
        if len(labels) > k:
            labels = labels[np.sort(rng.choice(len(labels), k, replace=False))]
        counts.append([int((labels == lab).sum()) for lab in LABELS])
    table = np.asarray(counts)
    used = table.sum(0) > 0
    if used.sum() < 2:
        return (1.0 if len(table) else float("nan")), len(table), k
    return fleiss_kappa_counts(table[:, used]), len(table), k


def label_agreement(ratings: pd.DataFrame, corpus: pd.DataFrame | None = None, seed: int = 42) -> pd.DataFrame:
    """Per language: items, resolved items, post-stratified automated-human agreement and Cohen's kappa
    (with the item weights of :func:`poststratification_weights`), the unweighted agreement, and Fleiss'
    kappa among the human raters (Feng et al. Sec. 3.1 and App. D.2.2)."""
    items = item_reference(ratings)
    items["weight"] = poststratification_weights(items, corpus)
    rows = []
    for lang, g in items.groupby("language", sort=True):
        r = g[g["reference"].notna()]
        agree = (r["automated"] == r["reference"]).to_numpy(float)
        w = r["weight"].to_numpy(float)
        kappa = cohen_kappa(r["automated"], r["reference"], sample_weight=w)
        fk, n_fk, k = fleiss(ratings[ratings["language"] == lang], seed)
        rows.append(
            {
                "language": lang,
                "n_items": int(len(g)),
                "n_resolved": int(len(r)),
                "agreement_weighted": float(w @ agree / w.sum()) if w.sum() > 0 else np.nan,
                "agreement_unweighted": float(agree.mean()) if len(r) else np.nan,
                "kappa_weighted": float(kappa),
                "fleiss_kappa": fk,
                "fleiss_items": n_fk,
                "fleiss_raters_per_item": k,
                "poststratified": corpus is not None and not corpus.empty,
            }
        )
    return pd.DataFrame(rows)


def corpus_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """The genre x automated-label counts of the full implicit corpus per language (the post-stratification
    target): occupations story/news narratives of stage 06's probe frame, labels outside female/male as unknown."""
    occ = frame[(frame["design"] == "occupations") & frame["genre"].isin(GENRES)]
    label = occ["label"].where(occ["label"].isin(("female", "male")), "unknown")
    return occ.assign(label=label).groupby(["language", "genre", "label"]).size().rename("n").reset_index()
