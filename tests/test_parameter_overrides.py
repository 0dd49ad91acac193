"""Issue #59 item 8, the students' path: one parameter changed in a notebook's parameters cell, with
papermill or with `make <stage> SET=...`, validated by the one schema, written to a run of its own beside
the base run (which stays byte for byte as it was), with a "what moved" table against the base run.

The base run is stage 04's inputs without a model (tests/test_associations_stage.py's files, no planted
association: the judge never starts), its earlier stages' Make targets and stamps in place, as a finished
run leaves them; the change reruns stage 04 alone, through its notebook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from storybias.config import params
from storybias.config.overrides import derived_run_name, parse_set
from storybias.core import derived_runs, paths
from storybias.core.run_folders import claim
from storybias.stages import associations as A
from test_associations_stage import _run_files
from test_reliability import make

ROOT = paths.repo_root()
BASE = "t"
ONE_PASS = "associations.passes=[global]"  # stage 04 tests the global pass only: fewer tables
DERIVED = derived_run_name(BASE, parse_set(ONE_PASS))


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()
    }


def _base_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, str]]:
    """A finished base run up to stage 04 (targets newer than their stamps, in stage order) and its profile."""
    env = {"STORYBIAS_DATA": str(tmp_path / "data"), "STORYBIAS_FIGURES": str(tmp_path / "figures")}
    env["STORYBIAS_MODELS"] = str(tmp_path / "no-models")  # a stage that would need a model fails at once
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["run_name"] = BASE
    params_file = tmp_path / "t.yaml"
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    _run_files(tmp_path / "data", planted=False)
    p = params.load(params_file)
    stamps = params.write_stage_stamps(p, claim(BASE) / ".params")
    run = paths.run_dir(BASE)
    (run / "stories.parquet").write_text("stand-in: stage 04 does not read it")
    A.run(p, progress=False).record()
    reports = run / "reports"
    reports.mkdir()
    for name in ("01_generate", "02_filter", "03_extract", "04_associations"):
        (reports / f"{name}.ipynb").write_text("{}")
    in_order = ["stories.parquet", "reports/01_generate.ipynb", "filtered.parquet", "reports/02_filter.ipynb"]
    in_order += ["extractions.parquet", "reports/03_extract.ipynb", "manifest_associations.json"]
    in_order += ["reports/04_associations.ipynb"]
    inputs = [*(ROOT / "notebooks").glob("*.ipynb"), *(ROOT / "params").rglob("*.yaml")]  # Make's other inputs
    start = max(int(time.time()) - 20, *(int(f.stat().st_mtime) + 1 for f in inputs))
    for stamp in stamps:
        os.utime(stamp, (start, start))
    for i, name in enumerate(in_order, start=1):
        os.utime(run / name, (start + i, start + i))
    return params_file, dict(os.environ, **env)


def test_make_with_set_writes_a_run_of_its_own_reruns_stage_04_only_and_prints_what_moved(tmp_path, monkeypatch):
    params_file, env = _base_run(tmp_path, monkeypatch)
    base = _snapshot(paths.run_dir(BASE))

    done = make("associations", f"PARAMS={params_file}", f"SET={ONE_PASS}", "SERVE=0", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "== stage associations" in done.stdout and "== stage extract" not in done.stdout, done.stdout
    assert _snapshot(paths.run_dir(BASE)) == base, "the base run is untouched, byte for byte"
    derived = paths.run_dir(DERIVED)
    assert derived.parent == paths.run_dir(BASE).parent and (derived / "reports" / "04_associations.ipynb").is_file()
    before = json.loads((paths.run_dir(BASE) / "values" / "associations.json").read_text())
    after = json.loads((derived / "values" / "associations.json").read_text())
    assert after["n_tables"] < before["n_tables"]
    assert f"what moved: run '{DERIVED}' against its base run '{BASE}'" in done.stdout
    moved = [line.split() for line in done.stdout.splitlines() if line.startswith("associations ")]
    assert ["associations", "n_tables", str(before["n_tables"]), str(after["n_tables"])] in moved, done.stdout

    again = make("what-moved", f"PARAMS={params_file}", f"SET={ONE_PASS}", env=env)
    assert again.returncode == 0 and f"n_tables  {before['n_tables']}" in again.stdout.replace("   ", "  ")


def test_papermill_overrides_in_the_parameters_cell_run_beside_the_base_and_show_what_moved(tmp_path, monkeypatch):
    params_file, env = _base_run(tmp_path, monkeypatch)
    base = _snapshot(paths.run_dir(BASE))
    output = tmp_path / "04.ipynb"
    command = [sys.executable, "-m", "papermill", str(ROOT / "notebooks" / "04_associations.ipynb"), str(output)]
    command += ["-k", "storybias", "--cwd", str(ROOT / "notebooks"), "--no-progress-bar"]
    command += ["-p", "params_file", str(params_file), "-p", "overrides", ONE_PASS]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _snapshot(paths.run_dir(BASE)) == base, "the base run is untouched, byte for byte"
    assert (paths.run_dir(DERIVED) / "values" / "associations.json").is_file()
    shown = nbformat.read(output, 4).cells[-1].outputs[0]["data"]["text/plain"]
    assert "n_tables" in shown and "this_run" in shown, shown


def test_a_bad_override_is_refused_naming_the_key_before_any_work(tmp_path, monkeypatch):
    params_file, env = _base_run(tmp_path, monkeypatch)
    base = _snapshot(paths.run_dir(BASE))
    refused = make("associations", f"PARAMS={params_file}", "SET=associations.passess=[global]", env=env)
    assert refused.returncode != 0 and "associations.passess: unknown key" in refused.stderr, refused.stderr
    refused = make("associations", f"PARAMS={params_file}", "SET=associations.power_known_share=2", env=env)
    assert refused.returncode != 0 and "associations.power_known_share: Input should be" in refused.stderr
    assert {p.name for p in paths.data_root().iterdir()} == {BASE}, "no run folder for a refused override"
    assert _snapshot(paths.run_dir(BASE)) == base
    with pytest.raises(params.ParamsError, match="associations.passes"):
        params.load(params_file, {"associations.passes": ["both"]})
    with pytest.raises(params.ParamsError, match="run_name: cannot be overridden"):
        params.load(params_file, "run_name=other")
    with pytest.raises(params.ParamsError, match=r"'associations': write it as key.path=value"):
        params.load(params_file, "associations")


def test_the_derived_run_name_is_readable_when_it_can_be_and_a_digest_otherwise():
    assert derived_run_name("default", {"associations.power_known_share": 0.25}) == (
        "default--associations.power_known_share-0.25"
    )
    assert derived_run_name("default", {}) == "default"
    digest = derived_run_name("default", {"associations.passes": ["global"]})
    assert digest.startswith("default--set-") and digest != derived_run_name("default", {"associations.passes": []})
    assert derived_run_name("d", {"a.b": 1, "c.d": "x"}) == derived_run_name("d", {"c.d": "x", "a.b": 1})
    long = derived_run_name("r" * 100, {"associations.power_known_share": 0.25})
    assert len(long) == 100 and paths.RUN_NAME.match(long)
    assert parse_set("a.b=1 c.d=x e=true f=[1, 2]".replace(", ", ",")) == {"a.b": 1, "c.d": "x", "e": True, "f": [1, 2]}


def test_what_moved_lists_exactly_the_values_that_differ(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path))
    for run, values in (("b", {"n": 3, "same": 1, "f": {"x": True}, "gone": 2}), ("b--n-4", {"n": 4, "same": 1})):
        (tmp_path / run / "values").mkdir(parents=True)
        (tmp_path / run / "values" / "associations.json").write_text(json.dumps(values))
    table = derived_runs.what_moved("b", "b--n-4")
    assert table.values.tolist() == [
        ["associations", "f.x", True, "(not recorded)"],
        ["associations", "gone", 2, "(not recorded)"],
        ["associations", "n", 3, 4],
    ]
    assert derived_runs.what_moved("b", "b").empty
    assert "no recorded value differs" in derived_runs.format_what_moved("b", "b", derived_runs.what_moved("b", "b"))
