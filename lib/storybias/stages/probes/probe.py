"""Feng et al.'s embedding probes (Sec. 3.2, App. C): grouped out-of-fold scores of a logistic probe,
AUC and balanced accuracy with vectorised group-bootstrap intervals (the resampled groups as a
multinomial count matrix, every resample's AUC from weighted rank sums), the cells a probe reads, and
stage 06's table schemas. Cue deletion (gendered words and the protagonist's name) lives in
``storybias.stages.probes.cues`` and is re-exported here."""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedGroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from storybias.config import lenses
from storybias.config.lenses import genre_of as genre_of
from storybias.config.lenses import probe_groups
from storybias.config.params import UmapSettings
from storybias.stages.probes.cues import ARABIC_OPTIONAL as ARABIC_OPTIONAL
from storybias.stages.probes.cues import MIN_NAME_COMPONENT as MIN_NAME_COMPONENT
from storybias.stages.probes.cues import NAME_SEPARATORS as NAME_SEPARATORS
from storybias.stages.probes.cues import NOT_A_NAME as NOT_A_NAME
from storybias.stages.probes.cues import CueList as CueList
from storybias.stages.probes.cues import delete_cues as delete_cues
from storybias.stages.probes.cues import load_cues as load_cues
from storybias.stages.probes.cues import name_terms as name_terms
from storybias.stages.probes.cues import tidy_spaces as tidy_spaces
from storybias.stats.bootstrap import bootstrap_group_counts, percentile_interval

_TEXT, _REAL, _COUNT = pa.string(), pa.float64(), pa.int64()


LABELS: tuple[str, str] = ("female", "male")  # y = 1 for female, 0 for male


CONTEXTS: tuple[str, ...] = ("en", "fr", "zh")  # the three language-linked contexts of the relevance scores


GENRES: tuple[str, ...] = ("stereotales", "bedtime", "story", "news")


MARKER_VERSIONS: tuple[str, ...] = ("original", "translated", "masked")


PROBE_VARIANTS: tuple[str, ...] = ("full_sample", "full", "cue_deleted", "delta")


TASK_COLUMN = "cond_task"


OCCUPATION_COLUMN = "cond_occupation"


ATTRIBUTE_COLUMN = "cond_attribute"  # the stereotales prompt's fixed attribute


IMPLICIT_TASKS = lenses.IMPLICIT_TASKS  # the explicit task (sentence completion) has no narrative to probe


PROBE_C = 1.0  # inverse L2 strength of the probe (scikit-learn's default), on standardised embeddings


def check_cell(
    y: np.ndarray, groups: np.ndarray, n_splits: int, min_per_class: int, classes: Mapping[Any, str] | None = None
) -> str:
    """'ok', or why a cell cannot be probed: a class (``classes``: value -> name; default 1 female,
    0 male) with fewer than ``min_per_class`` items, or spread over fewer than ``n_splits`` groups (a
    group-stratified fold would then miss it)."""
    y, groups = np.asarray(y), np.asarray(groups)
    classes = {1: "female", 0: "male"} if classes is None else classes
    if len(y) == 0:
        return "skipped: no items"
    for value, name in classes.items():
        mask = y == value
        if mask.sum() < min_per_class:
            return f"skipped: {int(mask.sum())} {name} < min_per_class {min_per_class}"
        n_g = len(np.unique(groups[mask]))
        if n_g < n_splits:
            return f"skipped: {name} items in {n_g} groups < n_splits {n_splits}"
    return "ok"


def group_folds(y: np.ndarray, groups: np.ndarray, n_splits: int, seed: int) -> np.ndarray:
    """Fold (0 .. n_splits-1) of every item under StratifiedGroupKFold(shuffle=True, seed): a group is
    never split across folds (Feng et al. Sec. 3.3.2: model-occupation groups kept within one fold)."""
    folds = np.full(len(y), -1, dtype=np.int64)
    splitter = StratifiedGroupKFold(n_splits=n_splits, shuffle=True, random_state=seed)
    for k, (_, test) in enumerate(splitter.split(np.zeros(len(y)), y, groups)):
        folds[test] = k
    return folds


