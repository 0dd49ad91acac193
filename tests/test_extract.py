"""Stage 03 without a model: schema, parsing, votes, agreement, parse-failure accounting, gold scoring."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from storybias import extract, io, params, paths
from storybias.engines import FakeEngine
from storybias.prompts import load_design

ALL = ("demographics", "narrative", "markers")


def answer(**overrides) -> dict:
    data = {"name": "Amina", "gender": "woman"}
    for dim in extract.dimensions():
        if dim != "gender":
            data[dim] = "unknown"
    data.update(
        adjectives=[{"word": "courageuse", "lemma_en": "Brave"}],
        settings=["kitchen"],
        cultural_refs=["couscous"],
        markers=[
            {
                "text": "Ramadan",
                "text_en": "Ramadan",
                "keep": True,
                "category": "rituals",
                "relevance_en": 2,
                "relevance_fr": 4,
                "relevance_zh": 1,
            }
        ],
    )
    data.update(overrides)
    return data


def test_schema_is_built_from_the_design():
    schema = extract.build_schema(ALL)
    props = schema["properties"]
    spec = load_design("stereotales")
    for dim, values in spec["dimensions"].items():
        if dim == "gender":
            assert props[dim]["enum"] == list(extract.GENDER_ANSWERS)  # one gender question serves both labels
            continue
        allowed = props[dim]["enum"]
        assert allowed[: len(values)] == values and allowed[-1] == "unknown"
        assert ("other" in allowed) == (dim in spec["extraction_other"])
    assert props["gender"]["enum"] == list(extract.GENDER_ANSWERS)
    assert props["markers"]["items"]["properties"]["category"]["enum"] == list(extract.MARKER_CATEGORIES)
    assert set(schema["required"]) == set(props) and schema["additionalProperties"] is False
    only = extract.build_schema(())
    assert set(only["properties"]) == {"name", "gender"}
    with pytest.raises(ValueError):
        extract.build_schema(("feelings",))


def test_prompt_lists_every_allowed_value():
    prompt = extract.build_prompt("Il était une fois.", ["demographics"])
    for value in extract.allowed_values("professional_field"):
        assert value in prompt
    assert prompt.endswith("Il était une fois.")
    assert '"woman" if the protagonist is female' in prompt


def test_parse_and_record():
    parsed = extract.parse_answer(json.dumps(answer(income_level="low")), ALL)
    assert parsed.ok
    record = extract.to_record(parsed.data, ALL)
    assert record["demo_income_level"] == "low" and record["demo_gender"] == "woman"
    assert record["protagonist_gender"] == "female" and record["protagonist_name"] == "Amina"
    assert record["adjectives_en"] == ["brave"] and record["adjectives_orig"] == ["courageuse"]
    assert record["markers"][0]["category"] == "rituals"


def test_truncated_json_is_a_parse_failure_not_an_exception():
    raw = json.dumps(answer())[:50]
    parsed = extract.parse_answer(raw, ALL)
    assert not parsed.ok and "not JSON" in parsed.error
    assert not extract.parse_answer('{"name": "x"}', ALL).ok
    assert not extract.parse_answer(json.dumps(answer(income_level="billionaire")), ALL).ok
    assert extract.to_record(None, ALL)["demo_age"] == "unknown"


def test_gender_outcomes_map_to_labels():
    fine = {g: extract.to_record(answer(gender=g), ALL) for g in extract.GENDER_ANSWERS}
    assert fine["several_people"]["protagonist_gender"] == "unknown"
    assert fine["several_people"]["protagonist_gender_fine"] == "multiple"
    assert fine["no_person"]["protagonist_gender_fine"] == "none"
    assert fine["non_binary"]["demo_gender"] == "non_binary"
    assert fine["man"]["protagonist_gender"] == "male"


def test_majority_vote_and_ties():
    assert extract.majority(["a", "a", "b"]) == "a"
    assert extract.majority(["a", "b"]) == "unknown"
    assert extract.majority(["a", "b", "c", "c", "b"]) == "unknown"
    assert extract.majority([]) == "unknown"
    assert extract.majority_list([["brave", "kind"], ["brave"], ["kind", "tall"]]) == ["brave", "kind"]
    assert extract.majority_list([["brave"], ["kind"]]) == []
    records = [extract.to_record(answer(income_level=v), ALL) for v in ("low", "low", "high")]
    assert extract.combine(records)["demo_income_level"] == "low"
    tie = [extract.to_record(answer(income_level=v), ALL) for v in ("low", "high")]
    assert extract.combine(tie)["demo_income_level"] == "unknown"


def test_cohen_kappa_hand_computed():
    # 10 items, two raters. Table: yes/yes 4, yes/no 1, no/yes 1, no/no 4.
    a = ["y"] * 5 + ["n"] * 5
    b = ["y", "y", "y", "y", "n", "y", "n", "n", "n", "n"]
    # p_o = 0.8; p_e = 0.5*0.5 + 0.5*0.5 = 0.5; kappa = (0.8 - 0.5) / 0.5 = 0.6
    assert extract.cohen_kappa(a, b) == pytest.approx(0.6)
    assert pd.isna(extract.cohen_kappa(["x", "x"], ["x", "x"]))


def test_fleiss_kappa_hand_computed():
    # 4 items x 3 raters; categories a/b.
    ratings = [["a", "a", "a"], ["a", "a", "b"], ["b", "b", "b"], ["a", "b", "b"]]
    # P_i = [1, 1/3, 1, 1/3] -> P_bar = 2/3; p_a = p_b = 0.5 -> P_e = 0.5; kappa = (2/3 - 1/2)/(1/2) = 1/3
    assert extract.fleiss_kappa(ratings) == pytest.approx(1 / 3)


def test_agreement_table_counts_unknown():
    frames = {
        "r1": pd.DataFrame({"f": ["a", "b", "unknown", "a"]}, index=list("wxyz")),
        "r2": pd.DataFrame({"f": ["a", "b", "a", "unknown"]}, index=list("wxyz")),
    }
    table = extract.agreement(frames, ["f"]).iloc[0]
    assert table["percent_agreement"] == 0.5 and table["share_unknown"] == 0.25 and table["method"] == "cohen"


def test_explicit_labels_map_in_every_language():
    assert extract.explicit_gender("woman", "en") == "female"
    assert extract.explicit_gender("Man.", "en") == "male"
    assert extract.explicit_gender("femme", "fr") == "female"
    assert extract.explicit_gender("男性", "zh") == "male"
    assert extract.explicit_gender("I cannot say", "en") == "unidentified"


def test_gold_scoring_and_baseline():
    truth = [
        {
            "protagonist_gender": g,
            "protagonist_gender_fine": g,
            "protagonist_name": None,
            **{c: "unknown" for c in extract.demo_columns()},
            "adjectives_en": ["brave", "kind"],
        }
        for g in ("female", "female", "male", "unknown")
    ]
    pred = [dict(t) for t in truth]
    pred[3]["protagonist_gender"] = "female"
    pred[0]["adjectives_en"] = ["brave"]
    scores = extract.score_gold(truth, pred).set_index("field")
    assert scores.loc["protagonist_gender", "accuracy"] == 0.75
    assert scores.loc["protagonist_gender", "majority_baseline"] == 0.5
    assert scores.loc["protagonist_gender", "accuracy_known"] == 1.0  # three known, all right
    adj = scores.loc["adjectives_en (precision/recall/F1)"]
    assert adj["majority_baseline"] == 1.0 and adj["accuracy_known"] == pytest.approx(7 / 8)


def test_gold_set_is_well_formed():
    items = extract.load_gold()
    assert len(items) >= 60 and len({i["language"] for i in items}) >= 6
    assert len({i["id"] for i in items}) == len(items)
    for item in items:
        truth = extract.gold_truth(item)
        for dim in extract.dimensions():
            assert truth[f"demo_{dim}"] in extract.allowed_values(dim), (item["id"], dim)


# --- the stage with a scripted extractor ------------------------------------------------------


class WordTokenizer:
    """Whitespace 'tokens' (what fit_story needs of a tokenizer)."""

    def encode(self, text, add_special_tokens=False):
        return text.split()

    def decode(self, ids):
        return " ".join(ids)


class ScriptedExtractor(FakeEngine):
    """The one fake engine answering with valid JSON, except: the first answer for any story whose text
    contains 'BROKEN' is cut mid-object (a truncated output), and stories containing 'HOPELESS' never parse."""

    def __init__(self, spec, **kwargs):
        self.seen: dict[str, int] = {}
        super().__init__(spec, answer=self._answer, tokenizer=WordTokenizer(), n_tokens=9, n_prompt_tokens=99, **kwargs)

    def _answer(self, r):
        story = r.messages[-1]["content"].split("Story:\n", 1)[1]
        n = self.seen.get(r.key, 0)
        self.seen[r.key] = n + 1
        text = json.dumps(answer(income_level="low"))
        if "HOPELESS" in story or ("BROKEN" in story and n == 0):
            text = text[:40]
        return text


def test_stage_keeps_and_counts_parse_failures(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["run_name"] = "unit-extract"
    raw["extract"] = {"retries": 1, "self_consistency_sample": 2, "gold_sample": 6, "prompt_design": "one_answer"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    p = params.load(path)
    texts = ["A calm story.", "A BROKEN story.", "A HOPELESS story.", "Another calm story."]
    filtered = pd.DataFrame(
        {
            "story_id": [f"s{i}" for i in range(5)],
            "design": ["stereotales"] * 4 + ["occupations"],
            "language": ["en"] * 5,
            "model": ["m"] * 5,
            "text": texts + ["woman"],
            "cond_task": [None] * 4 + ["explicit"],
            "is_valid": [True] * 5,
        }
    )
    io.write_parquet_atomic(filtered, paths.filtered_path("unit-extract"))
    monkeypatch.setattr("storybias.engines.preflight", lambda spec: (Path("."), "scripted"))
    result = extract.run(p, progress=False, engine_factory=ScriptedExtractor, log=lambda m: None)
    ex = result["extractions"].set_index("story_id")
    assert len(ex) == 5
    # written with the contract's types even where a column is empty here (no names, no markers)
    assert pq.read_schema(paths.extractions_path("unit-extract")).remove_metadata() == extract.extractions_schema()
    assert ex.loc["s1", "parse_ok"] and ex.loc["s1", "demo_income_level"] == "low"  # retried, then parsed
    assert not ex.loc["s2", "parse_ok"] and ex.loc["s2", "demo_income_level"] == "unknown"
    assert json.loads(ex.loc["s2", "raw"])["qwen2.5-coder-1.5b"].startswith('{"name"')  # the raw text is kept
    assert ex.loc["s4", "protagonist_gender"] == "female" and ex.loc["s4", "extractors"] == ["label-map"]
    raw_answers = result["raw"]
    attempts = raw_answers[raw_answers.story_id == "s2"].groupby("pass")["attempt"].max()
    assert (attempts == 1).all(), "retries are bounded (retries = 1) and every attempt is recorded"
    failures = result["failures"].set_index("language")
    assert failures.loc["en", "n_parse_failed"] == 1
    assert "self-consistency" in result["agreement_how"]
    gold = result["gold"]
    assert gold["n_items"] == 6 and len(gold["languages"]) == 6, "round-robin over the gold languages"
    assert set(gold["scores"]["field"]) >= {"protagonist_gender", "demo_income_level", "protagonist_name"}
    # a rerun has nothing left to do and gives the same table
    again = extract.run(p, progress=False, engine_factory=ScriptedExtractor, log=lambda m: None)
    assert again["raw"].shape == raw_answers.shape


def test_changed_story_or_schema_recomputes_only_what_changed(tmp_path, monkeypatch):
    """Issue #12.2: an answer stored for an old story text (or an old schema) used to be reused."""
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setattr("storybias.engines.preflight", lambda spec: (Path("."), "scripted"))
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["run_name"] = "unit-refresh"
    raw["extract"] = {"retries": 0, "self_consistency_sample": 0, "gold_sample": 0, "prompt_design": "one_answer"}

    def load(**extraction):
        raw["extract"].update(extraction)
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump(raw))
        return params.load(path)

    def write_stories(texts):
        io.write_parquet_atomic(
            pd.DataFrame(
                {
                    "story_id": [f"s{i}" for i in range(len(texts))],
                    "design": ["stereotales"] * len(texts),
                    "language": ["en"] * len(texts),
                    "model": ["m"] * len(texts),
                    "text": texts,
                    "cond_task": [None] * len(texts),
                    "is_valid": [True] * len(texts),
                }
            ),
            paths.filtered_path("unit-refresh"),
        )

    asked: list[str] = []

    class Counting(ScriptedExtractor):
        def stream(self, requests):
            asked.extend(r.key.split("|")[0] for r in requests)
            yield from super().stream(requests)

    write_stories(["One story.", "Two story.", "Three story."])
    extract.run(load(), progress=False, engine_factory=Counting, log=lambda m: None)
    assert sorted(asked) == ["s0", "s1", "s2"]
    asked.clear()
    write_stories(["One story, regenerated.", "Two story.", "Three story."])
    again = extract.run(load(), progress=False, engine_factory=Counting, log=lambda m: None)
    assert asked == ["s0"]
    manifest = io.read_json(paths.manifest_path("unit-refresh", "extract"))
    assert manifest["reuse"] == {"recomputed: story text changed": 1, "reused": 2}
    assert len(again["raw"]) == 3, "the stage's tables hold the current answers only"
    asked.clear()
    extract.run(load(max_list_items=3), progress=False, engine_factory=Counting, log=lambda m: None)
    assert sorted(asked) == ["s0", "s1", "s2"]
    manifest = io.read_json(paths.manifest_path("unit-refresh", "extract"))
    assert manifest["reuse"] == {"recomputed: extraction prompt or schema changed": 3}


