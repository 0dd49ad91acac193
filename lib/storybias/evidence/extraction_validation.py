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

The checks live here, below the configuration layer, so that ``make check-params`` reads the file
before any work starts; the statistics are ``storybias.stages.extract.validation``. The checks read
only the file (csv module) and answer in a second.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

COLUMNS: tuple[str, ...] = ("story_id", "language", "field", "item", "annotator_id", "score")
FIELDS: tuple[str, ...] = ("adjectives", "settings", "cultural_refs")  # stage 03's narrative lists
SCORES: tuple[int, ...] = (0, 1, 2)  # unsupported, partially supported, clearly supported
_SCORE_VALUE = re.compile(r"^[0-2]$")  # strict: "2" (spaces around it stripped), not "2.0", "02" or "true"
MAX_PROBLEMS = 20  # a file with many bad rows reports the first ones, not thousands of lines


def _header_problem(path: Path, header: list[str] | None) -> str | None:
    """The header's problem (empty file, missing, unknown or repeated columns), or None."""
    if header is None or not any(h.strip() for h in header):
        return f"{path}: the file is empty; expected a header row {','.join(COLUMNS)} and one row per judgement"
    names = [h.strip() for h in header]
    missing = [c for c in COLUMNS if c not in names]
    extra = [c for c in names if c not in COLUMNS]
    what = (
        ([f"missing column(s) {', '.join(missing)}"] if missing else [])
        + ([f"unknown column(s) {', '.join(repr(c) for c in extra)}"] if extra else [])
        + (["a column is repeated"] if len(set(names)) != len(names) else [])
    )
    if what:
        return f"{path}: row 1 (header): {'; '.join(what)} (expected exactly {', '.join(COLUMNS)})"
    return None


def _row_problems(path: Path, number: int, row: dict[str, str]) -> Iterator[str]:
    """The problems of one row on its own: empty cells, an unknown field, a score that is not 0, 1 or 2."""
    for column in ("story_id", "language", "item", "annotator_id"):
        if not row[column]:
            yield f"{path}: row {number}, column {column}: empty"
    if row["field"] not in FIELDS:
        yield f"{path}: row {number}, column field: {row['field']!r} is not one of {', '.join(FIELDS)}"
    if not _SCORE_VALUE.match(row["score"]):
        yield (
            f"{path}: row {number}, column score: {row['score']!r} is not 0, 1 or 2 "
            "(unsupported, partially or clearly supported; one digit)"
        )


def _rows(path: Path, reader: Iterator[list[str]], header: list[str]) -> Iterator[tuple[int, dict[str, str] | str]]:
    """(spreadsheet row number, the row as a mapping or the problem of a row of the wrong width), blank
    lines skipped."""
    for number, fields in enumerate(reader, start=2):
        if not fields or all(not f.strip() for f in fields):
            continue
        if len(fields) != len(header):
            yield (
                number,
                f"{path}: row {number}: {len(fields)} fields, the header has {len(header)} ({','.join(header)})",
            )
        else:
            yield number, dict(zip(header, (f.strip() for f in fields)))


def validate_extraction_validation(path: str | Path) -> list[str]:
    """Every problem of a human extraction-validation CSV (BiasedTales-ML, arXiv:2604.17008, Sec. 3),
    each naming the file and, where it applies, the row (as a spreadsheet numbers it: the header is
    row 1) and the column; at most ``MAX_PROBLEMS`` are listed. Types are strict: the header holds
    exactly the six columns, score is one digit 0-2 (not 2.0, not true), field one of adjectives /
    settings / cultural_refs, no cell empty; one story has one language, and one annotator judges an
    item of a story's list once. Empty list when the file is usable."""
    path = Path(path)
    if not path.is_file():
        return [f"{path}: file not found"]
    problems: list[str] = []
    first_language: dict[str, tuple[str, int]] = {}  # story_id -> (language, row it was first given on)
    seen: dict[tuple[str, str, str, str], int] = {}  # (story, field, item, annotator) -> row
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            problem = _header_problem(path, header)
            if problem is not None or header is None:  # (header None: always a problem; for the type checker)
                return [problem or f"{path}: the file is empty"]
            header = [h.strip() for h in header]
            n_rows = 0
            for number, row in _rows(path, reader, header):
                n_rows += 1
                if isinstance(row, str):
                    problems.append(row)
                else:
                    problems += _row_problems(path, number, row)
                    problems += _consistency(path, number, row, first_language, seen)
                if len(problems) >= MAX_PROBLEMS:
                    return [*problems[:MAX_PROBLEMS], f"{path}: (stopped after {MAX_PROBLEMS} problems)"]
            if n_rows == 0:
                problems.append(f"{path}: no judgement below the header row")
    except UnicodeDecodeError as exc:
        problems.append(f"{path}: not UTF-8 text ({exc})")
    except csv.Error as exc:
        problems.append(f"{path}: not a readable CSV ({exc})")
    return problems


def _consistency(
    path: Path,
    number: int,
    row: dict[str, str],
    first_language: dict[str, tuple[str, int]],
    seen: dict[tuple[str, str, str, str], int],
) -> list[str]:
    """The problems of a row against the rows above it: a second language for a story, a second
    judgement of one item by one annotator. Updates ``first_language`` and ``seen``."""
    problems = []
    language, row_first = first_language.setdefault(row["story_id"], (row["language"], number))
    if row["story_id"] and language != row["language"]:
        problems.append(
            f"{path}: row {number}, column language: {row['language']!r}, but story {row['story_id']!r} is "
            f"{language!r} on row {row_first} (one story has one language)"
        )
    key = (row["story_id"], row["field"], row["item"], row["annotator_id"])
    if key in seen:
        problems.append(
            f"{path}: row {number}, column annotator_id: a second judgement of {row['field']} item "
            f"{row['item']!r} of story {row['story_id']!r} by {row['annotator_id']!r} (first on row {seen[key]})"
        )
    else:
        seen[key] = number
    return problems


def load_extraction_validation(path: str | Path) -> pd.DataFrame:
    """The validated CSV (:func:`validate_extraction_validation`) as a frame with the six columns,
    strings stripped and ``score`` an int 0-2. Raises ValueError listing every problem."""
    problems = validate_extraction_validation(path)
    if problems:
        raise ValueError("the extraction validation file is invalid:\n" + "\n".join(f"  - {p}" for p in problems))
    frame = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=True)
    frame.columns = [c.strip() for c in frame.columns]
    frame = frame[list(COLUMNS)].apply(lambda column: column.str.strip())
    frame = frame[(frame != "").any(axis=1)]  # a line of commas only is blank, as the check reads it
    return frame.astype({"score": int}).reset_index(drop=True)
