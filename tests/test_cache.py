"""The one cache of every model call (storybias.engines.cache): what makes a stored answer reusable."""

from __future__ import annotations

import pytest

from fake_engine import FakeEngine
from storybias.config.params import EngineSettings, ModelSpec, Sampling
from storybias.engines import ChatRequest, cache
from storybias.engines.cache import CachingEngine, ResponseCache

EMBEDDED = ModelSpec(name="m", source="embedded")
SERVED = ModelSpec(name="m", source="openai", base_url="http://127.0.0.1:9/v1", model_id="org/model")


def requests(n: int = 3, **changes) -> list[ChatRequest]:
    base = dict(sampling=Sampling(temperature=0.0, max_tokens=32), seed=7, json_schema={"type": "object"})
    base.update(changes)
    return [ChatRequest(key=f"k{i}", messages=[{"role": "user", "content": f"story {i}"}], **base) for i in range(n)]


def ask(folder, spec: ModelSpec, settings: EngineSettings, batch: list[ChatRequest], calls: list[str], **fake):
    """Stream ``batch`` through a caching engine over ``folder``; returns the engine (its stats)."""
    engine = CachingEngine(lambda: FakeEngine(spec, calls=calls, **fake), spec, settings, ResponseCache(folder, 2))
    with engine:
        results = list(engine.stream(batch))
    assert sorted(r.key for r in results) == sorted(r.key for r in batch), "one result per request"
    return engine


def answered_twice(tmp_path, first: tuple[ModelSpec, EngineSettings], second: tuple[ModelSpec, EngineSettings]):
    calls: list[str] = []
    ask(tmp_path, *first, requests(), calls)
    calls.clear()
    engine = ask(tmp_path, *second, requests(), calls)
    return calls, engine


OUTPUT_ENGINE_CHANGES = [
    {"compact_json": True},
    {"enforce_eager": True},
    {"deterministic_cpu_attention": False},
    {"cpu_top_k_first": True},  # a tie at the nucleus boundary may be cut differently
]
OPERATIONAL_ENGINE_CHANGES = [
    {"max_num_seqs": 4},
    {"cpu_kvcache_gb": 8},
    {"cpu_threads_bind": "0"},
    {"shared_server": True},
    {"backend": "ray"},
    {"cpu_preload": True},  # measured: 16 of 16 texts identical with and without (docs/measurements)
]


@pytest.mark.parametrize("change", OUTPUT_ENGINE_CHANGES, ids=lambda c: next(iter(c)))
def test_an_engine_setting_that_shapes_outputs_regenerates(tmp_path, change):
    calls, engine = answered_twice(tmp_path, (EMBEDDED, EngineSettings()), (EMBEDDED, EngineSettings(**change)))
    assert calls == ["k0", "k1", "k2"]
    assert engine.stats.reasons == {"engine changed": 3}


@pytest.mark.parametrize("change", OPERATIONAL_ENGINE_CHANGES, ids=lambda c: next(iter(c)))
def test_an_engine_setting_that_cannot_shape_outputs_reuses(tmp_path, change):
    calls, engine = answered_twice(tmp_path, (EMBEDDED, EngineSettings()), (EMBEDDED, EngineSettings(**change)))
    assert calls == [] and engine.stats.reasons == {"reused": 3}
    assert not engine.model_loaded, "nothing missed: no model is loaded"


@pytest.mark.parametrize(
    "spec",
    [
        EMBEDDED.model_copy(update={"dtype": "float32"}),
        EMBEDDED.model_copy(update={"max_model_len": 2048}),
        EMBEDDED.model_copy(update={"embedded": "qwen2.5-coder-0.5b"}),
        EMBEDDED.model_copy(update={"chat_template_kwargs": {"enable_thinking": False}}),
        ModelSpec(name="m", source="embedded", weights="int8"),  # the W8A8 copy: other numerics
    ],
    ids=["dtype", "max_model_len", "embedded", "chat_template_kwargs", "weights"],
)
def test_a_model_setting_that_shapes_outputs_regenerates(tmp_path, spec):
    calls, engine = answered_twice(tmp_path, (EMBEDDED, EngineSettings()), (spec, EngineSettings()))
    assert calls == ["k0", "k1", "k2"] and engine.stats.reasons == {"model changed": 3}


