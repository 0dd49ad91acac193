"""Stages 02 and 03 for real on the killed-and-resumed smoke run: language filter, then extraction
with the embedded model through vLLM structured outputs, and its gold-set accuracy."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

pytestmark = pytest.mark.slow


def test_filter_keeps_every_story(extracted, resumed):
    stories, _, _ = resumed
    filtered = pd.read_parquet(extracted / "filtered.parquet")
    assert len(filtered) == len(stories) and set(filtered.story_id) == set(stories.story_id)
    assert (
        filtered["invalid_reason"]
        .dropna()
        .isin(["empty", "truncated", "refusal", "wrong_language", "low_confidence"])
        .all()
    )
    assert (filtered["is_valid"] == filtered["invalid_reason"].isna()).all()
    vsr = pd.read_parquet(extracted / "vsr.parquet")
    # one VSR row per design x model x language (BiasedTales-ML's rate is per design; no pooled row)
    assert "all" not in set(vsr.design) and vsr["n_stories"].sum() == len(stories)


def test_extraction_answers_every_valid_story_within_the_schema(extracted):
    filtered = pd.read_parquet(extracted / "filtered.parquet")
    ex = pd.read_parquet(extracted / "extractions.parquet")
    assert set(ex.story_id) == set(filtered.loc[filtered.is_valid, "story_id"])
    assert ex["protagonist_gender"].isin(["female", "male", "unknown"]).all()
    raw = pd.read_parquet(extracted / "extraction_raw.parquet")
    parsed = raw[raw.parse_ok]
    assert len(parsed) >= 1
    assert all(isinstance(json.loads(t), dict) for t in parsed.raw)
    values = json.loads((extracted / "values" / "extract.json").read_text())
    assert values["n_extracted"] == len(ex)
    assert values["n_parse_failed"] == int((~ex.parse_ok).sum())


def test_gold_set_extractor_beats_its_baselines(extracted):
    scores = pd.read_parquet(extracted / "gold_scores.parquet").set_index("field")
    summary = json.loads((extracted / "gold_summary.json").read_text())
    assert summary["n_items"] == 8 and len(summary["languages"]) == 6
    assert summary["n_parsed"] >= 7
    gender = scores.loc["protagonist_gender"]
    assert 0 <= gender["accuracy"] <= 1
    # The explicit requirement: the configured extractor beats always answering the commonest label.
    assert gender["accuracy"] > gender["majority_baseline"], scores.loc[["protagonist_gender"]]
    # Overall, it beats an extractor that reads nothing and answers `unknown` to every field (whose
    # accuracy is the share of unknown truths): 0.70 against 0.52 on the smoke run of 2026-12-03.
    scalar = scores[scores["majority_value"].notna()]
    abstaining = float(((scalar["n"] - scalar["n_known"]) / scalar["n"]).mean())
    assert scalar["accuracy"].mean() > abstaining, scalar[["accuracy", "n_known"]]
    assert scalar["accuracy_known"].mean() > 0, "some known value was recovered"
    adjectives = scores.loc["adjectives_en (precision/recall/F1)"]
    assert adjectives["accuracy"] > 0, "some gold adjective was recovered (F1)"


def test_stages_01_and_03_shared_one_model_host(extracted):
    """As under `make paper` on the default profile: stage 01 started the model's host (its start-up is
    in 01's manifest), stage 03 reused it without loading the weights again (no start-up of its own, one
    host start in the session's log), and every request was answered."""
    from storybias.engines.base import STARTS_LOG_VARIABLE

    generate = json.loads((extracted / "manifest_generate.json").read_text())["models"]
    extract = json.loads((extracted / "manifest_extract.json").read_text())["timings"]
    [timing] = extract.values()
    assert timing["endpoint"] is None and timing["startup_seconds"] < 5, timing
    assert max(m["startup_seconds"] for m in generate) > 5, generate
    assert timing["n_request_errors"] == 0
    starts = [json.loads(line) for line in open(os.environ[STARTS_LOG_VARIABLE], encoding="utf-8")]
    assert [s["kind"] for s in starts].count("host") == 1, starts


def test_stage_times_reads_the_run_papermill_and_the_stages_wrote(extracted, smoke_profile):
    """`make stage-times` on the slow tests' run: stages 01-03 executed by papermill as `make` runs them
    (conftest.run_notebook), their manifests written by the stages themselves."""
    from storybias.tools import stage_times

    _, _, reports = smoke_profile
    rows = {r.notebook: r for r in stage_times.collect(reports, extracted)}
    assert {"01_generate", "02_filter", "03_extract"} <= set(rows)
    assert rows["01_generate"].ended <= rows["02_filter"].started <= rows["03_extract"].started
    [model] = json.loads((extracted / "manifest_generate.json").read_text())["models"]
    assert rows["01_generate"].detail.startswith(f"{model['model']}: start {model['startup_seconds']:,.1f} s, ")
    assert rows["01_generate"].seconds > model["startup_seconds"]
    [(extractor, timing)] = json.loads((extracted / "manifest_extract.json").read_text())["timings"].items()
    assert rows["03_extract"].detail.startswith(f"{extractor}: {timing['n_answers']:,} answers")
    assert rows["03_extract"].detail.endswith(" answers did not parse")
    # both model stages name the machine their times were measured on, its bf16 rate probed
    lines = stage_times.machine_lines(extracted)
    assert [line.split(" ran on: ")[0] for line in lines] == ["01_generate", "03_extract"], lines
    ran_on = json.loads((extracted / "manifest_extract.json").read_text())["machine"]
    assert ran_on["bf16_gflops"] > 0 and ran_on["cores"] == len(os.sched_getaffinity(0))


def test_two_step_maps_the_facts_of_every_answer_that_quoted_some(extracted):
    """The slow profile extracts with ``two_step`` (the default profile's design): every parsed
    stereotales answer that quoted facts got one step-2 answer through the real engine, stored under
    its own pass, and the manifest counts them (a step-2 answer that does not parse is counted, not dropped)."""
    from storybias.stages.extract import facts as extract_facts

    raw = pd.read_parquet(extracted / "extraction_raw.parquet")
    two = json.loads((extracted / "manifest_extract.json").read_text())["two_step"]
    step1 = raw[~raw["pass"].str.endswith("_map")]
    maps = raw[raw["pass"].str.endswith("_map")]
    stories = pd.read_parquet(extracted / "filtered.parquet").set_index("story_id")["design"]
    quoted = [r for r in step1.itertuples() if r.parse_ok and extract_facts.facts_of(r.raw)]
    assert all(stories[r.story_id] == "stereotales" for r in quoted), "only demographic answers quote facts"
    assert two["n_with_facts"] == len(quoted) >= 1
    assert two["n_step2"] == len(maps) == len(quoted), "one step-2 answer per answer that quoted facts"
    assert two["n_step2_parse_failed"] == int((~maps["parse_ok"]).sum())
    assert set(maps["story_id"]) == {r.story_id for r in quoted}
