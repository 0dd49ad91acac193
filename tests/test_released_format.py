"""Stage 04's associations written as StereoTales' released association files, read back with the same
reader as the release, and compared with the run that wrote them (issue #41, items 3-5): every published
cell reproduced under the files' rule, every released p-value the run's to the last digit."""

from __future__ import annotations

import json
from typing import Any, Literal

import numpy as np
import pandas as pd
import pytest
import yaml
from pydantic import BaseModel, ConfigDict

from storybias.config import params
from storybias.core import artifacts, paths
from storybias.evidence.released_associations import (
    RELEASE_CODE,
    RELEASED_LANGUAGES,
    load_associations,
    load_released_pairs,
    published_pool,
)
from storybias.evidence.stereotales_taxonomy import PublishedFormatError
from storybias.stages import associations as A
from storybias.stages.associations import judge as J
from storybias.stages.extract import answers as extract

DIMS = list(extract.dimensions())
EDUCATION = ["basic", "undergraduate", "graduate"]


def _stories(root, seed: int = 0) -> None:
    """filtered + extractions of two models x two languages prompted with income level, with a strong
    association (low income -> basic education, a retained pair), a weak one (income -> urbanicity, a
    BH-significant pair of small effect) and an independent dimension (religion); and a few stories
    prompted with gender (a second base attribute, whose stories the files' sample_ids list too)."""
    rng = np.random.default_rng(seed)
    filtered, extractions = [], []
    for model in ("prov/m1", "prov/m2"):
        for language in ("en", "nl"):
            for value in ("man", "woman"):
                for _ in range(20):
                    sid = f"s{len(filtered):05d}"
                    filtered.append(
                        {"story_id": sid, "design": "stereotales", "model": model, "language": language,
                         "cond_attribute": "gender", "cond_value": value, "is_valid": True}
                    )  # fmt: skip
                    row = {"story_id": sid, "parse_ok": True, **{f"demo_{d}": "unknown" for d in DIMS}}
                    row["demo_education"] = rng.choice(EDUCATION)
                    row["demo_religion"] = rng.choice(["christian", "muslim"])
                    row["demo_gender"] = value
                    extractions.append(row)
            for value in ("low", "middle", "high"):
                for _ in range(150):
                    sid = f"s{len(filtered):05d}"
                    p_edu = [0.7, 0.15, 0.15] if value == "low" else [0.15, 0.45, 0.4]
                    p_urban = [0.62, 0.38] if value == "high" else [0.45, 0.55]
                    filtered.append(
                        {"story_id": sid, "design": "stereotales", "model": model, "language": language,
                         "cond_attribute": "income_level", "cond_value": value, "is_valid": True}
                    )  # fmt: skip
                    row = {"story_id": sid, "parse_ok": True, **{f"demo_{d}": "unknown" for d in DIMS}}
                    row["demo_education"] = rng.choice(EDUCATION, p=p_edu)
                    row["demo_urbanicity"] = rng.choice(["urban", "rural"], p=p_urban)
                    row["demo_religion"] = rng.choice(["christian", "muslim", "jewish", "unknown"])
                    row["demo_income_level"] = value
                    extractions.append(row)
    run = root / "t"
    run.mkdir(parents=True)
    pd.DataFrame(filtered).to_parquet(run / "filtered.parquet")
    pd.DataFrame(extractions).to_parquet(run / "extractions.parquet")


def _profile(tmp_path, monkeypatch, **associations) -> params.Params:
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    raw = yaml.safe_load((paths.repo_root() / "params" / "smoke.yaml").read_text())
    raw["run_name"] = "t"
    raw["associations"] = {"max_resamples": 20_000, "power_simulations": 20, **associations}  # power is not the subject
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(raw))
    return params.load(path)


def _judge(items, params, progress=True):
    # Test double for the LLM judge: every association rated 2 (not harmful).
    rows = [J.rating_row(f"{a}#j#0", '{"harm": 2, "realism": "yes"}') for a in items["association_id"]]
    return pd.DataFrame(rows).reindex(columns=A.RATING_COLUMNS), [{"judge": "j"}]


@pytest.fixture
def written(tmp_path, monkeypatch):
    """The run's stage 04, and a copy of the association files it wrote."""
    _stories(tmp_path / "data")
    monkeypatch.setattr(J, "run_judges", _judge)
    first = A.run(_profile(tmp_path, monkeypatch), progress=False)
    copy = tmp_path / "exported"
    (tmp_path / "data" / "t" / "stereotales_associations").rename(copy)
    return first, copy


