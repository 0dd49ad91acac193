"""Figures of stage 05's artifacts. BiasedTales-ML's S_C and word figures are drawn here: bias
fingerprints, cosine heat maps and distinctive words; its JSD figures (JSD by grammatical gender, VSR
vs JSD) live in :mod:`storybias.stages.figures.metrics_jsd`, and Feng et al.'s balance/stereotype
scatter, ANOVA table and GLM table in :mod:`storybias.stages.figures.metrics_feng`. This module re-exports those
four, so every stage-05 figure is importable from here."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.projections.polar import PolarAxes

from storybias.config.prompts import LANGUAGES
from storybias.config.studies import MIN_STORIES_FLAG, S_C_CLIP
from storybias.stages.figures.metrics_feng import anova_table, balance_stereotype, glm_table
from storybias.stages.figures.metrics_jsd import jsd_by_grammatical_gender, vsr_vs_jsd
from storybias.stages.figures.style import (
    LABEL,
    MARKERS,
    SMALL,
    add_legend,
    as_bools,
    category_colors,
    draw_heatmap,
    figure_title,
    is_empty,
    language_order,
    message_panel,
    new_figure,
    no_data_figure,
    ordered,
    panel_grid,
    pick_rows,
    require_columns,
    shorten,
    tick_style,
    too_small_reason,
)

__all__ = [
    "glm_table",
    "anova_table",
    "balance_stereotype",
    "bias_fingerprints",
    "cosine_heatmaps",
    "distinctive_words",
    "jsd_by_grammatical_gender",
    "vsr_vs_jsd",
]

# --- 5-9. narrative distributions (BiasedTales-ML): S_C and words ------------------------------

_FP_KEYS = (
    "comparison",
    "n_models",
    "n_languages",
    "max_abs_s_c",
    "most_positive_category",
    "most_negative_category",
    "n_small_sample_cells",
    "n_too_small_panels",
)


def _sc_too_small(panel: pd.DataFrame) -> tuple[bool, bool]:
    """(every S_C of the panel at the clip, every cell of the panel flagged small)."""
    finite = panel["s_c"].dropna().abs()
    clipped = bool(len(finite)) and bool((finite >= S_C_CLIP - 1e-9).all())
    small = "small_sample" in panel.columns and len(panel) > 0 and bool(as_bools(panel["small_sample"]).all())
    return clipped, small


def bias_fingerprints(
    sc: pd.DataFrame,
    comparison: str | None = None,
    kind: str = "adjectives",
    ncols: int = 4,
    min_stories: int = MIN_STORIES_FLAG,
) -> tuple[Figure, dict]:
    """Radar plots of S_C per category (``kind``: adjectives or settings), one polygon per language,
    one panel per model, for one ``comparison`` (default: the first in the file). The radius runs from
    -2 (centre) to +2; the bold circle is S_C = 0; outward = more frequent in the comparison's first
    group (group_m). Missing S_C leaves a gap; dashed = small sample.

    stats: ``comparison``, ``n_models``, ``n_languages``, ``max_abs_s_c``,
    ``most_positive_category`` / ``most_negative_category`` (highest / lowest mean S_C over model x
    language), ``n_small_sample_cells`` (model x language cells flagged small), ``n_too_small_panels``.

    A panel whose every S_C sits at the ±2 clip (each category seen in one group only) or whose every
    language has a group below ``min_stories`` (``metrics.min_stories``, the ``small_sample`` flag)
    draws no polygon: it says "too few stories" with each language's n_m and n_f. The S_C statistics
    are taken over the drawn panels only; when no panel is drawn they are NaN and ``too_small`` (and
    ``no_data``) hold the reason."""
    title = f"Bias fingerprints: S_C per {kind[:-1] if kind.endswith('s') else kind} category"
    if is_empty(sc):
        return no_data_figure(title, "metrics_sc table is empty (no comparison had stories in both groups)", _FP_KEYS)
    require_columns(sc, ["comparison", "model", "language", "kind", "category", "s_c"], "metrics_sc")
    sub = sc[sc["kind"] == kind]
    if sub.empty:
        return no_data_figure(title, f"no rows with kind = {kind!r}", _FP_KEYS)
    sub, comparison, why = pick_rows(sub, "comparison", comparison, "comparison")
    if why:
        return no_data_figure(title, why, _FP_KEYS)
    cats = list(pd.unique(sub["category"]))
    models = sorted(sub["model"].unique(), key=str)
    languages = language_order(sub["language"])
    colors = dict(zip(languages, category_colors(len(languages))))
    many = len(languages) > 10
    style = {lang: (MARKERS[i % len(MARKERS)] if many else "o") for i, lang in enumerate(languages)}
    n_cols = max(1, min(len(models), ncols))
    fig, axes, _, _ = panel_grid(
        len(models),
        ncols,
        3.5,
        3.5,
        extra_w=max(0.0, 7.0 - 3.5 * n_cols),
        extra_h=1.6 + 0.2 * math.ceil((len(languages) + 1) / 4),
        polar=True,
    )
    small_cells: set[tuple] = set()
    too_small: dict[str, str] = {}
    for ax, model in zip(axes, models):
        m = sub[sub["model"] == model]
        clipped, all_small = _sc_too_small(m)
        if clipped or all_small:
            too_small[model] = too_small_reason(m, min_stories, clipped)
            message_panel(ax, too_small[model], 2.2)
            ax.set_title(shorten(model, 30), fontsize=LABEL, pad=14)
            continue
        small_cells |= {(model, lang) for lang in _fingerprint_panel(ax, m, cats, languages, colors, style)}
        ax.set_title(shorten(model, 30), fontsize=LABEL, pad=14)
        ax.tick_params(pad=1)
    _fingerprint_legend(fig, title, comparison, languages, colors, style, bool(small_cells))
    return fig, _fingerprint_stats(sub, comparison, models, languages, small_cells, too_small)


def _fingerprint_panel(ax: PolarAxes, m: pd.DataFrame, cats: list, languages: list, colors: dict, style: dict) -> list:
    """One model's radar: the bold zero circle, one closed polygon per language (dashed when its
    cell is flagged small), the category and radius ticks. Returns the languages drawn dashed."""
    theta = np.linspace(0, 2 * np.pi, len(cats), endpoint=False)
    closed = np.append(theta, theta[0])
    dashed = []
    ax.set_ylim(-2.0, 2.0)
    ax.plot(np.linspace(0, 2 * np.pi, 200), np.zeros(200), color="black", lw=1.8, zorder=1)
    for lang in languages:
        cell = m[m["language"] == lang]
        if cell.empty:
            continue
        r = cell.set_index("category")["s_c"].reindex(cats).to_numpy(float)
        small = "small_sample" in cell.columns and bool(as_bools(cell["small_sample"]).any())
        if small:
            dashed.append(lang)
        ax.plot(
            closed,
            np.append(r, r[0]),
            color=colors[lang],
            lw=1.4,
            ls="--" if small else "-",
            marker=style[lang],
            markersize=3.5,
            zorder=2,
        )
    ax.set_xticks(theta, [shorten(c.replace("_", " "), 14) for c in cats], fontsize=SMALL)
    ax.set_yticks([-2, -1, 0, 1, 2], ["", "−1", "0", "+1", "+2"], fontsize=SMALL, color="#333333")
    ax.set_rlabel_position(180 / max(1, len(cats)))  # between the first two categories
    return dashed


def _fingerprint_legend(
    fig: Figure, title: str, comparison, languages: list, colors: dict, style: dict, any_small: bool
) -> None:
    """The figure title, the language legend below the panels (plus the dashed-line key when a cell
    is small) and the layout that leaves room for both."""
    handles = [Line2D([], [], color=colors[lang], marker=style[lang], lw=1.4, markersize=4) for lang in languages]
    labels = [f"{lang} ({LANGUAGES[lang]})" if lang in LANGUAGES else str(lang) for lang in languages]
    if any_small:
        handles.append(Line2D([], [], color="#555555", ls="--", lw=1.4))
        labels.append("dashed: small sample")
    top = figure_title(
        fig,
        f"{title} (comparison: {comparison}); radius = S_C (ln ratio, −2…+2), outward = more frequent "
        f"in the first group; bold circle = 0",
    )
    ncol = max(1, min(7, len(handles), int(fig.get_figwidth() / 1.6)))
    add_legend(fig, handles, labels, title="prompt language", loc="lower center", ncol=ncol, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, (0.4 + 0.2 * math.ceil(len(handles) / ncol)) / fig.get_figheight(), 1, top))


def _fingerprint_stats(
    sub: pd.DataFrame, comparison, models: list, languages: list, small_cells: set, too_small: dict[str, str]
) -> dict:
    """The stats of :func:`bias_fingerprints`, the S_C ones over the drawn panels only."""
    drawn = sub[~sub["model"].isin(too_small)]
    means = drawn.groupby("category")["s_c"].mean().dropna()
    stats = {
        "comparison": comparison,
        "n_models": len(models),
        "n_languages": len(languages),
        "max_abs_s_c": float(drawn["s_c"].abs().max()) if len(drawn) else float("nan"),
        "most_positive_category": str(means.idxmax()) if len(means) else None,
        "most_negative_category": str(means.idxmin()) if len(means) else None,
        "n_small_sample_cells": len(small_cells),
        "n_too_small_panels": len(too_small),
    }
    if too_small and len(too_small) == len(models):
        stats["too_small"] = stats["no_data"] = (
            "; ".join(f"{m}: {r}" for m, r in too_small.items()) if len(models) > 1 else next(iter(too_small.values()))
        )
    return stats


_COS_KEYS = ("comparison", "n_models", "n_languages", "mean_cosine", "min_cosine", "min_pair", "most_consistent_model")


def cosine_heatmaps(cosine: pd.DataFrame, comparison: str | None = None, ncols: int = 4) -> tuple[Figure, dict]:
    """Language x language cosine similarity of the adjective-category S_C vectors, one heatmap per
    model (viridis, -1 to 1; lighter = more similar), for one ``comparison`` (default: the first).

    stats: ``comparison``, ``n_models``, ``n_languages``, ``mean_cosine`` (mean over models of the
    off-diagonal pairs), ``min_cosine`` and ``min_pair`` ("model: a–b"), ``most_consistent_model``
    (highest mean off-diagonal cosine)."""
    title = "Cross-lingual cosine similarity of bias fingerprints"
    if is_empty(cosine):
        return no_data_figure(title, "metrics_cosine table is empty", _COS_KEYS)
    require_columns(cosine, ["comparison", "model", "language_a", "language_b", "cosine"], "metrics_cosine")
    sub, comparison, why = pick_rows(cosine, "comparison", comparison, "comparison")
    if why:
        return no_data_figure(title, why, _COS_KEYS)
    models = sorted(sub["model"].unique(), key=str)
    languages = language_order(pd.concat([sub["language_a"], sub["language_b"]]))
    n = len(languages)
    annotate = n <= 8  # beyond, the colour carries the value (a 14 x 14 grid of numbers per model is unreadable)
    panel = max(2.6, (0.42 if annotate else 0.2) * n + 1.1)
    n_cols = max(1, min(len(models), ncols))
    fig, axes, _, _ = panel_grid(
        len(models), ncols, panel, panel, extra_w=0.9 + max(0.0, 5.0 - panel * n_cols), extra_h=1.0
    )
    fmt = "{:.2f}" if annotate else None
    image: AxesImage | None = None
    off = sub[sub["language_a"] != sub["language_b"]].dropna(subset=["cosine"])
    for ax, model in zip(axes, models):
        matrix = sub[sub["model"] == model].pivot_table(
            index="language_a", columns="language_b", values="cosine", aggfunc="first"
        )
        matrix = matrix.reindex(index=languages, columns=languages)
        image = draw_heatmap(ax, matrix.to_numpy(float), -1.0, 1.0, fmt, aspect="equal")
        ax.set_xticks(range(n), languages, fontsize=SMALL, rotation=90 if n > 8 else 0)
        ax.set_yticks(range(n), languages, fontsize=SMALL)
        ax.set_xlabel("language", fontsize=LABEL)
        ax.set_ylabel("language", fontsize=LABEL)
        ax.set_title(shorten(model, 30), fontsize=LABEL)
    top = figure_title(fig, f"{title} (comparison: {comparison}; S_C vectors of adjective categories, missing = 0)")
    fig.tight_layout(rect=(0, 0, 1 - 0.8 / fig.get_figwidth(), top))
    cax = fig.add_axes((1 - 0.62 / fig.get_figwidth(), 0.12, 0.12 / fig.get_figwidth(), top - 0.2))
    assert image is not None  # the grid has at least one panel
    bar = fig.colorbar(image, cax=cax)
    bar.set_label("cosine similarity", fontsize=LABEL)
    bar.ax.tick_params(labelsize=SMALL)
    per_model = off.groupby("model")["cosine"].mean()
    worst = off.loc[off["cosine"].idxmin()] if len(off) else None
    stats = {
        "comparison": comparison,
        "n_models": len(models),
        "n_languages": n,
        "mean_cosine": float(per_model.mean()) if len(per_model) else float("nan"),
        "min_cosine": float(worst["cosine"]) if worst is not None else float("nan"),
        "min_pair": f"{worst['model']}: {worst['language_a']}–{worst['language_b']}" if worst is not None else None,
        "most_consistent_model": str(per_model.idxmax()) if len(per_model) else None,
    }
    return fig, stats


_LO_KEYS = ("models", "n_panels", "n_words", "max_abs_z", "max_abs_z_word")
_FIELD_NAMES = {
    "adjectives_en": "adjectives (English lemmas)",
    "settings": "settings",
    "cultural_refs": "cultural references",
}


def distinctive_words(
    log_odds: pd.DataFrame, top: int = 10, model: str | None = None, comparisons: Sequence[str] | None = None
) -> tuple[Figure, dict]:
    """Most distinctive words (Monroe et al. log-odds z): one row of panels per comparison x model (every
    model, as BiasedTales-ML's Figs. 10-12, or only ``model``), one column per field (adjectives, settings,
    cultural references); in each panel the ``top`` words of each group (at most 25), positive z = the
    first group.

    stats: ``models`` (comma-separated), ``n_panels``, ``n_words`` (bars drawn), ``max_abs_z`` and
    ``max_abs_z_word`` ("word (comparison, model, field)")."""
    title = "Distinctive words (log-odds z with informative Dirichlet prior)"
    if is_empty(log_odds):
        return no_data_figure(title, "metrics_log_odds table is empty", _LO_KEYS)
    require_columns(log_odds, ["comparison", "model", "field", "group", "word", "z"], "metrics_log_odds")
    sub = log_odds if model is None else log_odds[log_odds["model"] == model]
    if comparisons is not None:
        sub = sub[sub["comparison"].isin(list(comparisons))]
    if sub.empty:
        return no_data_figure(title, f"no rows for model {model!r}", _LO_KEYS)
    top = max(1, min(int(top), 25))
    models = sorted(sub["model"].unique(), key=str)
    rows = [(comp, m) for comp in pd.unique(sub["comparison"]) for m in models]
    fields = ordered(sub["field"], ("adjectives_en", "settings", "cultural_refs"))
    per_panel = sub.groupby(["comparison", "model", "field"]).apply(
        lambda p: sum(min(top, len(g)) for _, g in p.groupby("group")), include_groups=False
    )
    tallest = int(per_panel.max()) if len(per_panel) else top
    panel_h = 0.8 + 0.19 * tallest
    fig = new_figure(4.4 * len(fields) + 0.4, panel_h * len(rows) + 0.9)
    n_words, best = 0, None
    for r, (comp, m) in enumerate(rows):
        for c, field in enumerate(fields):
            ax = fig.add_subplot(len(rows), len(fields), r * len(fields) + c + 1)
            part = sub[(sub["comparison"] == comp) & (sub["model"] == m) & (sub["field"] == field)]
            who = f" · {shorten(m, 24)}" if len(models) > 1 else ""
            ax.set_title(f"{comp}{who} · {_FIELD_NAMES.get(field, field)}", fontsize=LABEL)
            if part.empty:
                message_panel(ax, "no words for this field")
                continue
            chosen = _words_panel(ax, part, top)
            n_words += len(chosen)
            i = chosen["z"].abs().idxmax()
            if best is None or abs(chosen.at[i, "z"]) > abs(best[0]):
                best = (float(chosen.at[i, "z"]), f"{chosen.at[i, 'word']} ({comp}, {m}, {field})")
    who = shorten(models[0], 40) if len(models) == 1 else f"{len(models)} models"
    upper = figure_title(fig, f"{title}: {who}, top {top} per group")
    fig.tight_layout(rect=(0, 0, 1, upper))
    stats = {
        "models": ", ".join(str(m) for m in models),
        "n_panels": len(rows) * len(fields),
        "n_words": n_words,
        "max_abs_z": abs(best[0]) if best else float("nan"),
        "max_abs_z_word": best[1] if best else None,
    }
    return fig, stats


def _words_panel(ax: Axes, part: pd.DataFrame, top: int) -> pd.DataFrame:
    """One comparison x field panel: the ``top`` words by |z| of each group as horizontal bars
    (sorted by z, coloured by group, with a group legend). Returns the words drawn."""
    groups = list(pd.unique(part["group"]))
    colors = dict(zip(groups, category_colors(max(2, len(groups)))))
    chosen = pd.concat(
        [
            g.reindex(g["z"].abs().sort_values(ascending=False).index).head(top)
            for _, g in part.groupby("group", sort=False)
        ]
    )
    chosen = chosen.sort_values("z")
    y = np.arange(len(chosen))
    ax.barh(y, chosen["z"], color=[colors[g] for g in chosen["group"]], height=0.75)
    ax.set_yticks(y, [shorten(w, 20) for w in chosen["word"]], fontsize=SMALL)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("log-odds z (> 0: first group)", fontsize=LABEL)
    ax.set_ylim(-0.6, len(chosen) - 0.4)
    tick_style(ax)
    add_legend(ax, [Patch(color=colors[g]) for g in groups], [str(g) for g in groups], loc="lower right", frameon=True)
    return chosen
