"""Corrupt artifacts noticed (issue #58 item 10): a file a stage wrote that no longer matches the run's ledger
(``storybias.core.digests``: its size and sha256 when it was written) makes the stage that wrote it stale.

A truncated ``extractions.parquet`` with its old modification time used to be "up to date" for Make.
``storybias.cli stamps``, run before every ``make`` of a stage, calls :func:`invalidate_corrupt`: the stage's
Make target is removed and its params stamp touched, so this ``make`` (which may already have looked at the
target) and the next one rerun the stage, and the command says which file changed and how.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storybias.core.artifacts import ARTIFACTS, MAKE_TARGETS, artifact
from storybias.core.digests import read_ledger, sha256_of


@dataclass(frozen=True)
class Stale:
    """An artifact that differs from what its stage wrote."""

    stage: str
    path: Path
    reason: str


def _difference(path: Path, record: dict[str, Any]) -> str | None:
    """How ``path`` differs from its ledger record (None when it does not); the sha256 is read only when
    size and file times leave a doubt."""
    try:
        stat = path.stat()
    except OSError:
        return None  # a missing target is Make's business: it reruns the stage
    if stat.st_size != record.get("size"):
        return f"{stat.st_size:,} bytes where its stage wrote {record.get('size'):,}"
    if stat.st_mtime_ns == record.get("mtime_ns") and stat.st_ctime_ns == record.get("ctime_ns"):
        return None
    if sha256_of(path) != record.get("sha256"):
        return "its content (sha256) differs from what its stage wrote"
    return None


def stale_artifacts(run_name: str) -> list[Stale]:
    """Every artifact of the run (the registry's, storybias.core.artifacts) whose file differs from the
    run's ledger; an artifact the ledger does not hold (written before the ledger existed) is not judged."""
    ledger = read_ledger(run_name)
    stale = []
    for entry in ARTIFACTS:
        record = ledger.get(f"{entry.root}/{entry.pattern}")
        if not isinstance(record, dict):
            continue
        path = entry.path(run_name)
        reason = _difference(path, record)
        if reason is not None:
            stale.append(Stale(entry.stage, path, reason))
    return stale


def invalidate_corrupt(run_name: str, stamps: Path, log: Callable[[str], None] = print) -> list[Stale]:
    """For each stale artifact: remove its stage's Make targets and touch the stage's stamp
    (``<stamps>/<stage>.params``), saying which file changed and how; returns the stale artifacts."""
    stale = stale_artifacts(run_name)
    for item in stale:
        for name in MAKE_TARGETS.get(item.stage, ()):
            artifact(name).path(run_name).unlink(missing_ok=True)
        stamp = stamps / f"{item.stage}.params"
        if stamp.is_file():
            os.utime(stamp)
        log(
            f"storybias: {item.path} changed since stage {item.stage} wrote it ({item.reason}): "
            f"stage {item.stage} reruns"
        )
    return stale