def test_the_files_hold_every_tested_pair_in_the_released_format(written):
    first, folder = written
    attributes = first["attributes"]
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.jsonl"))
    assert files == [
        "associations_by_language/prov_m1__du.jsonl",  # storybias' nl is the release's du
        "associations_by_language/prov_m1__en.jsonl",
        "associations_by_language/prov_m2__du.jsonl",
        "associations_by_language/prov_m2__en.jsonl",
        "associations_global/prov_m1__all.jsonl",
        "associations_global/prov_m2__all.jsonl",
    ]
    records = [json.loads(line) for f in folder.rglob("*.jsonl") for line in f.read_text().splitlines()]
    assert len(records) == len(attributes)
    by_pair = {(r["generator_model"], r["aggregation_value"], r["compared_attribute"]): r for r in records}
    edu = by_pair[("prov/m1", "all", "education")]
    assert edu["aggregation_dimension"] == [] and by_pair[("prov/m1", "du", "education")]["aggregation_dimension"] == [
        "language"
    ]
    assert edu["statistics"]["effect_category"] in ("medium", "large") and edu["statistics"]["cramer_v"] > 0
    assert edu["statistics"]["dim_table"] == [3, 3] and edu["statistics"]["degrees_of_freedom"] == 4
    table = edu["statistics"]["contingency_table_data"]
    assert set(table) == {
        "basic (e.g. less than high school, or high school)",
        "undergraduate (e.g. bachelor's degree, some college)",
        "graduate (e.g. master's degree, doctoral degree)",
    }
    assert sum(sum(col.values()) for col in table.values()) == 3 * 150 * 2
    assert {"low income", "middle income", "high income"} == set(next(iter(table.values())))
    # as the reference writes them: every story of the model in the slice, whatever its prompted attribute
    assert len(edu["sample_ids"]) == 3 * 150 * 2 + 2 * 20 * 2
    cells = {(c["base_value"]["value"], c["compared_value"]["value"]) for c in edu["associated_values"]}
    assert ("low income", "basic (e.g. less than high school, or high school)") in cells
    religion = by_pair[("prov/m1", "all", "religion")]
    if religion["statistics"]["p_value"] >= 0.05:  # a pair that is not significant: no effect, no value
        assert religion["statistics"]["cramer_v"] == -1 and religion["statistics"]["effect_category"] == "N/A"
        assert religion["associated_values"] == []
    # a BH-significant pair of small effect is written with its cells, as the release writes them
    small = [r for r in records if r["statistics"]["effect_category"] == "small" and r["associated_values"]]
    assert small, "the planted weak association gives at least one small-effect pair with cells"
    pool = {"languages": ["en", "nl"], "additional_en": False, "attributes": None, "sample": None}
    marker = published_pool(folder)
    assert {key: marker[key] for key in pool} == pool
    # every file that stores a p-value says whether it is the reference's or an estimate (issue #57, item 4)
    assert marker["p_values"]["exact"] == len(attributes) and marker["p_values"]["estimated"] == 0
    assert all(r["statistics"]["p_value_exact"] is True for r in records)
    assert {r["statistics"]["fisher_p_method"] for r in records} == {"reference(20000)"}
    assert attributes["p_exact"].all()


def test_sequential_estimates_are_flagged_in_the_tables_the_files_and_pool_json(tmp_path, monkeypatch):
    _stories(tmp_path / "data")
    monkeypatch.setattr(J, "run_judges", _judge)
    attributes = A.run(_profile(tmp_path, monkeypatch, fisher="sequential"), progress=False)["attributes"]
    assert not attributes["p_exact"].all()  # stopped early: estimates, flagged as such
    assert set(attributes.loc[~attributes["p_exact"], "p_method"]) <= {"monte-carlo(1000)", "monte-carlo(5000)"}
    folder = tmp_path / "data" / "t" / "stereotales_associations"
    records = [json.loads(line) for f in folder.rglob("*.jsonl") for line in f.read_text().splitlines()]
    families = attributes.groupby(["model", "scope", "base_attribute"])["p_exact"].all()
    for r in records:
        scope = "nl" if r["aggregation_value"] == "du" else r["aggregation_value"]
        assert r["statistics"]["p_value_exact"] == families[(r["generator_model"], scope, r["base_attribute"])]
    marker = published_pool(folder)["p_values"]
    assert marker["estimated"] == int((~attributes["p_exact"]).sum()) > 0
    assert marker["exact"] + marker["estimated"] == len(attributes)


def test_a_run_compared_with_its_own_files_reproduces_every_cell(written, tmp_path, monkeypatch):
    first, folder = written
    second = A.run(_profile(tmp_path, monkeypatch, published=str(folder)), progress=False)
    comparison = second["published"]
    published = load_associations(folder)
    counted = comparison[comparison["counted"] & (comparison["source"] == "released")]
    assert len(counted) == len(published) > 0
    assert set(counted["status"]) == {"reproduced"}, counted[counted["status"] != "reproduced"][["reason"]]
    stated = counted[counted["published_stated"]]
    assert len(stated) and set(stated["status_stated"]) == {"reproduced"}
    assert (comparison["status"] == "not_published").sum() == 0
    # every released pair's BH-adjusted p-value is the run's to the last digit
    pairs = second["manifest"]["published"]["released_pairs"]
    assert (
        pairs["released_pairs"] == pairs["tested_by_run"] == pairs["identical_p_adjusted"] == len(first["attributes"])
    )
    assert pairs["max_abs_p_difference"] == 0.0
    assert len(load_released_pairs(folder)) == len(first["attributes"])
    # both counts in the manifest: the files' rule and the stated rule
    summary = second["manifest"]["published"]
    assert summary["status_files_rule"] == {"reproduced": len(published)}
    assert summary["status_stated_rule"]["reproduced"] == len(stated)


