"""The one reader of a story table's files (CSV, JSONL, parquet), and how a problem with an input file is
quoted in a message.

``make check-params`` and stage 01 read a table with these functions and nothing else, so what the check
accepts is what the stage reads. :func:`table_header` gives a file's column names (its parquet footer, its
CSV header line, its first JSON record); :func:`read_text_columns` gives the named columns, every value
text or null:

- **nothing is converted to text**: a parquet column stored as a number, a boolean or a list, or a JSONL
  value that is not a string or null, is an error naming the file, the column (or the line and the key)
  and an example value; a CSV is text by nature and every cell is read as written (an empty cell is empty);
- **long stories are read**: Arrow reads a CSV in blocks of 1 MB and refuses a row longer than one block
  ("straddling object"); such a file is read again with one block as large as the file. A JSONL file is
  read line by line with Python's ``json`` (any line length; a line that is not one JSON object, a key
  repeated in it, or a value nested too deeply is an error naming the line);
- **every message is short**: a value is quoted by :func:`shown` (at most ``MAX_SHOWN`` characters, the
  rest elided) and a library's own message by :func:`shortened`, so one bad 1 MB cell gives one short line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from storybias.core.io import first_undecodable_line

MAX_SHOWN = 200  # characters of a value quoted in a message
MAX_MESSAGE = 400  # characters of a library's message quoted in ours
TABLE_SUFFIXES = (".csv", ".jsonl", ".parquet")
# Cells that spreadsheets and dataframe libraries write for a missing value: never a model's name or an id
MISSING_MARKERS = frozenset({"nan", "null", "none", "na", "n/a", "<na>", "nat"})
_INT32_MAX = 2**31 - 1


class TableFileError(ValueError):
    """A table file that cannot be read as text columns; the message names the file, the row or line and
    the column or key."""


def shown(value: Any, limit: int = MAX_SHOWN) -> str:
    """``repr(value)`` as a message quotes it: at most about ``limit`` characters, the rest elided with
    the full length given."""
    if isinstance(value, str) and len(value) > limit:
        return repr(value[: limit - 3]) + f"... ({len(value):,} characters)"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + f"... ({len(text):,} characters)"


def shortened(message: str, limit: int = MAX_MESSAGE) -> str:
    """A library's message (Arrow quotes the offending row whole) cut to ``limit`` characters."""
    message = " ".join(message.split())
    return message if len(message) <= limit else message[: limit - 3] + "..."


def missing_marker(value: str) -> bool:
    """Whether a cell is a spelled-out missing value (``NaN``, ``null``, ``None``, ``NA``, ...)."""
    return value.strip().lower() in MISSING_MARKERS


def is_text_type(kind: pa.DataType) -> bool:
    """Arrow types read as text without conversion: strings, a dictionary of strings, or the null type (a
    column with no value)."""
    if pa.types.is_dictionary(kind):
        return is_text_type(kind.value_type)
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_null(kind)
        or (hasattr(pa.types, "is_string_view") and pa.types.is_string_view(kind))
    )


def type_problem(file: Path, schema: pa.Schema, columns: list[str]) -> str | None:
    """The first of ``columns`` whose Arrow type in a parquet file's ``schema`` is not text, named with the
    file, its type and its first value (read from the first row group); None when every column is text."""
    for column in columns:
        kind = schema.field(column).type
        if not is_text_type(kind):
            return f"{file}: column {column}: stored as {kind}, not text{_first_value(file, column)}; " + (
                "storybias converts nothing to text: write the column as strings"
            )
    return None


def _first_value(file: Path, column: str) -> str:
    """`` (row N: value)`` of the first non-null value of a parquet column's first row group, or ""."""
    try:
        values = pq.ParquetFile(file).read_row_group(0, columns=[column]).column(column)
    except (pa.ArrowException, OSError, IndexError):
        return ""
    first = next((i for i, valid in enumerate(values.is_valid().to_pylist()) if valid), None)
    return "" if first is None else f" (row {first}: {shown(values[first].as_py())})"


def _duplicated(file: Path, names: list[str], where: str) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise TableFileError(f"{file}: {where}: column {shown(name)} appears twice")
        seen.add(name)


def _csv_options(file: Path, large: bool) -> tuple[pa_csv.ReadOptions, pa_csv.ParseOptions]:
    """Arrow's CSV options: values may hold newlines (a story's paragraphs); ``large``: one block as large
    as the file, so a row of any length fits in it."""
    block = min(max(file.stat().st_size + 1, 1 << 20), _INT32_MAX) if large else None
    read = pa_csv.ReadOptions(block_size=block) if block else pa_csv.ReadOptions()
    return read, pa_csv.ParseOptions(newlines_in_values=True)


def _straddles(exc: Exception) -> bool:
    return "straddl" in str(exc)


def _csv_header(file: Path) -> list[str]:
    for large in (False, True):
        read, parse = _csv_options(file, large)
        try:
            with pa_csv.open_csv(file, read_options=read, parse_options=parse) as reader:
                return list(reader.schema.names)
        except pa.ArrowInvalid as exc:
            if large or not _straddles(exc):
                raise
    raise AssertionError("unreachable")


