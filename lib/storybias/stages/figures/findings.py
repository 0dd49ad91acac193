"""Figure 21: StereoTales' headline findings on the run (``associations_findings.parquet``, stage 04):
per generator model, the significant associations of the pooled pass and how many the judges rate
harmful, with the stories behind them; per model x language, the harmful ones and how many of those are
significant in that language only (a description: finding 3 is a test of difference across languages,
``storybias.stages.associations.language_effects``). The title names the panel that rated harm
(``harm_panel``: the human panel when the run had its ratings, else the LLM judges)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from storybias.stages.figures.style import (
    LABEL,
    SMALL,
    add_legend,
    draw_heatmap,
    figure_title,
    is_empty,
    language_order,
    message_panel,
    new_figure,
    no_data_figure,
    require_columns,
    shorten,
    tick_style,
)

# Okabe-Ito sky blue and vermillion: the significant associations and, over them, the harmful ones
SIGNIFICANT_COLOUR, HARMFUL_COLOUR = "#56B4E9", "#D55E00"
_KEYS = ("n_models", "n_models_harmful", "n_harmful_all", "n_harmful_languages", "n_harmful_only_here", "n_unrated")
_COLUMNS = ["model", "scope", "n_stories", "n_significant", "n_rated", "n_harmful", "n_harmful_only_here"]


def headline_findings(findings: pd.DataFrame) -> tuple[Figure, dict]:
    """Left: per model, the pooled pass's significant associations (bar) and those rated harmful (dark
    bar), written as "harmful / significant (n stories)". Right: per language scope x model, the harmful
    associations, written "harmful / significant" with those of that language only in brackets.

    stats: ``n_models``, ``n_models_harmful`` (with at least one harmful association in the pooled pass),
    ``n_harmful_all``, ``n_harmful_languages``, ``n_harmful_only_here`` (per-language harmful ones
    significant in that language only), ``n_unrated`` (significant associations the judges did not rate)."""
    title = "StereoTales' headline findings: harmful associations per model and language"
    if is_empty(findings):
        return no_data_figure(title, "associations_findings table is empty (no parsed stereotales story)", _KEYS)
    require_columns(findings, _COLUMNS, "associations_findings")
    pooled = findings[findings["scope"] == "all"].sort_values("model")
    by_language = findings[findings["scope"] != "all"]
    models = sorted(findings["model"].unique(), key=str)
    n_languages = by_language["scope"].nunique()
    # the right panel's cells hold two lines of 8 pt text: about 0.55 in wide and 0.45 in tall each
    fig = new_figure(max(11.0, 6.5 + 0.55 * len(models)), max(3.2, 1.8 + max(0.3 * len(models), 0.45 * n_languages)))
    ax_m, ax_l = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    if len(pooled):
        _pooled_panel(ax_m, pooled)
    else:
        message_panel(ax_m, "no pooled (global) pass")
    ax_m.set_title("all languages pooled, per model", fontsize=LABEL)
    if len(by_language):
        _language_panel(fig, ax_l, by_language, models)
    else:
        message_panel(ax_l, "no per-language pass")
    ax_l.set_title("harmful / significant per language (in brackets: significant there only, a count, not a test)",
                   fontsize=LABEL)  # fmt: skip
    human = "harm_panel" in findings and bool((findings["harm_panel"] == "human").any())
    panel = "the human panel's" if human else "the LLM judges'"
    top = figure_title(fig, title + f" (harmful: {panel} median harm >= 4 of 5)")
    fig.tight_layout(rect=(0, 0, 1, top))
    stats = {
        "n_models": len(models),
        "n_models_harmful": int((pooled["n_harmful"] > 0).sum()),
        "n_harmful_all": int(pooled["n_harmful"].sum()),
        "n_harmful_languages": int(by_language["n_harmful"].sum()),
        "n_harmful_only_here": int(by_language["n_harmful_only_here"].fillna(0).sum()),
        "n_unrated": int((findings["n_significant"] - findings["n_rated"]).sum()),
    }
    return fig, stats


def _pooled_panel(ax: Axes, pooled: pd.DataFrame) -> None:
    """One pair of bars per model: significant (light) and rated harmful (dark), with the counts and n."""
    y = np.arange(len(pooled))[::-1]
    significant, harmful = pooled["n_significant"].to_numpy(), pooled["n_harmful"].to_numpy()
    ax.barh(y, significant, color=SIGNIFICANT_COLOUR, height=0.7)
    ax.barh(y, harmful, color=HARMFUL_COLOUR, height=0.7)
    for yi, row in zip(y, pooled.itertuples()):
        unrated = row.n_significant - row.n_rated
        note = f" {row.n_harmful} / {row.n_significant} (n = {row.n_stories})" + (
            f", {unrated} unrated" if unrated else ""
        )
        ax.text(row.n_significant, yi, note, va="center", fontsize=SMALL)
    ax.set_yticks(y, [shorten(m, 24) for m in pooled["model"]], fontsize=SMALL)
    ax.set_xlim(0, max(1, int(significant.max())) * 1.6)
    ax.set_xlabel("associations (count)", fontsize=LABEL)
    ax.set_ylabel("model", fontsize=LABEL)
    handles = [Patch(color=SIGNIFICANT_COLOUR), Patch(color=HARMFUL_COLOUR)]
    add_legend(ax, handles, ["significant", "rated harmful"], loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    tick_style(ax)


def _language_panel(fig: Figure, ax: Axes, by_language: pd.DataFrame, models: list) -> None:
    """Language scope (rows) x model (columns): the harmful count as colour, "h / s (only)" written."""
    languages = language_order(by_language["scope"])
    table = by_language.set_index(["scope", "model"])
    harmful = table["n_harmful"].unstack("model").reindex(index=languages, columns=models)
    top = max(1.0, float(np.nanmax(harmful.to_numpy(float))))
    image = draw_heatmap(ax, harmful.to_numpy(float), 0.0, top, None, "Oranges")
    for i, language in enumerate(languages):
        for j, model in enumerate(models):
            if (language, model) not in table.index:
                ax.text(j, i, "–", ha="center", va="center", fontsize=SMALL, color="#555555")
                continue
            row = table.loc[(language, model)]
            text = f"{row['n_harmful']} / {row['n_significant']}\n({int(row['n_harmful_only_here'])})"
            dark = row["n_harmful"] / top > 0.6  # Oranges is dark at the high end
            ax.text(j, i, text, ha="center", va="center", fontsize=SMALL, color="white" if dark else "black")
    ax.set_xticks(range(len(models)), [shorten(m, 16) for m in models], rotation=45 if len(models) > 3 else 0,
                  ha="right" if len(models) > 3 else "center", fontsize=SMALL)  # fmt: skip
    ax.set_yticks(range(len(languages)), languages, fontsize=SMALL)
    ax.set_xlabel("model", fontsize=LABEL)
    ax.set_ylabel("language scope", fontsize=LABEL)
    bar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
    bar.set_label("harmful associations (count)", fontsize=LABEL)
    bar.ax.tick_params(labelsize=SMALL)
    bar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))
