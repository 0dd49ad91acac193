"""Figure of stage 07's cross-lens tables (issue #30; issue #41 item 7): the three studies' headline
measures per model x language side by side, standardised per measure, with the cells where a lens could
not be computed marked; every pair of measures ranked by its within-language rank correlation, the pairs
across lenses apart from the pairs within one lens, with Benjamini-Hochberg-adjusted p-values; and the
centred ranks of the most and the least concordant pair across lenses.

The standardisation is for display only (each measure's z-score over the cells that have it, so that a
share and a count share one colour scale); the cell's own value is written in it. Every number comes
from ``crosslens.parquet`` and ``crosslens_agreement.parquet`` (``storybias.stages.crosslens.measures``,
``storybias.stats.concordance``); the centred ranks of the pair panels are those the statistic
correlates (``concordance.centred_rank_cells``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import blended_transform_factory

from storybias.stages.figures.style import (
    LABEL,
    MARKERS,
    OTHER_GREY,
    SMALL,
    add_legend,
    category_colors,
    is_empty,
    is_missing,
    language_order,
    message_panel,
    new_figure,
    no_data_figure,
    panel_title,
    require_columns,
    shorten,
    tick_style,
)
from storybias.stats.concordance import ACROSS, ALPHA, WITHIN, centred_rank_cells

# The label a reader sees for each of the cross-lens measures (display only: the figure draws every measure
# the table holds, in its order, and labels a measure not listed here by its name).
MEASURE_LABELS: dict[str, str] = {
    "assoc_per_1000": "StereoTales\nassoc./1k",
    "share_harmful": "StereoTales\nharmful",
    "jsd": "BiasedTales\nJSD",
    "max_abs_sc": "BiasedTales\nmax |S_C|",
    "m_s": "Feng\nM_s",
    "m_b": "Feng\nM_b",
    "auc_full": "Feng\nprobe AUC",
    "delta_auc": "Feng\nΔAUC",
}
MAX_ROWS = 60  # more cells than this: the first ones by model and language are drawn, and the title says so
AGREEMENT_NEEDS = ["measure_a", "measure_b", "kind", "n_cells", "r_within_language", "p_permutation", "p_bh"]
KIND_COLOR = {ACROSS: "#0072B2", WITHIN: OTHER_GREY}
_KEYS = (
    "n_cells",
    "n_measures",
    "n_missing",
    "n_pairs_assessed",
    "n_pairs_across",
    "n_agreements",
    "n_disagreements",
    "most_concordant",
    "r_most",
    "p_bh_most",
    "n_most",
    "least_concordant",
    "r_least",
    "p_bh_least",
    "n_least",
)


def standardise(values: pd.DataFrame) -> pd.DataFrame:
    """Each column's z-score over its finite values (0 where the column is constant; NaN stays NaN)."""
    mean, sd = values.mean(), values.std(ddof=0)
    return (values - mean) / sd.where(sd > 0, np.inf)


def table_measures(crosslens: pd.DataFrame) -> list[str]:
    """The measures of a cross-lens table, in its column order: each has a ``reason_<measure>`` column
    (the table's schema comes from the measures' registrations, storybias.stages.crosslens.registry)."""
    return [c.removeprefix("reason_") for c in crosslens.columns if c.startswith("reason_")]


def _label(measure: str) -> str:
    return MEASURE_LABELS.get(measure, measure).replace("\n", " ")


def ranked_pairs(agreement: pd.DataFrame) -> pd.DataFrame:
    """The pairs in the order the figure lists them: across lenses first, then within one lens; in each,
    from the highest ``r_within_language`` to the lowest, pairs without one last."""
    order = agreement.assign(
        _within=(agreement["kind"] == WITHIN).astype(int),
        _missing=agreement["r_within_language"].isna().astype(int),
    )
    order = order.sort_values(
        ["_within", "_missing", "r_within_language"], ascending=[True, True, False], kind="stable"
    )
    return order.drop(columns=["_within", "_missing"])


