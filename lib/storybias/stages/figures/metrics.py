"""Figures of stage 05's artifacts: BiasedTales-ML's fingerprints, cosine heat maps, JSD by
grammatical gender, distinctive words and VSR vs JSD; Feng et al.'s balance/stereotype scatter and
ANOVA table.

Above 600 lines once formatted, on purpose: seven figures drawn from stage 05's tables, one function
each; splitting them by study would split one stage's artifacts over two modules."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import Ellipse, Patch

from storybias.config.prompts import LANGUAGES
from storybias.config.studies import GRAMMATICAL_GENDER, MIN_STORIES_FLAG, S_C_CLIP
from storybias.stages.figures.style import (
    GENRE_ORDER,
    LABEL,
    MARKERS,
    SMALL,
    _bools,
    _colors,
    _figure,
    _grid,
    _group_sizes,
    _heatmap,
    _is_empty,
    _isna,
    _lang_order,
    _legend,
    _no_data,
    _ordered,
    _pick,
    _require,
    _short,
    _suptitle,
    _table,
    _ticks,
    _title,
    _too_small_reason,
    _wrap,
    message_panel,
)

# --- 5-9. narrative distributions (BiasedTales-ML) ---------------------------------------------

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
    small = "small_sample" in panel.columns and len(panel) > 0 and bool(_bools(panel["small_sample"]).all())
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
    if _is_empty(sc):
        return _no_data(title, "metrics_sc table is empty (no comparison had stories in both groups)", _FP_KEYS)
    _require(sc, ["comparison", "model", "language", "kind", "category", "s_c"], "metrics_sc")
    sub = sc[sc["kind"] == kind]
    if sub.empty:
        return _no_data(title, f"no rows with kind = {kind!r}", _FP_KEYS)
    sub, comparison, why = _pick(sub, "comparison", comparison, "comparison")
    if why:
        return _no_data(title, why, _FP_KEYS)
    cats = list(pd.unique(sub["category"]))
    models = sorted(sub["model"].unique(), key=str)
    languages = _lang_order(sub["language"])
    colors = dict(zip(languages, _colors(len(languages))))
    many = len(languages) > 10
    style = {lang: (MARKERS[i % len(MARKERS)] if many else "o") for i, lang in enumerate(languages)}
    n_cols = max(1, min(len(models), ncols))
    fig, axes, _, _ = _grid(
        len(models),
        ncols,
        3.5,
        3.5,
        extra_w=max(0.0, 7.0 - 3.5 * n_cols),
        extra_h=1.6 + 0.2 * math.ceil((len(languages) + 1) / 4),
        polar=True,
    )
    theta = np.linspace(0, 2 * np.pi, len(cats), endpoint=False)
    closed = np.append(theta, theta[0])
    small_cells = set()
    too_small: dict[str, str] = {}
    for ax, model in zip(axes, models):
        m = sub[sub["model"] == model]
        clipped, all_small = _sc_too_small(m)
        if clipped or all_small:
            too_small[model] = _too_small_reason(m, min_stories, clipped)
            message_panel(ax, too_small[model], 2.2)
            ax.set_title(_short(model, 30), fontsize=LABEL, pad=14)
            continue
        ax.set_ylim(-2.0, 2.0)
        ax.plot(np.linspace(0, 2 * np.pi, 200), np.zeros(200), color="black", lw=1.8, zorder=1)
        for lang in languages:
            cell = m[m["language"] == lang]
            if cell.empty:
                continue
            r = cell.set_index("category")["s_c"].reindex(cats).to_numpy(float)
            small = "small_sample" in cell.columns and bool(_bools(cell["small_sample"]).any())
            if small:
                small_cells.add((model, lang))
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
        ax.set_xticks(theta, [_short(c.replace("_", " "), 14) for c in cats], fontsize=SMALL)
        ax.set_yticks([-2, -1, 0, 1, 2], ["", "−1", "0", "+1", "+2"], fontsize=SMALL, color="#333333")
        ax.set_rlabel_position(180 / max(1, len(cats)))  # between the first two categories
        ax.set_title(_short(model, 30), fontsize=LABEL, pad=14)
        ax.tick_params(pad=1)
    handles = [Line2D([], [], color=colors[lang], marker=style[lang], lw=1.4, markersize=4) for lang in languages]
    labels = [f"{lang} ({LANGUAGES[lang]})" if lang in LANGUAGES else str(lang) for lang in languages]
    if small_cells:
        handles.append(Line2D([], [], color="#555555", ls="--", lw=1.4))
        labels.append("dashed: small sample")
    top = _suptitle(
        fig,
        f"{title} (comparison: {comparison}); radius = S_C (ln ratio, −2…+2), outward = more frequent "
        f"in the first group; bold circle = 0",
    )
    ncol = max(1, min(7, len(handles), int(fig.get_figwidth() / 1.6)))
    _legend(fig, handles, labels, title="prompt language", loc="lower center", ncol=ncol, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, (0.4 + 0.2 * math.ceil(len(handles) / ncol)) / fig.get_figheight(), 1, top))
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
    return fig, stats


_COS_KEYS = ("comparison", "n_models", "n_languages", "mean_cosine", "min_cosine", "min_pair", "most_consistent_model")


def cosine_heatmaps(cosine: pd.DataFrame, comparison: str | None = None, ncols: int = 4) -> tuple[Figure, dict]:
    """Language x language cosine similarity of the adjective-category S_C vectors, one heatmap per
    model (viridis, -1 to 1; lighter = more similar), for one ``comparison`` (default: the first).

    stats: ``comparison``, ``n_models``, ``n_languages``, ``mean_cosine`` (mean over models of the
    off-diagonal pairs), ``min_cosine`` and ``min_pair`` ("model: a–b"), ``most_consistent_model``
    (highest mean off-diagonal cosine)."""
    title = "Cross-lingual cosine similarity of bias fingerprints"
    if _is_empty(cosine):
        return _no_data(title, "metrics_cosine table is empty", _COS_KEYS)
    _require(cosine, ["comparison", "model", "language_a", "language_b", "cosine"], "metrics_cosine")
    sub, comparison, why = _pick(cosine, "comparison", comparison, "comparison")
    if why:
        return _no_data(title, why, _COS_KEYS)
    models = sorted(sub["model"].unique(), key=str)
    languages = _lang_order(pd.concat([sub["language_a"], sub["language_b"]]))
    n = len(languages)
    annotate = n <= 8  # beyond, the colour carries the value (a 14 x 14 grid of numbers per model is unreadable)
    panel = max(2.6, (0.42 if annotate else 0.2) * n + 1.1)
    n_cols = max(1, min(len(models), ncols))
    fig, axes, _, _ = _grid(len(models), ncols, panel, panel, extra_w=0.9 + max(0.0, 5.0 - panel * n_cols), extra_h=1.0)
    fmt = "{:.2f}" if annotate else None
    image: AxesImage | None = None
    off = sub[sub["language_a"] != sub["language_b"]].dropna(subset=["cosine"])
    for ax, model in zip(axes, models):
        matrix = sub[sub["model"] == model].pivot_table(
            index="language_a", columns="language_b", values="cosine", aggfunc="first"
        )
        matrix = matrix.reindex(index=languages, columns=languages)
        image = _heatmap(ax, matrix.to_numpy(float), -1.0, 1.0, fmt, aspect="equal")
        ax.set_xticks(range(n), languages, fontsize=SMALL, rotation=90 if n > 8 else 0)
        ax.set_yticks(range(n), languages, fontsize=SMALL)
        ax.set_xlabel("language", fontsize=LABEL)
        ax.set_ylabel("language", fontsize=LABEL)
        ax.set_title(_short(model, 30), fontsize=LABEL)
    top = _suptitle(fig, f"{title} (comparison: {comparison}; S_C vectors of adjective categories, missing = 0)")
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


def _jsd_too_small(title: str, jsd: pd.DataFrame, keys: Sequence[str], min_stories: int) -> tuple[Figure, dict] | None:
    """A figure saying "too few stories" with each language's n when every JSD of ``jsd`` is ln 2 (the
    two groups share no adjective: the maximum, reached by disjoint tiny samples); None otherwise."""
    values = jsd["jsd"].to_numpy(float)
    if not len(values) or not np.allclose(values, math.log(2), rtol=0, atol=1e-9):
        return None
    reason = (
        f"too few stories: JSD = ln 2 (the groups share no adjective) in every model x language; "
        f"{_group_sizes(jsd)} (need ≥ {min_stories})"
    )
    fig, stats = _no_data(title, reason, keys, height=2.8)
    for text in fig.axes[0].texts:
        text.set_text(
            _wrap(reason, fig.get_figwidth() - 2.0, LABEL)
        )  # the n, not "no data": the lens ran, its groups are too small
    stats["too_small"] = reason
    return fig, stats


_GG_KEYS = ("comparison", "median_jsd_G", "median_jsd_N", "n_G", "n_N", "n_ungrouped", "n_models")


def _gg_groups(grammatical_languages) -> tuple[tuple, tuple | None]:
    if grammatical_languages is None:
        grammatical_languages = GRAMMATICAL_GENDER
    if isinstance(grammatical_languages, Mapping):
        return tuple(grammatical_languages["G"]), tuple(grammatical_languages["N"])
    return tuple(grammatical_languages), None


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
    if _is_empty(jsd):
        return _no_data(title, "metrics_jsd table is empty", _GG_KEYS)
    _require(jsd, ["model", "language", "jsd"], "metrics_jsd")
    sub, comparison, why = _pick(jsd, "comparison", comparison, "comparison")
    if why:
        return _no_data(title, why, _GG_KEYS)
    g_langs, n_langs = _gg_groups(grammatical_languages)
    sub = sub.dropna(subset=["jsd"])
    group = np.where(
        sub["language"].isin(g_langs),
        "G",
        np.where(sub["language"].isin(n_langs) if n_langs is not None else ~sub["language"].isin(g_langs), "N", ""),
    )
    sub = sub.assign(group=group)
    ungrouped = sorted(sub.loc[sub["group"] == "", "language"].unique(), key=str)
    grouped = sub[sub["group"] != ""]
    if grouped.empty:
        return _no_data(title, "no JSD values" if sub.empty else "no language in either group", _GG_KEYS)
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
    fig = _figure(max(5.5, 1.6 + 0.75 * len(columns)) + 2.6, 4.6)
    ax = fig.add_subplot()
    colors = {"G": colormaps["tab10"](0), "N": colormaps["tab10"](1)}
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
    ax.set_xticks(
        range(len(columns)),
        [_short(c, 20) for c in columns],
        rotation=30 if len(columns) > 4 else 0,
        ha="right" if len(columns) > 4 else "center",
        fontsize=SMALL,
    )
    ax.set_xlim(-0.6, len(columns) - 0.4)
    ax.set_ylabel("Jensen–Shannon divergence (nats)", fontsize=LABEL)
    ax.set_xlabel("model", fontsize=LABEL)
    _ticks(ax)
    g_present = [l for l in _lang_order(grouped.loc[grouped["group"] == "G", "language"])]
    n_present = [l for l in _lang_order(grouped.loc[grouped["group"] == "N", "language"])]
    handles = [Patch(facecolor=(*colors[g][:3], 0.35), edgecolor=colors[g]) for g in ("G", "N")]
    labels = [
        f"G: grammatical gender ({', '.join(g_present) or 'none'})",
        f"N: no grammatical gender ({', '.join(n_present) or 'none'})",
    ]
    _legend(ax, handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1)
    note = f"; not grouped: {', '.join(map(str, ungrouped))}" if ungrouped else ""
    _title(ax, f"{title} (comparison: {comparison}; one point per language{note})", fig.get_figwidth() - 0.6)
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


_LO_KEYS = ("model", "n_panels", "n_words", "max_abs_z", "max_abs_z_word")
_FIELD_NAMES = {"adjectives_en": "adjectives (English lemmas)", "settings": "settings"}


def distinctive_words(
    log_odds: pd.DataFrame, top: int = 10, model: str | None = None, comparisons: Sequence[str] | None = None
) -> tuple[Figure, dict]:
    """Most distinctive words (Monroe et al. log-odds z) of one ``model`` (default: the first): one
    row of panels per comparison, one column per field (adjectives, settings); in each panel the
    ``top`` words of each group (at most 25), positive z = the first group.

    stats: ``model``, ``n_panels``, ``n_words`` (bars drawn), ``max_abs_z`` and ``max_abs_z_word``
    ("word (comparison, field)")."""
    title = "Distinctive words (log-odds z with informative Dirichlet prior)"
    if _is_empty(log_odds):
        return _no_data(title, "metrics_log_odds table is empty", _LO_KEYS)
    _require(log_odds, ["comparison", "model", "field", "group", "word", "z"], "metrics_log_odds")
    if model is None:
        model = sorted(log_odds["model"].unique(), key=str)[0]
    sub = log_odds[log_odds["model"] == model]
    if comparisons is not None:
        sub = sub[sub["comparison"].isin(list(comparisons))]
    if sub.empty:
        return _no_data(title, f"no rows for model {model!r}", _LO_KEYS)
    top = max(1, min(int(top), 25))
    comps = list(pd.unique(sub["comparison"]))
    fields = _ordered(sub["field"], ("adjectives_en", "settings"))
    per_panel = (
        sub.groupby(["comparison", "field"]).apply(
            lambda p: sum(min(top, len(g)) for _, g in p.groupby("group")), include_groups=False
        )
        if len(sub)
        else pd.Series(dtype=int)
    )
    tallest = int(per_panel.max()) if len(per_panel) else top
    panel_h = 0.8 + 0.19 * tallest
    fig = _figure(4.4 * len(fields) + 0.4, panel_h * len(comps) + 0.9)
    n_words, best = 0, None
    for r, comp in enumerate(comps):
        for c, field in enumerate(fields):
            ax = fig.add_subplot(len(comps), len(fields), r * len(fields) + c + 1)
            part = sub[(sub["comparison"] == comp) & (sub["field"] == field)]
            ax.set_title(f"{comp} · {_FIELD_NAMES.get(field, field)}", fontsize=LABEL)
            if part.empty:
                message_panel(ax, "no words for this field")
                continue
            groups = list(pd.unique(part["group"]))
            colors = dict(zip(groups, _colors(max(2, len(groups)))))
            chosen = pd.concat(
                [
                    g.reindex(g["z"].abs().sort_values(ascending=False).index).head(top)
                    for _, g in part.groupby("group", sort=False)
                ]
            )
            chosen = chosen.sort_values("z")
            y = np.arange(len(chosen))
            ax.barh(y, chosen["z"], color=[colors[g] for g in chosen["group"]], height=0.75)
            ax.set_yticks(y, [_short(w, 20) for w in chosen["word"]], fontsize=SMALL)
            ax.axvline(0, color="black", lw=0.8)
            ax.set_xlabel("log-odds z (> 0: first group)", fontsize=LABEL)
            ax.set_ylim(-0.6, len(chosen) - 0.4)
            _ticks(ax)
            _legend(
                ax, [Patch(color=colors[g]) for g in groups], [str(g) for g in groups], loc="lower right", frameon=True
            )
            n_words += len(chosen)
            i = chosen["z"].abs().idxmax()
            if best is None or abs(chosen.at[i, "z"]) > abs(best[0]):
                best = (float(chosen.at[i, "z"]), f"{chosen.at[i, 'word']} ({comp}, {field})")
    upper = _suptitle(fig, f"{title}: {_short(model, 40)}, top {top} per group")
    fig.tight_layout(rect=(0, 0, 1, upper))
    stats = {
        "model": model,
        "n_panels": len(comps) * len(fields),
        "n_words": n_words,
        "max_abs_z": abs(best[0]) if best else float("nan"),
        "max_abs_z_word": best[1] if best else None,
    }
    return fig, stats


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
    if _is_empty(vsr_jsd):
        return _no_data(title, "metrics_vsr_jsd table is empty", _VJ_KEYS)
    _require(vsr_jsd, ["model", "language", "jsd", "vsr"], "metrics_vsr_jsd")
    sub, comparison, why = _pick(vsr_jsd, "comparison", comparison, "comparison")
    if why:
        return _no_data(title, why, _VJ_KEYS)
    points = sub.dropna(subset=["vsr", "jsd"])
    n_missing = len(sub) - len(points)
    if points.empty:
        return _no_data(title, f"no row has both a VSR and a JSD ({n_missing} rows)", _VJ_KEYS)
    small = _jsd_too_small(title, points, _VJ_KEYS, min_stories)
    if small is not None:
        fig, stats = small
        stats.update(
            comparison=comparison, n_points=len(points), n_models=int(points["model"].nunique()), n_missing=n_missing
        )
        return fig, stats
    models = sorted(points["model"].unique(), key=str)
    colors = dict(zip(models, _colors(len(models))))
    markers = {m: MARKERS[i % len(MARKERS)] for i, m in enumerate(models)}
    fig = _figure(7.0 + (2.6 if len(models) > 12 else 1.6), 5.0)
    ax = fig.add_subplot()
    label_idx = (
        set(points.index)
        if len(points) <= max_labels
        else (set(points["jsd"].nlargest(15).index) | set(points["vsr"].nsmallest(10).index))
    )
    for model in models:
        part = points[points["model"] == model]
        x, y = part["vsr"].to_numpy(float) * 100, part["jsd"].to_numpy(float)
        if {"ci_low", "ci_high"} <= set(part.columns):
            lo, hi = part["ci_low"].to_numpy(float), part["ci_high"].to_numpy(float)
            ok = np.isfinite(lo) & np.isfinite(hi)
            ax.errorbar(
                x[ok],
                y[ok],
                yerr=[np.clip(y[ok] - lo[ok], 0, None), np.clip(hi[ok] - y[ok], 0, None)],
                fmt="none",
                ecolor=colors[model],
                alpha=0.5,
                lw=0.8,
            )
        ax.scatter(
            x,
            y,
            color=colors[model],
            marker=markers[model],
            s=30,
            edgecolors="black",
            linewidths=0.3,
            label=_short(model, 26),
            zorder=3,
        )
        for idx, xi, yi in zip(part.index, x, y):
            if idx in label_idx:
                ax.annotate(
                    str(part.at[idx, "language"]), (xi, yi), xytext=(3, 3), textcoords="offset points", fontsize=SMALL
                )
    ax.set_xlabel("valid-story rate (%)", fontsize=LABEL)
    ax.set_ylabel("Jensen–Shannon divergence (nats)", fontsize=LABEL)
    x_min = points["vsr"].min() * 100
    ax.set_xlim(max(0.0, x_min - 8), 103)
    _title(
        ax,
        f"{title} (comparison: {comparison}; one point per model × language, bars = 95% CI)",
        fig.get_figwidth() - 0.6,
    )
    _ticks(ax)
    _legend(
        ax,
        *ax.get_legend_handles_labels(),
        title="model",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        ncol=1 if len(models) <= 12 else 2,
    )
    fig.tight_layout()
    worst = points.loc[points["jsd"].idxmax()]
    stats = {
        "comparison": comparison,
        "n_points": int(len(points)),
        "n_models": len(models),
        "n_missing": int(n_missing),
        "mean_vsr": float(points["vsr"].mean()),
        "mean_jsd": float(points["jsd"].mean()),
        "max_jsd": float(worst["jsd"]),
        "max_jsd_cell": f"{worst['model']} / {worst['language']}",
    }
    return fig, stats


# --- 10. stereotype and balance (Feng et al.) --------------------------------------------------

_BS_KEYS = (
    "denominator",
    "n_points",
    "n_languages",
    "n_tasks",
    "n_ellipses",
    "mean_m_s",
    "mean_m_b",
    "max_m_s",
    "max_m_s_cell",
)


def _cov_ellipse(x: np.ndarray, y: np.ndarray, **kwargs) -> Ellipse | None:
    """The 1-sd ellipse of the points' covariance (axes = 2 sqrt(eigenvalues)); None below 3 points."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3:
        return None
    cov = np.cov(x, y)
    if not np.all(np.isfinite(cov)):
        return None
    values, vectors = np.linalg.eigh(cov)
    values = np.clip(values, 0, None)
    angle = math.degrees(math.atan2(vectors[1, 1], vectors[0, 1]))
    return Ellipse((x.mean(), y.mean()), 2 * math.sqrt(values[1]), 2 * math.sqrt(values[0]), angle=angle, **kwargs)


