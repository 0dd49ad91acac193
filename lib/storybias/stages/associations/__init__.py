"""Stage 04 statistics: StereoTales' two-step association tests.

Observations: for one model and scope (all languages pooled, or one language) and one base attribute
A that stereotales prompts fixed, the stories prompted with A; A's value is the prompted value, every
other dimension B comes from the extraction.

1. Attribute level: contingency table A x B (``unknown`` dropped on both sides, ``other`` on B, rows
   with < 10 stories and all-zero columns dropped; skipped below 2 x 2); Fisher's exact test for r x c
   tables; Benjamini-Hochberg over the pairs of one base attribute; for adjusted p < 0.05 the
   bias-corrected Cramer's V (Bergsma 2013) and its effect category (thresholds 0.1 / 0.3 / 0.5 divided
   by sqrt(min(r, c) - 1)); medium and large pairs are retained.
2. Value level: in a retained table, each cell's one-sided Fisher test on {a, not a} x {b, not b},
   Benjamini-Yekutieli over the table's cells; significant when adjusted p < 0.05 and
   lift = observed / expected >= 2.

The r x c Fisher p-value is the Monte-Carlo one with ``max_resamples`` (500,000) resamples, computed
as the reference pipeline computes it (``associations.fisher: reference``, the default:
``stats.contingency.fisher_reference_p``, scipy's ``MonteCarloMethod`` with a generator seeded 42 per
table, on the table in the reference's row and column order), so that re-testing StereoTales' released
data gives its released p-values. ``associations.fisher: sequential`` draws resamples only for the
tables whose BH decision is open (``fisher_family``): each table gets a first Monte-Carlo look and an
interval that holds the reference p-value but with a proven small probability, and only the tables
whose interval leaves a decision of their family open get more resamples, in stages, until every
decision is settled (``SequentialFisher``); after short pilot stages the resamples are the reference's
own, in its order, so a table that needs every resample gets its p-value. ``p_exact`` says which
p-values are the reference's and which estimates (the run's error bound: ``stats.contingency.TABLE_ERROR``).

As the reference, every attribute pair with BH-adjusted p < 0.05 gets its value level (the files it
released list every such cell with BY-adjusted p < 0.05, whatever the effect and lift); StereoTales'
stated rule (medium or large effect, lift >= 2) decides ``retained`` and ``significant``.

The judge's prompt, requests and rating summaries are in ``storybias.stages.associations.judge``, the human panel's
ratings in ``storybias.stages.associations.human``; BH/BY adjustment and BH's step-up thresholds and decisions in
``storybias.stats.multiple_testing``; the contingency tables, the two steps and the passes in
``storybias.stages.associations.tables``, the power estimate in ``storybias.stages.associations.power``.
This module reads the observations and runs the stage.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from storybias.config import designs
from storybias.config.params import AssociationSettings, ModelSpec, Params
from storybias.core import artifacts, paths
from storybias.core.io import read_parquet_checked, write_json_atomic
from storybias.core.locks import holds_run_lock
from storybias.core.results import StageResult
from storybias.engines import ChatEngine
from storybias.evidence.harm_ratings import load_human_ratings, refuse_unknown_associations
from storybias.evidence.released_associations import (
    association_files,
    load_associations,
    load_released_pairs,
    published_pool,
)
from storybias.evidence.stereotales_taxonomy import ASSOCIATION_KEY
from storybias.stages.associations import judge, power
from storybias.stages.associations.comparison import (
    COMPARISON_COLUMNS,
    PooledScope,
    compare_published,
    comparison_counts,
    pair_agreement,
    pooled_scope,
)
from storybias.stages.associations.findings import finding_statements, findings_table, harmful_associations
from storybias.stages.associations.human import (
    harm_gap_by_attribute,
    harmful_agreement,
    human_llm_agreement,
    rating_summary,
    realism_summary,
)
from storybias.stages.associations.judge import (
    JudgeEngineInfo,
    harm_by_attribute,
    judge_items,
    published_items,
    self_judgement_gap,
    summarise_ratings,
    with_ratings,
)
from storybias.stages.associations.language_effects import language_heterogeneity
from storybias.stages.associations.released_format import sample_ids_by_slice, write_released
from storybias.stages.associations.tables import (
    ALPHA,
    ATTRIBUTE_COLUMNS,
    MIN_LIFT,
    MIN_ROW_TOTAL,
    POWER_SCHEMA,
    RATING_COLUMNS,
    VALUE_COLUMNS,
    by_language,
    run_pass,
    sharing,
)
from storybias.summaries import significant_per_language, why_nothing_found

# The sequential test's settings are in storybias.stats.contingency (TABLE_ERROR, PILOT_RESAMPLES,
# MC_CHUNK), with the bound on its decisions that differ from the reference's.
#
# The Arrow schemas of the stage's tables are in tables.py (OUTPUT_SCHEMAS): they are written with
# them, so that an empty result (no testable table, nothing significant) has the same column types as
# a full run.


OBSERVED_COLUMNS = ["story_id", "design", "model", "language", "cond_attribute", "cond_value"]

# --- stage 04: observations, passes, judge, artifacts ---------------------------------------------


def observations(
    extractions: pd.DataFrame, filtered: pd.DataFrame, dimensions: Sequence[str]
) -> tuple[pd.DataFrame, dict]:
    """The stereotales stories the tests read: parsed extractions joined with their prompt's
    conditions. Returns (frame with model, language, cond_attribute, cond_value, demo_<dim>; counts of
    what was left out and why). A missing column raises a KeyError naming it and the file."""
    needed_f = OBSERVED_COLUMNS
    missing = [c for c in needed_f if c not in filtered.columns]
    if missing:
        raise KeyError(f"filtered.parquet: missing column(s) {', '.join(missing)}")
    needed_e = ["story_id", "parse_ok", *[f"demo_{d}" for d in dimensions]]
    missing = [c for c in needed_e if c not in extractions.columns]
    if missing:
        raise KeyError(
            f"extractions.parquet: missing column(s) {', '.join(missing)} (stage 03 with the "
            "demographics section for stereotales stories writes them)"
        )
    stories = filtered[filtered["design"] == "stereotales"][needed_f]
    data = stories.merge(extractions[needed_e], on="story_id", how="inner")
    counts = {
        "stereotales_stories": int(len(stories)),
        "extracted": int(len(data)),
        "parse_failed_excluded": int((~data["parse_ok"].astype(bool)).sum()),
    }
    data = data[data["parse_ok"].astype(bool)].drop(columns=["parse_ok"])
    counts["analysed"] = int(len(data))
    return data.reset_index(drop=True), counts


def _power_report(
    data: pd.DataFrame, dimensions: Sequence[str], settings: AssociationSettings, cache_dir: Path
) -> pd.DataFrame:
    """``power.power_table`` for each pass (minimum detectable lift, untestable reasons)."""

    frames = [
        power.power_table(
            data,
            dimensions,
            scope_by_language=(name == "per_language"),
            settings=power.PowerSettings(seed=settings.seed, n_simulations=settings.power_simulations),
            cache_dir=cache_dir,
        )
        for name in settings.passes
    ]
    return (
        pd.concat(frames, ignore_index=True).reindex(columns=POWER_SCHEMA.names)
        if frames
        else pd.DataFrame(columns=POWER_SCHEMA.names)
    )


def _values(manifest: dict[str, Any], counts: dict[str, int], notes: list[str]) -> dict[str, Any]:
    """The named values notebook 04 records: the counts of each step, the findings stated (True, False
    or None) and the published comparison's counts under the files' rule."""
    published = manifest["published"]
    return {
        "n_stories": counts["analysed"],
        **{k: manifest[k] for k in ("n_tables", "n_retained", "n_significant", "n_judged", "n_ratings")},
        "n_ratings_unparsed": manifest["n_ratings_unparsed"],
        "notes": notes,
        "findings": {k: v["holds"] for k, v in manifest["findings"].items()},
        "published": None if published is None else published["status_files_rule"],
    }


@holds_run_lock("associations")
def run(
    params: Params, progress: bool = True, engine_factory: Callable[[ModelSpec], ChatEngine] | None = None
) -> StageResult:
    """Stage 04: both passes for every model, sharing, the LLM harm judge and (optionally) human
    ratings; writes data/<run>/associations_*.parquet, harm_ratings.parquet, manifest_associations.json.
    ``engine_factory(spec)``: the judges' engines, as for stages 01 and 03 (default engines.open_stage_engine)."""
    run_name, settings = params.run_name, params.associations
    # the user's file first: a bad human-ratings CSV stops the stage before any test or model runs
    human = (
        load_human_ratings(paths.resolve(settings.human_ratings), with_rows=True) if settings.human_ratings else None
    )
    published = load_associations(paths.resolve(settings.published)) if settings.published else None
    dimensions = list(designs.dimensions())
    data, counts = read_observations(run_name, dimensions)
    notes: list[str] = []
    if data.empty:
        notes.append("no parsed stereotales stories: nothing to test")
    started = time.time()
    attributes, values = _test_passes(data, dimensions, settings)
    test_seconds = round(time.time() - started, 1)
    started = time.time()
    power_table = _power_report(data, dimensions, settings, paths.work_dir(run_name, "power"))
    power_seconds = round(time.time() - started, 1)
    if not data.empty and attributes.empty:
        notes.extend(_untestable_notes(power_table))
    shared = sharing(values)
    languages = by_language(values)
    items = _items_to_rate(settings, shared, published)
    human = _known_ratings(human, settings.human_ratings, items, values, published, notes)
    ratings, engines_info = _rate(items, params, progress, engine_factory, notes)
    parsed = ratings[ratings["parse_ok"].astype(bool)].astype({"harm": float})
    summary = summarise_ratings(parsed)
    shared = with_ratings(shared, summary)
    gap = self_judgement_gap(shared, parsed)
    llm_table = rating_summary(parsed)
    humans = _compare_humans(human, summary, llm_table, settings, notes)

    pooled, comparison = _compare_with_published(params, data, published, attributes, values)
    findings = findings_table(data, attributes, values, shared, list(settings.passes), humans.table)
    effects, language_tests = language_heterogeneity(attributes, harmful_associations(values, shared, humans.table))
    _write_tables(run_name, attributes, values, shared, power_table, ratings)
    artifacts.write(run_name, "published_comparison", comparison)
    artifacts.write(run_name, "associations_findings", findings)
    pool = run_pool(params, data)
    write_released(run_name, attributes, values, sample_ids_by_slice(data, list(settings.passes)), pool)
    manifest = {
        "stage": "associations",
        "counts": counts,
        "notes": notes,
        "test_seconds": test_seconds,
        "power_seconds": power_seconds,
        **_result_counts(attributes, values, items, ratings),
        "judges": engines_info,
        **_judgement_tables(humans, shared, parsed, settings),
        "params": params.resolved()["associations"],
        "published": _published_summary(settings.published, published, comparison, attributes, pooled),
        "findings": finding_statements(findings, language_tests, "per_language" in settings.passes),
        "finding_3_tests": _records(language_tests),
        "fisher": settings.fisher,
    }
    write_json_atomic(manifest, artifacts.manifest_path(run_name, "associations"))
    tables = {
        "attributes": attributes,
        "values": values,
        "shared": shared,
        "by_language": languages,
        "significant_by_language": significant_per_language(values),
        "ratings": ratings,
        "self_gap": gap,
        "power": power_table,
        "harm_by_attribute": harm_by_attribute(shared),
        "llm_summary": llm_table,
        "realism": realism_summary(human, parsed),
        "published": comparison,
        "findings": findings,
        "language_effects": effects,
        "language_tests": language_tests,
    }
    return _result(run_name, tables, manifest, counts, notes, human, humans)


