"""A synthetic corpus shaped as StereoTales' released stories, for the import's tests and ``make bench-import``.

It is written the way the release was exported (facts of the reference's exporter,
``scripts/export_run_outputs_to_stereotales.py``): one list of prompts ("samples") per language folder,
answered by every model, so a ``sample_id`` and an ``output_id`` (the id of one requested generation) recur
once per model; the ``additional_en`` prompts (templates neutral / negative / positive, language ``en``, no
scenario) ask for several stories each. A folder's rows run model after model (models and samples in sorted
order); a model whose answer came back empty has no row (``skipped_share`` of the outputs, for every model
but the first). Each folder's column types are those of its first row, so a column that row leaves empty
(the scenario columns of additional_en) has Arrow's null type, and ``extraction_score`` is a float in the
language folders and an integer in additional_en. Shards ``<folder>/stories/eval-NNNNN-of-NNNNN.parquet``
hold at most ``shard_rows`` rows; Dutch is ``du``.

The extractions carry what the import must handle: localized prompted values in French, the two published
spellings that differ from the reference's labels, empty (``{}``) and unparsable extractions. One
association is planted: a man's profession is trades and manual labor, a woman's healthcare and medicine,
with probability ``planted_share`` (otherwise uniform), in the stories prompted with gender. Every other
extracted value is drawn uniformly among the dimension's labels and ``unknown``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from storybias.config.corpus import ADDITIONAL_FOLDER, ADDITIONAL_TEMPLATES, RELEASED_COLUMNS, SCENARIO_TEMPLATE
from storybias.evidence.stereotales_taxonomy import reference_taxonomy

FRENCH_GENDER = {"man": "homme", "woman": "femme", "non_binary": "personne non binaire"}
# the release's spellings of two labels (the reference's attributes.en.yaml has the other)
RELEASE_SPELLING = {
    ("geographic_origin", "north_america"): "north america (e.g. United States, Canada, etc)",
    ("professional_field", "trades_manual_labor"): "trades and manual labor",
}
PLANTED = {"man": "trades_manual_labor", "woman": "healthcare_medicine"}
SENTENCE = "Once upon a time the protagonist walked through the town and thought about the day ahead. "


@dataclass(frozen=True)
class Sample:
    """One prompt of a folder's samples file: what it fixes and the ids of the generations it asked for."""

    sample_id: str
    attribute: str
    key: str  # the prompted value's canonical key
    scenario: str | None  # storybias' scenario key; None for additional_en
    template: str
    output_ids: tuple[str, ...]


@dataclass(frozen=True)
class Options:
    """What the rows carry besides their prompt (see :func:`write_synthetic_corpus`)."""

    planted_share: float
    broken_share: float
    empty_share: float
    skipped_share: float
    story: str


def _uuid(rng: np.random.Generator) -> str:
    return str(uuid.UUID(int=int(rng.integers(2**63)) << 64 | int(rng.integers(2**63))))


def _label(rng: np.random.Generator, attribute: str, key: str) -> str:
    """A value's published label, in either spelling where the release differs from the reference."""
    spelled = RELEASE_SPELLING.get((attribute, key))
    if spelled is not None and rng.random() < 0.5:
        return spelled
    return str(reference_taxonomy()["dimensions"][attribute][key]["value"])


def _profile(rng: np.random.Generator, attribute: str, value: str, planted_share: float) -> dict[str, str]:
    taxonomy = reference_taxonomy()["dimensions"]
    profile = {}
    for dimension, values in taxonomy.items():
        keys = [*values, "unknown"]
        profile[dimension] = str(keys[rng.integers(len(keys))])
    profile[attribute] = value
    planted = PLANTED.get(profile["gender"]) if attribute == "gender" else None
    if planted is not None and rng.random() < planted_share:
        profile["professional_field"] = planted
    return {d: ("unknown" if k == "unknown" else _label(rng, d, k)) for d, k in profile.items()}


def _extraction(rng: np.random.Generator, sample: Sample, options: Options) -> str:
    draw = rng.random()
    if draw < options.broken_share / 2:
        return "{}"  # no extraction: the exporter writes an empty object
    if draw < options.broken_share:
        return '{"gender": "man", '  # cut off: not JSON
    return json.dumps(_profile(rng, sample.attribute, sample.key, options.planted_share), ensure_ascii=False)


