"""The ``corpus:`` section of a profile: stories imported from a published corpus instead of generated.

StereoTales (*StereoTales: A Multilingual Framework for Open-Ended Stereotype Discovery in LLMs*, Le Jeune et
al., Giskard AI, 2026, arXiv:2605.10442) released its stories with their extracted profiles as the Hugging
Face dataset ``giskardai/StereoTales`` (an anonymised copy: ``anonymous-authors/StereoTales``, CC-BY-4.0).
Downloaded, its story configs are parquet shards ``<folder>/stories/eval-NNNNN-of-NNNNN.parquet`` of at most
50,000 rows, one folder per language (``en ar du es fr hi it pt uk zh``; Dutch is ``du``) and one for the
English prompt variants (``additional_en``: templates ``neutral``, ``negative``, ``positive``, language
``en``, no scenario). :data:`RELEASED_COLUMNS` are the columns every shard has. Every model answered the
same prompts, so a ``sample_id`` and an ``output_id`` (the id of one requested generation) recur once per
generator model: a released story is one (model, folder, output id). A folder's rows run model after model;
a model whose answer came back empty has no row for it; a shard's column types are those of its folder's
first row (a column null there is stored with Arrow's null type).

A profile with ``corpus:`` needs no ``generation:`` or ``designs:``: stage 01 imports the stories
(``storybias.stages.generate.corpus``), stage 03 maps the published extractions or extracts again
(``extractions``). storybias never downloads: the user points ``path`` at the folder they downloaded.

This module holds the section and the checks that read only file footers (a second at most), so
``make check-params`` refuses a wrong path, a file that is not parquet or a missing column before any work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, model_validator

from storybias.config import designs
from storybias.config.prompts import CONDITION_COLUMNS, LANGUAGES
from storybias.config.story_sections import InputFile, Language, Seed, Strict
from storybias.core import paths
from storybias.core.inputs import TABLE_SUFFIXES, TableFileError, shortened, shown, table_header, type_problem
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
# The released columns storybias reads, each stored as text (or Arrow's null type): anything else is refused
TEXT_COLUMNS = tuple(c for c in RELEASED_COLUMNS if c != "extraction_score")
# The prompt template of the per-language scenario prompts; the additional_en variants have others.
SCENARIO_TEMPLATE = "scenario_based"
ADDITIONAL_TEMPLATES = ("neutral", "negative", "positive")
ADDITIONAL_FOLDER = "additional_en"


class Constant(Strict):
    """A value shared by every row of a table that has no column for it, written ``{constant: en}``."""

    constant: Annotated[str, Field(min_length=1)]


class TableColumns(Strict):
    """``format: table``: which column of the user's table holds what (names as they are in the file), or
    ``{constant: value}`` where the table has no such column (a corpus of one language or one model)."""

    text: str  # the story
    language: str | Constant  # an ISO 639-1 code storybias knows (or the release's du)
    model: str | Constant  # the generating model's name
    id: str | None = None  # a stable story id; null: the file and row number
    # the prompt each story answered: stored as the story's prompt; stage 06 groups the probe's folds by
    # it when the design's conditions name no prompt finer than the prompted value (no scenario)
    prompt: str | None = None
    # the design's condition columns of stories.parquet (e.g. cond_child_gender) -> the table's column
    conditions: dict[str, str | Constant] = {}
    # StereoTales dimensions already extracted (e.g. gender, age) -> the table's column of their labels;
    # corpus.extractions: published maps them (reference.yaml's labels or canonical keys, or unknown)
    extracted: dict[str, str] = {}


class CorpusSettings(Strict):
    """Where the stories come from when a profile imports them (stage 01) and whose extractions stage 03 uses."""

    # stereotales: StereoTales' released story shards (the columns RELEASED_COLUMNS);
    # table: any story table (CSV, JSONL or parquet) with `columns:` naming its columns
    format: Literal["stereotales", "table"]
    path: InputFile  # a folder as downloaded (searched recursively) or one file
    design: str = "stereotales"  # table only: the design whose stories these are (its condition columns)
    columns: TableColumns | None = None  # table only
    languages: Annotated[list[Language], Field(min_length=1)] | None = None  # storybias codes (nl for du); null: all
    models: Annotated[list[str], Field(min_length=1)] | None = None  # generator_model values; null: all
    # the prompted attributes kept (the release's target_attribute, as storybias' keys, e.g. [gender]); null: all
    attributes: Annotated[list[str], Field(min_length=1)] | None = None
    sample: Annotated[int, Field(ge=1)] | None = None  # at most N stories per `sample_per`, seeded; null: all
    # model_language: N stories per model x language; prompted_value: N per model x language x prompted
    # value (stereotales: cond_attribute and cond_value; another table design: its condition columns)
    sample_per: Literal["model_language", "prompted_value"] = "model_language"
    seed: Seed = 42  # draws the sample
    # published: stage 03 maps extracted_attributes_json (the release's three-extractor consensus);
    # rerun: stage 03 extracts the imported stories with extract.models; both: rerun and compare with published
    extractions: Literal["published", "rerun", "both"] = "published"
    # Whose demographic profile stage 03 writes with extractions: rerun or both. extractions (default):
    # storybias' own, like every other field; published: the release's consensus (the association lens
    # then reads what StereoTales tested), with storybias' adjectives, settings and markers beside it
    # (the BiasedTales-ML and Feng et al. lenses): the three lenses on one imported corpus (issue #30)
    demographics: Literal["extractions", "published"] = "extractions"
    # the additional_en prompt variants (neutral/negative/positive, no scenario). false (default): left out,
    # as the reference's archive loader that computed the published associations does (it skips every
    # sample without a scenario_key); true: pooled with English (per-language pass) and with every
    # language (global pass), as the reference's Hugging Face loader (load_hf_dataset) does
    additional_en: bool = False
    # format: table: a condition column's table values -> the design's keys, e.g. {cond_value: {M: man}};
    # a value neither mapped nor a key of the design stops stage 01 naming the file, row and column
    values: dict[str, dict[str, str]] = {}

    @model_validator(mode="after")
    def _format_keys(self) -> CorpusSettings:
        if self.demographics == "published" and self.extractions == "published":
            raise ValueError(
                "corpus.demographics: published needs corpus.extractions: rerun or both (it is published, "
                "which takes every field from the release): storybias extracts the narrative lists, the "
                "release gives the demographic profile"
            )
        unknown_attributes = [a for a in self.attributes or () if a not in designs.dimensions()]
        if unknown_attributes:
            raise ValueError(f"corpus.attributes: {', '.join(unknown_attributes)} not one of StereoTales' dimensions")
        if self.format == "stereotales":
            if self.columns is not None or self.design != "stereotales" or self.values:
                raise ValueError(
                    "corpus.columns, corpus.design and corpus.values are for format: table (the release's are fixed)"
                )
            return self
        if self.attributes is not None and self.design != "stereotales":
            raise ValueError(
                f"corpus.attributes: the prompted attributes are the stereotales design's, not {self.design}'s"
            )
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
        _check_constants_and_values(self.columns, self.values, self.design)
        unknown = [d for d in self.columns.extracted if d not in designs.dimensions()]
        if unknown:
            raise ValueError(f"corpus.columns.extracted: {', '.join(unknown)} not one of StereoTales' dimensions")
        if self.extractions != "rerun" and not self.columns.extracted:
            raise ValueError(
                f"corpus.extractions: {self.extractions} needs corpus.columns.extracted (the table's extracted "
                "fields); with none, set extractions: rerun (stage 03 extracts with extract.models)"
            )
        return self


def condition_values(design: str) -> dict[str, list[str]]:
    """Each condition column of ``design`` -> its values (the keys its prompt grid uses), in grid order."""
    values: dict[str, dict[str, None]] = {}
    for cell in designs.design_cells(design):
        for column, value in cell.conditions.items():
            values.setdefault(column, {})[value] = None
    return {column: list(seen) for column, seen in values.items()}


def value_problem(design: str, column: str, value: str, allowed: list[str]) -> str:
    """Why ``value`` cannot be ``column`` of ``design``, with the first of the design's keys."""
    keys = ", ".join(allowed[:12]) + (", ..." if len(allowed) > 12 else "")
    return f"{shown(value)} is not a value of {column} in design {design} ({keys or 'none'})"


