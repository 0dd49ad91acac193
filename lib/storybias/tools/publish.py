"""The committed notebooks show a real run: ``make publish-notebooks`` copies the outputs of a run's
executed notebooks (``reports/<run>/NN_name.ipynb``, written by ``make paper``) into
``notebooks/NN_name.ipynb``.

A reader who opens a notebook on the forge then sees the default run's tables and figures, not the
smoke profile's zeros. The copy keeps the committed notebook's own cells (their sources, ids and
tags) and takes from the executed copy only what running produced: outputs and execution counts. It
refuses, naming the notebook and cell, when the notebook's code or prose changed since the run (the
outputs would describe other code), and drops what papermill added: the injected-parameters cell,
which would pin the notebook to the run's profile, and papermill's metadata. Absolute paths of the
machine that ran it are shortened to paths under the repository. nbval still runs every committed
notebook on the smoke profile, comparing only the cells whose output is the same on every run.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import TYPE_CHECKING

from storybias.core import paths
from storybias.core.artifacts import STAGES
from storybias.core.io import atomic_open

INJECTED = "injected-parameters"  # papermill's tag on the cell it adds after the parameters cell
# a virtual environment's absolute path (the kernel's may live outside the repository, e.g. a worktree's)
VENV_PATH = re.compile(r"/[^\s'\"]*/\.venv/")

if TYPE_CHECKING:
    from nbformat import NotebookNode


class StaleRun(ValueError):
    """The committed notebook changed since the run whose outputs would be copied into it."""


def _without_injected(cells: list) -> list:
    return [c for c in cells if INJECTED not in c.get("metadata", {}).get("tags", [])]


def _shorten_paths(value: object, root: str) -> object:
    """Every string inside an output with the repository's absolute path made relative."""
    if isinstance(value, str):
        return VENV_PATH.sub(".venv/", value.replace(root + "/", "").replace(root, "."))
    if isinstance(value, list):
        return [_shorten_paths(v, root) for v in value]
    if isinstance(value, dict):
        return {k: _shorten_paths(v, root) for k, v in value.items()}
    return value


def merge_outputs(committed: NotebookNode, executed: NotebookNode, name: str) -> NotebookNode:
    """``committed`` with the outputs and execution counts of ``executed`` (the same cells, run)."""
    import nbformat  # heavy, see publish_notebooks

    ran = _without_injected(executed.cells)
    if len(ran) != len(committed.cells):
        raise StaleRun(
            f"{name}: the run executed {len(ran)} cells, the notebook has {len(committed.cells)}; "
            "rerun the stage (make paper) before publishing"
        )
    root = str(paths.repo_root())
    merged = copy.deepcopy(committed)
    for number, (cell, run) in enumerate(zip(merged.cells, ran, strict=True)):
        if cell.cell_type != run.cell_type or cell.source != run.source:
            raise StaleRun(f"{name}: cell {number} changed since the run; rerun the stage (make paper) first")
        if cell.cell_type == "code":
            cell.outputs = nbformat.from_dict(_shorten_paths(run.get("outputs", []), root))
            cell.execution_count = run.get("execution_count")
            for key in ("execution", "papermill"):
                cell.metadata.pop(key, None)
    merged.metadata.pop("papermill", None)
    return merged


def publish_notebooks(run_name: str, notebooks: Path | None = None) -> list[Path]:
    """Copy the outputs of ``reports/<run_name>/``'s executed notebooks into ``notebooks/``; returns
    the notebooks written. Every executed notebook is checked before any is written."""
    # Imported here, not at the top, on purpose: nbformat's validator imports jsonschema's format
    # checkers, and rfc3987-syntax builds its parser at import (1.3 s of CPU). Every `storybias.cli`
    # call (Make runs `stamps` before each stage) imported it for this one command.
    import nbformat

    notebooks = notebooks or paths.repo_root() / "notebooks"
    reports = paths.reports_dir(run_name)  # reports/<run>/, or the run folder's reports/ under STORYBIAS_DATA
    merged = {}
    for stage in STAGES:
        name = Path(stage.notebook).name
        executed = reports / name
        if not executed.is_file():
            raise FileNotFoundError(f"{executed}: no executed notebook; run `make paper` for run {run_name!r} first")
        committed = nbformat.read(notebooks / name, as_version=4)
        merged[name] = merge_outputs(committed, nbformat.read(executed, as_version=4), name)
    written = []
    for name, notebook in merged.items():
        target = notebooks / name
        with atomic_open(target, "w", encoding="utf-8") as out:
            nbformat.write(notebook, out)
        written.append(target)
    return written
