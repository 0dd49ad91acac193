"""Figures of stage 06's artifacts (Feng et al., *Beyond Surface Cues*): probe AUC full text vs
cue-deleted, cultural-marker relevance and source-language separability, drawn here; the shared UMAP
with density contours (and its display trim) lives in :mod:`storybias.stages.figures.probes_umap` and
is re-exported from here, so every stage-06 figure is importable from this module."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.transforms import ScaledTranslation

from storybias.stages.figures.probes_advantage import SUBSET_ADVANTAGE, SUBSET_SELF_HIGHEST, self_context_advantage
from storybias.stages.figures.probes_umap import (
    HDR_LEVELS,
    MIN_KDE_POINTS,
    UMAP_DISPLAY_PERCENTILES,
    trim_for_display,
    umap_density,
)
from storybias.stages.figures.style import (
    GENRE_ORDER,
    LABEL,
    SMALL,
    VERSION_ORDER,
    add_legend,
    category_colors,
    draw_heatmap,
    figure_title,
    is_empty,
    is_missing,
    language_name,
    language_order,
    new_figure,
    no_data_figure,
    ordered,
    panel_grid,
    panel_title,
    require_columns,
    shorten,
    tick_style,
)

__all__ = [
    "SUBSET_ADVANTAGE",
    "SUBSET_SELF_HIGHEST",
    "self_context_advantage",
    "HDR_LEVELS",
    "MIN_KDE_POINTS",
    "UMAP_DISPLAY_PERCENTILES",
    "cultural_relevance",
    "probe_auc",
    "separability",
    "trim_for_display",
    "umap_density",
]

# --- 11-13. embeddings, probes, cultural markers (Feng et al.) ---------------------------------

_PROBE_KEYS = (
    "n_cells",
    "n_ok_cells",
    "n_skipped_rows",
    "mean_auc_full",
    "mean_auc_cue_deleted",
    "mean_delta",
    "largest_drop",
    "largest_drop_cell",
)


def _reason(status: Any) -> str:
    text = "unknown reason" if is_missing(status) else str(status)
    return re.sub(r"^skipped\s*[:(\-–]?\s*", "", text).rstrip(")") or text


def probe_auc(probes: pd.DataFrame) -> tuple[Figure, dict]:
    """Identity-label probe ROC AUC with 95% intervals per language x genre: full text (positive
    control) and cue-deleted, chance line at 0.5, Δ (cue-deleted − full) written at the right. Rows
    whose status is not ``ok`` are shown as ``skipped (reason)``.

    stats: ``n_cells``, ``n_ok_cells`` (both variants ok), ``n_skipped_rows``, ``mean_auc_full``,
    ``mean_auc_cue_deleted`` (over ok rows), ``mean_delta`` (delta rows), ``largest_drop`` (most
    negative Δ) and ``largest_drop_cell`` ("language / genre")."""
    title = "Identity-label probe: full text vs cue-deleted"
    if is_empty(probes):
        return no_data_figure(title, "probes table is empty", _PROBE_KEYS)
    require_columns(probes, ["language", "genre", "variant", "auc", "ci_low", "ci_high", "status"], "probes")
    data = probes.copy()
    data["ok"] = data["status"].astype(str).str.strip().str.lower().eq("ok") & data["auc"].notna()
    languages = language_order(data["language"])
    genres = ordered(data["genre"], GENRE_ORDER)
    cells = [
        (lang, g) for lang in languages for g in genres if ((data["language"] == lang) & (data["genre"] == g)).any()
    ]
    fig = new_figure(9.0, 1.5 + 0.5 * len(cells))
    ax = fig.add_subplot()
    lows = [0.5]
    ok_rows = data[data["ok"] & data["variant"].isin(list(_PROBE_VARIANTS))]
    if len(ok_rows):
        lows.append(float(np.nanmin(ok_rows[["auc", "ci_low"]].to_numpy(float))))
    x_min = max(0.0, min(lows) - 0.08)
    ax.set_xlim(x_min, 1.02)
    n_ok_cells, drops = 0, []
    y_positions = np.arange(len(cells))[::-1]
    for y, (lang, genre) in zip(y_positions, cells):
        cell = data[(data["language"] == lang) & (data["genre"] == genre)]
        n_ok_cells += _probe_cell(ax, cell, y, x_min + 0.02)
        drop = _probe_delta(ax, cell, y)
        if drop is not None:
            drops.append((drop, f"{lang} / {genre}"))
    ax.axvline(0.5, color="#444444", ls="--", lw=0.9)
    ax.set_yticks(y_positions, [f"{language_name(lang)} · {genre}" for lang, genre in cells], fontsize=SMALL)
    ax.set_ylim(-0.6, len(cells) - 0.4)
    ax.set_xlabel("ROC AUC (95% interval over held-out model–occupation groups)", fontsize=LABEL)
    ax.set_ylabel("language · genre", fontsize=LABEL)
    tick_style(ax)
    _probe_legend(fig, ax)
    panel_title(ax, f"{title} (Δ = cue-deleted − full, right)", fig.get_figwidth() - 0.6)
    fig.tight_layout()
    return fig, _probe_stats(data, cells, n_ok_cells, drops)


# variant -> (offset of its row in a cell, colour, marker, legend label)
_PROBE_VARIANTS = {
    "full": (0.15, colormaps["tab10"](0), "o", "full text (positive control)"),
    "cue_deleted": (-0.15, colormaps["tab10"](1), "s", "direct cues deleted"),
}


def _probe_cell(ax: Axes, cell: pd.DataFrame, y: float, text_x: float) -> bool:
    """One language x genre row: each variant's AUC and interval, or why it was skipped (one line
    when every variant was skipped for the same reason). Returns whether both variants are ok."""
    both = True
    shown = cell[cell["variant"].isin(list(_PROBE_VARIANTS))]
    if len(shown) and not shown["ok"].any() and shown["status"].astype(str).nunique() == 1:
        # every variant skipped for the same reason: one line
        ax.text(
            text_x,
            y,
            f"skipped ({shorten(_reason(shown['status'].iloc[0]), 70)})",
            va="center",
            fontsize=SMALL,
            color="#555555",
        )
        shown = shown.iloc[0:0]
        both = False
    for variant, (offset, color, marker, _) in _PROBE_VARIANTS.items():
        if shown.empty:
            break
        row = cell[cell["variant"] == variant]
        if row.empty:
            both = False
            continue
        row = row.iloc[0]
        if not row["ok"]:
            both = False
            ax.text(
                text_x,
                y + offset,
                f"{variant.replace('_', '-')}: skipped ({shorten(_reason(row['status']), 60)})",
                va="center",
                fontsize=SMALL,
                color="#555555",
            )
            continue
        lo, hi = row["ci_low"], row["ci_high"]
        if np.isfinite(lo) and np.isfinite(hi):
            ax.plot([lo, hi], [y + offset] * 2, color=color, lw=1.6)
        ax.scatter(
            [row["auc"]], [y + offset], color=color, marker=marker, s=34, edgecolors="black", linewidths=0.4, zorder=3
        )
    return both


def _probe_delta(ax: Axes, cell: pd.DataFrame, y: float) -> float | None:
    """The cell's Δ (with its interval), or why it was skipped, written right of the axes. Returns
    the Δ when it is ok."""
    delta = cell[cell["variant"] == "delta"]
    if not len(delta):
        return None
    d = delta.iloc[0]
    drop = None
    if d["ok"]:
        ci = (
            f" [{d['ci_low']:+.2f}, {d['ci_high']:+.2f}]"
            if np.isfinite(d["ci_low"]) and np.isfinite(d["ci_high"])
            else ""
        )
        text = f"Δ {d['auc']:+.2f}{ci}"
        drop = float(d["auc"])
    else:
        text = f"Δ skipped ({shorten(_reason(d['status']), 28)})"
    ax.text(1.01, y, text, transform=ax.get_yaxis_transform(), va="center", fontsize=SMALL, clip_on=False)
    return drop


def _probe_legend(fig: Figure, ax: Axes) -> None:
    handles = [
        Line2D([], [], color=c, marker=m, lw=1.6, markeredgecolor="black") for _, c, m, _ in _PROBE_VARIANTS.values()
    ]
    handles.append(Line2D([], [], color="#444444", ls="--", lw=0.9))
    add_legend(
        ax,
        handles,
        [v[3] for v in _PROBE_VARIANTS.values()] + ["chance (0.5)"],
        loc="upper left",
        bbox_to_anchor=(0.0, 0.0),
        bbox_transform=ax.transAxes + ScaledTranslation(0, -0.5, fig.dpi_scale_trans),
        ncol=3,
        borderaxespad=0.0,
    )


def _probe_stats(data: pd.DataFrame, cells: list, n_ok_cells: int, drops: list[tuple[float, str]]) -> dict:
    full = data[(data["variant"] == "full") & data["ok"]]["auc"]
    cue = data[(data["variant"] == "cue_deleted") & data["ok"]]["auc"]
    delta_vals = data[(data["variant"] == "delta") & data["ok"]]["auc"]
    worst = min(drops) if drops else None
    return {
        "n_cells": len(cells),
        "n_ok_cells": int(n_ok_cells),
        "n_skipped_rows": int((~data["ok"]).sum()),
        "mean_auc_full": float(full.mean()) if len(full) else float("nan"),
        "mean_auc_cue_deleted": float(cue.mean()) if len(cue) else float("nan"),
        "mean_delta": float(delta_vals.mean()) if len(delta_vals) else float("nan"),
        "largest_drop": worst[0] if worst else float("nan"),
        "largest_drop_cell": worst[1] if worst else None,
    }


_CULT_KEYS = (
    "n_genres",
    "n_source_languages",
    "mean_self_relevance",
    "mean_other_relevance",
    "self_context_advantage",
    "n_narratives",
    "n_markers",
)


def cultural_relevance(cultural: pd.DataFrame) -> tuple[Figure, dict]:
    """Mean automated relevance (1-7) of cultural markers by source language (rows) x reference
    context (columns: en, fr, zh), one heatmap per genre; the self-context cells (source = context)
    outlined.

    stats: ``n_genres``, ``n_source_languages``, ``mean_self_relevance`` (mean over self-context
    cells), ``mean_other_relevance`` (other cells), ``self_context_advantage`` (their difference),
    ``n_narratives`` and ``n_markers`` (summed over source language x genre)."""
    title = "Cultural-marker relevance by source language and context"
    if is_empty(cultural):
        return no_data_figure(title, "cultural table is empty (no retained cultural markers)", _CULT_KEYS)
    require_columns(cultural, ["source_language", "genre", "context", "relevance"], "cultural")
    data = cultural.dropna(subset=["relevance"])
    if data.empty:
        return no_data_figure(title, "no relevance scores", _CULT_KEYS)
    genres = ordered(data["genre"], GENRE_ORDER)
    sources = language_order(data["source_language"])
    contexts = language_order(data["context"])
    panel_w = 1.6 + 0.75 * len(contexts)
    fig, axes, _, _ = panel_grid(len(genres), 3, panel_w, 1.4 + 0.42 * len(sources), extra_w=1.0, extra_h=0.5)
    image: AxesImage | None = None
    for ax, genre in zip(axes, genres):
        matrix = data[data["genre"] == genre].pivot_table(
            index="source_language", columns="context", values="relevance", aggfunc="mean"
        )
        matrix = matrix.reindex(index=sources, columns=contexts)
        image = draw_heatmap(ax, matrix.to_numpy(float), 1.0, 7.0, "{:.2f}")
        for i, s in enumerate(sources):
            if s in contexts:
                ax.add_patch(Rectangle((contexts.index(s) - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", lw=1.8))
        ax.set_xticks(range(len(contexts)), [f"{c}-linked" for c in contexts], fontsize=SMALL)
        ax.set_yticks(range(len(sources)), [language_name(s) for s in sources], fontsize=SMALL)
        ax.set_xlabel("reference context", fontsize=LABEL)
        ax.set_ylabel("source language", fontsize=LABEL)
        ax.set_title(str(genre), fontsize=LABEL)
    top = figure_title(fig, f"{title} (mean relevance 1–7; outlined: own context)")
    fig.tight_layout(rect=(0, 0, 1 - 0.9 / fig.get_figwidth(), top))
    cax = fig.add_axes((1 - 0.7 / fig.get_figwidth(), 0.15, 0.12 / fig.get_figwidth(), top - 0.25))
    assert image is not None  # the grid has at least one panel
    bar = fig.colorbar(image, cax=cax)
    bar.set_label("relevance (1–7)", fontsize=LABEL)
    bar.ax.tick_params(labelsize=SMALL)
    own = data["source_language"] == data["context"]
    per_source = data.groupby(["source_language", "genre"])
    stats = {
        "n_genres": len(genres),
        "n_source_languages": len(sources),
        "mean_self_relevance": float(data.loc[own, "relevance"].mean()) if own.any() else float("nan"),
        "mean_other_relevance": float(data.loc[~own, "relevance"].mean()) if (~own).any() else float("nan"),
        "n_narratives": int(per_source["n_narratives"].max().sum()) if "n_narratives" in data.columns else 0,
        "n_markers": int(per_source["n_markers"].max().sum()) if "n_markers" in data.columns else 0,
    }
    stats["self_context_advantage"] = stats["mean_self_relevance"] - stats["mean_other_relevance"]
    return fig, stats


_SEP_KEYS = ("ba_original", "ba_translated", "ba_masked", "chance", "n_ok", "n_skipped")


def separability(sep: pd.DataFrame) -> tuple[Figure, dict]:
    """Source-language separability: balanced accuracy with 95% interval per marker version
    (original, translated, masked), each version's chance level dashed; versions whose status is not
    ``ok`` shown as ``skipped (reason)``.

    stats: ``ba_<version>`` for original / translated / masked (NaN when skipped or absent),
    ``chance`` (of the first ok version), ``n_ok``, ``n_skipped``."""
    title = "Source-language separability of cultural markers"
    if is_empty(sep):
        return no_data_figure(title, "separability table is empty", _SEP_KEYS)
    require_columns(sep, ["version", "balanced_accuracy", "ci_low", "ci_high", "chance", "status"], "separability")
    data = sep.drop_duplicates("version").copy()
    data["ok"] = data["status"].astype(str).str.strip().str.lower().eq("ok") & data["balanced_accuracy"].notna()
    versions = ordered(data["version"], VERSION_ORDER)
    data = data.set_index("version").loc[versions]
    fig = new_figure(max(4.8, 2.2 + 1.3 * len(versions)), 4.2)
    ax = fig.add_subplot()
    colors = dict(zip(versions, category_colors(len(versions))))
    for i, version in enumerate(versions):
        row = data.loc[version]
        if not is_missing(row["chance"]):
            ax.plot([i - 0.42, i + 0.42], [row["chance"]] * 2, color="#444444", ls="--", lw=1.0, zorder=4)
        if not row["ok"]:
            ax.text(
                i,
                0.5,
                f"skipped\n({shorten(_reason(row['status']), 40)})",
                ha="center",
                va="center",
                fontsize=SMALL,
                color="#555555",
                wrap=True,
            )
            continue
        ba = float(row["balanced_accuracy"])
        lo, hi = float(row["ci_low"]), float(row["ci_high"])
        yerr = [[max(0.0, ba - lo)], [max(0.0, hi - ba)]] if np.isfinite(lo) and np.isfinite(hi) else None
        ax.bar(i, ba, color=colors[version], width=0.6, yerr=yerr, capsize=4, error_kw={"lw": 1.0})
        ax.text(i, (hi if np.isfinite(hi) else ba) + 0.02, f"{ba:.2f}", ha="center", va="bottom", fontsize=SMALL)
    ax.set_xticks(range(len(versions)), versions, fontsize=SMALL)
    ax.set_ylim(0, 1.08)
    ax.set_xlim(-0.6, len(versions) - 0.4)
    ax.set_xlabel("marker version", fontsize=LABEL)
    ax.set_ylabel("balanced accuracy (95% interval)", fontsize=LABEL)
    tick_style(ax)
    add_legend(ax, [Line2D([], [], color="#444444", ls="--")], ["chance level"], loc="upper right", frameon=True)
    n_lang = data["n_languages"].dropna().max() if "n_languages" in data.columns else None
    extra = f"; {int(n_lang)} source languages" if n_lang is not None and not is_missing(n_lang) else ""
    panel_title(ax, f"{title}{extra}", fig.get_figwidth() - 0.6)
    fig.tight_layout()
    ok = data[data["ok"]]
    stats = {
        f"ba_{v}": (float(data.at[v, "balanced_accuracy"]) if v in data.index and data.at[v, "ok"] else float("nan"))
        for v in VERSION_ORDER
    }
    stats.update(
        {
            "chance": float(ok["chance"].iloc[0]) if len(ok) else float("nan"),
            "n_ok": int(len(ok)),
            "n_skipped": int((~data["ok"]).sum()),
        }
    )
    return fig, stats
