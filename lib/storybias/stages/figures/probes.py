"""Figures of stage 06's artifacts (Feng et al., *Beyond Surface Cues*): the shared UMAP with density
contours, probe AUC full text vs cue-deleted, cultural-marker relevance and source-language
separability."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.transforms import ScaledTranslation

from storybias.stages.figures.style import (
    GENRE_ORDER,
    LABEL,
    OKABE_ITO,
    SMALL,
    VERSION_ORDER,
    _colors,
    _figure,
    _grid,
    _heatmap,
    _is_empty,
    _isna,
    _lang_name,
    _lang_order,
    _legend,
    _no_data,
    _ordered,
    _require,
    _short,
    _suptitle,
    _ticks,
    _title,
)

# --- 11-13. embeddings, probes, cultural markers (Feng et al.) ---------------------------------

_UMAP_KEYS = ("n_points", "n_female", "n_male", "n_panels", "n_contoured_groups", "n_skipped_groups", "n_trimmed")
UMAP_DISPLAY_PERCENTILES: tuple[float, float] = (15.0, 90.0)  # Feng et al. App. D.4 (Fig. 3's display trim)


def trim_for_display(
    umap: pd.DataFrame,
    percentiles: tuple[float, float] | None = UMAP_DISPLAY_PERCENTILES,
    by: Sequence[str] = ("language", "genre", "label"),
) -> pd.DataFrame:
    """The points a UMAP figure draws: within each label and cell (``by``), those inside the
    ``percentiles`` range (inclusive) on *both* coordinates (Feng et al. App. D.4: 15th-90th). Display
    only -- the projection, the probes and every statistic keep all points. ``None`` keeps everything."""
    if percentiles is None or umap.empty:
        return umap
    low, high = percentiles
    keep = pd.Series(True, index=umap.index)
    for _, part in umap.groupby(list(by), sort=False, dropna=False):
        for axis in ("x", "y"):
            lo, hi = np.percentile(part[axis].to_numpy(float), [low, high])
            keep.loc[part.index] &= part[axis].between(lo, hi)
    return umap[keep]


HDR_LEVELS = (0.2, 0.5, 0.8)
MIN_KDE_POINTS = 5


def _hdr_thresholds(density_at_points: np.ndarray, levels: Sequence[float]) -> list[float]:
    """Density thresholds whose upper sets hold ``levels`` of the points (highest-density regions:
    the 20% level is the densest core), from the KDE evaluated at the points themselves; ascending."""
    return sorted(float(np.quantile(density_at_points, 1 - p)) for p in levels)


def umap_density(
    umap: pd.DataFrame,
    ncols: int | None = None,
    max_points_kde: int = 2000,
    percentiles: tuple[float, float] | None = UMAP_DISPLAY_PERCENTILES,
) -> tuple[Figure, dict]:
    """The shared UMAP projection, one panel per language x genre (same axes everywhere; each genre a
    block of rows of at most ``ncols`` languages, default 5, a language in the same column in every
    block): female and male points with their 20/50/80% highest-density contours (Gaussian KDE; solid =
    female, dashed = male; a group with fewer than 5 points, or a degenerate one, gets no contour).
    Display only: the axes carry no meaning. Points outside the ``percentiles`` range on either coordinate
    within their label and cell are not drawn (:func:`trim_for_display`; Feng et al. App. D.4: 15th-90th;
    ``None`` draws all).

    stats: ``n_points`` (drawn), ``n_female``, ``n_male``, ``n_panels``, ``n_contoured_groups``,
    ``n_skipped_groups`` (groups present but too small or degenerate for a KDE), ``n_trimmed``
    (female/male points left out of the display)."""
    from scipy.stats import gaussian_kde

    title = "Shared UMAP projection of story embeddings"
    if _is_empty(umap):
        return _no_data(title, "umap table is empty", _UMAP_KEYS)
    _require(umap, ["language", "genre", "label", "x", "y"], "umap")
    data = umap.dropna(subset=["x", "y"])
    data = data[data["label"].isin(["female", "male"])]
    if data.empty:
        return _no_data(title, "no female- or male-labelled points", _UMAP_KEYS)
    n_before = len(data)
    data = trim_for_display(data, percentiles)
    n_trimmed = n_before - len(data)
    languages = _lang_order(data["language"])
    genres = _ordered(data["genre"], GENRE_ORDER)
    present = set(zip(data["genre"], data["language"]))
    ncols = max(1, min(len(languages), 5) if ncols is None else ncols)
    rows_per_genre = math.ceil(len(languages) / ncols)
    # each genre starts a new row and a language keeps its column in every genre block
    slots = {
        (g, lang): (gi * rows_per_genre + li // ncols) * ncols + li % ncols
        for gi, g in enumerate(genres)
        for li, lang in enumerate(languages)
        if (g, lang) in present
    }
    cells = list(slots)
    fig, grid_axes, _, _ = _grid(len(genres) * rows_per_genre * ncols, ncols, 3.3, 3.1, extra_h=1.1)
    for i, ax in enumerate(grid_axes):
        ax.set_visible(i in slots.values())
    axes = [grid_axes[slots[c]] for c in cells]
    pad_x = (data["x"].max() - data["x"].min()) * 0.06 or 1.0
    pad_y = (data["y"].max() - data["y"].min()) * 0.06 or 1.0
    xlim = (data["x"].min() - pad_x, data["x"].max() + pad_x)
    ylim = (data["y"].min() - pad_y, data["y"].max() + pad_y)
    gx, gy = np.meshgrid(np.linspace(*xlim, 64), np.linspace(*ylim, 64))
    grid = np.vstack([gx.ravel(), gy.ravel()])
    rng = np.random.default_rng(0)
    contoured = skipped = 0
    styles = {"female": "-", "male": "--"}
    for ax, (genre, lang) in zip(axes, cells):
        part = data[(data["genre"] == genre) & (data["language"] == lang)]
        size = 10 if len(part) <= 400 else 4
        for label in ("female", "male"):
            pts = part.loc[part["label"] == label, ["x", "y"]].to_numpy(float)
            if len(pts) == 0:
                continue
            ax.scatter(
                pts[:, 0],
                pts[:, 1],
                s=size,
                color=OKABE_ITO[label],
                alpha=0.55 if len(part) > 200 else 0.8,
                marker="o" if label == "female" else "s",
                linewidths=0,
                zorder=2,
            )
            if len(pts) < MIN_KDE_POINTS:
                skipped += 1
                continue
            sample = pts if len(pts) <= max_points_kde else pts[rng.choice(len(pts), max_points_kde, replace=False)]
            try:
                kde = gaussian_kde(sample.T)
                values = kde(np.hstack([sample.T, grid]))  # one evaluation: the points, then the grid
                levels = _hdr_thresholds(values[: len(sample)], HDR_LEVELS)
                density = values[len(sample) :].reshape(gx.shape)
            except (np.linalg.LinAlgError, ValueError):
                skipped += 1
                continue
            if len(set(levels)) < len(levels) or not np.all(np.isfinite(levels)):
                skipped += 1
                continue
            ax.contour(
                gx,
                gy,
                density,
                levels=levels,
                colors=[OKABE_ITO[label]],
                linestyles=styles[label],
                linewidths=[0.8, 1.1, 1.5],
                zorder=3,
            )
            contoured += 1
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("UMAP 1 (no units)", fontsize=SMALL)
        ax.set_ylabel("UMAP 2 (no units)", fontsize=SMALL)
        name = _lang_name(lang)
        ax.set_title(f"{name} · {genre} (n = {len(part)})", fontsize=LABEL)
    handles = [
        Line2D([], [], marker="o", ls="", color=OKABE_ITO["female"]),
        Line2D([], [], color=OKABE_ITO["female"], ls="-"),
        Line2D([], [], marker="s", ls="", color=OKABE_ITO["male"]),
        Line2D([], [], color=OKABE_ITO["male"], ls="--"),
    ]
    _legend(
        fig,
        handles,
        ["female", "female density (20/50/80% HDR)", "male", "male density (20/50/80% HDR)"],
        loc="lower center",
        ncol=4,
        bbox_to_anchor=(0.5, 0.0),
    )
    trim = (
        f"; points outside the {percentiles[0]:g}th-{percentiles[1]:g}th percentiles per label and cell not drawn"
        if percentiles is not None
        else ""
    )
    top = _suptitle(
        fig,
        f"{title} (display only; contours: 20/50/80% highest-density regions, "
        f"none below {MIN_KDE_POINTS} points{trim})",
    )
    fig.tight_layout(rect=(0, 0.45 / fig.get_figheight(), 1, top))
    stats = {
        "n_points": int(len(data)),
        "n_female": int((data["label"] == "female").sum()),
        "n_male": int((data["label"] == "male").sum()),
        "n_panels": len(cells),
        "n_contoured_groups": contoured,
        "n_skipped_groups": skipped,
        "n_trimmed": int(n_trimmed),
    }
    return fig, stats


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
    text = "unknown reason" if _isna(status) else str(status)
    return re.sub(r"^skipped\s*[:(\-–]?\s*", "", text).rstrip(")") or text


def probe_auc(probes: pd.DataFrame) -> tuple[Figure, dict]:
    """Identity-label probe ROC AUC with 95% intervals per language x genre: full text (positive
    control) and cue-deleted, chance line at 0.5, Δ (cue-deleted − full) written at the right. Rows
    whose status is not ``ok`` are shown as ``skipped (reason)``.

    stats: ``n_cells``, ``n_ok_cells`` (both variants ok), ``n_skipped_rows``, ``mean_auc_full``,
    ``mean_auc_cue_deleted`` (over ok rows), ``mean_delta`` (delta rows), ``largest_drop`` (most
    negative Δ) and ``largest_drop_cell`` ("language / genre")."""
    title = "Identity-label probe: full text vs cue-deleted"
    if _is_empty(probes):
        return _no_data(title, "probes table is empty", _PROBE_KEYS)
    _require(probes, ["language", "genre", "variant", "auc", "ci_low", "ci_high", "status"], "probes")
    data = probes.copy()
    data["ok"] = data["status"].astype(str).str.strip().str.lower().eq("ok") & data["auc"].notna()
    languages = _lang_order(data["language"])
    genres = _ordered(data["genre"], GENRE_ORDER)
    cells = [
        (lang, g) for lang in languages for g in genres if ((data["language"] == lang) & (data["genre"] == g)).any()
    ]
    fig = _figure(9.0, 1.5 + 0.5 * len(cells))
    ax = fig.add_subplot()
    variants = {
        "full": (0.15, colormaps["tab10"](0), "o", "full text (positive control)"),
        "cue_deleted": (-0.15, colormaps["tab10"](1), "s", "direct cues deleted"),
    }
    lows = [0.5]
    ok_rows = data[data["ok"] & data["variant"].isin(list(variants))]
    if len(ok_rows):
        lows.append(float(np.nanmin(ok_rows[["auc", "ci_low"]].to_numpy(float))))
    x_min = max(0.0, min(lows) - 0.08)
    ax.set_xlim(x_min, 1.02)
    text_x = x_min + 0.02
    n_ok_cells, drops = 0, []
    y_positions = np.arange(len(cells))[::-1]
    for y, (lang, genre) in zip(y_positions, cells):
        cell = data[(data["language"] == lang) & (data["genre"] == genre)]
        both = True
        shown = cell[cell["variant"].isin(list(variants))]
        if len(shown) and not shown["ok"].any() and shown["status"].astype(str).nunique() == 1:
            # every variant skipped for the same reason: one line
            ax.text(
                text_x,
                y,
                f"skipped ({_short(_reason(shown['status'].iloc[0]), 70)})",
                va="center",
                fontsize=SMALL,
                color="#555555",
            )
            shown = shown.iloc[0:0]
            both = False
        for variant, (offset, color, marker, _) in variants.items():
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
                    f"{variant.replace('_', '-')}: skipped ({_short(_reason(row['status']), 60)})",
                    va="center",
                    fontsize=SMALL,
                    color="#555555",
                )
                continue
            lo, hi = row["ci_low"], row["ci_high"]
            if np.isfinite(lo) and np.isfinite(hi):
                ax.plot([lo, hi], [y + offset] * 2, color=color, lw=1.6)
            ax.scatter(
                [row["auc"]],
                [y + offset],
                color=color,
                marker=marker,
                s=34,
                edgecolors="black",
                linewidths=0.4,
                zorder=3,
            )
        n_ok_cells += both
        delta = cell[cell["variant"] == "delta"]
        if len(delta):
            d = delta.iloc[0]
            if d["ok"]:
                ci = (
                    f" [{d['ci_low']:+.2f}, {d['ci_high']:+.2f}]"
                    if np.isfinite(d["ci_low"]) and np.isfinite(d["ci_high"])
                    else ""
                )
                text = f"Δ {d['auc']:+.2f}{ci}"
                drops.append((float(d["auc"]), f"{lang} / {genre}"))
            else:
                text = f"Δ skipped ({_short(_reason(d['status']), 28)})"
            ax.text(1.01, y, text, transform=ax.get_yaxis_transform(), va="center", fontsize=SMALL, clip_on=False)
    ax.axvline(0.5, color="#444444", ls="--", lw=0.9)
    ax.set_yticks(y_positions, [f"{_lang_name(lang)} · {genre}" for lang, genre in cells], fontsize=SMALL)
    ax.set_ylim(-0.6, len(cells) - 0.4)
    ax.set_xlabel("ROC AUC (95% interval over held-out model–occupation groups)", fontsize=LABEL)
    ax.set_ylabel("language · genre", fontsize=LABEL)
    _ticks(ax)
    handles = [Line2D([], [], color=c, marker=m, lw=1.6, markeredgecolor="black") for _, c, m, _ in variants.values()]
    handles.append(Line2D([], [], color="#444444", ls="--", lw=0.9))
    _legend(
        ax,
        handles,
        [v[3] for v in variants.values()] + ["chance (0.5)"],
        loc="upper left",
        bbox_to_anchor=(0.0, 0.0),
        bbox_transform=ax.transAxes + ScaledTranslation(0, -0.5, fig.dpi_scale_trans),
        ncol=3,
        borderaxespad=0.0,
    )
    _title(ax, f"{title} (Δ = cue-deleted − full, right)", fig.get_figwidth() - 0.6)
    fig.tight_layout()
    full = data[(data["variant"] == "full") & data["ok"]]["auc"]
    cue = data[(data["variant"] == "cue_deleted") & data["ok"]]["auc"]
    delta_vals = data[(data["variant"] == "delta") & data["ok"]]["auc"]
    worst = min(drops) if drops else None
    stats = {
        "n_cells": len(cells),
        "n_ok_cells": int(n_ok_cells),
        "n_skipped_rows": int((~data["ok"]).sum()),
        "mean_auc_full": float(full.mean()) if len(full) else float("nan"),
        "mean_auc_cue_deleted": float(cue.mean()) if len(cue) else float("nan"),
        "mean_delta": float(delta_vals.mean()) if len(delta_vals) else float("nan"),
        "largest_drop": worst[0] if worst else float("nan"),
        "largest_drop_cell": worst[1] if worst else None,
    }
    return fig, stats


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
    if _is_empty(cultural):
        return _no_data(title, "cultural table is empty (no retained cultural markers)", _CULT_KEYS)
    _require(cultural, ["source_language", "genre", "context", "relevance"], "cultural")
    data = cultural.dropna(subset=["relevance"])
    if data.empty:
        return _no_data(title, "no relevance scores", _CULT_KEYS)
    genres = _ordered(data["genre"], GENRE_ORDER)
    sources = _lang_order(data["source_language"])
    contexts = _lang_order(data["context"])
    panel_w = 1.6 + 0.75 * len(contexts)
    fig, axes, _, _ = _grid(len(genres), 3, panel_w, 1.4 + 0.42 * len(sources), extra_w=1.0, extra_h=0.5)
    image: AxesImage | None = None
    for ax, genre in zip(axes, genres):
        matrix = data[data["genre"] == genre].pivot_table(
            index="source_language", columns="context", values="relevance", aggfunc="mean"
        )
        matrix = matrix.reindex(index=sources, columns=contexts)
        image = _heatmap(ax, matrix.to_numpy(float), 1.0, 7.0, "{:.2f}")
        for i, s in enumerate(sources):
            if s in contexts:
                ax.add_patch(Rectangle((contexts.index(s) - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", lw=1.8))
        ax.set_xticks(range(len(contexts)), [f"{c}-linked" for c in contexts], fontsize=SMALL)
        ax.set_yticks(range(len(sources)), [_lang_name(s) for s in sources], fontsize=SMALL)
        ax.set_xlabel("reference context", fontsize=LABEL)
        ax.set_ylabel("source language", fontsize=LABEL)
        ax.set_title(str(genre), fontsize=LABEL)
    top = _suptitle(fig, f"{title} (mean relevance 1–7; outlined: own context)")
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
    if _is_empty(sep):
        return _no_data(title, "separability table is empty", _SEP_KEYS)
    _require(sep, ["version", "balanced_accuracy", "ci_low", "ci_high", "chance", "status"], "separability")
    data = sep.drop_duplicates("version").copy()
    data["ok"] = data["status"].astype(str).str.strip().str.lower().eq("ok") & data["balanced_accuracy"].notna()
    versions = _ordered(data["version"], VERSION_ORDER)
    data = data.set_index("version").loc[versions]
    fig = _figure(max(4.8, 2.2 + 1.3 * len(versions)), 4.2)
    ax = fig.add_subplot()
    colors = dict(zip(versions, _colors(len(versions))))
    for i, version in enumerate(versions):
        row = data.loc[version]
        if not _isna(row["chance"]):
            ax.plot([i - 0.42, i + 0.42], [row["chance"]] * 2, color="#444444", ls="--", lw=1.0, zorder=4)
        if not row["ok"]:
            ax.text(
                i,
                0.5,
                f"skipped\n({_short(_reason(row['status']), 40)})",
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
    _ticks(ax)
    _legend(ax, [Line2D([], [], color="#444444", ls="--")], ["chance level"], loc="upper right", frameon=True)
    n_lang = data["n_languages"].dropna().max() if "n_languages" in data.columns else None
    extra = f"; {int(n_lang)} source languages" if n_lang is not None and not _isna(n_lang) else ""
    _title(ax, f"{title}{extra}", fig.get_figwidth() - 0.6)
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