def _assembled(consensus: str, answers_by_extractor: dict[str, str]) -> pd.Series:
    """``assemble`` on one stereotales story answered by the given extractors (raw texts)."""
    settings = params.ExtractionSettings(
        models=[params.ModelSpec(name=n, source="embedded") for n in answers_by_extractor], consensus=consensus
    )
    stories = pd.DataFrame(
        {
            "story_id": ["s0"],
            "design": ["stereotales"],
            "language": ["en"],
            "model": ["m"],
            "text": ["A story."],
            "cond_task": [None],
        }
    )
    raw = pd.DataFrame(
        [
            {
                "story_id": "s0",
                "extractor": n,
                "pass": "primary",
                "attempt": 0,
                "raw": text,
                "request_key": extract.request_key("s0", n, "primary"),
                "story_cut": False,
            }
            for n, text in answers_by_extractor.items()
        ]
    )
    return extract.assemble(stories, raw, settings).iloc[0]


def test_consensus_of_the_extractors_that_answered():
    # 3 extractors, one unparsed, the two that answered agree: the story is kept with their value
    # (StereoTales' consensus); the former rule dropped it because one answer failed to parse.
    answers = {
        "e1": json.dumps(answer(income_level="low")),
        "e2": '{"name": "Ami',
        "e3": json.dumps(answer(income_level="low")),
    }
    row = _assembled("answered_majority", answers)
    assert row["parse_ok"] and row["demo_income_level"] == "low" and row["n_parse_failures"] == 1
    assert not _assembled("all_parsed", answers)["parse_ok"]
    # the two that answered disagree: kept, the field has no majority -> unknown
    split = {**answers, "e3": json.dumps(answer(income_level="high"))}
    row = _assembled("answered_majority", split)
    assert row["parse_ok"] and row["demo_income_level"] == "unknown"
    # nobody answered: dropped
    assert not _assembled("answered_majority", {"e1": "no", "e2": "{", "e3": ""})["parse_ok"]


