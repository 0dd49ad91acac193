"""`make bench-engine` (storybias.tools.bench_engine): the trials' order and labels, and its refusals.
Its trials start real engines, so the sitting itself is run by hand (docs/measurements/README.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from storybias.evidence.recorded import recorded
from storybias.tools import bench_engine
from storybias.tools.bench_engine import SETTINGS, compile_cache_state, trial_order


def test_every_setting_runs_once_per_repeat_in_alternating_order():
    order = trial_order(SETTINGS, 3)
    assert [o[0] for o in order] == [1] * len(SETTINGS) + [2] * len(SETTINGS) + [3] * len(SETTINGS)
    first, second, third = ([o[1:] for o in order if o[0] == r] for r in (1, 2, 3))
    assert first == list(SETTINGS) == third and second == list(SETTINGS)[::-1]


def test_only_the_sittings_first_compiled_start_meets_an_empty_cache():
    rows = []
    for _repeat, engine, preload, _sampler in trial_order(SETTINGS, 2):
        rows.append({"engine": engine, "preload": preload, "compile_cache": compile_cache_state(engine, rows)})
    states = [(r["engine"], r["compile_cache"]) for r in rows]
    assert states.count(("compiled", "empty")) == 1 and states.count(("compiled", "warm")) == 1
    assert len(states) == 2 * len(SETTINGS)
    assert {state for engine, state in states if engine == "eager"} == {"-"}


def test_the_rows_fit_the_recorded_file_and_its_labels():
    recorded_table = recorded("engine_settings")
    assert tuple(recorded_table.columns) == bench_engine.COLUMNS
    assert set(recorded_table["engine"]) == {engine for engine, _, _ in SETTINGS}
    assert set(recorded_table["preload"]) == {preload for _, preload, _ in SETTINGS}
    assert set(recorded_table["sampler"]) == {sampler for _, _, sampler in SETTINGS}


def test_a_failed_write_keeps_the_trials_written_before(tmp_path):
    """The sitting rewrites its CSV after every trial (a kill keeps what was measured): a write that fails
    midway leaves the previous file whole, not a truncated one."""
    out = tmp_path / "bench_engine.csv"
    row = {column: "x" for column in bench_engine.COLUMNS}
    bench_engine._write([row, row], out)
    before = out.read_text(encoding="utf-8")
    assert len(before.splitlines()) == 3
    with pytest.raises(ValueError):
        bench_engine._write([row, {**row, "not a column": 1}], out)  # DictWriter raises on the second row
    assert out.read_text(encoding="utf-8") == before
    assert [p.name for p in tmp_path.iterdir()] == ["bench_engine.csv"]  # no temporary left


@pytest.mark.parametrize(
    "command, sign_of_work",
    [("bench-engine", "engine"), ("decode-ceiling", "gflop")],  # decode-ceiling loads its profile the same way
)
def test_a_bad_profile_is_named_before_any_engine_starts_or_anything_is_timed(tmp_path, command, sign_of_work):
    bad = tmp_path / "bad.yaml"
    bad.write_text("generation: {seed: forty-two}\n")
    done = subprocess.run(
        [sys.executable, "-m", "storybias.cli", command, str(bad)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and str(bad) in done.stderr
    assert sign_of_work not in done.stdout.lower()
