"""Figures of stage 04's artifacts (StereoTales' associations): significant associations per model and
language, the table of shared associations, and mean lift vs models sharing coloured by harm."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import ScaledTranslation

from storybias.config.prompts import LANGUAGES
from storybias.stages.figures.style import (
    LABEL,
    SMALL,
    add_legend,
    as_bools,
    figure_title,
    is_empty,
    is_missing,
    language_order,
    message_panel,
    new_figure,
    no_data_figure,
    panel_title,
    require_columns,
    shorten,
    table_panel,
    tick_style,
)
from storybias.summaries import why_nothing_found

# --- 3-4. StereoTales associations --------------------------------------------------------------


def power_reason(power: pd.DataFrame | None) -> str | None:
    """Why stage 04 found nothing, from its power table (``storybias.summaries.why_nothing_found``)."""

    return why_nothing_found(power)


_COUNT_KEYS = ("n_significant_all", "n_significant_languages", "n_tested", "n_models", "top_model", "top_language")


def association_counts(values: pd.DataFrame, power: pd.DataFrame | None = None) -> tuple[Figure, dict]:
    """Number of significant value-level associations (adjusted p < 0.05 and lift >= 2) per model in
    the global run (scope ``all``), and per language scope (one model: its count; several: bar = mean
    per model, dots = each model, total written at the right).

    stats: ``n_significant_all`` (rows significant in scope all), ``n_significant_languages`` (rows
    significant in language scopes), ``n_tested`` (every value-level row), ``n_models``,
    ``top_model`` (most significant in scope all), ``top_language``. ``power``: stage 04's power table;
    when nothing was tested or retained, the figure quotes its reasons (``power_reason``)."""
    title = "Significant value-level associations (StereoTales two-step test)"
    if is_empty(values):
        return no_data_figure(
            title,
            power_reason(power) or "associations_values table is empty (no retained attribute pair)",
            _COUNT_KEYS,
            height=3.2 if power_reason(power) else 2.4,
        )
    require_columns(values, ["model", "scope", "significant"], "associations_values")
    data = values.assign(significant=as_bools(values["significant"]))
    models = sorted(data["model"].dropna().unique(), key=str)
    per_model = data[data["scope"] == "all"].groupby("model")["significant"].sum().reindex(models, fill_value=0)
    by_lang = data[data["scope"] != "all"]
    languages = language_order(by_lang["scope"])
    lang_model = (
        by_lang.groupby(["scope", "model"])["significant"]
        .sum()
        .unstack(fill_value=0)
        .reindex(index=languages, columns=models, fill_value=0)
    )
    n_rows = max(len(models), len(languages), 1)
    fig = new_figure(10.0, max(2.8, 1.6 + 0.24 * n_rows + (0.3 if len(models) > 1 else 0.0)))
    ax_m, ax_l = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    if (data["scope"] == "all").any():
        _counts_per_model(ax_m, models, per_model)
    else:
        message_panel(ax_m, "no global run (scope = all)")
    ax_m.set_title("all languages pooled, per model", fontsize=LABEL)
    if languages:
        _counts_per_language(fig, ax_l, lang_model, languages, len(models) > 1)
    else:
        message_panel(ax_l, "no per-language run")
    ax_l.set_title("per language scope", fontsize=LABEL)
    top = figure_title(fig, title)
    fig.tight_layout(rect=(0, 0, 1, top))
    n_all = int(per_model.sum())
    stats = {
        "n_significant_all": n_all,
        "n_significant_languages": int(by_lang["significant"].sum()),
        "n_tested": int(len(data)),
        "n_models": len(models),
        "top_model": str(per_model.idxmax()) if n_all else None,
        "top_language": str(lang_model.sum(axis=1).idxmax()) if languages and lang_model.to_numpy().sum() else None,
    }
    return fig, stats


def _counts_per_model(ax: Axes, models: list, per_model: pd.Series) -> None:
    """The left panel: one bar per model, its count written at the bar's end."""
    y = np.arange(len(models))[::-1]
    ax.barh(y, per_model.to_numpy(), color=colormaps["tab10"](0), height=0.7)
    for yi, v in zip(y, per_model.to_numpy()):
        ax.text(v, yi, f" {int(v)}", va="center", fontsize=SMALL)
    ax.set_yticks(y, [shorten(m, 24) for m in models], fontsize=SMALL)
    ax.set_xlim(0, max(1, per_model.max()) * 1.18)
    ax.set_xlabel("significant associations (count)", fontsize=LABEL)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("model", fontsize=LABEL)
    tick_style(ax)