def balance_stereotype(
    aggregates: pd.DataFrame, denominator: str = "all outputs", ncols: int = 3
) -> tuple[Figure, dict]:
    """M_b (x, balance = P_f − P_m) vs M_s (y, stereotype) per language panel; one point per model x
    task, colour and marker = task, shaded 1-sd covariance ellipse per task (>= 3 models).

    stats: ``denominator``, ``n_points``, ``n_languages``, ``n_tasks``, ``n_ellipses``, ``mean_m_s``,
    ``mean_m_b``, ``max_m_s`` and ``max_m_s_cell`` ("model / language / task")."""
    title = "Balance and stereotype scores by language"
    if _is_empty(aggregates):
        return _no_data(title, "metrics_aggregates table is empty (no parsed occupations outputs)", _BS_KEYS)
    _require(aggregates, ["model", "language", "task", "m_s", "m_b"], "metrics_aggregates")
    sub = aggregates[aggregates["denominator"] == denominator] if "denominator" in aggregates.columns else aggregates
    sub = sub.dropna(subset=["m_s", "m_b"])
    if sub.empty:
        return _no_data(title, f"no rows with denominator = {denominator!r} and both scores", _BS_KEYS)
    languages = _lang_order(sub["language"])
    tasks = _ordered(sub["task"], GENRE_ORDER)
    colors = dict(zip(tasks, _colors(len(tasks))))
    markers = {t: MARKERS[i % len(MARKERS)] for i, t in enumerate(tasks)}
    fig, axes, _, _ = _grid(len(languages), ncols, 3.6, 3.5, extra_h=1.0)
    n_ellipses = 0
    for ax, lang in zip(axes, languages):
        part = sub[sub["language"] == lang]
        ax.axhline(0, color="#888888", lw=0.7)
        ax.axvline(0, color="#888888", lw=0.7)
        for task in tasks:
            t = part[part["task"] == task]
            if t.empty:
                continue
            ellipse = _cov_ellipse(
                t["m_b"].to_numpy(float),
                t["m_s"].to_numpy(float),
                facecolor=(*colors[task][:3], 0.18),
                edgecolor=colors[task],
                lw=1.0,
            )
            if ellipse is not None:
                ax.add_patch(ellipse)
                n_ellipses += 1
            ax.scatter(
                t["m_b"],
                t["m_s"],
                color=colors[task],
                marker=markers[task],
                s=28,
                edgecolors="black",
                linewidths=0.3,
                zorder=3,
            )
        ax.set_xlim(-1.05, 1.05)
        ax.set_ylim(-1.05, 1.05)
        ax.set_aspect("equal")
        ax.set_xlabel("balance M_b = P_f − P_m", fontsize=LABEL)
        ax.set_ylabel("stereotype M_s", fontsize=LABEL)
        ax.set_title(f"{lang} ({LANGUAGES[lang]})" if lang in LANGUAGES else str(lang), fontsize=LABEL)
        _ticks(ax)
    handles: list[Artist] = [
        Line2D([], [], marker=markers[t], ls="", color=colors[t], markeredgecolor="black") for t in tasks
    ]
    handles.append(Patch(facecolor=(0.5, 0.5, 0.5, 0.18), edgecolor="#555555"))
    _legend(
        fig,
        handles,
        [str(t) for t in tasks] + ["1-sd ellipse over models (≥ 3)"],
        title="task",
        loc="lower center",
        ncol=len(handles),
        bbox_to_anchor=(0.5, 0.0),
    )
    top = _suptitle(fig, f"{title} (one point per model × task; denominator: {denominator})")
    fig.tight_layout(rect=(0, 0.55 / fig.get_figheight(), 1, top))
    best = sub.loc[sub["m_s"].idxmax()]
    stats = {
        "denominator": denominator,
        "n_points": int(len(sub)),
        "n_languages": len(languages),
        "n_tasks": len(tasks),
        "n_ellipses": n_ellipses,
        "mean_m_s": float(sub["m_s"].mean()),
        "mean_m_b": float(sub["m_b"].mean()),
        "max_m_s": float(best["m_s"]),
        "max_m_s_cell": f"{best['model']} / {best['language']} / {best['task']}",
    }
    return fig, stats


