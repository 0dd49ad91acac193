"""Figures of stage 05's JSD tables (BiasedTales-ML): bias strength (JSD) by grammatical gender and
generation quality (VSR) vs bias strength. Both say "too few stories" instead of drawing when every
JSD sits at ln 2 (:func:`_jsd_too_small`). Re-exported by :mod:`storybias.stages.figures.metrics`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from storybias.config.studies import GRAMMATICAL_GENDER, MIN_STORIES_FLAG
from storybias.stages.figures.style import (
    LABEL,
    MARKERS,
    SMALL,
    add_legend,
    category_colors,
    group_sizes,
    is_empty,
    language_order,
    new_figure,
    no_data_figure,
    panel_title,
    pick_rows,
    require_columns,
    shorten,
    tick_style,
    wrap_text,
)


def _jsd_too_small(title: str, jsd: pd.DataFrame, keys: Sequence[str], min_stories: int) -> tuple[Figure, dict] | None:
    """A figure saying "too few stories" with each language's n when every JSD of ``jsd`` is ln 2 (the
    two groups share no adjective: the maximum, reached by disjoint tiny samples); None otherwise."""
    values = jsd["jsd"].to_numpy(float)
    if not len(values) or not np.allclose(values, math.log(2), rtol=0, atol=1e-9):
        return None
    reason = (
        f"too few stories: JSD = ln 2 (the groups share no adjective) in every model x language; "
        f"{group_sizes(jsd)} (need ≥ {min_stories})"
    )
    fig, stats = no_data_figure(title, reason, keys, height=2.8)
    for text in fig.axes[0].texts:
        text.set_text(
            wrap_text(reason, fig.get_figwidth() - 2.0, LABEL)
        )  # the n, not "no data": the lens ran, its groups are too small
    stats["too_small"] = reason
    return fig, stats


# --- JSD by grammatical gender -------------------------------------------------------------------

_GG_KEYS = ("comparison", "median_jsd_G", "median_jsd_N", "n_G", "n_N", "n_ungrouped", "n_models")


def _gg_groups(grammatical_languages) -> tuple[tuple, tuple | None]:
    if grammatical_languages is None:
        grammatical_languages = GRAMMATICAL_GENDER
    if isinstance(grammatical_languages, Mapping):
        return tuple(grammatical_languages["G"]), tuple(grammatical_languages["N"])
    return tuple(grammatical_languages), None


def _gg_assign(sub: pd.DataFrame, grammatical_languages) -> pd.DataFrame:
    """The rows with a JSD, with a ``group`` column: "G", "N", or "" (the language is in neither group)."""
    g_langs, n_langs = _gg_groups(grammatical_languages)
    sub = sub.dropna(subset=["jsd"])
    group = np.where(
        sub["language"].isin(g_langs),
        "G",
        np.where(sub["language"].isin(n_langs) if n_langs is not None else ~sub["language"].isin(g_langs), "N", ""),
    )
    return sub.assign(group=group)


def jsd_by_grammatical_gender(
    jsd: pd.DataFrame,
    grammatical_languages: Mapping[str, Sequence[str]] | Sequence[str] | None = None,
    comparison: str | None = None,
    min_stories: int = MIN_STORIES_FLAG,
) -> tuple[Figure, dict]:
    """Box plots (points overlaid, one per language) of JSD (nats) for languages with grammatical
    gender (G) and without (N), per model and pooled over models, for one ``comparison``.
    ``grammatical_languages``: ``{"G": [...], "N": [...]}`` (default ``metrics.GRAMMATICAL_GENDER``;
    languages in neither group are left out and named), or a list of G languages (all others N).

    stats: ``comparison``, ``median_jsd_G`` / ``median_jsd_N`` (pooled over models),
    ``n_G`` / ``n_N`` (model x language cells with a JSD), ``n_ungrouped``, ``n_models``.

    When every JSD is ln 2 (the two groups share no adjective: disjoint, too few stories) the figure
    draws no box: it says "too few stories" with each language's n_m and n_f (``min_stories``:
    ``metrics.min_stories``), the JSD statistics are NaN and ``too_small`` (and ``no_data``) hold the
    reason."""
    title = "Bias strength (JSD) by grammatical gender"
    if is_empty(jsd):
        return no_data_figure(title, "metrics_jsd table is empty", _GG_KEYS)
    require_columns(jsd, ["model", "language", "jsd"], "metrics_jsd")
    sub, comparison, why = pick_rows(jsd, "comparison", comparison, "comparison")
    if why:
        return no_data_figure(title, why, _GG_KEYS)
    sub = _gg_assign(sub, grammatical_languages)
    ungrouped = sorted(sub.loc[sub["group"] == "", "language"].unique(), key=str)
    grouped = sub[sub["group"] != ""]
    if grouped.empty:
        return no_data_figure(title, "no JSD values" if sub.empty else "no language in either group", _GG_KEYS)
    small = _jsd_too_small(title, grouped, _GG_KEYS, min_stories)
    if small is not None:
        fig, stats = small
        stats.update(
            comparison=comparison,
            n_G=int((grouped["group"] == "G").sum()),
            n_N=int((grouped["group"] == "N").sum()),
            n_ungrouped=len(ungrouped),
            n_models=int(grouped["model"].nunique()),
        )
        return fig, stats
    models = sorted(grouped["model"].unique(), key=str)
    columns = (["all models"] if len(models) > 1 else []) + models
    fig = new_figure(max(5.5, 1.6 + 0.75 * len(columns)) + 2.6, 4.6)
    ax = fig.add_subplot()
    colors = {"G": colormaps["tab10"](0), "N": colormaps["tab10"](1)}
    _gg_boxes(ax, grouped, columns, colors)
    _gg_axes(ax, grouped, columns, colors)
    note = f"; not grouped: {', '.join(map(str, ungrouped))}" if ungrouped else ""
    panel_title(ax, f"{title} (comparison: {comparison}; one point per language{note})", fig.get_figwidth() - 0.6)
    fig.tight_layout()
    stats = {
        "comparison": comparison,
        "median_jsd_G": float(grouped.loc[grouped["group"] == "G", "jsd"].median()),
        "median_jsd_N": float(grouped.loc[grouped["group"] == "N", "jsd"].median()),
        "n_G": int((grouped["group"] == "G").sum()),
        "n_N": int((grouped["group"] == "N").sum()),
        "n_ungrouped": len(ungrouped),
        "n_models": len(models),
    }
    return fig, stats


def _gg_boxes(ax: Axes, grouped: pd.DataFrame, columns: list, colors: dict) -> None:
    """One G and one N box per column ("all models", then each model), its points jittered over it
    (one seeded generator for the whole figure) and, when there are few, named by language."""
    rng = np.random.default_rng(0)
    label_points = len(grouped) <= 30  # few points: name their language
    for i, column in enumerate(columns):
        part = grouped if column == "all models" else grouped[grouped["model"] == column]
        for offset, g in ((-0.2, "G"), (0.2, "N")):
            y = part.loc[part["group"] == g, "jsd"].to_numpy(float)
            if len(y) == 0:
                continue
            box = ax.boxplot(
                y,
                positions=[i + offset],
                widths=0.32,
                patch_artist=True,
                showfliers=False,
                medianprops={"color": "black"},
            )
            for patch in box["boxes"]:
                patch.set_facecolor((*colors[g][:3], 0.35))
                patch.set_edgecolor(colors[g])
            xs = i + offset + rng.uniform(-0.08, 0.08, len(y))
            ax.scatter(xs, y, s=12, color=colors[g], edgecolors="black", linewidths=0.3, zorder=3)
            if label_points and column != "all models":
                for xi, yi, lang in zip(xs, y, part.loc[part["group"] == g, "language"]):
                    ax.annotate(
                        str(lang), (xi, yi), xytext=(4, 0), textcoords="offset points", fontsize=SMALL, va="center"
                    )


def _gg_axes(ax: Axes, grouped: pd.DataFrame, columns: list, colors: dict) -> None:
    """The model ticks, axis labels and the G / N legend naming each group's languages."""
    ax.set_xticks(
        range(len(columns)),
        [shorten(c, 20) for c in columns],
        rotation=30 if len(columns) > 4 else 0,
        ha="right" if len(columns) > 4 else "center",
        fontsize=SMALL,
    )
    ax.set_xlim(-0.6, len(columns) - 0.4)
    ax.set_ylabel("Jensen–Shannon divergence (nats)", fontsize=LABEL)
    ax.set_xlabel("model", fontsize=LABEL)
    tick_style(ax)
    g_present = [l for l in language_order(grouped.loc[grouped["group"] == "G", "language"])]
    n_present = [l for l in language_order(grouped.loc[grouped["group"] == "N", "language"])]
    handles = [Patch(facecolor=(*colors[g][:3], 0.35), edgecolor=colors[g]) for g in ("G", "N")]
    labels = [
        f"G: grammatical gender ({', '.join(g_present) or 'none'})",
        f"N: no grammatical gender ({', '.join(n_present) or 'none'})",
    ]
    add_legend(ax, handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1)