def _counts_per_language(fig: Figure, ax: Axes, lang_model: pd.DataFrame, languages: list, several: bool) -> None:
    """The right panel: one bar per language scope. ``several`` models: bar = mean per model, dots =
    each model (one scale, seeded jitter), total written at the right; one model: its count."""
    y = np.arange(len(languages))[::-1]
    totals = lang_model.sum(axis=1).to_numpy()
    bars = lang_model.mean(axis=1).to_numpy() if several else totals
    ax.barh(y, bars, color=colormaps["tab10"](1), height=0.7, label="mean over models" if several else "count")
    right = max(1.0, float(lang_model.to_numpy().max()) if several else float(totals.max()))
    if several:
        rng = np.random.default_rng(0)
        for yi, (_, row) in zip(y, lang_model.iterrows()):
            ax.scatter(
                row.to_numpy(),
                yi + rng.uniform(-0.2, 0.2, len(row)),
                s=12,
                color="black",
                zorder=3,
                label="one model" if yi == y[0] else None,
            )
        add_legend(
            ax,
            *ax.get_legend_handles_labels(),
            loc="upper left",
            bbox_to_anchor=(0.0, 0.0),
            ncol=2,
            bbox_transform=ax.transAxes + ScaledTranslation(0, -0.5, fig.dpi_scale_trans),
            borderaxespad=0.0,
        )
    for yi, v, b in zip(y, totals, bars):
        ax.text(
            right * 1.02 if several else b,
            yi,
            f" total {int(v)}" if several else f" {int(v)}",
            va="center",
            fontsize=SMALL,
        )
    ax.set_yticks(y, [f"{s} ({LANGUAGES[s]})" if s in LANGUAGES else str(s) for s in languages], fontsize=SMALL)
    ax.set_xlim(0, right * (1.3 if several else 1.18))
    ax.set_xlabel(
        "significant associations per model (count)" if several else "significant associations (count)",
        fontsize=LABEL,
    )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("language scope", fontsize=LABEL)
    tick_style(ax)


def association_label(row: Mapping[str, Any] | pd.Series) -> str:
    """'base_attribute=base_value → compared_attribute=compared_value'."""
    return f"{row['base_attribute']}={row['base_value']} → {row['compared_attribute']}={row['compared_value']}"


_SHARED_COLUMNS = [
    "scope",
    "base_attribute",
    "base_value",
    "compared_attribute",
    "compared_value",
    "n_models",
    "mean_lift",
]
_TABLE_KEYS = ("n_associations", "n_shown", "max_mean_lift", "max_n_models", "n_rated", "n_harmful")


def _shared_scope(shared: pd.DataFrame, scope: str) -> pd.DataFrame:
    require_columns(shared, _SHARED_COLUMNS, "associations_shared")
    sub = shared[shared["scope"] == scope].copy()
    if "median_harm" not in sub.columns:
        sub["median_harm"] = np.nan
    sub["median_harm"] = pd.to_numeric(sub["median_harm"], errors="coerce")
    sub["harmful_flag"] = as_bools(sub["harmful"]) if "harmful" in sub.columns else sub["median_harm"] >= 4
    return sub.sort_values(["n_models", "mean_lift"], ascending=[False, False], kind="stable").reset_index(drop=True)


