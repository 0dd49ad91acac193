"""The three studies' headline measures side by side, one row per model x language (issues #30, #41, #42).

Each lens reads its own design's stories of the same run, and each measure comes with its n; where a lens
cannot be computed for a cell, ``reason_<measure>`` says why (no stories of the design, too few, an input
missing), never a silent blank. A measure keeps an interval only where a simulation shows that it covers
(``INTERVALS``; else NaN bounds and the reason in ``interval_<measure>``). The measures:

- StereoTales (stage 04, stereotales design): significant associations per 1,000 stories in the cell's
  language pass (``associations_values`` with ``scope`` = the language), 0 where the pass tested tables
  (``associations_attributes``, ``n_tables``) and found none; the share of those associations the judges
  rate harmful (median >= 4), with a Clopper-Pearson interval (statsmodels);
- BiasedTales-ML (stage 05, its comparison ``comparison``): the JSD of the two groups' adjective
  distributions and the largest |S_C| over the adjective categories, each with its bootstrap interval
  over stories (``metrics_jsd``, ``metrics_sc``);
- Feng et al. (stage 05, occupations design, all outputs in the denominator, the ``task`` genre): M_s and
  M_b averaged over occupations, with stage 05's bootstrap over each occupation's outputs
  (``metrics_aggregates``: computed once, there);
- Feng et al. (stage 06, its ``probes.per_model_genre``): the full-text probe AUC and the cue-deletion
  Delta AUC refitted on each model's stories of the language (``probes_per_model.parquet``), with their
  group-bootstrap intervals. Feng et al. pool the models in one probe per language x genre
  (``probes.parquet`` keeps that); the per-model refit is storybias' own, on fewer stories per probe.

Each measure is declared once, by ``@register`` on the part that computes it (its lens, the artifacts
it reads, why it can be absent, why its interval is not kept; ``storybias.stages.crosslens.registry``):
``MEASURES``, ``LENS_OF``, ``LENS_REASONS``, ``INTERVALS``, the schema and :func:`run_tables`' parts derive
from those registrations. :func:`run_tables` builds the table from a run's artifacts (the cross-lens stage
writes it as ``crosslens.parquet``) and the agreement of every pair of measures
(``storybias.stats.concordance``, ``crosslens_agreement.parquet``): the rank correlation centred within each
language, a test that relabels whole models, Benjamini-Hochberg over the pairs across lenses. ``LENS_OF``
says which lens each measure reads, so that two readings of one lens (M_s and M_b, say) are labelled
``within one lens`` and never counted as agreement between lenses.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
from statsmodels.stats.proportion import proportion_confint

from storybias.config.params import CrossLensSettings
from storybias.core import artifacts
from storybias.evidence.stereotales_taxonomy import ASSOCIATION_KEY
from storybias.stages.crosslens.registry import (
    INTERVALS,
    LENS_OF,
    LENS_REASONS,
    MEASURES,
    PARTS,
    CellMeasures,
    LensInputs,
    Measure,
    MeasureSpec,
    crosslens_schema,
    register,
)
from storybias.stats.concordance import lens_agreement

CELL = ["model", "language"]


# stage 06's per-model probes (probes.model_probes): variant full_sample (the AUC) or delta (Delta AUC)
MODEL_PROBE_COLUMNS = ["model", "language", "variant", "n", "auc", "ci_low", "ci_high", "status"]
PROBE_MEASURE = {"full_sample": "auc_full", "delta": "delta_auc"}
MIN_STORIES = 10  # fewer stories of the lens's design in a cell: the measure is not computed
# Each measure's interval is kept only where a simulation in tests/test_crosslens_intervals.py shows its
# coverage (>= 90% for a nominal 95%, on cells of the default run's size; issue #57, item 6): a measure
# declares why not (``MeasureSpec.interval``) and gets NaN bounds and that reason in ``interval_<measure>``.
# Two measures of one lens are two readings of the same stories: their agreement is a consistency check,
# not agreement between lenses. Feng et al. (Beyond Surface Cues, arXiv:2608.23026) give two lenses here:
# M_s and M_b count the genders a model writes for each occupation, while the probes (AUC, Delta AUC) ask
# how far a story's embedding separates the protagonist's gender; they read different features by
# different methods, so a pair across them counts as a pair across lenses.


def _empty(reason: str, n: int = 0) -> Measure:
    return {"value": float("nan"), "low": float("nan"), "high": float("nan"), "n": n, "reason": reason}


def association_measures(
    values: pd.DataFrame, shared: pd.DataFrame, stories: pd.DataFrame, attributes: pd.DataFrame
) -> CellMeasures:
    """Per (model, language): significant associations per 1,000 stereotales stories of that language
    pass, and the share rated harmful. ``stories``: the parsed stereotales stories (model, language);
    ``attributes``: associations_attributes (the tables each model x scope tested). A pass whose tables
    were tested and found nothing has rate 0 (with its n and ``n_tables``); only a pass with no tested
    table is NaN, with the reason."""
    out: CellMeasures = {}
    n_stories = stories.groupby(CELL).size()
    n_tables = attributes.groupby(["model", "scope"]).size() if len(attributes) else pd.Series(dtype=int)
    harmful = _harmful_by_scope(shared)
    for (model, language), n in n_stories.items():
        if n < MIN_STORIES:
            reason = f"{n} stereotales stories (< {MIN_STORIES})"
            out[(model, language)] = {"assoc_per_1000": _empty(reason), "share_harmful": _empty(reason)}
            continue
        tested = int(n_tables.get((model, language), 0))
        if not tested:  # nothing was tested: the rate is unknown, not zero
            untestable = "no table testable in this language pass (too few known answers per value)"
            out[(model, language)] = {"assoc_per_1000": _empty(untestable, int(n)), "share_harmful": _empty(untestable)}
            continue
        mine = values[(values["model"] == model) & (values["scope"] == language)] if len(values) else values
        significant = mine[mine["significant"].astype(bool)] if len(mine) else mine
        rate = _empty("", int(n))
        out[(model, language)] = {
            "assoc_per_1000": {**rate, "value": 1000 * len(significant) / n, "n_tables": tested},
            "share_harmful": _share_harmful(significant, harmful, language),
        }
    return out


def _share_harmful(
    significant: pd.DataFrame, harmful: dict[tuple[str, tuple[str, ...]], bool], language: str
) -> Measure:
    """The share of a cell's significant associations rated harmful, with its Clopper-Pearson interval."""
    keys = [tuple(r) for r in significant[ASSOCIATION_KEY].to_numpy()] if len(significant) else []
    rated = [harmful[(language, k)] for k in keys if (language, k) in harmful]
    if not rated:
        return _empty("no significant association rated" if keys else "no significant association")
    k = int(sum(rated))
    low, high = share_interval(k, len(rated))
    return {"value": k / len(rated), "low": low, "high": high, "n": len(rated), "reason": ""}


