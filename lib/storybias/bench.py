"""Benchmarks (run by hand or by `make bench-*`; timings are reported, not asserted by tests).

bench_generate: does the pipeline add cost to the engine? One engine, the same prompts, seeds and
sampling parameters, timed alternately through (a) a bare ``LLM.chat`` call and (b) stage 01's own
path (``generate.generate_with``: streamed results, rows, atomic shards). Every request generates
exactly ``max_tokens`` tokens (ignore_eos): with free stopping the two paths wrote different stories
(prefix caching changes the numerics after the first pass), so tokens/s compared different work.
Reports output tokens/s of each and the ratio pipeline / bare (target >= 0.95).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from . import paths
from .engines import Engine
from .generate import ModelRun, STORIES_SCHEMA, _request, generate_with, plan
from .io import ShardStore, write_json_atomic
from .params import Params


def _fixed_length(rows: list[dict[str, Any]], max_tokens: int) -> list[dict[str, Any]]:
    """Every request generates exactly max_tokens tokens, on both paths."""
    return [{**r, "_sampling": {**r["_sampling"], "max_tokens": max_tokens}, "_ignore_eos": True} for r in rows]


def _bench_rows(params: Params, n_prompts: int) -> list[dict[str, Any]]:
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


def _bare(engine: Engine, rows: list[dict[str, Any]]) -> tuple[float, int]:
    requests = [_request(r) for r in rows]
    started = time.time()
    outputs = engine.llm.chat(
        [r.messages for r in requests], [engine.sampling_params(r) for r in requests], use_tqdm=False
    )
    seconds = time.time() - started
    return seconds, sum(len(o.outputs[0].token_ids) for o in outputs)


def _pipeline(engine: Engine, rows: list[dict[str, Any]], folder: Path, shard_size: int) -> tuple[float, int]:
    store = ShardStore(folder, key="story_id", schema=STORIES_SCHEMA)
    store.clear()
    record = ModelRun(model=rows[0]["model"])
    started = time.time()
    generate_with(engine, rows, store, shard_size, record, progress=False)
    return time.time() - started, record.output_tokens


def bench_generate(params: Params, n_prompts: int = 24, repeats: int = 2, max_tokens: int = 200, log=print) -> dict[str, Any]:
    from .generate import prepare_models

    prepare_models(params, log=log)
    rows = _fixed_length(_bench_rows(params, n_prompts), max_tokens)
    spec = params.generation.models[0]
    log(f"bench-generate: {len(rows)} prompts x {max_tokens} tokens, model {spec.name}, {repeats} repeats per path")
    bare_rates, pipe_rates, trials = [], [], []
    with Engine(spec, params.generation.engine, params.generation.seed) as engine, tempfile.TemporaryDirectory() as tmp:
        log(f"engine start-up: {engine.info.startup_seconds:.1f} s")
        _bare(engine, rows[: min(4, len(rows))])  # warm-up: first requests pay one-off costs
        for i in range(repeats):
            # alternate the order so drift (thermal, caches) does not favour one path
            order = ("bare", "pipeline") if i % 2 == 0 else ("pipeline", "bare")
            for path in order:
                if path == "bare":
                    seconds, tokens = _bare(engine, rows)
                    bare_rates.append(tokens / seconds)
                else:
                    seconds, tokens = _pipeline(engine, rows, Path(tmp), params.generation.shard_size)
                    pipe_rates.append(tokens / seconds)
                trials.append({"repeat": i, "path": path, "seconds": round(seconds, 2), "tokens": tokens, "tokens_per_second": round(tokens / seconds, 2)})
                log(f"  {path:8s} repeat {i}: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.1f} tokens/s")
        startup = engine.info.startup_seconds
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