def _classifier():
    return make_pipeline(StandardScaler(), LogisticRegression(C=PROBE_C, class_weight="balanced", max_iter=5000))


class ProbeSkipped(ValueError):
    """A fold's training part holds a single class."""


def out_of_fold(X: np.ndarray, y: np.ndarray, folds: np.ndarray, kind: str = "score") -> np.ndarray:
    """Out-of-fold outputs of the balanced logistic-regression probe: decision scores for two classes
    (``kind='score'``), predicted classes otherwise (``'predict'``, multinomial)."""
    out = np.zeros(len(y)) if kind == "score" else np.empty(len(y), dtype=np.asarray(y).dtype)
    # One BLAS thread: lbfgs on probe-sized problems is dominated by thread start-up (8x faster here).
    with warnings.catch_warnings(), threadpool_limits(limits=1, user_api="blas"):
        warnings.simplefilter("ignore", category=UserWarning)
        for k in np.unique(folds):
            test = folds == k
            train = ~test
            if len(np.unique(y[train])) < len(np.unique(y)):
                raise ProbeSkipped(f"skipped: training part of fold {k} lacks a class")
            clf = _classifier().fit(X[train], y[train])
            out[test] = clf.decision_function(X[test]) if kind == "score" else clf.predict(X[test])
    return out