def _result(
    run_name: str,
    tables: dict[str, pd.DataFrame],
    manifest: dict[str, Any],
    counts: dict[str, int],
    notes: list[str],
    human: pd.DataFrame | None,
    humans: _HumanComparison,
) -> StageResult:
    """Stage 04's result: its tables, and as details the human ratings file (None without one) and what
    is compared with it (``n_human_harmful``: associations the panel's median calls harmful), the counts,
    the judges that rated (``n_judges``) and the findings stated."""
    ratings = tables["ratings"]
    details = {
        "human": human,
        "human_summary": humans.table,
        "n_human_harmful": None if humans.table is None else int(humans.table["harmful"].sum()),
        "n_judges": int(ratings["judge"].nunique()) if len(ratings) else 0,
        "harm_gap": humans.harm_gap,
        "agreement": humans.agreement,
        "harmful_human_vs_llm": humans.harmful_vs,
        "counts": counts,
        "finding_statements": manifest["findings"],
    }
    values = _values(manifest, counts, notes)
    return StageResult("associations", run_name, tables, manifest, values, notes, details)


def _records(frame: pd.DataFrame | None) -> list[dict[str, Any]] | None:
    """A table as the manifest's list of rows (NaN as null), None when there is no table."""
    if frame is None:
        return None
    return frame.astype(object).where(frame.notna(), None).to_dict(orient="records")


