"""Stage 01 without a model: the plan, the data contract, and resume logic with a scripted engine.

The real engine (vLLM + embedded model) and a real kill -9 are exercised in test_generate_slow.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fake_engine import FakeEngine
from storybias.config import designs, params
from storybias.config.prompts import ALL_CONDITION_COLUMNS
from storybias.core import artifacts, paths
from storybias.engines.cache import ResponseCache, cache_dir
from storybias.stages import generate

CONTRACT = [
    "story_id",
    "design",
    "language",
    "model",
    "prompt_id",
    "sample",
    "seed",
    "prompt",
    "text",
    "finish_reason",
    "n_tokens",
    *ALL_CONDITION_COLUMNS,
]


class ScriptedEngine(FakeEngine):
    """The one fake engine (storybias.FakeEngine), recording every request in ``calls``."""

    calls: list[str] = []

    def __init__(self, spec, crash_after: int | None = None, **kwargs):
        super().__init__(spec, crash_after=crash_after, calls=ScriptedEngine.calls, **kwargs)


@pytest.fixture()
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    ScriptedEngine.calls = []
    return tmp_path / "data"


def profile(tmp_path: Path, **sampling) -> params.Params:
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["run_name"] = "unit"
    raw["generation"]["sampling"].update(sampling)
    path = tmp_path / "unit.yaml"
    path.write_text(yaml.safe_dump(raw))
    return params.load(path)


def no_preflight(monkeypatch):
    monkeypatch.setattr(generate, "preflight", lambda spec: (Path("."), "scripted"))


def test_plan_matches_profile(tmp_path):
    plan = generate.plan(profile(tmp_path))
    assert plan.groupby("design").size().to_dict() == {"bedtime": 2, "occupations": 3, "stereotales": 3}
    assert plan["story_id"].is_unique
    assert plan["seed"].nunique() == len(plan)
    explicit = plan[plan["cond_task"] == "explicit"]
    assert all(c == ["female", "woman", "male", "man"] for c in explicit["_choice"])
    assert set(plan.loc[plan.design == "occupations", "cond_occupation_gender"]) <= {"female", "male"}
    assert plan.loc[plan.design == "bedtime", "cond_attribute"].isna().all()


def test_a_design_is_written_only_by_its_models(tmp_path):
    """designs.<d>.models: the default profile's 0.5B model writes the occupations only."""

    def two_models(raw):
        raw["generation"]["models"] = [
            {"name": "big", "source": "embedded"},
            {"name": "small", "source": "embedded", "embedded": "qwen2.5-coder-0.5b"},
        ]
        raw["designs"]["stereotales"]["models"] = ["big"]
        raw["designs"]["bedtime"]["models"] = ["big"]

    plan = generate.plan(profile_with(tmp_path, two_models))
    by_design = plan.groupby("design")["model"].agg(lambda m: sorted(set(m))).to_dict()
    assert by_design == {"bedtime": ["big"], "occupations": ["big", "small"], "stereotales": ["big"]}
    occupations = plan[plan.design == "occupations"]
    assert (occupations["model"] == "small").sum() == (occupations["model"] == "big").sum() == 3
    cells = occupations.groupby("model")["prompt_id"].agg(lambda ids: tuple(sorted(ids)))
    assert cells["big"] == cells["small"], "both models get the same cells"


def test_run_writes_the_contract(tmp_path, data_dir, monkeypatch):
    no_preflight(monkeypatch)
    p = profile(tmp_path)
    result = generate.run(p, progress=False, engine_factory=ScriptedEngine, log=lambda m: None)
    stories = pd.read_parquet(artifacts.stories_path("unit"))
    assert list(stories.columns[: len(CONTRACT)]) == CONTRACT
    assert len(stories) == len(generate.plan(p)) == stories["story_id"].nunique()
    assert stories["sample"].dtype == "int64" and stories["n_tokens"].dtype == "int64"
    manifest = result.manifest
    assert manifest["n_stories"] == len(stories)
    assert manifest["models"][0]["n_generated_this_run"] == len(stories)
    # the machine is recorded; a stand-in engine's time is no model's, so its rate is not probed
    assert manifest["machine"]["cores"] == len(os.sched_getaffinity(0)) and manifest["machine"]["bf16_gflops"] is None
    cached = ResponseCache.for_run("unit").store.read_all().to_pandas()
    assert sorted(cached["logical_key"]) == sorted(stories["story_id"]), "every story is in the run's cache"
    assert set(stories["gen_config"]) == set(cached["cache_key"])


