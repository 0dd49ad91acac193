"""Benchmarks (run by hand or by `make bench-*`; timings are reported, not asserted by tests).

Each `make bench-*` target is one self-contained function, run by hand; none is imported by a stage.
The association tests' benchmark lives in ``storybias.tools.bench_associations`` and is importable
from here as well.

bench_generate: does the pipeline add cost to the engine? One engine, the same prompts, seeds and
sampling parameters, timed alternately through (a) a bare ``LLM.chat`` call and (b) stage 01's own
path (``generate.generate_with``: streamed results, rows, atomic shards). Every request generates
exactly ``max_tokens`` tokens (ignore_eos): with free stopping the two paths wrote different stories
(prefix caching changes the numerics after the first pass), so tokens/s compared different work.
Reports output tokens/s of each and the ratio pipeline / bare (target >= 0.95).

bench_served (``make bench-generate SERVE=1``): stage 01's path on the in-process engine, then the same
prompts, seeds and sampling through the local vLLM OpenAI-compatible server (storybias.engines.local_servers) over
HTTP, one after the other (never both engines at once); reports tokens/s of each and the ratio
HTTP / in-process (target >= 0.9 on CPU), and both start-up times.

bench_associations (``storybias.tools.bench_associations``): stage 04's association tests at paper
scale (650,000 synthetic stories, 23 models, 10 languages, 19 dimensions): wall and CPU time of the
global and the per-language pass (target <= 10 minutes together), peak memory, how each table got its
p-value, and a check of the decisions against the 500,000-resample Monte-Carlo Fisher test on a
stratified sample of tables.

bench_ray (``make bench-ray``): a smoke generation through Ray Data's vLLM processor against the
in-process engine, then the kill-and-resume check of stage 01's path on Ray.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from storybias.config.params import EngineSettings, ModelSpec, Params, RaySettings
from storybias.config.plan import plan
from storybias.core import paths
from storybias.core.io import write_json_atomic
from storybias.engines import ChatEngine, Engine, EngineInfo, entered_info
from storybias.engines.cache import CachingEngine, ResponseCache
from storybias.engines.local_servers import start_server
from storybias.engines.openai_endpoint import OpenAIEngine
from storybias.engines.ray_engine import RayEngine, require_ray
from storybias.stages.generate import ModelRun, generate_with, prepare_models, story_request
from storybias.tools.bench_associations import (
    LANGUAGES,
    REFERENCE_RESAMPLES,
    bench_associations,
    synthetic_extractions,
)

__all__ = [
    "LANGUAGES",
    "REFERENCE_RESAMPLES",
    "KillAfter",
    "bench_associations",
    "bench_generate",
    "bench_ray",
    "bench_served",
    "kill_and_resume",
    "synthetic_extractions",
]


def trial_record(repeat: int, path: str, seconds: float, tokens: int) -> dict[str, Any]:
    """One timed trial of a bench: its wall time, tokens and tokens/s."""
    return {
        "repeat": repeat,
        "path": path,
        "seconds": round(seconds, 2),
        "tokens": tokens,
        "tokens_per_second": round(tokens / seconds, 2),
    }


def fixed_length(rows: list[dict[str, Any]], max_tokens: int) -> list[dict[str, Any]]:
    """Every request generates exactly max_tokens tokens, on both paths."""
    return [{**r, "_sampling": {**r["_sampling"], "max_tokens": max_tokens}, "_ignore_eos": True} for r in rows]


def bench_rows(params: Params, n_prompts: int) -> list[dict[str, Any]]:
    """Up to ``n_prompts`` free-text stories of the first model, taken round-robin over designs."""
    planned = plan(params)
    model = params.generation.models[0].name
    planned = planned[(planned["model"] == model) & (planned["cond_task"].fillna("") != "explicit")]
    groups = [g.to_dict("records") for _, g in planned.groupby("design", sort=True)]
    rows: list[dict[str, Any]] = []
    while len(rows) < n_prompts and any(groups):
        for g in groups:
            if g and len(rows) < n_prompts:
                rows.append(g.pop(0))
    return rows


def bare_chat(engine: Engine, rows: list[dict[str, Any]]) -> tuple[float, int]:
    requests = [story_request(r) for r in rows]
    started = time.time()
    outputs = engine.llm.chat(
        [r.messages for r in requests], [engine.sampling_params(r) for r in requests], use_tqdm=False
    )
    seconds = time.time() - started
    return seconds, sum(len(o.outputs[0].token_ids) for o in outputs)


class _Borrowed:
    """A started engine lent to a CachingEngine, which would otherwise close it when it exits: the
    benchmarks time several passes on one engine."""

    def __init__(self, engine: ChatEngine):
        self.engine = engine
        self.info = engine.info

    def __enter__(self) -> ChatEngine:
        return self.engine

    def __exit__(self, *exc: Any) -> None:
        return None


def timed_pipeline(engine: ChatEngine, params: Params, rows: list[dict[str, Any]], folder: Path) -> tuple[float, int]:
    """Stage 01's path on a started ``engine`` over an emptied cache in ``folder``: (seconds, tokens)."""
    ResponseCache(folder).store.clear()
    cache = ResponseCache(folder, params.generation.shard_size)
    spec = params.generation.models[0]
    cached = CachingEngine(lambda: cast(ChatEngine, _Borrowed(engine)), spec, params.generation.engine, cache)
    record = ModelRun(model=rows[0]["model"])
    started = time.time()
    with cached:
        generate_with(cached, rows, record, progress=False)
    return time.time() - started, record.output_tokens


