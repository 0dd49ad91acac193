"""Importing any story table (``corpus: {format: table}``, issue #28 item 4): CSV, JSONL and parquet with a
column mapping; stage 01 imports one story per row with the mapped conditions, stage 03 maps extracted
columns, stage 05 says which input a lens lacks and which key provides it; bad input stops early.

Issue #41 item 9: a table as researchers have it (449 stories of one model prompted by race x gender, no
language column, genders M/W/N, no scenario) imports with constants and a value mapping, its power estimate
comes from its own counts, and the probe groups its stories by prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from storybias.config import params
from storybias.config.lenses import BY_PROMPT_CELL, BY_PROMPT_TEXT, grouping_note, lens_shortfalls
from storybias.core import artifacts
from storybias.stages import extract, generate, metrics
from storybias.stages import filter as filter_stage
from storybias.stages.associations import power as P
from storybias.stages.generate.corpus import CorpusError, story_id_of
from storybias.stages.probes.probe import probe_frame as stage_06_frame

TEXT = "Once upon a time a child walked to school and met a friend. They laughed all the way home. " * 3


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


def _profile(tmp_path: Path, corpus: dict, name: str = "table.yaml") -> params.Params:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"run_name": "table-test", "corpus": {"format": "table", **corpus}}))
    return params.load(path)


def _bedtime_rows(n: int = 8) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "story": [TEXT] * n,
            "lang": ["en", "du"] * (n // 2),
            "llm": ["lab/model-a"] * n,
            "uid": [f"s{i}" for i in range(n)],
            "child": ["boy", "girl"] * (n // 2),
            "hero_gender": ["woman", "woman", "man", "man"] * (n // 4),
        }
    )


BEDTIME = {
    "design": "bedtime",
    "columns": {
        "text": "story",
        "language": "lang",
        "model": "llm",
        "id": "uid",
        "conditions": {"cond_child_gender": "child"},
        "extracted": {"gender": "hero_gender"},
    },
    "extractions": "published",
}


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_a_table_imports_one_story_per_row_with_its_conditions(tmp_path, data_dir, suffix):
    rows = _bedtime_rows()
    path = tmp_path / f"stories{suffix}"
    if suffix == ".csv":
        rows.to_csv(path, index=False)
    elif suffix == ".jsonl":
        rows.to_json(path, orient="records", lines=True)
    else:
        rows.to_parquet(path)
    p = _profile(tmp_path, {"path": str(path), "languages": ["en", "nl"], **BEDTIME})
    generate.run(p, progress=False, log=lambda m: None)
    stories = pd.read_parquet(artifacts.stories_path(p.run_name))
    assert len(stories) == len(rows) and stories["story_id"].tolist() == [story_id_of(u) for u in rows["uid"]]
    assert set(stories["design"]) == {"bedtime"} and stories["text"].tolist() == rows["story"].tolist()
    assert stories["language"].tolist() == ["en", "nl"] * 4  # the release's du is storybias' nl
    assert stories["cond_child_gender"].tolist() == rows["child"].tolist()
    assert stories["cond_social_class"].isna().all() and set(stories["finish_reason"]) == {"imported"}

    filter_stage.run(p, progress=False)
    extract.run(p, progress=False, log=lambda m: None)
    extractions = pd.read_parquet(artifacts.extractions_path(p.run_name)).set_index("story_id")
    assert extractions.loc[story_id_of("s0"), "demo_gender"] == "woman"
    assert extractions.loc[story_id_of("s2"), "protagonist_gender"] == "male"  # s1 (du, English text) is invalid

    notes = metrics.run(p)["notes"]
    assert any("social_class" in n and "corpus.columns.conditions.cond_social_class" in n for n in notes)
    assert any("no adjectives or settings extracted" in n and "corpus.extractions: rerun" in n for n in notes)
    assert not any(n.startswith("child_gender: the") for n in notes), "cond_child_gender was mapped"


def test_bad_tables_are_refused_naming_the_file_row_and_column(tmp_path, data_dir):
    rows = _bedtime_rows()
    good = tmp_path / "good.csv"
    rows.to_csv(good, index=False)
    missing = {**BEDTIME, "columns": {**BEDTIME["columns"], "text": "body"}}
    with pytest.raises(params.ParamsError, match=r"corpus\.columns\.text: column 'body' is not in .*good\.csv"):
        _profile(tmp_path, {"path": str(good), **missing})
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(params.ParamsError, match=r"notes\.txt is not a \.csv, \.jsonl or \.parquet file"):
        _profile(tmp_path, {"path": str(tmp_path / "notes.txt"), **BEDTIME})
    (tmp_path / "empty").mkdir()
    with pytest.raises(params.ParamsError, match=r"holds no \.csv, \.jsonl or \.parquet file"):
        _profile(tmp_path, {"path": str(tmp_path / "empty"), **BEDTIME})
    with pytest.raises(params.ParamsError, match=r"cond_nationality_x.* not a condition column of bedtime"):
        bad = {**BEDTIME, "columns": {**BEDTIME["columns"], "conditions": {"cond_nationality_x": "child"}}}
        _profile(tmp_path, {"path": str(good), **bad})
    with pytest.raises(params.ParamsError, match=r"corpus\.extractions: published needs corpus\.columns\.extracted"):
        _profile(tmp_path, {"path": str(good), **{**BEDTIME, "columns": {**BEDTIME["columns"], "extracted": {}}}})

    for column, value, message in [
        ("lang", "xx", "language 'xx' is not one of storybias'"),
        ("hero_gender", "robot", "robot"),
    ]:
        broken = rows.copy()
        broken.loc[5, column] = value
        path = tmp_path / f"broken-{column}.csv"
        broken.to_csv(path, index=False)
        p = _profile(tmp_path, {"path": str(path), **BEDTIME}, name=f"{column}.yaml")
        with pytest.raises(CorpusError, match=rf"broken-{column}\.csv: row 5, column {column}: .*{message}"):
            generate.run(p, progress=False, log=lambda m: None)
    duplicated = rows.assign(uid="same")
    path = tmp_path / "dup.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in duplicated.to_dict("records")))
    p = _profile(tmp_path, {"path": str(path), **BEDTIME}, name="dup.yaml")
    with pytest.raises(
        CorpusError, match=r"corpus\.columns\.id 'same' appears twice \(\S*dup\.jsonl: row 0; \S*dup\.jsonl: row 1\)"
    ):
        generate.run(p, progress=False, log=lambda m: None)


def test_stage_06_names_the_key_that_provides_a_missing_label(tmp_path, data_dir):
    """Stage 06 on an imported table: without a mapped gender column the probes have no label, and the
    note names corpus.columns.extracted.gender; published extractions never carry markers."""
    from storybias.stages import probes

    rows = _bedtime_rows().drop(columns="hero_gender").assign(age="adult")
    path = tmp_path / "stories.csv"
    rows.to_csv(path, index=False)
    columns = {**BEDTIME["columns"], "extracted": {"age": "age"}}
    p = _profile(tmp_path, {**BEDTIME, "path": str(path), "languages": ["en", "nl"], "columns": columns})
    generate.run(p, progress=False, log=lambda m: None)
    filter_stage.run(p, progress=False)
    extract.run(p, progress=False, log=lambda m: None)
    frame = stage_06_frame(
        pd.read_parquet(artifacts.extractions_path(p.run_name)), pd.read_parquet(artifacts.filtered_path(p.run_name))
    )
    notes = probes.missing_inputs(frame, p.corpus)
    assert any("corpus.columns.extracted.gender" in n for n in notes)
    assert any("no cultural markers" in n and "corpus.extractions: rerun" in n for n in notes)
    frame["label"] = "female"  # as if the table had mapped a gender column
    assert not any("gender" in n for n in probes.missing_inputs(frame, p.corpus))
    assert probes.missing_inputs(frame, None) == []  # a generated run: stage 03 extracted both


RACES = ("Black", "White", "Asian", "Hispanic", "Native American")
GENDER_WORDS = {"M": "man", "W": "woman", "N": "non-binary person"}
GPT35 = "openai/gpt-3.5-turbo"
RACE_GENDER = {
    "design": "stereotales",
    "columns": {
        "text": "text",
        "language": {"constant": "en"},
        "model": "model",
        "prompt": "prompt",
        "conditions": {"cond_attribute": {"constant": "gender"}, "cond_value": "gender"},
    },
    "values": {"cond_value": {"M": "man", "W": "woman", "N": "non_binary"}},
    "extractions": "rerun",
}


def _race_gender_table(path: Path, n: int = 449) -> pd.DataFrame:
    """A published table's shape: text, model, gender (M/W/N), race, prompt; one model, no language column."""
    gender = [("M", "W", "N")[i % 3] for i in range(n)]
    race = [RACES[(i // 3) % len(RACES)] for i in range(n)]
    rows = pd.DataFrame(
        {
            "text": [TEXT] * n,
            "model": [GPT35] * n,
            "gender": gender,
            "race": race,
            "prompt": [f"Write a short story about a {r} {GENDER_WORDS[g]}." for r, g in zip(race, gender)],
        }
    )
    rows.to_csv(path, index=False)
    return rows


def test_a_race_by_gender_table_imports_with_constants_and_mapped_values(tmp_path, data_dir):
    rows = _race_gender_table(tmp_path / "race-gender.csv")
    p = _profile(tmp_path, {"path": str(tmp_path / "race-gender.csv"), **RACE_GENDER})
    planned = generate.plan(p)
    assert len(planned) == len(rows) and set(planned["language"]) == {"en"} and set(planned["model"]) == {GPT35}
    assert set(planned["cond_attribute"]) == {"gender"}
    expected = rows["gender"].map(RACE_GENDER["values"]["cond_value"])
    assert planned["cond_value"].tolist() == expected.tolist() and planned["prompt"].tolist() == rows["prompt"].tolist()
    # the power estimate counts the table's stories per prompted value, not a synthetic grid
    settings = P.PowerSettings(lifts=(2.0, 3.0), n_simulations=20, n_family=18)
    power = P.planned_power(p, known_share=1.0, settings=settings, stories=planned)
    counts = expected.value_counts()
    assert power["base_attribute"].tolist() == ["gender"]
    assert power["stories_per_value"].iloc[0] == f"{counts.min()}-{counts.max()}"


def test_unmapped_values_and_wrong_constants_are_refused(tmp_path, data_dir):
    rows = _race_gender_table(tmp_path / "race-gender.csv")
    unmapped = {**RACE_GENDER, "values": {}}
    p = _profile(tmp_path, {"path": str(tmp_path / "race-gender.csv"), **unmapped}, name="unmapped.yaml")
    with pytest.raises(
        CorpusError,
        match=r"race-gender\.csv: row 0, column gender: 'M' is not a value of cond_value.*"
        r"map it with corpus\.values\.cond_value",
    ):
        generate.plan(p)
    rows.loc[17, "gender"] = "X"
    rows.to_csv(tmp_path / "odd.csv", index=False)
    p = _profile(tmp_path, {"path": str(tmp_path / "odd.csv"), **RACE_GENDER}, name="odd.yaml")
    with pytest.raises(CorpusError, match=r"odd\.csv: row 17, column gender: 'X' .*not in corpus\.values\.cond_value"):
        generate.plan(p)
    # a value of the design, but not of the prompted attribute: no prompt of stereotales
    rows.loc[17, "gender"] = "adult"
    rows.to_csv(tmp_path / "odd.csv", index=False)
    with pytest.raises(
        CorpusError, match=r"odd\.csv: row 17, column gender: cond_attribute 'gender', cond_value 'adult' is no prompt"
    ):
        generate.plan(p)
    for change, message in [
        (
            {"values": {"cond_value": {"M": "male"}}},
            r"corpus\.values\.cond_value: 'M' -> 'male' is not a value of cond_value",
        ),
        (
            {"columns": {**RACE_GENDER["columns"], "language": {"constant": "xx"}}},
            r"corpus\.columns\.language: constant 'xx'",
        ),
        (
            {"values": {"cond_scenario": {"a": "going_to_jail"}}},
            r"corpus\.values\.cond_scenario: not a condition the table maps",
        ),
    ]:
        with pytest.raises(params.ParamsError, match=message):
            _profile(tmp_path, {"path": str(tmp_path / "race-gender.csv"), **RACE_GENDER, **change}, name="bad.yaml")


def test_the_probe_groups_a_table_without_scenario_by_prompt(tmp_path, data_dir):
    rows = _race_gender_table(tmp_path / "race-gender.csv")
    p = _profile(tmp_path, {"path": str(tmp_path / "race-gender.csv"), **RACE_GENDER})
    planned = generate.plan(p).assign(text=TEXT)
    labels = planned["cond_value"].map({"man": "male", "woman": "female", "non_binary": "unknown"})
    extractions = pd.DataFrame(
        {"story_id": planned["story_id"], "parse_ok": True, "protagonist_gender": labels, "protagonist_name": "Sam"}
    )
    frame = stage_06_frame(extractions, planned, "gender")
    assert len(frame) == len(rows) and set(frame["grouping"]) == {BY_PROMPT_TEXT}
    groups = frame[frame["label"].isin(["female", "male"])].groupby("label")["group"].nunique()
    assert (groups == len(RACES)).all()  # one group per prompt, not one per prompted value
    assert BY_PROMPT_TEXT in grouping_note(frame) and f"{len(rows):,} stories" in grouping_note(frame)
    assert not [line for line in lens_shortfalls(p, planned, 10) if line.startswith("probe")]
    # the stereotales release's scenario prompts keep their prompt-cell groups
    cells = planned.assign(cond_scenario="going_to_jail")
    assert set(stage_06_frame(extractions, cells, "gender")["grouping"]) == {BY_PROMPT_CELL}
    # no prompt text either: each story is its own group
    alone = stage_06_frame(extractions, planned.assign(prompt=None), "gender")
    assert alone["group"].is_unique