def concordance_extremes(agreement: pd.DataFrame) -> tuple[pd.Series | None, pd.Series | None]:
    """The most concordant pair (highest ``r_within_language``) and the least (closest to 0, another pair)
    among the pairs across lenses with a statistic (all pairs when none is across lenses); without any
    statistic, the two pairs with the most cells in common."""
    if is_empty(agreement):
        return None, None
    finite = agreement[np.isfinite(agreement["r_within_language"].astype(float))]
    across = finite[finite["kind"] == ACROSS]
    assessed = across if len(across) else finite
    if len(assessed):
        r = assessed["r_within_language"].astype(float)
        most = assessed.loc[r.idxmax()]
        rest = r.drop(index=most.name)
        least = assessed.loc[rest.abs().idxmin()] if len(rest) else None
        return most, least
    by_cells = agreement.sort_values("n_cells", ascending=False, kind="stable")
    by_cells = by_cells[by_cells["n_cells"] > 0]
    first = by_cells.iloc[0] if len(by_cells) else None
    second = by_cells.iloc[1] if len(by_cells) > 1 else None
    return first, second


def _p_text(pair: pd.Series) -> str:
    """'BH p = 0.012' or why the pair was not tested."""
    if is_missing(pair["p_bh"]):
        reason = pair.get("verdict")
        return "not tested" if is_missing(reason) else str(reason).replace("not assessed: ", "not tested: ")
    return f"BH-adjusted p = {pair['p_bh']:.3f}"


def _pair_title(pair: pd.Series, heading: str) -> str:
    a, b = _label(pair["measure_a"]), _label(pair["measure_b"])
    if is_missing(pair["r_within_language"]):
        return f"{a} vs {b}: not assessed ({int(pair['n_cells'])} cells in common)"
    kind = "" if pair["kind"] == ACROSS else " (within one lens)"
    return (
        f"{heading}{kind}: {a} vs {b}\nr_within_language = {pair['r_within_language']:.2f}, "
        f"{_p_text(pair)}, n = {int(pair['n_cells'])} cells"
    )


def _pair_panel(ax: Axes, table: pd.DataFrame, pair: pd.Series | None, heading: str, width_in: float) -> None:
    """One pair of measures: each cell's rank within its language minus the language's mean rank, one
    measure against the other, coloured by language (the points r_within_language correlates)."""
    if pair is None:
        message_panel(ax, f"no {heading.lower()} pair: no two measures share a cell", width_in)
        return
    a, b = pair["measure_a"], pair["measure_b"]
    points = centred_rank_cells(table, a, b)
    languages = language_order(points["language"])
    colors = dict(zip(languages, category_colors(len(languages))))
    offsets = np.linspace(-0.12, 0.12, len(languages)) if len(languages) > 1 else [0.0]
    for k, language in enumerate(languages):  # languages offset a little: the same ranks recur in each
        sub = points[points["language"] == language]
        ax.scatter(
            sub["rank_a"] + offsets[k],
            sub["rank_b"] + offsets[k],
            s=26,
            marker=MARKERS[k % len(MARKERS)],
            color=colors[language],
            alpha=0.85,
        )
    ax.axhline(0, color="#DDDDDD", lw=0.8, zorder=0)
    ax.axvline(0, color="#DDDDDD", lw=0.8, zorder=0)
    ax.set_xlabel(f"{_label(a)}: rank in its language, centred", fontsize=LABEL)
    ax.set_ylabel(f"{_label(b)}: rank, centred", fontsize=LABEL)
    tick_style(ax)
    panel_title(ax, _pair_title(pair, heading), width_in, size=SMALL + 1)
    if languages:
        handles = [
            Line2D([], [], marker=MARKERS[k % len(MARKERS)], ls="", color=colors[lang])
            for k, lang in enumerate(languages)
        ]
        add_legend(ax, handles, languages, title="language", loc="best")