def test_crash_then_resume_generates_only_the_rest(tmp_path, data_dir, monkeypatch):
    no_preflight(monkeypatch)
    p = profile(tmp_path)  # shard_size 2 in the smoke profile
    with pytest.raises(KeyboardInterrupt):
        generate.run(p, progress=False, engine_factory=lambda s: ScriptedEngine(s, crash_after=5), log=lambda m: None)
    assert not artifacts.stories_path("unit").exists()
    first = list(ScriptedEngine.calls)
    shards = list(cache_dir("unit").glob("part-*.parquet"))
    persisted = sum(len(pd.read_parquet(s)) for s in shards)
    # two full shards of 2, and the fifth story, flushed by the runner as the interrupt went by
    assert persisted == 5 and len(shards) == 3
    ScriptedEngine.calls = []
    result = generate.run(p, progress=False, engine_factory=ScriptedEngine, log=lambda m: None)
    regenerated = set(ScriptedEngine.calls)
    stories = result["stories"]
    assert len(stories) == len(generate.plan(p)) and stories["story_id"].is_unique
    assert len(regenerated) == len(stories) - persisted
    assert not regenerated & set(first[:persisted]), "stories already on disk must not be generated again"
    assert result.manifest["models"][0]["n_reused"] == persisted


def test_rerun_after_completion_generates_nothing(tmp_path, data_dir, monkeypatch):
    no_preflight(monkeypatch)
    p = profile(tmp_path)
    generate.run(p, progress=False, engine_factory=ScriptedEngine, log=lambda m: None)
    ScriptedEngine.calls = []
    result = generate.run(p, progress=False, engine_factory=ScriptedEngine, log=lambda m: None)
    assert ScriptedEngine.calls == []
    assert len(result["stories"]) == len(generate.plan(p))
    assert result.manifest["machine"] is None, "no model ran, so no machine to name"


def test_changed_sampling_regenerates_instead_of_reusing(tmp_path, data_dir, monkeypatch):
    no_preflight(monkeypatch)
    generate.run(profile(tmp_path), progress=False, engine_factory=ScriptedEngine, log=lambda m: None)
    ScriptedEngine.calls = []
    result = generate.run(
        profile(tmp_path, temperature=0.5), progress=False, engine_factory=ScriptedEngine, log=lambda m: None
    )
    stories = result["stories"]
    free_text = stories[stories["cond_task"].fillna("") != "explicit"]
    assert len(ScriptedEngine.calls) == len(stories)
    assert free_text["text"].str.contains("temperature 0.5").all()


def test_preflight_failure_comes_before_any_engine(tmp_path, data_dir):
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["generation"]["models"] = [
        {"name": "big", "source": "hub", "hub_id": "nobody/absent-model-8B", "device": "cuda"}
    ]
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(raw))
    started = []

    def factory(spec):
        started.append(spec)
        return ScriptedEngine(spec)

    from storybias.engines import EngineError

    with pytest.raises(EngineError, match="nobody/absent-model-8B.*not on this machine"):
        generate.run(params.load(path), progress=False, engine_factory=factory, log=lambda m: None)
    assert started == []


def test_gpu_model_on_this_cpu_machine_fails_clearly(tmp_path):
    from storybias.config.params import ModelSpec
    from storybias.engines import EngineError, preflight

    folder = tmp_path / "fake-8b"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    spec = ModelSpec(name="big", source="local", path=str(folder), device="cuda")
    with pytest.raises(EngineError, match="device 'cuda'.*CPU build.*DEVICE=cuda"):
        preflight(spec)
    with pytest.raises(EngineError, match="not a Hugging Face model folder"):
        preflight(ModelSpec(name="x", source="local", path=str(tmp_path)))


def profile_with(tmp_path: Path, edit) -> params.Params:
    """The smoke profile (run 'unit') after ``edit(raw)`` changes its raw YAML mapping."""
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["run_name"] = "unit"
    edit(raw)
    path = tmp_path / "unit.yaml"
    path.write_text(yaml.safe_dump(raw))
    return params.load(path)


def quiet_run(p):
    return generate.run(p, progress=False, engine_factory=ScriptedEngine, log=lambda m: None)


def test_changed_seed_regenerates_and_the_manifest_says_why(tmp_path, data_dir, monkeypatch):
    """Issue #12.2: a new generation.seed used to reuse every story with its old seed."""
    no_preflight(monkeypatch)

    def full_small_grid(seed):  # the full grid of one occupation: the same cells whatever the seed
        def edit(raw):
            raw["generation"]["seed"] = seed
            raw["designs"] = {
                "occupations": {"languages": ["en"], "restrict": {"occupation": ["nurse"]}, "tasks": ["story", "news"]}
            }

        return profile_with(tmp_path, edit)

    first = quiet_run(full_small_grid(42))
    ScriptedEngine.calls = []
    second = quiet_run(full_small_grid(7))
    stories = second["stories"]
    assert len(stories) == 2 and sorted(ScriptedEngine.calls) == sorted(stories["story_id"])
    assert second.manifest["base_seed"] == 7
    assert second.manifest["reuse"] == {"sampling changed": 2}  # the seed is part of the sampling
    assert set(stories["seed"]).isdisjoint(set(first["stories"]["seed"]))
    planned = generate.plan(full_small_grid(7))
    assert stories.set_index("story_id")["seed"].to_dict() == planned.set_index("story_id")["seed"].to_dict()


