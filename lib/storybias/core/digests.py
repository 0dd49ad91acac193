"""The run's ledger of what its stages wrote (issue #58 item 10): every table, JSON file and page written by
``storybias.core.io.atomic_open`` directly in a run's data folder (``data/<run>/``) or figures folder
(``figures/<run>/``) is recorded in ``data/<run>/.digests.json`` with its size, sha256 and file times, as it is
renamed into place. ``storybias.core.integrity`` compares the files with it before every ``make`` of a stage.

Nothing else is recorded: shards, caches and scratch files live in sub-folders, and a file name that starts
with a dot is storybias' own bookkeeping.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from storybias.core import paths

LEDGER = ".digests.json"
RECORDED_SUFFIXES = (".parquet", ".json", ".html")
CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def ledger_key(path: Path) -> tuple[str, str] | None:
    """(run, key) of a file the ledger records: ``data/<name>`` or ``figures/<name>`` of run ``<run>``; None
    for a file outside a run's folders, in a sub-folder, hidden, or of another kind."""
    if path.name.startswith(".") or path.suffix not in RECORDED_SUFFIXES:
        return None
    folder = path.parent.resolve()
    for root_name, root in (("data", paths.data_root()), ("figures", paths.figures_root())):
        if folder.parent == root.resolve() and paths.RUN_NAME.match(folder.name):
            return folder.name, f"{root_name}/{path.name}"
    return None


def stat_record(path: Path) -> dict[str, Any]:
    """What the ledger stores of a file: size, sha256, and the times that tell a later check whether the
    file could have changed (a change of content always changes ``ctime_ns``, which no tool sets back)."""
    stat = path.stat()
    return {"size": stat.st_size, "sha256": sha256_of(path), "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns}


@contextmanager
def _locked(run_dir: Path) -> Iterator[None]:
    with open(run_dir / ".digests.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_ledger(run_name: str) -> dict[str, dict[str, Any]]:
    """The run's ledger (empty when there is none or it cannot be read: nothing is then known to be wrong)."""
    try:
        ledger = json.loads((paths.run_dir(run_name) / LEDGER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return ledger if isinstance(ledger, dict) else {}


def record_written(path: Path) -> None:
    """Record ``path`` in its run's ledger, when it is a file the ledger keeps (:func:`ledger_key`) and the
    run's data folder exists."""
    located = ledger_key(path)
    if located is None:
        return
    run, key = located
    run_dir = paths.run_dir(run)
    if not run_dir.is_dir():
        return
    record = stat_record(path)
    with _locked(run_dir):
        ledger = read_ledger(run)
        ledger[key] = record
        fd, tmp = tempfile.mkstemp(prefix=".digests.", suffix=".tmp", dir=run_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(ledger, fh, indent=1, sort_keys=True)
            os.replace(tmp, run_dir / LEDGER)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