def _ranking_panel(ax: Axes, agreement: pd.DataFrame, width_in: float) -> None:
    """Every pair's r_within_language, pairs across lenses above those within one lens (a consistency
    check of one lens, never agreement between lenses); filled where the BH-adjusted p < ALPHA."""
    if is_empty(agreement):
        message_panel(ax, "no pair of measures", width_in)
        return
    ranked = ranked_pairs(agreement).reset_index(drop=True)
    n_across = int((ranked["kind"] == ACROSS).sum())
    # one blank row between the two kinds, for the within-lens heading
    rows = [i if i < n_across else i + 1 for i in range(len(ranked))]
    right = blended_transform_factory(ax.transAxes, ax.transData)
    for y, pair in zip(rows, ranked.itertuples(index=False)):
        color = KIND_COLOR.get(pair.kind, OTHER_GREY)
        if is_missing(pair.r_within_language):
            ax.text(0, y, "not assessed", ha="center", va="center", fontsize=SMALL - 1, color=OTHER_GREY)
            continue
        if is_missing(pair.p_bh):  # a statistic without a test (too few models): a grey cross
            ax.plot([pair.r_within_language], [y], "x", ms=6, color=OTHER_GREY, mew=1.2)
        else:
            fill = color if pair.p_bh < ALPHA else "white"
            ax.plot([pair.r_within_language], [y], "o", ms=6, color=color, mfc=fill, mew=1.2)
        p_bh = "untested" if is_missing(pair.p_bh) else f"{pair.p_bh:.3f}"
        ax.text(1.02, y, p_bh, transform=right, ha="left", va="center", fontsize=SMALL - 1, clip_on=False)
    if n_across < len(ranked):
        ax.text(-0.98, n_across, "within one lens (consistency checks):", ha="left", va="center",
                fontsize=SMALL, style="italic", color=OTHER_GREY)  # fmt: skip
    labels = [f"{_label(a)} – {_label(b)}" for a, b in zip(ranked["measure_a"], ranked["measure_b"])]
    ax.set_yticks(rows, labels, fontsize=SMALL - 1)
    ax.set_ylim(max(rows) + 0.7, -0.7)
    ax.set_xlim(-1.05, 1.05)
    ax.axvline(0, color="#BBBBBB", lw=0.8, zorder=0)
    ax.text(1.02, -0.9, "BH p", transform=right, ha="left", va="bottom", fontsize=SMALL - 1, clip_on=False)
    ax.set_xlabel("r_within_language (ranks centred within each language)", fontsize=LABEL)
    tick_style(ax)
    handles = [
        Line2D([], [], marker="o", ls="", color=KIND_COLOR[ACROSS]),
        Line2D([], [], marker="o", ls="", color=KIND_COLOR[ACROSS], mfc="white"),
        Line2D([], [], marker="x", ls="", color=OTHER_GREY),
    ]
    names = [f"BH-adjusted p < {ALPHA}", "not significant", "not tested (too few models)"]
    # below the x-axis label: inside the panel it covered the last pairs' rows
    add_legend(ax, handles, names, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=3)
    panel_title(
        ax, "Pairs of measures, ranked (whole-model relabelling test, BH across lenses)", width_in, size=SMALL + 1
    )


def _heatmap_panel(ax: Axes, table: pd.DataFrame, measures: list[str]) -> None:
    """Cells x measures, coloured by the per-measure z-score, the value written in; '×' where the lens
    could not be computed."""
    values = table[measures].astype(float)
    z = standardise(values).to_numpy()
    # white, not the house grey, for a missing entry: coolwarm's centre (a z of 0) is grey already
    cmap = colormaps["coolwarm"].with_extremes(bad="white")
    image = ax.imshow(np.ma.masked_invalid(z), cmap=cmap, vmin=-2.0, vmax=2.0, aspect="auto", interpolation="nearest")
    for (i, j), value in np.ndenumerate(values.to_numpy()):
        if np.isfinite(value):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=SMALL - 1)
        else:
            ax.text(j, i, "×", ha="center", va="center", fontsize=SMALL + 1, color="#555555")
    ax.set_xticks(range(len(measures)), [MEASURE_LABELS.get(m, m) for m in measures], fontsize=SMALL - 1)
    labels = [f"{shorten(m, 20)} · {lang}" for m, lang in zip(table["model"], table["language"])]
    ax.set_yticks(range(len(table)), labels, fontsize=SMALL)
    ax.tick_params(axis="x", labelrotation=0)
    colorbar = ax.figure.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    colorbar.set_label("z-score within measure (display only)", fontsize=SMALL)
    colorbar.ax.tick_params(labelsize=SMALL)