def test_edited_template_regenerates_with_the_new_prompt(tmp_path, data_dir, monkeypatch):
    """Issue #12.2: editing a template in params/designs/ used to keep every story's old prompt."""
    no_preflight(monkeypatch)
    p = profile(tmp_path)
    quiet_run(p)
    ScriptedEngine.calls = []
    original = designs.render_prompt
    monkeypatch.setattr(
        "storybias.config.plan.render_prompt",
        lambda cell, lang: original(cell, lang) + " (edited)" if cell.design == "bedtime" else original(cell, lang),
    )
    result = quiet_run(p)
    bedtime = result["stories"][result["stories"]["design"] == "bedtime"]
    assert bedtime["prompt"].str.endswith("(edited)").all()
    assert sorted(ScriptedEngine.calls) == sorted(bedtime["story_id"])
    assert result.manifest["reuse"] == {
        "reused": len(result["stories"]) - len(bedtime),
        "prompt changed": len(bedtime),
    }


def test_narrowed_profile_keeps_its_stories_and_widening_restores_without_generation(tmp_path, data_dir, monkeypatch):
    """Issue #12.3: fewer samples (or a dropped language) used to delete the unplanned stories; the
    append-only cache keeps them."""
    no_preflight(monkeypatch)

    def samples(n):
        return lambda raw: [
            raw["designs"][d].update(samples_per_prompt=n) for d in ("stereotales", "bedtime", "occupations")
        ]

    wide = quiet_run(profile_with(tmp_path, samples(2)))
    ScriptedEngine.calls = []
    narrow = quiet_run(profile_with(tmp_path, samples(1)))
    assert ScriptedEngine.calls == []
    assert len(narrow["stories"]) == len(wide["stories"]) // 2
    assert (pd.read_parquet(artifacts.stories_path("unit"))["sample"] == 0).all(), (
        "stories.parquet holds the planned stories only"
    )
    restored = quiet_run(profile_with(tmp_path, samples(2)))
    assert ScriptedEngine.calls == [], "widening again must not generate anything"
    assert restored.manifest["reuse"] == {"reused": len(wide["stories"])}
    pd.testing.assert_frame_equal(restored["stories"].reset_index(drop=True), wide["stories"].reset_index(drop=True))
    assert len(ResponseCache.for_run("unit")) == len(wide["stories"]), "every story is stored exactly once"


def test_notebook_01s_plan_counts_example_prompts_and_finish_reasons_on_a_hand_made_table():
    """Issue #59 item 3: what notebook 01 shows is computed here, not in its cells."""
    planned = pd.DataFrame(
        {
            "design": ["stereotales", "bedtime", "bedtime", "stereotales", "bedtime"],
            "language": ["fr", "en", "en", "fr", "fr"],
            "model": ["m", "m", "n", "m", "m"],
            "prompt_id": ["s1", "b1", "b1", "s2", "b2"],
            "prompt": ["P-s1", "P-b1", "P-b1n", "P-s2", "P-b2"],
        }
    )
    assert generate.plan_counts(planned).to_dict("records") == [
        {"design": "bedtime", "language": "en", "model": "m", "stories": 1},
        {"design": "bedtime", "language": "en", "model": "n", "stories": 1},
        {"design": "bedtime", "language": "fr", "model": "m", "stories": 1},
        {"design": "stereotales", "language": "fr", "model": "m", "stories": 2},
    ]
    # the first planned row of each design, designs in sorted order
    assert generate.example_prompts(planned).to_dict("records") == [
        {"design": "bedtime", "language": "en", "prompt_id": "b1", "prompt": "P-b1"},
        {"design": "stereotales", "language": "fr", "prompt_id": "s1", "prompt": "P-s1"},
    ]
    stories = planned.assign(story_id=list("abcde"), finish_reason=["stop", "length", "stop", "stop", "length"])
    finish = generate.finish_reason_counts(stories)
    assert list(finish.columns) == ["length", "stop"]
    assert finish.to_dict("index") == {
        ("bedtime", "en"): {"length": 1, "stop": 1},
        ("bedtime", "fr"): {"length": 1, "stop": 0},
        ("stereotales", "fr"): {"length": 0, "stop": 2},
    }
