"""nbval over every committed notebook, on the finished smoke run of the slow tests, then the named
values the notebooks recorded and the figures and explorer they produced.

Stages 01-03 are finished by then (fixtures in conftest.py), so their notebooks find nothing left to
compute and re-run their analysis cells from the stored data; 04-07 compute for real. `--nbval-lax`:
every cell must run without error, and the cells marked `# NBVAL_CHECK_OUTPUT` must reproduce the
committed outputs (the default run's, copied in by `make publish-notebooks`) after
tests/nbval_sanitize.cfg has replaced run names, paths and durations. Those are the outputs that depend
neither on the profile nor on what the LLM wrote: every stage's data-contract cell (column names and
Arrow types of its artifacts, which the stages write with explicit schemas). Counts and statistics
computed from generated text vary between runs and are checked by the named-value tests below.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from storybias.core import paths
from storybias.stages import figures as plots

pytestmark = pytest.mark.slow
NOTEBOOKS = [
    f"notebooks/{n}.ipynb"
    for n in (
        "01_generate",
        "02_filter",
        "03_extract",
        "04_associations",
        "05_metrics",
        "06_probes",
        "07_crosslens",
        "08_figures",
    )
]


@pytest.fixture(scope="module")
def nbval_run(extracted, smoke_profile):
    path, env, tmp = smoke_profile
    env = dict(env, STORYBIAS_PARAMS=str(path), STORYBIAS_FIGURES=str(tmp / "figures"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--nbval-lax",
            "--nbval-sanitize-with",
            "tests/nbval_sanitize.cfg",
            "--nbval-kernel-name",
            "storybias",
            "--nbval-cell-timeout",
            "900",
            *NOTEBOOKS,
        ],
        cwd=paths.repo_root(),
        env=env,
        capture_output=True,
        text=True,
    )
    return proc, Path(env["STORYBIAS_DATA"]) / "pytest-kill", tmp / "figures" / "pytest-kill", env


def test_committed_notebooks_pass_nbval(nbval_run):
    proc = nbval_run[0]
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout


def _values(data: Path, stage: str) -> dict:
    return json.loads((data / "values" / f"{stage}.json").read_text())


def _nan_to_none(value: object) -> object:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def test_named_values_of_stage_04_are_what_its_tables_say(nbval_run):
    """Notebook 04's recorded counts equal the counts of the tables stage 04 wrote, and the stories
    it analysed are the parsed stereotales extractions."""
    _, data, _, _ = nbval_run
    values = _values(data, "associations")
    attributes = pd.read_parquet(data / "associations_attributes.parquet")
    cells = pd.read_parquet(data / "associations_values.parquet")
    ratings = pd.read_parquet(data / "harm_ratings.parquet")
    assert values["n_tables"] == len(attributes)
    assert values["n_retained"] == int(attributes["retained"].sum()) <= values["n_tables"]
    assert values["n_significant"] == int(cells["significant"].sum())
    assert values["n_ratings"] == len(ratings)
    stories = pd.read_parquet(data / "filtered.parquet")
    extractions = pd.read_parquet(data / "extractions.parquet").merge(stories[["story_id", "design"]], on="story_id")
    assert values["n_stories"] == int(((extractions["design"] == "stereotales") & extractions["parse_ok"]).sum())
    # smoke: 3 stereotales stories cannot fill a row of 10, so nothing is tested and no judge starts
    assert values["n_stories"] <= 3 and values["n_tables"] == 0 and values["n_ratings"] == 0


def test_named_values_of_stage_06_are_what_its_tables_say(nbval_run):
    _, data, _, _ = nbval_run
    values = _values(data, "probes")
    manifest = json.loads((data / "manifest_probes.json").read_text())
    probes = pd.read_parquet(data / "probes.parquet")
    separability = pd.read_parquet(data / "separability.parquet")
    assert values["n_sampled"] == manifest["counts"]["sampled"] and values["n_paired"] == manifest["counts"]["paired"]
    assert values["n_probe_rows"] == len(probes)
    assert values["n_probe_rows_ok"] == int((probes["status"] == "ok").sum())
    assert values["separability"] == {r.version: _nan_to_none(r.balanced_accuracy) for r in separability.itertuples()}
    ok = probes[probes["variant"].isin(["full", "cue_deleted", "delta"]) & (probes["status"] == "ok")]
    assert values["auc"] == {f"{r.language}/{r.genre}/{r.variant}": _nan_to_none(r.auc) for r in ok.itertuples()}
    figures = _values(data, "figures")
    assert figures["n_figures"] == len(plots.FIGURES) and figures["stems"][0] == "01_vsr_heatmap"


def test_every_figure_is_written_as_png_and_pdf_with_an_index(nbval_run):
    _, _, figures, _ = nbval_run
    index = json.loads((figures / "figures.json").read_text())
    assert len(index["figures"]) == len(plots.FIGURES)
    for record in index["figures"]:
        png, pdf = (figures / f"{record['stem']}.{ext}" for ext in ("png", "pdf"))
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pdf.read_bytes()[:4] == b"%PDF", record["stem"]
        assert record["quote"], record["stem"]
    # the smoke run has valid stories in English: the valid-story-rate figure has data
    assert not next(r for r in index["figures"] if r["stem"] == "01_vsr_heatmap")["no_data"]


def test_explorer_page_from_the_smoke_run(nbval_run, smoke_profile):
    _, data, figures, env = nbval_run
    proc = subprocess.run(
        [sys.executable, "-m", "storybias.cli", "explorer", str(smoke_profile[0])],
        cwd=paths.repo_root(),
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (figures / "explorer.html").read_text(encoding="utf-8")
    stories = pd.read_parquet(data / "filtered.parquet")
    assert len(stories) and all(sid in page for sid in stories["story_id"])
