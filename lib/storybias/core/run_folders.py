"""Runs live only where runs live: where a run's folders may be, the marker that makes a folder a
run's own, what ``clean-run`` may delete, and the temporary files a killed stage left behind.

A run writes three folders (:func:`storybias.core.paths.run_folders`): its data folder
(``$STORYBIAS_DATA/<run>``, by default ``data/<run>``), its reports folder (``reports/<run>``, or
``<data folder>/reports``) and its figures folder (``figures/<run>``). Each one, after resolving links,
must be

* outside the repository's own folders (``lib/``, ``params/``, ``notebooks/``, ``tests/``, ``docs/``,
  ``scripts/``, ``.git``, ``.venv``) and the model weights (``data/models`` or ``$STORYBIAS_MODELS``):
  neither one of them, nor inside one, nor holding one; never the repository root or a folder above it;
* apart from the roots of the other kinds of run folders (a data folder inside ``figures/`` would be
  some run's figures folder), and a data folder never inside another run's data folder;
* new, or the run's own: a folder holding the marker ``.storybias-run`` with the run's name in it.

The marker is written when the data folder is created (:func:`claim`: every stage's lock, ``make
stamps``) and when a stage creates ``reports/<run>`` (:func:`claim_reports`). A folder made by a version
before markers has none: it is taken as the run's own (and the marker written) only when everything
in it is something a run writes (the registry's artifacts, ``.lock``, ``.params``, ``work/``,
``cache/``, ...; executed notebooks and logs in a reports folder); a folder holding anything else is
refused, naming what it holds, and must be moved or deleted by hand. The figures folder gets no
marker (``figures/default`` is committed): it is the run's when it holds figure files only.

``check-params`` (:func:`storybias.config.params.load`), every stage's lock and ``clean-run`` apply
these rules, so a refused folder is never written, and ``clean-run`` deletes only run folders.
"""

from __future__ import annotations

import os
from pathlib import Path

from storybias.core import paths
from storybias.core.artifacts import ARTIFACTS
from storybias.core.io import atomic_open

MARKER = ".storybias-run"

# What a run writes at the top of its data folder besides the registry's artifacts: the lock, the
# params stamps, resumable work, the model-answer cache, recorded values, the shared servers' registry,
# the benchmarks' results, (under STORYBIAS_DATA) the reports folder, and the ledger of its artifacts (core.digests).
RUN_ENTRIES = frozenset(
    {MARKER, ".lock", ".params", "work", "cache", "values", "servers.json", "reports", ".digests.json", ".digests.lock"}
    | {"bench_generate.json", "bench_generate_served.json", "bench_ray.json"}
    | {entry.pattern.split("/")[0] for entry in ARTIFACTS if entry.root == "data"}
)
REPORT_SUFFIXES = (".ipynb", ".log")
FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".json", ".html")

DATA, REPORTS, FIGURES = "data", "reports", "figures"


class RunFolderError(ValueError):
    """A folder the run may not write or delete; the message names the setting to change."""


def _setting(kind: str, run_name: str) -> str:
    """The settings that put the ``kind`` folder where it is, as the message's subject."""
    variable = "STORYBIAS_FIGURES" if kind == FIGURES else "STORYBIAS_DATA"
    value = os.environ.get(variable)
    return f"run_name {run_name!r}" + (f" with {variable}={value}" if value else "")


def _fix(kind: str) -> str:
    variable = "STORYBIAS_FIGURES" if kind == FIGURES else "STORYBIAS_DATA"
    return f"choose another run_name or {variable}"


def _relation(folder: Path, other: Path) -> str | None:
    if folder == other:
        return "is"
    if other in folder.parents:
        return "is inside"
    if folder in other.parents:
        return "holds"
    return None


def _repository_folders() -> list[tuple[Path, str]]:
    """(folder, what it is) for every folder of the repository and the model weights."""
    root = paths.repo_root()
    named = {
        "lib": "the package's code",
        "params": "the profiles",
        "notebooks": "the notebooks",
        "tests": "the tests",
        "docs": "the documentation",
        "scripts": "the scripts",
        ".git": "git's history",
        ".venv": "the virtual environment",
    }
    return [(root / name, what) for name, what in named.items()] + [(paths.models_dir(), "the model weights")]


# How a folder may lie inside a root it must stay apart from: never, anywhere, or not directly (a folder
# directly inside a data root would be the data folder of some run).
NEVER, INSIDE, DEEP = "never", "inside", "deep"


def _other_roots(kind: str) -> list[tuple[Path, str, str]]:
    """(root, what it is, how a ``kind`` folder may lie inside it) for the roots of the run folders that
    a ``kind`` folder must stay apart from: it may never be one of them nor hold one."""
    root = paths.repo_root()
    in_figures = INSIDE if kind == FIGURES else NEVER
    in_data = INSIDE if kind == DATA else DEEP
    return [
        (paths.figures_root(), "the figures root, moved by STORYBIAS_FIGURES", in_figures),
        (root / "figures", "the figures root", in_figures),
        (paths.data_root(), "the data root, moved by STORYBIAS_DATA", in_data),
        (root / "data", "the default data root", in_data),
        (paths.reports_root(), "the reports root", INSIDE if kind == REPORTS else NEVER),
    ]


def _allowed(relation: str | None, how: str, folder: Path, other: Path) -> bool:
    if relation is None:
        return True
    return relation == "is inside" and (how == INSIDE or (how == DEEP and folder.parent != other))


