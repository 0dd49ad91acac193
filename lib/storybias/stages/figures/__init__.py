"""Stage 08 figures: one function per figure of the three studies, drawn from the stage artifacts.

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

Stage 08's :func:`run` draws every figure of :data:`FIGURE_SPECS` (``registry``: each figure's stem,
description, the artifacts it reads, drawing call and quoted sentence, declared once; :data:`FIGURES`
lists the stable file stems in notebook order, :data:`FIGURE_READS` what they read; each figure is given
only its declared reads) from the run's artifacts, saves them, writes ``figures.json`` and returns the
``StageResult`` every stage returns; notebook 08 shows each figure with ``result["gallery"].display(stem)``.

The package has one module per stage whose artifacts the figures draw: ``generation`` (stages 02-03),
``associations`` (04; ``judges`` for its judges against the human panel and ``findings`` for its
headline counts), ``metrics`` (05; ``metrics_jsd`` and ``metrics_feng`` draw some of its figures and
are re-exported by it), ``probes`` (06; likewise ``probes_umap`` and ``probes_advantage``) and
``crosslens`` (07's cross-lens tables); the shared ``style`` (sizes, palettes, saving, and the
empty-input guard every figure uses: ``style.no_data_figure`` / ``style.message_panel``), and ``gallery``
(stage 08's artifacts and manifests, quoting and index). This module re-exports their public names:
``from storybias.stages import figures as plots; plots.vsr_heatmap(...)``.
"""

from __future__ import annotations

from storybias.config.params import Params
from storybias.core import paths
from storybias.core.locks import holds_run_lock
from storybias.core.results import StageResult
from storybias.stages.figures.associations import (
    association_counts,
    association_label,
    lift_share_plot,
    power_reason,
    top_associations_table,
)
from storybias.stages.figures.crosslens import crosslens_heatmap
from storybias.stages.figures.findings import headline_findings
from storybias.stages.figures.gallery import (
    ARTIFACT_NAMES,
    MANIFEST_NAMES,
    Artifacts,
    Gallery,
    load_artifacts,
    quote_stats,
)
from storybias.stages.figures.generation import attribute_distributions, vsr_heatmap
from storybias.stages.figures.judges import HARM_GAP_KEY, HUMAN_SUMMARY_KEY, SELF_JUDGEMENT_KEY, harm_agreement
from storybias.stages.figures.metrics import (
    anova_table,
    balance_stereotype,
    bias_fingerprints,
    cosine_heatmaps,
    distinctive_words,
    glm_table,
    jsd_by_grammatical_gender,
    vsr_vs_jsd,
)
from storybias.stages.figures.probes import (
    HDR_LEVELS,
    MIN_KDE_POINTS,
    SUBSET_ADVANTAGE,
    SUBSET_SELF_HIGHEST,
    UMAP_DISPLAY_PERCENTILES,
    cultural_relevance,
    probe_auc,
    self_context_advantage,
    separability,
    trim_for_display,
    umap_density,
)
from storybias.stages.figures.registry import FIGURE_READS, FIGURE_SPECS, FIGURES, FigureSpec, figure_list
from storybias.stages.figures.style import DPI, LABEL, SMALL, TITLE, message_panel, save_figure

__all__ = [
    "ARTIFACT_NAMES",
    "DPI",
    "FIGURES",
    "FIGURE_READS",
    "FIGURE_SPECS",
    "HARM_GAP_KEY",
    "HDR_LEVELS",
    "HUMAN_SUMMARY_KEY",
    "LABEL",
    "MANIFEST_NAMES",
    "MIN_KDE_POINTS",
    "SELF_JUDGEMENT_KEY",
    "SMALL",
    "SUBSET_ADVANTAGE",
    "SUBSET_SELF_HIGHEST",
    "TITLE",
    "UMAP_DISPLAY_PERCENTILES",
    "Artifacts",
    "FigureSpec",
    "Gallery",
    "anova_table",
    "association_counts",
    "association_label",
    "attribute_distributions",
    "balance_stereotype",
    "bias_fingerprints",
    "cosine_heatmaps",
    "crosslens_heatmap",
    "cultural_relevance",
    "distinctive_words",
    "figure_list",
    "glm_table",
    "harm_agreement",
    "headline_findings",
    "jsd_by_grammatical_gender",
    "lift_share_plot",
    "load_artifacts",
    "message_panel",
    "power_reason",
    "probe_auc",
    "quote_stats",
    "run",
    "save_figure",
    "self_context_advantage",
    "separability",
    "top_associations_table",
    "trim_for_display",
    "umap_density",
    "vsr_heatmap",
    "vsr_vs_jsd",
]


@holds_run_lock("figures")
def run(params: Params) -> StageResult:
    """Stage 08: read the run's artifacts, draw and save every figure of :data:`FIGURE_SPECS` (PNG + PDF in
    figures/<run>/), write ``figures.json`` last (Make's target) and return the result: ``figures`` (one row
    per figure: files and the quoted statistics), ``gallery`` (shows a saved figure), ``artifacts`` (the
    tables drawn), the index as manifest, the values notebook 08 records, and a note per missing artifact."""
    art = load_artifacts(params.run_name)
    gallery = Gallery(paths.figures_dir(params.run_name), dpi=params.figures.dpi)
    for spec in FIGURE_SPECS:
        fig, stats = spec.draw(art.only(spec.reads), params)  # what it declares, nothing else
        gallery.save(spec.stem, fig, stats, quote=spec.quote)
    settings = params.resolved()["figures"]
    gallery.write_index(params=settings)
    return StageResult(
        "figures",
        params.run_name,
        tables={"figures": gallery.table()},
        manifest=gallery.index(settings),
        values=gallery.values(),
        notes=list(art.notes),
        details={"gallery": gallery, "artifacts": art},
    )