def _shared_or_no_data(
    shared: pd.DataFrame, scope: str, title: str, power: pd.DataFrame | None
) -> tuple[pd.DataFrame, tuple[Figure, dict] | None]:
    """The associations of ``scope`` (``_shared_scope``), or the figure saying why there are none: the
    empty-input guard of the two figures drawn from ``associations_shared.parquet``."""
    if is_empty(shared):
        return shared, no_data_figure(
            title,
            power_reason(power) or "associations_shared table is empty (no significant association)",
            _TABLE_KEYS,
            height=3.2 if power_reason(power) else 2.4,
        )
    sub = _shared_scope(shared, scope)
    if sub.empty:
        return sub, no_data_figure(title, f"no associations with scope = {scope!r}", _TABLE_KEYS)
    return sub, None


def _shared_stats(sub: pd.DataFrame, n_shown: int) -> dict[str, Any]:
    return {
        "n_associations": int(len(sub)),
        "n_shown": int(n_shown),
        "max_mean_lift": float(sub["mean_lift"].max()),
        "max_n_models": int(sub["n_models"].max()),
        "n_rated": int(sub["median_harm"].notna().sum()),
        "n_harmful": int(sub["harmful_flag"].sum()),
    }


def top_associations_table(
    shared: pd.DataFrame, k: int = 20, scope: str = "all", power: pd.DataFrame | None = None
) -> tuple[Figure, dict]:
    """A table of the top ``k`` associations of ``scope`` (most models sharing, then highest mean
    lift): the association, mean lift, number of models sharing it, median harm (1-5; '–' unrated).

    stats: ``n_associations`` (in scope), ``n_shown``, ``max_mean_lift``, ``max_n_models``,
    ``n_rated``, ``n_harmful`` (median harm >= 4). ``power``: as :func:`association_counts`."""
    title = f"Top associations shared across models (scope: {scope})"
    sub, empty = _shared_or_no_data(shared, scope, title, power)
    if empty is not None:
        return empty
    top = sub.head(max(1, int(k)))
    rows = []
    for i, r in top.iterrows():
        harm = (
            "–"
            if is_missing(r["median_harm"])
            else f"{r['median_harm']:.1f}" + (" (harmful)" if r["harmful_flag"] else "")
        )
        rows.append(
            [str(i + 1), shorten(association_label(r), 92), f"{r['mean_lift']:.2f}", str(int(r["n_models"])), harm]
        )
    header = ["#", "association (base → compared)", "mean lift", "models sharing", "median harm (1–5)"]
    fig = new_figure(10.0, 1.0 + 0.27 * (len(rows) + 1))
    ax = fig.add_subplot()
    ax.axis("off")
    table = table_panel(ax, rows, header, [0.04, 0.58, 0.1, 0.12, 0.16], top["harmful_flag"].tolist(), "#FBE3EF")
    for (r, c), cell in table.get_celld().items():
        if c in (2, 3) and r > 0:
            cell.get_text().set_horizontalalignment("right")
    panel_title(
        ax,
        f"{title}: {len(rows)} of {len(sub)}, sorted by models sharing then mean lift; shaded = harmful (median ≥ 4)",
        fig.get_figwidth() - 0.6,
    )
    fig.tight_layout()
    return fig, _shared_stats(sub, len(rows))


