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

from pathlib import Path
from typing import Annotated, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

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


class CorpusSettings(Strict):
    """Where the stories come from when a profile imports them (stage 01) and whose extractions stage 03 uses."""

    format: Literal["stereotales"]  # StereoTales' released story shards (the columns RELEASED_COLUMNS)
    path: str  # a folder as downloaded (searched recursively for *.parquet) or one parquet file
    languages: Annotated[list[Language], Field(min_length=1)] | None = None  # storybias codes (nl for du); null: all
    models: Annotated[list[str], Field(min_length=1)] | None = None  # generator_model values; null: all
    sample: Annotated[int, Field(ge=1)] | None = None  # at most N stories per model x language, seeded; null: all
    seed: int = 42  # draws the sample
    # published: stage 03 maps extracted_attributes_json (the release's three-extractor consensus);
    # rerun: stage 03 extracts the imported stories with extract.models; both: rerun and compare with published
    extractions: Literal["published", "rerun", "both"] = "published"
    # the additional_en prompt variants (neutral/negative/positive, no scenario): StereoTales' reference
    # pools them with English (per-language pass) and with everything (global pass); false leaves them out
    additional_en: bool = True


def corpus_files(settings: CorpusSettings) -> list[Path]:
    """The corpus' parquet files, sorted; a ValueError naming ``corpus.path`` when there are none."""
    root = paths.resolve(settings.path)
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


def check_files(settings: CorpusSettings) -> list[str]:
    """Problems with the corpus files found from their footers alone: not parquet, a column missing."""
    try:
        files = corpus_files(settings)
    except ValueError as exc:
        return [str(exc)]
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
