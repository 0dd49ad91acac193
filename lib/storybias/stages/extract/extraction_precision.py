"""Human validation of the extracted narrative lists: BiasedTales-ML's extractor check (Ouyang, Luo, Xiao, Zhu,
*BiasedTales-ML: A Multilingual Dataset for Analyzing Narrative Attribute Distributions in LLM-Generated
Stories*, arXiv:2604.17008, Sec. 3, "extraction").

The study drew a stratified sample of 800 extracted stories (100 per language); two independent
annotators judged every extracted attribute (adjectives, settings, cultural references) as clearly
supported (2), partially supported (1) or unsupported (0) by the story text. It reports Cohen's kappa
between the annotators, 0.618, and a combined precision of 85.625%: the share of extracted traits judged
clearly or partially supported.

storybias reads such judgements from the CSV named by ``extract.human_validation`` (format and checks:
``storybias.evidence.support_ratings``, re-exported here; ``make check-params`` runs the checks
before any work) and computes, per language and over all, per list and over all lists:
:func:`precision_and_kappa`; :func:`compare_published` sets the pooled row beside the published numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from statsmodels.stats.proportion import proportion_confint

from storybias.core import paths
from storybias.evidence.support_ratings import (
    COLUMNS,
    FIELDS,
    MAX_PROBLEMS,
    SCORES,
    check_support_ratings,
    load_support_ratings,
)
from storybias.stats.agreement import cohen_kappa

__all__ = [
    "ALL",
    "COLUMNS",
    "FIELDS",
    "MAX_PROBLEMS",
    "PUBLISHED",
    "SCORES",
    "compare_published",
    "precision_and_kappa",
    "from_settings",
    "load_support_ratings",
    "pairwise_kappa",
    "precision",
    "check_support_ratings",
]

ALL = "all"  # the language or field of a pooled row
SUPPORTED = 1  # score >= 1: "clearly or partially supported", the study's precision
CLEAR = 2  # score 2: clearly supported
ITEM_KEY: tuple[str, ...] = ("story_id", "field", "item")  # one extracted item (the annotators judge it)

# BiasedTales-ML Sec. 3 ("extraction"), as published. 0.85625 = 137/160: a share of a whole multiple of
# 160 judgements or stories; the paper does not give the counts, so only the share is compared.
PUBLISHED: Mapping[str, float] = {
    "kappa": 0.618,  # Cohen's kappa between the two annotators
    "precision": 0.85625,  # share of extracted traits judged clearly or partially supported
    "n_stories": 800,  # the stratified sample
    "stories_per_language": 100,
    "n_languages": 8,
    "n_annotators": 2,
}


def pairwise_kappa(judgements: pd.DataFrame) -> tuple[float, int, int]:
    """Cohen's kappa between annotators over the items both scored: (kappa, annotator pairs entering it,
    items scored by at least two annotators).

    An item is (story_id, field, item); each pair of annotators is compared on the items both of them
    scored. Unweighted kappa (``sklearn.metrics.cohen_kappa_score`` through
    :func:`storybias.stats.agreement.cohen_kappa`): BiasedTales-ML reports "Cohen's kappa" on the 0-1-2
    scale without saying weighted, so the three scores are treated as categories. With two annotators
    this is their kappa; with more, the mean of the pairwise kappas (each pair weighing the same, Light's
    kappa), over the pairs where kappa is defined (NaN: no common item, or one score only)."""
    wide = judgements.pivot(index=list(ITEM_KEY), columns="annotator_id", values="score")
    kappas = []
    for first, second in combinations(sorted(wide.columns), 2):
        both = wide[[first, second]].dropna()
        if len(both):
            kappas.append(cohen_kappa(both[first].astype(int).tolist(), both[second].astype(int).tolist()))
    finite = [k for k in kappas if np.isfinite(k)]
    n_shared = int((wide.notna().sum(axis=1) >= 2).sum())
    return (float(np.mean(finite)) if finite else float("nan")), len(finite), n_shared


def precision(scores: pd.Series, threshold: int = SUPPORTED) -> tuple[float, int, int, float, float]:
    """The share of judgements with score >= ``threshold`` (1: BiasedTales-ML's precision, "clearly or
    partially supported"; 2: clearly supported) with its Wilson 95% interval (statsmodels
    ``proportion_confint(method="wilson")``): (share, count, judgements, low, high); NaNs without a
    judgement. The interval treats the judgements as independent, which two annotators of one item and
    the items of one story are not: it is a nominal interval, narrower than one that resamples stories."""
    n = int(len(scores))
    count = int((scores >= threshold).sum())
    if n == 0:
        return float("nan"), 0, 0, float("nan"), float("nan")
    low, high = proportion_confint(count, n, alpha=0.05, method="wilson")
    return count / n, count, n, float(low), float(high)


def _summary(judgements: pd.DataFrame) -> dict[str, Any]:
    """One row of :func:`precision_and_kappa`: the counts, the kappa and both precisions."""
    kappa, n_pairs, n_shared = pairwise_kappa(judgements)
    share, supported, n, low, high = precision(judgements["score"])
    clear, n_clear, _, clear_low, clear_high = precision(judgements["score"], CLEAR)
    return {
        "n_stories": int(judgements["story_id"].nunique()),
        "n_items": int(len(judgements.drop_duplicates(list(ITEM_KEY)))),
        "n_annotators": int(judgements["annotator_id"].nunique()),
        "n_judgements": n,
        "n_items_shared": n_shared,  # scored by at least two annotators: the items kappa reads
        "n_annotator_pairs": n_pairs,  # pairs whose kappa is defined (mean pairwise kappa over them)
        "kappa": kappa,
        "n_supported": supported,
        "precision": share,
        "precision_low": low,
        "precision_high": high,
        "n_clear": n_clear,
        "precision_clear": clear,
        "precision_clear_low": clear_low,
        "precision_clear_high": clear_high,
    }


def precision_and_kappa(judgements: pd.DataFrame) -> pd.DataFrame:
    """BiasedTales-ML's extractor validation (arXiv:2604.17008, Sec. 3) on the judgements of
    :func:`load_support_ratings`: one row per language (sorted, then ``all``) x list (adjectives,
    settings, cultural_refs as present, then ``all``).

    Columns: n_stories, n_items (distinct story x list x item), n_annotators, n_judgements (item x
    annotator), n_items_shared and n_annotator_pairs (what kappa reads), ``kappa`` (:func:`pairwise_kappa`),
    ``precision`` = share of judgements with score >= 1 (the study's "clearly or partially supported",
    its 85.625%) with its Wilson 95% interval, ``precision_clear`` = share with score 2, with its interval;
    n_supported and n_clear count them."""
    rows = []
    languages = [*sorted(judgements["language"].unique()), ALL]
    fields = [*(f for f in FIELDS if (judgements["field"] == f).any()), ALL]
    for language in languages:
        in_language = judgements if language == ALL else judgements[judgements["language"] == language]
        for field in fields:
            subset = in_language if field == ALL else in_language[in_language["field"] == field]
            if len(subset):
                rows.append({"language": language, "field": field, **_summary(subset)})
    return pd.DataFrame(rows)


def _pooled(table: pd.DataFrame) -> pd.Series:
    """The row of ``table`` (:func:`precision_and_kappa`) pooled over languages and lists."""
    pooled = table[(table["language"] == ALL) & (table["field"] == ALL)]
    if pooled.empty:
        raise ValueError("the table has no pooled row (language all, field all): no judgement at all?")
    return pooled.iloc[0]


def compare_published(table: pd.DataFrame) -> pd.DataFrame:
    """The published numbers of BiasedTales-ML Sec. 3 (:data:`PUBLISHED`) beside the reproduced ones
    (the pooled row of :func:`precision_and_kappa`): quantity, published, reproduced, ci_low and
    ci_high (precision: Wilson 95%), ``published_in_ci`` (the published precision inside the reproduced
    interval; NaN where there is no interval) and a note."""
    pooled = _pooled(table)
    per_language = table[(table["language"] != ALL) & (table["field"] == ALL)]["n_stories"]
    nan = float("nan")
    rows: list[dict[str, Any]] = [
        {
            "quantity": "kappa",
            "reproduced": pooled["kappa"],
            "note": f"unweighted Cohen's kappa over {pooled['n_items_shared']} items scored by two annotators"
            + (f" (mean of {pooled['n_annotator_pairs']} pairs)" if pooled["n_annotator_pairs"] > 1 else ""),
        },
        {
            "quantity": "precision",
            "reproduced": pooled["precision"],
            "ci_low": pooled["precision_low"],
            "ci_high": pooled["precision_high"],
            "note": f"{pooled['n_supported']} of {pooled['n_judgements']} judgements scored 1 or 2",
        },
        {"quantity": "n_stories", "reproduced": float(pooled["n_stories"]), "note": "stories judged"},
        {
            "quantity": "stories_per_language",
            "reproduced": float(per_language.mean()) if len(per_language) else nan,
            "note": f"mean; min {per_language.min()}, max {per_language.max()}" if len(per_language) else "",
        },
        {"quantity": "n_languages", "reproduced": float(len(per_language)), "note": "languages judged"},
        {"quantity": "n_annotators", "reproduced": float(pooled["n_annotators"]), "note": "annotators"},
    ]
    out = pd.DataFrame(rows)
    out.insert(1, "published", [float(PUBLISHED[q]) for q in out["quantity"]])
    for column in ("ci_low", "ci_high"):
        if column not in out:
            out[column] = nan
    inside = (out["published"] >= out["ci_low"]) & (out["published"] <= out["ci_high"])
    out["published_in_ci"] = inside.astype(object).where(out["ci_low"].notna(), nan)
    return out[["quantity", "published", "reproduced", "ci_low", "ci_high", "published_in_ci", "note"]]


def from_settings(path: str | Path | None) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """``extract.human_validation`` read (relative to the repo root), checked and summarised:
    (:func:`precision_and_kappa`, :func:`compare_published`), or None when the key is null."""
    if path is None:
        return None
    table = precision_and_kappa(load_support_ratings(paths.resolve(path)))
    return table, compare_published(table)