def bench_generate(
    params: Params, n_prompts: int = 24, repeats: int = 2, max_tokens: int = 200, log=print
) -> dict[str, Any]:

    prepare_models(params, log=log)
    rows = fixed_length(bench_rows(params, n_prompts), max_tokens)
    spec = params.generation.models[0]
    log(f"bench-generate: {len(rows)} prompts x {max_tokens} tokens, model {spec.name}, {repeats} repeats per path")
    bare_rates, pipe_rates, trials = [], [], []
    with Engine(spec, params.generation.engine, params.generation.seed) as engine, tempfile.TemporaryDirectory() as tmp:
        log(f"engine start-up: {entered_info(engine).startup_seconds:.1f} s")
        bare_chat(engine, rows[: min(4, len(rows))])  # warm-up: first requests pay one-off costs
        for i in range(repeats):
            # alternate the order so drift (thermal, caches) does not favour one path
            order = ("bare", "pipeline") if i % 2 == 0 else ("pipeline", "bare")
            for path in order:
                if path == "bare":
                    seconds, tokens = bare_chat(engine, rows)
                    bare_rates.append(tokens / seconds)
                else:
                    seconds, tokens = timed_pipeline(engine, params, rows, Path(tmp))
                    pipe_rates.append(tokens / seconds)
                trials.append(trial_record(i, path, seconds, tokens))
                log(f"  {path:8s} repeat {i}: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.1f} tokens/s")
        startup = entered_info(engine).startup_seconds
    result = {
        "n_prompts": len(rows),
        "tokens_per_request": max_tokens,
        "model": spec.name,
        "startup_seconds": startup,
        "bare_tokens_per_second": round(statistics.median(bare_rates), 2),
        "pipeline_tokens_per_second": round(statistics.median(pipe_rates), 2),
        "ratio_pipeline_over_bare": round(statistics.median(pipe_rates) / statistics.median(bare_rates), 3),
        "trials": trials,
    }
    out = paths.run_dir(params.run_name) / "bench_generate.json"
    write_json_atomic(result, out)
    log(f"ratio pipeline / bare = {result['ratio_pipeline_over_bare']:.3f} (target >= 0.95); written to {out}")
    return result