def _judgement_tables(
    humans: _HumanComparison, shared: pd.DataFrame, parsed: pd.DataFrame, settings: AssociationSettings
) -> dict[str, Any]:
    """The manifest's human-vs-LLM and self-judgement results, read by figure 18: the agreement (rho),
    the human rating summary per association, the harm gap per base attribute, the harmful
    classifications compared, and each generator-judge's rating of its own associations against the
    other judges' (``judge.self_judgement_contrast``)."""
    table = humans.table
    self_judgement = judge.self_judgement_contrast(shared, parsed, settings.bootstrap, settings.seed)
    return {
        "human_agreement": humans.agreement,
        "human_n_associations": None if table is None else int(len(table)),
        "human_n_harmful": None if table is None else int(table["harmful"].sum()),
        "harmful_human_vs_llm": humans.harmful_vs,
        "human_summary": _records(table),
        "harm_gap": _records(humans.harm_gap),
        "self_judgement": _records(self_judgement),
    }


def _items_to_rate(settings: AssociationSettings, shared: pd.DataFrame, published: pd.DataFrame | None) -> pd.DataFrame:
    """What the judges rate: the list ``associations.published`` names (``judge.items: published``), or the
    run's significant associations (both passes, or the global one without ``judge.include_per_language``)."""
    if settings.judge.items == "published" and published is not None:
        return published_items(published, ALPHA, MIN_LIFT)
    return judge_items(shared, settings.judge.include_per_language)


