"""Issue #58, items 1, 2, 3, 4 and 6: one reader of the run's name, the stamp is what the stage read, one
lock for the whole run, clean-run deletes only what the run wrote, a refused command deletes nothing. Each
reproduces the issue's case with real `make` and Python processes on a throwaway run (smoke profile, no model)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from stage_notebooks import tiny_stage_notebook
from storybias.config import params
from storybias.core import paths
from test_reliability import finished_reports, make, profile

ROOT = paths.repo_root()
SMOKE_TEXT = (ROOT / "params" / "smoke.yaml").read_text()


def _make_data_folder(params_file: Path, env: dict) -> str:
    """The DATA folder Make plans with for ``params_file`` (from its database, without running anything)."""
    done = make("-pn", "help", f"PARAMS={params_file}", env=env)
    return re.search(r"^DATA := (.*)$", done.stdout, re.M).group(1)


SPELLINGS = [
    '"run_name": {x}',
    "run_name: !!str {x}",
    "run_name : {x}",
    "run_name: '{x}'",
    'run_name: "{x}"',
    "run_name:   {x}   # a comment",
    "'run_name': {x}",
    "? run_name\n: {x}",
]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_make_and_python_read_the_same_run_name_from_every_yaml_spelling(tmp_path, spelling):
    """Make's `sed` read nothing from `"run_name": x` and used the file's name while the stages used `x`."""
    data = tmp_path / "data"
    env = dict(os.environ, STORYBIAS_DATA=str(data))
    params_file = tmp_path / "file-name.yaml"
    params_file.write_text(SMOKE_TEXT + "\n" + spelling.format(x="spelled-run") + "\n")
    os.environ["STORYBIAS_DATA"], before = str(data), os.environ.get("STORYBIAS_DATA")
    try:
        loaded = params.load(params_file)
        python_folder = str(paths.run_dir(loaded.run_name))
    finally:
        os.environ.pop("STORYBIAS_DATA") if before is None else os.environ.update(STORYBIAS_DATA=before)
    assert loaded.run_name == "spelled-run"
    assert _make_data_folder(params_file, env) == python_folder


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _finished_run(tmp_path: Path, run: str) -> tuple[Path, Path, dict]:
    data = tmp_path / "data"
    env = dict(os.environ, STORYBIAS_DATA=str(data), STORYBIAS_FIGURES=str(tmp_path / "figures"))
    params_file = profile(tmp_path, run)
    assert make("stamps", f"PARAMS={params_file}", env=env).returncode == 0
    for name in ("stories.parquet", "filtered.parquet", "extractions.parquet", "manifest_associations.json"):
        (data / run / name).write_text("stand-in")
        time.sleep(0.01)
    finished_reports(data / run / "reports", "01_generate", "02_filter", "03_extract", "04_associations")
    return data / run, params_file, env


def test_a_refused_make_leaves_the_run_folder_byte_identical(tmp_path):
    """A typo key (`fishr: typo`) refused by `make associations` used to make Make delete 7 stamps (the
    grouped stamps rule under .DELETE_ON_ERROR); so did a `.storybias-run` naming another run."""
    folder, params_file, env = _finished_run(tmp_path, "pytest-refused")
    before = _snapshot(folder)
    good = params_file.read_text()
    params_file.write_text(good + "fishr: typo\n")
    refused = make("associations", f"PARAMS={params_file}", "SERVE=0", env=env)
    assert refused.returncode != 0 and "fishr" in refused.stderr, refused.stderr
    assert _snapshot(folder) == before
    params_file.write_text(good)
    marker = folder / ".storybias-run"
    marker.write_text("another-run\n")
    before = _snapshot(folder)
    refused = make("associations", f"PARAMS={params_file}", "SERVE=0", env=env)
    assert refused.returncode != 0, refused.stdout
    assert _snapshot(folder) == before


def _hold(params_file: Path, env: dict, *command: str) -> subprocess.Popen:
    """`storybias.cli hold-run` holding the run while ``command`` runs (what `make <stage>` does)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "storybias.cli", "hold-run", str(params_file), "--", *command],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout.readline().strip() == "started"
    return proc


