"""The Ray backend's pieces that need neither Ray nor vLLM (issue #17): parameters and their errors,
ChatRequest -> processor rows, finish_reason derivation, partitioning by key, the profile plan and the
kill-and-resume helper on the scripted engine. The real runs are in tests/test_ray_slow.py."""

from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pytest
import yaml

from fake_engine import FakeEngine
from storybias import engines
from storybias.config.params import (
    EngineSettings,
    ModelSpec,
    ParamsError,
    PlanningSettings,
    RaySettings,
    Sampling,
    load,
)
from storybias.core import paths
from storybias.engines import ChatRequest, EngineError, ray_engine
from storybias.engines.cache import cache_dir
from storybias.engines.inprocess import cpu_engine_variables
from storybias.tools import planning
from storybias.tools.bench import kill_and_resume

ROOT = paths.repo_root()
CPU = ModelSpec(name="m", source="embedded")
SAMPLING = Sampling(temperature=0.7, top_p=0.9, top_k=40, repetition_penalty=1.05, max_tokens=24)


def profile(tmp_path, engine: dict, **extra) -> str:
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["generation"]["engine"] = engine
    raw.update(extra)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


# --- parameters --------------------------------------------------------------------------------------


def test_default_is_the_in_process_engine_and_the_shipped_profiles_validate():
    assert EngineSettings().backend == "vllm"
    for name in ("default", "smoke", "paper"):
        assert load(ROOT / "params" / f"{name}.yaml").generation.engine.backend == "vllm"


@pytest.mark.parametrize("address", ["local", "auto", "ray://head.example:10001", "10.0.0.1:6379"])
def test_ray_addresses_accepted(address):
    assert RaySettings(address=address).address == address


@pytest.mark.parametrize("address", ["", "http://head:8265", "ray://head", "head", "auto "])
def test_bad_ray_address_names_the_parameter(address):
    with pytest.raises(ValueError, match="generation.engine.ray.address"):
        RaySettings(address=address)


def test_ray_settings_are_validated_with_clear_errors(tmp_path):
    with pytest.raises(ParamsError, match=r"generation.engine.ray.concurrency"):
        load(profile(tmp_path, {"backend": "ray", "ray": {"concurrency": 0}}))
    with pytest.raises(
        ParamsError, match=r"generation.engine.ray.batch_size.*unknown key|generation.engine.ray.batchsize"
    ):
        load(profile(tmp_path, {"backend": "ray", "ray": {"batchsize": 4}}))
    with pytest.raises(ParamsError, match="exclusive"):
        load(profile(tmp_path, {"backend": "ray", "shared_server": True}))
    with pytest.raises(ParamsError, match="num_cpus sizes a local Ray only"):
        load(profile(tmp_path, {"backend": "ray", "ray": {"address": "auto", "num_cpus": 2}}))
    with pytest.raises(ParamsError, match="generation.engine.backend"):
        load(profile(tmp_path, {"backend": "spark"}))


def test_tensor_parallel_over_one_needs_cuda_models(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # as if ray were installed
    with pytest.raises(ParamsError, match="generation.engine.ray.tensor_parallel_size: > 1 needs CUDA"):
        load(profile(tmp_path, {"backend": "ray", "ray": {"tensor_parallel_size": 2}}))


def test_without_ray_the_backend_fails_at_check_params_naming_parameter_and_install(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ParamsError) as exc:
        load(profile(tmp_path, {"backend": "ray"}))
    assert "generation.engine.backend" in str(exc.value) and "make venv EXTRAS=ray" in str(exc.value)
    with pytest.raises(EngineError, match="make venv EXTRAS=ray"):
        ray_engine.require_ray()
    # ... and the in-process default never asks for it
    assert load(profile(tmp_path, {"cpu_kvcache_gb": 2})).generation.engine.backend == "vllm"


def test_open_engine_picks_the_ray_backend_for_local_models_only():
    chosen = engines.open_engine(CPU, EngineSettings(backend="ray"), seed=1)
    assert isinstance(chosen, ray_engine.RayEngine)
    assert isinstance(engines.open_engine(CPU, EngineSettings(), seed=1), engines.Engine)
    served = ModelSpec(name="s", source="openai", base_url="http://127.0.0.1:1/v1", model_id="x")
    assert not isinstance(engines.open_engine(served, EngineSettings(backend="ray"), seed=1), ray_engine.RayEngine)


def test_stage_stamp_unchanged_by_ray(tmp_path):
    """The Ray backend and its batch size are operational (the same texts: tests/test_ray_slow.py), so the
    stamps leave them out, as the cache does (#59 item 4): switching to Ray reruns no stage."""
    p = load(ROOT / "params" / "smoke.yaml")
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["generation"]["engine"]["ray"] = {"batch_size": 3}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(raw))
    assert load(tmp_path / "r.yaml").stage_digest("generate") == p.stage_digest("generate")