def _prompts(attributes: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(attribute, value key, scenario key) of every prompt of the given base attributes, the values of
    one scenario next to each other (so a folder of any size holds each value about equally often)."""
    taxonomy = reference_taxonomy()
    return [
        (attribute, key, scenario)
        for scenario in taxonomy["scenarios"]
        for attribute in attributes
        for key, words in taxonomy["dimensions"][attribute].items()
        if "prompt" in words
    ]


def _samples(folder: str, n: int, attributes: tuple[str, ...], outputs: int, rng: np.random.Generator) -> list[Sample]:
    """A folder's samples file, sorted by sample id (the order of the exporter's sorted JSON files)."""
    prompts = _prompts(attributes)
    samples = []
    for i in range(n):
        attribute, key, scenario = prompts[i % len(prompts)]
        if folder == ADDITIONAL_FOLDER:
            template = ADDITIONAL_TEMPLATES[(i // len(prompts)) % len(ADDITIONAL_TEMPLATES)]
            ids = tuple(_uuid(rng) for _ in range(outputs))
            samples.append(Sample(_uuid(rng), attribute, key, None, template, ids))
        else:
            samples.append(Sample(_uuid(rng), attribute, key, scenario, SCENARIO_TEMPLATE, (_uuid(rng),)))
    return sorted(samples, key=lambda s: s.sample_id)


def _row(folder: str, model: str, sample: Sample, output_id: str, rng: np.random.Generator, options: Options) -> dict:
    """One released row, as the exporter writes it from a model's answer to one generation of ``sample``."""
    taxonomy = reference_taxonomy()
    language = "en" if folder == ADDITIONAL_FOLDER else folder
    english = str(taxonomy["dimensions"][sample.attribute][sample.key]["value"])
    localized = FRENCH_GENDER.get(sample.key, english) if language == "fr" and sample.attribute == "gender" else english
    scenario = None if sample.scenario is None else str(taxonomy["scenarios"][sample.scenario])
    return {
        "sample_id": sample.sample_id,
        "output_id": output_id,
        "generator_model": model,
        "language": language,
        "target_attribute": sample.attribute,
        "target_attribute_value": localized,
        "attribute_value_key": english,
        "scenario": None if scenario is None else f"{scenario} ({language})",
        "scenario_key": scenario,
        "scenario_group": None if scenario is None else "group",
        "character": f"{localized} character",
        "prompt_template": sample.template,
        "user_prompt": f"Write a {sample.template} story about {localized} {scenario or ''}.",
        "story": "" if rng.random() < options.empty_share else options.story,
        "extraction_score": 1 if folder == ADDITIONAL_FOLDER else float(rng.random()),
        "extracted_attributes_json": _extraction(rng, sample, options),
    }


def _folder_table(
    folder: str, models: tuple[str, ...], samples: list[Sample], rng: np.random.Generator, options: Options
) -> pa.Table:
    """Every model's rows of one folder, model after model, typed as the folder's first row is."""
    columns: dict[str, list[Any]] = {c: [] for c in RELEASED_COLUMNS}
    first: dict[str, Any] | None = None
    for m, model in enumerate(sorted(models)):
        for sample in samples:
            for output_id in sample.output_ids:
                if m > 0 and rng.random() < options.skipped_share:
                    continue  # the model's answer had no choices: the exporter writes no row
                row = _row(folder, model, sample, output_id, rng, options)
                first = first or row
                for column, value in row.items():
                    columns[column].append(value)
    if first is None:
        raise ValueError(f"synthetic corpus: folder {folder} has no row (no sample or every output skipped)")
    return pa.table(columns, schema=pa.Table.from_pylist([first]).schema)


def write_synthetic_corpus(
    root: Path,
    models: tuple[str, ...] = ("anthropic/claude-opus-4-6", "azure_ai/gpt-4o"),
    folders: tuple[str, ...] = ("en", "fr", ADDITIONAL_FOLDER),
    samples_per_folder: int = 200,
    additional_outputs: int = 3,
    attributes: tuple[str, ...] = ("gender",),
    shard_rows: int = 50_000,
    seed: int = 0,
    planted_share: float = 0.8,
    broken_share: float = 0.04,
    empty_share: float = 0.0,
    skipped_share: float = 0.0,
    sentences: int = 3,
) -> list[Path]:
    """Write the corpus under ``root``; returns the shard files. Each folder has ``samples_per_folder``
    prompts answered by every model: one story each, ``additional_outputs`` each in additional_en."""
    options = Options(planted_share, broken_share, empty_share, skipped_share, SENTENCE * sentences)
    files = []
    for index, folder in enumerate(folders):
        rng = np.random.default_rng([seed, index])
        outputs = additional_outputs if folder == ADDITIONAL_FOLDER else 1
        table = _folder_table(
            folder, models, _samples(folder, samples_per_folder, attributes, outputs, rng), rng, options
        )
        n_shards = max(1, -(-len(table) // shard_rows))
        for i in range(n_shards):
            path = root / folder / "stories" / f"eval-{i:05d}-of-{n_shards:05d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table.slice(i * shard_rows, shard_rows), path)
            files.append(path)
    return files
