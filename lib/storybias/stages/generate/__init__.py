"""Stage 01: plan the prompt grid of a run, generate every story, write stories.parquet.

Every request goes through the run's one cache (``storybias.engines.cache``, data/<run>/cache/): a story
whose request -- rendered prompt, seed, sampling, answer constraint, model identity and the engine
settings that shape outputs -- was answered before is read from it, the others are generated and
stored there as they finish. After a crash or kill, a rerun generates only what the cache lacks and
assembles exactly one row per planned story. The manifest counts why each story was generated
(``reuse``: reused, new, "prompt changed", "sampling and model changed", ...).

A request that failed after the engine's retries (a served model: a 4xx, a content filter, a
timeout) is stored as a story with ``finish_reason`` "error" and the reason in ``error``; the stage
finishes, the manifest counts errors per model, stage 02 marks those stories invalid ("error"), and a
rerun asks again for exactly those (the cache never stores an error).

Nothing paid for is deleted: the cache is append-only, so a story the profile no longer plans (a
language dropped, fewer samples) stays in it and comes back without generation when the profile asks
for it again.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pandas as pd

from storybias.config import plan as grid
from storybias.config.models import pinned_sha256
from storybias.config.params import ModelSpec, Params, Sampling
from storybias.config.plan import ERROR, plan_columns, stories_schema
from storybias.core import artifacts, machine, paths
from storybias.core.locks import holds_run_lock
from storybias.core.results import StageResult
from storybias.engines import (
    ChatEngine,
    ChatRequest,
    ChatResult,
    check_endpoint_fits,
    entered_info,
    open_stage_engine,
    preflight,
    prepare,
)
from storybias.engines.cache import REUSED, CachingEngine, ResponseCache, cache_dir
from storybias.engines.runner import raise_if_failed, run_requests
from storybias.stages.generate import corpus, table


def plan(params: Params, progress: bool = False) -> pd.DataFrame:
    """The stories stage 01 will write: the profile's prompt grid, or (a profile with ``corpus:``) the
    corpus' rows it keeps, read and checked without their text (``storybias.stages.generate.corpus``)."""
    if params.corpus is not None:
        if params.corpus.format == "table":
            return table.read_table_plan(params.corpus, progress)
        return corpus.read_plan(params.corpus, progress)
    return grid.plan(params)


def plan_counts(planned: pd.DataFrame) -> pd.DataFrame:
    """Stories planned per design x language x model (column ``stories``), as notebook 01 shows the plan."""
    return planned.groupby(["design", "language", "model"]).size().rename("stories").reset_index()


def example_prompts(planned: pd.DataFrame) -> pd.DataFrame:
    """The first planned row of each design (design order), with its language, prompt id and prompt."""
    first = planned.drop_duplicates("design").sort_values("design", kind="stable")
    return first[["design", "language", "prompt_id", "prompt"]].reset_index(drop=True)


def finish_reason_counts(stories: pd.DataFrame) -> pd.DataFrame:
    """Stories per design x language (rows) and finish reason (columns): how many stopped at the token cap."""
    return stories.pivot_table(
        index=["design", "language"], columns="finish_reason", values="story_id", aggfunc="count", fill_value=0
    )


def story_request(row: dict[str, Any]) -> ChatRequest:
    return ChatRequest(
        key=row["story_id"],
        messages=[{"role": "user", "content": row["prompt"]}],
        sampling=Sampling(**row["_sampling"]),
        seed=int(row["seed"]),
        choice=row["_choice"],
        ignore_eos=bool(row.get("_ignore_eos", False)),  # set by the benchmark only
    )


@dataclass
class ModelRun:
    model: str
    model_id: str = ""
    weights_sha256: str | None = None
    startup_seconds: float = 0.0
    generation_seconds: float = 0.0
    n_generated: int = 0
    n_reused: int = 0  # answered from the run's cache
    output_tokens: int = 0
    prompt_tokens: int = 0
    versions: dict[str, str] = field(default_factory=dict)
    endpoint: str | None = None  # a served model's base URL (never its key)
    n_errors: int = 0  # requests that failed after retries this run (stored as "error" stories)
    errors: list[str] = field(default_factory=list)  # the first few error texts

    @property
    def tokens_per_second(self) -> float:
        return round(self.output_tokens / self.generation_seconds, 2) if self.generation_seconds else 0.0


def generate_result(
    run_name: str, stories: pd.DataFrame, runs: list[ModelRun], manifest: dict[str, Any]
) -> StageResult:
    """Stage 01's result: the stories (``stories``; without the text of an imported corpus), their finish
    reasons per design x language (``finish_reasons``), the per-model records (``runs``) and the values
    notebook 01 records."""
    values = {
        "n_planned": int(manifest.get("n_planned", len(stories))),
        "n_stories": int(len(stories)),
        "n_unique_story_ids": int(stories["story_id"].nunique()),
        "stories_per_design": {str(d): int(n) for d, n in stories["design"].value_counts().items()},
        "n_truncated": int((stories["finish_reason"] == "length").sum()),
    }
    tables = {"stories": stories, "finish_reasons": finish_reason_counts(stories)}
    return StageResult("generate", run_name, tables=tables, manifest=manifest, values=values, details={"runs": runs})


