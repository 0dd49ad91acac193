"""Stage 05 statistics: distributional bias (BiasedTales-ML) and stereotype/balance scores (Feng et al.).

The formulas of each study live in their own module -- :mod:`storybias.stages.metrics.biasedtales`
(narrative distributions) and :mod:`storybias.stages.metrics.feng` (stereotype and balance scores) --
and are all importable from here, where the notebook calls them. This module holds the stage itself:
the input and output contracts (columns read, Arrow schemas written) and :func:`run`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from storybias.config.designs import with_lens
from storybias.config.params import Comparison, MetricsSettings, Params
from storybias.config.studies import GRAMMATICAL_GENDER, MIN_STORIES_FLAG, S_C_CLIP
from storybias.core import artifacts
from storybias.core.locks import holds_run_lock
from storybias.core.results import StageResult
from storybias.stages.metrics.biasedtales import (
    JSD_EPSILON,
    GroupData,
    bootstrap_jsd,
    bootstrap_s_c,
    categories,
    category_counts,
    cosine_matrix,
    cosine_similarity,
    coverage,
    grammatical_gender_test,
    jensen_shannon,
    jsd_from_counts,
    load_lexicon,
    log_odds_dirichlet,
    log_odds_table,
    log_probability_ratio,
    narrative_comparison,
    s_c_from_counts,
    vsr_jsd_join,
)
from storybias.stages.metrics.feng import (
    ANOVA_SPEC_KEYS,
    GLM_GENRES,
    aggregate_intervals,
    aggregate_scores,
    bh_adjust,
    common_models,
    occupation_scores,
    occupation_trials,
    partial_omega_squared,
    trial_glm,
    type1_anova,
)
from storybias.summaries import answers_at_list_cap

__all__ = [
    # the study constants the formulas use (storybias.config.studies)
    "GRAMMATICAL_GENDER",
    "MIN_STORIES_FLAG",
    "S_C_CLIP",
    # A. narrative distributions (BiasedTales-ML)
    "JSD_EPSILON",
    "GroupData",
    "bootstrap_jsd",
    "bootstrap_s_c",
    "categories",
    "category_counts",
    "cosine_matrix",
    "cosine_similarity",
    "coverage",
    "grammatical_gender_test",
    "jensen_shannon",
    "jsd_from_counts",
    "load_lexicon",
    "log_odds_dirichlet",
    "log_odds_table",
    "log_probability_ratio",
    "narrative_comparison",
    "s_c_from_counts",
    "vsr_jsd_join",
    # B. stereotype and balance (Feng et al.)
    "ANOVA_SPEC_KEYS",
    "GLM_GENRES",
    "aggregate_intervals",
    "aggregate_scores",
    "bh_adjust",
    "common_models",
    "occupation_scores",
    "occupation_trials",
    "partial_omega_squared",
    "trial_glm",
    "type1_anova",
    # the stage
    "EXTRACTION_COLUMNS",
    "FILTERED_COLUMNS",
    "OUTPUT_SCHEMAS",
    "VSR_COLUMNS",
    "InputContractError",
    "check_input_columns",
    "required_input_columns",
    "run",
    "to_contract",
]


# Arrow schemas of the stage's tables (docs/data-contract.md), by the name in metrics_<name>.parquet.
# Every table is written with its schema, so an input with nothing to compare (no stories, no
# occupations outputs) gives the same columns and types as a full run, with zero rows.
_TEXT, _REAL, _COUNT, _FLAG = pa.string(), pa.float64(), pa.int64(), pa.bool_()
_CELL_FIELDS = [
    ("comparison", _TEXT),
    ("model", _TEXT),
    ("language", _TEXT),
    ("n_m", _COUNT),
    ("n_f", _COUNT),
    ("small_sample", _FLAG),
]
_JSD_FIELDS = [*_CELL_FIELDS, ("jsd", _REAL), ("ci_low", _REAL), ("ci_high", _REAL), ("note", _TEXT)]
_SCORE_KEYS = [("model", _TEXT), ("language", _TEXT), ("task", _TEXT)]
OUTPUT_SCHEMAS: dict[str, pa.Schema] = {
    "sc": pa.schema(
        [
            *_CELL_FIELDS,
            ("kind", _TEXT),
            ("category", _TEXT),
            ("s_c", _REAL),
            ("ci_low", _REAL),
            ("ci_high", _REAL),
            ("coverage", _REAL),
            ("note", _TEXT),
        ]
    ),
    "jsd": pa.schema(_JSD_FIELDS),
    "cosine": pa.schema(
        [
            ("comparison", _TEXT),
            ("model", _TEXT),
            ("language_a", _TEXT),
            ("language_b", _TEXT),
            ("cosine", _REAL),
            ("ci_low", _REAL),  # percentile interval over resamples of each language's stories
            ("ci_high", _REAL),
        ]
    ),
    "log_odds": pa.schema(
        [
            ("comparison", _TEXT),
            ("model", _TEXT),
            ("field", _TEXT),
            ("group", _TEXT),
            ("word", _TEXT),
            ("z", _REAL),
            ("count_m", _COUNT),
            ("count_f", _COUNT),
        ]
    ),
    "grammatical_gender": pa.schema(
        [
            ("comparison", _TEXT),
            ("model", _TEXT),
            ("U", _REAL),
            ("p_value", _REAL),
            ("n_G", _COUNT),
            ("n_N", _COUNT),
            ("note", _TEXT),
        ]
    ),
    "vsr_jsd": pa.schema([*_JSD_FIELDS, ("vsr", _REAL), ("n_stories", _COUNT)]),
    "occupations": pa.schema(
        [
            *_SCORE_KEYS,
            ("occupation", _TEXT),
            ("occupation_gender", _TEXT),
            ("n", _COUNT),
            ("n_female", _COUNT),
            ("n_male", _COUNT),
            ("n_unidentified", _COUNT),
            ("p_female", _REAL),
            ("p_male", _REAL),
            ("m_s", _REAL),
            ("m_b", _REAL),
            ("denominator", _TEXT),
        ]
    ),
    "aggregates": pa.schema(
        [
            *_SCORE_KEYS,
            ("m_s", _REAL),
            ("m_b", _REAL),
            # 95% percentile intervals over resamples of each occupation's outputs (feng.aggregate_intervals)
            ("m_s_low", _REAL),
            ("m_s_high", _REAL),
            ("m_b_low", _REAL),
            ("m_b_high", _REAL),
            ("n_occupations", _COUNT),
            ("n_outputs", _COUNT),
            ("denominator", _TEXT),
        ]
    ),
    "anova": pa.schema(
        [
            ("outcome", _TEXT),
            ("term", _TEXT),
            ("df", _COUNT),
            ("df_resid", _COUNT),
            ("sum_sq", _REAL),
            ("F", _REAL),
            ("p_value", _REAL),
            ("partial_omega_sq", _REAL),
            ("p_adjusted", _REAL),
            ("subset", _TEXT),
            ("denominator", _TEXT),
            ("note", _TEXT),
        ]
    ),
    "glm": pa.schema(
        [("outcome", _TEXT), ("term", _TEXT), ("chi2", _REAL), ("p_value", _REAL), ("df", _COUNT), ("n_trials", _COUNT)]
    ),
}

# Columns stage 05 reads from each input (docs/data-contract.md); the comparisons' cond_<condition>
# columns are added per profile (required_input_columns).
EXTRACTION_COLUMNS = ("story_id", "parse_ok", "adjectives_en", "settings", "protagonist_gender")
FILTERED_COLUMNS = ("story_id", "design", "model", "language", "cond_task", "cond_occupation", "cond_occupation_gender")
VSR_COLUMNS = ("design", "model", "language", "vsr", "n_stories")


class InputContractError(ValueError):
    """An input table of stage 05 lacks a column it reads (or has it with the wrong type); the message
    names the file and the columns."""


def required_input_columns(comparisons: Sequence[Comparison]) -> dict[str, tuple[str, ...]]:
    """Columns read from extractions / filtered / vsr, including each comparison's condition columns."""
    conds = [f"cond_{c}" for comparison in comparisons for c in (comparison.condition, *comparison.where)]
    return {
        "extractions": EXTRACTION_COLUMNS,
        "filtered": tuple(dict.fromkeys([*FILTERED_COLUMNS, *conds])),
        "vsr": VSR_COLUMNS,
    }


