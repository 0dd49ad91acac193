"""The one checker and reader of the CSV files people fill in: a human study's harm ratings (stage 04),
a human validation of the extracted lists (stage 03), and the marker and label ratings of Feng et al.'s
human validation (stage 06).

Each file is described once (:class:`HumanFile`: its columns, what each cell may hold, which key has one
value of which column, which keys may not repeat) and read once, row by row with the csv module
(:func:`read_rows`), by both :func:`check_file` (what ``make check-params`` runs when the profile loads,
before any work) and :func:`read_file` (what the stage runs): a file the check accepts is the file the
stage reads. Every problem names the file, the row as a spreadsheet numbers it (the header is row 1) and
the column; at most ``MAX_PROBLEMS`` are listed, and a long cell is shortened in the message. A line of
empty cells (``,,,``) is blank for both.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from storybias.core.io import first_undecodable_line

MAX_PROBLEMS = 20  # a file with many bad rows reports the first ones, not thousands of lines
MAX_SHOWN = 60  # characters of a cell quoted in a message


class HumanFileError(ValueError):
    """A human-input CSV that cannot be used; the message lists its problems, each with file, row and column."""


@dataclass(frozen=True)
class Column:
    """One column: ``valid(cell)`` says whether a stripped cell is acceptable, ``expected`` says what is."""

    name: str
    valid: Callable[[str], bool]
    expected: str
    optional: bool = False  # the column may be absent from the header, and its cells empty
    lower: bool = False  # compared and stored lower-cased


@dataclass(frozen=True)
class HumanFile:
    """A kind of human-input file: its columns, its consistency rules, and what a row is called."""

    what: str  # e.g. "human ratings"
    row_name: str  # e.g. "rating"
    columns: tuple[Column, ...]
    one_per: tuple[tuple[str, str], ...] = ()  # (key, column): every row of one key has one value of column
    unique: tuple[tuple[str, ...], ...] = ()  # keys that may not repeat (the message names the last column)
    together: tuple[tuple[str, ...], ...] = ()  # optional columns given all together or not at all
    integers: tuple[str, ...] = field(default=())  # columns stored as int

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


def nonempty(cell: str) -> bool:
    return bool(cell)


def one_of(*values: str) -> Callable[[str], bool]:
    return lambda cell: cell in values


def digit_from(low: int, high: int) -> Callable[[str], bool]:
    """One digit from ``low`` to ``high``, written as such (not 4.0, not 04, not true)."""
    pattern = re.compile(rf"^[{low}-{high}]$")
    return lambda cell: bool(pattern.match(cell))


def shown(cell: str) -> str:
    """A cell as a message quotes it, shortened when long."""
    return repr(cell if len(cell) <= MAX_SHOWN else cell[: MAX_SHOWN - 3] + "...")


def _header_problem(path: Path, header: list[str] | None, spec: HumanFile) -> str | None:
    if header is None or not any(h.strip() for h in header):
        return (
            f"{path}: the file is empty; expected a header row {','.join(spec.names)} and one row per {spec.row_name}"
        )
    names = [h.strip() for h in header]
    required = [c.name for c in spec.columns if not c.optional]
    missing = [c for c in required if c not in names]
    extra = [c for c in names if c not in spec.names]
    what = (
        ([f"missing column(s) {', '.join(missing)}"] if missing else [])
        + ([f"unknown column(s) {', '.join(shown(c) for c in extra)}"] if extra else [])
        + (["a column is repeated"] if len(set(names)) != len(names) else [])
    )
    for group in spec.together:
        given = [c for c in group if c in names]
        if given and len(given) < len(group):
            what.append(f"{', '.join(given)} without {', '.join(c for c in group if c not in given)} (all or none)")
    if not what:
        return None
    optional = [c.name for c in spec.columns if c.optional]
    expected = ", ".join(required) + (f"; optional {', '.join(optional)}" if optional else "")
    return f"{path}: row 1 (header): {'; '.join(what)} (expected {expected})"


def read_rows(path: str | Path, spec: HumanFile) -> Iterator[tuple[int, dict[str, str] | str]]:
    """(row number, the row's stripped cells by column) for every non-blank row of ``path``, or (row
    number, the problem) for a row that cannot be read as one; a file that cannot be read at all, or a
    bad header, yields (1 or 0, the problem) and stops."""
    path = Path(path)
    if not path.is_file():
        yield 0, f"{path}: file not found"
        return
    try:
        # utf-8-sig: a byte-order mark (Excel's "CSV UTF-8") is accepted, as the story reader accepts it
        with open(path, encoding="utf-8-sig", newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            problem = _header_problem(path, header, spec)
            if problem is not None or header is None:
                yield 1, problem or f"{path}: the file is empty"
                return
            names = [h.strip() for h in header]
            for number, cells in enumerate(reader, start=2):
                if not cells or all(not c.strip() for c in cells):
                    continue  # a blank line, or one of empty cells
                if len(cells) != len(names):
                    yield (
                        number,
                        f"{path}: row {number}: {len(cells)} fields, the header has {len(names)} ({','.join(names)})",
                    )
                    continue
                yield number, dict(zip(names, (c.strip() for c in cells)))
    except UnicodeDecodeError as exc:
        line = first_undecodable_line(path)
        yield 0, f"{path}: line {line}: not UTF-8 text ({exc.reason} at byte {exc.object[exc.start : exc.end]!r})"
    except csv.Error as exc:
        yield 0, f"{path}: not a readable CSV ({exc})"


def _cell_problems(path: Path, number: int, row: dict[str, str], spec: HumanFile) -> Iterator[str]:
    for column in spec.columns:
        if column.name not in row:
            continue
        cell = row[column.name].lower() if column.lower else row[column.name]
        if column.optional and cell == "":
            continue
        if not column.valid(cell):
            what = "empty" if cell == "" else f"{shown(cell)} is not {column.expected}"
            yield f"{path}: row {number}, column {column.name}: {what}"


def _consistency(path: Path, number: int, row: dict[str, str], spec: HumanFile, seen: dict) -> Iterator[str]:
    """A row against the rows above it: one value per key (``one_per``), no repeated key (``unique``)."""
    for key, column in spec.one_per:
        if column not in row:
            continue
        first, first_row = seen.setdefault(("one", key, column, row[key]), (row[column], number))
        if row[column] != first:
            yield (
                f"{path}: row {number}, column {column}: {shown(row[column])}, but {key} {shown(row[key])} has "
                f"{shown(first)} on row {first_row} (one {column} per {key})"
            )
    for keys in spec.unique:
        values = tuple(row[k] for k in keys)
        first_row = seen.setdefault(("unique", keys, values), number)
        if first_row != number:
            named = ", ".join(f"{k} {shown(v)}" for k, v in zip(keys, values))
            where = f"{path}: row {number}, column {keys[-1]}"
            yield f"{where}: a second {spec.row_name} of {named} (first on row {first_row})"


def check_file(path: str | Path, spec: HumanFile) -> list[str]:
    """Every problem of the file (at most ``MAX_PROBLEMS``), each naming the file, row and column;
    empty when the file is usable."""
    path = Path(path)
    problems: list[str] = []
    seen: dict = {}
    n_rows = 0
    for number, row in read_rows(path, spec):
        if isinstance(row, str):
            problems.append(row)
            if number <= 1:
                return problems
            continue
        n_rows += 1
        row = {c.name: row[c.name].lower() if c.lower else row[c.name] for c in spec.columns if c.name in row}
        problems += _cell_problems(path, number, row, spec)
        problems += _consistency(path, number, row, spec, seen)
        if len(problems) >= MAX_PROBLEMS:
            return [*problems[:MAX_PROBLEMS], f"{path}: (stopped after {MAX_PROBLEMS} problems)"]
    if n_rows == 0 and not problems:
        problems.append(f"{path}: no {spec.row_name} below the header row")
    return problems


def read_file(path: str | Path, spec: HumanFile) -> pd.DataFrame:
    """The checked file (``check_file``) as a frame: one column per column of ``spec`` (an absent optional
    one empty), cells stripped (lower-cased where ``lower``), ``integers`` as int, and ``row`` the row
    number. Raises :class:`HumanFileError` listing every problem."""
    problems = check_file(path, spec)
    if problems:
        raise HumanFileError(f"{spec.what} are invalid:\n" + "\n".join(f"  - {p}" for p in problems))
    rows = [
        {
            "row": number,
            **{c.name: (row.get(c.name, "").lower() if c.lower else row.get(c.name, "")) for c in spec.columns},
        }
        for number, row in read_rows(path, spec)
        if isinstance(row, dict)
    ]
    frame = pd.DataFrame(rows, columns=["row", *spec.names])
    return frame.astype({c: int for c in spec.integers if (frame[c] != "").all()})
