"""The format of a human validation of stage 03's narrative lists, after BiasedTales-ML (Ouyang, Luo, Xiao,
Zhu, *BiasedTales-ML: A Multilingual Dataset for Analyzing Narrative Attribute Distributions in
LLM-Generated Stories*, arXiv:2604.17008, Sec. 3): two annotators judged each extracted attribute as
clearly supported (2), partially supported (1) or unsupported (0) by the story text.

``extract.human_validation`` names a CSV, one row per extracted item and annotator:

============ ==========================================================================================
story_id     the story (``stories.parquet``'s story_id); one story has one language
language     the story's language
field        the extracted list: ``adjectives``, ``settings`` or ``cultural_refs``
item         the extracted word or phrase, as the extractor wrote it
annotator_id the annotator (pseudonymous)
score        0 (unsupported), 1 (partially supported) or 2 (clearly supported), written as one digit
============ ==========================================================================================

The file is described here (``SUPPORT_RATINGS``) and checked and read by the one checker of
human-input files (``storybias.evidence.human_files``), below the configuration layer, so that ``make
check-params`` reads it before any work starts; the statistics are ``storybias.stages.extract.extraction_precision``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from storybias.evidence import human_files
from storybias.evidence.human_files import Column, HumanFile, check_file, digit_from, nonempty, one_of, read_file

COLUMNS: tuple[str, ...] = ("story_id", "language", "field", "item", "annotator_id", "score")
FIELDS: tuple[str, ...] = ("adjectives", "settings", "cultural_refs")  # stage 03's narrative lists
SCORES: tuple[int, ...] = (0, 1, 2)  # unsupported, partially supported, clearly supported
MAX_PROBLEMS = human_files.MAX_PROBLEMS

SUPPORT_RATINGS = HumanFile(
    what="the extraction validation file",
    row_name="judgement",
    columns=(
        Column("story_id", nonempty, "a story id"),
        Column("language", nonempty, "a language"),
        Column("field", one_of(*FIELDS), f"one of {', '.join(FIELDS)}"),
        Column("item", nonempty, "an extracted item"),
        Column("annotator_id", nonempty, "an annotator's id"),
        Column("score", digit_from(0, 2), "0, 1 or 2 (unsupported, partially or clearly supported; one digit)"),
    ),
    one_per=(("story_id", "language"),),  # one story has one language
    unique=(("story_id", "field", "item", "annotator_id"),),  # one annotator judges an item of a story once
    integers=("score",),
)


def check_support_ratings(path: str | Path) -> list[str]:
    """Every problem of a human extraction-validation CSV (BiasedTales-ML, arXiv:2604.17008, Sec. 3;
    ``SUPPORT_RATINGS``), each naming the file, the row and the column; at most ``MAX_PROBLEMS``.
    Empty list when the file is usable."""
    return check_file(path, SUPPORT_RATINGS)


def load_support_ratings(path: str | Path) -> pd.DataFrame:
    """The checked CSV as a frame with the six columns, strings stripped and ``score`` an int 0-2, read by
    the same reader as the check. Raises ValueError (HumanFileError) listing every problem."""
    return read_file(path, SUPPORT_RATINGS)[list(COLUMNS)]