def test_an_endpoint_or_model_id_change_regenerates_but_its_key_variable_and_pacing_do_not(tmp_path):
    settings = EngineSettings()
    for i, (other, expected) in enumerate(
        [
            (SERVED.model_copy(update={"model_id": "org/other"}), {"model changed": 3}),
            (SERVED.model_copy(update={"base_url": "http://127.0.0.1:10/v1"}), {"model changed": 3}),
            (
                SERVED.model_copy(
                    update={
                        "api_key_env": "OTHER_KEY",
                        "max_concurrency": 2,
                        "request_timeout_s": 5.0,
                        "max_retries": 0,
                        "requests_per_minute": 30.0,
                        "name": "renamed",
                    }
                ),
                {"reused": 3},
            ),
        ]
    ):
        calls, engine = answered_twice(tmp_path / str(i), (SERVED, settings), (other, settings))
        assert engine.stats.reasons == expected


def test_every_model_and_engine_field_is_classified_once():
    """A new field of ModelSpec or EngineSettings must say whether it shapes outputs, and whether it is a
    loading setting: the cache key and the local server key both come from this one classification."""
    model_fields = set(ModelSpec.model_fields)
    classes = list(cache.MODEL_FIELD_CLASSES.values())
    assert set().union(*classes) == model_fields
    assert sum(len(c) for c in classes) == len(model_fields)  # exactly one class each
    assert cache.OUTPUT_MODEL_FIELDS == cache.LOADED_OUTPUT_FIELDS | cache.REQUEST_OUTPUT_FIELDS
    assert cache.SERVER_MODEL_FIELDS == cache.LOADED_OUTPUT_FIELDS | cache.LOADED_ONLY_FIELDS
    assert not cache.OUTPUT_MODEL_FIELDS & cache.OPERATIONAL_MODEL_FIELDS
    engine_fields = set(EngineSettings.model_fields)
    assert cache.OUTPUT_ENGINE_FIELDS | cache.OPERATIONAL_ENGINE_FIELDS == engine_fields
    assert not cache.OUTPUT_ENGINE_FIELDS & cache.OPERATIONAL_ENGINE_FIELDS


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"seed": 8}, "sampling changed"),
        ({"sampling": Sampling(temperature=0.7, max_tokens=32)}, "sampling changed"),
        ({"json_schema": {"type": "array"}}, "constraint changed"),
        ({"json_schema": None, "choice": ["a", "b"]}, "constraint changed"),
    ],
)
def test_a_changed_request_is_asked_again_and_the_reason_names_the_part(tmp_path, change, reason):
    calls: list[str] = []
    ask(tmp_path, EMBEDDED, EngineSettings(), requests(), calls)
    calls.clear()
    engine = ask(tmp_path, EMBEDDED, EngineSettings(), requests(**change), calls)
    assert calls == ["k0", "k1", "k2"] and engine.stats.reasons == {reason: 3}


def test_a_changed_prompt_and_a_new_request(tmp_path):
    calls: list[str] = []
    ask(tmp_path, EMBEDDED, EngineSettings(), requests(2), calls)
    calls.clear()
    batch = requests(3)
    batch[0].messages = [{"role": "user", "content": "an edited story"}]
    engine = ask(tmp_path, EMBEDDED, EngineSettings(), batch, calls)
    assert sorted(calls) == ["k0", "k2"]
    assert engine.stats.reasons == {"prompt changed": 1, "reused": 1, "new": 1}
    # the old answer is still there: changing the prompt back reuses it
    calls.clear()
    engine = ask(tmp_path, EMBEDDED, EngineSettings(), requests(2), calls)
    assert calls == [] and engine.stats.reasons == {"reused": 2}


def test_a_failed_request_is_not_stored_and_is_asked_again(tmp_path):
    calls: list[str] = []
    ask(tmp_path, EMBEDDED, EngineSettings(), requests(), calls, fail=lambda r: "HTTP 500" if r.key == "k1" else None)
    assert len(ResponseCache(tmp_path)) == 2
    calls.clear()
    ask(tmp_path, EMBEDDED, EngineSettings(), requests(), calls)
    assert calls == ["k1"]