def _null(value: Any) -> Any:
    """pandas stores a missing condition as NaN; Arrow's string columns want None."""
    return None if isinstance(value, float) and value != value else value


def _to_row(planned: dict[str, Any], result: ChatResult, gen_config: str) -> dict[str, Any]:
    row = {k: _null(planned[k]) for k in plan_columns()}
    row.update(
        text=result.text,
        finish_reason=result.finish_reason,
        n_tokens=result.n_tokens,
        n_prompt_tokens=result.n_prompt_tokens,
        gen_config=gen_config,
        generated_at=result.answered_at or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        error=result.error,
    )
    return row


def generate_with(
    engine: CachingEngine, rows: list[dict[str, Any]], record: ModelRun, progress: bool = True
) -> list[dict[str, Any]]:
    """The stories of ``rows`` (planned stories of one model) through ``engine``: stored ones from its
    cache, the others generated and stored as they finish (storybias.engines.cache, storybias.engines.runner). This
    is the whole per-story cost the pipeline adds to the engine (``make bench-generate`` times it
    against a bare ``LLM.chat``)."""
    by_key = {row["story_id"]: row for row in rows}
    requests = [story_request(r) for r in by_key.values()]
    keys = {r.key: engine.key_of(r) for r in requests}
    stories: list[dict[str, Any]] = []
    stats = None
    try:
        stats = run_requests(
            engine,
            requests,
            lambda r: stories.append(_to_row(by_key[r.key], r, keys[r.key])),
            None,
            1,
            desc=f"generate [{record.model}]",
            unit="story",
            progress=progress,
            on_result=lambda r: _count(record, r),
        )
    finally:
        if stats is not None:
            record.generation_seconds = round(record.generation_seconds + stats.seconds, 2)
            record.errors = (record.errors + stats.errors)[:5]
    return stories


def _count(record: ModelRun, result: ChatResult) -> None:
    if result.cached:
        record.n_reused += 1
        return
    record.n_generated += 1
    record.output_tokens += result.n_tokens
    record.prompt_tokens += result.n_prompt_tokens
    record.n_errors += result.error is not None


@holds_run_lock("generate")
def run(
    params: Params,
    progress: bool = True,
    engine_factory: Callable[[ModelSpec], ChatEngine] | None = None,
    log: Callable[[str], None] = print,
) -> StageResult:
    """Generate every planned story the run's cache does not hold, then write stories.parquet and
    manifest_generate.json."""
    started = time.time()
    run_name = params.run_name
    if params.corpus is not None:
        return import_corpus(params, progress, log)
    planned = plan(params)
    factory = engine_factory or (lambda spec: open_stage_engine(params, spec, params.generation.seed))
    cache = ResponseCache.for_run(run_name, params.generation.shard_size)
    engines = {
        spec.name: CachingEngine(partial(factory, spec), spec, params.generation.engine, cache)
        for spec in params.generation.models
    }
    rows_of = {name: planned[planned["model"] == name].to_dict("records") for name in engines}
    reasons: Counter = Counter()
    # Check every model with work before loading any: a paper-profile mistake fails in seconds, not after hours.
    with_work = []
    for spec in params.generation.models:
        found = engines[spec.name].lookup([story_request(r) for r in rows_of[spec.name]])
        reasons.update(found.reasons.values())
        if found.misses:
            preflight(spec)
            check_endpoint_fits(spec, found.misses)  # a served model's context: refused here, not per request
            with_work.append(spec)
    # what the times below were measured on (storybias.core.machine), before any engine takes the cores
    ran_on = machine.record_for([spec.source for spec in with_work], probe=engine_factory is None)
    log(
        f"run '{run_name}': {len(planned)} stories planned, {reasons[REUSED]} in the run's cache, "
        f"{len(planned) - reasons[REUSED]} to generate"
        + "".join(f"; {n} {why}" for why, n in sorted(reasons.items()) if why != REUSED)
    )
    runs, stories = [], []
    for spec in params.generation.models:
        record = ModelRun(model=spec.name)
        runs.append(record)
        with engines[spec.name] as engine:
            stories += generate_with(engine, rows_of[spec.name], record, progress)
            if engine.model_loaded:
                info = entered_info(engine)
                record.model_id, record.startup_seconds = info.model_id, info.startup_seconds
                record.versions, record.endpoint = info.versions, info.endpoint
        if spec.source == "embedded":
            record.weights_sha256 = pinned_sha256(spec)
    frame = _assemble(planned, stories)
    manifest = _manifest(params, planned, frame, runs, time.time() - started)
    manifest.update(reuse=dict(reasons), cache=str(cache_dir(run_name)), machine=ran_on)
    artifacts.write(run_name, "manifest_generate", manifest)
    raise_if_failed(  # every request failed (or more than the profile's share): stop before Make's target
        "generate",
        sum(r.n_generated for r in runs),
        sum(r.n_errors for r in runs),
        [e for r in runs for e in r.errors],
        params.generation.engine.max_failed_share,
    )
    artifacts.write(run_name, "stories", frame)  # last: Make's target
    n_errors = int(frame["finish_reason"].eq(ERROR).sum())
    log(
        f"wrote {artifacts.stories_path(run_name)} ({len(frame)} stories"
        + (f"; {n_errors} failed requests stored as errors: a rerun asks for them again)" if n_errors else ")")
    )
    return generate_result(run_name, frame, runs, manifest)


