"""Stage 04's tests written as StereoTales' released association files, so another group can compare
with a storybias run as with the release (``storybias.evidence.released_associations`` reads both).

One JSONL file per generator model and scope, ``<model, / and \\ as _>__<scope>.jsonl``, under
``data/<run>/stereotales_associations/associations_global/`` (scope ``all``) and
``.../associations_by_language/`` (a release language code: ``du`` for storybias' ``nl``); one record per
tested attribute pair, with the fields of the release (StereoTales: *A Multilingual Framework for
Open-Ended Stereotype Discovery in LLMs*, Le Jeune et al., arXiv:2605.10442; the format of its reference
pipeline, Giskard-AI/stereotales-pipeline):

- ``base_attribute``, ``compared_attribute``, ``generator_model``, ``aggregation_dimension`` (``[]`` or
  ``["language"]``), ``aggregation_value``;
- ``statistics``: ``alpha`` and ``alpha_corrected`` 0.05, ``p_value`` the BH-adjusted p-value,
  ``cramer_v`` and ``effect_category`` (-1 and "N/A" unless BH-adjusted p < 0.05), ``chi_square`` (Pearson,
  no continuity correction), ``degrees_of_freedom``, ``dim_table`` and ``contingency_table_data``
  (``{compared label: {base label: count}}``, in the order the test used);
- ``associated_values``: every cell of the pair's table with BY-adjusted p < 0.05, whatever its lift
  (``p_value`` BY-adjusted, ``fraction``, ``lift``), labels as the release writes them (``release_label``);
- ``sample_ids``: as the reference writes them, every story of the model in the slice (all base
  attributes), one entry per story in the order of stage 04's observations, in each record of the file.
  Imported stories keep the release's ``sample_id`` (which repeats where a prompt was answered more than
  once); generated ones give their ``story_id``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import chi2_contingency

from storybias.core import artifacts
from storybias.evidence.released_associations import (
    GLOBAL_SCOPE,
    NOT_SIGNIFICANT,
    POOL_FILE,
    POOL_P_VALUES,
    RELEASE_CODE,
)
from storybias.evidence.stereotales_taxonomy import release_label
from storybias.stages.associations.tables import ALPHA

FOLDER = "stereotales_associations"
SUBFOLDER = {True: "associations_global", False: "associations_by_language"}


def file_name(model: str, scope: str) -> str:
    """The release's file name of one model and scope."""
    return f"{model.replace('/', '_').replace(chr(92), '_')}__{RELEASE_CODE.get(scope, scope)}.jsonl"


def p_value_flags(row: Any, family_exact: bool) -> dict[str, Any]:
    """The fields that say where a record's p-value comes from (the reference's ``statistics`` allows
    extra fields): ``p_value_exact`` true when the BH-adjusted p-value is the reference's, i.e. every
    raw p-value of its family (model, scope, base attribute) is the reference's own Monte-Carlo p;
    ``fisher_p_method`` how the pair's raw p-value was computed (``reference(<B>)``, or a sequential
    estimate ``monte-carlo(<B>)`` from B resamples)."""
    return {"p_value_exact": bool(family_exact), "fisher_p_method": str(row.p_method)}


def _statistics(row: Any, family_exact: bool = True) -> dict[str, Any]:
    """A tested pair's ``statistics`` object, from its associations_attributes row."""
    table = json.loads(row.table)
    counts = np.asarray(table["counts"], np.int64)
    base, compared = row.base_attribute, row.compared_attribute
    significant = float(row.p_adjusted) < ALPHA
    return {
        "alpha": ALPHA,
        "alpha_corrected": ALPHA,
        "p_value": float(row.p_adjusted),
        "cramer_v": float(row.cramers_v) if significant else -1,
        "effect_category": str(row.effect_size) if significant else NOT_SIGNIFICANT,
        "chi_square": float(chi2_contingency(counts, correction=False).statistic),
        "degrees_of_freedom": int((counts.shape[0] - 1) * (counts.shape[1] - 1)),
        "dim_table": [int(counts.shape[0]), int(counts.shape[1])],
        "contingency_table_data": {
            release_label(compared, col): {
                release_label(base, r): int(counts[i, j]) for i, r in enumerate(table["rows"])
            }
            for j, col in enumerate(table["cols"])
        },
        **p_value_flags(row, family_exact),
    }


def _associated_values(cells: pd.DataFrame, base: str, compared: str) -> list[dict[str, Any]]:
    """The pair's cells with BY-adjusted p < 0.05, in the table's order, as the release writes them."""
    kept = cells[cells["p_adjusted"].astype(float) < ALPHA]
    return [
        {
            "base_value": {"name": base, "value": release_label(base, c.base_value)},
            "compared_value": {"name": compared, "value": release_label(compared, c.compared_value)},
            "statistics": {"p_value": float(c.p_adjusted), "fraction": float(c.fraction), "lift": float(c.lift)},
        }
        for c in kept.itertuples(index=False)
    ]