def crosslens_heatmap(crosslens: pd.DataFrame, agreement: pd.DataFrame) -> tuple[Figure, dict[str, Any]]:
    """Left: cells (model · language) x measures, standardised per measure, '×' where a lens could not be
    computed (``reason_<measure>`` in crosslens.parquet says why). Middle: every pair of measures of
    ``crosslens_agreement`` ranked by ``r_within_language``, across lenses above within one lens, with its
    Benjamini-Hochberg-adjusted p. Right: the centred ranks of the most and the least concordant pair
    across lenses, one point per cell with both.

    stats: ``n_cells``, ``n_measures``, ``n_missing`` (cell x measure entries without a value),
    ``n_pairs_assessed`` (pairs tested), ``n_pairs_across``, ``n_agreements`` / ``n_disagreements``
    (findings across lenses), ``most_concordant`` / ``least_concordant`` ("a vs b"), ``r_most`` /
    ``r_least`` (r_within_language, NaN when not assessed), ``p_bh_most`` / ``p_bh_least`` and
    ``n_most`` / ``n_least`` (cells in common)."""
    title = "The three lenses side by side"
    if is_empty(crosslens):
        return no_data_figure(title, "no cross-lens table (stage 07 found no model x language cell)", _KEYS)
    measures = table_measures(crosslens)
    require_columns(crosslens, ["model", "language", *measures], "crosslens")
    if not is_empty(agreement):
        require_columns(agreement, AGREEMENT_NEEDS, "crosslens_agreement")
    table = crosslens.sort_values(["model", "language"]).reset_index(drop=True)
    shown = table.head(MAX_ROWS)
    n_pairs = 0 if is_empty(agreement) else len(agreement)
    width, height = 20.0, max(6.0, 1.8 + 0.28 * len(shown), 2.0 + 0.24 * (n_pairs + 1))
    fig = new_figure(width, height)
    fig.set_layout_engine("constrained", w_pad=0.08, wspace=0.04)  # room for the pairs' long labels
    grid = fig.add_gridspec(2, 3, width_ratios=[1.5, 0.9, 0.9])
    ax_heat = fig.add_subplot(grid[:, 0])
    _heatmap_panel(ax_heat, shown, measures)
    cut = f" (first {MAX_ROWS} of {len(table)} cells)" if len(table) > MAX_ROWS else ""
    panel_title(ax_heat, f"{title}: each measure per model · language{cut}; × = not computable", 6.5)
    _ranking_panel(fig.add_subplot(grid[:, 1]), agreement, 4.0)
    most, least = concordance_extremes(agreement)
    _pair_panel(fig.add_subplot(grid[0, 2]), table, most, "Most concordant", 4.0)
    _pair_panel(fig.add_subplot(grid[1, 2]), table, least, "Least concordant", 4.0)
    return fig, _stats(table, measures, agreement, most, least)


def _stats(
    table: pd.DataFrame, measures: list[str], agreement: pd.DataFrame, most: pd.Series | None, least: pd.Series | None
) -> dict[str, Any]:
    """The numbers the notebook quotes (see crosslens_heatmap)."""
    empty = is_empty(agreement)
    findings = pd.Series(dtype=str) if empty or "finding" not in agreement else agreement["finding"]
    stats: dict[str, Any] = {
        "n_cells": len(table),
        "n_measures": len(measures),
        "n_missing": int(table[measures].isna().to_numpy().sum()),
        "n_pairs_assessed": 0 if empty else int(np.isfinite(agreement["p_permutation"].astype(float)).sum()),
        "n_pairs_across": 0 if empty else int((agreement["kind"] == ACROSS).sum()),
        "n_agreements": int((findings == "agreement").sum()),
        "n_disagreements": int((findings == "disagreement").sum()),
    }
    for name, pair in (("most", most), ("least", least)):
        stats[f"{name}_concordant"] = f"{pair['measure_a']} vs {pair['measure_b']}" if pair is not None else "none"
        stats[f"r_{name}"] = float(pair["r_within_language"]) if pair is not None else float("nan")
        stats[f"p_bh_{name}"] = float(pair["p_bh"]) if pair is not None else float("nan")
        stats[f"n_{name}"] = int(pair["n_cells"]) if pair is not None else 0
    return stats
