"""A run with overrides (storybias.config.overrides): where it starts from, and what moved.

A run named from its base run and overrides starts as a copy of the base run's data folder (its
artifacts, the answer and embedding caches, the params stamps, the recorded values and, where they live
apart, its executed notebooks), the files' modification times kept (:func:`seed`). ``storybias.cli
stamps`` then rewrites only the stamps of the stages whose parameters the overrides change, so Make
reruns those stages and the ones that read them, and every earlier stage's files are the base run's
answers; model calls of a rerun stage come from the copied cache when the requests are the same. The
base run is only read. Figures are not copied: the figure stage draws them again.

:func:`what_moved` compares the named values each stage recorded (``data/<run>/values/<stage>.json``,
storybias.core.io.record_values) between the base run and the derived one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from storybias.core import paths
from storybias.core.run_folders import MARKER, claim_reports

__all__ = ["WHAT_MOVED_COLUMNS", "format_what_moved", "seed", "what_moved"]

# never copied: the base run's lock, marker, server registry and ledger lock are the base run's own
_NOT_COPIED = frozenset({MARKER, ".lock", "servers.json", ".digests.lock"})
WHAT_MOVED_COLUMNS = ["stage", "value", "base", "this_run"]


def _fresh(folder: Path) -> bool:
    """No run has written ``folder`` yet (absent, or holding only a lock and a marker)."""
    return not folder.is_dir() or {p.name for p in folder.iterdir()} <= {".lock", MARKER}


def _copy_entries(source: Path, target: Path, skip: frozenset[str]) -> list[Path]:
    copied = []
    for entry in sorted(source.iterdir()):
        if entry.name in skip or entry.name.endswith(".tmp") or entry.is_symlink():
            continue
        destination = target / entry.name
        if entry.is_dir():
            shutil.copytree(entry, destination, copy_function=shutil.copy2, dirs_exist_ok=True)
        else:
            shutil.copy2(entry, destination)
        copied.append(destination)
    return copied


def seed(base_run: str, run_name: str) -> list[Path]:
    """Copy ``base_run``'s data folder (and its separate reports folder) into the new run ``run_name``,
    once: only while the new run's data folder is fresh, and only when the base run exists. Returns what
    was copied (nothing for a run without a base, a missing base or a run already started)."""
    base, data = paths.run_dir(base_run), paths.run_dir(run_name)
    if base_run == run_name or not base.is_dir() or not _fresh(data):
        return []
    reports = claim_reports(run_name)  # checks the new run's folders, creates and marks them
    copied = _copy_entries(base, data, _NOT_COPIED)
    base_reports = paths.reports_dir(base_run)
    if base_reports.is_dir() and base not in base_reports.parents:
        copied += _copy_entries(base_reports, reports, _NOT_COPIED)
    return copied


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested recorded values as dotted names (a list stays one value)."""
    flat: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, dict) and value:
            flat |= _flatten(value, f"{prefix}{name}.")
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def _recorded(run_name: str) -> dict[str, dict[str, Any]]:
    folder = paths.run_dir(run_name) / "values"
    if not folder.is_dir():
        return {}
    return {path.stem: _flatten(json.loads(path.read_text(encoding="utf-8"))) for path in sorted(folder.glob("*.json"))}


_MISSING = "(not recorded)"


def what_moved(base_run: str, run_name: str) -> pd.DataFrame:
    """One row per named value that differs between the two runs' recorded values (one recorded by only
    one of them included, shown as "(not recorded)"): stage, value, base (the base run's), this_run."""
    before, after = _recorded(base_run), _recorded(run_name)
    rows = []
    for stage in sorted(set(before) | set(after)):
        old, new = before.get(stage, {}), after.get(stage, {})
        for name in sorted(set(old) | set(new)):
            if old.get(name, _MISSING) != new.get(name, _MISSING):
                rows.append((stage, name, old.get(name, _MISSING), new.get(name, _MISSING)))
    return pd.DataFrame(rows, columns=WHAT_MOVED_COLUMNS)


def _cell(value: Any, width: int = 40) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def format_what_moved(base_run: str, run_name: str, table: pd.DataFrame) -> str:
    """``table`` (:func:`what_moved`) as the text ``make`` prints."""
    title = f"what moved: run '{run_name}' against its base run '{base_run}'"
    if table.empty:
        return f"{title}: no recorded value differs"
    cells = [[_cell(v) for v in row] for row in table.itertuples(index=False)]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(WHAT_MOVED_COLUMNS)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(WHAT_MOVED_COLUMNS, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)