def weighted_auc(scores: np.ndarray, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """ROC AUC of ``scores`` for the positive class ``y == 1`` under each row of ``weights`` (B x n):
    AUC_b = sum_{i pos, j neg} w_bi w_bj ([s_i > s_j] + [s_i = s_j] / 2) / (W_b,pos W_b,neg), from
    weighted ranks (ties share their midrank). All-ones weights give sklearn's roc_auc_score. NaN when
    a resample holds one class only."""
    scores = np.asarray(scores, float)
    weights = np.atleast_2d(np.asarray(weights, float))
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    pos = np.asarray(y)[order] == 1
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    w = weights[:, order]
    pos_u = np.add.reduceat(w * pos, starts, axis=1)
    neg_u = np.add.reduceat(w * ~pos, starts, axis=1)
    neg_below = np.cumsum(neg_u, axis=1) - neg_u
    num = (pos_u * (neg_below + 0.5 * neg_u)).sum(axis=1)
    den = pos_u.sum(axis=1) * neg_u.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def bootstrap_auc(
    scores: np.ndarray, y: np.ndarray, group_index: np.ndarray, counts: np.ndarray, chunk: int = 250
) -> np.ndarray:
    """AUC of every group-bootstrap resample: item i weighs counts[b, group_index[i]] in resample b."""
    out = np.empty(len(counts))
    for start in range(0, len(counts), chunk):
        out[start : start + chunk] = weighted_auc(scores, y, counts[start : start + chunk][:, group_index])
    return out


def bootstrap_balanced_accuracy(
    y: np.ndarray, pred: np.ndarray, group_index: np.ndarray, counts: np.ndarray
) -> np.ndarray:
    """Balanced accuracy (mean per-class recall over the classes present) of every group-bootstrap
    resample, via per-group correct/total counts: (B x G) @ (G x K)."""
    classes, y_idx = np.unique(y, return_inverse=True)
    n_groups = counts.shape[1]
    total = np.zeros((n_groups, len(classes)))
    correct = np.zeros((n_groups, len(classes)))
    np.add.at(total, (group_index, y_idx), 1.0)
    hit = np.asarray(pred) == np.asarray(y)
    np.add.at(correct, (group_index[hit], y_idx[hit]), 1.0)
    t, c = counts @ total, counts @ correct
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = np.where(t > 0, c / np.where(t > 0, t, 1), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)
        return np.nanmean(recall, axis=1)


@dataclass
class Timings:
    """Seconds spent per part of the stage (reported in the manifest)."""

    probe: float = 0.0
    bootstrap: float = 0.0
    umap: float = 0.0
    ner: float = 0.0
    cues: float = 0.0


def probe_auc(
    X: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    n_splits: int,
    n_boot: int,
    seed: int,
    min_per_class: int,
    timings: Timings | None = None,
) -> dict[str, Any]:
    """Feng et al. Sec. 3.3.2: out-of-fold ROC AUC of the probe with a 95% group-bootstrap interval."""
    timings = timings or Timings()
    y = np.asarray(y)
    row = _counts_row(y, groups)
    status = check_cell(y, groups, n_splits, min_per_class)
    if status != "ok":
        return {**row, "auc": np.nan, "ci_low": np.nan, "ci_high": np.nan, "status": status}
    t0 = time.perf_counter()
    folds = group_folds(y, groups, n_splits, seed)
    try:
        scores = out_of_fold(X, y, folds)
    except ProbeSkipped as exc:
        return {**row, "auc": np.nan, "ci_low": np.nan, "ci_high": np.nan, "status": str(exc)}
    timings.probe += time.perf_counter() - t0
    t0 = time.perf_counter()
    _, group_index = np.unique(groups, return_inverse=True)
    counts = bootstrap_group_counts(group_index.max() + 1, n_boot, seed)
    boot = bootstrap_auc(scores, y, group_index, counts)
    timings.bootstrap += time.perf_counter() - t0
    lo, hi = percentile_interval(boot)
    return {
        **row,
        "auc": float(weighted_auc(scores, y, np.ones((1, len(y))))[0]),
        "ci_low": lo,
        "ci_high": hi,
        "status": "ok",
        "scores": scores,
        "folds": folds,
    }


def paired_probe(
    X_full: np.ndarray,
    X_deleted: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    n_splits: int,
    n_boot: int,
    seed: int,
    min_per_class: int,
    timings: Timings | None = None,
) -> list[dict[str, Any]]:
    """Feng et al. Table 1: full-text and cue-deleted AUC on the same paired subset and the same folds,
    and Delta AUC = cue-deleted - full with its interval from the same resampled groups."""
    timings = timings or Timings()
    y = np.asarray(y)
    row = _counts_row(y, groups)
    status = check_cell(y, groups, n_splits, min_per_class)
    if status == "ok":
        t0 = time.perf_counter()
        folds = group_folds(y, groups, n_splits, seed)
        try:
            s_full = out_of_fold(X_full, y, folds)
            s_del = out_of_fold(X_deleted, y, folds)
        except ProbeSkipped as exc:
            status = str(exc)
        timings.probe += time.perf_counter() - t0
    if status != "ok":
        return [
            {**row, "variant": v, "auc": np.nan, "ci_low": np.nan, "ci_high": np.nan, "status": status}
            for v in ("full", "cue_deleted", "delta")
        ]
    t0 = time.perf_counter()
    _, group_index = np.unique(groups, return_inverse=True)
    counts = bootstrap_group_counts(group_index.max() + 1, n_boot, seed)
    b_full = bootstrap_auc(s_full, y, group_index, counts)
    b_del = bootstrap_auc(s_del, y, group_index, counts)
    timings.bootstrap += time.perf_counter() - t0
    ones = np.ones((1, len(y)))
    a_full, a_del = float(weighted_auc(s_full, y, ones)[0]), float(weighted_auc(s_del, y, ones)[0])
    rows = []
    for variant, value, boot in (
        ("full", a_full, b_full),
        ("cue_deleted", a_del, b_del),
        ("delta", a_del - a_full, b_del - b_full),
    ):
        lo, hi = percentile_interval(boot)
        rows.append({**row, "variant": variant, "auc": value, "ci_low": lo, "ci_high": hi, "status": "ok"})
    return rows


def _counts_row(y: np.ndarray, groups: np.ndarray) -> dict[str, Any]:
    y = np.asarray(y)
    return {
        "n": int(len(y)),
        "n_female": int((y == 1).sum()),
        "n_male": int((y == 0).sum()),
        "n_groups": int(len(np.unique(groups))) if len(y) else 0,
    }


def probe_frame(
    extractions: pd.DataFrame, filtered: pd.DataFrame, stereotales_attribute: str | None = None
) -> pd.DataFrame:
    """One row per parsed implicit narrative: story_id, language, design, genre, model, prompt_id,
    group and grouping (``storybias.config.lenses.probe_groups``: model x occupation for occupations,
    model x prompt_id otherwise, model x prompt text for a stereotales story without a scenario), label,
    name, text, markers. ``stereotales_attribute``: keep only the stereotales stories whose prompt fixed
    that attribute."""
    cols = ["story_id", "design", "language", "model", "prompt_id", "text", TASK_COLUMN, OCCUPATION_COLUMN]
    cols += [ATTRIBUTE_COLUMN, "cond_scenario", "prompt"]
    data = extractions.merge(filtered[[c for c in cols if c in filtered.columns]], on="story_id", how="inner")
    data = data[data["parse_ok"].fillna(False).astype(bool)]
    if stereotales_attribute is not None:
        attribute = data[ATTRIBUTE_COLUMN] if ATTRIBUTE_COLUMN in data else pd.Series(None, index=data.index)
        data = data[(data["design"] != "stereotales") | (attribute == stereotales_attribute)]
    for col in (TASK_COLUMN, OCCUPATION_COLUMN):
        if col not in data.columns:
            data[col] = np.nan
    genre = [genre_of(d, t) for d, t in zip(data["design"], data[TASK_COLUMN])]
    out = pd.DataFrame(
        {
            "story_id": data["story_id"].astype(str).to_numpy(),
            "language": data["language"].to_numpy(),
            "design": data["design"].to_numpy(),
            "genre": genre,
            "model": data["model"].to_numpy(),
            "prompt_id": data["prompt_id"].to_numpy(),
            "label": data["protagonist_gender"].to_numpy(),
            "name": data["protagonist_name"].to_numpy() if "protagonist_name" in data else None,
            "text": data["text"].fillna("").astype(str).to_numpy(),
            "markers": data["markers"].to_numpy() if "markers" in data else None,
        }
    )
    grouped = data.reindex(
        columns=["story_id", "design", "model", "prompt_id", OCCUPATION_COLUMN, "cond_scenario", "prompt"]
    )
    out["group"], out["grouping"] = probe_groups(grouped.reset_index(drop=True))
    return out[out["genre"].notna()].reset_index(drop=True)


def sample_cell(frame: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """Up to ``n`` stories of a cell, drawn at random with ``seed`` (order-independent: sorted first)."""
    frame = frame.sort_values("story_id")
    return frame if len(frame) <= n else frame.sample(n=n, random_state=seed)


def select_narratives(
    frame: pd.DataFrame, per_cell: int, per_label: int, seed: int
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Feng et al. Sec. 3.3.2 / App. D.4: per language x genre cell, a random sample of up to ``per_cell``
    implicit narratives whatever their label (``sampled``: all of it enters the UMAP projection); the
    probes use its female/male-labelled part (``probed``) and the cue-deletion comparison a label-balanced
    subset of that part (``paired``, ``per_label`` of each label)."""
    samples, pairs = [], []
    for _, cell in frame.groupby(["language", "genre"], sort=True):
        s = sample_cell(cell, per_cell, seed)
        samples.append(s)
        pairs.append(paired_subset(s[s["label"].isin(LABELS)], per_label, seed))
    sampled = pd.concat(samples, ignore_index=True) if samples else frame.iloc[:0]
    paired = pd.concat(pairs, ignore_index=True) if pairs else frame.iloc[:0]
    probed = sampled[sampled["label"].isin(LABELS)].reset_index(drop=True)
    return sampled, probed, paired


def paired_subset(sample: pd.DataFrame, per_label: int, seed: int) -> pd.DataFrame:
    """The label-balanced cue-deletion subset: k = min(per_label, #female, #male) stories of each label."""
    k = min(per_label, *(int((sample["label"] == lab).sum()) for lab in LABELS))
    parts = [sample[sample["label"] == lab].sort_values("story_id").sample(n=k, random_state=seed) for lab in LABELS]
    return pd.concat(parts) if k else sample.iloc[:0]


def labels_of(frame: pd.DataFrame) -> np.ndarray:
    return (frame["label"].to_numpy() == "female").astype(int)


def umap_projection(X: np.ndarray, settings: UmapSettings) -> tuple[np.ndarray | None, str]:
    """The shared 2-D UMAP of the sampled embeddings (App. D.4). With fewer than n_neighbors + 1 points
    the neighbourhood shrinks to n - 1; under 4 points it is skipped. Display only: inference uses the
    full embedding space."""
    n = len(X)
    if n < 4:
        return None, f"skipped: {n} points < 4"
    import umap  # optional and slow to import (numba): only when a projection is made

    k = min(settings.n_neighbors, n - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reducer = umap.UMAP(
            n_components=2,
            n_neighbors=k,
            min_dist=settings.min_dist,
            metric=settings.metric,
            random_state=settings.random_state,
            init="spectral" if n > 2 * k + 2 else "random",
        )
        coords = reducer.fit_transform(np.asarray(X, np.float32))
    status = "ok" if k == settings.n_neighbors else f"ok (n_neighbors lowered to {k})"
    return np.asarray(coords, float), status


def _fmt(value: float, lo: float, hi: float) -> str:
    if not np.isfinite(value):
        return "–"
    return f"{value:.3f} [{lo:.3f}, {hi:.3f}]"


def table1(probes: pd.DataFrame) -> pd.DataFrame:
    """Feng et al. Table 1 layout: language x genre rows; full text, cue-deleted and Delta AUC on the
    paired subset, each 'value [95% interval]', with the subset size and status."""
    paired = probes[probes["variant"].isin(["full", "cue_deleted", "delta"])]
    rows = []
    for (lang, genre), g in paired.groupby(["language", "genre"], sort=False):
        by = g.set_index("variant")
        row = {"Language": lang, "Genre": genre}
        for variant, title in (("full", "Full text"), ("cue_deleted", "Cue-deleted"), ("delta", "Δ AUC")):
            r = by.loc[variant]
            row[title] = _fmt(r["auc"], r["ci_low"], r["ci_high"])
        row["n"], row["status"] = int(by.loc["full", "n"]), by.loc["full", "status"]
        rows.append(row)
    return pd.DataFrame(rows)


# Arrow schemas of the stage's parquet files: written with them, so that a cell too small to probe
# (an empty table) has the same column types as a full run and the data contract holds.
OUTPUT_SCHEMAS: dict[str, pa.Schema] = {
    # the probes refitted per model x language in probes.per_model_genre (the cross-lens stage reads them):
    # variant full_sample (the AUC) or delta (the paired Delta AUC)
    "probes_per_model": pa.schema(
        [
            ("model", _TEXT),
            ("language", _TEXT),
            ("variant", _TEXT),
            ("n", _COUNT),
            ("auc", _REAL),
            ("ci_low", _REAL),
            ("ci_high", _REAL),
            ("status", _TEXT),
        ]
    ),
    "probes": pa.schema(
        [
            ("language", _TEXT),
            ("genre", _TEXT),
            ("variant", _TEXT),
            ("n", _COUNT),
            ("n_female", _COUNT),
            ("n_male", _COUNT),
            ("n_groups", _COUNT),
            ("auc", _REAL),
            ("ci_low", _REAL),
            ("ci_high", _REAL),
            ("status", _TEXT),
        ]
    ),
    "umap": pa.schema(
        [("story_id", _TEXT), ("language", _TEXT), ("genre", _TEXT), ("label", _TEXT), ("x", _REAL), ("y", _REAL)]
    ),
    "cultural": pa.schema(
        [
            ("source_language", _TEXT),
            ("genre", _TEXT),
            ("context", _TEXT),
            ("relevance", _REAL),
            ("n_narratives", _COUNT),
            ("n_markers", _COUNT),
        ]
    ),
    "cultural_advantage": pa.schema(
        [
            ("source_language", _TEXT),
            ("genre", _TEXT),
            ("advantage", _REAL),
            ("ci_low", _REAL),
            ("ci_high", _REAL),
            ("n_narratives", _COUNT),
        ]
    ),
    "separability": pa.schema(
        [
            ("version", _TEXT),
            ("balanced_accuracy", _REAL),
            ("ci_low", _REAL),
            ("ci_high", _REAL),
            ("chance", _REAL),
            ("n_markers", _COUNT),
            ("n_languages", _COUNT),
            ("status", _TEXT),
        ]
    ),
}


PROBE_COLUMNS = OUTPUT_SCHEMAS["probes"].names


UMAP_COLUMNS = OUTPUT_SCHEMAS["umap"].names