def _check_constants_and_values(columns: TableColumns, values: dict[str, dict[str, str]], design: str) -> None:
    """A constant language storybias knows; constants and mapped values that are the design's keys; a
    ``values`` mapping only for a condition the table maps."""
    if isinstance(columns.language, Constant):
        code = RELEASE_LANGUAGE.get(columns.language.constant, columns.language.constant)
        if code not in LANGUAGES:
            raise ValueError(
                f"corpus.columns.language: constant {columns.language.constant!r} is not one of storybias' "
                f"languages ({', '.join(LANGUAGES)})"
            )
    allowed = condition_values(design)
    for target, source in columns.conditions.items():
        if isinstance(source, Constant) and source.constant not in allowed.get(target, []):
            problem = value_problem(design, target, source.constant, allowed.get(target, []))
            raise ValueError(f"corpus.columns.conditions.{target}: constant {problem}")
    for target, mapping in values.items():
        if target not in columns.conditions:
            raise ValueError(
                f"corpus.values.{target}: not a condition the table maps (corpus.columns.conditions: "
                f"{', '.join(columns.conditions) or 'none'})"
            )
        wrong = {k: v for k, v in mapping.items() if v not in allowed.get(target, [])}
        if wrong:
            key, value = next(iter(wrong.items()))
            problem = value_problem(design, target, value, allowed.get(target, []))
            raise ValueError(f"corpus.values.{target}: {key!r} -> {problem}")


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
    """Skip the additional_en folder unless asked for, and a shard whose footer shows that none of its
    rows is of a language the profile keeps; any other file is read (its rows' ``language`` decides,
    whatever its folder is called)."""
    folder = file.relative_to(root).parts[0] if file.parent != root else ""
    if folder == ADDITIONAL_FOLDER:
        return settings.additional_en and (settings.languages is None or "en" in settings.languages)
    if settings.languages is None:
        return True
    languages = footer_languages(file)
    return languages is None or bool({RELEASE_LANGUAGE.get(v, v) for v in languages} & set(settings.languages))


