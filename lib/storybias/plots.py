"""Stage 07 figures: one function per figure of the three studies, drawn from the stage artifacts.

Every function takes artifact DataFrames (docs/data-contract.md) and returns ``(fig, stats)``: a
:class:`matplotlib.figure.Figure` and a dict of a few named values the figure shows (counts, means,
extremes), so a notebook can quote them in its text. The functions only *draw*: every statistic of
the studies (S_C, JSD, lift, AUC, ...) comes from the artifact; the stats dict holds counts and simple
means or extremes of what is drawn. An empty input (or nothing left after the function's filter)
gives a figure saying ``no data: <reason>`` and the same stats keys set to NaN (counts ``n_*`` to 0)
plus ``stats["no_data"] = <reason>`` (the key exists only then), never an exception. A non-empty
table without a required column raises ``KeyError`` naming it.

Figures are built on the Agg canvas directly (``Figure()`` + ``FigureCanvasAgg``), not through
pyplot: no global figure state, no GUI backend, nothing to leak in long notebooks. Text is at least
8 pt at the saved size; palettes are colour-blind-safe (tab10 / Okabe-Ito for categories, viridis for
continuous values, with redundant markers or line styles where more than ten series share a panel);
grids wrap, long labels are truncated and top-k lists are capped, so a 1-model CPU run and a
23-model x 14-language run both stay readable.

:data:`FIGURES` lists the stable file stems (``save_figure(fig, out_dir, stem)``) in notebook order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Ellipse, Patch, Rectangle
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import ScaledTranslation

from .io import atomic_open
from .metrics import GRAMMATICAL_GENDER, MIN_STORIES_FLAG, S_C_CLIP
from .prompts import LANGUAGES

# Registry: stable file stems in notebook order, with what each figure shows.
FIGURES: list[tuple[str, str]] = [
    ("01_vsr_heatmap", "Valid-story rate (%) by prompt language x model (BiasedTales-ML Table 3 / App. C)"),
    ("02_attribute_distributions", "Extracted protagonist attributes per model (StereoTales) and protagonist gender per model x design"),
    ("03_association_counts", "Significant value-level associations per model (all languages) and per language scope (StereoTales)"),
    ("04_top_associations_table", "Top associations shared across models: mean lift, models sharing, median harm (StereoTales)"),
    ("05_lift_share", "Mean lift vs number of models sharing each association, coloured by median harm (StereoTales)"),
    ("06_bias_fingerprints", "Bias fingerprints: S_C per adjective category, one polygon per language, one panel per model (BiasedTales-ML Fig. 2)"),
    ("07_cosine_heatmaps", "Cross-lingual cosine similarity of S_C vectors per model (BiasedTales-ML Fig. 3)"),
    ("08_jsd_grammatical_gender", "JSD by grammatical-gender group per model (BiasedTales-ML Fig. 4)"),
    ("09_distinctive_words", "Most distinctive words per field and group, log-odds z (BiasedTales-ML Fig. 5, 10-12)"),
    ("10_vsr_vs_jsd", "Valid-story rate vs JSD per model x language (BiasedTales-ML Fig. 6)"),
    ("11_balance_stereotype", "Balance M_b vs stereotype M_s per language, 1-sd ellipse per task (Feng et al. Fig. 2)"),
    ("12_anova_table", "Type-I ANOVA of M_s and M_b (Feng et al. Sec. 3.3.1, App. C)"),
    ("13_umap_density", "Shared UMAP of story embeddings with female/male density contours per language x genre (Feng et al. Fig. 3)"),
    ("14_probe_auc", "Identity-label probe AUC, full text vs cue-deleted, per language x genre (Feng et al. Table 1)"),
    ("15_cultural_relevance", "Cultural-marker relevance by source language x context per genre (Feng et al. Fig. 5)"),
    ("16_separability", "Source-language separability: balanced accuracy per marker version (Feng et al. Sec. 4.3)"),
]

# Text sizes (points at the saved size: figures are saved without rescaling).
TITLE = 10
LABEL = 9
SMALL = 8
DPI = 200

OKABE_ITO = {"female": "#CC79A7", "male": "#0072B2", "unknown": "#999999"}
UNKNOWN_GREY = "#BBBBBB"
OTHER_GREY = "#666666"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p")
GENRE_ORDER = ("explicit", "story", "news")
VERSION_ORDER = ("original", "translated", "masked")


# --- helpers ------------------------------------------------------------------------------------

def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _short(label: Any, n: int = 22) -> str:
    """``label`` cut to ``n`` characters with an ellipsis in the middle: model names differ at their
    ends ('vendor/model-8b-instruct') as often as at their starts."""
    text = str(label)
    if len(text) <= n:
        return text
    head = (n - 1) // 2
    return text[:head] + "…" + text[len(text) - (n - 1 - head):]


def _colors(n: int) -> list:
    """n categorical colours: tab10 up to ten, tab20 up to twenty, viridis samples beyond."""
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        # dark then light shade of each tab20 pair: the first ten stay the distinct tab10-like hues
        return [colormaps["tab20"](2 * i if i < 10 else 2 * (i - 10) + 1) for i in range(n)]
    return [colormaps["viridis"](x) for x in np.linspace(0, 0.95, n)]


def _lang_order(values: Iterable[Any]) -> list:
    """Languages in the canonical order of prompts.LANGUAGES, unknown codes after, ``all`` last."""
    present = list(dict.fromkeys(v for v in values if not _isna(v)))
    known = [code for code in LANGUAGES if code in present]
    rest = sorted((v for v in present if v not in LANGUAGES and v != "all"), key=str)
    return known + rest + (["all"] if "all" in present else [])


def _lang_name(code: Any) -> str:
    """'English' for 'en'; 'all languages' for the pooled scope; other codes as they are."""
    return "all languages" if code == "all" else LANGUAGES.get(code, str(code))


def _ordered(values: Iterable[Any], preferred: Sequence[str]) -> list:
    present = list(dict.fromkeys(v for v in values if not _isna(v)))
    return [v for v in preferred if v in present] + sorted((v for v in present if v not in preferred), key=str)


def _isna(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _is_empty(frame: pd.DataFrame | None) -> bool:
    return frame is None or len(frame) == 0


def _require(frame: pd.DataFrame, columns: Sequence[str], name: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise KeyError(f"{name}: missing column(s) {', '.join(missing)} (see docs/data-contract.md)")


def _bools(series: pd.Series) -> pd.Series:
    """A boolean column that may hold missing values (object dtype): missing counts as False."""
    return series.map(lambda v: False if _isna(v) else bool(v)).astype(bool)


def _empty_stats(keys: Sequence[str]) -> dict[str, Any]:
    return {k: (0 if k.startswith("n_") else float("nan")) for k in keys}


def _no_data(title: str, reason: str, keys: Sequence[str], width: float = 6.4, height: float = 2.4) -> tuple[Figure, dict]:
    fig = _figure(width, height)
    ax = fig.add_subplot()
    _no_data_axes(ax, reason)
    _title(ax, title, width - 0.4)
    stats = _empty_stats(keys)
    stats["no_data"] = reason
    return fig, stats


def _no_data_axes(ax, reason: str) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_color(UNKNOWN_GREY)
    text = f"no data: {reason}"
    if len(text) > 80:  # a long reason (stage 04's power table) wrapped inside the figure, not past its edges
        text = _wrap(text, ax.figure.get_figwidth() - 2.0, LABEL)
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=LABEL, wrap=True,
            transform=ax.transAxes, color="#333333")


def _too_small_axes(ax, text: str, width_in: float) -> None:
    """A panel that says its lens is too small (with the n) instead of drawing degenerate values."""
    ax.set_xticks([])
    ax.set_yticks([])
    if ax.name == "polar":
        ax.grid(False)
        ax.spines["polar"].set_color(UNKNOWN_GREY)
    ax.text(0.5, 0.5, _wrap(text, width_in, LABEL), ha="center", va="center", fontsize=LABEL,
            transform=ax.transAxes, color="#333333")


def _group_sizes(frame: pd.DataFrame) -> str:
    """"n_m = 2, n_f = 2" per language of ``frame`` (columns language, n_m, n_f), languages in order."""
    if not {"n_m", "n_f"} <= set(frame.columns):
        return "group sizes unknown"
    cells = frame.drop_duplicates(subset=["language"]).set_index("language")
    languages = _lang_order(cells.index)
    one = len(languages) == 1
    return "; ".join(f"{'' if one else str(lang) + ' '}n_m = {int(cells.loc[lang, 'n_m'])}, n_f = {int(cells.loc[lang, 'n_f'])}"
                     for lang in languages)


def _too_small_reason(frame: pd.DataFrame, min_stories: int, clipped: bool) -> str:
    """The text of a too-small panel: the group sizes, the minimum and, when so, that every value sits at the clip."""
    tail = f"; every S_C at the ±{S_C_CLIP:g} clip" if clipped else ""
    return f"too few stories: {_group_sizes(frame)} (need ≥ {min_stories}){tail}"


def _grid(n: int, ncols_max: int, panel_w: float, panel_h: float, extra_w: float = 0.0, extra_h: float = 0.8,
          polar: bool = False) -> tuple[Figure, list, int, int]:
    """A figure with ``n`` panels wrapped in rows of at most ``ncols_max``; unused cells hidden."""
    ncols = max(1, min(n, ncols_max))
    nrows = max(1, math.ceil(n / ncols))
    fig = _figure(panel_w * ncols + extra_w, panel_h * nrows + extra_h)
    axes = []
    for i in range(nrows * ncols):
        ax = fig.add_subplot(nrows, ncols, i + 1, projection="polar" if polar else None)
        if i >= n:
            ax.set_visible(False)
        axes.append(ax)
    return fig, axes, nrows, ncols


def _wrap(text: str, width_in: float, size: float = TITLE) -> str:
    """``text`` wrapped to lines that fit ``width_in`` inches at ``size`` points (~0.55 em a character)."""
    import textwrap

    return textwrap.fill(text, max(24, int(width_in * 72 / (0.55 * size))))


def _suptitle(fig: Figure, text: str) -> float:
    """A figure title wrapped to the figure's width; returns the top of the area left for the panels
    (a figure fraction, for ``tight_layout(rect=...)``)."""
    wrapped = _wrap(text, fig.get_figwidth() - 0.3)
    fig.suptitle(wrapped, fontsize=TITLE)
    return 1 - (0.12 + 0.2 * (wrapped.count("\n") + 1)) / fig.get_figheight()


def _title(ax, text: str, width_in: float, size: int = TITLE, **kwargs) -> None:
    ax.set_title(_wrap(text, width_in, size), fontsize=size, **kwargs)


def _ticks(ax, size: int = SMALL) -> None:
    ax.tick_params(labelsize=size)


def _pick(frame: pd.DataFrame, column: str, value: Any, what: str) -> tuple[pd.DataFrame, Any, str | None]:
    """Rows with ``column == value`` (``value`` None: the first value in file order). Returns the rows,
    the value used, and a reason when nothing matched."""
    if column not in frame.columns:
        return frame, None, None
    if value is None:
        values = [v for v in pd.unique(frame[column]) if not _isna(v)]
        if not values:
            return frame.iloc[0:0], None, f"no {what}"
        value = values[0]
    sub = frame[frame[column] == value]
    return sub, value, (None if len(sub) else f"no rows with {column} = {value!r}")


def _heatmap(ax, matrix: np.ndarray, vmin: float, vmax: float, fmt: str | None, cmap_name: str = "viridis", fontsize: int = SMALL,
             aspect: str = "auto"):
    """imshow with NaN cells grey and (``fmt`` not None) a value written in each cell (dark text on
    light cells, '–' in empty ones)."""
    cmap = colormaps[cmap_name].with_extremes(bad="#E8E8E8")
    masked = np.ma.masked_invalid(matrix.astype(float))
    image = ax.imshow(masked, cmap=cmap, vmin=vmin, vmax=vmax, aspect=aspect, interpolation="nearest")
    if fmt is None:
        return image
    for (i, j), value in np.ndenumerate(matrix):
        if np.isfinite(value):
            share = (value - vmin) / (vmax - vmin) if vmax > vmin else 0.5
            ax.text(j, i, fmt.format(value), ha="center", va="center", fontsize=fontsize,
                    color="black" if share > 0.55 else "white")
        else:
            ax.text(j, i, "–", ha="center", va="center", fontsize=fontsize, color="#555555")
    return image


def _legend(ax_or_fig, handles, labels, title: str | None = None, **kwargs):
    kwargs.setdefault("fontsize", SMALL)
    kwargs.setdefault("frameon", False)
    legend = ax_or_fig.legend(handles, labels, title=title, **kwargs)
    if title:
        legend.get_title().set_fontsize(SMALL)
    return legend


# --- saving -------------------------------------------------------------------------------------

_STEM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def save_figure(fig: Figure, out_dir: Path, stem: str, dpi: int = DPI) -> list[Path]:
    """Write ``<out_dir>/<stem>.png`` (``dpi``, default 200) and ``<stem>.pdf``, each to a temporary
    file in the same folder renamed into place (a kill leaves the old file or the new one), then
    close the figure. Returns the two paths. Display a figure before saving it."""
    if not _STEM.match(stem):
        raise ValueError(f"figure stem {stem!r}: use letters, digits, '_', '-', '.' (e.g. '01_vsr_heatmap')")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt, metadata in (("png", {"Software": None}), ("pdf", {"CreationDate": None, "Producer": None})):
        path = out_dir / f"{stem}.{fmt}"
        with atomic_open(path, "wb") as fh:
            fig.savefig(fh, format=fmt, dpi=dpi, bbox_inches="tight", pad_inches=0.08, metadata=metadata)
        written.append(path)
    _close(fig)
    return written


def _close(fig: Figure) -> None:
    """Close the figure: release it from pyplot when pyplot manages it (a figure built by this module
    is held by nothing global, so dropping the reference frees it)."""
    import sys

    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None and getattr(fig.canvas, "manager", None) is not None:
        pyplot.close(fig)


# --- 1. valid-story rate ------------------------------------------------------------------------

_VSR_KEYS = ("mean_vsr", "pooled_vsr", "min_vsr", "min_vsr_cell", "n_models", "n_languages", "n_empty_cells")


def vsr_heatmap(vsr: pd.DataFrame, design: str = "bedtime") -> tuple[Figure, dict]:
    """Valid-story rate (%) per prompt language (rows) x model (columns), with BiasedTales-ML Table 3's
    margins: ``Overall`` (pooled over models) and ``Average`` (mean over languages). Default: the
    bedtime design, BiasedTales-ML's own stories under its own validity rule (Table 3).

    stats: ``mean_vsr`` (mean over the model x language cells, 0-1), ``pooled_vsr`` (valid / stories),
    ``min_vsr`` and ``min_vsr_cell`` ("model / language"), ``n_models``, ``n_languages``,
    ``n_empty_cells`` (model x language pairs without stories)."""
    title = f"Valid-story rate by prompt language and model (design: {design})"
    if _is_empty(vsr):
        return _no_data(title, "vsr table is empty", _VSR_KEYS)
    _require(vsr, ["design", "model", "language", "vsr", "n_stories", "n_valid"], "vsr.parquet")
    sub = vsr[vsr["design"] == design]
    if sub.empty:
        return _no_data(title, f"no rows with design = {design!r}", _VSR_KEYS)
    from .langid import vsr_matrix

    matrix = vsr_matrix(vsr, design)
    models = [c for c in matrix.columns if c != "Overall"]
    languages = [r for r in matrix.index if r != "Average"]
    values = matrix.to_numpy(float)
    nrows, ncols = values.shape
    cell_w = 0.5 if ncols <= 12 else 0.42
    fig = _figure(max(4.6, 1.9 + cell_w * ncols), max(3.0, 2.0 + 0.3 * nrows))
    ax = fig.add_subplot()
    fmt = "{:.1f}" if ncols <= 12 else "{:.0f}"
    image = _heatmap(ax, values, 0.0, 100.0, fmt)
    ax.axvline(len(models) - 0.5, color="white", lw=2.5)
    ax.axhline(len(languages) - 0.5, color="white", lw=2.5)
    ax.set_xticks(range(ncols), [_short(c, 20) for c in matrix.columns], rotation=45 if ncols > 3 else 0,
                  ha="right" if ncols > 3 else "center", fontsize=SMALL)
    ax.set_yticks(range(nrows), [f"{r} ({LANGUAGES[r]})" if r in LANGUAGES else str(r) for r in matrix.index], fontsize=SMALL)
    ax.set_xlabel("generating model", fontsize=LABEL)
    ax.set_ylabel("prompt language", fontsize=LABEL)
    _title(ax, f"{title}; Overall = pooled over models, Average = mean over languages", fig.get_figwidth() - 0.6)
    bar = fig.colorbar(image, ax=ax, fraction=0.04 if ncols > 6 else 0.08, pad=0.02)
    bar.set_label("valid-story rate (%)", fontsize=LABEL)
    bar.ax.tick_params(labelsize=SMALL)
    fig.tight_layout()
    worst = sub.loc[sub["vsr"].idxmin()]
    stats = {
        "mean_vsr": float(sub["vsr"].mean()),
        "pooled_vsr": float(sub["n_valid"].sum() / sub["n_stories"].sum()) if sub["n_stories"].sum() else float("nan"),
        "min_vsr": float(worst["vsr"]),
        "min_vsr_cell": f"{worst['model']} / {worst['language']}",
        "n_models": len(models),
        "n_languages": len(languages),
        "n_empty_cells": int(len(models) * len(languages) - sub[["model", "language"]].drop_duplicates().shape[0]),
    }
    return fig, stats


# --- 2. attribute distributions ----------------------------------------------------------------

def _dimension_values(dimension: str) -> list[str]:
    try:
        from .extract import allowed_values

        return allowed_values(dimension)
    except Exception:  # a dimension outside the stereotales design: observed order
        return []


def _stacked_bars(ax, shares: pd.DataFrame, colors: Mapping[str, Any], annotate: bool, labels: bool = True) -> None:
    """Horizontal stacked bars of ``shares`` (percent), row 0 on top; segments >= 12% annotated."""
    y = np.arange(len(shares))[::-1]
    left = np.zeros(len(shares))
    for value in shares.columns:
        width = shares[value].to_numpy(float)
        color = colors[value]
        ax.barh(y, width, left=left, color=color, edgecolor="white", linewidth=0.4, height=0.8, label=str(value),
                hatch="//" if value == "unknown" else None)
        if annotate:
            r, g, b = _rgb(color)
            ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"
            for yi, li, wi in zip(y, left, width):
                if wi >= 12:
                    ax.text(li + wi / 2, yi, f"{wi:.0f}", ha="center", va="center", fontsize=SMALL, color=ink)
        left += width
    ax.set_yticks(y, [_short(i, 28) for i in shares.index] if labels else [""] * len(y), fontsize=SMALL)
    ax.set_xlim(0, 100)
    ax.set_ylim(-0.6, len(shares) - 0.4)
    _ticks(ax)


def _rgb(color: Any) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return to_rgb(color)


def _value_colors(values: Sequence[str]) -> dict[str, Any]:
    regular = [v for v in values if v not in ("other", "unknown")]
    colors = dict(zip(regular, _colors(len(regular))))
    colors["other"] = OTHER_GREY
    colors["unknown"] = UNKNOWN_GREY
    return colors


def attribute_distributions(extractions: pd.DataFrame, filtered: pd.DataFrame,
                            dimensions: Sequence[str] = ("gender", "age", "geographic_origin", "income_level"),
                            exclude_prompted: bool = True, ncols: int = 4) -> tuple[Figure, dict]:
    """Share (%) of each extracted value of the protagonists per model: top row(s), one panel of
    stacked horizontal bars per demographic dimension (stereotales stories, parsed extractions);
    bottom row, ``protagonist_gender`` per model, one panel per design. With ``exclude_prompted`` a
    dimension's panel leaves out the stories whose prompt fixed that dimension (their value is the
    prompt's).

    stats: ``n_stories`` (parsed stereotales stories), ``n_models``, per dimension d ``top_<d>`` (most
    frequent known value, pooled over models), ``top_share_<d>`` (its share, 0-1) and
    ``share_unknown_<d>``; ``share_female`` and ``share_male`` (protagonist_gender over all parsed
    stories of every design)."""
    dimensions = list(dimensions)
    title = "Extracted protagonist attributes per model"
    keys = ["n_stories", "n_models", *[f"{p}_{d}" for d in dimensions for p in ("top", "top_share", "share_unknown")],
            "share_female", "share_male"]
    if _is_empty(extractions) or _is_empty(filtered):
        return _no_data(title, "no extractions" if _is_empty(extractions) else "filtered table is empty", keys)
    _require(extractions, ["story_id", "parse_ok", "protagonist_gender", *[f"demo_{d}" for d in dimensions]], "extractions.parquet")
    _require(filtered, ["story_id", "design", "model"], "filtered.parquet")
    side = [c for c in ("story_id", "design", "model", "language", "cond_attribute") if c in filtered.columns]
    data = extractions.merge(filtered[side], on="story_id", how="inner")
    data = data[_bools(data["parse_ok"])]
    if data.empty:
        return _no_data(title, "no parsed extractions joined to filtered stories", keys)
    models = sorted(data["model"].dropna().unique(), key=str)
    stereo = data[data["design"] == "stereotales"]
    designs = _ordered(data["design"], ("stereotales", "bedtime", "occupations"))

    # value order and colours per dimension first: the legend heights size the figure
    panels = []
    for dim in dimensions:
        part = stereo
        if exclude_prompted and "cond_attribute" in part.columns:
            part = part[part["cond_attribute"] != dim]
        values = part[f"demo_{dim}"].fillna("unknown").astype(str)
        observed = set(values)
        order = [v for v in _dimension_values(dim) if v in observed]
        order += sorted(v for v in observed if v not in order and v not in ("other", "unknown"))
        order += [v for v in ("other", "unknown") if v in observed and v not in order]
        panels.append((dim, part, values, order))
    ncols = max(1, min(ncols, len(dimensions))) if dimensions else 1
    dim_rows = math.ceil(len(dimensions) / ncols) if dimensions else 0
    legend_rows = max([math.ceil(len(o) / 2) for *_, o in panels] + [1])
    bars_h = 0.5 + 0.2 * len(models)
    dim_h = bars_h + 0.9 + 0.17 * legend_rows
    gender_h = bars_h + 1.1
    label_w = 1.9
    panel_w = 3.1
    width = label_w + panel_w * max(ncols, len(designs))
    fig = _figure(width, dim_h * dim_rows + gender_h + 0.6)
    outer = fig.add_gridspec(dim_rows + 1, 1, height_ratios=[dim_h] * dim_rows + [gender_h])
    stats: dict[str, Any] = _empty_stats(keys)
    stats["n_stories"] = int(len(stereo))
    stats["n_models"] = len(models)
    annotate = len(models) <= 12
    for i, (dim, part, values, order) in enumerate(panels):
        row = outer[i // ncols].subgridspec(1, ncols)
        ax = fig.add_subplot(row[i % ncols])
        label = dim.replace("_", " ")
        ax.set_title(label + (" (prompts fixing it excluded)" if exclude_prompted else ""), fontsize=LABEL)
        first = i % ncols == 0
        if part.empty:
            _no_data_axes(ax, "no stereotales stories" if stereo.empty else f"every story fixed {label}")
            continue
        counts = pd.crosstab(part["model"], values).reindex(index=models, columns=order, fill_value=0)
        shares = counts.div(counts.sum(axis=1).replace(0, np.nan), axis=0).fillna(0) * 100
        _stacked_bars(ax, shares, _value_colors(order), annotate, labels=first)
        ax.set_xlabel("share of protagonists (%)", fontsize=LABEL)
        if first:
            ax.set_ylabel("model", fontsize=LABEL)
        _legend(ax, *ax.get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 0.0),
                bbox_transform=ax.transAxes + ScaledTranslation(0, -0.42, fig.dpi_scale_trans),
                ncol=2, columnspacing=0.8, handlelength=1.2, borderaxespad=0.0)
        pooled = values.value_counts()
        known = pooled.drop([v for v in ("unknown", "other") if v in pooled.index])
        if len(known):
            stats[f"top_{dim}"] = str(known.idxmax())
            stats[f"top_share_{dim}"] = float(known.max() / len(values))
        stats[f"share_unknown_{dim}"] = float((values == "unknown").mean())
    labels = data["protagonist_gender"].fillna("unknown").astype(str)
    order = _ordered(labels, ("female", "male", "unknown"))
    colors = {**_value_colors(order), **{k: v for k, v in OKABE_ITO.items() if k != "unknown"}}
    row = outer[dim_rows].subgridspec(1, max(ncols, len(designs)))
    for j, design in enumerate(designs):
        ax = fig.add_subplot(row[j])
        part = data[data["design"] == design]
        counts = pd.crosstab(part["model"], labels[part.index]).reindex(index=models, columns=order, fill_value=0)
        shares = counts.div(counts.sum(axis=1).replace(0, np.nan), axis=0).fillna(0) * 100
        _stacked_bars(ax, shares, colors, annotate, labels=j == 0)
        ax.set_title(f"protagonist gender · {design} (n = {len(part)})", fontsize=LABEL)
        ax.set_xlabel("share of stories (%)", fontsize=LABEL)
        if j == 0:
            ax.set_ylabel("model", fontsize=LABEL)
        if j == len(designs) - 1:
            _legend(ax, *ax.get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(1.02, 1.0), title="protagonist")
    stats["share_female"] = float((labels == "female").mean())
    stats["share_male"] = float((labels == "male").mean())
    top = _suptitle(fig, f"{title} (StereoTales; {len(stereo)} parsed stereotales stories)")
    fig.tight_layout(rect=(0, 0, 1, top))
    return fig, stats


# --- 3-4. StereoTales associations --------------------------------------------------------------

def power_reason(power: pd.DataFrame | None) -> str | None:
    """Why stage 04 found nothing, from its power table (``storybias.power.explain``)."""
    from .power import explain

    return explain(power)


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
    if _is_empty(values):
        return _no_data(title, power_reason(power) or "associations_values table is empty (no retained attribute pair)",
                        _COUNT_KEYS, height=3.2 if power_reason(power) else 2.4)
    _require(values, ["model", "scope", "significant"], "associations_values.parquet")
    data = values.assign(significant=_bools(values["significant"]))
    models = sorted(data["model"].dropna().unique(), key=str)
    per_model = data[data["scope"] == "all"].groupby("model")["significant"].sum().reindex(models, fill_value=0)
    by_lang = data[data["scope"] != "all"]
    languages = _lang_order(by_lang["scope"])
    lang_model = by_lang.groupby(["scope", "model"])["significant"].sum().unstack(fill_value=0).reindex(index=languages, columns=models, fill_value=0)
    n_rows = max(len(models), len(languages), 1)
    fig = _figure(10.0, max(2.8, 1.6 + 0.24 * n_rows + (0.3 if len(models) > 1 else 0.0)))
    ax_m, ax_l = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    if (data["scope"] == "all").any():
        y = np.arange(len(models))[::-1]
        ax_m.barh(y, per_model.to_numpy(), color=colormaps["tab10"](0), height=0.7)
        for yi, v in zip(y, per_model.to_numpy()):
            ax_m.text(v, yi, f" {int(v)}", va="center", fontsize=SMALL)
        ax_m.set_yticks(y, [_short(m, 24) for m in models], fontsize=SMALL)
        ax_m.set_xlim(0, max(1, per_model.max()) * 1.18)
        ax_m.set_xlabel("significant associations (count)", fontsize=LABEL)
        ax_m.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_m.set_ylabel("model", fontsize=LABEL)
        _ticks(ax_m)
    else:
        _no_data_axes(ax_m, "no global run (scope = all)")
    ax_m.set_title("all languages pooled, per model", fontsize=LABEL)
    if languages:
        y = np.arange(len(languages))[::-1]
        totals = lang_model.sum(axis=1).to_numpy()
        several = len(models) > 1
        # several models: bar = mean per model, dots = each model (one scale), total written at the right
        bars = lang_model.mean(axis=1).to_numpy() if several else totals
        ax_l.barh(y, bars, color=colormaps["tab10"](1), height=0.7, label="mean over models" if several else "count")
        right = max(1.0, float(lang_model.to_numpy().max()) if several else float(totals.max()))
        if several:
            rng = np.random.default_rng(0)
            for yi, (_, row) in zip(y, lang_model.iterrows()):
                ax_l.scatter(row.to_numpy(), yi + rng.uniform(-0.2, 0.2, len(row)), s=12, color="black", zorder=3,
                             label="one model" if yi == y[0] else None)
            _legend(ax_l, *ax_l.get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(0.0, 0.0), ncol=2,
                    bbox_transform=ax_l.transAxes + ScaledTranslation(0, -0.5, fig.dpi_scale_trans), borderaxespad=0.0)
        for yi, v, b in zip(y, totals, bars):
            ax_l.text(right * 1.02 if several else b, yi, f" total {int(v)}" if several else f" {int(v)}", va="center", fontsize=SMALL)
        ax_l.set_yticks(y, [f"{s} ({LANGUAGES[s]})" if s in LANGUAGES else str(s) for s in languages], fontsize=SMALL)
        ax_l.set_xlim(0, right * (1.3 if several else 1.18))
        ax_l.set_xlabel("significant associations per model (count)" if several else "significant associations (count)",
                        fontsize=LABEL)
        ax_l.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_l.set_ylabel("language scope", fontsize=LABEL)
        _ticks(ax_l)
    else:
        _no_data_axes(ax_l, "no per-language run")
    ax_l.set_title("per language scope", fontsize=LABEL)
    top = _suptitle(fig, title)
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


def association_label(row: Mapping[str, Any] | pd.Series) -> str:
    """'base_attribute=base_value → compared_attribute=compared_value'."""
    return f"{row['base_attribute']}={row['base_value']} → {row['compared_attribute']}={row['compared_value']}"


_SHARED_COLUMNS = ["scope", "base_attribute", "base_value", "compared_attribute", "compared_value", "n_models", "mean_lift"]
_TABLE_KEYS = ("n_associations", "n_shown", "max_mean_lift", "max_n_models", "n_rated", "n_harmful")


def _shared_scope(shared: pd.DataFrame, scope: str) -> pd.DataFrame:
    _require(shared, _SHARED_COLUMNS, "associations_shared.parquet")
    sub = shared[shared["scope"] == scope].copy()
    if "median_harm" not in sub.columns:
        sub["median_harm"] = np.nan
    sub["median_harm"] = pd.to_numeric(sub["median_harm"], errors="coerce")
    sub["harmful_flag"] = _bools(sub["harmful"]) if "harmful" in sub.columns else sub["median_harm"] >= 4
    return sub.sort_values(["n_models", "mean_lift"], ascending=[False, False], kind="stable").reset_index(drop=True)


def _shared_stats(sub: pd.DataFrame, n_shown: int) -> dict[str, Any]:
    return {"n_associations": int(len(sub)), "n_shown": int(n_shown), "max_mean_lift": float(sub["mean_lift"].max()),
            "max_n_models": int(sub["n_models"].max()), "n_rated": int(sub["median_harm"].notna().sum()),
            "n_harmful": int(sub["harmful_flag"].sum())}


def top_associations_table(shared: pd.DataFrame, k: int = 20, scope: str = "all",
                           power: pd.DataFrame | None = None) -> tuple[Figure, dict]:
    """A table of the top ``k`` associations of ``scope`` (most models sharing, then highest mean
    lift): the association, mean lift, number of models sharing it, median harm (1-5; '–' unrated).

    stats: ``n_associations`` (in scope), ``n_shown``, ``max_mean_lift``, ``max_n_models``,
    ``n_rated``, ``n_harmful`` (median harm >= 4). ``power``: as :func:`association_counts`."""
    title = f"Top associations shared across models (scope: {scope})"
    if _is_empty(shared):
        return _no_data(title, power_reason(power) or "associations_shared table is empty (no significant association)",
                        _TABLE_KEYS, height=3.2 if power_reason(power) else 2.4)
    sub = _shared_scope(shared, scope)
    if sub.empty:
        return _no_data(title, f"no associations with scope = {scope!r}", _TABLE_KEYS)
    top = sub.head(max(1, int(k)))
    rows = []
    for i, r in top.iterrows():
        harm = "–" if _isna(r["median_harm"]) else f"{r['median_harm']:.1f}" + (" (harmful)" if r["harmful_flag"] else "")
        rows.append([str(i + 1), _short(association_label(r), 92), f"{r['mean_lift']:.2f}", str(int(r["n_models"])), harm])
    header = ["#", "association (base → compared)", "mean lift", "models sharing", "median harm (1–5)"]
    fig = _figure(10.0, 1.0 + 0.27 * (len(rows) + 1))
    ax = fig.add_subplot()
    ax.axis("off")
    table = ax.table(cellText=rows, colLabels=header, colWidths=[0.04, 0.58, 0.1, 0.12, 0.16], loc="upper center",
                     cellLoc="left", colLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(SMALL)
    table.scale(1, 1.35)
    for (r, c), cell in table.get_celld().items():
        cell.PAD = 0.03
        cell.set_edgecolor("#CCCCCC")
        if r == 0:
            cell.set_facecolor("#E8E8E8")
            cell.get_text().set_fontweight("bold")
        elif top.iloc[r - 1]["harmful_flag"]:
            cell.set_facecolor("#FBE3EF")
        if c in (2, 3) and r > 0:
            cell.get_text().set_horizontalalignment("right")
    _title(ax, f"{title}: {len(rows)} of {len(sub)}, sorted by models sharing then mean lift; shaded = harmful (median ≥ 4)",
           fig.get_figwidth() - 0.6)
    fig.tight_layout()
    return fig, _shared_stats(sub, len(rows))


def lift_share_plot(shared: pd.DataFrame, scope: str = "all", label_top: int = 5,
                    power: pd.DataFrame | None = None) -> tuple[Figure, dict]:
    """Scatter of mean lift (y; log scale when it spans more than 8x) vs number of models sharing (x,
    jittered), one point per association of ``scope``, coloured by median harm (viridis, 1-5); unrated
    ones as open grey circles; the ``label_top`` (at most 10) first of the table order (most shared,
    then highest lift) numbered on the plot and named below it.

    stats: as :func:`top_associations_table` (``n_shown`` = points drawn). ``power``: as :func:`association_counts`."""
    title = f"Mean lift vs models sharing (scope: {scope})"
    if _is_empty(shared):
        return _no_data(title, power_reason(power) or "associations_shared table is empty (no significant association)",
                        _TABLE_KEYS, height=3.2 if power_reason(power) else 2.4)
    sub = _shared_scope(shared, scope)
    if sub.empty:
        return _no_data(title, f"no associations with scope = {scope!r}", _TABLE_KEYS)
    n_label = max(0, min(int(label_top), 10, len(sub)))
    fig = _figure(8.0, 4.9 + 0.3 + 0.17 * n_label)
    gs = fig.add_gridspec(2, 1, height_ratios=[4.6, 0.3 + 0.17 * n_label])
    ax = fig.add_subplot(gs[0])
    rng = np.random.default_rng(0)
    x = sub["n_models"].to_numpy(float) + rng.uniform(-0.18, 0.18, len(sub))
    y = sub["mean_lift"].to_numpy(float)
    rated = sub["median_harm"].notna().to_numpy()
    handles, labels = [], []
    if (~rated).any():
        h = ax.scatter(x[~rated], y[~rated], s=22, facecolors="none", edgecolors="#888888", linewidths=0.8)
        handles.append(h)
        labels.append("unrated")
    if rated.any():
        points = ax.scatter(x[rated], y[rated], s=26, c=sub.loc[rated, "median_harm"], cmap="viridis", vmin=1, vmax=5,
                            edgecolors="black", linewidths=0.3)
        bar = fig.colorbar(points, ax=ax, pad=0.02)
        bar.set_label("median harm rating (1–5)", fontsize=LABEL)
        bar.ax.tick_params(labelsize=SMALL)
        handles.append(Line2D([], [], marker="o", ls="", color=colormaps["viridis"](0.6), markeredgecolor="black"))
        labels.append("rated (colour = median harm)")
    ax.axhline(2.0, color="#444444", ls="--", lw=0.8)
    handles.append(Line2D([], [], color="#444444", ls="--", lw=0.8))
    labels.append("lift = 2 (threshold)")
    if y.max() / max(y.min(), 1e-9) > 8:
        ax.set_yscale("log")
    for i in range(n_label):
        ax.annotate(str(i + 1), (x[i], y[i]), xytext=(3, 3), textcoords="offset points", fontsize=SMALL, fontweight="bold",
                    color="#222222")
    n_max = int(sub["n_models"].max())
    ax.set_xticks(range(1, n_max + 1) if n_max <= 25 else np.linspace(1, n_max, 10).round().astype(int))
    ax.set_xlim(0.5, n_max + 0.7)
    ax.set_xlabel("models sharing the association (count, jittered)", fontsize=LABEL)
    ax.set_ylabel("mean lift (observed / expected)", fontsize=LABEL)
    _title(ax, f"{title}: {len(sub)} associations", fig.get_figwidth() - 0.6)
    _ticks(ax)
    key = fig.add_subplot(gs[1])
    key.axis("off")
    _legend(key, handles, labels, loc="upper left", bbox_to_anchor=(0.0, 1.0), ncol=len(handles), borderaxespad=0.0)
    for i in range(n_label):
        key.text(0.0, 1.0 - (0.3 + 0.17 * (i + 1)) / (0.3 + 0.17 * n_label), f"{i + 1}: {_short(association_label(sub.iloc[i]), 100)}",
                 transform=key.transAxes, fontsize=SMALL, va="top")
    fig.tight_layout()
    return fig, _shared_stats(sub, len(sub))


# --- 5-9. narrative distributions (BiasedTales-ML) ---------------------------------------------

_FP_KEYS = ("comparison", "n_models", "n_languages", "max_abs_s_c", "most_positive_category", "most_negative_category",
            "n_small_sample_cells", "n_too_small_panels")


def _sc_too_small(panel: pd.DataFrame) -> tuple[bool, bool]:
    """(every S_C of the panel at the clip, every cell of the panel flagged small)."""
    finite = panel["s_c"].dropna().abs()
    clipped = bool(len(finite)) and bool((finite >= S_C_CLIP - 1e-9).all())
    small = "small_sample" in panel.columns and len(panel) > 0 and bool(_bools(panel["small_sample"]).all())
    return clipped, small


def bias_fingerprints(sc: pd.DataFrame, comparison: str | None = None, kind: str = "adjectives",
                      ncols: int = 4, min_stories: int = MIN_STORIES_FLAG) -> tuple[Figure, dict]:
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
    _require(sc, ["comparison", "model", "language", "kind", "category", "s_c"], "metrics_sc.parquet")
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
    fig, axes, _, _ = _grid(len(models), ncols, 3.5, 3.5, extra_w=max(0.0, 7.0 - 3.5 * n_cols),
                                         extra_h=1.6 + 0.2 * math.ceil((len(languages) + 1) / 4), polar=True)
    theta = np.linspace(0, 2 * np.pi, len(cats), endpoint=False)
    closed = np.append(theta, theta[0])
    small_cells = set()
    too_small: dict[str, str] = {}
    for ax, model in zip(axes, models):
        m = sub[sub["model"] == model]
        clipped, all_small = _sc_too_small(m)
        if clipped or all_small:
            too_small[model] = _too_small_reason(m, min_stories, clipped)
            _too_small_axes(ax, too_small[model], 2.2)
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
            ax.plot(closed, np.append(r, r[0]), color=colors[lang], lw=1.4, ls="--" if small else "-",
                    marker=style[lang], markersize=3.5, zorder=2)
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
    top = _suptitle(fig, f"{title} (comparison: {comparison}); radius = S_C (ln ratio, −2…+2), outward = more frequent "
                         f"in the first group; bold circle = 0")
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
        stats["too_small"] = stats["no_data"] = "; ".join(f"{m}: {r}" for m, r in too_small.items()) if len(models) > 1 \
            else next(iter(too_small.values()))
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
    _require(cosine, ["comparison", "model", "language_a", "language_b", "cosine"], "metrics_cosine.parquet")
    sub, comparison, why = _pick(cosine, "comparison", comparison, "comparison")
    if why:
        return _no_data(title, why, _COS_KEYS)
    models = sorted(sub["model"].unique(), key=str)
    languages = _lang_order(pd.concat([sub["language_a"], sub["language_b"]]))
    n = len(languages)
    annotate = n <= 8  # beyond, the colour carries the value (a 14 x 14 grid of numbers per model is unreadable)
    panel = max(2.6, (0.42 if annotate else 0.2) * n + 1.1)
    n_cols = max(1, min(len(models), ncols))
    fig, axes, _, _ = _grid(len(models), ncols, panel, panel, extra_w=0.9 + max(0.0, 5.0 - panel * n_cols),
                                         extra_h=1.0)
    fmt = "{:.2f}" if annotate else None
    image = None
    off = sub[sub["language_a"] != sub["language_b"]].dropna(subset=["cosine"])
    for ax, model in zip(axes, models):
        matrix = sub[sub["model"] == model].pivot_table(index="language_a", columns="language_b", values="cosine", aggfunc="first")
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
    reason = (f"too few stories: JSD = ln 2 (the groups share no adjective) in every model x language; "
              f"{_group_sizes(jsd)} (need ≥ {min_stories})")
    fig, stats = _no_data(title, reason, keys, height=2.8)
    for text in fig.axes[0].texts:
        text.set_text(_wrap(reason, fig.get_figwidth() - 2.0, LABEL))  # the n, not "no data": the lens ran, its groups are too small
    stats["too_small"] = reason
    return fig, stats


_GG_KEYS = ("comparison", "median_jsd_G", "median_jsd_N", "n_G", "n_N", "n_ungrouped", "n_models")


def _gg_groups(grammatical_languages) -> tuple[tuple, tuple | None]:
    if grammatical_languages is None:
        grammatical_languages = GRAMMATICAL_GENDER
    if isinstance(grammatical_languages, Mapping):
        return tuple(grammatical_languages["G"]), tuple(grammatical_languages["N"])
    return tuple(grammatical_languages), None


def jsd_by_grammatical_gender(jsd: pd.DataFrame, grammatical_languages: Mapping[str, Sequence[str]] | Sequence[str] | None = None,
                              comparison: str | None = None, min_stories: int = MIN_STORIES_FLAG) -> tuple[Figure, dict]:
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
    _require(jsd, ["model", "language", "jsd"], "metrics_jsd.parquet")
    sub, comparison, why = _pick(jsd, "comparison", comparison, "comparison")
    if why:
        return _no_data(title, why, _GG_KEYS)
    g_langs, n_langs = _gg_groups(grammatical_languages)
    sub = sub.dropna(subset=["jsd"])
    group = np.where(sub["language"].isin(g_langs), "G",
                     np.where(sub["language"].isin(n_langs) if n_langs is not None else ~sub["language"].isin(g_langs), "N", ""))
    sub = sub.assign(group=group)
    ungrouped = sorted(sub.loc[sub["group"] == "", "language"].unique(), key=str)
    grouped = sub[sub["group"] != ""]
    if grouped.empty:
        return _no_data(title, "no JSD values" if sub.empty else "no language in either group", _GG_KEYS)
    small = _jsd_too_small(title, grouped, _GG_KEYS, min_stories)
    if small is not None:
        fig, stats = small
        stats.update(comparison=comparison, n_G=int((grouped["group"] == "G").sum()), n_N=int((grouped["group"] == "N").sum()),
                     n_ungrouped=len(ungrouped), n_models=int(grouped["model"].nunique()))
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
            box = ax.boxplot(y, positions=[i + offset], widths=0.32, patch_artist=True, showfliers=False,
                             medianprops={"color": "black"})
            for patch in box["boxes"]:
                patch.set_facecolor((*colors[g][:3], 0.35))
                patch.set_edgecolor(colors[g])
            xs = i + offset + rng.uniform(-0.08, 0.08, len(y))
            ax.scatter(xs, y, s=12, color=colors[g], edgecolors="black", linewidths=0.3, zorder=3)
            if label_points and column != "all models":
                for xi, yi, lang in zip(xs, y, part.loc[part["group"] == g, "language"]):
                    ax.annotate(str(lang), (xi, yi), xytext=(4, 0), textcoords="offset points", fontsize=SMALL, va="center")
    ax.set_xticks(range(len(columns)), [_short(c, 20) for c in columns], rotation=30 if len(columns) > 4 else 0,
                  ha="right" if len(columns) > 4 else "center", fontsize=SMALL)
    ax.set_xlim(-0.6, len(columns) - 0.4)
    ax.set_ylabel("Jensen–Shannon divergence (nats)", fontsize=LABEL)
    ax.set_xlabel("model", fontsize=LABEL)
    _ticks(ax)
    g_present = [l for l in _lang_order(grouped.loc[grouped["group"] == "G", "language"])]
    n_present = [l for l in _lang_order(grouped.loc[grouped["group"] == "N", "language"])]
    handles = [Patch(facecolor=(*colors[g][:3], 0.35), edgecolor=colors[g]) for g in ("G", "N")]
    labels = [f"G: grammatical gender ({', '.join(g_present) or 'none'})", f"N: no grammatical gender ({', '.join(n_present) or 'none'})"]
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


def distinctive_words(log_odds: pd.DataFrame, top: int = 10, model: str | None = None,
                      comparisons: Sequence[str] | None = None) -> tuple[Figure, dict]:
    """Most distinctive words (Monroe et al. log-odds z) of one ``model`` (default: the first): one
    row of panels per comparison, one column per field (adjectives, settings); in each panel the
    ``top`` words of each group (at most 25), positive z = the first group.

    stats: ``model``, ``n_panels``, ``n_words`` (bars drawn), ``max_abs_z`` and ``max_abs_z_word``
    ("word (comparison, field)")."""
    title = "Distinctive words (log-odds z with informative Dirichlet prior)"
    if _is_empty(log_odds):
        return _no_data(title, "metrics_log_odds table is empty", _LO_KEYS)
    _require(log_odds, ["comparison", "model", "field", "group", "word", "z"], "metrics_log_odds.parquet")
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
    per_panel = sub.groupby(["comparison", "field"]).apply(
        lambda p: sum(min(top, len(g)) for _, g in p.groupby("group")), include_groups=False) if len(sub) else pd.Series(dtype=int)
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
                _no_data_axes(ax, "no words for this field")
                continue
            groups = list(pd.unique(part["group"]))
            colors = dict(zip(groups, _colors(max(2, len(groups)))))
            chosen = pd.concat([g.reindex(g["z"].abs().sort_values(ascending=False).index).head(top) for _, g in part.groupby("group", sort=False)])
            chosen = chosen.sort_values("z")
            y = np.arange(len(chosen))
            ax.barh(y, chosen["z"], color=[colors[g] for g in chosen["group"]], height=0.75)
            ax.set_yticks(y, [_short(w, 20) for w in chosen["word"]], fontsize=SMALL)
            ax.axvline(0, color="black", lw=0.8)
            ax.set_xlabel("log-odds z (> 0: first group)", fontsize=LABEL)
            ax.set_ylim(-0.6, len(chosen) - 0.4)
            _ticks(ax)
            _legend(ax, [Patch(color=colors[g]) for g in groups], [str(g) for g in groups], loc="lower right", frameon=True)
            n_words += len(chosen)
            i = chosen["z"].abs().idxmax()
            if best is None or abs(chosen.at[i, "z"]) > abs(best[0]):
                best = (float(chosen.at[i, "z"]), f"{chosen.at[i, 'word']} ({comp}, {field})")
    upper = _suptitle(fig, f"{title}: {_short(model, 40)}, top {top} per group")
    fig.tight_layout(rect=(0, 0, 1, upper))
    stats = {"model": model, "n_panels": len(comps) * len(fields), "n_words": n_words,
             "max_abs_z": abs(best[0]) if best else float("nan"), "max_abs_z_word": best[1] if best else None}
    return fig, stats


_VJ_KEYS = ("comparison", "n_points", "n_models", "n_missing", "mean_vsr", "mean_jsd", "max_jsd", "max_jsd_cell")


def vsr_vs_jsd(vsr_jsd: pd.DataFrame, comparison: str | None = None, max_labels: int = 60,
               min_stories: int = MIN_STORIES_FLAG) -> tuple[Figure, dict]:
    """Valid-story rate (%, x) vs JSD (nats, y) with its bootstrap interval, one point per model x
    language (colour and marker = model, text = language code; with more than ``max_labels`` points
    only the 15 highest-JSD and the 10 lowest-VSR points are labelled).

    stats: ``comparison``, ``n_points``, ``n_models``, ``n_missing`` (rows without VSR or JSD),
    ``mean_vsr`` (0-1), ``mean_jsd``, ``max_jsd`` and ``max_jsd_cell`` ("model / language").
    Every JSD at ln 2: "too few stories" with the n, as :func:`jsd_by_grammatical_gender`."""
    title = "Generation quality vs bias strength"
    if _is_empty(vsr_jsd):
        return _no_data(title, "metrics_vsr_jsd table is empty", _VJ_KEYS)
    _require(vsr_jsd, ["model", "language", "jsd", "vsr"], "metrics_vsr_jsd.parquet")
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
        stats.update(comparison=comparison, n_points=len(points), n_models=int(points["model"].nunique()), n_missing=n_missing)
        return fig, stats
    models = sorted(points["model"].unique(), key=str)
    colors = dict(zip(models, _colors(len(models))))
    markers = {m: MARKERS[i % len(MARKERS)] for i, m in enumerate(models)}
    fig = _figure(7.0 + (2.6 if len(models) > 12 else 1.6), 5.0)
    ax = fig.add_subplot()
    label_idx = set(points.index) if len(points) <= max_labels else (
        set(points["jsd"].nlargest(15).index) | set(points["vsr"].nsmallest(10).index))
    for model in models:
        part = points[points["model"] == model]
        x, y = part["vsr"].to_numpy(float) * 100, part["jsd"].to_numpy(float)
        if {"ci_low", "ci_high"} <= set(part.columns):
            lo, hi = part["ci_low"].to_numpy(float), part["ci_high"].to_numpy(float)
            ok = np.isfinite(lo) & np.isfinite(hi)
            ax.errorbar(x[ok], y[ok], yerr=[np.clip(y[ok] - lo[ok], 0, None), np.clip(hi[ok] - y[ok], 0, None)], fmt="none",
                        ecolor=colors[model], alpha=0.5, lw=0.8)
        ax.scatter(x, y, color=colors[model], marker=markers[model], s=30, edgecolors="black", linewidths=0.3,
                   label=_short(model, 26), zorder=3)
        for idx, xi, yi in zip(part.index, x, y):
            if idx in label_idx:
                ax.annotate(str(part.at[idx, "language"]), (xi, yi), xytext=(3, 3), textcoords="offset points", fontsize=SMALL)
    ax.set_xlabel("valid-story rate (%)", fontsize=LABEL)
    ax.set_ylabel("Jensen–Shannon divergence (nats)", fontsize=LABEL)
    x_min = points["vsr"].min() * 100
    ax.set_xlim(max(0.0, x_min - 8), 103)
    _title(ax, f"{title} (comparison: {comparison}; one point per model × language, bars = 95% CI)", fig.get_figwidth() - 0.6)
    _ticks(ax)
    _legend(ax, *ax.get_legend_handles_labels(), title="model", loc="upper left", bbox_to_anchor=(1.01, 1.0),
            ncol=1 if len(models) <= 12 else 2)
    fig.tight_layout()
    worst = points.loc[points["jsd"].idxmax()]
    stats = {"comparison": comparison, "n_points": int(len(points)), "n_models": len(models), "n_missing": int(n_missing),
             "mean_vsr": float(points["vsr"].mean()), "mean_jsd": float(points["jsd"].mean()),
             "max_jsd": float(worst["jsd"]), "max_jsd_cell": f"{worst['model']} / {worst['language']}"}
    return fig, stats


# --- 10. stereotype and balance (Feng et al.) --------------------------------------------------

_BS_KEYS = ("denominator", "n_points", "n_languages", "n_tasks", "n_ellipses", "mean_m_s", "mean_m_b", "max_m_s", "max_m_s_cell")


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


def balance_stereotype(aggregates: pd.DataFrame, denominator: str = "all outputs", ncols: int = 3) -> tuple[Figure, dict]:
    """M_b (x, balance = P_f − P_m) vs M_s (y, stereotype) per language panel; one point per model x
    task, colour and marker = task, shaded 1-sd covariance ellipse per task (>= 3 models).

    stats: ``denominator``, ``n_points``, ``n_languages``, ``n_tasks``, ``n_ellipses``, ``mean_m_s``,
    ``mean_m_b``, ``max_m_s`` and ``max_m_s_cell`` ("model / language / task")."""
    title = "Balance and stereotype scores by language"
    if _is_empty(aggregates):
        return _no_data(title, "metrics_aggregates table is empty (no parsed occupations outputs)", _BS_KEYS)
    _require(aggregates, ["model", "language", "task", "m_s", "m_b"], "metrics_aggregates.parquet")
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
            ellipse = _cov_ellipse(t["m_b"].to_numpy(float), t["m_s"].to_numpy(float), facecolor=(*colors[task][:3], 0.18),
                                   edgecolor=colors[task], lw=1.0)
            if ellipse is not None:
                ax.add_patch(ellipse)
                n_ellipses += 1
            ax.scatter(t["m_b"], t["m_s"], color=colors[task], marker=markers[task], s=28, edgecolors="black", linewidths=0.3, zorder=3)
        ax.set_xlim(-1.05, 1.05)
        ax.set_ylim(-1.05, 1.05)
        ax.set_aspect("equal")
        ax.set_xlabel("balance M_b = P_f − P_m", fontsize=LABEL)
        ax.set_ylabel("stereotype M_s", fontsize=LABEL)
        ax.set_title(f"{lang} ({LANGUAGES[lang]})" if lang in LANGUAGES else str(lang), fontsize=LABEL)
        _ticks(ax)
    handles = [Line2D([], [], marker=markers[t], ls="", color=colors[t], markeredgecolor="black") for t in tasks]
    handles.append(Patch(facecolor=(0.5, 0.5, 0.5, 0.18), edgecolor="#555555"))
    _legend(fig, handles, [str(t) for t in tasks] + ["1-sd ellipse over models (≥ 3)"], title="task", loc="lower center",
            ncol=len(handles), bbox_to_anchor=(0.5, 0.0))
    top = _suptitle(fig, f"{title} (one point per model × task; denominator: {denominator})")
    fig.tight_layout(rect=(0, 0.55 / fig.get_figheight(), 1, top))
    best = sub.loc[sub["m_s"].idxmax()]
    stats = {"denominator": denominator, "n_points": int(len(sub)), "n_languages": len(languages), "n_tasks": len(tasks),
             "n_ellipses": n_ellipses, "mean_m_s": float(sub["m_s"].mean()), "mean_m_b": float(sub["m_b"].mean()),
             "max_m_s": float(best["m_s"]), "max_m_s_cell": f"{best['model']} / {best['language']} / {best['task']}"}
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
    _require(anova, ["outcome", "term", "df", "F", "p_value", "p_adjusted", "partial_omega_sq"], "metrics_anova.parquet")
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
        rows.append([str(r["denominator"]), str(r["subset"]), str(r["outcome"]), str(r["term"]), df,
                     "–" if _isna(r["F"]) else f"{r['F']:.2f}", _p(r["p_value"]), _p(r["p_adjusted"]),
                     "–" if _isna(r["partial_omega_sq"]) else f"{r['partial_omega_sq']:.3f}"])
    notes = []
    if "note" in data.columns:
        notes = [n for n in pd.unique(data["note"].dropna()) if str(n).strip()]
    header = ["denominator", "subset", "outcome", "term", "df (effect, resid.)", "F", "p", "p (BH)", "partial ω²"]
    fig = _figure(10.0, 0.8 + 0.26 * (len(rows) + 1) + 0.25 * len(notes))
    ax = fig.add_subplot()
    ax.axis("off")
    table = ax.table(cellText=rows, colLabels=header, colWidths=[0.14, 0.13, 0.08, 0.14, 0.13, 0.08, 0.08, 0.08, 0.1],
                     loc="upper center", cellLoc="left", colLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(SMALL)
    table.scale(1, 1.35)
    significant = (pd.to_numeric(data["p_adjusted"], errors="coerce") < alpha).to_numpy()
    for (r, c), cell in table.get_celld().items():
        cell.PAD = 0.03
        cell.set_edgecolor("#CCCCCC")
        if r == 0:
            cell.set_facecolor("#E8E8E8")
            cell.get_text().set_fontweight("bold")
        elif significant[r - 1]:
            cell.set_facecolor("#DCEAF7")
    for i, note in enumerate(notes):
        ax.text(0.0, -0.02 - 0.25 * i / max(1.0, fig.get_figheight() - 1.0), f"note: {_short(note, 150)}", transform=ax.transAxes,
                fontsize=SMALL, va="top")
    _title(ax, f"{title}; shaded: BH-adjusted p < {alpha}", fig.get_figwidth() - 0.6)
    fig.tight_layout()
    omega = pd.to_numeric(data["partial_omega_sq"], errors="coerce")
    if omega.notna().any():
        best = data.loc[omega.idxmax()]
        term = f"{best['outcome']}: {best['term']} ({best['subset']}; {best['denominator']})"
    else:
        term = None
    stats = {"n_rows": int(len(data)), "n_significant": int(significant.sum()),
             "max_partial_omega_sq": float(omega.max()) if omega.notna().any() else float("nan"), "max_partial_omega_sq_term": term}
    return fig, stats


# --- 11-13. embeddings, probes, cultural markers (Feng et al.) ---------------------------------

_UMAP_KEYS = ("n_points", "n_female", "n_male", "n_panels", "n_contoured_groups", "n_skipped_groups", "n_trimmed")
UMAP_DISPLAY_PERCENTILES: tuple[float, float] = (15.0, 90.0)  # Feng et al. App. D.4 (Fig. 3's display trim)


def trim_for_display(umap: pd.DataFrame, percentiles: tuple[float, float] | None = UMAP_DISPLAY_PERCENTILES,
                     by: Sequence[str] = ("language", "genre", "label")) -> pd.DataFrame:
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


def umap_density(umap: pd.DataFrame, ncols: int | None = None, max_points_kde: int = 2000,
                 percentiles: tuple[float, float] | None = UMAP_DISPLAY_PERCENTILES) -> tuple[Figure, dict]:
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
    _require(umap, ["language", "genre", "label", "x", "y"], "umap.parquet")
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
    slots = {(g, lang): (gi * rows_per_genre + li // ncols) * ncols + li % ncols
             for gi, g in enumerate(genres) for li, lang in enumerate(languages) if (g, lang) in present}
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
            ax.scatter(pts[:, 0], pts[:, 1], s=size, color=OKABE_ITO[label], alpha=0.55 if len(part) > 200 else 0.8,
                       marker="o" if label == "female" else "s", linewidths=0, zorder=2)
            if len(pts) < MIN_KDE_POINTS:
                skipped += 1
                continue
            sample = pts if len(pts) <= max_points_kde else pts[rng.choice(len(pts), max_points_kde, replace=False)]
            try:
                kde = gaussian_kde(sample.T)
                values = kde(np.hstack([sample.T, grid]))  # one evaluation: the points, then the grid
                levels = _hdr_thresholds(values[: len(sample)], HDR_LEVELS)
                density = values[len(sample):].reshape(gx.shape)
            except (np.linalg.LinAlgError, ValueError):
                skipped += 1
                continue
            if len(set(levels)) < len(levels) or not np.all(np.isfinite(levels)):
                skipped += 1
                continue
            ax.contour(gx, gy, density, levels=levels, colors=[OKABE_ITO[label]], linestyles=styles[label],
                       linewidths=[0.8, 1.1, 1.5], zorder=3)
            contoured += 1
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("UMAP 1 (no units)", fontsize=SMALL)
        ax.set_ylabel("UMAP 2 (no units)", fontsize=SMALL)
        name = _lang_name(lang)
        ax.set_title(f"{name} · {genre} (n = {len(part)})", fontsize=LABEL)
    handles = [Line2D([], [], marker="o", ls="", color=OKABE_ITO["female"]), Line2D([], [], color=OKABE_ITO["female"], ls="-"),
               Line2D([], [], marker="s", ls="", color=OKABE_ITO["male"]), Line2D([], [], color=OKABE_ITO["male"], ls="--")]
    _legend(fig, handles, ["female", "female density (20/50/80% HDR)", "male", "male density (20/50/80% HDR)"],
            loc="lower center", ncol=4, bbox_to_anchor=(0.5, 0.0))
    trim = (f"; points outside the {percentiles[0]:g}th-{percentiles[1]:g}th percentiles per label and cell not drawn"
            if percentiles is not None else "")
    top = _suptitle(fig, f"{title} (display only; contours: 20/50/80% highest-density regions, none below {MIN_KDE_POINTS} points{trim})")
    fig.tight_layout(rect=(0, 0.45 / fig.get_figheight(), 1, top))
    stats = {"n_points": int(len(data)), "n_female": int((data["label"] == "female").sum()),
             "n_male": int((data["label"] == "male").sum()), "n_panels": len(cells), "n_contoured_groups": contoured,
             "n_skipped_groups": skipped, "n_trimmed": int(n_trimmed)}
    return fig, stats


_PROBE_KEYS = ("n_cells", "n_ok_cells", "n_skipped_rows", "mean_auc_full", "mean_auc_cue_deleted", "mean_delta",
               "largest_drop", "largest_drop_cell")


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
    _require(probes, ["language", "genre", "variant", "auc", "ci_low", "ci_high", "status"], "probes.parquet")
    data = probes.copy()
    data["ok"] = data["status"].astype(str).str.strip().str.lower().eq("ok") & data["auc"].notna()
    languages = _lang_order(data["language"])
    genres = _ordered(data["genre"], GENRE_ORDER)
    cells = [(lang, g) for lang in languages for g in genres if ((data["language"] == lang) & (data["genre"] == g)).any()]
    fig = _figure(9.0, 1.5 + 0.5 * len(cells))
    ax = fig.add_subplot()
    variants = {"full": (0.15, colormaps["tab10"](0), "o", "full text (positive control)"),
                "cue_deleted": (-0.15, colormaps["tab10"](1), "s", "direct cues deleted")}
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
            ax.text(text_x, y, f"skipped ({_short(_reason(shown['status'].iloc[0]), 70)})", va="center", fontsize=SMALL, color="#555555")
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
                ax.text(text_x, y + offset, f"{variant.replace('_', '-')}: skipped ({_short(_reason(row['status']), 60)})",
                        va="center", fontsize=SMALL, color="#555555")
                continue
            lo, hi = row["ci_low"], row["ci_high"]
            if np.isfinite(lo) and np.isfinite(hi):
                ax.plot([lo, hi], [y + offset] * 2, color=color, lw=1.6)
            ax.scatter([row["auc"]], [y + offset], color=color, marker=marker, s=34, edgecolors="black", linewidths=0.4, zorder=3)
        n_ok_cells += both
        delta = cell[cell["variant"] == "delta"]
        if len(delta):
            d = delta.iloc[0]
            if d["ok"]:
                ci = f" [{d['ci_low']:+.2f}, {d['ci_high']:+.2f}]" if np.isfinite(d["ci_low"]) and np.isfinite(d["ci_high"]) else ""
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
    _legend(ax, handles, [v[3] for v in variants.values()] + ["chance (0.5)"], loc="upper left", bbox_to_anchor=(0.0, 0.0),
            bbox_transform=ax.transAxes + ScaledTranslation(0, -0.5, fig.dpi_scale_trans), ncol=3, borderaxespad=0.0)
    _title(ax, f"{title} (Δ = cue-deleted − full, right)", fig.get_figwidth() - 0.6)
    fig.tight_layout()
    full = data[(data["variant"] == "full") & data["ok"]]["auc"]
    cue = data[(data["variant"] == "cue_deleted") & data["ok"]]["auc"]
    delta_vals = data[(data["variant"] == "delta") & data["ok"]]["auc"]
    worst = min(drops) if drops else None
    stats = {"n_cells": len(cells), "n_ok_cells": int(n_ok_cells), "n_skipped_rows": int((~data["ok"]).sum()),
             "mean_auc_full": float(full.mean()) if len(full) else float("nan"),
             "mean_auc_cue_deleted": float(cue.mean()) if len(cue) else float("nan"),
             "mean_delta": float(delta_vals.mean()) if len(delta_vals) else float("nan"),
             "largest_drop": worst[0] if worst else float("nan"), "largest_drop_cell": worst[1] if worst else None}
    return fig, stats


_CULT_KEYS = ("n_genres", "n_source_languages", "mean_self_relevance", "mean_other_relevance", "self_context_advantage",
              "n_narratives", "n_markers")


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
    _require(cultural, ["source_language", "genre", "context", "relevance"], "cultural.parquet")
    data = cultural.dropna(subset=["relevance"])
    if data.empty:
        return _no_data(title, "no relevance scores", _CULT_KEYS)
    genres = _ordered(data["genre"], GENRE_ORDER)
    sources = _lang_order(data["source_language"])
    contexts = _lang_order(data["context"])
    panel_w = 1.6 + 0.75 * len(contexts)
    fig, axes, _, _ = _grid(len(genres), 3, panel_w, 1.4 + 0.42 * len(sources), extra_w=1.0, extra_h=0.5)
    image = None
    for ax, genre in zip(axes, genres):
        matrix = data[data["genre"] == genre].pivot_table(index="source_language", columns="context", values="relevance", aggfunc="mean")
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
    bar = fig.colorbar(image, cax=cax)
    bar.set_label("relevance (1–7)", fontsize=LABEL)
    bar.ax.tick_params(labelsize=SMALL)
    own = data["source_language"] == data["context"]
    per_source = data.groupby(["source_language", "genre"])
    stats = {"n_genres": len(genres), "n_source_languages": len(sources),
             "mean_self_relevance": float(data.loc[own, "relevance"].mean()) if own.any() else float("nan"),
             "mean_other_relevance": float(data.loc[~own, "relevance"].mean()) if (~own).any() else float("nan"),
             "n_narratives": int(per_source["n_narratives"].max().sum()) if "n_narratives" in data.columns else 0,
             "n_markers": int(per_source["n_markers"].max().sum()) if "n_markers" in data.columns else 0}
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
    _require(sep, ["version", "balanced_accuracy", "ci_low", "ci_high", "chance", "status"], "separability.parquet")
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
            ax.text(i, 0.5, f"skipped\n({_short(_reason(row['status']), 40)})", ha="center", va="center", fontsize=SMALL,
                    color="#555555", wrap=True)
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
    stats = {f"ba_{v}": (float(data.at[v, "balanced_accuracy"]) if v in data.index and data.at[v, "ok"] else float("nan"))
             for v in VERSION_ORDER}
    stats.update({"chance": float(ok["chance"].iloc[0]) if len(ok) else float("nan"), "n_ok": int(len(ok)),
                  "n_skipped": int((~data["ok"]).sum())})
    return fig, stats


# --- notebook 07: artifacts in, figures + index out -----------------------------------------------

ARTIFACTS: list[tuple[str, str]] = [
    # (name in the notebook, file under data/<run>/): everything notebook 07 reads
    ("vsr", "vsr.parquet"), ("filtered", "filtered.parquet"), ("extractions", "extractions.parquet"),
    ("associations_values", "associations_values.parquet"), ("associations_shared", "associations_shared.parquet"),
    ("metrics_sc", "metrics_sc.parquet"), ("metrics_cosine", "metrics_cosine.parquet"), ("metrics_jsd", "metrics_jsd.parquet"),
    ("metrics_log_odds", "metrics_log_odds.parquet"), ("metrics_vsr_jsd", "metrics_vsr_jsd.parquet"),
    ("metrics_aggregates", "metrics_aggregates.parquet"), ("metrics_anova", "metrics_anova.parquet"),
    ("umap", "umap.parquet"), ("probes", "probes.parquet"), ("cultural", "cultural.parquet"),
    ("separability", "separability.parquet"), ("associations_power", "associations_power.parquet"),
]


class Artifacts(dict):
    """The run's tables by name; a missing file is an empty table plus a note saying which stage
    writes it (the figure then says "no data")."""

    def __init__(self, tables: dict[str, pd.DataFrame], notes: list[str]):
        super().__init__(tables)
        self.notes = notes


def load_artifacts(run_name: str) -> Artifacts:
    from . import paths

    tables, notes = {}, []
    for name, file in ARTIFACTS:
        path = paths.run_dir(run_name) / file
        if path.is_file():
            tables[name] = pd.read_parquet(path)
        else:
            tables[name] = pd.DataFrame()
            notes.append(f"{path} is missing: its figures will say 'no data' (run the stage that writes it)")
    return Artifacts(tables, notes)


def quote_stats(template: str, stats: Mapping[str, Any]) -> str:
    """Fill ``template`` ("{mean_vsr:.1%}") with ``stats``; a missing or NaN value prints as "n/a"
    (an empty figure's statistics) instead of raising. ``{stats}`` prints every statistic."""
    class _Value:
        def __init__(self, value: Any):
            self.value = value

        def __format__(self, spec: str) -> str:
            if _isna(self.value):
                return "n/a"
            try:
                return format(self.value, spec)
            except (TypeError, ValueError):
                return str(self.value)

    class _Stats(dict):
        def __missing__(self, key: str) -> _Value:
            return _Value(None)

    values = _Stats({k: _Value(v) for k, v in stats.items()})
    values["stats"] = _Value(", ".join(f"{k} = {'n/a' if _isna(v) else (round(v, 3) if isinstance(v, float) else v)}"
                                       for k, v in stats.items()))
    return template.format_map(values)


def _plain(value: Any) -> Any:
    """JSON-safe statistic: numpy scalars to Python, NaN to None."""
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


class Gallery:
    """Notebook 07's figures: ``show`` saves one (PNG + PDF), displays the PNG and prints its quoted
    statistic; ``write_index`` writes ``figures.json`` (files, statistics, parameters) last, atomically:
    the Make target of the stage."""

    def __init__(self, out_dir: Path, dpi: int = DPI):
        self.out_dir = Path(out_dir)
        self.dpi = dpi
        self.records: list[dict[str, Any]] = []

    def show(self, stem: str, fig: Figure, stats: Mapping[str, Any], *, quote: str = "{stats}",
             display_width: int = 720) -> dict[str, Any]:
        from IPython.display import Image, display

        files = save_figure(fig, self.out_dir, stem, dpi=self.dpi)
        text = quote_stats(quote, stats)
        no_data = bool(stats.get("no_data")) or not stats  # the reason, set by _no_data
        record = {"stem": stem, "files": [p.name for p in files], "quote": text, "no_data": bool(no_data),
                  "stats": {k: _plain(v) for k, v in stats.items()}}
        self.records = [r for r in self.records if r["stem"] != stem] + [record]
        display(Image(filename=str(files[0]), width=display_width))
        print(text)
        return record

    def write_index(self, params: Mapping[str, Any] | None = None) -> Path:
        from .io import write_json_atomic

        described = dict(FIGURES)
        index = {"figures": [{**r, "description": described.get(r["stem"], "")} for r in self.records],
                 "params": dict(params or {})}
        return write_json_atomic(index, self.out_dir / "figures.json")

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([{"figure": r["stem"], "files": ", ".join(r["files"]), "shows": r["quote"]} for r in self.records])
