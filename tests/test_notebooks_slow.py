"""nbval over the committed notebooks, on the finished smoke run of the slow tests.

Every stage's artifacts exist by then, so the notebooks find nothing left to compute and re-run their
analysis cells from the stored data (`--nbval-lax`: every cell must run without error; outputs are
not compared, since LLM text varies between machines).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from storybias import paths

pytestmark = pytest.mark.slow
NOTEBOOKS = ["notebooks/01_generate.ipynb", "notebooks/02_filter.ipynb", "notebooks/03_extract.ipynb", "notebooks/05_metrics.ipynb"]


def test_committed_notebooks_pass_nbval(extracted, kill_profile):
    path, env, _ = kill_profile
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
         "--nbval-kernel-name", "storybias", "--nbval-cell-timeout", "900", *NOTEBOOKS],
        cwd=paths.repo_root(), env=dict(env, STORYBIAS_PARAMS=str(path)), capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout
