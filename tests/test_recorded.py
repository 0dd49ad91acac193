"""Recorded measurements (docs/measurements/, storybias.evidence.recorded): the tables notebook 03
shows instead of hand-typed numbers."""

from __future__ import annotations

import pandas as pd
import pytest

from storybias.config import params
from storybias.core import paths
from storybias.evidence.recorded import RECORDED_COLUMNS, recorded, step2_fills

ROOT = paths.repo_root()


def test_every_recorded_table_loads_and_is_described():
    readme = (ROOT / "docs" / "measurements" / "README.md").read_text()
    on_disk = {p.stem for p in (ROOT / "docs" / "measurements").glob("*.csv")}
    assert on_disk == set(RECORDED_COLUMNS)
    for name in RECORDED_COLUMNS:
        assert f"`{name}.csv`" in readme
        assert len(recorded(name)) > 0


def test_extraction_designs_name_the_default_and_say_why_each_retired_one_lost():
    table = recorded("extraction_designs")
    assert set(table["status"]) <= {"default", "kept", "retired"}
    default = table[table["status"] == "default"]
    assert len(default) == 1 and default["design"].iloc[0].startswith("two_step")
    assert params.load(ROOT / "params" / "default.yaml").extract.prompt_design == "two_step"
    retired = table[table["status"] == "retired"]
    assert retired["why"].notna().all() and len(retired) == 3
    shares = table[["accuracy", "answered", "unknown_kept", "gender", "adjective_f1"]]
    assert ((shares >= 0) & (shares <= 1)).all().all()


def test_step2_fills_are_counts_and_an_unknown_table_or_bad_columns_fail(tmp_path, monkeypatch):
    fills = recorded("step2_fills")
    assert (fills["right"] <= fills["fills"]).all() and fills["fills"].sum() == 85
    with pytest.raises(KeyError, match="no recorded measurement 'nope'"):
        recorded("nope")
    (tmp_path / "docs" / "measurements").mkdir(parents=True)
    pd.DataFrame({"field": ["x"], "n": [1]}).to_csv(tmp_path / "docs" / "measurements" / "step2_fills.csv", index=False)
    monkeypatch.setattr(paths, "repo_root", lambda: tmp_path)
    with pytest.raises(ValueError, match=r"step2_fills.csv: columns \['field', 'n'\]"):
        recorded("step2_fills")


def test_step2_known_share_is_a_share_per_field_that_step_2_raised():
    known = recorded("step2_known_share")
    assert known["field"].is_unique and (known["stories"] > 0).all()
    shares = known[["known_step1", "known_after_step2"]]
    assert ((shares >= 0) & (shares <= 1)).all().all()
    assert (known["known_after_step2"] > known["known_step1"]).all()


def test_step2_fills_adds_the_share_right(tmp_path, monkeypatch):
    """Issue #59 item 3: notebook 03's share of right step-2 fills is right / fills, to 2 digits."""
    (tmp_path / "docs" / "measurements").mkdir(parents=True)
    (tmp_path / "docs" / "measurements" / "step2_fills.csv").write_text("field,fills,right\na,4,1\nb,3,2\nc,6,0\n")
    monkeypatch.setattr(paths, "repo_root", lambda: tmp_path)
    table = step2_fills()
    assert list(table.columns) == [*RECORDED_COLUMNS["step2_fills"], "share_right"]
    assert table["share_right"].tolist() == [0.25, 0.67, 0.0]
