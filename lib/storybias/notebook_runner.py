"""How Make runs a stage: papermill on the stage's notebook, under the run's lock.

``python -m storybias.cli run-stage STAGE NOTEBOOK PARAMS --target FILE`` does what the Makefile's
recipe used to do in shell, without a shell command line (a checkout or profile path with a space in
it is just an argument):

1. take the run's lock (storybias.locks): a second process on the same run is refused at once with
   the holder's pid and stage, and touches nothing (not the temporary notebook, not the target);
2. execute the notebook with papermill into ``reports/<run>/NN_name.tmp.ipynb``, its log in
   ``reports/<run>/NN_name.log``;
3. on success, rename the executed notebook to ``reports/<run>/NN_name.ipynb``; on failure, show the
   log's tail and remove the Make target *if this process wrote it*, so Make reruns the stage next
   time. (The Makefile marks the stage targets .PRECIOUS: Make itself never deletes them, because a
   refused second process must not delete the target that the first one just wrote.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from . import paths
from .locks import RunBusy, run_lock


def papermill_command(notebook: Path, output: Path, params_file: Path) -> list[str]:
    """papermill's argument list (no shell: every path is one argument, spaces and all)."""
    return [sys.executable, "-m", "papermill", str(notebook), str(output), "-k", "storybias",
            "--cwd", str(paths.repo_root() / "notebooks"), "-p", "params_file", str(params_file),
            "--log-output", "--no-progress-bar"]


def _mtime(path: Path | None) -> float | None:
    return path.stat().st_mtime_ns if path is not None and path.exists() else None


def run_stage(stage: str, notebook: Path, params_file: Path, run_name: str, target: Path | None = None,
              log: Callable[[str], None] = print) -> int:
    """Execute one stage notebook for ``run_name``; returns the process exit code (0 = success)."""
    reports = paths.reports_dir(run_name)
    name = notebook.stem
    tmp_notebook, final_notebook, log_file = reports / f"{name}.tmp.ipynb", reports / f"{name}.ipynb", reports / f"{name}.log"
    try:
        with run_lock(run_name, stage, log=log):
            reports.mkdir(parents=True, exist_ok=True)
            target_before = _mtime(target)
            log(f"== stage {stage}: {notebook.relative_to(paths.repo_root()) if notebook.is_relative_to(paths.repo_root()) else notebook} "
                f"(params {params_file}, run {run_name}); log: {log_file}")
            with open(log_file, "w", encoding="utf-8") as fh:
                done = subprocess.run(papermill_command(notebook, tmp_notebook, params_file), stdout=fh,
                                      stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
            if done.returncode != 0:
                tail = log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
                print(f"stage {stage} FAILED: see {log_file} and {tmp_notebook}", file=sys.stderr)
                print("\n".join(tail), file=sys.stderr)
                if target is not None and _mtime(target) != target_before:
                    target.unlink(missing_ok=True)  # half-finished stage: Make must rerun it
                    print(f"removed {target} (written by this failed run)", file=sys.stderr)
                return 1
            os.replace(tmp_notebook, final_notebook)
            return 0
    except RunBusy as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        return 3