def _placement_problem(folder: Path, kind: str, run_name: str) -> str | None:
    """Why the run's ``kind`` folder may not be where it is, or None."""
    resolved, root = folder.resolve(), paths.repo_root().resolve()
    where = f"{_setting(kind, run_name)} puts the run's {kind} folder at {folder}"
    if resolved == root or resolved in root.parents:
        return f"{where}, which holds the repository {root}: {_fix(kind)}"
    apart = [(other, what, NEVER) for other, what in _repository_folders()] + _other_roots(kind)
    for other, what, how in apart:
        relation = _relation(resolved, other.resolve())
        if not _allowed(relation, how, resolved, other.resolve()):
            return f"{where}, which {relation} {other} ({what}): {_fix(kind)}"
    for parent in resolved.parents:  # a run folder inside another run's
        if (parent / MARKER).is_file() and not (kind == REPORTS and _owner(parent) == run_name):
            return f"{where}, inside run {_owner(parent)!r}'s folder {parent}: {_fix(kind)}"
    return None


def _owner(folder: Path) -> str:
    return (folder / MARKER).read_text(encoding="utf-8", errors="replace").strip()


def _known(name: str, kind: str) -> bool:
    """True when a run writes entries called ``name`` at the top of its ``kind`` folder."""
    if name == MARKER or name.endswith(".tmp"):
        return True
    if kind == DATA:
        return name in RUN_ENTRIES
    return name.endswith(REPORT_SUFFIXES if kind == REPORTS else FIGURE_SUFFIXES)


def _ownership_problem(folder: Path, kind: str, run_name: str) -> str | None:
    """Why an existing ``kind`` folder is not the run's own, or None (absent, marked, or only run files)."""
    if not folder.exists():
        return None
    subject = f"{_setting(kind, run_name)}: the run's {kind} folder {folder}"
    if not folder.is_dir():
        return f"{subject} exists and is not a folder: {_fix(kind)}"
    if (folder / MARKER).is_file():
        owner = _owner(folder)
        if owner == run_name:
            return None
        return (
            f"{subject} belongs to run {owner!r} (its {MARKER} says so): {_fix(kind)}, or, if you renamed the "
            f"run, write {run_name} into {folder / MARKER}"
        )
    unknown = sorted(entry.name for entry in folder.iterdir() if not _known(entry.name, kind))
    if not unknown:
        return None
    shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
    return (
        f"{subject} is not a storybias run's folder (no {MARKER} marker, and it holds {shown}, which no "
        f"run writes): {_fix(kind)}, or move or delete that folder by hand"
    )


def _folders(run_name: str) -> list[tuple[Path, str]]:
    """(folder, kind) for each folder of the run (the reports folder also where it sits in the data one)."""
    return [
        (paths.run_dir(run_name), DATA),
        (paths.reports_dir(run_name), REPORTS),
        (paths.figures_dir(run_name), FIGURES),
    ]


def problems(run_name: str) -> list[str]:
    """Every reason the run may not write its folders (empty when it may), each naming the setting."""
    found: list[str] = []
    refused: list[Path] = []
    for folder, kind in _folders(run_name):
        if any(bad in folder.parents for bad in refused):
            continue  # the reports folder inside a refused data folder: said once
        problem = _placement_problem(folder, kind, run_name) or _ownership_problem(folder, kind, run_name)
        if problem:
            found.append(problem)
            refused.append(folder)
    return found


def check(run_name: str) -> None:
    """Raise RunFolderError naming every problem of the run's folders (see the module docstring)."""
    found = problems(run_name)
    if found:
        raise RunFolderError("refusing to write run folders:\n" + "\n".join(f"  - {p}" for p in found))


def _mark(folder: Path, run_name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / MARKER).is_file():
        with atomic_open(folder / MARKER, "w", encoding="utf-8") as fh:
            fh.write(run_name + "\n")


def claim(run_name: str) -> Path:
    """Check the run's folders, create its data folder if needed and mark it as the run's; returns it."""
    check(run_name)
    _mark(paths.run_dir(run_name), run_name)
    return paths.run_dir(run_name)


def claim_reports(run_name: str) -> Path:
    """:func:`claim`, and the reports folder created and marked (where it is not inside the data folder)."""
    claim(run_name)
    reports = paths.reports_dir(run_name)
    if paths.run_dir(run_name) in reports.parents:
        reports.mkdir(parents=True, exist_ok=True)
    else:
        _mark(reports, run_name)
    return reports


def deletable(run_name: str) -> list[Path]:
    """The run's folders that exist, each checked to be the run's own (``clean-run`` deletes these).
    Raises RunFolderError, before anything is deleted, when one is not."""
    check(run_name)
    present = [(f, r) for f, r in paths.run_folders(run_name) if f.exists() or f.is_symlink()]
    for folder, root in present:
        if folder.is_symlink() or folder.resolve().parent != root.resolve() or folder.name != run_name:
            raise RunFolderError(f"refusing to delete {folder}: it is not a folder directly inside {root}")
    return [folder for folder, _ in present]


def _temporary(name: str) -> bool:
    """A file written to a temporary name and renamed into place when complete (storybias.core.io's
    ``.<name>.<random>.tmp``, papermill's ``NN_name.tmp.ipynb``): left only by a killed process."""
    return name.endswith((".tmp", ".tmp.ipynb"))


def remove_stale_temporaries(run_name: str) -> list[Path]:
    """Delete the temporary files an interrupted stage left in the run's folders; returns them.

    Call it holding the run's lock (:func:`storybias.core.locks.run_lock` does, when it takes the lock):
    then no other process of the run is writing, so every temporary file is a leftover."""
    removed: list[Path] = []
    data = paths.run_dir(run_name)
    if data.is_dir():
        for walked, _, names in os.walk(data):
            removed += [Path(walked) / name for name in names if _temporary(name)]
    for folder in (paths.reports_dir(run_name), paths.figures_dir(run_name)):
        if folder.is_dir() and data not in folder.parents:
            removed += [entry for entry in folder.iterdir() if entry.is_file() and _temporary(entry.name)]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed
