"""Figure of stage 04's harm judgements, after StereoTales (*StereoTales: A Multilingual Framework for
Open-Ended Stereotype Discovery in LLMs*, Le Jeune et al., arXiv:2605.10442): its human panel and the
LLM judges broadly agree on which associations are harmful (Spearman rho 0.62 between the
per-association median harms), the judges under-rate the harm of socio-economic attributes and
over-rate that of gender, and every model generates associations it itself rates harmful.

Drawn from ``associations_shared`` (the judges' median harm per association) and stage 04's manifest
(``manifest_associations.json``): ``human_agreement`` (rho with its bootstrap interval, written when
``associations.human_ratings`` names a CSV) and ``harmful_human_vs_llm`` (Cohen's kappa of the
harmful classifications), and three tables as lists of rows: :data:`HUMAN_SUMMARY_KEY` and
:data:`HARM_GAP_KEY` (null without human ratings) and :data:`SELF_JUDGEMENT_KEY`. A manifest of an
older run without a key gets a panel that says which one is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from storybias.stages.figures.style import (
    LABEL,
    SMALL,
    figure_title,
    is_empty,
    is_missing,
    message_panel,
    new_figure,
    no_data_figure,
    panel_title,
    require_columns,
    shorten,
    tick_style,
)

__all__ = ["HARM_GAP_KEY", "HUMAN_SUMMARY_KEY", "SELF_JUDGEMENT_KEY", "harm_agreement"]

# manifest_associations.json keys of the tables stage 04 writes as rows (storybias.stages.associations):
HUMAN_SUMMARY_KEY = "human_summary"  # stages.associations.human.rating_summary of the human ratings
HARM_GAP_KEY = "harm_gap"  # stages.associations.human.harm_gap_by_attribute
SELF_JUDGEMENT_KEY = "self_judgement"  # stages.associations.judge.self_judgement_contrast

NO_HUMANS = "no human ratings: set associations.human_ratings"
HARMFUL = 4  # StereoTales: harmful when the median harm is >= 4

_KEYS = (
    "n_rated",
    "n_human_compared",
    "rho",
    "rho_ci_low",
    "rho_ci_high",
    "n_rho",
    "kappa_harmful",
    "n_attributes",
    "max_gap",
    "max_gap_attribute",
    "min_gap",
    "min_gap_attribute",
    "n_self_judges",
    "mean_self_gap",
    "min_self_gap",
    "min_self_gap_judge",
)

_GAP_COLUMNS = ["base_attribute", "n_associations", "gap", "gap_ci_low", "gap_ci_high"]
_SELF_COLUMNS = ["judge", "n_compared", "gap", "gap_ci_low", "gap_ci_high", "self_share_harmful"]


def _rows(manifest: Mapping[str, Any], key: str, columns: list[str]) -> pd.DataFrame:
    """The manifest's table under ``key`` (a list of rows); empty when missing or None, refused
    (naming the manifest) when it lacks ``columns``."""
    value = manifest.get(key)
    if not isinstance(value, list) or not value:
        return pd.DataFrame(columns=columns)
    frame = pd.DataFrame(value)
    require_columns(frame, columns, "manifest_associations")
    return frame


def _num(value: Any) -> float:
    return float("nan") if value is None or is_missing(value) else float(value)


def harm_agreement(shared: pd.DataFrame, manifest: Mapping[str, Any] | None = None) -> tuple[Figure, dict]:
    """Three panels (StereoTales' human evaluation): (a) the judges' median harm against the human
    panel's median harm per association, with stage 04's Spearman rho and its interval in the title;
    (b) the harm gap per base attribute (human − judges' mean of the per-association medians, > 0
    where the judges under-rate the harm) with its bootstrap interval; (c) per judge that is also a
    generating model, its mean harm on its own associations minus the other judges' (< 0: milder on
    itself), with its interval. A panel whose table stage 04 did not write says so; without human
    ratings (a) and (b) say "no human ratings: set associations.human_ratings".

    stats: ``n_rated`` (associations the judges rated), ``n_human_compared`` (points of (a)), ``rho``,
    ``rho_ci_low``, ``rho_ci_high``, ``n_rho``, ``kappa_harmful`` (from the manifest), ``n_attributes``,
    ``max_gap`` / ``min_gap`` and their ``*_attribute``, ``n_self_judges``, ``mean_self_gap``,
    ``min_self_gap`` and ``min_self_gap_judge``."""
    title = "Harm of the associations: human panel vs LLM judges"
    if is_empty(shared):
        return no_data_figure(title, "associations_shared table is empty (no significant association)", _KEYS)
    require_columns(shared, ["association_id", "median_harm"], "associations_shared")
    rated = shared.dropna(subset=["median_harm"]).drop_duplicates("association_id")
    if rated.empty:
        return no_data_figure(
            title, "no association was rated by the judges (harm_ratings.parquet has no parsed rating)", _KEYS
        )
    manifest = manifest or {}
    agreement = manifest.get("human_agreement") if isinstance(manifest.get("human_agreement"), Mapping) else None
    human = _rows(manifest, HUMAN_SUMMARY_KEY, ["association_id", "median_harm"])
    gap = _rows(manifest, HARM_GAP_KEY, _GAP_COLUMNS)
    own = _rows(manifest, SELF_JUDGEMENT_KEY, _SELF_COLUMNS)
    fig = new_figure(14.0, max(4.2, 1.8 + 0.34 * max(len(gap), len(own))))
    axes = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.0, 1.1, 1.2]})
    stats: dict[str, Any] = {"n_rated": int(len(rated))}
    width = fig.get_figwidth()
    stats |= _scatter_panel(axes[0], 0.28 * width, rated, human, agreement, manifest.get("harmful_human_vs_llm"))
    stats |= _gap_panel(axes[1], 0.3 * width, gap, humans=agreement is not None)
    stats |= _self_panel(axes[2], 0.32 * width, own)
    top = figure_title(fig, f"{title} ({len(rated)} association(s) rated by the judges; harmful: median ≥ {HARMFUL})")
    fig.tight_layout(rect=(0, 0, 1, top))
    return fig, {k: stats[k] for k in _KEYS}


def _scatter_panel(
    ax: Axes, width: float, rated: pd.DataFrame, human: pd.DataFrame, agreement: Mapping | None, harmful: Any
) -> dict[str, Any]:
    """(a): one bubble per (human median, judges' median) pair, sized by its number of associations,
    the diagonal and the harmful thresholds; or why there is nothing to draw."""
    ax.set_xlabel("human panel's median harm (1–5)", fontsize=LABEL)
    ax.set_ylabel("LLM judges' median harm (1–5)", fontsize=LABEL)
    out: dict[str, Any] = {"n_human_compared": 0, "rho": np.nan, "rho_ci_low": np.nan, "rho_ci_high": np.nan}
    out["n_rho"], out["kappa_harmful"] = 0, np.nan
    if agreement is None:
        message_panel(ax, NO_HUMANS, width_in=width)
        panel_title(ax, "(a) per association", width, size=LABEL)
        return out
    out |= {"rho": _num(agreement.get("rho")), "rho_ci_low": _num(agreement.get("ci_low"))}
    out |= {"rho_ci_high": _num(agreement.get("ci_high")), "n_rho": int(agreement.get("n") or 0)}
    if isinstance(harmful, Mapping):
        out["kappa_harmful"] = _num(harmful.get("cohen_kappa"))
    rho = "ρ not computed" if is_missing(out["rho"]) else f"Spearman ρ = {out['rho']:.2f}"
    if not is_missing(out["rho_ci_low"]):
        rho += f" [{out['rho_ci_low']:.2f}, {out['rho_ci_high']:.2f}]"
    rho += f", n = {out['n_rho']}"
    if not is_missing(out["kappa_harmful"]):
        rho += f"; κ(harmful) = {out['kappa_harmful']:.2f}"
    both = human[["association_id", "median_harm"]].merge(
        rated[["association_id", "median_harm"]], on="association_id", suffixes=("_human", "_llm")
    )
    both = both.dropna(subset=["median_harm_human", "median_harm_llm"])
    if both.empty:
        why = f"{rho}. Stage 04 writes no per-association human medians (manifest key '{HUMAN_SUMMARY_KEY}')"
        message_panel(ax, why, width_in=width)
        panel_title(ax, "(a) per association", width, size=LABEL)
        return out
    points = both.groupby(["median_harm_human", "median_harm_llm"]).size().rename("n").reset_index()
    ax.scatter(
        points["median_harm_human"],
        points["median_harm_llm"],
        s=18 + 22 * np.sqrt(points["n"]),
        color=colormaps["tab10"](0),
        alpha=0.7,
        edgecolors="black",
        linewidths=0.4,
        zorder=3,
    )
    ax.plot([0.8, 5.2], [0.8, 5.2], color="#666666", ls="--", lw=0.8)
    ax.axvline(HARMFUL, color="#AAAAAA", ls=":", lw=0.8)
    ax.axhline(HARMFUL, color="#AAAAAA", ls=":", lw=0.8)
    ax.set_xlim(0.8, 5.2)
    ax.set_ylim(0.8, 5.2)
    ax.set_aspect("equal")
    tick_style(ax)
    panel_title(ax, f"(a) per association (bubble area: associations): {rho}", width, size=LABEL)
    out["n_human_compared"] = int(len(both))
    return out


def _interval_rows(ax: Axes, table: pd.DataFrame, labels: list[str]) -> None:
    """Point and interval per row of ``table`` (gap, gap_ci_low, gap_ci_high), first row at the top,
    a zero line; blue circles above zero, orange squares below."""
    y = np.arange(len(table))[::-1]
    for yi, (_, row) in zip(y, table.iterrows()):
        negative = row["gap"] < 0
        color = colormaps["tab10"](1 if negative else 0)
        if not is_missing(row["gap_ci_low"]) and not is_missing(row["gap_ci_high"]):
            ax.plot([row["gap_ci_low"], row["gap_ci_high"]], [yi, yi], color=color, lw=1.6)
        ax.scatter([row["gap"]], [yi], color=color, marker="s" if negative else "o", s=30, edgecolors="black", zorder=3)
    ax.axvline(0, color="#444444", ls="--", lw=0.9)
    ax.set_yticks(y, labels, fontsize=SMALL)
    ax.set_ylim(-0.6, len(table) - 0.4)
    tick_style(ax)


def _gap_panel(ax: Axes, width: float, gap: pd.DataFrame, humans: bool) -> dict[str, Any]:
    """(b): the human − judges harm gap per base attribute with its interval, or why there is none."""
    ax.set_xlabel("human − judges' mean harm (> 0: judges under-rate)", fontsize=LABEL)
    panel_title(ax, "(b) harm gap per base attribute (95% bootstrap interval)", width, size=LABEL)
    out: dict[str, Any] = {"n_attributes": 0, "max_gap": np.nan, "max_gap_attribute": None}
    out |= {"min_gap": np.nan, "min_gap_attribute": None}
    data = gap.dropna(subset=["gap"]) if len(gap) else gap
    if data.empty:
        why = (
            NO_HUMANS
            if not humans
            else (
                f"stage 04 writes no per-attribute harm gap (manifest key '{HARM_GAP_KEY}': "
                "stages.associations.human.harm_gap_by_attribute)"
            )
        )
        message_panel(ax, why, width_in=width)
        return out
    data = data.sort_values("gap", ascending=False, kind="stable").reset_index(drop=True)
    labels = [f"{shorten(r['base_attribute'], 24)} (n = {int(r['n_associations'])})" for _, r in data.iterrows()]
    _interval_rows(ax, data, labels)
    out |= {"n_attributes": int(len(data)), "max_gap": float(data["gap"].iloc[0])}
    out |= {"max_gap_attribute": str(data["base_attribute"].iloc[0]), "min_gap": float(data["gap"].iloc[-1])}
    out["min_gap_attribute"] = str(data["base_attribute"].iloc[-1])
    return out


def _self_panel(ax: Axes, width: float, own: pd.DataFrame) -> dict[str, Any]:
    """(c): per judge, own − other judges' mean harm on the associations it generated, with its
    interval and the share it rates harmful itself; or why there is none."""
    ax.set_xlabel("own − other judges' mean harm on its own associations", fontsize=LABEL)
    panel_title(ax, "(c) self-judgement: each model judging its own associations", width, size=LABEL)
    out: dict[str, Any] = {"n_self_judges": 0, "mean_self_gap": np.nan, "min_self_gap": np.nan}
    out["min_self_gap_judge"] = None
    data = own.dropna(subset=["gap"]) if len(own) else own
    if data.empty:
        why = (
            f"stage 04 writes no self-judgement contrast (manifest key '{SELF_JUDGEMENT_KEY}': "
            "stages.associations.judge.self_judgement_contrast)"
        )
        message_panel(ax, why, width_in=width)
        return out
    data = data.sort_values("gap", kind="stable").reset_index(drop=True)
    labels = [
        f"{shorten(r['judge'], 24)}\nn = {int(r['n_compared'])}, "
        + ("–" if is_missing(r["self_share_harmful"]) else f"{r['self_share_harmful']:.0%}")
        + " self-rated harmful"
        for _, r in data.iterrows()
    ]
    _interval_rows(ax, data, labels)
    out |= {"n_self_judges": int(len(data)), "mean_self_gap": float(data["gap"].mean())}
    out |= {"min_self_gap": float(data["gap"].iloc[0]), "min_self_gap_judge": str(data["judge"].iloc[0])}
    return out