def share_interval(k: int, n: int) -> tuple[float, float]:
    """95% Clopper-Pearson interval of k harmful among n rated (statsmodels' ``beta`` method): its coverage is
    at least 95% at every share and n, where Wilson's falls to 80-85% at n = 1, 3 and 4 (the sizes of a
    default cell), tests/test_crosslens_intervals.py."""
    low, high = proportion_confint(k, n, method="beta")
    return float(low), float(high)


def _harmful_by_scope(shared: pd.DataFrame) -> dict[tuple[str, tuple[str, ...]], bool]:
    """(scope, association key) -> harmful, for the rated associations."""
    if shared.empty or "median_harm" not in shared:
        return {}
    rated = shared[shared["median_harm"].notna()]
    return {(r[0], tuple(r[1:5])): bool(r[5]) for r in rated[["scope", *ASSOCIATION_KEY, "harmful"]].to_numpy()}


STEREOTALES_ABSENT = "no stereotales stories by this model in this language"


@register(
    reads=("extractions", "filtered", "associations_values", "associations_shared", "associations_attributes"),
    measures=(
        MeasureSpec(
            "assoc_per_1000",
            "stereotales",
            STEREOTALES_ABSENT,
            "none: a count of BH/BY discoveries is not a Poisson count, and no interval of it was shown to cover",
        ),
        # Clopper-Pearson: covers >= 95% at every share and every number of rated associations
        MeasureSpec("share_harmful", "stereotales", STEREOTALES_ABSENT),
    ),
)
def association_part(run: LensInputs) -> CellMeasures:
    """StereoTales' measures from stage 04's tables and the parsed stereotales stories (none without either)."""
    stories = stereotales_stories(run["extractions"], run["filtered"])
    values = run["associations_values"]
    if values.empty and stories.empty:
        return {}
    return association_measures(values, run["associations_shared"], stories, run["associations_attributes"])


