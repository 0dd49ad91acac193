"""scripts/compare-runs.py: two run folders compared table by table, cell by cell (issue #59's check
that the refactor changed no default output). Two tiny synthetic runs: identical ones report nothing,
and each kind of difference (a cell, a column, a row, a JSON value, a file on one side) is named."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare-runs.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compare_runs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(folder: Path) -> Path:
    """A run folder: a parquet table with floats, NaN and list cells, a CSV, a JSON and a dot file."""
    folder.mkdir(parents=True)
    table = pd.DataFrame(
        {
            "language": ["en", "fr", "zh"],
            "lift": [1.5, np.nan, 1 / 3],
            "n": [10, 20, 30],
            "values": [[1.0, 2.0], [], [0.1]],
        }
    )
    table.to_parquet(folder / "associations_values.parquet")
    (folder / "values").mkdir()
    pd.DataFrame({"model": ["a", "b"], "score": [0.25, 0.75]}).to_csv(folder / "values" / "scores.csv", index=False)
    manifest = {"stage": "associations", "counts": {"analysed": 108}, "p": [0.5, None], "notes": []}
    (folder / "manifest_associations.json").write_text(json.dumps(manifest))
    (folder / ".digests.json").write_text(json.dumps({"when": "now"}))
    return folder


def _differences(a: Path, b: Path) -> dict[str, list[str]]:
    return dict(_script().compare_runs(a, b))


def test_identical_runs_report_nothing_and_exit_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    (b / ".digests.json").write_text(json.dumps({"when": "later"}))  # dot entries are not outputs
    assert _script().main([str(a), str(b)]) == 0
    assert "0 of 3 table files differ" in capsys.readouterr().out


def test_floats_equal_within_the_relative_tolerance_only(tmp_path: Path) -> None:
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    table = pd.read_parquet(b / "associations_values.parquet")
    table.loc[2, "lift"] = (1 / 3) * (1 + 1e-14)
    table.to_parquet(b / "associations_values.parquet")
    assert _differences(a, b) == {}
    table.loc[2, "lift"] = (1 / 3) * (1 + 1e-9)
    table.to_parquet(b / "associations_values.parquet")
    (lines,) = _differences(a, b).values()
    assert len(lines) == 1 and lines[0].startswith("cells lift: 1 of 3 differ (row 2: 0.333")


def test_each_kind_of_difference_is_named(tmp_path: Path) -> None:
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    table = pd.read_parquet(b / "associations_values.parquet")
    table.at[0, "values"] = [1.0, 2.5]
    table.at[1, "language"] = "de"
    table["p_exact"] = 0.5
    pd.concat([table, table.iloc[:1]]).to_parquet(b / "associations_values.parquet")
    manifest = json.loads((b / "manifest_associations.json").read_text())
    manifest["counts"]["analysed"] = 107
    manifest["n_tables"] = 2
    (b / "manifest_associations.json").write_text(json.dumps(manifest))
    (b / "values" / "scores.csv").unlink()
    shutil.copy(a / "values" / "scores.csv", b / "new.csv")
    found = _differences(a, b)
    assert found == {
        "associations_values.parquet": [
            "columns only in A: []; only in B: ['p_exact']",
            "rows: 3 in A, 4 in B (cells compared on the first 3)",
            "cells language: 1 of 3 differ (row 1: 'fr' -> 'de')",
            "cells values: 1 of 3 differ (row 0: [1.0, 2.0] -> [1.0, 2.5])",
        ],
        "manifest_associations.json": ["key only in B: n_tables", "value counts.analysed: 108 -> 107"],
        "new.csv": ["only in B"],
        "values/scores.csv": ["only in A"],
    }


def test_a_missing_folder_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _run(tmp_path / "a")
    with pytest.raises(SystemExit) as exit_info:
        _script().main([str(a), str(tmp_path / "nowhere")])
    assert exit_info.value.code == 2
    assert "nowhere" in capsys.readouterr().err


def test_ignored_keys_leave_out_json_keys_and_columns_by_name(tmp_path: Path) -> None:
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    manifest = json.loads((b / "manifest_associations.json").read_text())
    manifest["timings"] = {"test_seconds": 4.7}
    (b / "manifest_associations.json").write_text(json.dumps(manifest))
    table = pd.read_parquet(b / "associations_values.parquet")
    table["lift"] = [2.0, 3.0, 4.0]
    table.to_parquet(b / "associations_values.parquet")
    assert set(_differences(a, b)) == {"associations_values.parquet", "manifest_associations.json"}
    assert dict(_script().compare_runs(a, b, ignore_keys=["timings", "lift"])) == {}
