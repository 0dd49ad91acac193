"""Figures of the stories themselves (stages 02-03's artifacts): the valid-story rate per language x
model (``vsr.parquet``) and the extracted protagonist attributes (``extractions.parquet`` joined to
``filtered.parquet``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.gridspec import GridSpec
from matplotlib.transforms import ScaledTranslation

from storybias.config.designs import allowed_values
from storybias.config.prompts import LANGUAGES
from storybias.stages.figures.style import (
    LABEL,
    OKABE_ITO,
    OTHER_GREY,
    SMALL,
    UNKNOWN_GREY,
    add_legend,
    as_bools,
    category_colors,
    draw_heatmap,
    empty_stats,
    figure_title,
    is_empty,
    message_panel,
    new_figure,
    no_data_figure,
    ordered,
    panel_title,
    require_columns,
    shorten,
    tick_style,
)
from storybias.summaries import vsr_matrix

# --- 1. valid-story rate ------------------------------------------------------------------------

_VSR_KEYS = ("mean_vsr", "pooled_vsr", "min_vsr", "min_vsr_cell", "n_models", "n_languages", "n_empty_cells")


def vsr_heatmap(vsr: pd.DataFrame, design: str = "bedtime") -> tuple[Figure, dict]:
    """Valid-story rate (%) per prompt language (rows) x model (columns), with BiasedTales-ML Table 3's
    margins: ``Overall`` (pooled over models) and ``Average`` (mean over languages). Default: the
    bedtime design, BiasedTales-ML's own stories under its own validity rule (Table 3).

    stats: ``mean_vsr`` (mean over the model x language cells, 0-1), ``pooled_vsr`` (valid / stories),
    ``min_vsr`` and ``min_vsr_cell`` ("model / language"), ``n_models``, ``n_languages``,
    ``n_empty_cells`` (model x language pairs without stories)."""
    title = f"Valid-story rate by prompt language and model (design: {design})"
    if is_empty(vsr):
        return no_data_figure(title, "vsr table is empty", _VSR_KEYS)
    require_columns(vsr, ["design", "model", "language", "vsr", "n_stories", "n_valid"], "vsr")
    sub = vsr[vsr["design"] == design]
    if sub.empty:
        return no_data_figure(title, f"no rows with design = {design!r}", _VSR_KEYS)

    matrix = vsr_matrix(vsr, design)
    models = [c for c in matrix.columns if c != "Overall"]
    languages = [r for r in matrix.index if r != "Average"]
    values = matrix.to_numpy(float)
    nrows, ncols = values.shape
    cell_w = 0.5 if ncols <= 12 else 0.42
    fig = new_figure(max(4.6, 1.9 + cell_w * ncols), max(3.0, 2.0 + 0.3 * nrows))
    ax = fig.add_subplot()
    fmt = "{:.1f}" if ncols <= 12 else "{:.0f}"
    image = draw_heatmap(ax, values, 0.0, 100.0, fmt)
    ax.axvline(len(models) - 0.5, color="white", lw=2.5)
    ax.axhline(len(languages) - 0.5, color="white", lw=2.5)
    ax.set_xticks(
        range(ncols),
        [shorten(c, 20) for c in matrix.columns],
        rotation=45 if ncols > 3 else 0,
        ha="right" if ncols > 3 else "center",
        fontsize=SMALL,
    )
    ax.set_yticks(
        range(nrows), [f"{r} ({LANGUAGES[r]})" if r in LANGUAGES else str(r) for r in matrix.index], fontsize=SMALL
    )
    ax.set_xlabel("generating model", fontsize=LABEL)
    ax.set_ylabel("prompt language", fontsize=LABEL)
    panel_title(ax, f"{title}; Overall = pooled over models, Average = mean over languages", fig.get_figwidth() - 0.6)
    bar = fig.colorbar(image, ax=ax, fraction=0.04 if ncols > 6 else 0.08, pad=0.02)
    bar.set_label("valid-story rate (%)", fontsize=LABEL)
    bar.ax.tick_params(labelsize=SMALL)
    fig.tight_layout()
    worst = sub.loc[sub["vsr"].idxmin()]
    stats = {
        "mean_vsr": float(sub["vsr"].mean()),
        "pooled_vsr": float(sub["n_valid"].sum() / sub["n_stories"].sum()) if sub["n_stories"].sum() else float("nan"),
        "min_vsr": float(worst["vsr"]),
        "min_vsr_cell": f"{worst['model']} / {worst['language']}",
        "n_models": len(models),
        "n_languages": len(languages),
        "n_empty_cells": int(len(models) * len(languages) - sub[["model", "language"]].drop_duplicates().shape[0]),
    }
    return fig, stats


# --- 2. attribute distributions ----------------------------------------------------------------


def _dimension_values(dimension: str) -> list[str]:
    try:
        return allowed_values(dimension)
    except Exception:  # a dimension outside the stereotales design: observed order
        return []


def _stacked_bars(ax, shares: pd.DataFrame, colors: Mapping[str, Any], annotate: bool, labels: bool = True) -> None:
    """Horizontal stacked bars of ``shares`` (percent), row 0 on top; segments >= 12% annotated."""
    y = np.arange(len(shares))[::-1]
    left = np.zeros(len(shares))
    for value in shares.columns:
        width = shares[value].to_numpy(float)
        color = colors[value]
        ax.barh(
            y,
            width,
            left=left,
            color=color,
            edgecolor="white",
            linewidth=0.4,
            height=0.8,
            label=str(value),
            hatch="//" if value == "unknown" else None,
        )
        if annotate:
            r, g, b = _rgb(color)
            ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"
            for yi, li, wi in zip(y, left, width):
                if wi >= 12:
                    ax.text(li + wi / 2, yi, f"{wi:.0f}", ha="center", va="center", fontsize=SMALL, color=ink)
        left += width
    ax.set_yticks(y, [shorten(i, 28) for i in shares.index] if labels else [""] * len(y), fontsize=SMALL)
    ax.set_xlim(0, 100)
    ax.set_ylim(-0.6, len(shares) - 0.4)
    tick_style(ax)


def _rgb(color: Any) -> tuple[float, float, float]:
    return to_rgb(color)


def _value_colors(values: Sequence[str]) -> dict[str, Any]:
    regular = [v for v in values if v not in ("other", "unknown")]
    colors = dict(zip(regular, category_colors(len(regular))))
    colors["other"] = OTHER_GREY
    colors["unknown"] = UNKNOWN_GREY
    return colors


def attribute_distributions(
    extractions: pd.DataFrame,
    filtered: pd.DataFrame,
    dimensions: Sequence[str] = ("gender", "age", "geographic_origin", "income_level"),
    exclude_prompted: bool = True,
    ncols: int = 4,
) -> tuple[Figure, dict]:
    """Share (%) of each extracted value of the protagonists per model: top row(s), one panel of
    stacked horizontal bars per demographic dimension (stereotales stories, parsed extractions);
    bottom row, ``protagonist_gender`` per model, one panel per design. With ``exclude_prompted`` a
    dimension's panel leaves out the stories whose prompt fixed that dimension (their value is the
    prompt's).

    stats: ``n_stories`` (parsed stereotales stories), ``n_models``, per dimension d ``top_<d>`` (most
    frequent known value, pooled over models), ``top_share_<d>`` (its share, 0-1) and
    ``share_unknown_<d>``; ``share_female`` and ``share_male`` (protagonist_gender over all parsed
    stories of every design)."""
    dimensions = list(dimensions)
    title = "Extracted protagonist attributes per model"
    keys = [
        "n_stories",
        "n_models",
        *[f"{p}_{d}" for d in dimensions for p in ("top", "top_share", "share_unknown")],
        "share_female",
        "share_male",
    ]
    if is_empty(extractions) or is_empty(filtered):
        return no_data_figure(title, "no extractions" if is_empty(extractions) else "filtered table is empty", keys)
    require_columns(
        extractions,
        ["story_id", "parse_ok", "protagonist_gender", *[f"demo_{d}" for d in dimensions]],
        "extractions",
    )
    require_columns(filtered, ["story_id", "design", "model"], "filtered")
    side = [c for c in ("story_id", "design", "model", "language", "cond_attribute") if c in filtered.columns]
    data = extractions.merge(filtered[side], on="story_id", how="inner")
    data = data[as_bools(data["parse_ok"])]
    if data.empty:
        return no_data_figure(title, "no parsed extractions joined to filtered stories", keys)
    models = sorted(data["model"].dropna().unique(), key=str)
    stereo = data[data["design"] == "stereotales"]
    designs = ordered(data["design"], ("stereotales", "bedtime", "occupations"))

    # value order and colours per dimension first: the legend heights size the figure
    panels = _dimension_panels(stereo, dimensions, exclude_prompted)
    ncols = max(1, min(ncols, len(dimensions))) if dimensions else 1
    dim_rows = math.ceil(len(dimensions) / ncols) if dimensions else 0
    fig, outer = _attribute_figure(panels, len(models), ncols, dim_rows, len(designs))
    stats: dict[str, Any] = empty_stats(keys)
    stats["n_stories"] = int(len(stereo))
    stats["n_models"] = len(models)
    annotate = len(models) <= 12
    for i, (dim, part, values, order) in enumerate(panels):
        row = outer[i // ncols].subgridspec(1, ncols)
        ax = fig.add_subplot(row[i % ncols])
        label = dim.replace("_", " ")
        ax.set_title(label + (" (prompts fixing it excluded)" if exclude_prompted else ""), fontsize=LABEL)
        if part.empty:
            message_panel(ax, "no stereotales stories" if stereo.empty else f"every story fixed {label}")
            continue
        _dimension_bars(fig, ax, part, values, order, models, annotate, first=i % ncols == 0)
        stats.update(_dimension_stats(dim, values))
    row = outer[dim_rows].subgridspec(1, max(ncols, len(designs)))
    labels = _gender_row(fig, row, data, designs, models, annotate)
    stats["share_female"] = float((labels == "female").mean())
    stats["share_male"] = float((labels == "male").mean())
    top = figure_title(fig, f"{title} (StereoTales; {len(stereo)} parsed stereotales stories)")
    fig.tight_layout(rect=(0, 0, 1, top))
    return fig, stats


def _dimension_panels(stereo: pd.DataFrame, dimensions: Sequence[str], exclude_prompted: bool) -> list[tuple]:
    """Per dimension: (dimension, its stories, their values with missing as "unknown", the value
    order: the design's allowed values first, other observed ones sorted, then "other" and "unknown")."""
    panels = []
    for dim in dimensions:
        part = stereo
        if exclude_prompted and "cond_attribute" in part.columns:
            part = part[part["cond_attribute"] != dim]
        values = part[f"demo_{dim}"].fillna("unknown").astype(str)
        observed = set(values)
        order = [v for v in _dimension_values(dim) if v in observed]
        order += sorted(v for v in observed if v not in order and v not in ("other", "unknown"))
        order += [v for v in ("other", "unknown") if v in observed and v not in order]
        panels.append((dim, part, values, order))
    return panels


def _attribute_figure(
    panels: list[tuple], n_models: int, ncols: int, dim_rows: int, n_designs: int
) -> tuple[Figure, GridSpec]:
    """The figure and its outer grid: ``dim_rows`` rows of dimension panels (tall enough for the
    longest legend) above one row of protagonist-gender panels."""
    legend_rows = max([math.ceil(len(o) / 2) for *_, o in panels] + [1])
    bars_h = 0.5 + 0.2 * n_models
    dim_h = bars_h + 0.9 + 0.17 * legend_rows
    gender_h = bars_h + 1.1
    label_w = 1.9
    panel_w = 3.1
    width = label_w + panel_w * max(ncols, n_designs)
    fig = new_figure(width, dim_h * dim_rows + gender_h + 0.6)
    outer = fig.add_gridspec(dim_rows + 1, 1, height_ratios=[dim_h] * dim_rows + [gender_h])
    return fig, outer


def _dimension_bars(
    fig: Figure,
    ax: Axes,
    part: pd.DataFrame,
    values: pd.Series,
    order: list,
    models: list,
    annotate: bool,
    first: bool,
) -> None:
    """One dimension's panel: each model's value shares as stacked bars, its legend below the panel
    (model names on the first panel of a row only)."""
    counts = pd.crosstab(part["model"], values).reindex(index=models, columns=order, fill_value=0)
    shares = counts.div(counts.sum(axis=1).replace(0, np.nan), axis=0).fillna(0) * 100
    _stacked_bars(ax, shares, _value_colors(order), annotate, labels=first)
    ax.set_xlabel("share of protagonists (%)", fontsize=LABEL)
    if first:
        ax.set_ylabel("model", fontsize=LABEL)
    add_legend(
        ax,
        *ax.get_legend_handles_labels(),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        bbox_transform=ax.transAxes + ScaledTranslation(0, -0.42, fig.dpi_scale_trans),
        ncol=2,
        columnspacing=0.8,
        handlelength=1.2,
        borderaxespad=0.0,
    )


def _dimension_stats(dim: str, values: pd.Series) -> dict[str, Any]:
    """``top_<dim>`` and ``top_share_<dim>`` (most frequent known value, pooled over models; only when
    there is one) and ``share_unknown_<dim>``."""
    stats: dict[str, Any] = {}
    pooled = values.value_counts()
    known = pooled.drop([v for v in ("unknown", "other") if v in pooled.index])
    if len(known):
        stats[f"top_{dim}"] = str(known.idxmax())
        stats[f"top_share_{dim}"] = float(known.max() / len(values))
    stats[f"share_unknown_{dim}"] = float((values == "unknown").mean())
    return stats


def _gender_row(fig: Figure, row, data: pd.DataFrame, designs: list, models: list, annotate: bool) -> pd.Series:
    """The bottom row: protagonist_gender shares per model, one panel per design, the legend right of
    the last. Returns every parsed story's gender label (missing as "unknown")."""
    labels = data["protagonist_gender"].fillna("unknown").astype(str)
    order = ordered(labels, ("female", "male", "unknown"))
    colors = {**_value_colors(order), **{k: v for k, v in OKABE_ITO.items() if k != "unknown"}}
    for j, design in enumerate(designs):
        ax = fig.add_subplot(row[j])
        part = data[data["design"] == design]
        counts = pd.crosstab(part["model"], labels[part.index]).reindex(index=models, columns=order, fill_value=0)
        shares = counts.div(counts.sum(axis=1).replace(0, np.nan), axis=0).fillna(0) * 100
        _stacked_bars(ax, shares, colors, annotate, labels=j == 0)
        ax.set_title(f"protagonist gender · {design} (n = {len(part)})", fontsize=LABEL)
        ax.set_xlabel("share of stories (%)", fontsize=LABEL)
        if j == 0:
            ax.set_ylabel("model", fontsize=LABEL)
        if j == len(designs) - 1:
            add_legend(
                ax, *ax.get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(1.02, 1.0), title="protagonist"
            )
    return labels
