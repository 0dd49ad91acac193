"""Stage 03's run: every valid story's answer from each extractor, through the run's one cache.

What an answer is (schema, prompt, parsing, consensus, gold scoring) is ``storybias.stages.extract.answers``; the
second step of the two-step design is ``storybias.stages.extract.facts``. This module plans the answers a
run needs, asks them through ``storybias.engines.cache.CachingEngine`` (an answer whose request, model and
output-shaping engine settings are unchanged is read from data/<run>/cache/, never asked twice),
retries answers that do not parse (bounded, each attempt its own request), asks step 2 of
``two_step`` for the step-1 answers that quoted facts, scores the gold sample, and writes the tables.

Every attempt is kept in ``extraction_raw.parquet`` with its raw text, so an answer that does not
parse is counted and shown, never dropped. A request that failed after the engine's retries is not
cached (a rerun asks again) and is counted in the manifest.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from storybias.config.designs import demo_columns, extraction_defaults
from storybias.config.params import ExtractionSettings, ModelSpec, Params, ParamsError
from storybias.core import artifacts, machine
from storybias.core.io import read_parquet_checked
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
)
from storybias.engines.cache import CachingEngine, ResponseCache
from storybias.engines.runner import RunStats, raise_if_failed, run_requests
from storybias.stages.extract import extraction_precision, released_profiles
from storybias.stages.extract import facts as extract_facts
from storybias.stages.extract.answers import (
    GOLD_SECTIONS,
    RAW_SCHEMA,
    ExtractionJob,
    agreement_table,
    assemble,
    choose_gold_items,
    design_sections,
    extraction_request,
    final_answers,
    fit_story,
    gold_table,
    gold_truth,
    parse_answer,
    parse_failure_table,
    refused,
    sample_ids,
    score_gold,
    to_record,
)
from storybias.stages.extract.consensus import REFUSAL_CHECK
from storybias.stages.extract.parse import with_defaults
from storybias.summaries import valid_stories as select

PROMPT_ROOM = 1200  # tokens of the context kept for the instructions and worked examples
ANSWER_SHARD = 8  # answers buffered per cache shard (stage 03's answers are short)

# the columns this stage cannot work without: a file without one is named with the column
FILTERED_KEY_COLUMNS = ("story_id", "design", "language", "model", "text")


def plan_jobs(stories: pd.DataFrame, settings: ExtractionSettings) -> list[ExtractionJob]:
    """Every (story, extractor, pass) answer the stage needs. Explicit-task answers need none, nor do the
    refusals of a design in ``extract.refusals_unknown`` (every field unknown, as StereoTales' reference)."""
    llm_stories = stories[(stories["cond_task"].fillna("") != "explicit") & ~refused(stories, settings)]
    check_ids: set[str] = set()
    if len(settings.models) == 1 and settings.self_consistency_sample != 0:
        check_ids = set(sample_ids(llm_stories["story_id"].tolist(), settings.self_consistency_sample, settings.seed))
    jobs = []
    for row in llm_stories.itertuples(index=False):
        sections = design_sections(settings, row.design)
        for spec in settings.models:
            for pass_name in ("primary", "check") if row.story_id in check_ids else ("primary",):
                jobs.append(ExtractionJob(row.story_id, spec.name, pass_name, sections, row.text, row.language))
    return jobs


def attempt_request(job: ExtractionJob, story: str, settings: ExtractionSettings, attempt: int) -> ChatRequest:
    """The request of one attempt: temperature 0 for a primary answer's first attempt, else the
    self-consistency temperature; the seed moves with the attempt and the pass."""
    temperature = 0.0 if job.pass_name == "primary" and attempt == 0 else settings.self_consistency_temperature
    seed = settings.seed + attempt + (1000 if job.pass_name == "check" else 0)
    return extraction_request(f"{job.answer_key}|{attempt}", story, job.sections, settings, temperature, seed)


def fitted_stories(
    engine: CachingEngine, jobs: Sequence[ExtractionJob], settings: ExtractionSettings
) -> dict[str, tuple[str, bool]]:
    """Each job's story cut to the extractor's context budget, and whether it was cut."""
    budget = engine.spec.max_model_len - settings.max_tokens - PROMPT_ROOM
    tokenizer = engine.tokenizer() if jobs else None
    return {job.answer_key: fit_story(job.text, tokenizer, budget) for job in jobs}


def _answer_row(job: ExtractionJob, attempt: int, result: ChatResult, cut: bool, key: str) -> dict[str, Any]:
    parsed = parse_answer(result.text, job.sections)
    return {
        "answer_key": f"{job.answer_key}|{attempt}",
        "request_key": job.answer_key,
        "story_id": job.story_id,
        "extractor": job.extractor,
        "pass": job.pass_name,
        "attempt": attempt,
        "raw": result.text,
        "parse_ok": parsed.ok,
        "error": parsed.error,
        "n_tokens": result.n_tokens,
        "finish_reason": result.finish_reason,
        "story_cut": cut,
        "cache_key": key,
    }


def answer_attempt(
    engine: CachingEngine,
    pending: Sequence[ExtractionJob],
    fitted: dict[str, tuple[str, bool]],
    settings: ExtractionSettings,
    attempt: int,
    progress: bool,
) -> tuple[list[dict[str, Any]], RunStats]:
    """One attempt's rows for ``pending`` (a failed request gives no row: a rerun asks again)."""
    by_key = {f"{job.answer_key}|{attempt}": job for job in pending}
    requests = [attempt_request(job, fitted[job.answer_key][0], settings, attempt) for job in pending]
    keys = {r.key: engine.key_of(r) for r in requests}
    rows: list[dict[str, Any]] = []

    def keep(result: ChatResult) -> None:
        if result.error is None:
            job = by_key[result.key]
            rows.append(_answer_row(job, attempt, result, fitted[job.answer_key][1], keys[result.key]))

    desc = f"extract [{engine.spec.name}] attempt {attempt}"
    return rows, run_requests(engine, requests, keep, None, 1, desc, unit="answer", progress=progress)


def answer_jobs(
    engine: CachingEngine, jobs: Sequence[ExtractionJob], settings: ExtractionSettings, progress: bool
) -> tuple[list[dict[str, Any]], RunStats]:
    """Every attempt's row for ``jobs`` (one extractor): an answer that does not parse is asked again,
    up to ``extract.retries`` times, each attempt its own request (another temperature and seed)."""
    fitted = fitted_stories(engine, jobs, settings)
    by_answer = {job.answer_key: job for job in jobs}
    rows: list[dict[str, Any]] = []
    total = RunStats()
    pending = list(jobs)
    for attempt in range(settings.retries + 1):
        if not pending:
            break
        mine, stats = answer_attempt(engine, pending, fitted, settings, attempt, progress)
        rows += mine
        total.add(stats)
        pending = [by_answer[r["request_key"]] for r in mine if not r["parse_ok"]]
    return rows, total


def map_answers(
    engine: CachingEngine,
    answers: list[dict[str, Any]],
    settings: ExtractionSettings,
    sections_of: dict[str, tuple[str, ...]],
    progress: bool,
) -> tuple[list[dict[str, Any]], RunStats]:
    """two_step: step 2 for the final step-1 ``answers`` that quoted facts (one attempt: a step-2
    answer that does not parse leaves step 1's fields as they were, and is kept and counted)."""
    final = final_answers(pd.DataFrame(answers, columns=RAW_SCHEMA.names))
    jobs = {job["request_key"]: job for job in extract_facts.map_jobs(final, engine.spec, settings, sections_of)}
    requests = extract_facts.map_requests(list(jobs.values()), settings, settings.seed)
    keys = {r.key: engine.key_of(r) for r in requests}
    rows: list[dict[str, Any]] = []

    def keep(result: ChatResult) -> None:
        if result.error is not None:
            return
        job = jobs[result.key]
        ok = extract_facts.parse_map(result.text, settings) is not None
        rows.append(
            {
                "answer_key": f"{result.key}|0",
                "request_key": result.key,
                "story_id": job["story_id"],
                "extractor": engine.spec.name,
                "pass": job["pass"],
                "attempt": 0,
                "raw": result.text,
                "parse_ok": ok,
                "error": None if ok else "step 2 answer does not parse",
                "n_tokens": result.n_tokens,
                "finish_reason": result.finish_reason,
                "story_cut": False,
                "cache_key": keys[result.key],
            }
        )

    desc = f"extract [{engine.spec.name}] facts -> fields"
    return rows, run_requests(engine, requests, keep, None, 1, desc, unit="answer", progress=progress)


def evaluate_gold(engine: ChatEngine, items: list[dict[str, Any]], settings: ExtractionSettings) -> dict[str, Any]:
    """Extract the gold stories (same prompt, schema, temperature and design as the stage) and score
    the answers against the true labels."""
    started = time.time()
    requests = [extraction_request(it["id"], it["text"], GOLD_SECTIONS, settings, 0.0, settings.seed) for it in items]
    texts = {r.key: r.text for r in engine.stream(requests)}  # a failed request has text "": it does not parse
    if settings.prompt_design == "two_step":
        texts = extract_facts.merge_in_memory(engine, texts, GOLD_SECTIONS, settings)
    seconds = time.time() - started
    defaults = extraction_defaults() if settings.design_rules else {}
    predictions, parsed_ok = [], 0
    for it in items:
        parsed = parse_answer(texts[it["id"]], GOLD_SECTIONS)
        parsed_ok += parsed.ok
        record = to_record(parsed.data if parsed.ok else None, GOLD_SECTIONS)
        predictions.append(with_defaults(record, defaults) if parsed.ok else record)
    return {
        "scores": score_gold([gold_truth(it, defaults) for it in items], predictions),
        "targets": gold_table(items, predictions, defaults),
        "prompt_design": settings.prompt_design,
        "design_rules": settings.design_rules,
        "n_items": len(items),
        "languages": sorted({it["language"] for it in items}),
        "n_parsed": int(parsed_ok),
        "seconds": round(seconds, 1),
        "stories_per_second": round(len(items) / seconds, 3) if seconds else None,
        "extractor": entered_info(engine).model,
        "predictions": pd.DataFrame(
            [{"id": it["id"], "language": it["language"], **pred} for it, pred in zip(items, predictions)]
        ),
    }


def _timings(engine: CachingEngine, stats: RunStats, n_answers: int, n_step2: int, seconds: float) -> dict[str, Any]:
    info = entered_info(engine)
    return {
        "model_loaded": engine.model_loaded,  # false: every answer came from the cache
        "startup_seconds": info.startup_seconds,
        "extraction_seconds": round(seconds, 1),
        "n_answers": n_answers,
        "n_step2_answers": n_step2,  # two_step: facts mapped to fields, in the same seconds
        "n_from_cache": stats.n_cached,
        "stories_per_second": round(n_answers / max(seconds, 1e-9), 3) if n_answers else None,
        "endpoint": info.endpoint,
        "model_id": info.model_id,
        "output_tokens": stats.output_tokens,
        "prompt_tokens": stats.prompt_tokens,
        "finish_reasons": dict(stats.finish_reasons),
        # failed requests (after retries): not cached, asked again by a rerun
        "n_request_errors": stats.n_errors,
        "request_errors": stats.errors,
        "reuse": dict(engine.stats.reasons),
    }


def _write_gold(run_name: str, gold: dict[str, Any]) -> None:
    artifacts.write(run_name, "gold_predictions", gold["predictions"])
    artifacts.write(run_name, "gold_targets", gold["targets"])
    artifacts.write(run_name, "gold_scores", gold["scores"])
    artifacts.write(
        run_name, "gold_summary", {k: v for k, v in gold.items() if k not in ("scores", "predictions", "targets")}
    )


def extract_with(
    engine: CachingEngine,
    jobs: list[ExtractionJob],
    settings: ExtractionSettings,
    sections_of: dict[str, tuple[str, ...]],
    progress: bool,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One extractor's rows (every attempt, and step 2 under two_step) and its timings."""
    started = time.time()
    rows, stats = answer_jobs(engine, jobs, settings, progress)
    step2: list[dict[str, Any]] = []
    if settings.prompt_design == "two_step":
        step2, map_stats = map_answers(engine, rows, settings, sections_of, progress)
        stats.add(map_stats)
    return rows + step2, _timings(engine, stats, len(jobs), len(step2), time.time() - started)


def _manifest(
    params: Params,
    extractions: pd.DataFrame,
    raw: pd.DataFrame,
    resolved: pd.DataFrame,
    timings: dict[str, Any],
    agreement_how: str,
) -> dict[str, Any]:
    reuse: Counter = Counter()
    for t in timings.values():
        reuse.update(t["reuse"])
    return {
        "stage": "extract",
        "params": params.resolved()["extract"],
        "engine": params.resolved()["generation"]["engine"],
        "timings": timings,
        "agreement": agreement_how,
        "n_stories": len(extractions),
        "reuse": dict(reuse),
        "n_parse_failed": int((~extractions["parse_ok"]).sum()),
        # refusals under StereoTales' rule (extract.refusals_unknown): every field unknown, no extractor asked
        "n_refusals_unknown": int(sum(REFUSAL_CHECK in list(e) for e in extractions["extractors"])),
        "n_request_errors": {name: t["n_request_errors"] for name, t in timings.items()},
        "two_step": extract_facts.summary(final_answers(raw), resolved)
        if params.extract.prompt_design == "two_step"
        else None,
    }


def unknown_shares(extractions: pd.DataFrame) -> pd.DataFrame:
    """Per demographic column, the share of "unknown" among the answers an extractor gave (parsed, not only
    mapped from prompt labels by ``label-map``), smallest first (column ``share_unknown``)."""
    asked = extractions["extractors"].map(lambda names: list(names) != ["label-map"])
    answered = extractions[extractions["parse_ok"].astype(bool) & asked.astype(bool)][demo_columns()]
    return (answered == "unknown").mean().sort_values().rename("share_unknown").to_frame()


def gender_by_language(extractions: pd.DataFrame, stories: pd.DataFrame) -> pd.DataFrame:
    """Extracted protagonist genders per design x language: story counts, genders as columns."""
    merged = extractions.merge(stories[["story_id", "design", "language", "model"]], on="story_id")
    return merged.pivot_table(
        index=["design", "language"], columns="protagonist_gender", values="story_id", aggfunc="count", fill_value=0
    )


def extract_result(
    run_name: str, manifest: dict[str, Any], tables: dict[str, pd.DataFrame], details: dict[str, Any]
) -> StageResult:
    """Stage 03's result, with the values notebook 03 records: counts, the agreement's method and, when the
    gold set ran, the primary extractor's gender accuracy against its majority baseline; its tables add the
    share of unknown answers (``unknown_share``) and the genders per design x language (``gender_by_language``);
    its details hold ``human_validation`` (the extractor against ``extract.human_validation``'s human labels
    and against the published ones, two tables, or None without the file)."""
    extractions, gold = tables["extractions"], details["gold"]
    tables = {
        **tables,
        "unknown_share": unknown_shares(extractions),
        "gender_by_language": gender_by_language(extractions, tables["stories"]),
    }
    values: dict[str, Any] = {
        "n_extracted": int(len(extractions)),
        "n_parse_failed": int((~extractions["parse_ok"].astype(bool)).sum()),
        "n_story_cut": int(extractions["story_cut"].astype(bool).sum()) if "story_cut" in extractions else 0,
        "agreement": details["agreement_how"],
    }
    if gold is not None:
        scores = gold["scores"].set_index("field")
        values["gold_gender_accuracy"] = float(scores.loc["protagonist_gender", "accuracy"])
        values["gold_gender_majority_baseline"] = float(scores.loc["protagonist_gender", "majority_baseline"])
    return StageResult("extract", run_name, tables=tables, manifest=manifest, values=values, details=details)


def _extractors_with_work(
    engines: dict[str, CachingEngine], jobs: list[Any], settings: ExtractionSettings
) -> list[ModelSpec]:
    """The extractors with answers to ask for, each checked (its preflight, a served endpoint's context)
    before any engine loads: a refusal comes here, not per request."""
    with_work = []
    for spec in settings.models:
        mine = [j for j in jobs if j.extractor == spec.name]
        fitted = fitted_stories(engines[spec.name], mine, settings)
        first = [attempt_request(j, fitted[j.answer_key][0], settings, 0) for j in mine]
        missing = engines[spec.name].lookup(first).misses
        if missing:
            preflight(spec)
            check_endpoint_fits(spec, missing)
            with_work.append(spec)
    return with_work


@holds_run_lock("extract")
def run(
    params: Params,
    progress: bool = True,
    engine_factory: Callable[[ModelSpec], ChatEngine] | None = None,
    log: Callable[[str], None] = print,
) -> StageResult:
    """Stage 03: extract every valid story (resumable through the cache), write extractions.parquet
    and its tables."""
    run_name, settings = params.run_name, params.extract
    source = artifacts.filtered_path(run_name)
    if not source.is_file():
        raise FileNotFoundError(f"{source} is missing: run stage 02 first (make filter)")
    if params.corpus is not None and params.corpus.extractions == "published":
        # no model reads the texts: an imported corpus' stories are loaded without them
        columns = [c for c in pq.read_schema(source).names if c not in ("text", "prompt")]
        return run_published(params, select(pd.read_parquet(source, columns=columns)), log)
    human = extraction_precision.from_settings(settings.human_validation)  # a bad file stops before any model
    # each design's study rule (filter.exclude, stage 02)
    stories = select(read_parquet_checked(source, required=FILTERED_KEY_COLUMNS))
    jobs = plan_jobs(stories, settings)
    sections_of = {j.story_id: j.sections for j in jobs}
    factory = engine_factory or (lambda spec: open_stage_engine(params, spec, settings.seed))
    cache = ResponseCache.for_run(run_name, ANSWER_SHARD)
    engines = {
        spec.name: CachingEngine(partial(factory, spec), spec, params.generation.engine, cache)
        for spec in settings.models
    }
    gold_items = choose_gold_items(settings.gold_sample, settings.seed) if settings.gold_sample != 0 else []
    log(f"run '{run_name}': {len(stories)} valid stories, {len(jobs)} extraction answers needed")
    unfit = extract_facts.llama_cpp_map_problems(params) if jobs else []  # before step 1's work, not after
    if unfit:
        raise ParamsError(f"{params.source}: " + "; ".join(unfit) + ". Nothing was sent.")
    with_work = _extractors_with_work(engines, jobs, settings)
    # what the timings were measured on (storybias.core.machine), before any engine takes the cores
    ran_on = machine.record_for([spec.source for spec in with_work], probe=engine_factory is None)
    rows: list[dict[str, Any]] = []
    timings: dict[str, Any] = {}
    gold = None
    for i, spec in enumerate(settings.models):
        with engines[spec.name] as engine:
            answered, timings[spec.name] = extract_with(
                engine, [j for j in jobs if j.extractor == spec.name], settings, sections_of, progress
            )
            rows += answered
            if gold_items and i == 0:  # the gold set measures the first (primary) extractor
                gold = evaluate_gold(engine, gold_items, settings)
                _write_gold(run_name, gold)
    raw = pd.DataFrame(rows, columns=RAW_SCHEMA.names)
    resolved = extract_facts.resolve(final_answers(raw), settings)  # two_step: step 1 merged with step 2
    extractions = assemble(stories, resolved, settings)
    agree, agreement_how = agreement_table(stories, resolved, settings)
    artifacts.write(run_name, "extraction_raw", raw)
    artifacts.write(run_name, "extraction_agreement", agree)
    manifest = _manifest(params, extractions, raw, resolved, timings, agreement_how)
    manifest["machine"] = ran_on
    artifacts.write(run_name, "manifest_extract", manifest)
    raise_if_failed(  # every request failed (or more than the profile's share): stop before Make's target
        "extract",
        sum(sum(t["finish_reasons"].values()) - t["n_from_cache"] for t in timings.values()),
        sum(t["n_request_errors"] for t in timings.values()),
        [e for t in timings.values() for e in t["request_errors"]],
        params.generation.engine.max_failed_share,
    )
    compared, extractions, published_agreement = _published_side(params, stories, extractions, log)
    artifacts.write(run_name, "extractions", extractions)  # last: Make's target
    tables = {
        "stories": stories,
        "extractions": extractions,
        "raw": raw,
        "agreement": agree,
        "failures": parse_failure_table(stories, extractions),
        **({} if published_agreement is None else {"published_agreement": published_agreement}),
    }
    details: dict[str, Any] = {"agreement_how": agreement_how, "timings": timings, "gold": gold, "published": compared}
    details["human_validation"] = human
    return extract_result(run_name, manifest, tables, details)


def _corpus_table(run_name: str) -> pd.DataFrame:
    source = artifacts.path(run_name, "corpus")
    if not source.is_file():
        raise FileNotFoundError(f"{source} is missing: stage 01 writes it on a profile with corpus: (make generate)")
    return pd.read_parquet(source, columns=["story_id", "published_extraction"])


def run_published(params: Params, stories: pd.DataFrame, log: Callable[[str], None] = print) -> StageResult:
    """Stage 03 with ``corpus.extractions: published``: the release's extractions mapped, no model asked."""
    run_name = params.run_name
    human = extraction_precision.from_settings(params.extract.human_validation)  # a bad file stops first
    started = time.time()
    extractions, counts = released_profiles.published_extractions(stories, _corpus_table(run_name))
    log(
        f"run '{run_name}': {counts['n_stories']} published extractions mapped; {counts['n_parse_failed']} "
        f"empty or unparsable kept with parse_ok false ({counts['profiles']})"
    )
    artifacts.write(run_name, "extraction_raw", pd.DataFrame(columns=RAW_SCHEMA.names))
    artifacts.write(run_name, "extraction_agreement", pd.DataFrame())
    manifest = {
        "stage": "extract",
        "mode": "published",
        "params": params.resolved()["extract"],
        "corpus": params.resolved()["corpus"],
        **counts,
        "seconds": round(time.time() - started, 1),
        "machine": None,  # no model ran (storybias.core.machine)
    }
    artifacts.write(run_name, "manifest_extract", manifest)
    artifacts.write(run_name, "extractions", extractions)  # last: Make's target
    tables = {
        "stories": stories,
        "extractions": extractions,
        "raw": pd.DataFrame(columns=RAW_SCHEMA.names),
        "agreement": pd.DataFrame(),
        "failures": parse_failure_table(stories, extractions),
    }
    how = "published extractions: the release's three-extractor consensus, one answer per story"
    details = {"agreement_how": how, "timings": {}, "gold": None, "published": counts, "human_validation": human}
    return extract_result(run_name, manifest, tables, details)


def _published_side(
    params: Params, stories: pd.DataFrame, extractions: pd.DataFrame, log: Callable[[str], None]
) -> tuple[dict[str, Any] | None, pd.DataFrame, pd.DataFrame | None]:
    """An imported corpus extracted again: with ``corpus.extractions: both``, storybias' extractions
    against the published ones (published_agreement.parquet; the counts and the table are returned); with
    ``corpus.demographics: published``, the release's demographic profile in place of storybias'."""
    corpus = params.corpus
    if corpus is None or corpus.extractions == "published":
        return None, extractions, None
    if corpus.extractions == "rerun" and corpus.demographics != "published":
        return None, extractions, None
    theirs, counts = released_profiles.published_extractions(stories, _corpus_table(params.run_name))
    compared, table = None, None
    if corpus.extractions == "both":
        table = released_profiles.agreement_with_published(extractions, theirs, stories)
        artifacts.write(params.run_name, "published_agreement", table)
        compared = {"n_stories": int(len(stories)), **counts}
        log(f"storybias against the published extractions: {compared['n_stories']} stories compared")
    if corpus.demographics == "published":
        extractions = released_profiles.with_published_demographics(extractions, theirs)
        unparsed = int((~extractions["parse_ok"]).sum())
        log(f"the release's demographic profile in place of storybias': {unparsed} stories not parsed by one side")
    return compared, extractions, table
