"""Each cross-lens measure is declared once (issue #59 item 2; storybias.stages.crosslens.registry): one
registration adds a measure to MEASURES, LENS_OF, the table, its schema, the agreement table and the
figure, and the stage's inputs derive from what the registered parts read."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from storybias.config.params import CrossLensSettings
from storybias.core import artifacts
from storybias.stages import crosslens as stage
from storybias.stages.crosslens import measures as X
from storybias.stages.crosslens import registry as R
from storybias.stages.figures import crosslens_heatmap
from test_crosslens import write_run

TOY = "toy_stories"


@pytest.fixture
def toy_measure():
    """A toy lens with one measure (the number of filtered stories per cell), registered for the test only."""

    @R.register(reads=("filtered",), measures=(R.MeasureSpec(TOY, "toy_lens", "no filtered stories"),))
    def toy_part(run: R.LensInputs) -> R.CellMeasures:
        counts = run["filtered"].groupby(["model", "language"]).size()
        nan = float("nan")
        return {
            cell: {TOY: {"value": float(n), "low": nan, "high": nan, "n": int(n), "reason": ""}}
            for cell, n in counts.items()
        }

    yield TOY
    R.unregister("toy_part")


def test_one_registration_adds_a_measure_everywhere(tmp_path, monkeypatch, toy_measure):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    write_run(tmp_path / "data" / "x", {"a": (0.5, 0.5, 0.5), "b": (0.2, 0.2, 0.2), "c": (0.8, 0.1, 0.4)})
    filtered = pd.read_parquet(tmp_path / "data" / "x" / "filtered.parquet")  # a count that differs by model
    kept = filtered["model"].map({"a": 150, "b": 100, "c": 180}) - filtered["language"].map(
        {"en": 0, "fr": 9, "zh": 30}
    )
    filtered = filtered[filtered.groupby(["model", "language"]).cumcount() < kept]
    filtered.to_parquet(tmp_path / "data" / "x" / "filtered.parquet")
    assert X.MEASURES[-1] == stage.MEASURES[-1] == TOY and X.LENS_OF[TOY] == stage.LENS_OF[TOY] == "toy_lens"
    assert X.LENS_REASONS[TOY] == "no filtered stories" and X.INTERVALS[TOY] == ""
    table, agreement = X.run_tables("x", "child_gender", CrossLensSettings(n_permutations=100))
    assert list(table.columns) == R.crosslens_schema().names and f"reason_{TOY}" in table.columns
    counts = filtered.groupby(["model", "language"]).size()
    assert table.set_index(["model", "language"])[TOY].to_dict() == counts.astype(float).to_dict()
    toy_pairs = agreement[(agreement["measure_a"] == TOY) | (agreement["measure_b"] == TOY)]
    n = len(X.MEASURES)  # the eight built-in measures, any other registered one, and the toy
    assert (
        len(agreement) == n * (n - 1) // 2 and len(toy_pairs) == n - 1 and set(toy_pairs["kind"]) == {"across lenses"}
    )
    assert np.isfinite(toy_pairs["r_within_language"].astype(float)).any()
    fig, stats = crosslens_heatmap(table, agreement)  # the figure draws what the table holds
    assert stats["n_measures"] == n
    fig.clear()


def test_unregistering_restores_the_table_and_a_taken_name_or_unknown_artifact_is_refused(toy_measure):
    n = len(X.MEASURES)
    with pytest.raises(ValueError, match="must be new and distinct"):
        R.register(reads=("filtered",), measures=(R.MeasureSpec(TOY, "x", "y"),))(lambda run: {})
    with pytest.raises(KeyError, match="no artifact 'nope' in the registry"):
        R.register(reads=("nope",), measures=(R.MeasureSpec("other", "x", "y"),))(lambda run: {})
    R.unregister("toy_part")
    try:
        assert len(X.MEASURES) == n - 1 and TOY not in X.MEASURES and TOY not in X.LENS_OF
        assert R.crosslens_schema() == X.CROSSLENS_SCHEMA  # the artifact's schema holds every registered measure
    finally:  # the fixture unregisters it again
        R.register(reads=("filtered",), measures=(R.MeasureSpec(TOY, "toy_lens", "-"),))(_named_toy_part)


def _named_toy_part(run: R.LensInputs) -> R.CellMeasures:
    return {}


_named_toy_part.__name__ = "toy_part"


def test_a_part_reads_only_what_it_declares():
    inputs = R.LensInputs({"filtered": pd.DataFrame()}, None, CrossLensSettings())
    with pytest.raises(KeyError, match="'metrics_jsd' is not among the part's declared reads"):
        inputs["metrics_jsd"]


def test_the_stage_inputs_are_what_the_registered_parts_read():
    """The cross-lens stage's inputs (what it checks, and core.artifacts' STAGES, which the Makefile's
    prerequisites come from) are the Make targets of the stages whose tables the parts read, less those
    another one is built from (extractions and filtered come before stage 04's manifest)."""
    reads = R.part_reads()
    assert {"extractions", "associations_values", "metrics_jsd", "metrics_aggregates", "probes_per_model"} <= set(reads)
    assert {"manifest_associations", "manifest_metrics", "manifest_probes"} <= set(stage.INPUTS)
    assert R.stage_inputs(reads) == stage.INPUTS
    assert tuple(sorted(artifacts.STAGE_BY_TOKEN["crosslens"].reads)) == stage.INPUTS
    assert R.stage_inputs(["vsr", "extractions"]) == ("extractions",)  # vsr is written before extractions