_ANOVA_KEYS = ("n_rows", "n_significant", "max_partial_omega_sq", "max_partial_omega_sq_term")


def _p(value: Any) -> str:
    if _isna(value):
        return "–"
    return "< .001" if value < 0.001 else f"{value:.3f}".lstrip("0") if value < 1 else f"{value:.2f}"


def anova_table(anova: pd.DataFrame, alpha: float = 0.05) -> tuple[Figure, dict]:
    """A table of the Type-I ANOVA rows (denominator, subset, outcome, term, df, F, p, BH-adjusted p,
    partial ω²), rows with adjusted p < ``alpha`` shaded; notes of the specifications below.

    stats: ``n_rows``, ``n_significant`` (adjusted p < alpha), ``max_partial_omega_sq`` and
    ``max_partial_omega_sq_term`` ("outcome: term (subset; denominator)")."""
    title = "Type-I ANOVA of the stereotype (m_s) and balance (m_b) aggregates"
    if _is_empty(anova):
        return _no_data(title, "metrics_anova table is empty (too few models, languages or tasks to test)", _ANOVA_KEYS)
    _require(anova, ["outcome", "term", "df", "F", "p_value", "p_adjusted", "partial_omega_sq"], "metrics_anova")
    data = anova.copy()
    for column in ("denominator", "subset"):
        if column not in data.columns:
            data[column] = "–"
    data = data.sort_values(["denominator", "subset", "outcome"], kind="stable").reset_index(drop=True)
    rows = []
    for _, r in data.iterrows():
        df = "–" if _isna(r["df"]) else f"{int(r['df'])}"
        if "df_resid" in data.columns and not _isna(r["df_resid"]) and df != "–":
            df += f", {int(r['df_resid'])}"
        rows.append(
            [
                str(r["denominator"]),
                str(r["subset"]),
                str(r["outcome"]),
                str(r["term"]),
                df,
                "–" if _isna(r["F"]) else f"{r['F']:.2f}",
                _p(r["p_value"]),
                _p(r["p_adjusted"]),
                "–" if _isna(r["partial_omega_sq"]) else f"{r['partial_omega_sq']:.3f}",
            ]
        )
    notes = []
    if "note" in data.columns:
        notes = [n for n in pd.unique(data["note"].dropna()) if str(n).strip()]
    header = ["denominator", "subset", "outcome", "term", "df (effect, resid.)", "F", "p", "p (BH)", "partial ω²"]
    fig = _figure(10.0, 0.8 + 0.26 * (len(rows) + 1) + 0.25 * len(notes))
    ax = fig.add_subplot()
    ax.axis("off")
    significant = (pd.to_numeric(data["p_adjusted"], errors="coerce") < alpha).to_numpy()
    _table(ax, rows, header, [0.14, 0.13, 0.08, 0.14, 0.13, 0.08, 0.08, 0.08, 0.1], significant, "#DCEAF7")
    for i, note in enumerate(notes):
        ax.text(
            0.0,
            -0.02 - 0.25 * i / max(1.0, fig.get_figheight() - 1.0),
            f"note: {_short(note, 150)}",
            transform=ax.transAxes,
            fontsize=SMALL,
            va="top",
        )
    _title(ax, f"{title}; shaded: BH-adjusted p < {alpha}", fig.get_figwidth() - 0.6)
    fig.tight_layout()
    omega = pd.to_numeric(data["partial_omega_sq"], errors="coerce")
    if omega.notna().any():
        best = data.loc[omega.idxmax()]
        term = f"{best['outcome']}: {best['term']} ({best['subset']}; {best['denominator']})"
    else:
        term = None
    stats = {
        "n_rows": int(len(data)),
        "n_significant": int(significant.sum()),
        "max_partial_omega_sq": float(omega.max()) if omega.notna().any() else float("nan"),
        "max_partial_omega_sq_term": term,
    }
    return fig, stats
