"""`make publish-notebooks` (storybias.tools.publish): the committed notebooks take the outputs of a
run's executed copies, keep their own cells, and refuse a copy of other code."""

from __future__ import annotations

import shutil

import nbformat
import pytest

from storybias.core import paths
from storybias.core.artifacts import STAGES
from storybias.tools.publish import StaleRun, merge_outputs, publish_notebooks


def _notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('params_file = "params/default.yaml"', metadata={"tags": ["parameters"]})
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), params, nbformat.v4.new_code_cell("result = 1 + 1")]
    return nb


def _executed(committed: nbformat.NotebookNode, root: str) -> nbformat.NotebookNode:
    """What papermill writes: an injected-parameters cell, outputs, its metadata."""
    run = nbformat.from_dict(committed)
    injected = nbformat.v4.new_code_cell(
        'params_file = "/abs/params/smoke.yaml"', metadata={"tags": ["injected-parameters"]}
    )
    run.cells.insert(2, injected)
    run.cells[3].outputs = [
        nbformat.v4.new_output("stream", name="stdout", text=f"wrote {root}/data/default/x.parquet\n")
    ]
    run.cells[3].execution_count = 3
    run.cells[3].metadata["papermill"] = {"duration": 1.5}
    run.metadata["papermill"] = {"parameters": {"params_file": "params/default.yaml"}}
    return run


def test_outputs_are_copied_and_papermills_additions_dropped():
    root = str(paths.repo_root())
    committed = _notebook()
    merged = merge_outputs(committed, _executed(committed, root), "x.ipynb")
    assert [c.source for c in merged.cells] == [c.source for c in committed.cells]  # no injected cell
    assert [c.get("id") for c in merged.cells] == [c.get("id") for c in committed.cells]
    assert merged.cells[2].outputs[0]["text"] == "wrote data/default/x.parquet\n"  # the machine's path is gone
    assert merged.cells[2].execution_count == 3
    assert "papermill" not in merged.metadata and "papermill" not in merged.cells[2].metadata
    assert committed.cells[2].outputs == []  # the input is left as it was


def test_a_notebook_changed_since_the_run_is_refused_naming_the_cell():
    committed = _notebook()
    executed = _executed(committed, str(paths.repo_root()))
    committed.cells[2].source = "result = 2 + 2"
    with pytest.raises(StaleRun, match=r"x.ipynb: cell 2 changed since the run"):
        merge_outputs(committed, executed, "x.ipynb")
    committed.cells.append(nbformat.v4.new_markdown_cell("more"))
    with pytest.raises(StaleRun, match="the run executed 3 cells, the notebook has 4"):
        merge_outputs(committed, executed, "x.ipynb")


def test_publish_checks_every_report_before_writing_any(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "repo_root", lambda: tmp_path)
    notebooks, reports = tmp_path / "notebooks", tmp_path / "reports" / "default"
    notebooks.mkdir()
    reports.mkdir(parents=True)
    for stage in STAGES:
        nbformat.write(_notebook(), notebooks / stage.notebook.split("/")[1])
    for stage in STAGES[:-1]:
        nbformat.write(_executed(_notebook(), str(tmp_path)), reports / stage.notebook.split("/")[1])
    before = {p.name: p.read_text() for p in notebooks.iterdir()}
    with pytest.raises(FileNotFoundError, match=r"08_figures.ipynb: no executed notebook; run `make paper`"):
        publish_notebooks("default")
    assert {p.name: p.read_text() for p in notebooks.iterdir()} == before  # nothing written
    shutil.copy(reports / "01_generate.ipynb", reports / "08_figures.ipynb")
    written = publish_notebooks("default")
    assert [p.name for p in written] == [s.notebook.split("/")[1] for s in STAGES]
    published = nbformat.read(notebooks / "08_figures.ipynb", as_version=4)
    assert published.cells[2].outputs[0]["text"] == "wrote data/default/x.parquet\n"
    nbformat.validate(published)


def test_a_kernels_virtual_environment_outside_the_repository_is_shortened_too():
    """A kernel installed from another checkout (a worktree) warns from its own .venv: that machine
    path is not the repository's, and is shortened all the same."""
    committed = _notebook()
    executed = _executed(committed, str(paths.repo_root()))
    warning = "/home/someone/wt42/.venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: x\n"
    executed.cells[3].outputs.append(nbformat.v4.new_output("stream", name="stderr", text=warning))
    merged = merge_outputs(committed, executed, "x.ipynb")
    assert merged.cells[2].outputs[1]["text"] == ".venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: x\n"