def _first_record(file: Path) -> list[str]:
    for line_number, record in _json_lines(file):
        if not isinstance(record, dict):
            raise TableFileError(f"{file}: line {line_number}: not a JSON object")
        return list(record)
    return []


def table_header(file: Path) -> list[str]:
    """The column names of one table file (its footer, header line or first record); a TableFileError
    naming the file when it cannot be read or repeats a column."""
    suffix = file.suffix.lower()
    try:
        if suffix == ".parquet":
            names = list(pq.read_schema(file).names)
        elif suffix == ".csv":
            names = _csv_header(file)
        else:
            names = _first_record(file)
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as exc:
        raise TableFileError(f"{file}: not a readable {suffix[1:]} file ({shortened(str(exc))})") from None
    _duplicated(file, names, "header" if suffix != ".jsonl" else "line 1")
    return names


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, refusing a repeated key (``json`` would keep the last value silently)."""
    record = dict(pairs)
    if len(record) != len(pairs):
        names = [k for k, _ in pairs]
        repeated = next(k for i, k in enumerate(names) if k in names[:i])
        raise ValueError(f"key {shown(repeated)} appears twice in one object")
    return record


def _json_lines(file: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of every non-blank line; a TableFileError naming the line otherwise.
    Read as bytes and decoded line by line, so that a line that is not UTF-8 is named exactly."""
    with open(file, "rb") as fh:
        for line_number, raw in enumerate(fh, start=1):
            if raw.strip():
                yield line_number, _json_line(file, line_number, raw)


def _json_line(file: Path, line_number: int, raw: bytes) -> Any:
    where = f"{file}: line {line_number}"
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=unique_keys)
    except UnicodeDecodeError as exc:  # a ValueError too: caught before the repeated key's
        raise TableFileError(f"{where}: not UTF-8 text ({exc.reason}, byte {exc.start + 1})") from None
    except json.JSONDecodeError as exc:
        raise TableFileError(f"{where}: not valid JSON ({exc.msg}, column {exc.colno})") from None
    except RecursionError:
        raise TableFileError(f"{where}: a value nested too deeply to read") from None
    except ValueError as exc:  # a repeated key (unique_keys)
        raise TableFileError(f"{where}: {exc}") from None


def _read_jsonl(file: Path, columns: list[str]) -> pd.DataFrame:
    """``columns`` of every record of a JSONL file; a missing key is null, a value neither a string nor
    null stops the read naming the line and the key."""
    values: dict[str, list[str | None]] = {c: [] for c in columns}
    for line_number, record in _json_lines(file):
        if not isinstance(record, dict):
            raise TableFileError(f"{file}: line {line_number}: not a JSON object ({shown(record)})")
        for column in columns:
            value = record.get(column)
            if value is not None and not isinstance(value, str):
                raise TableFileError(
                    f"{file}: line {line_number}, key {column}: {shown(value)} is a {_json_kind(value)}, not "
                    "text; storybias converts nothing to text: write it as a JSON string"
                )
            values[column].append(value)
    return pd.DataFrame(values, columns=columns, dtype=object)


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return "list" if isinstance(value, list) else "object"


def _read_csv(file: Path, columns: list[str]) -> pa.Table:
    convert = pa_csv.ConvertOptions(include_columns=columns, column_types={c: pa.string() for c in columns})
    for large in (False, True):
        read, parse = _csv_options(file, large)
        try:
            return pa_csv.read_csv(file, read_options=read, parse_options=parse, convert_options=convert)
        except pa.ArrowInvalid as exc:
            if large or not _straddles(exc):
                raise
    raise AssertionError("unreachable")


def _read_parquet(file: Path, columns: list[str]) -> pa.Table:
    problem = type_problem(file, pq.read_schema(file), columns)
    if problem:
        raise TableFileError(problem)
    return pq.read_table(file, columns=columns)


def read_text_columns(file: Path, columns: list[str]) -> pd.DataFrame:
    """``columns`` of one table file, one row per row (numbered from 0) and every value a string or None;
    a TableFileError naming the file (and the line or row, the column or key) when it cannot be read so."""
    suffix = file.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(file, columns)
    header = table_header(file)  # a repeated column is refused: Arrow would silently take the first
    missing = [c for c in columns if c not in header]
    if missing:
        named = ", ".join(map(shown, missing))
        raise TableFileError(f"{file}: header: no column {named} (its columns: {shortened(', '.join(header))})")
    try:
        table = _read_parquet(file, columns) if suffix == ".parquet" else _read_csv(file, columns)
    except (pa.ArrowInvalid, OSError) as exc:
        wanted = ", ".join(columns)
        problem = shortened(str(exc).strip('"'))
        line = first_undecodable_line(file) if suffix == ".csv" and "UTF8" in str(exc) else 0
        where = f"line {line}: not UTF-8 text; " if line else ""  # Arrow names the column, not the line
        raise TableFileError(
            f"{file}: {where}not a readable {suffix[1:]} table with columns {wanted} ({problem})"
        ) from None
    frame = table.to_pandas().astype(object)
    return frame.where(frame.notna(), None)