def _known_ratings(
    human: pd.DataFrame | None,
    file: str | None,
    items: pd.DataFrame,
    values: pd.DataFrame,
    published: pd.DataFrame | None,
    notes: list[str],
) -> pd.DataFrame | None:
    """The human ratings (without their row numbers) once every rated id is an association the stage
    knows: one it tested (``values``), rates (``items``) or was given as published; a rating of any other
    id stops the stage naming the file and row, before a judge runs or a rating is used. Also notes the
    published questions merged into one association (listed under several question ids)."""
    if published is not None and len(published):
        merged = [ids for ids in published["question_ids"] if len(ids) > 1]
        if merged:
            notes.append(
                f"associations.published: {len(merged)} association(s) listed under several question ids, each "
                f"counted once (e.g. {', '.join(merged[0])})"
            )
    if human is None or file is None:
        return human
    known = set(items["association_id"]) if len(items) else set()
    for frame in (values, published):
        if frame is not None and len(frame):
            known |= set(frame[ASSOCIATION_KEY].astype(str).agg("|".join, axis=1))
    refuse_unknown_associations(human, known, paths.resolve(file))
    return human.drop(columns="row")


def _compare_with_published(
    params: Params, data: pd.DataFrame, published: pd.DataFrame | None, attributes: pd.DataFrame, values: pd.DataFrame
) -> tuple[PooledScope | None, pd.DataFrame]:
    """Whether scope all may be compared (the run's pool against the published files'), and the
    comparison table (empty without ``associations.published``)."""
    file = params.associations.published
    if published is None or file is None:
        return None, pd.DataFrame(columns=COMPARISON_COLUMNS)
    pooled = pooled_scope(run_pool(params, data), published_pool(paths.resolve(file)))
    return pooled, compare_published(published, attributes, values, pooled)