def test_one_lock_spans_the_run_refuses_clean_run_and_a_second_make_and_dies_with_its_holder(tmp_path):
    """`make clean-run` used to delete a run between two stages of a running `make` (no stage held the
    lock then). A stage inside the holder inherits the lock; a SIGKILL of the holder releases it."""
    folder, params_file, env = _finished_run(tmp_path, "pytest-whole-run")
    inner = (
        "import sys, time\nfrom storybias.config import params\nfrom storybias.core.locks import run_lock\n"
        f"with run_lock(params.load({str(params_file)!r}).run_name, 'filter'):\n"
        "    print('started', flush=True)\n    time.sleep(60)\n"
    )
    holder = _hold(params_file, env, sys.executable, "-c", inner)  # a stage inside: no deadlock
    try:
        cleaned = make("clean-run", f"PARAMS={params_file}", env=env)
        assert cleaned.returncode != 0 and "busy" in cleaned.stderr, cleaned.stdout + cleaned.stderr
        assert (folder / "stories.parquet").is_file()
        second = make("filter", f"PARAMS={params_file}", env=env)  # up to date or not: refused before anything
        assert second.returncode != 0 and "busy" in second.stderr, second.stdout + second.stderr
        os.killpg(holder.pid, signal.SIGKILL)  # the holder and its stage
        holder.wait()
        cleaned = make("clean-run", f"PARAMS={params_file}", env=env)
        assert cleaned.returncode == 0, cleaned.stderr
        assert not folder.exists()
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)


def test_clean_run_keeps_the_files_git_tracks_and_says_so(tmp_path):
    """`make clean-run PARAMS=params/default.yaml` used to delete figures/default/, 22 committed files."""
    figures = tmp_path / "figures"
    folder, params_file, env = _finished_run(tmp_path, "pytest-tracked")
    own = figures / "pytest-tracked"
    own.mkdir(parents=True)
    (own / "01_committed.png").write_bytes(b"png")
    (own / "02_new.png").write_bytes(b"png")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-C", str(figures)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "pytest-tracked/01_committed.png"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a committed figure"], check=True)
    cleaned = make("clean-run", f"PARAMS={params_file}", env=env)
    assert cleaned.returncode == 0, cleaned.stderr
    assert (own / "01_committed.png").read_bytes() == b"png"
    assert not (own / "02_new.png").exists() and not folder.exists()
    assert "kept 1 file(s) git tracks" in cleaned.stdout and "01_committed.png" in cleaned.stdout


def test_a_profile_edited_while_the_stage_ran_leaves_its_result_stale(tmp_path, monkeypatch):
    """The issue's case: a profile edited while `make associations` ran, then restored, left a result
    computed with the edit that `make` called up to date. The stage notes what it loaded; run-stage puts
    that in the stamp, so the restored profile's stamp is newer than the result: Make reruns the stage."""
    from storybias.config.params import write_stage_stamps
    from storybias.tools.notebook_runner import run_stage

    run = "pytest-edited"
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    params_file = profile(tmp_path, run)
    original = params_file.read_text()
    edited = yaml.safe_load(original)
    edited["filter"] = {"lid_threshold": 0.7}
    stamps = paths.run_dir(run) / ".params"
    target = paths.run_dir(run) / "filtered.parquet"
    notebook = tmp_path / "stage.ipynb"
    nbformat.write(
        tiny_stage_notebook(
            'params_file = ""',
            "from storybias.config import params\nfrom storybias.core import paths\n"
            "p = params.load(params_file)\n(paths.run_dir(p.run_name) / 'filtered.parquet').write_text('done')",
        ),
        notebook,
    )

    def stale() -> bool:  # what Make decides: a prerequisite newer than the target
        return (stamps / "filter.params").stat().st_mtime_ns > target.stat().st_mtime_ns

    write_stage_stamps(params.load(params_file), stamps)
    params_file.write_text(yaml.safe_dump(edited))  # edited as the stage starts
    assert run_stage("filter", notebook, params_file, run, target=target, log=lambda m: None) == 0
    params_file.write_text(original)  # restored after it finished
    write_stage_stamps(params.load(params_file), stamps)  # `make` refreshes the stamps
    assert stale(), "the result was computed with the edited profile"
    assert run_stage("filter", notebook, params_file, run, target=target, log=lambda m: None) == 0
    write_stage_stamps(params.load(params_file), stamps)
    assert not stale(), "a stage that read the profile as it is is up to date"