def check_input_columns(frame: pd.DataFrame, path: Any, required: Sequence[str], remedy: str) -> None:
    """Raise InputContractError naming ``path`` and every missing column (and a non-boolean parse_ok)."""
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InputContractError(
            f"{path}: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"(stage 05 reads {', '.join(required)}; see docs/data-contract.md): {remedy}"
        )
    if "parse_ok" in required and len(frame) and not pd.api.types.is_bool_dtype(frame["parse_ok"]):
        raise InputContractError(
            f"{path}: column parse_ok must be boolean, found {frame['parse_ok'].dtype} "
            f"(see docs/data-contract.md): {remedy}"
        )


def to_contract(frame: pd.DataFrame, name: str) -> pa.Table:
    """The Arrow table of ``metrics_<name>.parquet``: columns in schema order with schema types; a
    column the frame lacks (an empty frame lacks them all) is null. A column outside the schema is a
    bug (the contract and the code disagree) and raises."""
    schema = OUTPUT_SCHEMAS[name]
    extra = [c for c in frame.columns if c not in schema.names]
    if extra:
        raise ValueError(f"metrics_{name}: columns {extra} are not in OUTPUT_SCHEMAS[{name!r}] (docs/data-contract.md)")
    frame = frame.reset_index(drop=True)
    arrays = [
        pa.array(frame[f.name], from_pandas=True).cast(f.type)
        if f.name in frame.columns
        else pa.nulls(len(frame), f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _read_inputs(run_name: str, comparisons: Sequence[Comparison]) -> dict[str, pd.DataFrame]:
    """The extractions, filtered and vsr tables of the run, each checked against the columns stage 05
    reads from it."""
    inputs = {
        "extractions": (artifacts.extractions_path(run_name), "rerun stage 03 (make extract)"),
        "filtered": (artifacts.filtered_path(run_name), "rerun stage 02 (make filter)"),
        "vsr": (artifacts.vsr_path(run_name), "rerun stage 02 (make filter)"),
    }
    for path, _ in inputs.values():
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run the earlier stages first (make extract)")
    required = required_input_columns(comparisons)
    frames = {}
    for key, (path, remedy) in inputs.items():
        frames[key] = pd.read_parquet(path)
        check_input_columns(frames[key], path, required[key], remedy)
    return frames


def _grammatical_gender_table(jsd: pd.DataFrame) -> pd.DataFrame:
    """The grammatical-gender test of the JSDs per comparison x model."""
    rows = []
    if not jsd.empty:
        for (comparison, model), g in jsd.groupby(["comparison", "model"]):
            rows.append({"comparison": comparison, "model": model, **grammatical_gender_test(g)})
    return pd.DataFrame(rows)


NARRATIVE_LISTS = ("adjectives_en", "settings")  # what the BiasedTales-ML comparisons count
OCCUPATION_CONDITIONS = ("cond_occupation", "cond_task")  # what Feng et al.'s scores group by


def missing_inputs(parsed: pd.DataFrame, settings: MetricsSettings) -> list[str]:
    """Why a lens cannot run on stories the run has: a condition column no story holds, or narrative
    lists stage 03 did not extract (an imported table, ``corpus.extractions: published``), each with the
    key that provides it. Empty when every input exists or the design is absent."""
    notes = []
    for comparison in settings.comparisons:
        column = f"cond_{comparison.condition}"
        stories = parsed[parsed["design"] == comparison.design]
        if len(stories) and (column not in stories or stories[column].isna().all()):
            notes.append(
                f"{comparison.name}: the {len(stories)} {comparison.design} stories have no {column} "
                f"(an imported table provides it with corpus.columns.conditions.{column})"
            )
    narratives = parsed[parsed["design"].isin({c.design for c in settings.comparisons})]
    lists = [c for c in NARRATIVE_LISTS if c in narratives]
    if len(narratives) and lists and not narratives[lists].map(lambda v: v is not None and len(v) > 0).any().any():
        notes.append(
            f"no adjectives or settings extracted from the {len(narratives)} narrative stories: stage 03 extracts "
            "them with a model (corpus.extractions: rerun); published extractions carry demographics only"
        )
    # the designs read through Feng et al.'s occupational lens, as occupation_trials selects them
    occupational = with_lens("occupations", sorted(parsed["design"].dropna().unique()))
    occupations = parsed[parsed["design"].isin(occupational)]
    for column in OCCUPATION_CONDITIONS:
        if len(occupations) and (column not in occupations or occupations[column].isna().all()):
            notes.append(
                f"the {len(occupations)} occupational-lens outputs have no {column}: Feng et al.'s scores need it "
                f"(an imported table provides it with corpus.columns.conditions.{column})"
            )
    return notes


def _narrative_tables(
    parsed: pd.DataFrame, vsr: pd.DataFrame, settings: MetricsSettings, notes: list[str]
) -> dict[str, pd.DataFrame]:
    """BiasedTales-ML's tables (sc, jsd, cosine, log_odds, grammatical_gender, vsr_jsd) over the parsed
    stories, every comparison of ``settings``; a comparison with nothing to compare adds a note."""
    sc_frames, jsd_frames, lo_frames, boot_frames = [], [], [], []
    for comparison in settings.comparisons:
        lo_frames.append(log_odds_table(parsed, comparison, settings.log_odds_prior_scale, settings.log_odds_top))
        if comparison.log_odds_only:  # an Appendix F contrast: distinctive words only
            continue
        out = narrative_comparison(
            parsed, comparison, settings.bootstrap, settings.seed, settings.min_stories, settings.sc_denominator
        )
        if out["sc"].empty:
            notes.append(
                f"{comparison.name}: no {comparison.design} stories with {comparison.condition} in "
                f"({comparison.group_m}, {comparison.group_f}): nothing to compare"
            )
        sc_frames.append(out["sc"])
        jsd_frames.append(out["jsd"])
        boot_frames.append(out["sc_replicates"])
    sc = pd.concat(sc_frames, ignore_index=True) if sc_frames else pd.DataFrame()
    replicates = pd.concat(boot_frames, ignore_index=True) if boot_frames else pd.DataFrame()
    jsd = pd.concat(jsd_frames, ignore_index=True) if jsd_frames else pd.DataFrame()
    log_odds = pd.concat(lo_frames, ignore_index=True) if lo_frames else pd.DataFrame()
    return {
        "sc": sc,
        "jsd": jsd,
        "cosine": cosine_matrix(sc, replicates) if not sc.empty else pd.DataFrame(),
        "log_odds": log_odds,
        "grammatical_gender": _grammatical_gender_table(jsd),
        "vsr_jsd": vsr_jsd_join(jsd, vsr, settings.comparisons) if not jsd.empty else pd.DataFrame(),
    }


def _anova_specifications(
    aggregates: pd.DataFrame, common: Sequence[str], family: str, notes: list[str]
) -> pd.DataFrame:
    """Type-I ANOVAs of both metrics for every specification (denominator x subset: all available
    models, common models), BH-adjusted by ``family``; a test that cannot be run adds a note."""
    specs = []
    for denominator, table in aggregates.groupby("denominator"):
        for subset, part in (("all available", table), ("common models", table[table["model"].isin(common)])):
            for outcome in ("m_s", "m_b"):
                result, why = type1_anova(part, outcome)
                if why:
                    notes.append(f"ANOVA {outcome} ({subset}; {denominator}): {why}")
                if not result.empty:
                    specs.append(result.assign(subset=subset, denominator=denominator, note=why))
    return bh_adjust(pd.concat(specs, ignore_index=True), family) if specs else pd.DataFrame()


def _trial_glms(trials: pd.DataFrame, common: Sequence[str], notes: list[str]) -> pd.DataFrame:
    """The trial-level GLMs (female, identified) on the common models; one not estimable adds a note."""
    parts = []
    common_trials = trials[trials["model"].isin(common)]
    for outcome in ("female", "identified"):
        result, why = trial_glm(common_trials, outcome)
        if why:
            notes.append(f"trial-level GLM ({outcome}): {why}")
        if not result.empty:
            parts.append(result)  # a fit whose unusable terms were emptied keeps its other terms
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _stereotype_tables(data: pd.DataFrame, settings: MetricsSettings, notes: list[str]) -> dict[str, pd.DataFrame]:
    """Feng et al.'s tables (occupations, aggregates, anova, glm) over the parsed occupations outputs,
    under both denominators (all outputs, identified only); empty, with a note, when there are none."""
    trials = occupation_trials(data)
    if trials.empty:
        notes.append("no parsed occupations outputs: stereotype and balance scores not computed")
        return {name: pd.DataFrame() for name in ("occupations", "aggregates", "anova", "glm")}
    occ_all = occupation_scores(trials)
    occ_ident = occupation_scores(trials, identified_only=True)
    occupations = pd.concat(
        [occ_all.assign(denominator="all outputs"), occ_ident.assign(denominator="identified only")]
    )
    keys = ["model", "language", "task"]
    aggregates = pd.concat(
        [
            aggregate_scores(table)
            .merge(aggregate_intervals(table, settings.bootstrap, settings.seed, identified), on=keys, how="left")
            .assign(denominator=denominator)
            for table, identified, denominator in (
                (occ_all, False, "all outputs"),
                (occ_ident, True, "identified only"),
            )
        ]
    )
    common = common_models(aggregate_scores(occ_all))
    return {
        "occupations": occupations,
        "aggregates": aggregates,
        "anova": _anova_specifications(aggregates, common, settings.anova_bh_family, notes),
        "glm": _trial_glms(trials, common, notes),
    }


def _values(tables: dict[str, pd.DataFrame], notes: list[str], n_excluded: int) -> dict[str, Any]:
    """The named values notebook 05 records: exclusions, notes, table sizes and the mean M_s and M_b (all
    outputs in the denominator) when the run has occupations outputs."""
    values: dict[str, Any] = {
        "n_excluded": n_excluded,
        "notes": notes,
        "n_sc_rows": int(len(tables["sc"])),
        "n_jsd_rows": int(len(tables["jsd"])),
    }
    aggregates = tables["aggregates"]
    if not aggregates.empty:
        pooled = aggregates[aggregates["denominator"] == "all outputs"]
        values.update(mean_m_s=float(pooled["m_s"].mean()), mean_m_b=float(pooled["m_b"].mean()))
    return values


CAPPED_LISTS = ("adjectives_en", "settings", "cultural_refs")  # stage 03's lists that extract.max_list_items caps


def capped_answers(run_name: str, cap: int | None) -> pd.Series:
    """How many parsed answers of the run's extractions reached stage 03's list cap, per list of
    :data:`CAPPED_LISTS` that the file holds (``storybias.summaries.answers_at_list_cap``)."""
    path = artifacts.extractions_path(run_name)
    columns = [c for c in ("parse_ok", *CAPPED_LISTS) if c in pq.read_schema(path).names]
    return answers_at_list_cap(pd.read_parquet(path, columns=columns), cap, CAPPED_LISTS)


def cosine_matrices(cosine: pd.DataFrame) -> dict[tuple[str, str], pd.DataFrame]:
    """The cosine table as one language x language matrix per (comparison, model), in sorted order."""
    return {
        (str(comparison), str(model)): group.pivot(index="language_a", columns="language_b", values="cosine")
        for (comparison, model), group in cosine.groupby(["comparison", "model"])
    }


@holds_run_lock("metrics")
def run(params: Params) -> StageResult:
    """Stage 05: read extractions + conditions, compute every table, write data/<run>/metrics_*.parquet."""

    run_name, settings = params.run_name, params.metrics
    frames = _read_inputs(run_name, settings.comparisons)
    extractions, filtered, vsr = frames["extractions"], frames["filtered"], frames["vsr"]
    data = extractions.merge(filtered.drop(columns=["raw"], errors="ignore"), on="story_id", how="left")
    n_excluded = int((~data["parse_ok"]).sum())
    parsed = data[data["parse_ok"]]
    notes: list[str] = missing_inputs(parsed, settings)
    tables = {**_narrative_tables(parsed, vsr, settings, notes), **_stereotype_tables(data, settings, notes)}
    for name, table in tables.items():
        artifacts.write(run_name, f"metrics_{name}", to_contract(table, name))
        tables[name] = table.reset_index(drop=True).reindex(columns=OUTPUT_SCHEMAS[name].names)
    manifest = {
        "stage": "metrics",
        "notes": notes,
        "n_parse_failed_excluded": n_excluded,
        "params": params.resolved()["metrics"],
    }
    artifacts.write(run_name, "manifest_metrics", manifest)
    return StageResult(
        "metrics",
        run_name,
        tables=tables,
        manifest=manifest,
        values=_values(tables, notes, n_excluded),
        notes=notes,
        details={
            "n_excluded": n_excluded,
            "answers_at_list_cap": capped_answers(run_name, params.extract.max_list_items),
            "cosine_matrices": cosine_matrices(tables["cosine"]) if "cosine" in tables else {},
        },
    )
