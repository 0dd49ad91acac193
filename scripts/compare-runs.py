#!/usr/bin/env python
"""Compare two run folders table by table, cell by cell, and report every difference.

    python scripts/compare-runs.py RUN_A RUN_B [--rtol 1e-12] [--skip NAME ...] [--ignore-key TEXT ...]
                                               [--examples 5]

Every ``*.parquet``, ``*.csv``, ``*.json`` and ``*.jsonl`` file under either folder is compared with the
file at the same relative path under the other: the same columns (in order), the same number of rows, the
same values row by row (floats equal to ``rtol`` relative, NaN equal to NaN; lists, arrays and mappings
compared element by element). JSON files are flattened to ``key.sub[0]`` paths first. Entries whose
name starts with a dot (``.params``, ``.digests.json``, locks) and the names given with ``--skip`` are
left out; so are JSON keys and table columns whose name contains a ``--ignore-key`` text (e.g. the
stage timings, ``--ignore-key timings --ignore-key _seconds``). Other files (figures, notebooks, logs)
are not read.

Written to show that a refactor changed no output of the default run (issue #59); it is a check for
two runs of the same data, not a statistic: rows are matched by position, not by key.
Exit status: 0 when the runs are identical, 1 when they differ, 2 when an argument is wrong.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

TABLE_SUFFIXES = (".parquet", ".csv", ".json", ".jsonl")


def table_files(root: Path, skip: Sequence[str]) -> set[str]:
    """Relative paths of the table files under ``root``, leaving out dot entries and ``skip`` names."""
    found = set()
    for path in root.rglob("*"):
        parts = path.relative_to(root).parts
        if any(part.startswith(".") or part in skip for part in parts):
            continue
        if path.is_file() and path.name.endswith(TABLE_SUFFIXES):
            found.add(path.relative_to(root).as_posix())
    return found


def _plain(value: Any) -> Any:
    """A cell as plain Python: arrays and tuples become lists, numpy scalars Python numbers."""
    if isinstance(value, np.ndarray | tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def values_equal(a: Any, b: Any, rtol: float) -> bool:
    """Whether two cells are equal: floats to ``rtol`` relative, NaN and None equal to themselves."""
    a, b = _plain(a), _plain(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(values_equal(x, y, rtol) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_equal(a[key], b[key], rtol) for key in a)
    if _missing(a) or _missing(b):
        return _missing(a) and _missing(b)
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=rtol, abs_tol=0.0)
    return bool(type(a) is type(b) and a == b)


def _missing(value: Any) -> bool:
    return value is None or value is pd.NaT or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def flatten_json(value: Any, prefix: str = "") -> dict[str, Any]:
    """A JSON document as ``{path: leaf}``; an empty list or mapping is a leaf of its own."""
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(flatten_json(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(value, list) and value:
        flat = {}
        for index, item in enumerate(value):
            flat.update(flatten_json(item, f"{prefix}[{index}]"))
        return flat
    return {prefix: value}


def read_table(path: Path) -> pd.DataFrame | dict[str, Any]:
    """A parquet or CSV file as a frame, a JSON or JSON-lines file as its flattened paths."""
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".csv":
        return pd.read_csv(path, keep_default_na=False, na_values=[""])
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return flatten_json([json.loads(line) for line in text.splitlines() if line.strip()])
    return flatten_json(json.loads(text))


def without_keys(table: pd.DataFrame | dict[str, Any], ignore: Sequence[str]) -> pd.DataFrame | dict[str, Any]:
    """``table`` without the columns (frame) or flattened keys (JSON) whose name contains an ``ignore`` text."""
    if isinstance(table, pd.DataFrame):
        return table[[c for c in table.columns if not any(text in str(c) for text in ignore)]]
    return {key: value for key, value in table.items() if not any(text in key for text in ignore)}


def _shown(value: Any, width: int = 60) -> str:
    text = repr(_plain(value))
    return text if len(text) <= width else text[: width - 3] + "..."


def compare_json(a: dict[str, Any], b: dict[str, Any], rtol: float, examples: int) -> list[str]:
    """Differences between two flattened JSON documents: keys on one side only, values that differ."""
    lines = [f"key only in A: {key}" for key in sorted(a.keys() - b.keys())]
    lines += [f"key only in B: {key}" for key in sorted(b.keys() - a.keys())]
    changed = [key for key in sorted(a.keys() & b.keys()) if not values_equal(a[key], b[key], rtol)]
    lines += [f"value {key}: {_shown(a[key])} -> {_shown(b[key])}" for key in changed]
    return _cap(lines, examples * 4)


def compare_frames(a: pd.DataFrame, b: pd.DataFrame, rtol: float, examples: int) -> list[str]:
    """Differences between two tables: columns, row count, dtypes, then cells row by row per column."""
    lines = []
    if list(a.columns) != list(b.columns):
        only_a = [c for c in a.columns if c not in b.columns]
        only_b = [c for c in b.columns if c not in a.columns]
        lines.append(f"columns only in A: {only_a}; only in B: {only_b}" if only_a or only_b else "column order")
    if len(a) != len(b):
        lines.append(f"rows: {len(a)} in A, {len(b)} in B (cells compared on the first {min(len(a), len(b))})")
    rows = min(len(a), len(b))
    for column in (c for c in a.columns if c in b.columns):
        if a[column].dtype != b[column].dtype:
            lines.append(f"dtype {column}: {a[column].dtype} -> {b[column].dtype}")
        left, right = a[column].iloc[:rows].tolist(), b[column].iloc[:rows].tolist()
        differing = [row for row in range(rows) if not values_equal(left[row], right[row], rtol)]
        if differing:
            shown = "; ".join(f"row {r}: {_shown(left[r])} -> {_shown(right[r])}" for r in differing[:examples])
            lines.append(f"cells {column}: {len(differing)} of {rows} differ ({shown})")
    return lines


def _cap(lines: list[str], most: int) -> list[str]:
    return lines if len(lines) <= most else [*lines[:most], f"... and {len(lines) - most} more"]


def compare_runs(
    run_a: Path,
    run_b: Path,
    rtol: float = 1e-12,
    skip: Sequence[str] = (),
    examples: int = 5,
    ignore_keys: Sequence[str] = (),
) -> Iterator[tuple[str, list[str]]]:
    """``(relative path, differences)`` for each table file of either run that differs, in path order."""
    files_a, files_b = table_files(run_a, skip), table_files(run_b, skip)
    for name in sorted(files_a | files_b):
        if name not in files_b:
            yield name, ["only in A"]
            continue
        if name not in files_a:
            yield name, ["only in B"]
            continue
        a = without_keys(read_table(run_a / name), ignore_keys)
        b = without_keys(read_table(run_b / name), ignore_keys)
        if isinstance(a, pd.DataFrame) and isinstance(b, pd.DataFrame):
            lines = compare_frames(a, b, rtol, examples)
        else:
            assert isinstance(a, dict) and isinstance(b, dict)  # same suffix, same reader
            lines = compare_json(a, b, rtol, examples)
        if lines:
            yield name, lines


def _folder(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"run folder {text!r} is not a directory")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compare-runs.py", description=__doc__.splitlines()[1])
    parser.add_argument("run_a", type=_folder, help="the first run folder (A), e.g. data/default")
    parser.add_argument("run_b", type=_folder, help="the second run folder (B)")
    parser.add_argument("--rtol", type=float, default=1e-12, help="relative tolerance for floats (1e-12)")
    parser.add_argument("--skip", action="append", default=[], help="a file or folder name to leave out")
    parser.add_argument(
        "--ignore-key", action="append", default=[], help="leave out JSON keys and columns whose name contains this"
    )
    parser.add_argument("--examples", type=int, default=5, help="differing cells shown per column (5)")
    args = parser.parse_args(argv)
    if not args.rtol >= 0:
        parser.error(f"--rtol must be a non-negative number, got {args.rtol}")
    compared = len(table_files(args.run_a, args.skip) | table_files(args.run_b, args.skip))
    differing = 0
    for name, lines in compare_runs(args.run_a, args.run_b, args.rtol, args.skip, args.examples, args.ignore_key):
        differing += 1
        print(name)
        print("\n".join(f"  {line}" for line in lines))
    print(f"{differing} of {compared} table files differ (rtol {args.rtol:g})")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