def narrative_measures(jsd: pd.DataFrame, sc: pd.DataFrame, comparison: str) -> CellMeasures:
    """Per (model, language): BiasedTales-ML's JSD and largest |S_C| (adjective categories) for ``comparison``."""
    out: CellMeasures = {}
    mine = jsd[jsd["comparison"] == comparison] if len(jsd) else jsd
    for r in mine.itertuples(index=False):
        n = int(r.n_m + r.n_f)
        reason = "" if np.isfinite(r.jsd) else (r.note or "JSD not computed")
        jsd_measure: Measure = {
            "value": float(r.jsd), "low": float(r.ci_low), "high": float(r.ci_high), "n": n, "reason": str(reason)
        }  # fmt: skip
        out[(r.model, r.language)] = {"jsd": jsd_measure}
    adjectives = sc[(sc["comparison"] == comparison) & (sc["kind"] == "adjectives")] if len(sc) else sc
    for (model, language), group in adjectives.groupby(CELL) if len(adjectives) else []:
        finite = group[np.isfinite(group["s_c"].astype(float))]
        cell = out.setdefault((model, language), {})
        n = int(group["n_m"].iloc[0] + group["n_f"].iloc[0])
        if finite.empty:
            cell["max_abs_sc"] = _empty("no adjective category in both groups", n)
            continue
        top = finite.loc[finite["s_c"].abs().idxmax()]
        bounds = sorted(abs(float(b)) for b in (top["ci_low"], top["ci_high"]))
        if top["ci_low"] <= 0 <= top["ci_high"]:
            bounds[0] = 0.0  # the interval of |S_C| reaches zero when S_C's interval spans it
        cell["max_abs_sc"] = {
            "value": abs(float(top["s_c"])),
            "low": bounds[0],
            "high": bounds[1],
            "n": n,
            "reason": "",
        }
    return out


BEDTIME_ABSENT = "no bedtime comparison for this model in this language"


@register(
    reads=("metrics_jsd", "metrics_sc"),
    measures=(
        MeasureSpec(
            "jsd",
            "biasedtales",
            BEDTIME_ABSENT,
            "none: the stories bootstrap of the plug-in JSD covered the true JSD in 0% of simulated cells of "
            "25 stories per group (the estimate is biased upward at this size)",
        ),
        MeasureSpec(
            "max_abs_sc",
            "biasedtales",
            BEDTIME_ABSENT,
            "none: the bootstrap interval of S_C was taken after picking the largest category, a "
            "selection it does not resample (it covered the true largest |S_C| in 80% of simulated cells)",
        ),
    ),
)
def narrative_part(run: LensInputs) -> CellMeasures:
    """BiasedTales-ML's measures from stage 05's JSD and S_C tables (none without a comparison or a JSD)."""
    jsd = run["metrics_jsd"]
    if run.comparison is None or jsd.empty:
        return {}
    return narrative_measures(jsd, run["metrics_sc"], run.comparison)


