"""Issue #44, items 1, 7 and 8: runs live only where runs live, a run's reports follow STORYBIAS_DATA
and are written under its lock, and a killed stage leaves nothing behind (its temporary files are removed
by the next stage, its executed notebook is written by the next `make`).

Every `make` that could write into or delete a repository folder runs in a copy of the repository
(the ``checkout`` fixture), never in the real checkout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from stage_notebooks import tiny_stage_notebook
from storybias.config.params import ParamsError, load
from storybias.core import locks, paths, run_folders
from storybias.tools.notebook_runner import run_stage
from working_tree import copy_working_tree

ROOT = paths.repo_root()
PYTHON = sys.executable
MOVED = ("STORYBIAS_DATA", "STORYBIAS_FIGURES", "STORYBIAS_MODELS")


def write_profile(folder: Path, run_name: str) -> Path:
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["run_name"] = run_name
    path = folder / f"{run_name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def files(folder: Path) -> list[str]:
    """Every file under ``folder``, relative to it."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def run_make(cwd: Path, *args: str, **variables: str) -> subprocess.CompletedProcess:
    """`make ARGS` in ``cwd`` with that checkout's code, the folders moved only by ``variables``."""
    env = {k: v for k, v in os.environ.items() if k not in MOVED}
    env.update(PYTHONPATH=str(cwd / "lib"), **variables)
    return subprocess.run(
        ["make", "-s", "--no-print-directory", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the repository (tracked and untracked files git does not ignore; .venv a link to this
    one's), in which `make clean-run` may run: what it could delete there is a copy."""
    copy = copy_working_tree(tmp_path / "checkout")
    planned = run_make(copy, "-n", "clean-run")
    assert "setup-venv" not in planned.stdout, "the copy must use the shared .venv as it is, never rebuild it"
    return copy


# --- 1. runs live only where runs live ------------------------------------------------------------


def test_a_run_in_the_package_is_refused_and_clean_run_never_deletes_it(checkout, tmp_path):
    """The issue's attack: `run_name: storybias` with STORYBIAS_DATA=lib passed check-params, `make filter`
    wrote its lock and stories.parquet into lib/storybias/, and `make clean-run` deleted the package."""
    package = checkout / "lib" / "storybias"
    before = files(package)
    profile = f"PARAMS={write_profile(tmp_path / 'profiles', 'storybias')}"
    for target in ("check-params", "filter", "clean-run"):
        result = run_make(checkout, target, profile, STORYBIAS_DATA="lib")
        assert result.returncode != 0, target
        assert "run_name 'storybias' with STORYBIAS_DATA=" in result.stderr, (target, result.stderr)
        assert f"{package}, which is inside {checkout / 'lib'} (the package's code)" in result.stderr
        assert files(package) == before, f"`make {target}` wrote nothing into lib/storybias"
    # what an earlier version left there: clean-run still refuses, deleting nothing
    (package / ".lock").write_text("")
    (package / "stories.parquet").write_text("stand-in")
    assert run_make(checkout, "clean-run", profile, STORYBIAS_DATA="lib").returncode != 0
    assert files(package) == sorted([*before, ".lock", "stories.parquet"])


def test_a_run_in_the_weights_or_the_code_folder_is_refused(checkout, tmp_path):
    weights = checkout / "data" / "models" / "qwen" / "config.json"
    weights.parent.mkdir(parents=True)
    weights.write_text("{}")
    models = run_make(checkout, "clean-run", f"PARAMS={write_profile(tmp_path, 'models')}")
    assert models.returncode == 2 and "run_name 'models' puts the run's data folder" in models.stderr
    assert "(the model weights)" in models.stderr and weights.is_file()
    lib = run_make(checkout, "clean-run", f"PARAMS={write_profile(tmp_path, 'lib')}", STORYBIAS_DATA=".")
    assert lib.returncode == 2 and f"run_name 'lib' with STORYBIAS_DATA={checkout}" in lib.stderr
    assert (checkout / "lib" / "storybias" / "cli" / "__init__.py").is_file()
    data = run_make(checkout, "check-params", f"PARAMS={write_profile(tmp_path, 'data')}", STORYBIAS_DATA=".")
    assert data.returncode == 2 and f"data folder at {checkout / 'data'}, which holds" in data.stderr


def test_clean_run_deletes_marked_and_earlier_run_folders_and_refuses_the_others(checkout, tmp_path):
    """The default layout: data/<run>/ (marked by the run), reports/<run>/ and figures/<run>/."""
    mine = f"PARAMS={write_profile(tmp_path, 'mine')}"
    assert run_make(checkout, "stamps", mine).returncode == 0
    assert (checkout / "data" / "mine" / ".storybias-run").read_text() == "mine\n"
    for path in ("reports/mine/01_generate.ipynb", "reports/mine/01_generate.log", "figures/mine/01_vsr.png"):
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        (checkout / path).write_text("x")
    done = run_make(checkout, "clean-run", mine)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"removed {checkout / f}" for f in ("data/mine", "reports/mine", "figures/mine")
    ]
    # made by a version before markers, holding only what a run writes: taken as the run's
    old = checkout / "data" / "old"
    (old / "work" / "generate").mkdir(parents=True)
    for name in (".lock", "stories.parquet", "work/generate/part-000000.parquet"):
        (old / name).write_text("x")
    assert run_make(checkout, "clean-run", f"PARAMS={write_profile(tmp_path, 'old')}").returncode == 0
    assert not old.exists()
    # a folder that is not a run's, or another run's: refused by check-params and clean-run alike
    notes = checkout / "data" / "notes"
    notes.mkdir()
    (notes / "thesis.tex").write_text("mine, not storybias's")
    (notes / "stories.parquet").write_text("x")
    for target in ("check-params", "clean-run"):
        refused = run_make(checkout, target, f"PARAMS={write_profile(tmp_path, 'notes')}")
        assert refused.returncode == 2 and "holds thesis.tex, which no run writes" in refused.stderr, target
    assert files(notes) == ["stories.parquet", "thesis.tex"]
    renamed = checkout / "data" / "renamed"
    renamed.mkdir()
    (renamed / ".storybias-run").write_text("other\n")
    refused = run_make(checkout, "clean-run", f"PARAMS={write_profile(tmp_path, 'renamed')}")
    assert refused.returncode == 2 and "belongs to run 'other'" in refused.stderr and renamed.is_dir()


def test_every_stage_refuses_a_bad_folder_before_writing(checkout, tmp_path):
    """A stage called with a profile that skipped the loader's check (built in code) is refused by the
    run's lock, before it creates anything."""
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["run_name"] = "storybias"
    code = (
        "from pathlib import Path\nfrom storybias.config.params import Params, Profile\n"
        "from storybias.core.run_folders import RunFolderError\nfrom storybias.stages import filter\n"
        f"p = Params(Profile.model_validate({raw!r}), Path('x.yaml'))\n"
        "try:\n    filter.run(p)\nexcept RunFolderError as exc:\n    print('refused:', exc)\n"
    )
    package = checkout / "lib" / "storybias"
    before = files(package)
    env = {k: v for k, v in os.environ.items() if k not in MOVED}
    env.update(PYTHONPATH=str(checkout / "lib"), STORYBIAS_DATA=str(checkout / "lib"))
    done = subprocess.run([PYTHON, "-c", code], cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    assert "refused:" in done.stdout and "run_name 'storybias'" in done.stdout, done.stdout + done.stderr
    assert files(package) == before


def test_a_run_inside_another_runs_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    with locks.run_lock("outer", "generate", log=lambda m: None):
        pass
    assert (tmp_path / "data" / "outer" / run_folders.MARKER).read_text() == "outer\n"
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data" / "outer"))
    with pytest.raises(run_folders.RunFolderError, match=r"inside run 'outer'.s folder"):
        with locks.run_lock("cache", "generate"):
            pass
    with pytest.raises(ParamsError, match=r"run_name 'cache' with STORYBIAS_DATA=.*inside run 'outer'"):
        load(write_profile(tmp_path, "cache"))


def test_an_earlier_run_folder_is_adopted_and_a_foreign_one_left_untouched(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path))
    (tmp_path / "earlier" / "work").mkdir(parents=True)
    (tmp_path / "earlier" / "filtered.parquet").write_text("x")
    with locks.run_lock("earlier", "filter", log=lambda m: None):
        pass
    assert (tmp_path / "earlier" / run_folders.MARKER).read_text() == "earlier\n"
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_text("x")
    with pytest.raises(run_folders.RunFolderError, match=r"holds cat.jpg, which no run writes"):
        with locks.run_lock("photos", "filter"):
            pass
    assert files(tmp_path / "photos") == ["cat.jpg"], "no lock, no marker written"


# --- 7. the reports follow STORYBIAS_DATA, under the run's lock ------------------------------------


def _make_reports(**variables: str) -> Path:
    printed = run_make(ROOT, "--eval", "print-reports: ; @echo $(abspath $(REPORTS))", "print-reports", **variables)
    assert printed.returncode == 0, printed.stderr
    return Path(printed.stdout.strip())


def test_reports_follow_the_data_root_and_make_agrees(tmp_path, monkeypatch):
    for variable in MOVED:
        monkeypatch.delenv(variable, raising=False)
    assert paths.reports_dir("default") == ROOT / "reports" / "default" == _make_reports()
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "a"))
    assert paths.reports_dir("default") == tmp_path / "a" / "default" / "reports"
    assert _make_reports(STORYBIAS_DATA=str(tmp_path / "a")) == tmp_path / "a" / "default" / "reports"