def test_majority_is_a_strict_majority_of_the_votes_not_a_plurality():
    assert extract.majority(["a", "a", "b", "c"]) == "unknown"  # 2 of 4: a plurality, not a majority
    assert extract.majority(["a", "a", "a", "b"]) == "a"
    assert extract.majority(["a"]) == "a"
    assert params.ExtractionSettings().consensus == "answered_majority"


# --- the per_field prompt design (issue #15) ------------------------------------------------------


class PerFieldExtractor(FakeEngine):
    """Answers each per-field question as a constrained engine would: the scripted value of its field
    (``answer()``'s), the name as text, the lists as JSON; the lists answer of a story containing
    'BROKEN' is cut mid-object the first time it is asked."""

    def __init__(self, spec, **kwargs):
        self.seen: dict[str, int] = {}
        super().__init__(spec, answer=self._answer, tokenizer=WordTokenizer(), **kwargs)

    def _answer(self, r):
        story = r.messages[0]["content"].split("Story:\n", 1)[1].split("\n\n---\n", 1)[0]
        field = r.key.rpartition("#")[2]
        data = answer(income_level="low", age="senior")
        if field == "name":
            return "NONE" if "NAMELESS" in story else data["name"]
        if field == "lists":
            n = self.seen.get(r.key, 0)
            self.seen[r.key] = n + 1
            text = json.dumps({k: data[k] for k in r.json_schema["properties"]})
            return text[:25] if "BROKEN" in story and n == 0 else text
        assert data[field] in r.choice, f"{field}: the scripted value must be one of the engine's choices"
        return data[field]


