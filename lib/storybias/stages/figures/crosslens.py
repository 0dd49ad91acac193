"""Figure of stage 06's cross-lens tables (issue #30): the three studies' headline measures per model x
language side by side, standardised per measure, with the cells where a lens could not be computed
marked, and the pair plots of the most and the least concordant pair of measures.

The standardisation is for display only (each measure's z-score over the cells that have it, so that a
share and a count share one colour scale); the cell's own value is written in it. Every number comes
from ``crosslens.parquet`` and ``crosslens_agreement.parquet`` (``storybias.stages.probes.crosslens``,
``storybias.stats.concordance``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from storybias.stages.figures.style import (
    LABEL,
    SMALL,
    _colors,
    _figure,
    _is_empty,
    _isna,
    _lang_order,
    _legend,
    _no_data,
    _require,
    _short,
    _ticks,
    _title,
    message_panel,
)

# The cross-lens measures in the table's order, with the lens and the label a reader sees.
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
_KEYS = (
    "n_cells",
    "n_measures",
    "n_missing",
    "n_pairs_assessed",
    "most_concordant",
    "r_most",
    "n_most",
    "least_concordant",
    "r_least",
    "n_least",
)


def standardise(values: pd.DataFrame) -> pd.DataFrame:
    """Each column's z-score over its finite values (0 where the column is constant; NaN stays NaN)."""
    mean, sd = values.mean(), values.std(ddof=0)
    return (values - mean) / sd.where(sd > 0, np.inf)


def concordance_extremes(agreement: pd.DataFrame) -> tuple[pd.Series | None, pd.Series | None]:
    """The most concordant pair (highest r) and the least (|r| closest to 0, another pair) among the
    assessed ones; without any assessed pair, the two pairs with the most cells in common (no r)."""
    if _is_empty(agreement):
        return None, None
    assessed = agreement[np.isfinite(agreement["r"].astype(float))]
    if len(assessed):
        most = assessed.loc[assessed["r"].astype(float).idxmax()]
        rest = assessed.drop(index=most.name)
        least = rest.loc[rest["r"].astype(float).abs().idxmin()] if len(rest) else None
        return most, least
    by_cells = agreement.sort_values("n_cells", ascending=False, kind="stable")
    by_cells = by_cells[by_cells["n_cells"] > 0]
    first = by_cells.iloc[0] if len(by_cells) else None
    second = by_cells.iloc[1] if len(by_cells) > 1 else None
    return first, second


def _pair_title(pair: pd.Series, kind: str) -> str:
    a, b = (MEASURE_LABELS.get(pair[m], pair[m]).replace("\n", " ") for m in ("measure_a", "measure_b"))
    if _isna(pair["r"]):
        return f"{a} vs {b}: not assessed ({int(pair['n_cells'])} cells in common)"
    symbol = "ρ" if pair["method"] == "spearman" else "τ"
    return (
        f"{kind}: {a} vs {b}\n{symbol} = {pair['r']:.2f} [{pair['ci_low']:.2f}, {pair['ci_high']:.2f}], "
        f"p = {pair['p_permutation']:.3f}, n = {int(pair['n_cells'])}"
    )


