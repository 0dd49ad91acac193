"""Stage 07: the three studies' lenses side by side, after stages 04-06 (issues #30, #41, #42).

storybias applies StereoTales, BiasedTales-ML and Feng et al. to one run, so it can ask what none of the
three could: do models that look biased through one lens look biased through the others? This stage reads
each lens's headline measure per model x language from the stage that computed it (stage 04's
associations, stage 05's narrative and occupation metrics, stage 06's per-model probes;
``storybias.stages.crosslens.measures``) and tests the agreement of every pair of measures
(``storybias.stats.concordance``). It computes no lens itself, so changing one stage's parameters reruns
that stage and this one, not the others.

Writes ``crosslens.parquet``, ``crosslens_agreement.parquet`` and, last (Make's target),
``manifest_crosslens.json``.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from storybias.config.params import Params
from storybias.core import artifacts
from storybias.core.io import write_json_atomic
from storybias.core.locks import holds_run_lock
from storybias.core.results import StageResult
from storybias.stages.crosslens.measures import LENS_OF, MEASURES, run_tables
from storybias.stages.crosslens.registry import part_reads, stage_inputs

# the Make targets of the stages whose artifacts the registered measures read (a target another is built
# from left out): core.artifacts' STAGES says the same (tests/test_crosslens.py)
INPUTS = stage_inputs(part_reads())


def _values(lenses: pd.DataFrame, agreement: pd.DataFrame) -> dict[str, Any]:
    """The named values notebook 07 records: the table's size, what is missing, what was found."""
    n_entries = len(lenses) * len(MEASURES)
    missing = int(sum(lenses[m].isna().sum() for m in MEASURES)) if len(lenses) else 0
    findings = agreement["finding"].value_counts().to_dict() if len(agreement) else {}
    return {
        "n_cells": int(len(lenses)),
        "n_entries": n_entries,
        "n_missing": missing,
        "n_pairs": int(len(agreement)),
        "findings": {str(k): int(v) for k, v in findings.items()},
    }


@holds_run_lock("crosslens")
def run(params: Params) -> StageResult:
    """The cross-lens table and the agreement of its measures from the run's stage 04-06 tables; a stage
    that did not run gives its lens's reasons (``reason_<measure>``), never a blank."""
    run_name = params.run_name
    missing = [name for name in INPUTS if not artifacts.path(run_name, name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{', '.join(str(artifacts.path(run_name, m)) for m in missing)} missing: run stages 04-06 first "
            "(make associations metrics probes)"
        )
    lenses, agreement = run_tables(run_name, params.crosslens_comparison(), params.crosslens)
    artifacts.write(run_name, "crosslens", lenses)
    artifacts.write(run_name, "crosslens_agreement", agreement)
    notes = [
        f"{m}: {n} of {len(lenses)} cells missing"
        for m in MEASURES
        if len(lenses) and (n := int(lenses[m].isna().sum()))
    ]
    values = _values(lenses, agreement)
    manifest = {
        "stage": "crosslens",
        "comparison": params.crosslens_comparison(),
        "lenses": LENS_OF,
        **values,
        "notes": notes,
        "params": params.resolved()["crosslens"],
    }
    write_json_atomic(manifest, artifacts.manifest_path(run_name, "crosslens"))
    return StageResult(
        "crosslens",
        run_name,
        tables={"crosslens": lenses, "crosslens_agreement": agreement},
        manifest=manifest,
        values=values,
        notes=notes,
    )
