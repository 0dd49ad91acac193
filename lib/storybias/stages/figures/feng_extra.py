"""Two more figures of Feng et al. (*Beyond Surface Cues: Disentangling Sociocultural Signals in
Multilingual LLMs*, Feng, Liu, Feuerriegel, Shrestha): the self-context advantage per source language
x genre (their Eq. 5 and Sec. 4.3, from stage 06's ``cultural_advantage.parquet``, with the
high-agreement marker subset of their human validation when stage 06 has it) and the trial-level
binomial GLMs of their Appendix C as a table (stage 05's ``metrics_glm.parquet``)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from storybias.stages.figures.metrics_feng import _p
from storybias.stages.figures.style import (
    GENRE_ORDER,
    LABEL,
    MARKERS,
    SMALL,
    _colors,
    _figure,
    _is_empty,
    _isna,
    _lang_name,
    _lang_order,
    _legend,
    _no_data,
    _ordered,
    _require,
    _short,
    _table,
    _ticks,
    _title,
)

__all__ = ["SUBSET_ADVANTAGE", "SUBSET_SELF_HIGHEST", "glm_table", "self_context_advantage"]

# --- self-context advantage (Eq. 5) -----------------------------------------------------------------

# The rows of stage 06's validation_markers table (manifest_probes.json: human_validation) that hold
# Feng et al.'s high-agreement subset (markers with >= 2 valid human ratings spanning at most one
# scale point: the automated marker-level advantage, and the share of those markers whose
# source-linked score is strictly the highest). Stage 06 does not compute them yet.
SUBSET_ADVANTAGE = "high_agreement_advantage"
SUBSET_SELF_HIGHEST = "high_agreement_self_highest"

_ADV_KEYS = (
    "n_cells",
    "n_positive",
    "n_ci_above_zero",
    "mean_advantage",
    "min_advantage",
    "min_advantage_cell",
    "max_advantage",
    "max_advantage_cell",
    "n_narratives",
    "subset_advantage",
    "subset_ci_low",
    "subset_ci_high",
    "n_subset_markers",
    "subset_share_self_highest",
)
_GENRES = (*GENRE_ORDER, "stereotales", "bedtime")
_SUBSET_COLOR = "#333333"


def self_context_advantage(
    advantage: pd.DataFrame, validation_markers: pd.DataFrame | None = None
) -> tuple[Figure, dict]:
    """Feng et al.'s self-context advantage (Eq. 5: per marker-bearing narrative, the relevance of its
    markers to the source-linked context minus the mean of the other two contexts; averaged over the
    narratives of a source language x genre, 95% bootstrap interval over narratives), one point and
    interval per cell, a zero line. A second series, at the bottom, is their high-agreement subset
    (rows :data:`SUBSET_ADVANTAGE` / :data:`SUBSET_SELF_HIGHEST` of stage 06's ``validation_markers``)
    when stage 06 computed it; otherwise a note says why it is not drawn (no human marker ratings, or
    stage 06 does not compute the subset).

    stats: ``n_cells``, ``n_positive`` (advantage > 0), ``n_ci_above_zero``, ``mean_advantage`` (over
    cells), ``min_advantage`` / ``max_advantage`` and their ``*_cell`` ("language / genre"),
    ``n_narratives`` (summed), ``subset_advantage``, ``subset_ci_low``, ``subset_ci_high``,
    ``n_subset_markers``, ``subset_share_self_highest`` (NaN / 0 without the subset)."""
    title = "Self-context advantage of the cultural markers (Feng et al. Eq. 5)"
    if _is_empty(advantage):
        return _no_data(
            title,
            "cultural_advantage table is empty (no marker-bearing narrative from an en, fr or zh source)",
            _ADV_KEYS,
        )
    _require(advantage, ["source_language", "genre", "advantage", "ci_low", "ci_high"], "cultural_advantage")
    data = advantage.dropna(subset=["advantage"])
    if data.empty:
        return _no_data(title, "no advantage computed (every cell NaN)", _ADV_KEYS)
    cells = [
        (lang, genre)
        for lang in _lang_order(data["source_language"])
        for genre in _ordered(data["genre"], _GENRES)
        if ((data["source_language"] == lang) & (data["genre"] == genre)).any()
    ]
    subset, why = _subset(validation_markers)
    n_rows = len(cells) + (subset is not None)
    fig = _figure(8.4, 1.9 + 0.42 * n_rows)
    ax = fig.add_subplot()
    genres = _ordered(data["genre"], _GENRES)
    colors = dict(zip(genres, _colors(len(genres))))
    y = np.arange(n_rows)[::-1]
    labels = []
    for yi, (lang, genre) in zip(y, cells):
        row = data[(data["source_language"] == lang) & (data["genre"] == genre)].iloc[0]
        marker = MARKERS[genres.index(genre) % len(MARKERS)]
        _point(ax, yi, row["advantage"], row["ci_low"], row["ci_high"], colors[genre], marker)
        n = f" (n = {int(row['n_narratives'])})" if "n_narratives" in data.columns else ""
        labels.append(f"{_lang_name(lang)} · {genre}{n}")
    if subset is not None:
        _point(ax, y[-1], subset["advantage"], subset["ci_low"], subset["ci_high"], _SUBSET_COLOR, "D")
        labels.append(f"high-agreement markers, pooled (n = {subset['n_markers']} markers)")
        ax.axhline(y[-1] + 0.5, color="#BBBBBB", lw=0.7)
    ax.axvline(0, color="#444444", ls="--", lw=0.9)
    ax.set_yticks(y, labels, fontsize=SMALL)
    ax.set_ylim(-0.6, n_rows - 0.4)
    ax.set_xlabel("advantage = r̄_self − (r̄_other1 + r̄_other2) / 2 (relevance points, 95% interval)", fontsize=LABEL)
    ax.set_ylabel("source language · genre", fontsize=LABEL)
    _ticks(ax)
    handles = [
        Line2D([], [], color=colors[g], marker=MARKERS[i % len(MARKERS)], ls="", markeredgecolor="black")
        for i, g in enumerate(genres)
    ]
    _legend(ax, handles, [str(g) for g in genres], title="genre", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    note = why or (
        "high-agreement subset (markers with ≥ 2 human ratings spanning ≤ 1 point): source-linked score "
        f"strictly highest for {subset['share_self_highest']:.1%} of them"
        if subset is not None and not _isna(subset["share_self_highest"])
        else ""
    )
    _title(ax, f"{title}; > 0: markers most relevant to their own language's context", fig.get_figwidth() - 0.6)
    bottom = 0.0
    if note:
        fig.text(0.01, 0.01, _short(note, 140), fontsize=SMALL, va="bottom", color="#333333")
        bottom = 0.3 / fig.get_figheight()
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig, _advantage_stats(data, cells, subset)


def _point(ax: Axes, y: float, value: float, low: float, high: float, color: Any, marker: str) -> None:
    if not _isna(low) and not _isna(high):
        ax.plot([low, high], [y, y], color=color, lw=1.6)
    ax.scatter([value], [y], color=color, marker=marker, s=36, edgecolors="black", linewidths=0.4, zorder=3)


def _subset(validation: pd.DataFrame | None) -> tuple[dict[str, Any] | None, str]:
    """Feng et al.'s high-agreement subset from stage 06's validation_markers rows, or why there is none."""
    if _is_empty(validation):
        return None, "high-agreement subset not drawn: no human marker ratings (probes.human_validation.markers)"
    assert validation is not None
    _require(validation, ["metric", "estimate", "ci_low", "ci_high", "n_markers"], "manifest_probes")
    rows = validation.set_index("metric")
    if SUBSET_ADVANTAGE not in rows.index:
        return None, f"high-agreement subset not drawn: stage 06 does not compute it (no '{SUBSET_ADVANTAGE}' row)"
    row = rows.loc[SUBSET_ADVANTAGE]
    share = rows.loc[SUBSET_SELF_HIGHEST, "estimate"] if SUBSET_SELF_HIGHEST in rows.index else np.nan
    subset = {"advantage": float(row["estimate"]), "ci_low": float(row["ci_low"]), "ci_high": float(row["ci_high"])}
    return subset | {"n_markers": int(row["n_markers"]), "share_self_highest": float(share)}, ""


def _advantage_stats(data: pd.DataFrame, cells: list, subset: dict[str, Any] | None) -> dict[str, Any]:
    shown = pd.concat(
        [data[(data["source_language"] == lang) & (data["genre"] == genre)].iloc[:1] for lang, genre in cells]
    )
    low, high = shown.loc[shown["advantage"].idxmin()], shown.loc[shown["advantage"].idxmax()]
    return {
        "n_cells": len(cells),
        "n_positive": int((shown["advantage"] > 0).sum()),
        "n_ci_above_zero": int((shown["ci_low"] > 0).sum()),
        "mean_advantage": float(shown["advantage"].mean()),
        "min_advantage": float(low["advantage"]),
        "min_advantage_cell": f"{low['source_language']} / {low['genre']}",
        "max_advantage": float(high["advantage"]),
        "max_advantage_cell": f"{high['source_language']} / {high['genre']}",
        "n_narratives": int(shown["n_narratives"].sum()) if "n_narratives" in shown.columns else 0,
        "subset_advantage": subset["advantage"] if subset else float("nan"),
        "subset_ci_low": subset["ci_low"] if subset else float("nan"),
        "subset_ci_high": subset["ci_high"] if subset else float("nan"),
        "n_subset_markers": subset["n_markers"] if subset else 0,
        "subset_share_self_highest": subset["share_self_highest"] if subset else float("nan"),
    }


# --- trial-level GLMs (App. C) ----------------------------------------------------------------------

_GLM_KEYS = ("n_rows", "n_terms", "n_significant", "n_negative_chi2", "max_chi2", "max_chi2_term", "p_column")
_NEGATIVE_NOTE = (
    "† Wald χ² < 0: the term's cluster-robust variance is numerically not positive (few clusters or near-separation), "
    "so χ² and p are unusable"
)
_OUTCOMES = {"female": "female (vs male)", "identified": "identified (vs unknown)"}


def _term(term: Any) -> str:
    """'C(language, Sum):C(task, Sum)' -> 'language × genre' (the GLMs' task is the genre)."""
    text = re.sub(r"C\((\w+)(?:,\s*\w+)?\)", r"\1", str(term)).replace(":", " × ")
    return re.sub(r"\btask\b", "genre", text)


def glm_table(glm: pd.DataFrame, alpha: float = 0.05) -> tuple[Figure, dict]:
    """Feng et al.'s trial-level binomial GLMs (App. C: female vs male among identified protagonists,
    and identified vs not, on the story and news outputs, cluster-robust covariance by model x
    occupation) as a table: outcome, term, df, Wald χ², p, BH-adjusted p (when the table has
    ``p_adjusted``; stage 05 writes none, and Feng et al. report these p unadjusted), trials. Term
    rows with p (adjusted when there) < ``alpha`` are shaded; intercept rows are shown in grey and
    never shaded (not a term test). A negative Wald χ² (the cluster-robust covariance is not positive
    definite for the term, as with few clusters) is flagged with † and its row never shaded.

    stats: ``n_rows``, ``n_terms`` (rows other than the intercepts), ``n_significant``,
    ``n_negative_chi2``, ``max_chi2`` and ``max_chi2_term`` ("outcome: term"), ``p_column``."""
    title = "Trial-level binomial GLMs: Wald tests per term (Feng et al. App. C)"
    if _is_empty(glm):
        return _no_data(
            title,
            "metrics_glm table is empty (no story or news trials to model; manifest_metrics.json says why)",
            _GLM_KEYS,
        )
    _require(glm, ["outcome", "term", "chi2", "p_value", "df"], "metrics_glm")
    data = glm.reset_index(drop=True)
    p_column = "p_adjusted" if "p_adjusted" in data.columns else "p_value"
    chi2 = pd.to_numeric(data["chi2"], errors="coerce")
    intercept = data["term"].astype(str).str.lower().eq("intercept").to_numpy()
    negative = (chi2 < 0).to_numpy()
    significant = (pd.to_numeric(data[p_column], errors="coerce") < alpha).to_numpy() & ~intercept & ~negative
    rows = [_glm_row(r, "p_adjusted" in data.columns) for _, r in data.iterrows()]
    header = ["outcome", "term", "df", "Wald χ²", "p", "p (BH)", "trials"]
    notes = ["no coefficient estimates or odds ratios in metrics_glm: one Wald test per term"]
    if negative.any():
        notes.insert(0, _NEGATIVE_NOTE)
    height = 0.75 + 0.24 * (len(rows) + 1) + 0.2 * len(notes)
    fig = _figure(8.6, height)
    ax = fig.add_subplot()
    ax.axis("off")
    table = _table(ax, rows, header, [0.22, 0.3, 0.06, 0.12, 0.1, 0.1, 0.1], significant, "#DCEAF7")
    for (r, _c), cell in table.get_celld().items():
        if r > 0 and intercept[r - 1]:
            cell.get_text().set_color("#777777")
    adjusted = "BH-adjusted p" if p_column == "p_adjusted" else "p"
    unadjusted = "" if p_column == "p_adjusted" else " (metrics_glm has no BH-adjusted p)"
    _title(ax, f"{title}; shaded: {adjusted} < {alpha}{unadjusted}", fig.get_figwidth() - 0.4)
    fig.tight_layout(rect=(0, (0.1 + 0.2 * len(notes)) / height, 1, 1))
    # the notes right under the table (saving crops the blank space below them)
    box = table.get_window_extent().transformed(fig.transFigure.inverted())
    for i, note in enumerate(notes):
        fig.text(box.x0, box.y0 - (0.06 + 0.2 * i) / height, note, fontsize=SMALL, va="top")
    usable = chi2.where(~negative)
    best = data.loc[usable.idxmax()] if usable.notna().any() else None
    stats = {
        "n_rows": int(len(data)),
        "n_terms": int((~intercept).sum()),
        "n_significant": int(significant.sum()),
        "n_negative_chi2": int(negative.sum()),
        "max_chi2": float(usable.max()) if best is not None else float("nan"),
        "max_chi2_term": f"{best['outcome']}: {_term(best['term'])}" if best is not None else None,
        "p_column": p_column,
    }
    return fig, stats


def _glm_row(r: pd.Series, adjusted: bool) -> list[str]:
    chi2 = r["chi2"]
    flag = "†" if not _isna(chi2) and chi2 < 0 else ""
    return [
        _OUTCOMES.get(str(r["outcome"]), str(r["outcome"])),
        _short(_term(r["term"]), 40),
        "–" if _isna(r["df"]) else f"{int(r['df'])}",
        "–" if _isna(chi2) else f"{chi2:.2f}{flag}",
        _p(r["p_value"]),
        _p(r["p_adjusted"]) if adjusted else "–",
        "–" if "n_trials" not in r.index or _isna(r["n_trials"]) else f"{int(r['n_trials'])}",
    ]
