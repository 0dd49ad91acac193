"""The ``corpus:`` section of a profile: stories imported from a published corpus instead of generated.

StereoTales (*StereoTales: A Multilingual Framework for Open-Ended Stereotype Discovery in LLMs*, Le Jeune et
al., Giskard AI, 2026, arXiv:2605.10442) released its stories with their extracted profiles as the Hugging
Face dataset ``giskardai/StereoTales`` (an anonymised copy: ``anonymous-authors/StereoTales``, CC-BY-4.0).
Downloaded, its story configs are parquet shards ``<folder>/stories/eval-NNNNN-of-NNNNN.parquet`` of at most
50,000 rows, one folder per language (``en ar du es fr hi it pt uk zh``; Dutch is ``du``) and one for the
English prompt variants (``additional_en``: templates ``neutral``, ``negative``, ``positive``, language
``en``, no scenario). :data:`RELEASED_COLUMNS` are the columns every shard has.

A profile with ``corpus:`` needs no ``generation:`` or ``designs:``: stage 01 imports the stories
(``storybias.stages.generate.corpus``), stage 03 maps the published extractions or extracts again
(``extractions``). storybias never downloads: the user points ``path`` at the folder they downloaded.

This module holds the section and the checks that read only file footers (a second at most), so
``make check-params`` refuses a wrong path, a file that is not parquet or a missing column before any work.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from pydantic import Field, model_validator

from storybias.config import designs
from storybias.config.prompts import CONDITION_COLUMNS
from storybias.config.story_sections import Language, Strict
from storybias.core import paths
from storybias.evidence.released_associations import RELEASE_LANGUAGE

# The released story shards' columns (the reference exporter's order). `extraction_score` is a float,
# every other column a string; a column null in a shard's first row may be stored with Arrow's null type.
RELEASED_COLUMNS = (
    "sample_id",
    "output_id",
    "generator_model",
    "language",
    "target_attribute",
    "target_attribute_value",
    "attribute_value_key",
    "scenario",
    "scenario_key",
    "scenario_group",
    "character",
    "prompt_template",
    "user_prompt",
    "story",
    "extraction_score",
    "extracted_attributes_json",
)
# The prompt template of the per-language scenario prompts; the additional_en variants have others.
SCENARIO_TEMPLATE = "scenario_based"
ADDITIONAL_TEMPLATES = ("neutral", "negative", "positive")
ADDITIONAL_FOLDER = "additional_en"


TABLE_SUFFIXES = (".csv", ".jsonl", ".parquet")


class TableColumns(Strict):
    """``format: table``: which column of the user's table holds what (names as they are in the file)."""

    text: str  # the story
    language: str  # an ISO 639-1 code storybias knows (or the release's du)
    model: str  # the generating model's name
    id: str | None = None  # a stable story id; null: the file and row number
    # the design's condition columns of stories.parquet (e.g. cond_child_gender) -> the table's column
    conditions: dict[str, str] = {}
    # StereoTales dimensions already extracted (e.g. gender, age) -> the table's column of their labels;
    # corpus.extractions: published maps them (reference.yaml's labels or canonical keys, or unknown)
    extracted: dict[str, str] = {}


class CorpusSettings(Strict):
    """Where the stories come from when a profile imports them (stage 01) and whose extractions stage 03 uses."""

    # stereotales: StereoTales' released story shards (the columns RELEASED_COLUMNS);
    # table: any story table (CSV, JSONL or parquet) with `columns:` naming its columns
    format: Literal["stereotales", "table"]
    path: str  # a folder as downloaded (searched recursively) or one file
    design: str = "stereotales"  # table only: the design whose stories these are (its condition columns)
    columns: TableColumns | None = None  # table only
    languages: Annotated[list[Language], Field(min_length=1)] | None = None  # storybias codes (nl for du); null: all
    models: Annotated[list[str], Field(min_length=1)] | None = None  # generator_model values; null: all
    sample: Annotated[int, Field(ge=1)] | None = None  # at most N stories per model x language, seeded; null: all
    seed: int = 42  # draws the sample
    # published: stage 03 maps extracted_attributes_json (the release's three-extractor consensus);
    # rerun: stage 03 extracts the imported stories with extract.models; both: rerun and compare with published
    extractions: Literal["published", "rerun", "both"] = "published"
    # Whose demographic profile stage 03 writes with extractions: rerun or both. extractions (default):
    # storybias' own, like every other field; published: the release's consensus (the association lens
    # then reads what StereoTales tested), with storybias' adjectives, settings and markers beside it
    # (the BiasedTales-ML and Feng et al. lenses): the three lenses on one imported corpus (issue #30)
    demographics: Literal["extractions", "published"] = "extractions"
    # the additional_en prompt variants (neutral/negative/positive, no scenario): StereoTales' reference
    # pools them with English (per-language pass) and with everything (global pass); false leaves them out
    additional_en: bool = True

    @model_validator(mode="after")
    def _format_keys(self) -> CorpusSettings:
        if self.demographics == "published" and self.extractions == "published":
            raise ValueError(
                "corpus.demographics: published needs corpus.extractions: rerun or both (it is published, "
                "which takes every field from the release): storybias extracts the narrative lists, the "
                "release gives the demographic profile"
            )
        if self.format == "stereotales":
            if self.columns is not None or self.design != "stereotales":
                raise ValueError("corpus.columns and corpus.design are for format: table (the release's are fixed)")
            return self
        if self.columns is None:
            raise ValueError("corpus.columns: format: table needs the names of its text, language and model columns")
        if self.design not in designs.names():
            raise ValueError(f"corpus.design: {self.design!r} is not a design ({', '.join(designs.names())})")
        allowed = CONDITION_COLUMNS.get(self.design, ())
        wrong = [c for c in self.columns.conditions if c not in allowed]
        if wrong:
            raise ValueError(
                f"corpus.columns.conditions: {', '.join(wrong)} not a condition column of {self.design} "
                f"({', '.join(allowed) or 'none'})"
            )
        unknown = [d for d in self.columns.extracted if d not in designs.dimensions()]
        if unknown:
            raise ValueError(f"corpus.columns.extracted: {', '.join(unknown)} not one of StereoTales' dimensions")
        if self.extractions != "rerun" and not self.columns.extracted:
            raise ValueError(
                f"corpus.extractions: {self.extractions} needs corpus.columns.extracted (the table's extracted "
                "fields); with none, set extractions: rerun (stage 03 extracts with extract.models)"
            )
        return self