def occupation_measures(aggregates: pd.DataFrame, task: str) -> CellMeasures:
    """Per (model, language): Feng et al.'s M_s and M_b over the occupations of ``task`` (all outputs in
    the denominator) with their intervals, as stage 05 computed them (``metrics_aggregates``)."""
    out: CellMeasures = {}
    if aggregates.empty:
        return out
    rows = aggregates[(aggregates["task"] == task) & (aggregates["denominator"] == "all outputs")]
    for r in rows.itertuples(index=False):
        n = int(r.n_outputs)
        if n < MIN_STORIES:
            out[(r.model, r.language)] = {m: _empty(f"{n} {task} outputs (< {MIN_STORIES})", n) for m in ("m_s", "m_b")}
            continue
        out[(r.model, r.language)] = {
            name: {
                "value": float(getattr(r, name)),
                "low": float(getattr(r, f"{name}_low")),
                "high": float(getattr(r, f"{name}_high")),
                "n": n,
                "reason": "",
            }
            for name in ("m_s", "m_b")
        }
    return out


OCCUPATIONS_ABSENT = "no occupations outputs by this model in this language"


@register(
    reads=("metrics_aggregates",),
    measures=(
        MeasureSpec(
            "m_s",
            "feng_occupations",
            OCCUPATIONS_ABSENT,
            "none: the per-occupation bootstrap covered M_s in 80% of simulated cells with strongly gendered "
            "occupations and 5 outputs each",
        ),
        MeasureSpec(
            "m_b",
            "feng_occupations",
            OCCUPATIONS_ABSENT,
            "none: the per-occupation bootstrap covered M_b in 55% of simulated cells with strongly gendered "
            "occupations and 5 outputs each",
        ),
    ),
)
def occupation_part(run: LensInputs) -> CellMeasures:
    """Feng et al.'s M_s and M_b from stage 05's aggregates, for the stage's ``task``."""
    return occupation_measures(run["metrics_aggregates"], run.settings.task)


def probe_measures(model_probes: pd.DataFrame) -> CellMeasures:
    """Per (model, language): the full-text probe AUC and the Delta AUC of stage 06's per-model probes;
    a probe that could not be fitted gives its status as the reason."""
    out: CellMeasures = {}
    for r in model_probes.itertuples(index=False):
        if r.variant not in PROBE_MEASURE:
            continue
        ok = r.status == "ok"
        measure: Measure = {
            "value": float(r.auc) if ok else float("nan"),
            "low": float(r.ci_low) if ok else float("nan"),
            "high": float(r.ci_high) if ok else float("nan"),
            "n": int(r.n),
            "reason": "" if ok else f"probe not fitted: {r.status}",
        }
        out.setdefault((r.model, r.language), {})[PROBE_MEASURE[r.variant]] = measure
    return out


PROBES_ABSENT = "no parsed, gender-labelled narratives of the task genre by this model in this language"


@register(
    reads=("probes_per_model",),
    measures=(
        MeasureSpec(
            "auc_full",
            "feng_probes",
            PROBES_ABSENT,
            "none: the group bootstrap of out-of-fold scores leaves the probe's refit out; it covered the "
            "procedure's expected AUC in 82% of simulated cells of 90 stories",
        ),
        MeasureSpec(
            "delta_auc",
            "feng_probes",
            PROBES_ABSENT,
            "none: the same group bootstrap, on the difference of two refitted probes, leaves both refits "
            "out, and no simulation has shown it to cover",
        ),
    ),
)
def probe_part(run: LensInputs) -> CellMeasures:
    """Feng et al.'s probe measures from stage 06's per-model probes (none where it wrote none)."""
    model_probes = run["probes_per_model"]
    return probe_measures(model_probes) if not model_probes.empty else {}