# --- request mapping and results ------------------------------------------------------------------------


def test_request_maps_to_the_same_sampling_as_the_in_process_engine():
    request = ChatRequest(key="s1", messages=[{"role": "user", "content": "hi"}], sampling=SAMPLING, seed=17)
    row = ray_engine.request_row(request, "<prompt>", [5, 6, 7])
    assert row["key"] == "s1" and row["prompt"] == "<prompt>" and row["tokenized_prompt"] == [5, 6, 7]
    assert row["sampling_params"] == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "repetition_penalty": 1.05,
        "max_tokens": 24,
        "seed": 17,
        "ignore_eos": False,
    }
    assert row["max_tokens"] == 24
    vllm = pytest.importorskip("vllm")  # the mapping builds the very SamplingParams the in-process engine does
    sp = vllm.SamplingParams(**row["sampling_params"])
    expected = engines.Engine(CPU, EngineSettings(), seed=1).sampling_params(request)
    for field in ("temperature", "top_p", "top_k", "repetition_penalty", "max_tokens", "seed", "ignore_eos"):
        assert getattr(sp, field) == getattr(expected, field), field


def test_constraints_are_carried_or_refused():
    choice = ChatRequest(key="c", messages=[], sampling=SAMPLING, seed=1, choice=["yes", "no"])
    assert ray_engine.sampling_params(choice)["structured_outputs"] == {"choice": ["yes", "no"]}
    schema = {"type": "object", "properties": {"zq": {"type": "integer"}}, "required": ["zq"]}
    js = ChatRequest(key="j", messages=[], sampling=SAMPLING, seed=1, json_schema=schema)
    carried = ray_engine.sampling_params(js)["structured_outputs"]
    assert list(carried) == ["json"] and json.loads(carried["json"]) == schema
    both = ChatRequest(key="b", messages=[], sampling=SAMPLING, seed=1, choice=["a"], json_schema=schema)
    with pytest.raises(EngineError, match="one structured-output constraint"):
        ray_engine.sampling_params(both)
    with pytest.raises(EngineError, match="non-empty list of strings"):
        ray_engine.sampling_params(ChatRequest(key="e", messages=[], sampling=SAMPLING, seed=1, choice=[]))
    assert "structured_outputs" not in ray_engine.sampling_params(
        ChatRequest(key="f", messages=[], sampling=SAMPLING, seed=1)
    )


@pytest.mark.parametrize(
    "n_tokens,max_tokens,reason", [(24, 24, "length"), (23, 24, "stop"), (0, 24, "stop"), (25, 24, "length")]
)
def test_finish_reason_from_token_count(n_tokens, max_tokens, reason):
    assert ray_engine.finish_reason(n_tokens, max_tokens) == reason


