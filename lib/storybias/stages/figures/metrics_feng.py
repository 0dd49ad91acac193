"""Figures of stage 05's Feng et al. tables: the balance / stereotype scatter per language (with a
1-sd covariance ellipse per task), the Type-I ANOVA table and the trial-level binomial GLMs of their
Appendix C as a table (``metrics_glm.parquet``). Re-exported by :mod:`storybias.stages.figures.metrics`."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Ellipse, Patch

from storybias.config.prompts import LANGUAGES
from storybias.stages.figures.style import (
    GENRE_ORDER,
    LABEL,
    MARKERS,
    SMALL,
    add_legend,
    category_colors,
    figure_title,
    is_empty,
    is_missing,
    language_order,
    new_figure,
    no_data_figure,
    ordered,
    panel_grid,
    panel_title,
    require_columns,
    shorten,
    table_panel,
    tick_style,
)

# --- stereotype and balance ---------------------------------------------------------------------

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
    if is_empty(aggregates):
        return no_data_figure(title, "metrics_aggregates table is empty (no parsed occupations outputs)", _BS_KEYS)
    require_columns(aggregates, ["model", "language", "task", "m_s", "m_b"], "metrics_aggregates")
    sub = aggregates[aggregates["denominator"] == denominator] if "denominator" in aggregates.columns else aggregates
    sub = sub.dropna(subset=["m_s", "m_b"])
    if sub.empty:
        return no_data_figure(title, f"no rows with denominator = {denominator!r} and both scores", _BS_KEYS)
    languages = language_order(sub["language"])
    tasks = ordered(sub["task"], GENRE_ORDER)
    colors = dict(zip(tasks, category_colors(len(tasks))))
    markers = {t: MARKERS[i % len(MARKERS)] for i, t in enumerate(tasks)}
    fig, axes, _, _ = panel_grid(len(languages), ncols, 3.6, 3.5, extra_h=1.0)
    n_ellipses = 0
    for ax, lang in zip(axes, languages):
        n_ellipses += _bs_panel(ax, sub[sub["language"] == lang], lang, tasks, colors, markers)
    handles: list[Artist] = [
        Line2D([], [], marker=markers[t], ls="", color=colors[t], markeredgecolor="black") for t in tasks
    ]
    handles.append(Patch(facecolor=(0.5, 0.5, 0.5, 0.18), edgecolor="#555555"))
    add_legend(
        fig,
        handles,
        [str(t) for t in tasks] + ["1-sd ellipse over models (≥ 3)"],
        title="task",
        loc="lower center",
        ncol=len(handles),
        bbox_to_anchor=(0.5, 0.0),
    )
    top = figure_title(fig, f"{title} (one point per model × task; denominator: {denominator})")
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


def _bs_panel(ax: Axes, part: pd.DataFrame, lang: Any, tasks: list, colors: dict, markers: dict) -> int:
    """One language's panel: zero lines, each task's ellipse (when it has one) and points, the
    fixed ±1.05 square axes. Returns the number of ellipses drawn."""
    n_ellipses = 0
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
    tick_style(ax)
    return n_ellipses


_ANOVA_KEYS = ("n_rows", "n_significant", "max_partial_omega_sq", "max_partial_omega_sq_term")


def _p(value: Any) -> str:
    if is_missing(value):
        return "–"
    return "< .001" if value < 0.001 else f"{value:.3f}".lstrip("0") if value < 1 else f"{value:.2f}"


def anova_table(anova: pd.DataFrame, alpha: float = 0.05) -> tuple[Figure, dict]:
    """A table of the Type-I ANOVA rows (denominator, subset, outcome, term, df, F, p, BH-adjusted p,
    partial ω²), rows with adjusted p < ``alpha`` shaded; notes of the specifications below.

    stats: ``n_rows``, ``n_significant`` (adjusted p < alpha), ``max_partial_omega_sq`` and
    ``max_partial_omega_sq_term`` ("outcome: term (subset; denominator)")."""
    title = "Type-I ANOVA of the stereotype (m_s) and balance (m_b) aggregates"
    if is_empty(anova):
        return no_data_figure(
            title, "metrics_anova table is empty (too few models, languages or tasks to test)", _ANOVA_KEYS
        )
    require_columns(anova, ["outcome", "term", "df", "F", "p_value", "p_adjusted", "partial_omega_sq"], "metrics_anova")
    data = anova.copy()
    for column in ("denominator", "subset"):
        if column not in data.columns:
            data[column] = "–"
    data = data.sort_values(["denominator", "subset", "outcome"], kind="stable").reset_index(drop=True)
    rows = []
    for _, r in data.iterrows():
        df = "–" if is_missing(r["df"]) else f"{int(r['df'])}"
        if "df_resid" in data.columns and not is_missing(r["df_resid"]) and df != "–":
            df += f", {int(r['df_resid'])}"
        rows.append(
            [
                str(r["denominator"]),
                str(r["subset"]),
                str(r["outcome"]),
                str(r["term"]),
                df,
                "–" if is_missing(r["F"]) else f"{r['F']:.2f}",
                _p(r["p_value"]),
                _p(r["p_adjusted"]),
                "–" if is_missing(r["partial_omega_sq"]) else f"{r['partial_omega_sq']:.3f}",
            ]
        )
    notes = []
    if "note" in data.columns:
        notes = [n for n in pd.unique(data["note"].dropna()) if str(n).strip()]
    header = ["denominator", "subset", "outcome", "term", "df (effect, resid.)", "F", "p", "p (BH)", "partial ω²"]
    fig = new_figure(10.0, 0.8 + 0.26 * (len(rows) + 1) + 0.25 * len(notes))
    ax = fig.add_subplot()
    ax.axis("off")
    significant = (pd.to_numeric(data["p_adjusted"], errors="coerce") < alpha).to_numpy()
    table_panel(ax, rows, header, [0.14, 0.13, 0.08, 0.14, 0.13, 0.08, 0.08, 0.08, 0.1], significant, "#DCEAF7")
    for i, note in enumerate(notes):
        ax.text(
            0.0,
            -0.02 - 0.25 * i / max(1.0, fig.get_figheight() - 1.0),
            f"note: {shorten(note, 150)}",
            transform=ax.transAxes,
            fontsize=SMALL,
            va="top",
        )
    panel_title(ax, f"{title}; shaded: BH-adjusted p < {alpha}", fig.get_figwidth() - 0.6)
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


# --- trial-level GLMs (App. C) ------------------------------------------------------------------

_GLM_KEYS = ("n_rows", "n_terms", "n_significant", "n_negative_chi2", "max_chi2", "max_chi2_term", "p_column")
_NEGATIVE_NOTE = (
    "† Wald χ² < 0: the term's cluster-robust variance is numerically not positive (few clusters or near-separation), "
    "so χ² and p are unusable"
)
_OUTCOMES = {"female": "female (vs male)", "identified": "identified (vs unknown)"}


def _term(term: Any) -> str:
    """'C(language, Sum):C(task, Sum)' -> 'language × genre' (the GLMs' task is the genre)."""
    text = re.sub(r"C\((\w+)(?:,\s*\w+)?\)", r"\1", str(term)).replace(":", " × ")
    return re.sub(r"\btask\b", "genre", text)


def glm_table(glm: pd.DataFrame, alpha: float = 0.05) -> tuple[Figure, dict]:
    """Feng et al.'s trial-level binomial GLMs (App. C: female vs male among identified protagonists,
    and identified vs not, on the story and news outputs, cluster-robust covariance by model x
    occupation) as a table: outcome, term, df, Wald χ², p, BH-adjusted p (when the table has
    ``p_adjusted``; stage 05 writes none, and Feng et al. report these p unadjusted), trials. Term
    rows with p (adjusted when there) < ``alpha`` are shaded; intercept rows are shown in grey and
    never shaded (not a term test). A negative Wald χ² (the cluster-robust covariance is not positive
    definite for the term, as with few clusters) is flagged with † and its row never shaded.

    stats: ``n_rows``, ``n_terms`` (rows other than the intercepts), ``n_significant``,
    ``n_negative_chi2``, ``max_chi2`` and ``max_chi2_term`` ("outcome: term"), ``p_column``."""
    title = "Trial-level binomial GLMs: Wald tests per term (Feng et al. App. C)"
    if is_empty(glm):
        return no_data_figure(
            title,
            "metrics_glm table is empty (no story or news trials to model; manifest_metrics.json says why)",
            _GLM_KEYS,
        )
    require_columns(glm, ["outcome", "term", "chi2", "p_value", "df"], "metrics_glm")
    data = glm.reset_index(drop=True)
    p_column = "p_adjusted" if "p_adjusted" in data.columns else "p_value"
    chi2 = pd.to_numeric(data["chi2"], errors="coerce")
    intercept = data["term"].astype(str).str.lower().eq("intercept").to_numpy()
    negative = (chi2 < 0).to_numpy()
    significant = (pd.to_numeric(data[p_column], errors="coerce") < alpha).to_numpy() & ~intercept & ~negative
    rows = [_glm_row(r, "p_adjusted" in data.columns) for _, r in data.iterrows()]
    header = ["outcome", "term", "df", "Wald χ²", "p", "p (BH)", "trials"]
    notes = ["no coefficient estimates or odds ratios in metrics_glm: one Wald test per term"]
    if negative.any():
        notes.insert(0, _NEGATIVE_NOTE)
    height = 0.75 + 0.24 * (len(rows) + 1) + 0.2 * len(notes)
    fig = new_figure(8.6, height)
    ax = fig.add_subplot()
    ax.axis("off")
    table = table_panel(ax, rows, header, [0.22, 0.3, 0.06, 0.12, 0.1, 0.1, 0.1], significant, "#DCEAF7")
    for (r, _c), cell in table.get_celld().items():
        if r > 0 and intercept[r - 1]:
            cell.get_text().set_color("#777777")
    adjusted = "BH-adjusted p" if p_column == "p_adjusted" else "p"
    unadjusted = "" if p_column == "p_adjusted" else " (metrics_glm has no BH-adjusted p)"
    panel_title(ax, f"{title}; shaded: {adjusted} < {alpha}{unadjusted}", fig.get_figwidth() - 0.4)
    fig.tight_layout(rect=(0, (0.1 + 0.2 * len(notes)) / height, 1, 1))
    # the notes right under the table (saving crops the blank space below them)
    box = table.get_window_extent().transformed(fig.transFigure.inverted())
    for i, note in enumerate(notes):
        fig.text(box.x0, box.y0 - (0.06 + 0.2 * i) / height, note, fontsize=SMALL, va="top")
    usable = chi2.where(~negative)
    best = data.loc[usable.idxmax()] if usable.notna().any() else None
    stats = {
        "n_rows": int(len(data)),
        "n_terms": int((~intercept).sum()),
        "n_significant": int(significant.sum()),
        "n_negative_chi2": int(negative.sum()),
        "max_chi2": float(usable.max()) if best is not None else float("nan"),
        "max_chi2_term": f"{best['outcome']}: {_term(best['term'])}" if best is not None else None,
        "p_column": p_column,
    }
    return fig, stats


def _glm_row(r: pd.Series, adjusted: bool) -> list[str]:
    chi2 = r["chi2"]
    flag = "†" if not is_missing(chi2) and chi2 < 0 else ""
    return [
        _OUTCOMES.get(str(r["outcome"]), str(r["outcome"])),
        shorten(_term(r["term"]), 40),
        "–" if is_missing(r["df"]) else f"{int(r['df'])}",
        "–" if is_missing(chi2) else f"{chi2:.2f}{flag}",
        _p(r["p_value"]),
        _p(r["p_adjusted"]) if adjusted else "–",
        "–" if "n_trials" not in r.index or is_missing(r["n_trials"]) else f"{int(r['n_trials'])}",
    ]
