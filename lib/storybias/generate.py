"""Stage 01: plan the prompt grid of a run, generate every story, write stories.parquet.

Resumable: finished stories are written in atomic shards under data/<run>/work/generate/ as they
complete. After a crash or kill, a rerun keeps every story already written (from the shards, a
previous stories.parquet or the archive) whose every input is unchanged -- rendered prompt, seed,
model and sampling (``gen_config``) -- generates only the rest, and assembles exactly one row per
planned story. The manifest counts why each story was generated (``reuse``: reused, new,
"regenerated: prompt changed", "retried: error", ...).

A request that failed after the engine's retries (a served model: a 4xx, a content filter, a
timeout) is stored as a story with ``finish_reason`` "error" and the reason in ``error``; the stage
finishes, the manifest counts errors per model, stage 02 marks those stories invalid ("error"), and a
rerun asks again for exactly those (a stored error is never reused).

Nothing paid for is deleted: a story the profile no longer plans (a language dropped, fewer samples)
or an older version of a regenerated one is moved to data/<run>/archive/stories/, and comes back
without generation when the profile asks for it again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from . import artifacts, paths
from .designs import all_condition_columns
from .engines import ChatEngine, ChatRequest, ChatResult, entered_info, open_engine, preflight
from .io import ShardStore
from .locks import holds_run_lock
from .params import ModelSpec, Params, model_identity
from .prompts import (
    ALL_CONDITION_COLUMNS,
    design_cells,
    explicit_labels,
    render_prompt,
    request_seed,
    sample_cells,
    story_id,
)
from .runner import run_requests


def stories_schema() -> pa.Schema:
    """stories.parquet: the condition columns of every registered design (storybias.designs; the
    built-in designs' columns in their fixed order, then any other design's new ones)."""
    return pa.schema(
        [
            ("story_id", pa.string()),
            ("design", pa.string()),
            ("language", pa.string()),
            ("model", pa.string()),
            ("prompt_id", pa.string()),
            ("sample", pa.int64()),
            ("seed", pa.int64()),
            ("prompt", pa.string()),
            ("text", pa.string()),
            ("finish_reason", pa.string()),
            ("n_tokens", pa.int64()),
            *[(c, pa.string()) for c in all_condition_columns()],
            ("n_prompt_tokens", pa.int64()),
            ("gen_config", pa.string()),
            ("generated_at", pa.string()),
            ("error", pa.string()),  # why the request failed (finish_reason "error"); null otherwise
        ]
    )


def archive_schema() -> pa.Schema:
    return pa.schema([("version_key", pa.string()), *stories_schema()])


def plan_columns() -> list[str]:
    return [
        f.name
        for f in stories_schema()
        if f.name not in ("text", "finish_reason", "n_tokens", "n_prompt_tokens", "generated_at", "error")
    ]


# the built-in designs' schema (what stories_schema() is when no other design is registered)
STORIES_SCHEMA = pa.schema(
    [f for f in stories_schema() if not f.name.startswith("cond_") or f.name in ALL_CONDITION_COLUMNS]
)
ERROR = "error"  # finish_reason of a request that failed after retries


def gen_config_hash(model: ModelSpec, sampling: dict[str, Any], choice: list[str] | None) -> str:
    """Fingerprint of everything besides the prompt that shapes a story: a stored story is reused on
    a rerun only when its fingerprint is unchanged (a new temperature regenerates it)."""
    # exclude_defaults: a field added to the schema later (with its default) must not invalidate
    # every stored story. A served model's endpoint and id count; its key variable, concurrency,
    # rate limit, timeout and retries do not (params.model_identity).
    key = json.dumps({"model": model_identity(model), "sampling": sampling, "choice": choice}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def plan(params: Params) -> pd.DataFrame:
    """Every story the run asks for, one row each, with its prompt, seed and conditions."""
    rows = []
    base_seed = params.generation.seed
    condition_columns = all_condition_columns()
    for design, run in params.enabled_designs().items():
        cells = sample_cells(design_cells(design), run.n_prompts, base_seed, run.restrict or None)
        if run.tasks is not None:  # a design with a task condition (params checks it)
            cells = [c for c in cells if c.conditions["cond_task"] in run.tasks]
        sampling = params.sampling_for(design)
        for model in params.generation.models:
            if run.models is not None and model.name not in run.models:
                continue
            for language in run.languages:
                for cell in cells:
                    prompt = render_prompt(cell, language)
                    # the explicit task answers with one of its localised labels (Feng et al.)
                    choice = (
                        list(explicit_labels(language).values())
                        if cell.conditions.get("cond_task") == "explicit"
                        else None
                    )
                    task_sampling = sampling.model_dump()
                    if choice is not None:
                        task_sampling["max_tokens"] = min(task_sampling["max_tokens"], 16)
                    config = gen_config_hash(model, task_sampling, choice)
                    for sample in range(run.samples_per_prompt):
                        sid = story_id(design, language, model.name, cell.prompt_id, sample)
                        row: dict[str, Any] = {c: None for c in condition_columns}
                        row.update(cell.conditions)
                        row.update(
                            story_id=sid,
                            design=design,
                            language=language,
                            model=model.name,
                            prompt_id=cell.prompt_id,
                            sample=sample,
                            seed=request_seed(base_seed, sid),
                            prompt=prompt,
                            gen_config=config,
                            _sampling=task_sampling,
                            _choice=choice,
                        )
                        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame["story_id"].duplicated().any():  # would mean two cells share a prompt_id: a design bug
        raise RuntimeError("duplicate story_id in the plan")
    return frame


def _request(row: dict[str, Any]) -> ChatRequest:
    from .params import Sampling

    return ChatRequest(
        key=row["story_id"],
        messages=[{"role": "user", "content": row["prompt"]}],
        sampling=Sampling(**row["_sampling"]),
        seed=int(row["seed"]),
        choice=row["_choice"],
        ignore_eos=bool(row.get("_ignore_eos", False)),  # set by the benchmark only
    )


# What makes two stored stories the same story: a stored one is reused only if all of these match.
FINGERPRINT_COLUMNS = ["story_id", "gen_config", "prompt", "seed"]
_CHANGE_NAMES = {"gen_config": "model or sampling", "prompt": "prompt", "seed": "seed"}


def version_key(frame: pd.DataFrame) -> pd.Series:
    """One key per stored version of a story (its id plus a hash of everything that shaped it)."""
    if frame.empty:
        return pd.Series([], dtype=str, index=frame.index)
    digest = [
        hashlib.sha256(json.dumps([g, p, int(s)]).encode()).hexdigest()[:16]
        for g, p, s in zip(frame["gen_config"], frame["prompt"], frame["seed"])
    ]
    return frame["story_id"].astype(str) + "|" + pd.Series(digest, index=frame.index)


def archive_store(run_name: str) -> ShardStore:
    """Stories generated once but not planned now (or older versions): kept, never regenerated twice."""
    return ShardStore(paths.run_dir(run_name) / "archive" / "stories", key="version_key", schema=archive_schema())


def _stored_rows(run_name: str, store: ShardStore) -> pd.DataFrame:
    """Every stored version of every story: the shards of an unfinished run, a previous
    stories.parquet and the archive (in that order of preference), one row per version."""
    frames = [store.read_all().to_pandas()]
    final = paths.stories_path(run_name)
    if final.is_file():
        previous = pq.read_table(final)
        if "gen_config" in previous.column_names:
            from .io import _conform

            frames.append(_conform(previous, stories_schema()).to_pandas())
    archived = archive_store(run_name).read_all().to_pandas()
    frames.append(archived.assign(_archived=True).drop(columns="version_key"))
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=[*stories_schema().names, "_archived"])
    stored = pd.concat(frames, ignore_index=True)
    stored["_archived"] = stored.get("_archived", pd.Series(False, index=stored.index)).fillna(False).astype(bool)
    # a version that answered beats a stored error of the same story (stable: otherwise shards first)
    stored = stored.iloc[np.argsort(stored["finish_reason"].eq(ERROR).to_numpy(), kind="stable")]
    return stored.drop_duplicates(FINGERPRINT_COLUMNS, keep="first").reset_index(drop=True)


def reuse_reasons(planned: pd.DataFrame, stored: pd.DataFrame) -> pd.Series:
    """Why each planned story is (or is not) generated on this run, indexed like ``planned``:
    ``reused``, ``new`` (never generated), or ``regenerated: <what> changed`` naming every input that
    differs from the closest stored version (the one with the fewest differences)."""
    reasons = pd.Series("new", index=planned.index, dtype=object)
    if stored.empty:
        return reasons
    failed = stored["finish_reason"].eq(ERROR)
    retried = planned[FINGERPRINT_COLUMNS].merge(stored.loc[failed, FINGERPRINT_COLUMNS], how="left", indicator=True)
    retry = pd.Series(retried["_merge"].eq("both").to_numpy(), index=planned.index)
    stored = stored[~failed]  # a stored error is never reused
    by_id = {sid: group for sid, group in stored.groupby("story_id")}
    for i, row in zip(planned.index, planned[FINGERPRINT_COLUMNS].itertuples(index=False)):
        versions = by_id.get(row.story_id)
        if versions is None:
            continue
        best: list[str] | None = None
        for version in versions[FINGERPRINT_COLUMNS].itertuples(index=False):
            changed = [
                name for column, name in _CHANGE_NAMES.items() if getattr(version, column) != getattr(row, column)
            ]
            if best is None or len(changed) < len(best):
                best = changed
        reasons[i] = "reused" if not best else f"regenerated: {' and '.join(best)} changed"
    reasons[retry & reasons.ne("reused")] = "retried: error"
    return reasons


@dataclass
class ModelRun:
    model: str
    model_id: str = ""
    weights_sha256: str | None = None
    startup_seconds: float = 0.0
    generation_seconds: float = 0.0
    n_generated: int = 0
    n_reused: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    versions: dict[str, str] = field(default_factory=dict)
    endpoint: str | None = None  # a served model's base URL (never its key)
    n_errors: int = 0  # requests that failed after retries this run (stored as "error" stories)
    errors: list[str] = field(default_factory=list)  # the first few error texts

    @property
    def tokens_per_second(self) -> float:
        return round(self.output_tokens / self.generation_seconds, 2) if self.generation_seconds else 0.0


@dataclass
class GenerateResult:
    stories: pd.DataFrame
    runs: list[ModelRun]
    manifest: dict[str, Any]


def _null(value: Any) -> Any:
    """pandas stores a missing condition as NaN; Arrow's string columns want None."""
    return None if isinstance(value, float) and value != value else value