def test_answers_are_stored_in_shards_and_kept_across_a_kill(tmp_path):
    calls: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        ask(tmp_path, EMBEDDED, EngineSettings(), requests(5), calls, crash_after=3)
    shards = sorted(tmp_path.glob("part-*.parquet"))
    assert len(shards) == 2, "one full shard of 2 and the third answer, flushed as the interrupt went by"
    assert len(ResponseCache(tmp_path)) == 3
    calls.clear()
    engine = ask(tmp_path, EMBEDDED, EngineSettings(), requests(5), calls)
    assert calls == ["k3", "k4"] and engine.stats.reasons == {"reused": 3, "new": 2}
    assert len(ResponseCache(tmp_path)) == 5, "nothing stored twice"


def test_stored_answers_come_back_marked_and_unchanged(tmp_path):
    calls: list[str] = []
    spec, settings = EMBEDDED, EngineSettings()
    engine = CachingEngine(lambda: FakeEngine(spec, calls=calls), spec, settings, ResponseCache(tmp_path))
    with engine:
        fresh = {r.key: r for r in engine.stream(requests())}
    engine = CachingEngine(lambda: FakeEngine(spec, calls=calls), spec, settings, ResponseCache(tmp_path))
    with engine:
        stored = {r.key: r for r in engine.stream(requests())}
    for key, result in stored.items():
        assert result.cached and not fresh[key].cached
        assert (result.text, result.n_tokens, result.answered_at) == (
            fresh[key].text,
            fresh[key].n_tokens,
            fresh[key].answered_at,
        )


def test_shard_size_is_checked(tmp_path):
    with pytest.raises(ValueError, match="shard_size must be at least 1"):
        ResponseCache(tmp_path, 0)


def test_the_tokenizer_comes_from_the_engine_without_loading_a_model(tmp_path):
    """Stage 03 fits stories to the context before it knows whether a model must load: the inner
    engine's tokenizer is used when it can give one unstarted, and nothing is started for it."""
    marker = object()
    entered: list[bool] = []

    class Unstarted(FakeEngine):
        def __enter__(self):
            entered.append(True)
            return super().__enter__()

    engine = CachingEngine(
        lambda: Unstarted(EMBEDDED, tokenizer=marker), EMBEDDED, EngineSettings(), ResponseCache(tmp_path)
    )
    with engine:
        assert engine.tokenizer() is marker
        assert entered == [] and not engine.model_loaded
        list(engine.stream(requests(1)))
        assert entered == [True] and engine.model_loaded and engine.tokenizer() is marker


def test_the_benchmark_lends_its_started_engine_to_the_cache_and_keeps_it_open(tmp_path):
    """`make bench-generate` times stage 01's path on an engine it started once: tools.bench.timed_pipeline lends
    it through a wrapper whose ``__enter__`` returns the engine. The cache streamed through the wrapper
    instead (AttributeError: '_Borrowed' object has no attribute 'stream', after the engine's start-up)."""
    from storybias.config.params import load
    from storybias.core import paths
    from storybias.tools import bench

    params = load(paths.repo_root() / "params" / "smoke.yaml")
    rows = bench.fixed_length(bench.bench_rows(params, 3), 16)
    engine = FakeEngine(params.generation.models[0], n_tokens=16).__enter__()
    for repeat in range(2):  # the benchmark runs the path once per repeat, on the same engine
        seconds, tokens = bench.timed_pipeline(engine, params, rows, tmp_path / f"cache{repeat}")
        assert tokens == 3 * 16 and seconds >= 0
    assert len(engine.calls) == 6 and engine.exited == 0, "every pass asked the lent engine, which stays open"


def test_each_engine_start_is_logged_where_the_variable_points(tmp_path, monkeypatch):
    """Issue #43: the test log lists every engine start and what it cost (conftest's summary reads this file)."""
    from conftest import engine_starts_summary
    from storybias.engines.base import STARTS_LOG_VARIABLE, record_start

    log = tmp_path / "starts.jsonl"
    monkeypatch.delenv(STARTS_LOG_VARIABLE, raising=False)
    record_start("m", "in_process", 1.0)  # no variable: nothing written anywhere
    monkeypatch.setenv(STARTS_LOG_VARIABLE, str(log))
    record_start("qwen2.5-coder-0.5b", "in_process", 35.2, enforce_eager=True)
    record_start("qwen2.5-coder-0.5b", "server", 61.0, enforce_eager=False)
    summary = engine_starts_summary(log)
    assert len(summary) == 3 and "in_process" in summary[0] and "35.2 s  (enforce_eager)" in summary[0]
    assert "server" in summary[1] and "enforce_eager" not in summary[1]
    assert summary[2] == "2 engine start(s), 96 s in all"
