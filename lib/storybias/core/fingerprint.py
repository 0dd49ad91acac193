"""The sha256 of input files, computed once per version of a file.

:class:`FileHashes` keeps each file's digest in a small JSON store with the file's size and modification
time (``st_mtime_ns``): a file whose size and time are unchanged is not read again, so the stamps step
every ``make`` runs first hashes a multi-gigabyte corpus once, then only the files that changed.

An edit that keeps the size within the clock's resolution of the hash (the file changed in the same
instant it was read) would look unchanged; as Git does for its index, an entry whose file was modified
less than :data:`RACY_NS` before it was hashed is not trusted, and the file is hashed again next time.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from storybias.core.io import write_json_atomic

RACY_NS = 2_000_000_000  # a file modified within 2 s of its hash is hashed again next time


class FileHashes:
    """sha256 of files, cached in ``store`` (JSON) by absolute path, size and ``st_mtime_ns``."""

    def __init__(self, store: Path):
        self.store = store
        self.entries: dict[str, dict[str, Any]] = self._read(store)
        self.used: set[str] = set()
        self.hashed: list[Path] = []  # the files read this time (the others came from the store)

    @staticmethod
    def _read(store: Path) -> dict[str, dict[str, Any]]:
        try:
            entries = json.loads(store.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # none yet, or unreadable: every file is hashed again
            return {}
        return entries if isinstance(entries, dict) else {}

    def sha256(self, path: Path) -> str:
        """The file's sha256 (hex): from the store when its size and time match a trusted entry."""
        key = str(path.resolve())
        stat = path.stat()
        entry = self.entries.get(key)
        self.used.add(key)
        if (
            isinstance(entry, dict)
            and entry.get("size") == stat.st_size
            and entry.get("mtime_ns") == stat.st_mtime_ns
            and int(entry.get("hashed_at_ns", 0)) - stat.st_mtime_ns >= RACY_NS
        ):
            return str(entry["sha256"])
        hashed_at = time.time_ns()
        with open(path, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        self.entries[key] = {
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "hashed_at_ns": hashed_at,
            "sha256": digest,
        }
        self.hashed.append(path)
        return digest

    def save(self) -> None:
        """Write the store (atomically) with the entries of the files asked for since it was read."""
        kept = {key: entry for key, entry in self.entries.items() if key in self.used}
        if kept != self._read(self.store):
            write_json_atomic(kept, self.store)
