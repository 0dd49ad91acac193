"""`make stage-times`: the per-stage table read from papermill's own reports (notebooks executed by
papermill with the storybias kernel, as `make` runs them) and the stages' manifests."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from stage_notebooks import tiny_stage_notebook
from storybias.core import io
from storybias.tools import stage_times

PAPERMILL = str(Path(sys.executable).parent / "papermill")


def papermill(notebook: Path, output: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [PAPERMILL, str(notebook), str(output), "-k", "storybias", "--no-progress-bar"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def sleeping_notebook(folder: Path, seconds: float) -> Path:
    path = folder / f"sleep-{seconds}.ipynb"
    nbformat.write(tiny_stage_notebook("seconds = 0.0", f"import time\ntime.sleep({seconds})"), path)
    return path


def test_the_table_times_each_executed_notebook_and_says_what_the_time_went_to(tmp_path):
    reports, data = tmp_path / "reports", tmp_path / "data"
    reports.mkdir()
    for name, seconds in (("03_extract", 0.1), ("01_generate", 1.5)):  # 03 first: the table orders by start
        assert papermill(sleeping_notebook(tmp_path, seconds), reports / f"{name}.ipynb").wait(timeout=120) == 0
    # a stage killed while papermill ran it: its work-in-progress report is not a stage's time
    running = papermill(sleeping_notebook(tmp_path, 60), reports / "04_associations.tmp.ipynb")
    deadline = time.time() + 120
    while not (reports / "04_associations.tmp.ipynb").exists() and time.time() < deadline:
        time.sleep(0.2)
    running.kill()
    running.wait(timeout=30)
    unfinished = json.loads((reports / "04_associations.tmp.ipynb").read_text())["metadata"]["papermill"]
    assert unfinished["start_time"] and unfinished["end_time"] is None, "papermill writes its report as it starts"
    generate = {
        "models": [
            {"model": "m-1.5b", "startup_seconds": 22.04, "n_generated_this_run": 1280, "n_reused": 20},
            {"model": "m-0.5b", "startup_seconds": 23.0, "n_generated_this_run": 60, "n_errors_this_run": 2},
        ]
    }
    generate["models"][0].update(generation_seconds=900.16, tokens_per_second=69.94)
    generate["models"][1].update(generation_seconds=44.71, tokens_per_second=None)
    extract = {
        "timings": {"m-1.5b": {"n_answers": 295, "n_step2_answers": 104, "extraction_seconds": 1627.8}},
        "n_parse_failed": 3,
    }
    io.write_json_atomic(generate, data / "manifest_generate.json")
    io.write_json_atomic(extract, data / "manifest_extract.json")

    rows = stage_times.collect(reports, data)

    assert [r.notebook for r in rows] == ["03_extract", "01_generate"]
    assert 1.5 <= rows[1].seconds < 60 and rows[0].seconds < rows[1].seconds
    assert rows[1].detail == (
        "m-1.5b: start 22.0 s, 1,280 stories (+20 reused) in 900.2 s at 69.9 tokens/s; "
        "m-0.5b: start 23.0 s, 60 stories in 44.7 s, 2 failed requests"
    )
    assert rows[0].detail == "m-1.5b: 295 answers + 104 step-2 in 1,627.8 s; 3 answers did not parse"
    table = stage_times.format_table(rows).splitlines()
    assert table[2].startswith("| 03_extract | ") and table[3].startswith("| 01_generate | ")
    span = (rows[1].ended - rows[0].started).total_seconds()
    assert table[-1].startswith(f"| all stages | | {int(round(span)) // 60} min ")


def test_a_run_with_nothing_finished_is_named_not_timed(tmp_path):
    with pytest.raises(stage_times.StageTimesError, match=r"reports: no executed stage notebook"):
        stage_times.collect(tmp_path / "reports", tmp_path / "data")
    (tmp_path / "reports").mkdir()
    report = tmp_path / "reports" / "02_filter.ipynb"
    report.write_text(json.dumps({"metadata": {"papermill": {"start_time": "2026-12-06T10:00:00+00:00"}}}))
    with pytest.raises(stage_times.StageTimesError, match=r"02_filter.ipynb: papermill did not finish"):
        stage_times.collect(tmp_path / "reports", tmp_path / "data")