def test_per_field_requests_put_the_story_first_and_constrain_each_field():
    settings = params.ExtractionSettings(prompt_design="per_field")
    requests = extract.answer_requests("s0|e|primary|f", "Il était une fois.", ALL, settings, 0.0, 7)
    fields = [r.key.rpartition("#")[2] for r in requests]
    dims = [d for d in extract.dimensions() if d != "gender"]
    assert fields == ["name", "gender", *dims, "lists"]
    for r in requests:
        # one shared prefix per story: the engine's prefix cache computes the story once
        assert r.messages[0]["content"].startswith("Story:\nIl était une fois.\n\n---\n")
        assert r.seed == 7 and r.sampling.temperature == 0.0
    by_field = dict(zip(fields, requests))
    for dim in dims:
        assert by_field[dim].choice == extract.allowed_values(dim)
    assert by_field["gender"].choice == list(extract.GENDER_ANSWERS)
    # StereoTales' labels (age ranges) are shown to the extractor, not only the canonical keys
    assert "senior: senior (65+)" in by_field["age"].messages[0]["content"]
    assert set(by_field["lists"].json_schema["properties"]) == {"adjectives", "settings", "cultural_refs", "markers"}
    only_demo = extract.answer_requests("k", "A story.", ["demographics"], settings, 0.0, 7)
    assert not any(r.key.endswith("#lists") for r in only_demo), "no list question when no list is asked"
    one = extract.answer_requests("k", "A story.", ALL, params.ExtractionSettings(prompt_design="one_answer"), 0.0, 7)
    assert len(one) == 1 and one[0].json_schema == extract.build_schema(ALL)


