"""Notebook 08's plumbing: the figure registry (:data:`FIGURES`, stable file stems in notebook order),
the run's artifacts read in one call, statistics quoted into text, and the ``Gallery`` that saves,
shows and indexes the figures (``figures.json``)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from storybias.core import artifacts
from storybias.core.io import record_values, write_json_atomic
from storybias.stages.figures.style import DPI, is_missing, save_figure

# Registry: stable file stems in notebook order, with what each figure shows.
FIGURES: list[tuple[str, str]] = [
    ("01_vsr_heatmap", "Valid-story rate (%) by prompt language x model (BiasedTales-ML Table 3 / App. C)"),
    (
        "02_attribute_distributions",
        "Extracted protagonist attributes per model (StereoTales) and protagonist gender per model x design",
    ),
    (
        "03_association_counts",
        "Significant value-level associations per model (all languages) and per language scope (StereoTales)",
    ),
    (
        "04_top_associations_table",
        "Top associations shared across models: mean lift, models sharing, median harm (StereoTales)",
    ),
    ("05_lift_share", "Mean lift vs number of models sharing each association, coloured by median harm (StereoTales)"),
    (
        "06_bias_fingerprints",
        "Bias fingerprints: S_C per adjective category, one polygon per language, "
        "one panel per model (BiasedTales-ML Fig. 2)",
    ),
    ("07_cosine_heatmaps", "Cross-lingual cosine similarity of S_C vectors per model (BiasedTales-ML Fig. 3)"),
    ("08_jsd_grammatical_gender", "JSD by grammatical-gender group per model (BiasedTales-ML Fig. 4)"),
    (
        "09_distinctive_words",
        "Most distinctive words per model, field and group, log-odds z (BiasedTales-ML Fig. 5, 10-12)",
    ),
    ("10_vsr_vs_jsd", "Valid-story rate vs JSD per model x language (BiasedTales-ML Fig. 6)"),
    ("11_balance_stereotype", "Balance M_b vs stereotype M_s per language, 1-sd ellipse per task (Feng et al. Fig. 2)"),
    ("12_anova_table", "Type-I ANOVA of M_s and M_b (Feng et al. Sec. 3.3.1, App. C)"),
    (
        "13_umap_density",
        "Shared UMAP of story embeddings with female/male density contours per language x genre (Feng et al. Fig. 3)",
    ),
    ("14_probe_auc", "Identity-label probe AUC, full text vs cue-deleted, per language x genre (Feng et al. Table 1)"),
    ("15_cultural_relevance", "Cultural-marker relevance by source language x context per genre (Feng et al. Fig. 5)"),
    ("16_separability", "Source-language separability: balanced accuracy per marker version (Feng et al. Sec. 4.3)"),
    (
        "17_crosslens",
        "The three lenses per model x language, standardised per measure, and the most / least concordant "
        "pair of measures (storybias, issue #30)",
    ),
    (
        "18_harm_agreement",
        "Human vs LLM-judge harm: median harm per association with Spearman rho, the harm gap per base "
        "attribute, and each judge's ratings of its own associations against the other judges' (StereoTales)",
    ),
    (
        "19_self_context_advantage",
        "Self-context advantage per source language x genre with bootstrap CI, and on the high-agreement "
        "marker subset when human ratings are given (Feng et al. Eq. 5, Sec. 4.3)",
    ),
    (
        "20_glm_table",
        "Trial-level binomial GLMs of the female and identified shares: Wald tests per term (Feng et al. App. C)",
    ),
    (
        "21_headline_findings",
        "Significant and harmful associations per model (pooled) and per model x language, with the "
        "language-only harmful ones: StereoTales' findings 1 and 3 on the run",
    ),
]


# --- notebook 08: artifacts in, figures + index out -----------------------------------------------

ARTIFACT_NAMES: tuple[str, ...] = (
    # everything notebook 08 reads: names in storybias.core.artifacts (the registry says where each file lives)
    "vsr",
    "filtered",
    "extractions",
    "associations_values",
    "associations_shared",
    "associations_findings",
    "metrics_sc",
    "metrics_cosine",
    "metrics_jsd",
    "metrics_log_odds",
    "metrics_vsr_jsd",
    "metrics_aggregates",
    "metrics_anova",
    "umap",
    "probes",
    "cultural",
    "separability",
    "associations_power",
    "crosslens",
    "crosslens_agreement",
    "cultural_advantage",
    "metrics_glm",
)

MANIFEST_NAMES: tuple[str, ...] = (
    # the manifests whose values notebook 08 draws (stage 04's human agreement, stage 06's human validation)
    "manifest_associations",
    "manifest_probes",
)


class Artifacts(dict):
    """The run's tables by name, and its manifests (:data:`MANIFEST_NAMES`) in ``manifests``; a missing
    file is an empty table (an empty dict) plus a note saying which stage writes it (the figure then
    says "no data")."""

    def __init__(
        self, tables: dict[str, pd.DataFrame], notes: list[str], manifests: dict[str, dict[str, Any]] | None = None
    ):
        super().__init__(tables)
        self.notes = notes
        self.manifests: dict[str, dict[str, Any]] = dict(manifests or {})

    def manifest_table(self, manifest: str, *keys: str) -> pd.DataFrame:
        """A table a manifest holds as a list of rows, under ``keys`` (e.g. ``manifest_probes``,
        ``human_validation``, ``validation_markers``); empty where a key is missing or None."""
        value: Any = self.manifests.get(manifest, {})
        for key in keys:
            value = value.get(key) if isinstance(value, Mapping) else None
        return pd.DataFrame(value) if isinstance(value, list) and value else pd.DataFrame()


def _missing(path: Path, name: str) -> str:
    stage = artifacts.artifact(name).stage
    return f"{path} is missing: its figures will say 'no data' (stage '{stage}' writes it)"


def load_artifacts(run_name: str) -> Artifacts:

    tables, notes, manifests = {}, [], {}
    for name in ARTIFACT_NAMES:
        path = artifacts.path(run_name, name)
        if path.is_file():
            tables[name] = pd.read_parquet(path)
        else:
            tables[name] = pd.DataFrame()
            notes.append(_missing(path, name))
    for name in MANIFEST_NAMES:
        path = artifacts.path(run_name, name)
        if path.is_file():
            manifests[name] = json.loads(path.read_text(encoding="utf-8"))
        else:
            manifests[name] = {}
            notes.append(_missing(path, name))
    return Artifacts(tables, notes, manifests)


def quote_stats(template: str, stats: Mapping[str, Any]) -> str:
    """Fill ``template`` ("{mean_vsr:.1%}") with ``stats``; a missing or NaN value prints as "n/a"
    (an empty figure's statistics) instead of raising. ``{stats}`` prints every statistic."""

    class _Value:
        def __init__(self, value: Any):
            self.value = value

        def __format__(self, spec: str) -> str:
            if is_missing(self.value):
                return "n/a"
            try:
                return format(self.value, spec)
            except (TypeError, ValueError):
                return str(self.value)

    class _Stats(dict):
        def __missing__(self, key: str) -> _Value:
            return _Value(None)

    values = _Stats({k: _Value(v) for k, v in stats.items()})
    values["stats"] = _Value(
        ", ".join(
            f"{k} = {'n/a' if is_missing(v) else (round(v, 3) if isinstance(v, float) else v)}"
            for k, v in stats.items()
        )
    )
    return template.format_map(values)


def _plain(value: Any) -> Any:
    """JSON-safe statistic: numpy scalars to Python, NaN to None."""
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


class Gallery:
    """Notebook 08's figures: ``show`` saves one (PNG + PDF), displays the PNG and prints its quoted
    statistic; ``write_index`` writes ``figures.json`` (files, statistics, parameters) last, atomically:
    the Make target of the stage."""

    def __init__(self, out_dir: Path, dpi: int = DPI):
        self.out_dir = Path(out_dir)
        self.dpi = dpi
        self.records: list[dict[str, Any]] = []

    def show(
        self, stem: str, fig: Figure, stats: Mapping[str, Any], *, quote: str = "{stats}", display_width: int = 720
    ) -> dict[str, Any]:
        # only inside a notebook, where IPython runs
        from IPython.display import Image, display

        files = save_figure(fig, self.out_dir, stem, dpi=self.dpi)
        text = quote_stats(quote, stats)
        no_data = bool(stats.get("no_data")) or not stats  # the reason, set by no_data_figure
        record = {
            "stem": stem,
            "files": [p.name for p in files],
            "quote": text,
            "no_data": bool(no_data),
            "stats": {k: _plain(v) for k, v in stats.items()},
        }
        self.records = [r for r in self.records if r["stem"] != stem] + [record]
        display(Image(filename=str(files[0]), width=display_width))
        print(text)
        return record

    def write_index(self, params: Mapping[str, Any] | None = None) -> Path:

        described = dict(FIGURES)
        index = {
            "figures": [{**r, "description": described.get(r["stem"], "")} for r in self.records],
            "params": dict(params or {}),
        }
        return write_json_atomic(index, self.out_dir / "figures.json")

    def record(self, run_name: str) -> dict[str, Any]:
        """The values notebook 08 records (data/<run>/values/figures.json): how many figures, how many
        say "no data", their stems."""
        return record_values(
            run_name,
            "figures",
            n_figures=len(self.records),
            n_no_data=sum(r["no_data"] for r in self.records),
            stems=[r["stem"] for r in self.records],
        )

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(
            [{"figure": r["stem"], "files": ", ".join(r["files"]), "shows": r["quote"]} for r in self.records]
        )