def bench_served(
    params: Params, n_prompts: int = 24, repeats: int = 2, max_tokens: int = 200, log=print
) -> dict[str, Any]:
    """Stage 01's path in process vs over HTTP against the local server, same rows (fixed length)."""

    prepare_models(params, log=log)
    rows = fixed_length(bench_rows(params, n_prompts), max_tokens)
    spec = params.generation.models[0]
    settings, seed = params.generation.engine, params.generation.seed
    log(
        f"bench-generate (served): {len(rows)} prompts x {max_tokens} tokens, model {spec.name}, "
        f"{repeats} repeats per path"
    )
    rates: dict[str, list[float]] = {"in_process": [], "http": []}
    startup: dict[str, float] = {}
    trials = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in ("in_process", "http"):
            server = None
            started = time.time()
            engine: ChatEngine
            if path == "in_process":
                engine = Engine(spec, settings, seed)
            else:
                server = start_server(spec, settings, seed, params.run_name, log=log)
                engine = OpenAIEngine.for_local_server(spec, server.entry(), settings, seed)
            try:
                with engine:
                    startup[path] = round(time.time() - started, 1)
                    log(f"{path}: start-up {startup[path]:.1f} s")
                    timed_pipeline(engine, params, rows[: min(4, len(rows))], Path(tmp))  # warm-up
                    for i in range(repeats):
                        seconds, tokens = timed_pipeline(engine, params, rows, Path(tmp))
                        rates[path].append(tokens / seconds)
                        trials.append(trial_record(i, path, seconds, tokens))
                        log(
                            f"  {path:10s} repeat {i}: {tokens} tokens in {seconds:.1f} s = "
                            f"{tokens / seconds:.1f} tokens/s"
                        )
            finally:
                if server is not None:
                    server.stop()
    result = {
        "n_prompts": len(rows),
        "tokens_per_request": max_tokens,
        "model": spec.name,
        "startup_seconds": startup,
        "in_process_tokens_per_second": round(statistics.median(rates["in_process"]), 2),
        "http_tokens_per_second": round(statistics.median(rates["http"]), 2),
        "ratio_http_over_in_process": round(
            statistics.median(rates["http"]) / statistics.median(rates["in_process"]), 3
        ),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "trials": trials,
    }
    out = paths.run_dir(params.run_name) / "bench_generate_served.json"
    write_json_atomic(result, out)
    log(f"ratio HTTP / in-process = {result['ratio_http_over_in_process']:.3f} (target >= 0.9); written to {out}")
    return result


class KillAfter:
    """A ChatEngine that dies (KeyboardInterrupt, as a killed job) after ``n`` results of the wrapped
    engine: the kill-and-resume checks of the Ray backend (``make bench-ray``, tests/test_ray_slow.py)."""

    def __init__(self, engine: Any, n: int):
        self.engine, self.n = engine, n
        self.info: EngineInfo | None = None

    def __enter__(self) -> KillAfter:
        self.engine.__enter__()
        self.info = self.engine.info
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self.engine.__exit__(*exc)

    def stream(self, requests: Sequence[Any]):
        for i, result in enumerate(self.engine.stream(requests)):
            if i == self.n:
                raise KeyboardInterrupt(f"simulated kill after {self.n} results")
            yield result

    def tokenizer(self) -> Any:
        return self.engine.tokenizer()


def kill_and_resume(
    engine_factory: Any,
    spec: ModelSpec,
    settings: EngineSettings,
    rows: list[dict[str, Any]],
    folder: Path,
    shard_size: int,
    kill_after: int,
) -> dict[str, Any]:
    """Stage 01's path (``generate_with`` through the cache in ``folder``) killed after ``kill_after``
    results, then resumed with a fresh engine; counts what was kept, redone, duplicated."""
    ResponseCache(folder).store.clear()

    def caching(inner: Any) -> CachingEngine:
        return CachingEngine(lambda: inner, spec, settings, ResponseCache(folder, shard_size))

    try:
        with caching(KillAfter(engine_factory(), kill_after)) as engine:
            generate_with(engine, rows, ModelRun(model=rows[0]["model"]), progress=False)
    except KeyboardInterrupt:
        pass
    kept = len(ResponseCache(folder))
    resumed = ModelRun(model=rows[0]["model"])
    with caching(engine_factory()) as engine:
        stories = generate_with(engine, rows, resumed, progress=False)
    keys = ResponseCache(folder).store.read_all().column("logical_key").to_pylist()
    return {
        "planned": len(rows),
        "kept_after_kill": kept,
        "generated_on_resume": resumed.n_generated,
        "stored_rows": len(keys),
        "unique_stories": len(set(keys)),
        "duplicates": len(keys) - len(set(keys)),
        "missing": len({r["story_id"] for r in rows} - {s["story_id"] for s in stories}),
    }