def _lift_points(
    fig: Figure, ax: Axes, x: np.ndarray, y: np.ndarray, rated: np.ndarray, harm: pd.Series
) -> tuple[list[Artist], list[str]]:
    """The unrated points (open grey circles) and the rated ones (coloured by median harm, with its
    colour bar); returns their legend handles and labels."""
    handles: list[Artist] = []
    labels: list[str] = []
    if (~rated).any():
        h = ax.scatter(x[~rated], y[~rated], s=22, facecolors="none", edgecolors="#888888", linewidths=0.8)
        handles.append(h)
        labels.append("unrated")
    if rated.any():
        points = ax.scatter(
            x[rated],
            y[rated],
            s=26,
            c=harm.loc[rated],
            cmap="viridis",
            vmin=1,
            vmax=5,
            edgecolors="black",
            linewidths=0.3,
        )
        bar = fig.colorbar(points, ax=ax, pad=0.02)
        bar.set_label("median harm rating (1–5)", fontsize=LABEL)
        bar.ax.tick_params(labelsize=SMALL)
        handles.append(Line2D([], [], marker="o", ls="", color=colormaps["viridis"](0.6), markeredgecolor="black"))
        labels.append("rated (colour = median harm)")
    return handles, labels


def lift_share_plot(
    shared: pd.DataFrame, scope: str = "all", label_top: int = 5, power: pd.DataFrame | None = None
) -> tuple[Figure, dict]:
    """Scatter of mean lift (y; log scale when it spans more than 8x) vs number of models sharing (x,
    jittered), one point per association of ``scope``, coloured by median harm (viridis, 1-5); unrated
    ones as open grey circles; the ``label_top`` (at most 10) first of the table order (most shared,
    then highest lift) numbered on the plot and named below it.

    stats: as :func:`top_associations_table` (``n_shown`` = points drawn). ``power``: as :func:`association_counts`."""
    title = f"Mean lift vs models sharing (scope: {scope})"
    sub, empty = _shared_or_no_data(shared, scope, title, power)
    if empty is not None:
        return empty
    n_label = max(0, min(int(label_top), 10, len(sub)))
    fig = new_figure(8.0, 4.9 + 0.3 + 0.17 * n_label)
    gs = fig.add_gridspec(2, 1, height_ratios=[4.6, 0.3 + 0.17 * n_label])
    ax = fig.add_subplot(gs[0])
    rng = np.random.default_rng(0)
    x = sub["n_models"].to_numpy(float) + rng.uniform(-0.18, 0.18, len(sub))
    y = sub["mean_lift"].to_numpy(float)
    rated = sub["median_harm"].notna().to_numpy()
    handles, labels = _lift_points(fig, ax, x, y, rated, sub["median_harm"])
    ax.axhline(2.0, color="#444444", ls="--", lw=0.8)
    handles.append(Line2D([], [], color="#444444", ls="--", lw=0.8))
    labels.append("lift = 2 (threshold)")
    if y.max() / max(y.min(), 1e-9) > 8:
        ax.set_yscale("log")
    for i in range(n_label):
        ax.annotate(
            str(i + 1),
            (x[i], y[i]),
            xytext=(3, 3),
            textcoords="offset points",
            fontsize=SMALL,
            fontweight="bold",
            color="#222222",
        )
    n_max = int(sub["n_models"].max())
    ax.set_xticks(range(1, n_max + 1) if n_max <= 25 else np.linspace(1, n_max, 10).round().astype(int))
    ax.set_xlim(0.5, n_max + 0.7)
    ax.set_xlabel("models sharing the association (count, jittered)", fontsize=LABEL)
    ax.set_ylabel("mean lift (observed / expected)", fontsize=LABEL)
    panel_title(ax, f"{title}: {len(sub)} associations", fig.get_figwidth() - 0.6)
    tick_style(ax)
    key = fig.add_subplot(gs[1])
    key.axis("off")
    add_legend(key, handles, labels, loc="upper left", bbox_to_anchor=(0.0, 1.0), ncol=len(handles), borderaxespad=0.0)
    for i in range(n_label):
        key.text(
            0.0,
            1.0 - (0.3 + 0.17 * (i + 1)) / (0.3 + 0.17 * n_label),
            f"{i + 1}: {shorten(association_label(sub.iloc[i]), 100)}",
            transform=key.transAxes,
            fontsize=SMALL,
            va="top",
        )
    fig.tight_layout()
    return fig, _shared_stats(sub, len(sub))