def footer_languages(file: Path) -> set[str] | None:
    """The values of a shard's ``language`` column as its footer's statistics prove them (each row group
    one value, no null), or None when the footer cannot tell."""
    try:
        meta = pq.ParquetFile(file).metadata
    except (pa.ArrowInvalid, OSError):
        return None
    values: set[str] = set()
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        chunks = [row_group.column(i) for i in range(row_group.num_columns)]
        chunk = next((c for c in chunks if c.path_in_schema == "language"), None)
        stats = chunk.statistics if chunk is not None else None
        if stats is None or not stats.has_min_max or stats.null_count or stats.min != stats.max:
            return None
        values.add(str(stats.min))
    return values


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


def mapped_columns(columns: TableColumns) -> dict[str, str]:
    """Profile key -> the table column it names (corpus.columns.text -> "story", ...); constants left out."""
    keys = {f"corpus.columns.{k}": getattr(columns, k) for k in ("text", "language", "model", "id", "prompt")}
    keys.update({f"corpus.columns.conditions.{k}": v for k, v in columns.conditions.items()})
    keys.update({f"corpus.columns.extracted.{k}": v for k, v in columns.extracted.items()})
    return {k: v for k, v in keys.items() if isinstance(v, str)}  # a constant reads no column


def _check_table_files(settings: CorpusSettings, files: list[Path]) -> list[str]:
    assert settings.columns is not None
    problems = []
    for file in files:
        try:
            header = table_header(file)
        except TableFileError as exc:
            problems.append(f"corpus.path: {exc}")
            continue
        for key, column in mapped_columns(settings.columns).items():
            if column not in header:
                columns = shortened(", ".join(header))
                problems.append(f"{key}: column {shown(column)} is not in {file} (its columns: {columns})")
        if file.suffix.lower() == ".parquet":
            present = [c for c in dict.fromkeys(mapped_columns(settings.columns).values()) if c in header]
            wrong = type_problem(file, pq.read_schema(file), present)
            problems += [f"corpus.path: {wrong}"] if wrong else []
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
            problems.append(f"corpus.path: {file} is not a parquet file ({shortened(str(exc))})")
            continue
        missing = [c for c in RELEASED_COLUMNS if c not in schema.names]
        if missing:
            problems.append(
                f"corpus.path: {file} lacks column(s) {', '.join(missing)} of StereoTales' released stories "
                f"(format: {settings.format})"
            )
            continue
        wrong = type_problem(file, schema, list(TEXT_COLUMNS))
        if wrong:
            problems.append(f"corpus.path: {wrong}")
    if not files:
        problems.append(
            f"corpus.path: no shard holds a language of corpus.languages {settings.languages} (a shard is "
            "skipped when its footer shows only other languages)"
        )
    return problems