def _pair_panel(ax: Axes, table: pd.DataFrame, pair: pd.Series | None, kind: str, width_in: float) -> None:
    """One pair of measures over the cells that have both, with their intervals, coloured by language."""
    if pair is None:
        message_panel(ax, f"no {kind.lower()} pair: no two measures share a cell", width_in)
        return
    a, b = pair["measure_a"], pair["measure_b"]
    both = table[np.isfinite(table[a].astype(float)) & np.isfinite(table[b].astype(float))]
    languages = _lang_order(both["language"])
    colors = dict(zip(languages, _colors(len(languages))))
    for language in languages:
        sub = both[both["language"] == language]
        x, y = sub[a].astype(float), sub[b].astype(float)
        ax.errorbar(
            x,
            y,
            xerr=[(x - sub[f"{a}_low"]).clip(lower=0), (sub[f"{a}_high"] - x).clip(lower=0)],
            yerr=[(y - sub[f"{b}_low"]).clip(lower=0), (sub[f"{b}_high"] - y).clip(lower=0)],
            fmt="o",
            ms=5,
            color=colors[language],
            ecolor=colors[language],
            elinewidth=0.8,
            alpha=0.9,
            label=language,
        )
    ax.set_xlabel(MEASURE_LABELS.get(a, a).replace("\n", " "), fontsize=LABEL)
    ax.set_ylabel(MEASURE_LABELS.get(b, b).replace("\n", " "), fontsize=LABEL)
    _ticks(ax)
    _title(ax, _pair_title(pair, kind), width_in, size=SMALL + 1)
    if languages:
        handles = [Line2D([], [], marker="o", ls="", color=colors[lang]) for lang in languages]
        _legend(ax, handles, languages, title="language", loc="best")


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
    labels = [f"{_short(m, 20)} · {lang}" for m, lang in zip(table["model"], table["language"])]
    ax.set_yticks(range(len(table)), labels, fontsize=SMALL)
    ax.tick_params(axis="x", labelrotation=0)
    colorbar = ax.figure.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    colorbar.set_label("z-score within measure (display only)", fontsize=SMALL)
    colorbar.ax.tick_params(labelsize=SMALL)


def crosslens_heatmap(crosslens: pd.DataFrame, agreement: pd.DataFrame) -> tuple[Figure, dict[str, Any]]:
    """Left: cells (model · language) x measures, standardised per measure, '×' where a lens could not be
    computed (``reason_<measure>`` in crosslens.parquet says why). Right: the most and the least
    concordant pair of measures (``crosslens_agreement``), one point per cell with both, with intervals.

    stats: ``n_cells``, ``n_measures``, ``n_missing`` (cell x measure entries without a value),
    ``n_pairs_assessed``, ``most_concordant`` / ``least_concordant`` ("a vs b"), ``r_most`` / ``r_least``
    and ``n_most`` / ``n_least`` (cells in common; r NaN when the pair was not assessed)."""
    title = "The three lenses side by side"
    if _is_empty(crosslens):
        return _no_data(title, "no cross-lens table (stage 06 found no model x language cell)", _KEYS)
    measures = [m for m in MEASURE_LABELS if m in crosslens.columns]
    _require(crosslens, ["model", "language", *measures], "crosslens")
    table = crosslens.sort_values(["model", "language"]).reset_index(drop=True)
    shown = table.head(MAX_ROWS)
    width, height = 13.0, max(4.2, 1.8 + 0.28 * len(shown))
    fig = _figure(width, height)
    grid = fig.add_gridspec(2, 2, width_ratios=[1.7, 1.0], hspace=0.75, wspace=0.3)
    ax_heat = fig.add_subplot(grid[:, 0])
    _heatmap_panel(ax_heat, shown, measures)
    cut = f" (first {MAX_ROWS} of {len(table)} cells)" if len(table) > MAX_ROWS else ""
    _title(ax_heat, f"{title}: each measure per model · language{cut}; × = not computable", 7.0)
    most, least = concordance_extremes(agreement)
    _pair_panel(fig.add_subplot(grid[0, 1]), table, most, "Most concordant", 4.4)
    _pair_panel(fig.add_subplot(grid[1, 1]), table, least, "Least concordant", 4.4)
    assessed = 0 if _is_empty(agreement) else int(np.isfinite(agreement["r"].astype(float)).sum())
    stats: dict[str, Any] = {
        "n_cells": len(table),
        "n_measures": len(measures),
        "n_missing": int(table[measures].isna().to_numpy().sum()),
        "n_pairs_assessed": assessed,
    }
    for name, pair in (("most", most), ("least", least)):
        stats[f"{name}_concordant"] = f"{pair['measure_a']} vs {pair['measure_b']}" if pair is not None else "none"
        stats[f"r_{name}"] = float(pair["r"]) if pair is not None else float("nan")
        stats[f"n_{name}"] = int(pair["n_cells"]) if pair is not None else 0
    return fig, stats
