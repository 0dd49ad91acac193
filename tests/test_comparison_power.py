"""Comparison by what the run could see (issue #57, item 5): a published cell the run did not reproduce is
"missed" only when the run's own table had 80 % power to see the published effect, "underpowered"
otherwise; every scope says how the stories it pooled differ from the release's."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from storybias.evidence.released_associations import RELEASE_POOL, load_associations
from storybias.stages.associations import tables
from storybias.stages.associations.cell_power import detection_power, planted_probabilities
from storybias.stages.associations.comparison import compare_published, pooled_scope

EDUCATION = ["basic", "undergraduate", "graduate"]
INCOME = ["low", "middle", "high"]


def _published(tmp_path) -> pd.DataFrame:
    """One released record of scope fr: low income -> basic education, lift 2.2 (fraction 0.6)."""
    record = {
        "base_attribute": "income_level",
        "compared_attribute": "education",
        "associated_values": [
            {
                "base_value": {"name": "income_level", "value": "low income"},
                "compared_value": {
                    "name": "education",
                    "value": "basic (e.g. less than high school, or high school)",
                },
                "statistics": {"p_value": 0.001, "fraction": 0.6, "lift": 2.2},
            }
        ],
        "statistics": {"p_value": 0.001, "cramer_v": 0.35, "effect_category": "medium"},
        "generator_model": "prov/m",
        "sample_ids": [],
        "aggregation_dimension": ["language"],
        "aggregation_value": "fr",
    }
    path = tmp_path / "prov_m__fr.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return load_associations(path)


def _run(per_value: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A run of scope fr whose income x education table shows no association (every row the same
    shares): per_value stories per prompted income level; 18 tables in its BH family, none significant."""
    counts = np.array([[per_value // 3, per_value // 3, per_value - 2 * (per_value // 3)]] * 3)
    table = json.dumps({"rows": INCOME, "cols": EDUCATION, "counts": counts.tolist()})
    attributes = pd.DataFrame(
        [
            {
                "model": "prov/m",
                "scope": "fr",
                "base_attribute": "income_level",
                "compared_attribute": other,
                "p_adjusted": 0.9,
                "effect_size": "not significant",
                "retained": False,
                "table": table if other == "education" else json.dumps({"rows": [], "cols": [], "counts": []}),
            }
            for other in ["education", *[f"other_{i}" for i in range(17)]]
        ]
    )
    return attributes, pd.DataFrame(columns=tables.VALUE_COLUMNS)


def test_a_sampled_run_calls_its_non_reproduced_cells_underpowered_a_full_one_missed(tmp_path):
    published = _published(tmp_path)
    sampled_pool = {**RELEASE_POOL, "attributes": ["income_level"], "sample": "30 per prompted value"}
    sampled = compare_published(published, *_run(30), pooled_scope(sampled_pool, RELEASE_POOL)).iloc[0]
    assert sampled["status"] == "underpowered" and sampled["run_power"] < 0.8
    assert f"power {sampled['run_power']:.0%}" in sampled["reason"]
    # the scope says how it pooled other stories than the release's slice of the language
    assert "sample 30 per prompted value" in sampled["pool_difference"]
    assert "prompted attributes ['income_level']" in sampled["pool_difference"]
    full = compare_published(published, *_run(900), pooled_scope(dict(RELEASE_POOL), RELEASE_POOL)).iloc[0]
    assert full["status"] == "missed" and full["run_power"] >= 0.8
    assert full["pool_difference"] == ""


def test_detection_power_holds_its_level_and_grows_with_the_table():
    # level: with no published effect (lift 1) a cell is "detected" at most alpha of the time, in small
    # and large tables; power: lift 2.2 is seen in a large table, not in a small one
    for per_row in (20, 300):
        counts = np.full((3, 3), per_row // 3)
        files, stated = detection_power(counts, 0, 0, 1.0, 1 / 3, family_size=1, n_simulations=2_000, seed=1)
        assert files <= 0.05 and stated <= files
    small = detection_power(np.full((3, 3), 4), 0, 0, 2.2, 0.6, family_size=18, seed=2)[0]
    large = detection_power(np.full((3, 3), 300), 0, 0, 2.2, 0.6, family_size=18, seed=2)[0]
    assert small < 0.3 and large > 0.95


def test_planted_probabilities_and_bad_input():
    probs = planted_probabilities(np.array([[10, 30], [10, 30]]), 0, 0, 2.0, 0.9)
    assert probs[0].tolist() == pytest.approx([0.5, 0.5]) and probs[1].tolist() == pytest.approx([0.25, 0.75])
    # a value the run never saw gets the published fraction
    assert planted_probabilities(np.array([[10, 0], [10, 0]]), 0, 1, 2.0, 0.4)[0, 1] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="counts"):
        planted_probabilities(np.zeros((2, 2)), 0, 0, 2.0, 0.5)
    with pytest.raises(ValueError, match="family_size"):
        detection_power(np.full((2, 2), 5), 0, 0, 2.0, 0.5, family_size=0)