def bench_ray(params: Params, n_prompts: int = 24, log=print) -> dict[str, Any]:
    """Smoke-sized generation through Ray Data's vLLM processor (storybias.engines.ray_engine, a local Ray on this
    machine) against the in-process engine on the same prompts, seeds and sampling, one after the other.

    Every request generates exactly the profile's ``max_tokens`` (ignore_eos), so both do the same work.
    Timed Ray run: one block (``batch_size`` >= prompts), so its generation time is the longest
    request's time inside vLLM, and its start-up (ray.init + processor, then the replica loading the
    model) is the rest, reported separately. Then the kill-and-resume check through stage 01's path with
    ``batch_size`` = ``shard_size`` (results stream back block by block), killed after the first shard.
    """

    require_ray()
    prepare_models(params, log=log)
    spec = params.generation.models[0]
    max_tokens = params.generation.sampling.max_tokens
    rows = fixed_length(bench_rows(params, n_prompts), max_tokens)
    requests = [story_request(r) for r in rows]
    base, seed = params.generation.engine, params.generation.seed
    ray_base = base.ray if base.backend == "ray" else RaySettings(num_cpus=min(2, os.cpu_count() or 1))
    log(f"bench-ray: {len(rows)} prompts x {max_tokens} tokens, model {spec.name}; Ray address {ray_base.address}")
    result: dict[str, Any] = {"n_prompts": len(rows), "tokens_per_request": max_tokens, "model": spec.name}

    with Engine(spec, base, seed) as engine:
        started = time.time()
        local = {r.key: r for r in engine.stream(requests)}
        seconds = time.time() - started
        tokens = sum(r.n_tokens for r in local.values())
        result["in_process"] = {
            "startup_seconds": entered_info(engine).startup_seconds,
            "generation_seconds": round(seconds, 2),
            "output_tokens": tokens,
            "tokens_per_second": round(tokens / seconds, 2),
        }
    log(f"  in process: start-up {entered_info(engine).startup_seconds:.1f} s, {tokens} tokens in {seconds:.1f} s")

    out = paths.run_dir(params.run_name) / "bench_ray.json"
    try:
        _bench_ray_paths(params, spec, rows, requests, local, base, ray_base, seed, result, log)
    except Exception as exc:  # a replica that cannot start (memory, hardware): keep what was measured
        result["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        write_json_atomic(result, out)
        log(f"bench-ray: the Ray part failed ({result['error'][:200]}); partial results written to {out}")
        raise
    write_json_atomic(result, out)
    log(f"ratio Ray / in process (generation tokens/s) = {result['ratio_ray_over_in_process']}; written to {out}")
    return result


def _bench_ray_paths(
    params: Params,
    spec: Any,
    rows: list[dict[str, Any]],
    requests: list[Any],
    local: dict[str, Any],
    base: Any,
    ray_base: Any,
    seed: int,
    result: dict[str, Any],
    log,
) -> None:
    """bench_ray's Ray half: the timed one-block run, then kill-and-resume (fills ``result``)."""

    one_block = base.model_copy(
        update={
            "backend": "ray",
            "shared_server": False,
            "ray": ray_base.model_copy(update={"batch_size": max(len(rows), ray_base.batch_size)}),
        }
    )
    started = time.time()
    with RayEngine(spec, one_block, seed) as ray_engine:
        init = entered_info(ray_engine).startup_seconds
        on_ray = {r.key: r for r in ray_engine.stream(requests)}
        timing = dict(ray_engine.last_stream)
    wall = time.time() - started
    tokens = sum(r.n_tokens for r in on_ray.values())
    generation = timing["max_request_seconds_in_vllm"]
    same = sum(on_ray[k].text == local[k].text for k in local)
    result["ray"] = {
        "init_and_processor_seconds": init,
        "stream_seconds": timing["seconds"],
        "replica_startup_seconds": round(timing["seconds"] - generation, 2),
        "generation_seconds": generation,
        "wall_seconds": round(wall, 2),
        "output_tokens": tokens,
        "tokens_per_second": round(tokens / generation, 2) if generation else None,
        "tokens_per_second_wall": round(tokens / wall, 2),
        "errors": sum(r.error is not None for r in on_ray.values()),
    }
    result["ratio_ray_over_in_process"] = (
        round(result["ray"]["tokens_per_second"] / result["in_process"]["tokens_per_second"], 3)
        if result["ray"]["tokens_per_second"]
        else None
    )
    result["same_texts"] = f"{same}/{len(local)}"
    log(
        f"  ray: init+processor {init:.1f} s, replica start-up {result['ray']['replica_startup_seconds']:.1f} s, "
        f"{tokens} tokens in {generation:.1f} s in vLLM; wall {wall:.1f} s; "
        f"same texts as in process: {same}/{len(local)}"
    )

    shard = params.generation.shard_size
    streamed = base.model_copy(
        update={"backend": "ray", "shared_server": False, "ray": ray_base.model_copy(update={"batch_size": shard})}
    )
    with tempfile.TemporaryDirectory() as tmp:
        result["kill_and_resume"] = kill_and_resume(
            lambda: RayEngine(spec, streamed, seed), spec, streamed, rows, Path(tmp), shard, shard
        )
    log(f"  kill and resume: {result['kill_and_resume']}")
