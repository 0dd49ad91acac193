"""The shared UMAP figure of stage 06 (Feng et al., *Beyond Surface Cues*): one panel per language x
genre with the female and male points and their highest-density contours, and the display trim it
applies (:func:`trim_for_display`). Re-exported by :mod:`storybias.stages.figures.probes`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from scipy.stats import gaussian_kde

from storybias.stages.figures.style import (
    GENRE_ORDER,
    LABEL,
    OKABE_ITO,
    SMALL,
    add_legend,
    figure_title,
    is_empty,
    language_name,
    language_order,
    no_data_figure,
    ordered,
    panel_grid,
    require_columns,
)

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
    title = "Shared UMAP projection of story embeddings"
    if is_empty(umap):
        return no_data_figure(title, "umap table is empty", _UMAP_KEYS)
    require_columns(umap, ["language", "genre", "label", "x", "y"], "umap")
    data = umap.dropna(subset=["x", "y"])
    data = data[data["label"].isin(["female", "male"])]
    if data.empty:
        return no_data_figure(title, "no female- or male-labelled points", _UMAP_KEYS)
    n_before = len(data)
    data = trim_for_display(data, percentiles)
    n_trimmed = n_before - len(data)
    languages = language_order(data["language"])
    genres = ordered(data["genre"], GENRE_ORDER)
    ncols = max(1, min(len(languages), 5) if ncols is None else ncols)
    rows_per_genre = math.ceil(len(languages) / ncols)
    slots = _umap_slots(data, languages, genres, ncols, rows_per_genre)
    cells = list(slots)
    fig, grid_axes, _, _ = panel_grid(len(genres) * rows_per_genre * ncols, ncols, 3.3, 3.1, extra_h=1.1)
    for i, ax in enumerate(grid_axes):
        ax.set_visible(i in slots.values())
    axes = [grid_axes[slots[c]] for c in cells]
    extent = _umap_extent(data)
    rng = np.random.default_rng(0)
    contoured = skipped = 0
    for ax, (genre, lang) in zip(axes, cells):
        part = data[(data["genre"] == genre) & (data["language"] == lang)]
        drawn, missed = _umap_panel(ax, part, extent, rng, max_points_kde)
        contoured += drawn
        skipped += missed
        ax.set_title(f"{language_name(lang)} · {genre} (n = {len(part)})", fontsize=LABEL)
    _umap_legend_and_title(fig, title, percentiles)
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


def _umap_slots(data: pd.DataFrame, languages: list, genres: list, ncols: int, rows_per_genre: int) -> dict[tuple, int]:
    """The grid slot of each (genre, language) cell present: each genre starts a new row and a
    language keeps its column in every genre block."""
    present = set(zip(data["genre"], data["language"]))
    return {
        (g, lang): (gi * rows_per_genre + li // ncols) * ncols + li % ncols
        for gi, g in enumerate(genres)
        for li, lang in enumerate(languages)
        if (g, lang) in present
    }


class _UmapExtent(NamedTuple):
    """The axes limits shared by every panel and the 64 x 64 grid the densities are evaluated on."""

    xlim: tuple[float, float]
    ylim: tuple[float, float]
    gx: np.ndarray
    gy: np.ndarray
    grid: np.ndarray


def _umap_extent(data: pd.DataFrame) -> _UmapExtent:
    """The points' range padded 6% on each side (1 when the points have no spread), and its grid."""
    pad_x = (data["x"].max() - data["x"].min()) * 0.06 or 1.0
    pad_y = (data["y"].max() - data["y"].min()) * 0.06 or 1.0
    xlim = (data["x"].min() - pad_x, data["x"].max() + pad_x)
    ylim = (data["y"].min() - pad_y, data["y"].max() + pad_y)
    gx, gy = np.meshgrid(np.linspace(*xlim, 64), np.linspace(*ylim, 64))
    return _UmapExtent(xlim, ylim, gx, gy, np.vstack([gx.ravel(), gy.ravel()]))


_UMAP_LINESTYLES = {"female": "-", "male": "--"}


def _umap_panel(
    ax: Axes, part: pd.DataFrame, extent: _UmapExtent, rng: np.random.Generator, max_points_kde: int
) -> tuple[int, int]:
    """One language x genre panel: each label's points and, when its KDE works, its HDR contours;
    the shared limits and the axis labels. Returns (groups contoured, groups skipped)."""
    contoured = skipped = 0
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
        if _umap_contours(ax, pts, label, extent, rng, max_points_kde):
            contoured += 1
        else:
            skipped += 1
    ax.set_xlim(*extent.xlim)
    ax.set_ylim(*extent.ylim)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("UMAP 1 (no units)", fontsize=SMALL)
    ax.set_ylabel("UMAP 2 (no units)", fontsize=SMALL)
    return contoured, skipped


def _umap_contours(
    ax: Axes, pts: np.ndarray, label: str, extent: _UmapExtent, rng: np.random.Generator, max_points_kde: int
) -> bool:
    """One group's 20/50/80% HDR contours from a Gaussian KDE of (a sample of at most
    ``max_points_kde`` of) its points; False, drawing nothing, when the group has fewer than
    ``MIN_KDE_POINTS`` points or its KDE is degenerate."""
    if len(pts) < MIN_KDE_POINTS:
        return False
    sample = pts if len(pts) <= max_points_kde else pts[rng.choice(len(pts), max_points_kde, replace=False)]
    try:
        kde = gaussian_kde(sample.T)
        values = kde(np.hstack([sample.T, extent.grid]))  # one evaluation: the points, then the grid
        levels = _hdr_thresholds(values[: len(sample)], HDR_LEVELS)
        density = values[len(sample) :].reshape(extent.gx.shape)
    except (np.linalg.LinAlgError, ValueError):
        return False
    if len(set(levels)) < len(levels) or not np.all(np.isfinite(levels)):
        return False
    ax.contour(
        extent.gx,
        extent.gy,
        density,
        levels=levels,
        colors=[OKABE_ITO[label]],
        linestyles=_UMAP_LINESTYLES[label],
        linewidths=[0.8, 1.1, 1.5],
        zorder=3,
    )
    return True


def _umap_legend_and_title(fig: Figure, title: str, percentiles: tuple[float, float] | None) -> None:
    """The point / density legend below the panels, the title naming the display trim, the layout."""
    handles = [
        Line2D([], [], marker="o", ls="", color=OKABE_ITO["female"]),
        Line2D([], [], color=OKABE_ITO["female"], ls="-"),
        Line2D([], [], marker="s", ls="", color=OKABE_ITO["male"]),
        Line2D([], [], color=OKABE_ITO["male"], ls="--"),
    ]
    add_legend(
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
    top = figure_title(
        fig,
        f"{title} (display only; contours: 20/50/80% highest-density regions, "
        f"none below {MIN_KDE_POINTS} points{trim})",
    )
    fig.tight_layout(rect=(0, 0.45 / fig.get_figheight(), 1, top))