def import_corpus(params: Params, progress: bool = True, log: Callable[[str], None] = print) -> StageResult:
    """Stage 01 on a corpus profile: the corpus' kept rows, checked, written as stories.parquet and corpus.parquet."""
    started = time.time()
    settings = params.corpus
    assert settings is not None
    planned = plan(params, progress)
    log(f"run '{params.run_name}': importing {len(planned)} stories from {settings.path} (format {settings.format})")
    if settings.format == "table":
        counts = table.write_table_import(params.run_name, planned, settings, progress)
    else:
        counts = corpus.write_import(params.run_name, planned, paths.resolve(settings.path), progress)
    manifest = corpus.import_manifest(settings, planned, counts, time.time() - started)
    manifest.update(run_name=params.run_name, params=params.resolved())
    artifacts.write(params.run_name, "manifest_generate", manifest)
    log(f"wrote {artifacts.stories_path(params.run_name)} ({counts['rows']} imported stories)")
    # the text stays in the file (a corpus can be large); no model ran, so no token count (null, as in the file)
    stories = planned.assign(finish_reason=corpus.IMPORTED, n_tokens=pd.NA)
    return generate_result(params.run_name, stories[[*plan_columns(), "finish_reason", "n_tokens"]], [], manifest)


def _assemble(planned: pd.DataFrame, stories: list[dict[str, Any]]) -> pd.DataFrame:
    """Exactly one row per planned story, in plan order; fails loudly if any is missing."""
    by_id = {row["story_id"]: row for row in stories}
    missing = [sid for sid in planned["story_id"] if sid not in by_id]
    if missing:
        raise RuntimeError(f"{len(missing)} planned stories were not generated (e.g. {missing[0]})")
    frame = pd.DataFrame([by_id[sid] for sid in planned["story_id"]], columns=stories_schema().names)
    return frame


def _manifest(
    params: Params, planned: pd.DataFrame, stories: pd.DataFrame, runs: list[ModelRun], seconds: float
) -> dict[str, Any]:
    counts = stories.groupby(["design", "language", "model"]).size().rename("n").reset_index()
    return {
        "stage": "generate",
        "run_name": params.run_name,
        "params": params.resolved(),
        "base_seed": params.generation.seed,
        "seed_rule": "seed = (base_seed + int(story_id[:8], 16)) mod (2^31 - 1)",
        "n_planned": int(len(planned)),
        "n_stories": int(len(stories)),
        "finish_reasons": {k: int(v) for k, v in stories["finish_reason"].value_counts().items()},
        # failed requests stored as data, per model (a rerun asks for these again)
        "errors_per_model": {
            m: int(n) for m, n in stories[stories["finish_reason"].eq(ERROR)].groupby("model").size().items()
        },
        "stories_per_cell": counts.to_dict("records"),
        "models": [
            {
                "model": r.model,
                "model_id": r.model_id,
                "weights_sha256": r.weights_sha256,
                "n_generated_this_run": r.n_generated,
                "n_reused": r.n_reused,
                "startup_seconds": r.startup_seconds,
                "generation_seconds": r.generation_seconds,
                "output_tokens": r.output_tokens,
                "prompt_tokens": r.prompt_tokens,
                "tokens_per_second": r.tokens_per_second,
                "versions": r.versions,
                "endpoint": r.endpoint,
                "n_errors_this_run": r.n_errors,
                "errors": r.errors,
            }
            for r in runs
        ],
        "wall_seconds": round(seconds, 1),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def prepare_models(
    params: Params, stages: Sequence[str] = ("generate",), log: Callable[[str], None] = print
) -> list[str]:
    """Build the folder of each embedded model ``stages`` run (default: stage 01's generators; none for a
    profile that imports a corpus), a no-op once built (storybias.engines.prepare). Stage 04 prepares its
    judges itself, when it runs. Returns the embedded models' keys."""
    return prepare.prepare_models(params, stages, log=log)