def test_processor_rows_become_results():
    ok = ray_engine.result_from_row(
        {"key": "a", "text": "Once", "n_tokens": 24, "n_prompt_tokens": 9, "max_tokens": 24, "error": ""}
    )
    assert (ok.key, ok.text, ok.finish_reason, ok.n_tokens, ok.n_prompt_tokens, ok.error) == (
        "a",
        "Once",
        "length",
        24,
        9,
        None,
    )
    short = ray_engine.result_from_row(
        {"key": "b", "text": "x", "n_tokens": 3, "n_prompt_tokens": 9, "max_tokens": 24, "error": ""}
    )
    assert short.finish_reason == "stop"
    failed = ray_engine.result_from_row(
        {"key": "c", "text": "", "n_tokens": 0, "n_prompt_tokens": 0, "max_tokens": 24, "error": "ValueError: boom"}
    )
    assert failed.finish_reason == "error" and failed.error == "ValueError: boom" and failed.text == ""
    # what the processor hands to the postprocess step -> what result_from_row reads
    raw = {
        "key": "d",
        "generated_text": "t",
        "num_generated_tokens": 5,
        "num_input_tokens": 8,
        "max_tokens": 5,
        "__inference_error__": "",
        "time_taken_llm": 1.5,
        "prompt": "p",
    }
    post = ray_engine._postprocess(raw)
    assert ray_engine.result_from_row(post).finish_reason == "length" and post["seconds_in_vllm"] == 1.5


def test_partition_by_key_each_key_once_and_duplicates_refused():
    reqs = [ChatRequest(key=k, messages=[], sampling=SAMPLING, seed=1) for k in ["d", "a", "c", "b", "e"]]
    blocks = ray_engine.partition(reqs, 2)
    assert [[r.key for r in b] for b in blocks] == [["a", "b"], ["c", "d"], ["e"]]
    with pytest.raises(EngineError, match="repeated: a"):
        ray_engine.partition(reqs + [ChatRequest(key="a", messages=[], sampling=SAMPLING, seed=2)], 2)