def released_records(
    attributes: pd.DataFrame, values: pd.DataFrame, sample_ids: dict[tuple[str, str], list[str]]
) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(model, scope, record) for every tested pair of ``attributes`` (associations_attributes), its
    cells from ``values`` (associations_values) and ``sample_ids`` by (model, scope)."""
    cells = {key: group for key, group in values.groupby(["model", "scope", "base_attribute", "compared_attribute"])}
    family = ["model", "scope", "base_attribute"]
    exact = attributes.groupby(family)["p_exact"].transform("all") if len(attributes) else attributes["p_exact"]
    for row, family_exact in zip(attributes.itertuples(index=False), exact.astype(bool)):
        key = (row.model, row.scope, row.base_attribute, row.compared_attribute)
        mine = cells.get(key, values.iloc[:0])
        record = {
            "base_attribute": row.base_attribute,
            "compared_attribute": row.compared_attribute,
            "associated_values": _associated_values(mine, row.base_attribute, row.compared_attribute),
            "statistics": _statistics(row, family_exact),
            "generator_model": row.model,
            "sample_ids": sample_ids.get((row.model, row.scope), []),
            "aggregation_dimension": [] if row.scope == GLOBAL_SCOPE else ["language"],
            "aggregation_value": RELEASE_CODE.get(row.scope, row.scope),
        }
        yield row.model, row.scope, record


def sample_ids_by_slice(data: pd.DataFrame, passes: list[str]) -> dict[tuple[str, str], list[str]]:
    """(model, scope) -> the ids of every story of the model in the slice, for each pass, in ``data``'s
    order, one per story, as the reference writes ``sample_ids`` (its ``model_df["sample_id"].tolist()``).
    ``data``: stage 04's observations with ``sample_id`` (the release's, or the story id)."""
    out: dict[tuple[str, str], list[str]] = {}
    for name in passes:
        scope = data["language"] if name == "per_language" else pd.Series(GLOBAL_SCOPE, index=data.index)
        for (model, where), ids in data.groupby([data["model"], scope], sort=False)["sample_id"]:
            out[(str(model), str(where))] = [str(i) for i in ids]
    return out


def p_value_summary(attributes: pd.DataFrame) -> dict[str, Any]:
    """What ``pool.json`` says of the files' p-values (its ``p_values`` key): how many raw p-values are
    the reference's own Monte-Carlo p (``exact``) and how many are estimates of the sequential test
    (``estimated``), and in words how the estimates were made."""
    exact = attributes["p_exact"].astype(bool) if len(attributes) else pd.Series([], dtype=bool)
    return {
        "exact": int(exact.sum()),
        "estimated": int((~exact).sum()),
        "how": "exact: the reference's Monte-Carlo Fisher p (every resample of its stream seeded 42); estimated: "
        "associations.fisher: sequential stopped once BH's decision was settled, the p-value from the "
        "resamples its record's fisher_p_method counts (statistics.p_value_exact false)",
    }


def write_released(
    run_name: str,
    attributes: pd.DataFrame,
    values: pd.DataFrame,
    sample_ids: dict[tuple[str, str], list[str]],
    pool: dict[str, Any],
) -> Path:
    """Write the run's tests as StereoTales' association files (module docstring) under
    data/<run>/stereotales_associations/, with ``pool.json`` beside them (what the global pass pooled:
    ``pool``, the ``RELEASE_POOL`` keys; and ``p_values``: ``p_value_summary``), replacing the previous
    run's files whole: written into a temporary folder first, so a kill leaves the old folder or the new
    one, never a mix."""
    target = artifacts.path(run_name, "stereotales_associations")
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    handles: dict[Path, Any] = {}
    try:
        for model, scope, record in released_records(attributes, values, sample_ids):
            path = staging / SUBFOLDER[scope == GLOBAL_SCOPE] / file_name(model, scope)
            if path not in handles:
                path.parent.mkdir(parents=True, exist_ok=True)
                handles[path] = open(path, "w", encoding="utf-8")
            handles[path].write(json.dumps(record, ensure_ascii=False) + "\n")
    finally:
        for handle in handles.values():
            handle.close()
    staging.mkdir(parents=True, exist_ok=True)
    marker = {**pool, POOL_P_VALUES: p_value_summary(attributes)}
    (staging / POOL_FILE).write_text(json.dumps(marker, sort_keys=True) + "\n", encoding="utf-8")
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target
