"""Where every file of a run lives. Every stage imports its paths from here and nowhere else.

Layout (relative to the repository root):

    params/<profile>.yaml               parameters (validated by storybias.config.params)
    params/designs/<design>/...         prompt designs (canonical keys + per-language text)
    data/models/<name>/                 converted embedded model (never committed)
    data/<run>/stories.parquet          stage 01 output, and the other stage artifacts
                                        (names, patterns and schemas: storybias.core.artifacts)
    data/<run>/work/<stage>/            resumable shards of an unfinished stage
    data/<run>/.storybias-run           the run's marker: this folder is run <run>'s own
    reports/<run>/NN_name.ipynb         executed notebooks (<run folder>/reports/ under STORYBIAS_DATA)
    figures/<run>/                      figures (PNG + PDF)

``STORYBIAS_DATA`` moves the run folders elsewhere (e.g. a bigger disk), and the run's executed notebooks
with them, into ``$STORYBIAS_DATA/<run>/reports/``: two runs of one name under two data roots never
share a reports folder, and the run's lock covers it. ``STORYBIAS_MODELS`` moves data/models/;
``STORYBIAS_FIGURES`` moves figures/. A relative value is taken relative to the repository root (where
Make runs), never to the current directory: notebooks run with notebooks/ as their working directory,
and must see the same folders as Make. Where a run's folders may be, and which folder ``clean-run`` may
delete: :mod:`storybias.core.run_folders`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_MARKER = "pyproject.toml"


def repo_root() -> Path:
    """The repository root: the first parent of this file that holds pyproject.toml."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / _MARKER).is_file() and (parent / "lib" / "storybias").is_dir():
            return parent
    raise RuntimeError(f"storybias: cannot find the repository root above {here}")


def resolve(path: str | os.PathLike[str]) -> Path:
    """A path as given in params or on the command line: absolute, or relative to the repo root.

    Notebooks run with notebooks/ as their working directory (JupyterLab) or the root (papermill);
    resolving against the root makes the same params file work in both.
    """
    p = Path(path).expanduser()
    return p if p.is_absolute() else repo_root() / p


def params_dir() -> Path:
    return repo_root() / "params"


def designs_dir() -> Path:
    return params_dir() / "designs"


def worked_examples_path() -> Path:
    """Stage 03's worked examples (``extract.worked_examples``)."""
    return params_dir() / "extract" / "worked_examples.yaml"


def _from_env(variable: str, default: Path) -> Path:
    value = os.environ.get(variable)
    return resolve(value).resolve() if value else default


def data_root() -> Path:
    return _from_env("STORYBIAS_DATA", repo_root() / "data")


def models_dir() -> Path:
    """Converted and local model weights. Independent of STORYBIAS_DATA (moving a run's data does not
    move the 3.4 GB model cache); ``STORYBIAS_MODELS`` moves it."""
    return _from_env("STORYBIAS_MODELS", repo_root() / "data" / "models")


def run_dir(run_name: str) -> Path:
    return data_root() / run_name


def work_dir(run_name: str, stage: str) -> Path:
    """Scratch space of a stage in progress (resumable shards). Removed when the stage completes."""
    return run_dir(run_name) / "work" / stage


def reports_root() -> Path:
    """reports/: the executed notebooks of the runs under the default data root."""
    return repo_root() / "reports"


def reports_dir(run_name: str) -> Path:
    """Where the run's executed notebooks and logs go: reports/<run>/ under the default data root,
    ``$STORYBIAS_DATA/<run>/reports/`` when STORYBIAS_DATA is set (the Makefile's REPORTS says the same)."""
    if os.environ.get("STORYBIAS_DATA"):
        return run_dir(run_name) / "reports"
    return reports_root() / run_name


def figures_root() -> Path:
    """figures/ (or $STORYBIAS_FIGURES: the tests keep their figures out of the repository)."""
    return _from_env("STORYBIAS_FIGURES", repo_root() / "figures")


def figures_dir(run_name: str) -> Path:
    """figures/<run>/ (or $STORYBIAS_FIGURES/<run>/)."""
    return figures_root() / run_name


def run_folders(run_name: str) -> list[tuple[Path, Path]]:
    """(folder, the root it must sit directly in) for every folder that belongs to one run only; the
    reports folder is listed only where it is not inside the run's data folder."""
    folders = [(run_dir(run_name), data_root())]
    if not os.environ.get("STORYBIAS_DATA"):
        folders.append((reports_dir(run_name), reports_root()))
    return [*folders, (figures_dir(run_name), figures_root())]


RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


# Characters Make would read as something else in a variable's value (or split a path on).
_MAKE_UNSAFE = re.compile(r"[\s$#\\:;=%*?\[\]`'\"]")


def make_variables(run_name: str) -> str:
    """The run's name and folders as Make assignments (``RUN``, ``DATA``, ``REPORTS``, ``FIGURES``,
    ``STAMPS``): what the Makefile reads instead of parsing the profile itself (``storybias.cli where
    --make``). A folder inside the repository is written relative to it, as Make runs there. Raises
    ValueError naming the folder when a path holds a character Make cannot carry in a file name."""
    root = repo_root()

    def shown(path: Path) -> str:
        text = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        unsafe = _MAKE_UNSAFE.search(text)
        if unsafe:
            raise ValueError(f"{text}: Make cannot track a folder whose path holds {unsafe[0]!r}")
        return text

    data = shown(run_dir(run_name))
    folders = {
        "RUN": run_name,
        "DATA": data,
        "REPORTS": shown(reports_dir(run_name)),
        "FIGURES": shown(figures_dir(run_name)),
        "STAMPS": f"{data}/.params",
    }
    return "".join(f"{name} := {value}\n" for name, value in folders.items())