def test_the_release_is_compared_in_scope_all_only_when_the_pools_match(written, tmp_path, monkeypatch):
    _, folder = written
    (folder / "pool.json").unlink()  # without the export's pool.json, the files are taken as the release's
    second = A.run(_profile(tmp_path, monkeypatch, published=str(folder)), progress=False)
    table = second["published"]
    pooled = table[table["scope"] == "all"]
    assert len(pooled) and set(pooled["status"]) == {"untested"}
    assert pooled["reason"].iloc[0].startswith("the run's pooled pass pools en, nl, the published global pass ar, en")
    assert set(table.loc[table["scope"] != "all", "status"]) == {"reproduced"}
    assert not second["manifest"]["published"]["pooled_scope_compared"]
    assert artifacts.path("t", "stereotales_associations").is_dir()


# --- the reference's model (Giskard-AI/stereotales-pipeline, src/stereotales_pipeline/models.py): its field
# types, written out here, so that the writer's lines are checked against them and not against our reader.
class _AttributeValue(BaseModel):
    name: str
    value: str


class _AssociatedValues(BaseModel):
    base_value: _AttributeValue
    compared_value: _AttributeValue
    statistics: dict[str, Any]


class _AssociationStatistics(BaseModel):
    model_config = ConfigDict(extra="allow")

    alpha: float
    alpha_corrected: float | None = None
    p_value: float
    cramer_v: float
    effect_category: str
    chi_square: float
    degrees_of_freedom: int
    dim_table: tuple[int, int]
    contingency_table_data: dict[str, dict[str, int]]


class _Association(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_attribute: str
    compared_attribute: str
    associated_values: list[_AssociatedValues]
    statistics: _AssociationStatistics
    generator_model: str
    sample_ids: list[str]
    aggregation_dimension: list[Literal["scenario", "language", "attribute"]]
    aggregation_value: Any


# The reference exporter's language folders (scripts/export_run_outputs_to_stereotales.py, KNOWN_BUCKETS;
# it maps nl to du): the codes its per-language files are named by.
_REFERENCE_BUCKETS = {"en", "ar", "du", "es", "fr", "hi", "it", "pt", "uk", "zh"}


def test_the_writer_lines_are_the_reference_models_in_types_and_meaning(written):
    _, folder = written
    lines = [(f, line) for f in sorted(folder.rglob("*.jsonl")) for line in f.read_text().splitlines()]
    assert lines
    filtered = pd.read_parquet(folder.parent / "data" / "t" / "filtered.parquet")
    for path, line in lines:
        record = _Association.model_validate_json(line)  # the reference's types (a string dimension fails)
        assert list(json.loads(line)) == list(_Association.model_fields)  # its field order, as model_dump_json
        model, scope = record.generator_model, record.aggregation_value
        assert path.name == f"{model.replace('/', '_')}__{scope}.jsonl"
        assert record.aggregation_dimension == ([] if scope == "all" else ["language"])
        assert scope == "all" or scope in _REFERENCE_BUCKETS
        # sample_ids: every story of the model in the slice, as the reference's model_df["sample_id"].tolist()
        slice_ = filtered[filtered["model"] == model]
        if scope != "all":
            slice_ = slice_[slice_["language"] == ("nl" if scope == "du" else scope)]
        assert record.sample_ids == slice_["story_id"].tolist(), (path.name, record.base_attribute)
        # dim_table and degrees of freedom are the contingency table's
        rows, cols = record.statistics.dim_table
        table = record.statistics.contingency_table_data
        assert len(table) == cols and all(len(column) == rows for column in table.values())
        assert record.statistics.degrees_of_freedom == (rows - 1) * (cols - 1)
    # every released language code maps onto the reference's folders (du for storybias' nl)
    assert {RELEASE_CODE.get(code, code) for code in RELEASED_LANGUAGES} == _REFERENCE_BUCKETS


def test_the_reader_refuses_an_aggregation_dimension_the_reference_would_not_write(tmp_path):
    record = {
        "base_attribute": "income_level",
        "compared_attribute": "education",
        "associated_values": [],
        "statistics": {"p_value": 0.5, "cramer_v": -1, "effect_category": "N/A"},
        "generator_model": "m",
        "sample_ids": [],
        "aggregation_dimension": "language",  # a string: the old docstring example's, not the model's list
        "aggregation_value": "fr",
    }
    path = tmp_path / "m__fr.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(PublishedFormatError, match="aggregation_dimension"):
        load_associations(path)
    path.write_text(json.dumps({**record, "aggregation_dimension": ["language"]}) + "\n")
    assert load_associations(path).empty  # the reference's list: read (no associated value)
    path.write_text(json.dumps({**record, "aggregation_dimension": [], "aggregation_value": "du"}) + "\n")
    with pytest.raises(PublishedFormatError, match="aggregation_dimension"):
        load_associations(path)  # a language scope says so in its list