# --- VSR vs JSD ----------------------------------------------------------------------------------

_VJ_KEYS = ("comparison", "n_points", "n_models", "n_missing", "mean_vsr", "mean_jsd", "max_jsd", "max_jsd_cell")


def vsr_vs_jsd(
    vsr_jsd: pd.DataFrame, comparison: str | None = None, max_labels: int = 60, min_stories: int = MIN_STORIES_FLAG
) -> tuple[Figure, dict]:
    """Valid-story rate (%, x) vs JSD (nats, y) with its bootstrap interval, one point per model x
    language (colour and marker = model, text = language code; with more than ``max_labels`` points
    only the 15 highest-JSD and the 10 lowest-VSR points are labelled).

    stats: ``comparison``, ``n_points``, ``n_models``, ``n_missing`` (rows without VSR or JSD),
    ``mean_vsr`` (0-1), ``mean_jsd``, ``max_jsd`` and ``max_jsd_cell`` ("model / language").
    Every JSD at ln 2: "too few stories" with the n, as :func:`jsd_by_grammatical_gender`."""
    title = "Generation quality vs bias strength"
    if is_empty(vsr_jsd):
        return no_data_figure(title, "metrics_vsr_jsd table is empty", _VJ_KEYS)
    require_columns(vsr_jsd, ["model", "language", "jsd", "vsr"], "metrics_vsr_jsd")
    sub, comparison, why = pick_rows(vsr_jsd, "comparison", comparison, "comparison")
    if why:
        return no_data_figure(title, why, _VJ_KEYS)
    points = sub.dropna(subset=["vsr", "jsd"])
    n_missing = len(sub) - len(points)
    if points.empty:
        return no_data_figure(title, f"no row has both a VSR and a JSD ({n_missing} rows)", _VJ_KEYS)
    small = _jsd_too_small(title, points, _VJ_KEYS, min_stories)
    if small is not None:
        fig, stats = small
        stats.update(
            comparison=comparison, n_points=len(points), n_models=int(points["model"].nunique()), n_missing=n_missing
        )
        return fig, stats
    models = sorted(points["model"].unique(), key=str)
    colors = dict(zip(models, category_colors(len(models))))
    markers = {m: MARKERS[i % len(MARKERS)] for i, m in enumerate(models)}
    fig = new_figure(7.0 + (2.6 if len(models) > 12 else 1.6), 5.0)
    ax = fig.add_subplot()
    label_idx = (
        set(points.index)
        if len(points) <= max_labels
        else (set(points["jsd"].nlargest(15).index) | set(points["vsr"].nsmallest(10).index))
    )
    for model in models:
        _vj_model(ax, points[points["model"] == model], colors[model], markers[model], shorten(model, 26), label_idx)
    ax.set_xlabel("valid-story rate (%)", fontsize=LABEL)
    ax.set_ylabel("Jensen–Shannon divergence (nats)", fontsize=LABEL)
    x_min = points["vsr"].min() * 100
    ax.set_xlim(max(0.0, x_min - 8), 103)
    panel_title(
        ax,
        f"{title} (comparison: {comparison}; one point per model × language, bars = 95% CI)",
        fig.get_figwidth() - 0.6,
    )
    tick_style(ax)
    add_legend(
        ax,
        *ax.get_legend_handles_labels(),
        title="model",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        ncol=1 if len(models) <= 12 else 2,
    )
    fig.tight_layout()
    return fig, _vj_stats(points, comparison, len(models), n_missing)