def test_processor_config_on_cpu_has_cpu_bundles_no_metrics_and_the_in_process_scheduler():
    settings = EngineSettings(
        backend="ray",
        max_num_seqs=8,
        cpu_kvcache_gb=3,
        ray=RaySettings(concurrency=2, batch_size=5, cpus_per_replica=2),
    )
    kw = ray_engine.processor_config_kwargs(CPU, settings, seed=42, folder="/w")
    assert kw["placement_group_config"]["bundles"] == [{"CPU": 2}]
    assert kw["log_engine_metrics"] is False and kw["concurrency"] == 2 and kw["batch_size"] == 5
    assert kw["engine_kwargs"]["seed"] == 42 and kw["engine_kwargs"]["max_num_seqs"] == 8
    for k, v in engines.cpu_scheduler_kwargs(CPU).items():
        assert kw["engine_kwargs"][k] == v
    assert kw["runtime_env"]["env_vars"]["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert kw["runtime_env"]["env_vars"]["VLLM_CPU_ATTN_SPLIT_KV"] == "0"
    remote = cpu_engine_variables(EngineSettings(), local=False)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in remote  # a cluster node binds its own cores
    gpu = ModelSpec(name="g", source="hub", hub_id="x/y", device="cuda", tensor_parallel_size=2)
    kw = ray_engine.processor_config_kwargs(
        gpu, EngineSettings(backend="ray", ray=RaySettings(tensor_parallel_size=4)), 1, "/w"
    )
    assert "placement_group_config" not in kw and kw["engine_kwargs"]["tensor_parallel_size"] == 4
    assert "enable_chunked_prefill" not in kw["engine_kwargs"]
    if importlib.util.find_spec("ray") is not None:  # the real config class accepts them
        from ray.data.llm import vLLMEngineProcessorConfig

        vLLMEngineProcessorConfig(**ray_engine.processor_config_kwargs(CPU, settings, seed=42, folder="/w"))


# --- kill and resume on the scripted engine ---------------------------------------------------------


def test_kill_and_resume_counts(tmp_path):
    rows = [
        {
            "story_id": f"s{i}",
            "design": "bedtime",
            "language": "en",
            "model": "m",
            "prompt_id": f"p{i}",
            "sample": 0,
            "seed": i,
            "prompt": "tell",
            "_sampling": SAMPLING.model_dump(),
            "_choice": None,
        }
        for i in range(5)
    ]
    from storybias.stages import generate

    for col in generate.plan_columns():
        for r in rows:
            r.setdefault(col, None)
    calls: list[str] = []
    counts = kill_and_resume(
        lambda: FakeEngine(CPU, calls=calls), CPU, EngineSettings(), rows, tmp_path, shard_size=2, kill_after=2
    )
    assert counts == {
        "planned": 5,
        "kept_after_kill": 2,
        "generated_on_resume": 3,
        "stored_rows": 5,
        "unique_stories": 5,
        "duplicates": 0,
        "missing": 0,
    }
    # only the request in flight at the kill (its result never reached the runner) is asked again
    assert sorted(set(calls)) == [f"s{i}" for i in range(5)] and len(calls) == 6 and calls.count("s2") == 2


# --- planning -------------------------------------------------------------------------------------------


def test_plan_with_known_numbers():
    planned = pd.DataFrame(
        {
            "design": ["bedtime"] * 4 + ["stereotales"] * 2,
            "model": ["a"] * 4 + ["b"] * 2,
            "prompt": ["x" * 30] * 4 + ["y" * 300] * 2,
            "_sampling": [{"max_tokens": 100}] * 4 + [{"max_tokens": 1000}] * 2,
        }
    )
    specs = [
        ModelSpec(name="a", source="embedded"),
        ModelSpec(name="b", source="hub", hub_id="x/y", device="cuda", tensor_parallel_size=2),
    ]
    rows = planning.plan_rows(planned, specs, PlanningSettings(tokens_per_second_per_replica=10, gpus=4))
    a, b = rows
    # a: 4 prompts of 30 chars -> 4 x (30 // 3 + 12) = 88 prompt tokens; 400 output; 4 replicas -> 10 s
    assert (a.design, a.model, a.requests, a.prompt_tokens, a.output_tokens, a.replicas, a.wall_seconds) == (
        "bedtime",
        "a",
        4,
        88,
        400,
        4,
        10.0,
    )
    # b: 2 x (100 + 12) = 224; 2000 output; 4 GPUs / tp 2 = 2 replicas -> 2000 / 20 = 100 s
    assert (b.prompt_tokens, b.output_tokens, b.replicas, b.wall_seconds) == (224, 2000, 2, 100.0)
    text = planning.format_plan(rows, PlanningSettings(tokens_per_second_per_replica=10, gpus=4))
    assert "~10 s" in text and "~100 s" in text and "estimate rule" in text
    # the Ray backend's own tensor parallel size wins
    assert (
        planning.plan_rows(planned, specs, PlanningSettings(tokens_per_second_per_replica=10, gpus=4), 4)[1].replicas
        == 1
    )


def test_plan_of_the_smoke_profile_counts_its_requests():
    p = load(ROOT / "params" / "smoke.yaml")
    rows = planning.profile_plan(p)
    from storybias.config.plan import plan

    assert sum(r.requests for r in rows) == len(plan(p)) == 8
    assert sum(r.output_tokens for r in rows) == 8 * 48


def test_stage01_killed_after_its_first_shard_resumes_like_the_slow_test(tmp_path, monkeypatch):
    """The slow test's flow (tests/test_ray_slow.py) on the scripted engine: KillAfter lands after the
    first shard, the rerun keeps those 2 stories and generates the 2 others."""
    from storybias.stages import generate
    from storybias.tools.bench import KillAfter

    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(generate, "preflight", lambda spec: (None, "fake"))
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["run_name"] = "pytest-ray-fake"
    raw["generation"]["shard_size"] = 2
    raw["designs"] = {
        "stereotales": {"languages": ["en"], "n_prompts": 2},
        "bedtime": {"languages": ["en"], "n_prompts": 2},
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(raw))
    p = load(tmp_path / "p.yaml")
    assert len(generate.plan(p)) == 4
    calls: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        generate.run(
            p, progress=False, log=lambda m: None, engine_factory=lambda s: KillAfter(FakeEngine(s, calls=calls), 2)
        )
    work = cache_dir(p.run_name)
    before = pd.concat([pd.read_parquet(f) for f in sorted(work.glob("part-*.parquet"))])
    assert len(before) == 2
    result = generate.run(p, progress=False, log=lambda m: None, engine_factory=lambda s: FakeEngine(s, calls=calls))
    assert len(result["stories"]) == 4 and result["stories"]["story_id"].is_unique
    assert result.manifest["reuse"] == {"reused": 2, "new": 2}
