"""Issue #12: nothing stale, nothing lost. Paths with spaces, one writer per run, file modes, and
temporary files on SIGTERM -- each reproduced with real processes (make, python, papermill).

(Fingerprints and the archive are tested with the stage code in test_generate.py and test_extract.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from stage_notebooks import tiny_stage_notebook
from storybias.core import io, locks, paths
from working_tree import copy_working_tree

ROOT = paths.repo_root()
PYTHON = sys.executable


def make(*args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "--no-print-directory", *args],
        cwd=cwd,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )


def profile(tmp_path: Path, run_name: str, name: str = "p.yaml") -> Path:
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["run_name"] = run_name
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def finished_reports(folder: Path, *names: str) -> None:
    """Stand-ins for the executed notebooks of finished stages (written after their targets)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / f"{name}.ipynb").write_text("{}")


def hold_lock(run_name: str, env: dict, stage: str = "generate") -> subprocess.Popen:
    """Another process holding the run's lock (until killed)."""
    code = (
        "import sys, time\nfrom storybias.core.locks import run_lock\n"
        f"with run_lock({run_name!r}, {stage!r}):\n    print('locked', flush=True)\n    time.sleep(120)\n"
    )
    proc = subprocess.Popen([PYTHON, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


# --- 1. paths --------------------------------------------------------------------------------


def test_space_in_the_data_folder_is_refused_and_nothing_is_deleted(tmp_path):
    """`STORYBIAS_DATA="<dir>/my data" make clean-run` used to delete <dir>/my and ./data/default."""
    unrelated = tmp_path / "my"
    unrelated.mkdir()
    (unrelated / "keep.txt").write_text("not storybias's")
    intended = tmp_path / "my data" / "default"
    intended.mkdir(parents=True)
    result = make("clean-run", env=dict(os.environ, STORYBIAS_DATA=str(tmp_path / "my data")))
    assert result.returncode != 0
    assert "STORYBIAS_DATA" in result.stderr and "contains a space" in result.stderr
    assert (unrelated / "keep.txt").is_file() and intended.is_dir()
    spaced = profile(tmp_path, "spaced", name="my profile.yaml")
    result = make("clean-run", f"PARAMS={spaced}")
    assert result.returncode != 0 and "PARAMS" in result.stderr and "contains a space" in result.stderr


def test_clean_run_deletes_only_the_runs_own_folders_and_says_which(tmp_path):
    """(Under STORYBIAS_DATA the run's reports are inside its data folder; the layout without it, and
    the folders clean-run refuses, are tested in a copy of the repository: tests/test_run_folders.py.)"""
    run = "pytest-clean-run"
    data, figures = tmp_path / "data", tmp_path / "figs"
    for folder in (data / run / "work", data / run / "reports", data / "other-run", figures / run):
        folder.mkdir(parents=True, exist_ok=True)
    (data / run / ".storybias-run").write_text(run + "\n")  # the run's marker, written when a stage made it
    (data / run / "reports" / "01_generate.ipynb").write_text("{}")
    (data / "other-run" / "file.txt").write_text("x")
    (figures / run / "01_vsr_heatmap.png").write_text("x")
    env = dict(os.environ, STORYBIAS_DATA=str(data), STORYBIAS_FIGURES=str(figures))
    result = make("clean-run", f"PARAMS={profile(tmp_path, run)}", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"removed {data / run}", f"removed {figures / run}"]
    assert not (data / run).exists() and not (figures / run).exists() and not (ROOT / "reports" / run).exists()
    assert (data / "other-run" / "file.txt").is_file() and data.is_dir() and figures.is_dir()
    again = make("clean-run", f"PARAMS={profile(tmp_path, run)}", env=env)
    assert again.returncode == 0 and "nothing to remove" in again.stdout


def test_relative_data_folder_means_the_same_folder_to_make_and_to_the_notebooks(tmp_path, monkeypatch):
    result = make("where", "PARAMS=params/smoke.yaml", env=dict(os.environ, STORYBIAS_DATA="relative-data"))
    assert result.returncode == 0, result.stderr
    where = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert where["data"] == str(ROOT / "relative-data" / "smoke")
    monkeypatch.setenv("STORYBIAS_DATA", "relative-data")
    monkeypatch.chdir(ROOT / "notebooks")  # where papermill runs the notebooks
    assert paths.run_dir("smoke") == ROOT / "relative-data" / "smoke"
    assert not (ROOT / "relative-data").exists(), "`make where` creates nothing"


def test_checkout_path_with_a_space(tmp_path):
    """A checkout under a folder with a space: Make's own paths are relative and work there."""
    checkout = copy_working_tree(tmp_path / "my checkout")
    env = dict(os.environ, PYTHONPATH=str(checkout / "lib"))
    result = make("where", "PARAMS=params/smoke.yaml", env=env, cwd=checkout)
    assert result.returncode == 0, result.stderr
    assert f"data {checkout / 'data' / 'smoke'}" in result.stdout.splitlines()
    assert make("check-params", "PARAMS=params/smoke.yaml", env=env, cwd=checkout).returncode == 0


def test_run_stage_runs_papermill_without_a_shell(tmp_path, monkeypatch):
    """Notebook and profile paths with spaces are single arguments; failure removes only what the
    failed run wrote."""
    run = "pytest-run-stage"
    folder = tmp_path / "my notebooks"
    folder.mkdir()
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    target = tmp_path / "data" / run / "target.json"
    nb = tiny_stage_notebook(
        'params_file = ""\nfail = False',
        "from storybias.config import params\nfrom storybias.core import io, paths\np = params.load(params_file)\n"
        "io.write_json_atomic({'run': p.run_name}, paths.run_dir(p.run_name) / 'target.json')\n"
        "assert not fail or open(params_file).read().count('fail_me') == 0, 'asked to fail'",
    )
    nbformat.write(nb, folder / "tiny stage.ipynb")
    params_file = profile(folder, run, name="my profile.yaml")
    from storybias.tools.notebook_runner import run_stage

    reports = paths.reports_dir(run)
    assert reports == tmp_path / "data" / run / "reports", "the reports follow STORYBIAS_DATA"
    try:
        assert run_stage("tiny", folder / "tiny stage.ipynb", params_file, run, target=target, log=lambda m: None) == 0
        assert json.loads(target.read_text()) == {"run": run}
        assert (reports / "tiny stage.ipynb").is_file()
        assert not (reports / "tiny stage.tmp.ipynb").exists()
        # the same notebook failing after writing the target: the target goes, so Make reruns the stage
        nb.cells[1].source += "\nraise RuntimeError('stage failed after writing its target')"
        nbformat.write(nb, folder / "tiny stage.ipynb")
        assert run_stage("tiny", folder / "tiny stage.ipynb", params_file, run, target=target, log=lambda m: None) == 1
        assert not target.exists()
        assert "stage failed after writing its target" in (reports / "tiny stage.log").read_text()
    finally:
        shutil.rmtree(ROOT / "reports" / run, ignore_errors=True)  # (an older layout's place)


# --- 4. one writer per run ------------------------------------------------------------------


def test_second_generator_is_refused_while_the_first_holds_the_run(tmp_path):
    run = "pytest-busy-generate"
    env = dict(os.environ, STORYBIAS_DATA=str(tmp_path / "data"))
    holder = hold_lock(run, env)
    try:
        # -X importtime lists every module the refused process imported, on stderr: "before any model
        # loads" is then a fact to check, not a wall-clock bound (a cold venv took 95 s to import pandas & co.)
        second = subprocess.run(
            [PYTHON, "-X", "importtime", "-m", "storybias.cli", "generate", str(profile(tmp_path, run))],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert second.returncode == 3
        assert f"run '{run}' is busy (pid {holder.pid}, stage generate" in second.stderr
        imported = {
            line.rsplit("|", 1)[1].strip() for line in second.stderr.splitlines() if line.startswith("import time:")
        }
        assert "storybias.stages.generate" in imported, "the listing is read (the stage was imported)"
        assert not imported & {"vllm", "torch", "ray", "openai"}, "refused before any engine or model loads"
        touched = sorted(p.name for p in (tmp_path / "data" / run).iterdir())
        assert touched == [".lock", ".storybias-run"], "nothing but the holder's lock and marker"
    finally:
        holder.kill()
        holder.wait()


def test_make_refuses_a_second_stage_and_keeps_the_first_ones_target(tmp_path):
    """Two `make metrics` on one run: the second used to fail on the temp notebook, and Make's
    .DELETE_ON_ERROR then deleted the first one's good manifest."""
    run = "pytest-busy-make"
    data = tmp_path / "data"
    env = dict(os.environ, STORYBIAS_DATA=str(data))
    params_file = profile(tmp_path, run)
    assert make("stamps", f"PARAMS={params_file}", env=env).returncode == 0
    for name in ("stories.parquet", "filtered.parquet", "extractions.parquet"):
        (data / run / name).write_text("stand-in")  # Make compares mtimes only
        time.sleep(0.01)
    manifest = data / run / "manifest_metrics.json"
    manifest.write_text('{"from": "the first run"}')
    os.utime(manifest, (time.time() - 3600, time.time() - 3600))  # out of date: Make runs the recipe
    holder = hold_lock(run, env, stage="metrics")
    try:
        result = make("metrics", f"PARAMS={params_file}", env=env)
        assert result.returncode != 0
        assert f"run '{run}' is busy (pid {holder.pid}, stage metrics" in result.stderr
        assert manifest.read_text() == '{"from": "the first run"}'
        assert not (data / run / "reports").exists(), "the refused process wrote no notebook"
        assert not (ROOT / "reports" / run).exists()
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(ROOT / "reports" / run, ignore_errors=True)
    database = make("-pn", "metrics", f"PARAMS={params_file}", env=env).stdout
    precious = next(line for line in database.splitlines() if line.startswith(".PRECIOUS:"))
    assert str(manifest) in precious.split(), "Make itself must never delete a stage target"


def test_stale_lock_of_a_killed_process_is_taken_over(tmp_path, monkeypatch):
    run = "pytest-stale"
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    holder = hold_lock(run, dict(os.environ))
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    said: list[str] = []
    with locks.run_lock(run, "filter", log=said.append):
        assert json.loads(locks.lock_path(run).read_text())["stage"] == "filter"
    assert said == [
        f"run '{run}': taking over the lock left by pid {holder.pid} (stage generate), which is no longer running"
    ]


def test_lock_is_reentrant_in_one_process_and_released_after(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    with locks.run_lock("r", "associations"):
        with locks.run_lock("r", "associations"):  # the judge inside stage 04, for example
            pass
    with locks.run_lock("r", "metrics"):  # released: a later stage takes it
        pass
    assert locks.lock_path("r").read_text() == ""


# --- 6 and 9. file modes and SIGTERM ----------------------------------------------------------


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_written_files_follow_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        written = [
            io.write_json_atomic({"a": 1}, tmp_path / "x.json"),
            io.write_parquet_atomic(__import__("pandas").DataFrame({"a": [1]}), tmp_path / "x.parquet"),
        ]
    finally:
        os.umask(old)
    assert [p.stat().st_mode & 0o777 for p in written] == [mode, mode]


def test_sigterm_during_a_write_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "big.bin"
    code = (
        f"from pathlib import Path\nfrom storybias.core.io import atomic_open\n"
        f"with atomic_open(Path({str(target)!r})) as fh:\n"
        "    fh.write(b'x' * 1_000_000); fh.flush(); print('writing', flush=True)\n"
        "    while True:\n        fh.write(b'x' * 1_000_000)\n"
    )
    proc = subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == [], "neither the target nor a temporary file is left"


# --- 2. Make follows the data files each stage reads --------------------------------------------


@pytest.mark.parametrize(
    "edited, stage_notebook",
    [
        ("params/designs/bedtime/en.yaml", "01_generate"),
        ("params/refusals/fr.yaml", "02_filter"),
        ("params/lexicon/categories.yaml", "05_metrics"),
        ("params/cues/zh.yaml", "06_probes"),
    ],
)
def test_editing_a_params_data_file_reruns_the_stage_that_reads_it(tmp_path, edited, stage_notebook):
    """Make used to track only the profile: an edited template or refusal list reran nothing.
    `make -W FILE` asks Make what it would do if FILE had just changed, without touching it."""
    run = "pytest-deps"
    data = tmp_path / "data"
    env = dict(os.environ, STORYBIAS_DATA=str(data))
    params_file = profile(tmp_path, run)
    assert make("stamps", f"PARAMS={params_file}", env=env).returncode == 0
    targets = [
        "stories.parquet",
        "filtered.parquet",
        "extractions.parquet",
        "manifest_associations.json",
        "manifest_metrics.json",
        "manifest_probes.json",
    ]
    for name in targets:  # every stage finished, in order
        (data / run / name).write_text("stand-in")
        time.sleep(0.01)
    finished_reports(data / run / "reports", "04_associations", "05_metrics", "06_probes")
    # the stage targets' files: `-W` does not reach the sub-make that `make probes` runs its stages in
    goals = [str(data / run / "manifest_probes.json"), str(data / run / "manifest_metrics.json")]
    up_to_date = make("-n", *goals, f"PARAMS={params_file}", env=env)
    assert "run-stage" not in up_to_date.stdout, up_to_date.stdout
    after_edit = make("-n", "-W", edited, *goals, f"PARAMS={params_file}", env=env)
    assert f"notebooks/{stage_notebook}.ipynb" in after_edit.stdout, after_edit.stdout


def test_changing_stage_04s_parameters_reruns_04_and_the_cross_lens_stage_not_the_probes(tmp_path):
    """Issue #42: the cross-lens table lived in stage 06, so Make made the probes depend on stage 04's and
    05's manifests and a change of associations: reran the embeddings. Now only 04 and 07 (and the figures)."""
    run = "pytest-crosslens"
    data = tmp_path / "data"
    env = dict(os.environ, STORYBIAS_DATA=str(data))
    params_file = profile(tmp_path, run)
    assert make("stamps", f"PARAMS={params_file}", env=env).returncode == 0
    names = ["stories.parquet", "filtered.parquet", "extractions.parquet", "manifest_associations.json",
             "manifest_metrics.json", "manifest_probes.json", "manifest_crosslens.json"]  # fmt: skip
    for name in names:  # every stage finished, in order
        (data / run / name).write_text("stand-in")
        time.sleep(0.01)
    finished_reports(data / run / "reports", "04_associations", "05_metrics", "06_probes", "07_crosslens")
    stamp = data / run / ".params" / "associations.params"
    up_to_date = make("-n", "crosslens", f"PARAMS={params_file}", "STAMPS_FORCE=", env=env)
    assert "run-stage" not in up_to_date.stdout, up_to_date.stdout
    goals = [str(data / run / "manifest_crosslens.json"), str(data / run / "manifest_probes.json")]  # (-W: files)
    after = make("-n", "-W", str(stamp), *goals, f"PARAMS={params_file}", "STAMPS_FORCE=", env=env)
    assert "notebooks/04_associations.ipynb" in after.stdout and "notebooks/07_crosslens.ipynb" in after.stdout
    assert "06_probes" not in after.stdout, after.stdout