def run_pool(params: Params, data: pd.DataFrame) -> dict[str, Any]:
    """What the run's pooled pass pools (``RELEASE_POOL``-shaped): its stories' languages, and for an
    imported StereoTales corpus whether it pools the additional_en variants, keeps a subset of the
    prompted attributes and draws a sample (and per what)."""
    corpus = params.profile.corpus
    languages = sorted({str(x) for x in data["language"]}) if len(data) else []
    if corpus is None or corpus.format != "stereotales":
        return {"languages": languages, "additional_en": False, "attributes": None, "sample": None}
    return {
        "languages": languages,
        "additional_en": bool(corpus.additional_en),
        "attributes": sorted(corpus.attributes) if corpus.attributes is not None else None,
        "sample": None if corpus.sample is None else f"{corpus.sample} per {corpus.sample_per.replace('_', ' x ')}",
    }


def _published_summary(
    file: str | None,
    published: pd.DataFrame | None,
    comparison: pd.DataFrame,
    attributes: pd.DataFrame,
    pooled: PooledScope | None,
) -> dict[str, Any] | None:
    """The manifest's account of the comparison with the published associations (None without a file):
    counts under both rules, per model and scope, how many (model, scope) outcomes were tried in all,
    and, for released files, the tested pairs' BH decisions and p-values against the run's."""
    if file is None or published is None or pooled is None:
        return None
    counted = comparison[comparison["counted"].astype(bool)] if len(comparison) else comparison
    released = [f for f in association_files(paths.resolve(file)) if f.suffix.lower() == ".jsonl"]
    pairs = pd.concat([load_released_pairs(f) for f in released], ignore_index=True) if released else pd.DataFrame()
    return {
        "file": file,
        "n_published": int(len(published)),
        "n_outcomes_tried": int(len(comparison[comparison["source"] != "run"])) if len(comparison) else 0,
        "pooled_scope_compared": pooled.comparable,
        "pooled_scope_reason": pooled.reason,
        "status_files_rule": {k: int(v) for k, v in counted["status"].value_counts().items()} if len(counted) else {},
        "status_stated_rule": {k: int(v) for k, v in counted["status_stated"].value_counts().items()}
        if len(counted)
        else {},
        "per_model_scope_files_rule": comparison_counts(comparison).to_dict(orient="records"),
        "per_model_scope_stated_rule": comparison_counts(comparison, rule="stated").to_dict(orient="records"),
        "released_pairs": pair_agreement(pairs, attributes) if released else None,
    }


def _write_tables(
    run_name: str,
    attributes: pd.DataFrame,
    values: pd.DataFrame,
    shared: pd.DataFrame,
    power_table: pd.DataFrame,
    ratings: pd.DataFrame,
) -> None:
    """The stage's parquet files: associations_{attributes,values,shared,power} and harm_ratings."""
    outputs = {
        "associations_attributes": attributes,
        "associations_values": values,
        "associations_shared": shared,
        "associations_power": power_table,
        "harm_ratings": ratings.drop(columns=["rating_key"]).reset_index(drop=True),
    }
    for name, table in outputs.items():
        artifacts.write(run_name, name, table)  # the registry's schema (OUTPUT_SCHEMAS) and path


def _result_counts(
    attributes: pd.DataFrame, values: pd.DataFrame, items: pd.DataFrame, ratings: pd.DataFrame
) -> dict[str, int]:
    """The manifest's counts: tables tested, pairs retained, significant values, items judged, ratings."""
    n_failed = int((~ratings["parse_ok"].astype(bool)).sum()) if len(ratings) else 0
    return {
        "n_tables": int(len(attributes)),
        "n_retained": int(attributes["retained"].astype(bool).sum()) if len(attributes) else 0,
        "n_significant": int(values["significant"].astype(bool).sum()) if len(values) else 0,
        "n_judged": int(len(items)),
        "n_ratings": int(len(ratings)),
        "n_ratings_unparsed": n_failed,
    }


def read_observations(run_name: str, dimensions: Sequence[str]) -> tuple[pd.DataFrame, dict]:
    """``observations`` of the run's extractions and filtered stories; a missing file names the stage to run."""
    extract_columns = [f"demo_{d}" for d in dimensions]
    for path in (artifacts.extractions_path(run_name), artifacts.filtered_path(run_name)):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run the earlier stages first (make extract)")
    # only the columns the tests read: an imported corpus' filtered.parquet holds every story's text
    data, counts = observations(
        read_parquet_checked(artifacts.extractions_path(run_name), ["story_id", "parse_ok", *extract_columns]),
        read_parquet_checked(artifacts.filtered_path(run_name), OBSERVED_COLUMNS),
        dimensions,
    )
    return data.assign(sample_id=_sample_ids(run_name, data["story_id"])), counts


