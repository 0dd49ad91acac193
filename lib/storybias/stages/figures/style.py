"""Stage 08 figures' shared style: text sizes and palettes, the Agg figure factory, layout helpers
(grids, wrapped titles, heat maps, legends), saving as PNG + PDF (``save_figure``), and the empty-input
guard written once: ``no_data_figure`` (a whole figure) and ``message_panel`` (one panel), which every
figure draws instead of raising or drawing degenerate values.
"""

from __future__ import annotations

import math
import re
import sys
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from storybias.config.prompts import LANGUAGES
from storybias.config.studies import S_C_CLIP
from storybias.core import artifacts
from storybias.core.io import atomic_open

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


def new_figure(width: float, height: float) -> Figure:
    """An Agg figure whose texts are shown as written: a ``$`` in a label (a model name such as
    ``$\\undefinedcmd{x}$`` from a corpus) is not read as mathtext, which failed stage 08 naming nothing.
    storybias' figures use no mathtext; every label is data."""
    matplotlib.rcParams["text.parse_math"] = False  # read by each Text as it is made
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def shorten(label: Any, n: int = 22) -> str:
    """``label`` cut to ``n`` characters with an ellipsis in the middle: model names differ at their
    ends ('vendor/model-8b-instruct') as often as at their starts."""
    text = str(label)
    if len(text) <= n:
        return text
    head = (n - 1) // 2
    return text[:head] + "…" + text[len(text) - (n - 1 - head) :]


def category_colors(n: int) -> list:
    """n categorical colours: tab10 up to ten, tab20 up to twenty, viridis samples beyond."""
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        # dark then light shade of each tab20 pair: the first ten stay the distinct tab10-like hues
        return [colormaps["tab20"](2 * i if i < 10 else 2 * (i - 10) + 1) for i in range(n)]
    return [colormaps["viridis"](x) for x in np.linspace(0, 0.95, n)]


def language_order(values: Iterable[Any]) -> list:
    """Languages in the canonical order of prompts.LANGUAGES, unknown codes after, ``all`` last."""
    present = list(dict.fromkeys(v for v in values if not is_missing(v)))
    known = [code for code in LANGUAGES if code in present]
    rest = sorted((v for v in present if v not in LANGUAGES and v != "all"), key=str)
    return known + rest + (["all"] if "all" in present else [])


def language_name(code: Any) -> str:
    """'English' for 'en'; 'all languages' for the pooled scope; other codes as they are."""
    return "all languages" if code == "all" else LANGUAGES.get(code, str(code))


def ordered(values: Iterable[Any], preferred: Sequence[str]) -> list:
    present = list(dict.fromkeys(v for v in values if not is_missing(v)))
    return [v for v in preferred if v in present] + sorted((v for v in present if v not in preferred), key=str)


