"""A copy of the repository's working tree for tests that run `make` where it could write or delete
(a checkout under a path with a space, `make clean-run` on a folder inside the code)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from storybias.core import paths


def copy_working_tree(copy: Path) -> Path:
    """Copy the tracked files and the new ones git does not ignore into ``copy`` (modes and times kept), with
    ``.venv`` a link to this checkout's, so `make` there uses the environment as it is; returns ``copy``."""
    root = paths.repo_root()
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        if (root / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, copy / name)
    (copy / ".venv").symlink_to(root / ".venv")
    return copy
