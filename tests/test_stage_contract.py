"""One contract for every stage (issue #42, item 2): each stage's run() returns a StageResult (the tables
it wrote, its manifest, the values its notebook records, its notes), and each notebook records its values
with one library call instead of building them cell by cell."""

from __future__ import annotations

import importlib
import json
import typing

import pytest

from storybias.core import artifacts, paths
from storybias.core.results import StageResult

ROOT = paths.repo_root()


@pytest.mark.parametrize("stage", [s for s in artifacts.STAGES if s.token != "figures"], ids=lambda s: s.token)
def test_every_stage_returns_the_one_result(stage):
    module = importlib.import_module(f"storybias.{stage.module}")
    assert typing.get_type_hints(module.run)["return"] is StageResult, stage.token


def _code_cells(notebook: str) -> list[str]:
    cells = json.loads((ROOT / notebook).read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


@pytest.mark.parametrize("stage", artifacts.STAGES, ids=lambda s: s.token)
def test_every_notebook_records_its_values_with_one_call_and_defines_no_helper(stage):
    cells = _code_cells(stage.notebook)
    recording = [c for c in cells if ".record(" in c]
    assert len(recording) == 1, f"{stage.notebook}: {len(recording)} cells record values"
    assert not any("record_values(" in c for c in cells), stage.notebook  # the stage builds its values
    assert len(recording[0].strip().splitlines()) <= 3, recording[0]
    for cell in cells:  # statistics and helpers live in lib/, tested there
        assert not any(line.startswith(("def ", "class ")) for line in cell.splitlines()), (stage.notebook, cell[:80])


def test_a_result_answers_by_name_and_records_under_its_stage_token(tmp_path, monkeypatch):
    import pandas as pd

    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path))
    result = StageResult("metrics", "r", tables={"sc": pd.DataFrame({"a": [1]})}, values={"n": 3}, details={"k": 1})
    assert result["sc"].shape == (1, 1) and result["k"] == 1 and result["values"] == {"n": 3}
    assert result.get("nope") is None and "sc" in result and list(result) == ["sc", "k"]
    with pytest.raises(KeyError, match="stage metrics has no table or detail 'nope'"):
        result["nope"]
    result.record()
    assert json.loads((tmp_path / "r" / "values" / "metrics.json").read_text()) == {"n": 3}