def corpus_files(settings: CorpusSettings) -> list[Path]:
    """The corpus' files, sorted (parquet shards; for a table, its CSV, JSONL and parquet files); a
    ValueError naming ``corpus.path`` when there are none."""
    root = paths.resolve(settings.path)
    if settings.format == "table":
        return _table_files(root)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ValueError(
            f"corpus.path: {root} does not exist (storybias never downloads: fetch the corpus first, e.g. "
            "`huggingface-cli download giskardai/StereoTales --repo-type dataset --local-dir " + str(root) + "`)"
        )
    files = sorted(p for p in root.rglob("*.parquet") if p.is_file())
    if not files:
        raise ValueError(f"corpus.path: {root} holds no .parquet file (expected <language>/stories/eval-*.parquet)")
    return [f for f in files if _wanted(f, root, settings)]


def _wanted(file: Path, root: Path, settings: CorpusSettings) -> bool:
    """Skip a language folder the profile leaves out (the rows' `language` column still decides)."""
    folder = file.relative_to(root).parts[0] if file.parent != root else ""
    if folder == ADDITIONAL_FOLDER:
        return settings.additional_en and (settings.languages is None or "en" in settings.languages)
    language = RELEASE_LANGUAGE.get(folder, folder)
    if settings.languages is None or len(folder) != 2:
        return True
    return language in settings.languages


def _table_files(root: Path) -> list[Path]:
    if root.is_file():
        if root.suffix.lower() not in TABLE_SUFFIXES:
            raise ValueError(f"corpus.path: {root} is not a .csv, .jsonl or .parquet file")
        return [root]
    if not root.is_dir():
        raise ValueError(f"corpus.path: {root} does not exist (storybias never downloads: put the table there)")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES)
    if not files:
        raise ValueError(f"corpus.path: {root} holds no .csv, .jsonl or .parquet file")
    return files


def table_header(file: Path) -> list[str]:
    """The column names of one table file, read from its footer, header line or first record."""
    suffix = file.suffix.lower()
    try:
        if suffix == ".parquet":
            return list(pq.read_schema(file).names)
        if suffix == ".csv":
            return list(pa_csv.open_csv(file).schema.names)
        with open(file, encoding="utf-8") as fh:
            first = json.loads(fh.readline() or "{}")
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"corpus.path: {file} is not a readable {suffix[1:]} file ({exc})") from None
    if not isinstance(first, dict):
        raise ValueError(f"corpus.path: {file}: line 1 is not a JSON object")
    return list(first)


def mapped_columns(columns: TableColumns) -> dict[str, str]:
    """Profile key -> the table column it names (corpus.columns.text -> "story", ...)."""
    keys = {f"corpus.columns.{k}": getattr(columns, k) for k in ("text", "language", "model", "id")}
    keys.update({f"corpus.columns.conditions.{k}": v for k, v in columns.conditions.items()})
    keys.update({f"corpus.columns.extracted.{k}": v for k, v in columns.extracted.items()})
    return {k: v for k, v in keys.items() if v is not None}


def _check_table_files(settings: CorpusSettings, files: list[Path]) -> list[str]:
    assert settings.columns is not None
    problems = []
    for file in files:
        try:
            header = table_header(file)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        for key, column in mapped_columns(settings.columns).items():
            if column not in header:
                problems.append(f"{key}: column {column!r} is not in {file} (its columns: {', '.join(header)})")
    return problems


def check_files(settings: CorpusSettings) -> list[str]:
    """Problems with the corpus files found from their footers or headers alone: not readable, a column missing."""
    try:
        files = corpus_files(settings)
    except ValueError as exc:
        return [str(exc)]
    if settings.format == "table":
        return _check_table_files(settings, files)
    problems = []
    for file in files:
        try:
            schema = pq.read_schema(file)
        except (pa.ArrowInvalid, OSError) as exc:
            problems.append(f"corpus.path: {file} is not a parquet file ({exc})")
            continue
        missing = [c for c in RELEASED_COLUMNS if c not in schema.names]
        if missing:
            problems.append(
                f"corpus.path: {file} lacks column(s) {', '.join(missing)} of StereoTales' released stories "
                f"(format: {settings.format})"
            )
    if not files:
        problems.append(f"corpus.path: no file left after corpus.languages {settings.languages}")
    return problems
