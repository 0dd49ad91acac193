"""A synthetic corpus in StereoTales' released schema, for the import's tests and ``make bench-import``.

The shards have every released column (``storybias.config.corpus.RELEASED_COLUMNS``), the release's folder
layout (``<folder>/stories/eval-NNNNN-of-NNNNN.parquet``, at most ``shard_rows`` rows each, Dutch in ``du``,
the English variants in ``additional_en``), litellm model ids, localized prompted values in French, the two
published spellings that differ from the reference's labels, empty (``{}``) and unparsable extractions.

One association is planted: a man's profession is trades and manual labor, a woman's healthcare and
medicine, with probability ``planted_share`` (otherwise uniform), in the stories prompted with gender.
Every other extracted value is drawn uniformly among the dimension's labels and ``unknown``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from storybias.config.corpus import ADDITIONAL_FOLDER, RELEASED_COLUMNS
from storybias.evidence.published import reference_taxonomy

FRENCH_GENDER = {"man": "homme", "woman": "femme", "non_binary": "personne non binaire"}
# the release's spellings of two labels (the reference's attributes.en.yaml has the other)
RELEASE_SPELLING = {
    ("geographic_origin", "north_america"): "north america (e.g. United States, Canada, etc)",
    ("professional_field", "trades_manual_labor"): "trades and manual labor",
}
PLANTED = {"man": "trades_manual_labor", "woman": "healthcare_medicine"}
SENTENCE = "Once upon a time the protagonist walked through the town and thought about the day ahead. "


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


def _extraction(rng: np.random.Generator, attribute: str, value: str, planted_share: float, broken: float) -> str:
    draw = rng.random()
    if draw < broken / 2:
        return "{}"
    if draw < broken:
        return '{"gender": "man", '  # cut off: not JSON
    return json.dumps(_profile(rng, attribute, value, planted_share), ensure_ascii=False)


def _prompts(attributes: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(attribute, value key, scenario key) of every prompt of the given base attributes, the values of
    one scenario next to each other (so a cell of any size holds each value about equally often)."""
    taxonomy = reference_taxonomy()
    return [
        (attribute, key, scenario)
        for scenario in taxonomy["scenarios"]
        for attribute in attributes
        for key, words in taxonomy["dimensions"][attribute].items()
        if "prompt" in words
    ]


def _rows(folder: str, model: str, n: int, rng: np.random.Generator, options: dict) -> dict[str, list]:
    language = "en" if folder == ADDITIONAL_FOLDER else folder
    taxonomy = reference_taxonomy()
    prompts = _prompts(options["attributes"])
    columns: dict[str, list] = {c: [] for c in RELEASED_COLUMNS}
    for i in range(n):
        attribute, key, scenario = prompts[i % len(prompts)]
        english = str(taxonomy["dimensions"][attribute][key]["value"])
        additional = folder == ADDITIONAL_FOLDER
        localized = FRENCH_GENDER.get(key, english) if language == "fr" and attribute == "gender" else english
        text = "" if rng.random() < options["empty_share"] else SENTENCE * options["sentences"]
        row = {
            "sample_id": str(uuid.UUID(int=int(rng.integers(2**63)) << 64 | i)),
            "output_id": str(uuid.UUID(int=int(rng.integers(2**63)))),
            "generator_model": model,
            "language": language,
            "target_attribute": attribute,
            "target_attribute_value": localized,
            "attribute_value_key": english,
            "scenario": None if additional else f"{taxonomy['scenarios'][scenario]} ({language})",
            "scenario_key": None if additional else taxonomy["scenarios"][scenario],
            "scenario_group": None if additional else "group",
            "character": f"{localized} character",
            "prompt_template": ("neutral", "negative", "positive")[i % 3] if additional else "scenario_based",
            "user_prompt": f"Write a story about {localized} {taxonomy['scenarios'][scenario]}.",
            "story": text,
            "extraction_score": 1.0,
            "extracted_attributes_json": _extraction(
                rng, attribute, key, options["planted_share"], options["broken_share"]
            ),
        }
        for column, value in row.items():
            columns[column].append(value)
    return columns


def write_synthetic_corpus(
    root: Path,
    models: tuple[str, ...] = ("anthropic/claude-opus-4-6", "azure_ai/gpt-4o"),
    folders: tuple[str, ...] = ("en", "fr", ADDITIONAL_FOLDER),
    rows_per_cell: int = 200,
    attributes: tuple[str, ...] = ("gender",),
    shard_rows: int = 50_000,
    seed: int = 0,
    planted_share: float = 0.8,
    broken_share: float = 0.04,
    empty_share: float = 0.0,
    sentences: int = 3,
) -> list[Path]:
    """Write the corpus under ``root``; returns the shard files. ``rows_per_cell`` stories per model x folder."""
    rng = np.random.default_rng(seed)
    options = dict(
        attributes=attributes,
        planted_share=planted_share,
        broken_share=broken_share,
        empty_share=empty_share,
        sentences=sentences,
    )
    schema = pa.schema([(c, pa.float64() if c == "extraction_score" else pa.string()) for c in RELEASED_COLUMNS])
    files = []
    for folder in folders:
        table = pa.concat_tables(
            pa.table(_rows(folder, model, rows_per_cell, rng, options), schema=schema) for model in models
        )
        n_shards = max(1, -(-len(table) // shard_rows))
        for i in range(n_shards):
            path = root / folder / "stories" / f"eval-{i:05d}-of-{n_shards:05d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table.slice(i * shard_rows, shard_rows), path)
            files.append(path)
    return files