def is_missing(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def is_empty(frame: pd.DataFrame | None) -> bool:
    return frame is None or len(frame) == 0


def require_columns(frame: pd.DataFrame, columns: Sequence[str], artifact_name: str) -> None:
    """Refuse a table that lacks ``columns``, naming its file through the artifact registry."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        file = artifacts.artifact(artifact_name).pattern
        raise KeyError(f"{file}: missing column(s) {', '.join(missing)} (see docs/data-contract.md)")


def as_bools(series: pd.Series) -> pd.Series:
    """A boolean column that may hold missing values (object dtype): missing counts as False."""
    return series.map(lambda v: False if is_missing(v) else bool(v)).astype(bool)


def empty_stats(keys: Sequence[str]) -> dict[str, Any]:
    return {k: (0 if k.startswith("n_") else float("nan")) for k in keys}


def no_data_figure(
    title: str, reason: str, keys: Sequence[str], width: float = 6.4, height: float = 2.4
) -> tuple[Figure, dict]:
    """A whole figure that is one ``message_panel`` (no data: ``reason``), with ``keys`` set to NaN
    (counts ``n_*`` to 0) and ``stats["no_data"] = reason``: what every figure returns for an empty input."""
    fig = new_figure(width, height)
    ax = fig.add_subplot()
    message_panel(ax, reason)
    panel_title(ax, title, width - 0.4)
    stats = empty_stats(keys)
    stats["no_data"] = reason
    return fig, stats


def message_panel(ax, text: str, width_in: float | None = None) -> None:
    """The empty-input guard's panel, drawn by every figure instead of degenerate values (no axes
    ticks, one centred message). ``width_in`` None: a "no data: <text>" panel (grey frame; a long
    reason, such as stage 04's power table's, wrapped inside the figure); otherwise a panel saying its
    lens is too small, with the n (``text``, e.g. "too few stories: n_m = 2, n_f = 2 (need ≥ 5)"),
    wrapped to ``width_in`` inches."""
    ax.set_xticks([])
    ax.set_yticks([])
    if width_in is None:
        for spine in ax.spines.values():
            spine.set_color(UNKNOWN_GREY)
        text = f"no data: {text}"
        if len(text) > 80:
            text = wrap_text(text, ax.figure.get_figwidth() - 2.0, LABEL)
        ax.text(
            0.5, 0.5, text, ha="center", va="center", fontsize=LABEL, wrap=True, transform=ax.transAxes, color="#333333"
        )
        return
    if ax.name == "polar":
        ax.grid(False)
        ax.spines["polar"].set_color(UNKNOWN_GREY)
    ax.text(
        0.5,
        0.5,
        wrap_text(text, width_in, LABEL),
        ha="center",
        va="center",
        fontsize=LABEL,
        transform=ax.transAxes,
        color="#333333",
    )


def group_sizes(frame: pd.DataFrame) -> str:
    """ "n_m = 2, n_f = 2" per language of ``frame`` (columns language, n_m, n_f), languages in order."""
    if not {"n_m", "n_f"} <= set(frame.columns):
        return "group sizes unknown"
    cells = frame.drop_duplicates(subset=["language"]).set_index("language")
    languages = language_order(cells.index)
    one = len(languages) == 1
    return "; ".join(
        f"{'' if one else str(lang) + ' '}n_m = {int(cells.loc[lang, 'n_m'])}, n_f = {int(cells.loc[lang, 'n_f'])}"
        for lang in languages
    )


def too_small_reason(frame: pd.DataFrame, min_stories: int, clipped: bool) -> str:
    """The text of a too-small panel: the group sizes, the minimum and, when so, that every value sits at the clip."""
    tail = f"; every S_C at the ±{S_C_CLIP:g} clip" if clipped else ""
    return f"too few stories: {group_sizes(frame)} (need ≥ {min_stories}){tail}"


def panel_grid(
    n: int,
    ncols_max: int,
    panel_w: float,
    panel_h: float,
    extra_w: float = 0.0,
    extra_h: float = 0.8,
    polar: bool = False,
) -> tuple[Figure, list, int, int]:
    """A figure with ``n`` panels wrapped in rows of at most ``ncols_max``; unused cells hidden."""
    ncols = max(1, min(n, ncols_max))
    nrows = max(1, math.ceil(n / ncols))
    fig = new_figure(panel_w * ncols + extra_w, panel_h * nrows + extra_h)
    axes = []
    for i in range(nrows * ncols):
        ax = fig.add_subplot(nrows, ncols, i + 1, projection="polar" if polar else None)
        if i >= n:
            ax.set_visible(False)
        axes.append(ax)
    return fig, axes, nrows, ncols


def wrap_text(text: str, width_in: float, size: float = TITLE) -> str:
    """``text`` wrapped to lines that fit ``width_in`` inches at ``size`` points (~0.55 em a character)."""
    return textwrap.fill(text, max(24, int(width_in * 72 / (0.55 * size))))


def figure_title(fig: Figure, text: str) -> float:
    """A figure title wrapped to the figure's width; returns the top of the area left for the panels
    (a figure fraction, for ``tight_layout(rect=...)``)."""
    wrapped = wrap_text(text, fig.get_figwidth() - 0.3)
    fig.suptitle(wrapped, fontsize=TITLE)
    return 1 - (0.12 + 0.2 * (wrapped.count("\n") + 1)) / fig.get_figheight()


def panel_title(ax, text: str, width_in: float, size: int = TITLE, **kwargs) -> None:
    ax.set_title(wrap_text(text, width_in, size), fontsize=size, **kwargs)


def tick_style(ax, size: int = SMALL) -> None:
    ax.tick_params(labelsize=size)


def pick_rows(frame: pd.DataFrame, column: str, value: Any, what: str) -> tuple[pd.DataFrame, Any, str | None]:
    """Rows with ``column == value`` (``value`` None: the first value in file order). Returns the rows,
    the value used, and a reason when nothing matched."""
    if column not in frame.columns:
        return frame, None, None
    if value is None:
        values = [v for v in pd.unique(frame[column]) if not is_missing(v)]
        if not values:
            return frame.iloc[0:0], None, f"no {what}"
        value = values[0]
    sub = frame[frame[column] == value]
    return sub, value, (None if len(sub) else f"no rows with {column} = {value!r}")


def draw_heatmap(
    ax,
    matrix: np.ndarray,
    vmin: float,
    vmax: float,
    fmt: str | None,
    cmap_name: str = "viridis",
    fontsize: int = SMALL,
    aspect: str = "auto",
):
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
            ax.text(
                j,
                i,
                fmt.format(value),
                ha="center",
                va="center",
                fontsize=fontsize,
                color="black" if share > 0.55 else "white",
            )
        else:
            ax.text(j, i, "–", ha="center", va="center", fontsize=fontsize, color="#555555")
    return image


def add_legend(ax_or_fig, handles, labels, title: str | None = None, **kwargs):
    kwargs.setdefault("fontsize", SMALL)
    kwargs.setdefault("frameon", False)
    legend = ax_or_fig.legend(handles, labels, title=title, **kwargs)
    if title:
        legend.get_title().set_fontsize(SMALL)
    return legend


def table_panel(
    ax, rows: list[list[str]], header: list[str], col_widths: Sequence[float], shaded: Sequence[bool], shade: str
):
    """A table drawn as a figure, in the house style: small text, grey bold header row, light cell
    edges, and the body rows where ``shaded`` is true filled with ``shade``."""
    table = ax.table(
        cellText=rows, colLabels=header, colWidths=list(col_widths), loc="upper center", cellLoc="left", colLoc="left"
    )
    table.auto_set_font_size(False)
    table.set_fontsize(SMALL)
    table.scale(1, 1.35)
    for (r, _c), cell in table.get_celld().items():
        cell.PAD = 0.03
        cell.set_edgecolor("#CCCCCC")
        if r == 0:
            cell.set_facecolor("#E8E8E8")
            cell.get_text().set_fontweight("bold")
        elif shaded[r - 1]:
            cell.set_facecolor(shade)
    return table


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
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None and getattr(fig.canvas, "manager", None) is not None:
        pyplot.close(fig)