def _sample_ids(run_name: str, story_ids: pd.Series) -> pd.Series:
    """Each story's id in its source: an imported story's ``sample_id`` (corpus.parquet), else its story id."""
    corpus = artifacts.path(run_name, "corpus")
    if not corpus.is_file():
        return story_ids
    source = pd.read_parquet(corpus, columns=["story_id", "sample_id"]).set_index("story_id")["sample_id"]
    return story_ids.map(source).fillna(story_ids)


def _test_passes(
    data: pd.DataFrame, dimensions: Sequence[str], settings: AssociationSettings
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every configured pass (pooled and/or per language) of ``run_pass``: (attribute-level tests,
    value-level cells), concatenated in the stage's columns."""
    attr_frames, value_frames = [], []
    for name in settings.passes:
        attrs, values = run_pass(
            data,
            dimensions,
            scope_by_language=(name == "per_language"),
            seed=settings.seed,
            max_resamples=settings.max_resamples,
            fisher=settings.fisher,
        )
        attr_frames.append(attrs)
        value_frames.append(values)
    attributes = pd.concat(attr_frames, ignore_index=True).reindex(columns=ATTRIBUTE_COLUMNS)
    values = pd.concat(value_frames, ignore_index=True).reindex(columns=VALUE_COLUMNS)
    return attributes, values


def _untestable_notes(power_table: pd.DataFrame) -> list[str]:
    """The notes of a run with stories but no testable table: what a table needs, and why none has it."""
    notes = [
        f"no testable table: every base attribute needs >= 2 prompted values with >= {MIN_ROW_TOTAL} "
        "stories each and another dimension with >= 2 known values (why, per compared dimension: "
        "associations_power.parquet)"
    ]
    why = why_nothing_found(power_table)
    if why:
        notes.append(why)
    return notes


def _rate(
    items: pd.DataFrame,
    params: Params,
    progress: bool,
    engine_factory: Callable[[ModelSpec], ChatEngine] | None,
    notes: list[str],
) -> tuple[pd.DataFrame, list[JudgeEngineInfo]]:
    """The judges' ratings of ``items`` (``judge.run_judges``) and their engines' info; with no item, an
    empty ratings table and a note on why (appended to ``notes``)."""
    settings = params.associations
    if items.empty:
        notes.append(
            "no significant association: nothing for the judges to rate"
            + (
                ""
                if settings.judge.include_per_language or "global" in settings.passes
                else " (the judges rate the global pass's associations, and associations.passes has no 'global')"
            )
        )
        return pd.DataFrame(columns=RATING_COLUMNS), []
    return judge.run_judges(items, params, progress, **({"engine_factory": engine_factory} if engine_factory else {}))


class _HumanComparison(NamedTuple):
    """The human ratings next to the judges' (all None without a human-ratings file)."""

    agreement: dict[str, Any] | None  # human_llm_agreement
    table: pd.DataFrame | None  # rating_summary of the human ratings
    harm_gap: pd.DataFrame | None  # harm_gap_by_attribute
    harmful_vs: dict[str, Any] | None  # harmful_agreement


def _compare_humans(
    human: pd.DataFrame | None,
    summary: pd.DataFrame,
    llm_table: pd.DataFrame,
    settings: AssociationSettings,
    notes: list[str],
) -> _HumanComparison:
    """Human-LLM agreement, the human rating summary, the harm gap per attribute and the harmful
    classifications compared; without human ratings, a note (appended to ``notes``) and Nones."""
    if human is None:
        notes.append("no human ratings file (associations.human_ratings): human-LLM agreement not computed")
        return _HumanComparison(None, None, None, None)
    agreement = human_llm_agreement(human, summary, settings.bootstrap, settings.seed)
    human_table = rating_summary(human)
    harm_gap = harm_gap_by_attribute(human_table, llm_table, settings.bootstrap, settings.seed)
    return _HumanComparison(agreement, human_table, harm_gap, harmful_agreement(human_table, llm_table))