def _to_row(planned: dict[str, Any], result: ChatResult) -> dict[str, Any]:
    row = {k: _null(planned[k]) for k in plan_columns()}
    row.update(
        text=result.text,
        finish_reason=result.finish_reason,
        n_tokens=result.n_tokens,
        n_prompt_tokens=result.n_prompt_tokens,
        generated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        error=result.error,
    )
    return row


def generate_with(
    engine: ChatEngine,
    rows: list[dict[str, Any]],
    store: ShardStore,
    shard_size: int,
    record: ModelRun,
    progress: bool = True,
) -> None:
    """Generate ``rows`` (planned stories of one model) on a started engine, persisting every
    ``shard_size`` finished stories (storybias.runner). This is the whole per-story cost the pipeline
    adds to the engine (``make bench-generate`` times it against a bare ``LLM.chat``)."""
    by_key = {row["story_id"]: row for row in rows}
    stats = None
    try:
        stats = run_requests(
            engine,
            [_request(r) for r in by_key.values()],
            lambda r: _to_row(by_key[r.key], r),
            store,
            shard_size,
            desc=f"generate [{record.model}]",
            unit="story",
            progress=progress,
            on_result=lambda r: _count(record, r),
        )
    finally:
        if stats is not None:
            record.generation_seconds = round(record.generation_seconds + stats.seconds, 2)
            record.errors = (record.errors + stats.errors)[:5]