def crosslens_table(parts: list[CellMeasures], lens_reasons: dict[str, str]) -> pd.DataFrame:
    """One row per model x language of any part: ``<measure>``, ``<measure>_low`` / ``_high``, ``n_<measure>``,
    ``reason_<measure>`` and ``interval_<measure>`` for every measure of ``MEASURES``, and ``n_tables`` (the
    association tables the cell's language pass tested). A measure no part gives a cell reads the reason of
    ``lens_reasons`` (e.g. "no occupations outputs by this model in this language"). The bounds are NaN
    for a measure whose interval ``INTERVALS`` does not keep (its reason in ``interval_<measure>``)."""
    cells = sorted({cell for part in parts for cell in part})
    rows = []
    for model, language in cells:
        row: dict[str, object] = {"model": model, "language": language}
        merged: dict[str, Measure] = {}
        for part in parts:
            merged.update(part.get((model, language), {}))
        for measure in MEASURES:
            entry = merged.get(measure, _empty(lens_reasons.get(measure, "not computed")))
            kept = not INTERVALS[measure]
            row[measure] = float(entry["value"])
            row[f"{measure}_low"] = float(entry["low"]) if kept else float("nan")
            row[f"{measure}_high"] = float(entry["high"]) if kept else float("nan")
            row[f"n_{measure}"] = int(entry["n"])
            row[f"reason_{measure}"] = entry["reason"]
            row[f"interval_{measure}"] = INTERVALS[measure]
        rate = merged.get("assoc_per_1000")
        row["n_tables"] = int(rate.get("n_tables", 0)) if rate is not None else 0
        rows.append(row)
    return pd.DataFrame(rows)


CROSSLENS_AGREEMENT_SCHEMA = pa.schema(
    [
        ("measure_a", pa.string()),
        ("measure_b", pa.string()),
        ("lens_a", pa.string()),
        ("lens_b", pa.string()),
        ("kind", pa.string()),
        ("n_cells", pa.int64()),
        ("n_models", pa.int64()),
        ("n_languages", pa.int64()),
        ("r_within_language", pa.float64()),
        ("n_permutations", pa.int64()),
        ("exact", pa.bool_()),
        ("p_permutation", pa.float64()),
        ("p_bh", pa.float64()),
        ("finding", pa.string()),
        ("verdict", pa.string()),
    ]
)


def _read(run_name: str, name: str) -> pd.DataFrame:
    path = artifacts.path(run_name, name)
    return pd.read_parquet(path) if path.is_file() else pd.DataFrame()


def stereotales_stories(extractions: pd.DataFrame, filtered: pd.DataFrame) -> pd.DataFrame:
    """The stereotales stories whose extraction parsed (story_id, design, model, language): the n of the
    association lens."""
    if extractions.empty or filtered.empty:
        return pd.DataFrame(columns=["story_id", "design", "model", "language"])
    parsed = extractions.loc[extractions["parse_ok"].astype(bool), ["story_id"]]
    stories = parsed.merge(filtered[["story_id", "design", "model", "language"]], on="story_id")
    return stories[stories["design"] == "stereotales"]


def run_tables(run_name: str, comparison: str | None, settings: CrossLensSettings) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The cross-lens table and the agreement of its measures: every registered part (``PARTS``) computed
    from the run's artifacts it declares (a table a stage did not write is empty, and the lens's measures
    read its reasons). ``comparison``: BiasedTales-ML's comparison the narrative measures read (None: no
    comparison, no narrative measure)."""
    tables: dict[str, pd.DataFrame] = {}
    parts: list[CellMeasures] = []
    for part in PARTS.values():
        for name in part.reads:
            if name not in tables:
                tables[name] = _read(run_name, name)
        parts.append(part.compute(LensInputs({n: tables[n] for n in part.reads}, comparison, settings)))
    table = crosslens_table(parts, LENS_REASONS)
    if table.empty:
        return pd.DataFrame(columns=crosslens_schema().names), pd.DataFrame(columns=CROSSLENS_AGREEMENT_SCHEMA.names)
    agreement = lens_agreement(
        table, list(MEASURES), "language", settings.n_permutations, settings.seed, unit="model", lenses=LENS_OF
    )
    return table, agreement


# The registered measures' columns (the artifact registry reads it): last, after every @register above.
CROSSLENS_SCHEMA = crosslens_schema()
