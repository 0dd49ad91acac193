"""One contract for every stage (issue #42, item 2; finished by issue #59, item 3): each stage's run(), stage 08's
included, returns a StageResult (the tables it wrote, its manifest, the values its notebook records, its
notes); each notebook runs its stage and records its values with one library call each, and computes
nothing: no helper, no grouping, pivot, aggregate, lambda or arithmetic, no file read (parsed with ``ast``)."""

from __future__ import annotations

import ast
import importlib
import json
import typing

import pytest

from storybias.core import artifacts, paths
from storybias.core.results import StageResult

ROOT = paths.repo_root()


@pytest.mark.parametrize("stage", artifacts.STAGES, ids=lambda s: s.token)
def test_every_stage_returns_the_one_result(stage):
    module = importlib.import_module(f"storybias.{stage.module}")
    assert typing.get_type_hints(module.run)["return"] is StageResult, stage.token


def _code_cells(notebook: str) -> list[str]:
    cells = json.loads((ROOT / notebook).read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


# What a notebook may not do in a code cell: a statistic or a reshaping belongs in lib/, tested there.
COMPUTING_METHODS = frozenset(
    {
        "groupby", "pivot_table", "pivot", "crosstab", "size", "mean", "sum", "median", "value_counts", "count",
        "nunique", "agg", "aggregate", "apply", "transform", "merge", "std", "var", "min", "max", "describe",
        "quantile", "cumsum", "corr", "assign", "map",
    }
)  # fmt: skip
ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.MatMult)
# Where a run's files are: a notebook names one only to show the schema written (io.artifact_schema).
RUN_FILE_LOOKUPS = frozenset(
    {"path", "manifest_path", "extractions_path", "filtered_path", "run_dir", "load_artifacts"}
)


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def computations(source: str) -> list[str]:
    """What a notebook code cell computes or reads itself, one entry per offending node: a helper (``def``,
    ``class``), a ``lambda``, arithmetic, a grouping / pivot / aggregate method, or a file read (``read_*``,
    ``open``, a run file's path); the data-contract cells' ``io.artifact_schema(artifacts.path(...))``, which
    shows the schema the stage wrote, is allowed."""
    tree = ast.parse(source)
    schema_args = {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _called_name(node) == "artifact_schema"
        for arg in node.args
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append(f"defines {node.name}")
        elif isinstance(node, ast.Lambda):
            found.append("lambda")
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ARITHMETIC):
            found.append(f"arithmetic {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and (name := _called_name(node)) is not None:
            if isinstance(node.func, ast.Attribute) and name in COMPUTING_METHODS:
                found.append(f"computes .{name}()")
            elif name.startswith("read_") or name == "open":
                found.append(f"reads a file: {ast.unparse(node)[:60]}")
            elif name in RUN_FILE_LOOKUPS and id(node) not in schema_args:
                found.append(f"reads a run file: {ast.unparse(node)[:60]}")
    return found


def test_the_cell_check_finds_each_kind_of_computation():
    assert computations('result["unknown_share"].T.round(2)\nresult.values["n_valid"]') == []
    assert computations("t.groupby(['a']).size()") == ["computes .size()", "computes .groupby()"]
    assert computations("x.assign(s=lambda t: t['r'] / t['f'])")[:2] == ["computes .assign()", "lambda"]
    assert computations("print(f'{(a - b)}')") == ["arithmetic a - b"]
    assert computations("import pandas as pd\npd.read_parquet(path)") == ["reads a file: pd.read_parquet(path)"]
    assert computations("if x:\n    def helper():\n        pass") == ["defines helper"]
    assert computations("display(io.artifact_schema(artifacts.path(run, 'vsr')))") == []
    assert computations("io.read_json(artifacts.path(run, 'm'))") == [
        "reads a file: io.read_json(artifacts.path(run, 'm'))",
        "reads a run file: artifacts.path(run, 'm')",
    ]
    assert computations("art = plots.load_artifacts(p.run_name)") == [
        "reads a run file: plots.load_artifacts(p.run_name)"
    ]


@pytest.mark.parametrize("stage", artifacts.STAGES, ids=lambda s: s.token)
def test_every_notebook_runs_its_stage_records_once_and_computes_nothing(stage):
    cells = _code_cells(stage.notebook)
    calls = [_called_name(n) for c in cells for n in ast.walk(ast.parse(c)) if isinstance(n, ast.Call)]
    assert "run" in calls, f"{stage.notebook}: never calls its stage's run()"
    recording = [c for c in cells if ".record(" in c]
    assert len(recording) == 1, f"{stage.notebook}: {len(recording)} cells record values"
    assert not any("record_values(" in c for c in cells), stage.notebook  # the stage builds its values
    assert len(recording[0].strip().splitlines()) <= 3, recording[0]
    # statistics, reshaping and helpers live in lib/, tested there; the notebook shows the stage's result
    offending = {cell[:60]: found for cell in cells if (found := computations(cell))}
    assert not offending, f"{stage.notebook} computes in its code cells: {offending}"


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