def _count(record: ModelRun, result: ChatResult) -> None:
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
) -> GenerateResult:
    """Generate every planned story not yet stored, then write stories.parquet and manifest_generate.json."""
    started = time.time()
    run_name = params.run_name
    planned = plan(params)
    store = ShardStore(paths.work_dir(run_name, "generate"), key="story_id", schema=stories_schema())
    stored = _stored_rows(run_name, store)
    reasons = reuse_reasons(planned, stored)
    reusable = stored[stored["finish_reason"].ne(ERROR)].merge(
        planned[FINGERPRINT_COLUMNS], on=FINGERPRINT_COLUMNS, how="inner"
    )
    todo = planned[reasons != "reused"]
    reuse_counts = {k: int(v) for k, v in reasons.value_counts().items()}
    log(
        f"run '{run_name}': {len(planned)} stories planned, {int((reasons == 'reused').sum())} already generated "
        f"({int(reusable['_archived'].sum())} of them from the archive), {len(todo)} to generate"
        + "".join(f"; {n} {why}" for why, n in reuse_counts.items() if why.startswith("regenerated"))
    )

    # Check every model before loading any: a paper-profile mistake fails in seconds, not after hours.
    for spec in params.generation.models:
        if (todo["model"] == spec.name).any():
            preflight(spec)

    factory = engine_factory or (
        lambda spec: open_engine(spec, params.generation.engine, params.generation.seed, run_name)
    )
    runs = []
    for spec in params.generation.models:
        model_todo = todo[todo["model"] == spec.name]
        record = ModelRun(model=spec.name, n_reused=int((reusable["model"] == spec.name).sum()))
        runs.append(record)
        if model_todo.empty:
            continue
        with factory(spec) as engine:
            info = entered_info(engine)
            record.model_id = info.model_id
            record.startup_seconds = info.startup_seconds
            record.versions = info.versions
            record.endpoint = info.endpoint
            generate_with(engine, model_todo.to_dict("records"), store, params.generation.shard_size, record, progress)
        if spec.source == "embedded":
            from .models import embedded_weights

            record.weights_sha256 = embedded_weights(spec.embedded).sha256

    stored = _stored_rows(run_name, store)
    stories = _assemble(planned, stored)
    archived = _archive_unplanned(run_name, stored, stories)
    manifest = _manifest(params, planned, stories, runs, time.time() - started)
    manifest.update(
        reuse=reuse_counts,
        n_restored_from_archive=int(reusable["_archived"].sum()),
        n_archived_this_run=archived,
        archive=str(archive_store(run_name).folder),
    )
    artifacts.write(run_name, "manifest_generate", manifest)
    artifacts.write(run_name, "stories", stories)  # last: Make's target
    store.clear()  # everything is in stories.parquet or the archive now
    n_errors = int(stories["finish_reason"].eq(ERROR).sum())
    log(
        f"wrote {paths.stories_path(run_name)} ({len(stories)} stories"
        + (f"; {n_errors} failed requests stored as errors: a rerun asks for them again)" if n_errors else ")")
    )
    return GenerateResult(stories=stories, runs=runs, manifest=manifest)


