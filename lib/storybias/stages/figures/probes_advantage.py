"""Figure 19 of stage 06's artifacts: Feng et al.'s self-context advantage (*Beyond Surface Cues:
Disentangling Sociocultural Signals in Multilingual LLMs*, Feng, Liu, Feuerriegel, Shrestha, Eq. 5 and
Sec. 4.3) per source language x genre, from ``cultural_advantage.parquet``, with the high-agreement
marker subset of their human validation when stage 06 has it. Re-exported by ``probes``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from storybias.stages.figures.style import (
    GENRE_ORDER,
    LABEL,
    MARKERS,
    SMALL,
    add_legend,
    category_colors,
    is_empty,
    is_missing,
    language_name,
    language_order,
    new_figure,
    no_data_figure,
    ordered,
    panel_title,
    require_columns,
    shorten,
    tick_style,
)

__all__ = ["SUBSET_ADVANTAGE", "SUBSET_SELF_HIGHEST", "self_context_advantage"]

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
    if is_empty(advantage):
        return no_data_figure(
            title,
            "cultural_advantage table is empty (no marker-bearing narrative from an en, fr or zh source)",
            _ADV_KEYS,
        )
    require_columns(advantage, ["source_language", "genre", "advantage", "ci_low", "ci_high"], "cultural_advantage")
    data = advantage.dropna(subset=["advantage"])
    if data.empty:
        return no_data_figure(title, "no advantage computed (every cell NaN)", _ADV_KEYS)
    cells = [
        (lang, genre)
        for lang in language_order(data["source_language"])
        for genre in ordered(data["genre"], _GENRES)
        if ((data["source_language"] == lang) & (data["genre"] == genre)).any()
    ]
    subset, why = _subset(validation_markers)
    n_rows = len(cells) + (subset is not None)
    fig = new_figure(8.4, 1.9 + 0.42 * n_rows)
    ax = fig.add_subplot()
    genres = ordered(data["genre"], _GENRES)
    colors = dict(zip(genres, category_colors(len(genres))))
    y = np.arange(n_rows)[::-1]
    labels = []
    for yi, (lang, genre) in zip(y, cells):
        row = data[(data["source_language"] == lang) & (data["genre"] == genre)].iloc[0]
        marker = MARKERS[genres.index(genre) % len(MARKERS)]
        _point(ax, yi, row["advantage"], row["ci_low"], row["ci_high"], colors[genre], marker)
        n = f" (n = {int(row['n_narratives'])})" if "n_narratives" in data.columns else ""
        labels.append(f"{language_name(lang)} · {genre}{n}")
    if subset is not None:
        _point(ax, y[-1], subset["advantage"], subset["ci_low"], subset["ci_high"], _SUBSET_COLOR, "D")
        labels.append(f"high-agreement markers, pooled (n = {subset['n_markers']} markers)")
        ax.axhline(y[-1] + 0.5, color="#BBBBBB", lw=0.7)
    ax.axvline(0, color="#444444", ls="--", lw=0.9)
    ax.set_yticks(y, labels, fontsize=SMALL)
    ax.set_ylim(-0.6, n_rows - 0.4)
    ax.set_xlabel("advantage = r̄_self − (r̄_other1 + r̄_other2) / 2 (relevance points, 95% interval)", fontsize=LABEL)
    ax.set_ylabel("source language · genre", fontsize=LABEL)
    tick_style(ax)
    handles = [
        Line2D([], [], color=colors[g], marker=MARKERS[i % len(MARKERS)], ls="", markeredgecolor="black")
        for i, g in enumerate(genres)
    ]
    add_legend(ax, handles, [str(g) for g in genres], title="genre", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    note = why or (
        "high-agreement subset (markers with ≥ 2 human ratings spanning ≤ 1 point): source-linked score "
        f"strictly highest for {subset['share_self_highest']:.1%} of them"
        if subset is not None and not is_missing(subset["share_self_highest"])
        else ""
    )
    panel_title(ax, f"{title}; > 0: markers most relevant to their own language's context", fig.get_figwidth() - 0.6)
    bottom = 0.0
    if note:
        fig.text(0.01, 0.01, shorten(note, 140), fontsize=SMALL, va="bottom", color="#333333")
        bottom = 0.3 / fig.get_figheight()
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig, _advantage_stats(data, cells, subset)


def _point(ax: Axes, y: float, value: float, low: float, high: float, color: Any, marker: str) -> None:
    if not is_missing(low) and not is_missing(high):
        ax.plot([low, high], [y, y], color=color, lw=1.6)
    ax.scatter([value], [y], color=color, marker=marker, s=36, edgecolors="black", linewidths=0.4, zorder=3)


def _subset(validation: pd.DataFrame | None) -> tuple[dict[str, Any] | None, str]:
    """Feng et al.'s high-agreement subset from stage 06's validation_markers rows, or why there is none."""
    if is_empty(validation):
        return None, "high-agreement subset not drawn: no human marker ratings (probes.human_validation.markers)"
    assert validation is not None
    require_columns(validation, ["metric", "estimate", "ci_low", "ci_high", "n_markers"], "manifest_probes")
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
