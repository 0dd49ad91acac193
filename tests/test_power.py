"""storybias.stages.associations.power: the smallest lift stage 04 detects, simulated through the stage's own tests;
why a compared dimension is untestable; the stage's power artifact; `check-params`'s table and the lenses a
profile's size cannot feed (storybias.config.lenses)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from storybias.config import params
from storybias.config.lenses import lens_shortfalls
from storybias.core import paths
from storybias.evidence.stereotales_taxonomy import reference_taxonomy
from storybias.stages import associations as A
from storybias.stages import generate
from storybias.stages.associations import judge as J
from storybias.stages.associations import power as P
from storybias.stages.associations import tables
from storybias.stages.extract import answers as extract
from storybias.tools.synthetic_corpus import write_synthetic_corpus

DIMS = list(extract.dimensions())


@pytest.mark.parametrize("sizes,k,lift", [((30, 30, 30), 3, 2.5), ((20, 40, 60), 4, 2.0), ((50, 50), 3, 2.0)])
def test_planted_cell_has_the_asked_lift_and_other_rows_share_one_distribution(sizes, k, lift):
    probs = P.planted_probabilities(sizes, k, lift)
    expected = np.asarray(sizes, float)[:, None] * probs  # the table's expectation
    independent = np.outer(expected.sum(1), expected.sum(0)) / expected.sum()
    planted = int(np.argmin(sizes))
    assert expected[planted, 0] / independent[planted, 0] == pytest.approx(lift)
    np.testing.assert_allclose(probs.sum(1), 1.0)
    others = np.delete(probs, planted, axis=0)
    np.testing.assert_allclose(others, np.broadcast_to(others[0], others.shape))


def test_lifts_beyond_n_over_row_are_unreachable():
    assert P.planted_probabilities((40, 40), 3, 2.5) is None  # two equal values: at most lift 2
    assert P.planted_probabilities((40, 40, 40), 3, 3.5) is None
    assert P.planted_probabilities((40, 40), 3, 2.0)[1, 0] == 0.0  # lift exactly 2: the value only in one row


def test_power_is_high_for_a_large_lift_on_big_rows_and_near_zero_under_the_null():
    settings = P.PowerSettings(n_simulations=40, seed=3)
    assert P.simulate_power((150, 150, 150), 4, 2.8, settings) >= 0.95
    assert P.simulate_power((150, 150, 150), 4, 1.0, settings) <= 0.05
    assert P.simulate_power((150, 150), 4, 2.5, settings) is None


def test_the_simulation_calls_the_stage_tests(monkeypatch):
    """A stage that never retains a table detects nothing, whatever the lift: the simulation goes
    through associations.analyse_family, it does not test on its own."""
    real = tables.analyse_family

    def never_retained(base, tables, seed, max_resamples, fisher="reference"):
        assert fisher == "sequential"  # the reference's decisions, without every resample of every null table
        attrs, values = real(base, tables, seed, max_resamples, fisher)
        return attrs.assign(retained=False), values.iloc[0:0]

    monkeypatch.setattr(tables, "analyse_family", never_retained)
    assert P.simulate_power((150, 150, 150), 4, 2.8, P.PowerSettings(n_simulations=10)) == 0.0


def test_minimum_detectable_lift_shrinks_as_rows_grow():
    settings = P.PowerSettings(lifts=(2.0, 2.5, 3.0, 3.5), n_simulations=60, n_family=5)
    found = [P.minimum_detectable_lift((n,) * 4, 6, settings).min_detectable_lift for n in (12, 25, 60)]
    big = [np.inf if f is None else f for f in found]
    assert big == sorted(big, reverse=True) and big[0] > big[-1]
    assert all(f is None or f >= tables.MIN_LIFT for f in found)  # never below the stage's lift threshold


@pytest.mark.parametrize("n_simulations", [50, 33])  # 33: 0.8 x 33 is no whole number of hits
def test_sequential_stop_gives_the_full_run_decision(n_simulations):
    settings = P.PowerSettings(n_simulations=n_simulations, n_family=3)
    for lift in (2.0, 2.5, 3.0):
        full = P.simulate_power((25,) * 4, 6, lift, settings)
        _, early = P._simulate((25,) * 4, 6, lift, settings, decide=0.8)
        assert (full >= 0.8) == early


def test_untestable_rows_and_unreachable_lifts_say_why():
    assert P.minimum_detectable_lift((9, 9, 9), 3).reason == "untestable: < 10 known per value"
    result = P.minimum_detectable_lift((40, 40), 3, P.PowerSettings(lifts=(2.5, 3.0), n_simulations=10))
    assert result.min_detectable_lift is None and "no lift >= 2 possible" in result.reason


def test_rows_are_rounded_down_to_the_grid_from_the_smallest_kept_row():
    assert P.rounded_rows([43, 9, 61]) == [40, 40]  # the row under 10 is dropped, as the stage drops it
    assert P.rounded_rows([10, 11]) == [10, 10] and P.rounded_rows([9, 3]) == []
    assert P.rounded_rows([1234, 2000]) == [1200, 1200]
    assert all(a / b >= 0.75 for a, b in zip(P.ROW_GRID, P.ROW_GRID[1:]))  # at most 25% fewer stories


def test_disk_cache_is_keyed_and_reused(tmp_path, monkeypatch):
    settings = P.PowerSettings(lifts=(2.0, 3.0), n_simulations=20, n_family=2)
    first = P.minimum_detectable_lift((30, 20, 25), 3, settings, cache_dir=tmp_path)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and files[0].stem == P.cache_key((20, 25, 30), 3, settings)

    def boom(*args, **kwargs):
        raise AssertionError("should come from the cache")

    P._cached.cache_clear()
    monkeypatch.setattr(P, "_compute", boom)
    again = P.minimum_detectable_lift((20, 25, 30), 3, settings, cache_dir=tmp_path)
    assert again.min_detectable_lift == first.min_detectable_lift and again.power == first.power
    assert P.cache_key((20, 25, 30), 3, settings) != P.cache_key((20, 25, 30), 3, P.PowerSettings(seed=1))


@pytest.mark.parametrize(
    "counts,reason",
    [
        ([[0, 0], [0, 0], [0, 0]], "all unknown"),
        ([[3, 2], [4, 1], [12, 0]], "rows < 10 known stories: 2 of 3 values"),
        ([[3, 2], [4, 1], [2, 0]], "rows < 10 known stories: 3 of 3 values"),
        ([[12, 0], [15, 0], [3, 1]], "one known value"),
        ([[12, 3]], "one prompted value"),
        ([[12, 3], [4, 11]], ""),
    ],
)
def test_untestable_reason_on_constructed_tables(counts, reason):
    assert P.untestable_reason(np.array(counts)) == reason


def _stories(n_per_value: dict[str, int], education: dict[str, list[str]]) -> pd.DataFrame:
    rows = []
    for value, n in n_per_value.items():
        for i in range(n):
            row = {
                "model": "m",
                "language": "en",
                "cond_attribute": "income_level",
                "cond_value": value,
                **{f"demo_{d}": "unknown" for d in DIMS},
            }
            row["demo_education"] = education[value][i % len(education[value])]
            row["demo_gender"] = "woman"  # one known value everywhere
            row["demo_religion"] = "christian" if i < 3 else "unknown"  # few known
            rows.append(row)
    return pd.DataFrame(rows)


def test_power_table_says_which_dimensions_were_testable_and_why(tmp_path):
    data = _stories(
        {"low": 30, "middle": 30, "high": 30},
        {"low": ["basic", "graduate"], "middle": ["undergraduate", "basic"], "high": ["graduate"]},
    )
    settings = P.PowerSettings(lifts=(2.0, 3.0), n_simulations=20)
    table = P.power_table(data, DIMS, scope_by_language=False, settings=settings, cache_dir=tmp_path)
    by = table.set_index("compared_attribute")
    assert by.loc["education", "testable"] and by.loc["education", "reason"] == ""
    assert by.loc["education", "row_sizes"] == [30, 30, 30]
    assert by.loc["gender", "reason"] == "one known value"
    assert by.loc["religion", "reason"] == "rows < 10 known stories: 3 of 3 values"
    assert by.loc["age", "reason"] == "all unknown" and not by.loc["age", "testable"]
    assert np.isnan(by.loc["age", "min_detectable_lift"])
    assert "income_level" not in by.index  # never compared with itself
    head = by.loc[P.ALL_COMPARED]
    assert head["row_sizes"] == [30, 30, 30] and head["n_family"] == len(DIMS) - 1
    assert by.loc["education", "n_family"] == 1  # the stage's BH family: the tested dimensions only


def test_stage_writes_the_power_artifact_with_its_schema(tmp_path, monkeypatch):
    from test_associations_stage import _profile, _run_files

    _run_files(tmp_path / "data", planted=False)
    p = _profile(tmp_path, monkeypatch)
    monkeypatch.setattr(J, "run_judges", lambda *a, **k: pytest.fail("nothing is significant"))
    A.run(p, progress=False)
    path = paths.run_dir("t") / "associations_power.parquet"
    assert pq.read_schema(path).remove_metadata() == tables.OUTPUT_SCHEMAS["associations_power"]
    power = pd.read_parquet(path)
    assert set(power["scope"]) == {"all", "en", "fr"} and set(power["model"]) == {"m1", "m2"}
    pooled = power[(power["scope"] == "all") & (power["model"] == "m1")].set_index("compared_attribute")
    assert pooled.loc["education", "testable"] and pooled.loc["age", "reason"] == "all unknown"
    assert pooled.loc["education", "min_detectable_lift"] >= tables.MIN_LIFT
    assert list(pooled.loc[P.ALL_COMPARED, "row_sizes"]) == [80, 80, 80]
    per_language = power[(power["scope"] == "en") & (power["compared_attribute"] == "education")]
    assert per_language["testable"].all() and per_language["min_detectable_lift"].isna().all()  # pooled pass only
    head = power[(power["scope"] == "en") & (power["compared_attribute"] == P.ALL_COMPARED)]
    assert (head["min_detectable_lift"] >= tables.MIN_LIFT).all()
    assert list((paths.work_dir("t", "power")).glob("*.json"))  # cached under data/<run>/work/power/


def test_check_params_prints_the_power_table():
    root = paths.repo_root()
    env = {**os.environ, "PYTHONPATH": str(root / "lib")}
    proc = subprocess.run(
        [sys.executable, "-m", "storybias.cli", "check-params", str(root / "params" / "default.yaml")],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # the profile's own assumed share (associations.power_known_share: 0.3, measured for issue #15)
    assert "minimum detectable lift" in proc.stdout and "known share 0.3" in proc.stdout
    gender = next(line for line in lines if line.strip().startswith("gender"))
    # default: 12 scenarios x 3 languages = 36 stories per prompted value, 30% known: 10 (the stage's least)
    assert gender.split()[1:3] == ["36", "10"] and "untestable" not in gender


def test_planned_power_follows_the_known_share():
    from storybias.config import params

    profile = params.load(paths.repo_root() / "params" / "default.yaml")
    settings = P.PowerSettings(lifts=(2.0, 2.5, 3.0), n_simulations=30, n_family=18)
    table = P.planned_power(profile, known_share=1.0, settings=settings).set_index("base_attribute")
    assert table.loc["gender", "known_per_value"] == "36"
    assert table.loc["gender", "min_detectable_lift"] >= 2.0


def test_stage_without_testable_table_says_why_in_its_notes(tmp_path, monkeypatch):
    from test_associations_stage import _profile, _run_files

    _run_files(tmp_path / "data", planted=False, n_per_value=3)  # 6 stories per prompted value pooled: < 10
    p = _profile(tmp_path, monkeypatch)
    out = A.run(p, progress=False)
    assert out["attributes"].empty
    why = [n for n in out["notes"] if n.startswith("stage 04 found nothing to show")]
    assert why and "income_level (6/6/6 stories per prompted value): 0 of 18 compared dimensions testable" in why[0]
    assert "rows < 10 known stories: 3 of 3 values (1 dimension)" in why[0] and "all unknown (17 dimensions)" in why[0]


def _three_lenses(tmp_path, corpus: dict) -> params.Params:
    shipped = yaml.safe_load((paths.repo_root() / "params" / "stereotales-three-lenses.yaml").read_text())
    shipped["corpus"].update(corpus)
    path = tmp_path / f"lenses-{len(list(tmp_path.glob('*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(shipped))
    return params.load(path)


def test_check_params_names_the_lenses_a_size_cannot_feed(tmp_path, monkeypatch):
    """Issue #41 item 8: the three-lens profile's old size (300 stories per model x language over every
    prompted value) feeds none of its lenses; sized per prompted value on the gender prompts, it feeds all."""
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    root = tmp_path / "release"
    every_prompt = len(reference_taxonomy()["scenarios"]) * sum(
        "prompt" in words for values in reference_taxonomy()["dimensions"].values() for words in values.values()
    )
    attributes = tuple(reference_taxonomy()["dimensions"])
    write_synthetic_corpus(root, folders=("en", "fr"), samples_per_folder=every_prompt, attributes=attributes)
    shipped = _three_lenses(tmp_path, {"path": str(root)})
    assert lens_shortfalls(shipped, generate.plan(shipped), tables.MIN_ROW_TOTAL) == []
    old = _three_lenses(
        tmp_path, {"path": str(root), "sample": 300, "sample_per": "model_language", "attributes": None}
    )
    lines = lens_shortfalls(old, generate.plan(old), tables.MIN_ROW_TOTAL)
    assert any(line.startswith("association lens (stage 04), per-language pass") for line in lines)
    assert any(line.startswith("narrative lens (stage 05), prompted_gender") for line in lines)
    assert any(line.startswith("probe (stage 06)") and "probes.n_splits" in line for line in lines)

    root_dir = paths.repo_root()
    env = {**os.environ, "PYTHONPATH": str(root_dir / "lib"), "STORYBIAS_DATA": str(tmp_path / "data")}
    proc = subprocess.run(
        [sys.executable, "-m", "storybias.cli", "check-params", str(old.source)],
        capture_output=True,
        text=True,
        env=env,
        cwd=root_dir,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "lenses this profile's size cannot feed" in proc.stdout
    assert all(line in proc.stdout for line in lines)


def test_the_profiles_default_simulation_count_is_the_power_modules(tmp_path, monkeypatch):
    """``associations.power_simulations`` (config cannot import the stage) defaults to ``SIMULATIONS``,
    and check-params' planned power runs the profile's count."""
    assert params.AssociationSettings().power_simulations == P.SIMULATIONS
    raw = yaml.safe_load((paths.repo_root() / "params" / "smoke.yaml").read_text())
    raw.setdefault("associations", {})["power_simulations"] = 20
    (tmp_path / "coarse.yaml").write_text(yaml.safe_dump(raw))
    coarse = params.load(tmp_path / "coarse.yaml")
    seen: list[int] = []
    real = P.minimum_detectable_lift

    def spy(sizes, n_values, settings, cache_dir=None):
        seen.append(settings.n_simulations)
        return real(sizes, n_values, settings, cache_dir)

    monkeypatch.setattr(P, "minimum_detectable_lift", spy)
    P.planned_power(coarse, known_share=1.0)
    assert seen and set(seen) == {20}