def _archive_unplanned(run_name: str, stored: pd.DataFrame, stories: pd.DataFrame) -> int:
    """Move every stored version that stories.parquet does not hold into the archive; returns how
    many versions were added to it (versions already archived are not written twice)."""
    archive = archive_store(run_name)
    if stored.empty:
        return 0
    keys = version_key(stored)
    kept = set(version_key(stories))
    already = archive.done_keys()
    extra = stored[~keys.isin(kept) & ~keys.isin(already) & stored["finish_reason"].ne(ERROR)]  # errors cost nothing
    if extra.empty:
        return 0
    rows = extra[stories_schema().names].assign(version_key=version_key(extra))
    rows = rows.astype(object).where(rows.notna(), None)
    archive.append(rows[archive_schema().names].to_dict("records"))
    return int(len(extra))


def _assemble(planned: pd.DataFrame, stored: pd.DataFrame) -> pd.DataFrame:
    """Exactly one row per planned story, in plan order; fails loudly if any is missing."""
    keep = stored.merge(planned[FINGERPRINT_COLUMNS], on=FINGERPRINT_COLUMNS, how="inner")
    keep = keep.drop_duplicates("story_id", keep="first").set_index("story_id")
    missing = planned.loc[~planned["story_id"].isin(keep.index), "story_id"]
    if len(missing):
        raise RuntimeError(f"{len(missing)} planned stories were not generated (e.g. {missing.iloc[0]})")
    ordered = keep.loc[planned["story_id"]].reset_index()
    return ordered[stories_schema().names]


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


def prepare_models(params: Params, log: Callable[[str], None] = print) -> None:
    """Build the folder of each embedded model the run uses (a no-op once cached)."""
    from .models import prepare_embedded

    specs = [*params.generation.models, *params.extract.models, *params.associations.judge.models]
    for key in sorted({m.embedded for m in specs if m.source == "embedded"}):
        prepare_embedded(key, log=log)