def test_per_field_answers_join_into_one_answer_and_resume_without_duplicates(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setattr("storybias.engines.preflight", lambda spec: (Path("."), "scripted"))
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["run_name"] = "unit-perfield"
    raw["extract"] = {
        "retries": 1,
        "self_consistency_sample": 0,
        "gold_sample": 0,
        "prompt_design": "per_field",
        "sections": {"stereotales": ["demographics", "narrative"]},
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    p = params.load(path)
    texts = ["A story about Amina.", "A BROKEN story.", "A NAMELESS story.", "A fourth story."]
    io.write_parquet_atomic(
        pd.DataFrame(
            {
                "story_id": [f"s{i}" for i in range(4)],
                "design": ["stereotales"] * 4,
                "language": ["en"] * 4,
                "model": ["m"] * 4,
                "text": texts,
                "cond_task": [None] * 4,
                "is_valid": [True] * 4,
            }
        ),
        paths.filtered_path("unit-perfield"),
    )
    n_questions = len(extract.answer_requests("k", "x", ("demographics", "narrative"), p.extraction, 0.0, 1))
    # killed in the middle of the second story's questions: the first story's answer is stored whole,
    # the second's partial answers are not stored at all
    with pytest.raises(KeyboardInterrupt):
        extract.run(
            p,
            progress=False,
            log=lambda m: None,
            engine_factory=lambda spec: PerFieldExtractor(spec, crash_after=n_questions + 3),
        )
    stored = (
        io.ShardStore(paths.work_dir("unit-perfield", "extract"), key="answer_key", schema=extract._raw_schema())
        .read_all()
        .to_pandas()
    )
    assert stored["story_id"].tolist() == ["s0"] and stored["parse_ok"].tolist() == [True]
    calls: list[str] = []
    result = extract.run(
        p, progress=False, log=lambda m: None, engine_factory=lambda spec: PerFieldExtractor(spec, calls=calls)
    )
    assert not any(c.startswith("s0|") for c in calls), "a stored answer is never asked again"
    ex = result["extractions"].set_index("story_id")
    assert ex["parse_ok"].all()
    assert ex.at["s0", "demo_income_level"] == "low" and ex.at["s0", "demo_age"] == "senior"
    assert ex.at["s0", "demo_gender"] == "woman" and ex.at["s0", "protagonist_name"] == "Amina"
    assert pd.isna(ex.at["s2", "protagonist_name"]), "NONE means unnamed"
    assert list(ex.at["s0", "adjectives_en"]) == ["brave"]
    # the cut list answer was kept as a failed attempt, then retried: one answer per attempt, no duplicate
    final = result["raw"]
    broken = final[final["story_id"] == "s1"].sort_values("attempt")
    assert broken["parse_ok"].tolist() == [False, True] and "lists_raw" in broken["raw"].iloc[0]
    assert final["answer_key"].is_unique and len(final) == 5


def test_gold_targets_count_answers_guesses_and_accuracy_separately():
    items = [it for it in extract.load_gold() if it["language"] == "en"][:4]
    truths = [extract.gold_truth(it) for it in items]
    perfect = extract.gold_targets(truths, truths)
    assert perfect == {
        "macro_accuracy_known": 1.0,
        "answered_known": 1.0,
        "unknown_kept": 1.0,
        "gender_accuracy": 1.0,
        "adjective_f1": 1.0,
    }
    silent = [dict(t, **{c: "unknown" for c in extract.demo_columns()}) for t in truths]
    got = extract.gold_targets(truths, silent)
    assert got["answered_known"] == 0.0 and got["macro_accuracy_known"] == 0.0 and got["unknown_kept"] == 1.0
    # a guesser answers every unknown field with some value: it loses unknown_kept, not accuracy
    guesser = [{**t, **{c: ("guess" if t[c] == "unknown" else t[c]) for c in extract.demo_columns()}} for t in truths]
    got = extract.gold_targets(truths, guesser)
    assert got["unknown_kept"] == 0.0 and got["macro_accuracy_known"] == 1.0
    table = extract.gold_table(items, truths)
    assert table["language"].tolist() == ["en", "all", "target"]
    assert table.set_index("language").at["target", "adjective_f1"] == extract.GOLD_TARGETS["adjective_f1"]


@pytest.mark.parametrize("facts_first", [False, True])
@pytest.mark.parametrize(
    "sections", [("demographics",), ("narrative",), ("markers",), ("demographics", "narrative"), ALL]
)
def test_every_worked_example_answers_within_the_schema(sections, facts_first):
    examples = extract.load_worked_examples()
    assert len(examples) >= 2
    for example in examples:
        answer = extract.example_answer(example["answer"], sections, facts_first)
        parsed = extract.parse_answer(answer, sections)
        assert parsed.ok, (example["answer"]["name"], parsed.error)
        assert list(json.loads(answer)) == list(extract.build_schema(sections, facts_first=facts_first)["properties"])
        # a worked example must not come from the gold set that scores the extractor
        assert all(example["text"][:60] not in item["text"] for item in extract.load_gold())


def test_worked_examples_precede_each_story_as_one_shared_prefix():
    settings = params.ExtractionSettings()
    assert settings.prompt_design == "one_answer" and settings.worked_examples and not settings.facts_first
    a = extract.answer_requests("a", "First story.", ["demographics"], settings, 0.0, 7)[0]
    b = extract.answer_requests("b", "Second story.", ["demographics"], settings, 0.0, 7)[0]
    n_examples = len(extract.load_worked_examples())
    assert len(a.messages) == 2 * n_examples + 1
    assert [m["role"] for m in a.messages[:2]] == ["user", "assistant"]
    assert a.messages[:-1] == b.messages[:-1]  # the prefix the engine's cache computes once
    assert a.messages[-1]["content"].endswith("Story:\nFirst story.")
    plain = extract.answer_requests(
        "a", "First story.", ["demographics"], settings.model_copy(update={"worked_examples": False}), 0.0, 7
    )
    assert len(plain[0].messages) == 1


def test_facts_first_opens_the_answer_and_stays_out_of_the_table():
    settings = params.ExtractionSettings(facts_first=True)
    [request] = extract.answer_requests("a", "A story.", ["demographics"], settings, 0.0, 7)
    assert list(request.json_schema["properties"])[0] == "facts"
    assert extract.FACTS_RULE in request.messages[-1]["content"]
    answer = json.loads(extract.example_answer(extract.load_worked_examples()[0]["answer"], ["demographics"], True))
    parsed = extract.parse_answer(json.dumps(answer), ["demographics"])
    assert parsed.ok and "facts" not in extract.to_record(parsed.data, ["demographics"])


def test_changing_the_worked_examples_or_facts_first_changes_the_answer_fingerprint():
    spec = params.ModelSpec(name="qwen2.5-coder-1.5b", source="embedded")
    base = params.ExtractionSettings()
    prints = {
        extract.answer_fingerprint("A story.", ["demographics"], "primary", spec, s)
        for s in (
            base,
            base.model_copy(update={"worked_examples": False}),
            base.model_copy(update={"facts_first": True}),
        )
    }
    assert len(prints) == 3


def test_worked_examples_need_the_one_answer_design():
    assert not params.ExtractionSettings(prompt_design="per_field").facts_first  # the default is accepted
    for key in ("worked_examples", "facts_first"):
        with pytest.raises(ValueError, match=f"{key}: true needs prompt_design: one_answer"):
            params.ExtractionSettings(prompt_design="per_field", **{key: True})


def test_worked_examples_are_read_once_per_version_of_the_file(tmp_path, monkeypatch):
    import os

    path = tmp_path / "worked_examples.yaml"
    monkeypatch.setattr(paths, "worked_examples_path", lambda: path)
    path.write_text("- {text: One., answer: {name: A}}\n")
    first = extract.load_worked_examples()
    assert extract.load_worked_examples() is first  # cached: not re-read for every story
    path.write_text("- {text: Two., answer: {name: B}}\n")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    assert extract.load_worked_examples()[0]["text"] == "Two."  # an edited file is read again
    path.write_text("text: not a list\n")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 2_000_000))
    with pytest.raises(ValueError, match="worked_examples.yaml: expected a list of examples"):
        extract.load_worked_examples()