def test_two_runs_of_one_name_under_two_data_roots_do_not_share_reports(tmp_path, monkeypatch):
    """Both wrote reports/<run>/NN_name.tmp.ipynb, each under its own data root's lock."""
    run, root_a, root_b = "pytest-two-roots", tmp_path / "a", tmp_path / "b"
    nbformat.write(tiny_stage_notebook('params_file = ""', "print('ran')"), tmp_path / "tiny.ipynb")
    params_file = write_profile(tmp_path, run)
    holder_code = (
        "import time\nfrom storybias.core.locks import run_lock\n"
        f"with run_lock({run!r}, 'tiny'):\n    print('locked', flush=True)\n    time.sleep(120)\n"
    )
    env_a = dict(os.environ, STORYBIAS_DATA=str(root_a))
    holder = subprocess.Popen([PYTHON, "-c", holder_code], env=env_a, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        monkeypatch.setenv("STORYBIAS_DATA", str(root_b))
        assert run_stage("tiny", tmp_path / "tiny.ipynb", params_file, run, log=lambda m: None) == 0
        assert (root_b / run / "reports" / "tiny.ipynb").is_file()
        monkeypatch.setenv("STORYBIAS_DATA", str(root_a))
        assert run_stage("tiny", tmp_path / "tiny.ipynb", params_file, run, log=lambda m: None) == 3
        assert not (root_a / run / "reports").exists(), "a refused stage writes no report"
    finally:
        holder.kill()
        holder.wait()
    assert not (ROOT / "reports" / run).exists()


# --- 8. after a kill: no temporary left, the executed notebook written ------------------------------


def test_a_killed_stages_temporary_files_are_removed_by_the_next_stage(tmp_path, monkeypatch):
    """A SIGKILL during an atomic write left a 0-byte `.filtered.parquet.<random>.tmp` that survived the
    successful rerun; papermill's `NN_name.tmp.ipynb` stayed too."""
    run = "pytest-leftovers"
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path))
    code = (
        "import time\nfrom storybias.core import paths\nfrom storybias.core.io import atomic_open\n"
        "from storybias.core.locks import run_lock\n"
        f"with run_lock({run!r}, 'filter'):\n"
        "    with atomic_open(paths.run_dir(" + repr(run) + ") / 'filtered.parquet') as fh:\n"
        "        print('writing', flush=True)\n        time.sleep(120)\n"
    )
    proc = subprocess.Popen([PYTHON, "-c", code], env=dict(os.environ), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = [p.name for p in (tmp_path / run).glob(".filtered.parquet.*.tmp")]
    assert len(left) == 1, "the kill left its temporary file (what the next stage must remove)"
    reports = paths.reports_dir(run)
    reports.mkdir()
    (reports / "02_filter.tmp.ipynb").write_text("{}")
    (tmp_path / run / "stories.parquet").write_text("kept")
    said: list[str] = []
    with locks.run_lock(run, "filter", log=said.append):
        assert not list((tmp_path / run).rglob("*.tmp")) and not (reports / "02_filter.tmp.ipynb").exists()
    assert (tmp_path / run / "stories.parquet").read_text() == "kept"
    assert any("removed 2 temporary file(s) an interrupted stage left" in line for line in said), said


def test_make_writes_the_missing_executed_notebook_of_an_up_to_date_stage(tmp_path):
    """A kill between a stage's target and its notebook's rename: the target was up to date, so `make`
    ran nothing and 05_metrics.ipynb was never written."""
    run, data = "pytest-report", tmp_path / "data"
    params_file = write_profile(tmp_path, run)
    assert run_make(ROOT, "stamps", f"PARAMS={params_file}", STORYBIAS_DATA=str(data)).returncode == 0
    for name in ("stories.parquet", "filtered.parquet", "extractions.parquet", "manifest_metrics.json"):
        (data / run / name).write_text("stand-in")
        time.sleep(0.01)
    (data / run / "reports").mkdir()
    (data / run / "reports" / "05_metrics.tmp.ipynb").write_text("{}")  # the killed run's
    planned = run_make(ROOT, "-n", "metrics", f"PARAMS={params_file}", STORYBIAS_DATA=str(data)).stdout
    runs = [line for line in planned.splitlines() if "run-stage" in line]
    assert len(runs) == 1 and "notebooks/05_metrics.ipynb" in runs[0] and runs[0].endswith("--report-only"), runs
    (data / run / "reports" / "05_metrics.ipynb").write_text("{}")  # written by that run
    planned = run_make(ROOT, "-n", "metrics", f"PARAMS={params_file}", STORYBIAS_DATA=str(data)).stdout
    assert "run-stage" not in planned, planned


def test_report_only_runs_the_notebook_and_keeps_the_targets_time(tmp_path, monkeypatch):
    run = "pytest-report-only"
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    target, runs = tmp_path / "data" / run / "target.json", tmp_path / "runs.txt"
    body = (
        f"from storybias.core import io\nfrom pathlib import Path\nio.write_json_atomic({{}}, Path({str(target)!r}))\n"
        f"with open({str(runs)!r}, 'a') as fh:\n    fh.write('ran\\n')"
    )
    nbformat.write(tiny_stage_notebook('params_file = ""', body), tmp_path / "tiny.ipynb")
    params_file, notebook = write_profile(tmp_path, run), tmp_path / "tiny.ipynb"
    reports = paths.reports_dir(run)
    assert run_stage("tiny", notebook, params_file, run, target=target, log=lambda m: None) == 0
    assert (reports / "tiny.ipynb").stat().st_mtime_ns >= target.stat().st_mtime_ns, "Make sees it up to date"
    (reports / "tiny.ipynb").unlink()  # killed before the rename: the target up to date, no notebook
    (reports / "tiny.tmp.ipynb").write_text("{}")
    os.utime(target, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    assert run_stage("tiny", notebook, params_file, run, target=target, log=lambda m: None, report_only=True) == 0
    assert (reports / "tiny.ipynb").is_file() and not (reports / "tiny.tmp.ipynb").exists()
    assert runs.read_text() == "ran\nran\n", "the notebook ran again"
    assert target.stat().st_mtime_ns == 1_600_000_000_000_000_000, "the target kept its time: no later stage reruns"
    target.unlink()
    assert run_stage("tiny", notebook, params_file, run, target=target, log=lambda m: None, report_only=True) == 2