def _vj_model(ax: Axes, part: pd.DataFrame, color, marker: str, label: str, label_idx: set) -> None:
    """One model's points: its CI bars (where both bounds are finite), the points, and the language
    code of those in ``label_idx``."""
    x, y = part["vsr"].to_numpy(float) * 100, part["jsd"].to_numpy(float)
    if {"ci_low", "ci_high"} <= set(part.columns):
        lo, hi = part["ci_low"].to_numpy(float), part["ci_high"].to_numpy(float)
        ok = np.isfinite(lo) & np.isfinite(hi)
        ax.errorbar(
            x[ok],
            y[ok],
            yerr=[np.clip(y[ok] - lo[ok], 0, None), np.clip(hi[ok] - y[ok], 0, None)],
            fmt="none",
            ecolor=color,
            alpha=0.5,
            lw=0.8,
        )
    ax.scatter(x, y, color=color, marker=marker, s=30, edgecolors="black", linewidths=0.3, label=label, zorder=3)
    for idx, xi, yi in zip(part.index, x, y):
        if idx in label_idx:
            ax.annotate(
                str(part.at[idx, "language"]), (xi, yi), xytext=(3, 3), textcoords="offset points", fontsize=SMALL
            )


def _vj_stats(points: pd.DataFrame, comparison, n_models: int, n_missing: int) -> dict:
    worst = points.loc[points["jsd"].idxmax()]
    return {
        "comparison": comparison,
        "n_points": int(len(points)),
        "n_models": n_models,
        "n_missing": int(n_missing),
        "mean_vsr": float(points["vsr"].mean()),
        "mean_jsd": float(points["jsd"].mean()),
        "max_jsd": float(worst["jsd"]),
        "max_jsd_cell": f"{worst['model']} / {worst['language']}",
    }
