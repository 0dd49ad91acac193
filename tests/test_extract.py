"""Stage 03 without a model: schema, parsing, votes, agreement, parse-failure accounting, gold scoring."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from fake_engine import FakeEngine
from storybias.config import params
from storybias.config.prompts import load_design
from storybias.core import artifacts, io, paths
from storybias.stages import extract as extract_stage
from storybias.stages.extract import answers as extract
from storybias.stages.extract import extraction_precision

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
    records = [extract.to_record(answer(income_level=v), ALL) for v in ("low", "low", "high")]
    assert extract.combine(records)["demo_income_level"] == "low"
    tie = [extract.to_record(answer(income_level=v), ALL) for v in ("low", "high")]
    assert extract.combine(tie)["demo_income_level"] == "unknown"


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
        n = self.seen.get(story, 0)  # attempts of this story so far
        self.seen[story] = n + 1
        text = json.dumps(answer(income_level="low"))
        if "HOPELESS" in story or ("BROKEN" in story and n == 0):
            text = text[:40]
        return text


def test_stage_keeps_and_counts_parse_failures(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["run_name"] = "unit-extract"
    raw["extract"] = {"retries": 1, "self_consistency_sample": 2, "gold_sample": 6, "prompt_design": "one_answer"}
    raw["extract"]["human_validation"] = "tests/data/support_ratings_example.csv"
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
    io.write_parquet_atomic(filtered, artifacts.filtered_path("unit-extract"))
    monkeypatch.setattr("storybias.stages.extract.preflight", lambda spec: (Path("."), "scripted"))
    result = extract_stage.run(p, progress=False, engine_factory=ScriptedExtractor, log=lambda m: None)
    ex = result["extractions"].set_index("story_id")
    assert len(ex) == 5
    # written with the contract's types even where a column is empty here (no names, no markers)
    assert pq.read_schema(artifacts.extractions_path("unit-extract")).remove_metadata() == extract.extractions_schema()
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
    # what notebook 03 shows is in the result (issue #59 item 3): the human validation file read by the stage,
    # the genders of the 5 stories per design x language, the unknown share of each demographic, smallest first
    judged, compared = result["human_validation"]
    assert judged.equals(extraction_precision.from_settings(p.extract.human_validation)[0]) and len(compared)
    assert result["gender_by_language"].to_numpy().sum() == 5
    shares = result["unknown_share"]["share_unknown"]
    assert set(shares.index) == set(extract.demo_columns()) and shares.is_monotonic_increasing
    # a rerun has nothing left to do and gives the same table
    again = extract_stage.run(p, progress=False, engine_factory=ScriptedExtractor, log=lambda m: None)
    assert again["raw"].shape == raw_answers.shape


def test_changed_story_or_schema_recomputes_only_what_changed(tmp_path, monkeypatch):
    """Issue #12.2: an answer stored for an old story text (or an old schema) used to be reused."""
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setattr("storybias.stages.extract.preflight", lambda spec: (Path("."), "scripted"))
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
            artifacts.filtered_path("unit-refresh"),
        )

    asked: list[str] = []

    class Counting(ScriptedExtractor):
        def stream(self, requests):
            asked.extend(r.key.split("|")[0] for r in requests)
            yield from super().stream(requests)

    write_stories(["One story.", "Two story.", "Three story."])
    extract_stage.run(load(), progress=False, engine_factory=Counting, log=lambda m: None)
    assert sorted(asked) == ["s0", "s1", "s2"]
    asked.clear()
    write_stories(["One story, regenerated.", "Two story.", "Three story."])
    again = extract_stage.run(load(), progress=False, engine_factory=Counting, log=lambda m: None)
    assert asked == ["s0"]
    manifest = io.read_json(artifacts.manifest_path("unit-refresh", "extract"))
    assert manifest["reuse"] == {"prompt changed": 1, "reused": 2}
    assert len(again["raw"]) == 3, "the stage's tables hold the current answers only"
    asked.clear()
    extract_stage.run(load(max_list_items=3), progress=False, engine_factory=Counting, log=lambda m: None)
    assert sorted(asked) == ["s0", "s1", "s2"]
    manifest = io.read_json(artifacts.manifest_path("unit-refresh", "extract"))
    assert manifest["reuse"] == {"constraint changed": 3}  # the schema's list length
    asked.clear()
    extract_stage.run(load(max_list_items=3), progress=False, engine_factory=Counting, log=lambda m: None)
    assert asked == [], "an unchanged run asks nothing"


@pytest.mark.parametrize(
    "engine, asked_again",
    [({"compact_json": True}, 3), ({"enforce_eager": True}, 3), ({"max_num_seqs": 4}, 0), ({"cpu_kvcache_gb": 9}, 0)],
    ids=["compact_json", "enforce_eager", "max_num_seqs", "cpu_kvcache_gb"],
)
def test_an_engine_setting_that_shapes_answers_reruns_stage_03_and_one_that_cannot_does_not(
    tmp_path, monkeypatch, engine, asked_again
):
    """Stage 03 runs on generation.engine: whitespace-free JSON (compact_json) used to reuse the
    answers written with free whitespace, because neither the answer fingerprint nor the stage's
    Make stamp read the engine settings."""
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setattr("storybias.stages.extract.preflight", lambda spec: (Path("."), "scripted"))
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["run_name"] = "unit-engine"
    raw["extract"] = {"retries": 0, "self_consistency_sample": 0, "gold_sample": 0, "prompt_design": "one_answer"}
    path = tmp_path / "p.yaml"

    def load(**settings) -> params.Params:
        raw["generation"]["engine"] = settings
        path.write_text(yaml.safe_dump(raw))
        return params.load(path)

    stories = pd.DataFrame(
        {
            "story_id": ["s0", "s1", "s2"],
            "design": ["stereotales"] * 3,
            "language": ["en"] * 3,
            "model": ["m"] * 3,
            "text": ["One.", "Two.", "Three."],
            "cond_task": [None] * 3,
            "is_valid": [True] * 3,
        }
    )
    io.write_parquet_atomic(stories, artifacts.filtered_path("unit-engine"))
    calls: list[str] = []
    first = load()
    extract_stage.run(first, progress=False, engine_factory=lambda s: ScriptedExtractor(s, calls=calls), log=print)
    calls.clear()
    changed = load(**engine)
    extract_stage.run(changed, progress=False, engine_factory=lambda s: ScriptedExtractor(s, calls=calls), log=print)
    assert len(calls) == asked_again
    # Make reruns stage 03 exactly when the setting can shape its answers (the cache's classification, #59)
    assert (first.stage_digest("extract") != changed.stage_digest("extract")) == (asked_again > 0)


def _assembled(answers_by_extractor: dict[str, str]) -> pd.Series:
    """``assemble`` on one stereotales story answered by the given extractors (raw texts)."""
    settings = params.ExtractionSettings(
        models=[params.ModelSpec(name=n, source="embedded") for n in answers_by_extractor]
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
                "request_key": f"s0|{n}|primary",
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
    row = _assembled(answers)
    assert row["parse_ok"] and row["demo_income_level"] == "low" and row["n_parse_failures"] == 1
    # the two that answered disagree: kept, the field has no majority -> unknown
    split = {**answers, "e3": json.dumps(answer(income_level="high"))}
    row = _assembled(split)
    assert row["parse_ok"] and row["demo_income_level"] == "unknown"
    # nobody answered: dropped
    assert not _assembled({"e1": "no", "e2": "{", "e3": ""})["parse_ok"]


def test_majority_is_a_strict_majority_of_the_votes_not_a_plurality():
    assert extract.majority(["a", "a", "b", "c"]) == "unknown"  # 2 of 4: a plurality, not a majority
    assert extract.majority(["a", "a", "a", "b"]) == "a"
    assert extract.majority(["a"]) == "a"


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


@pytest.mark.parametrize("with_facts", [False, True])
@pytest.mark.parametrize(
    "sections", [("demographics",), ("narrative",), ("markers",), ("demographics", "narrative"), ALL]
)
def test_every_worked_example_answers_within_the_schema(sections, with_facts):
    examples = extract.load_worked_examples()
    assert len(examples) >= 2
    for example in examples:
        answer = extract.example_answer(example["answer"], sections, with_facts)
        parsed = extract.parse_answer(answer, sections)
        assert parsed.ok, (example["answer"]["name"], parsed.error)
        assert list(json.loads(answer)) == list(extract.build_schema(sections, with_facts=with_facts)["properties"])
        # a worked example must not come from the gold set that scores the extractor
        assert all(example["text"][:60] not in item["text"] for item in extract.load_gold())


@pytest.mark.parametrize("design", ["one_answer", "two_step"])
def test_worked_examples_precede_each_story_as_one_shared_prefix(design):
    settings = params.ExtractionSettings(prompt_design=design)
    a = extract.extraction_request("a", "First story.", ["demographics"], settings, 0.0, 7)
    b = extract.extraction_request("b", "Second story.", ["demographics"], settings, 0.0, 7)
    n_examples = len(extract.load_worked_examples())
    assert len(a.messages) == 2 * n_examples + 1
    assert [m["role"] for m in a.messages[:2]] == ["user", "assistant"]
    assert a.messages[:-1] == b.messages[:-1]  # the prefix the engine's cache computes once
    assert a.messages[-1]["content"].endswith("Story:\nFirst story.")


def test_two_step_opens_a_demographic_answer_with_facts_that_stay_out_of_the_table():
    settings = params.ExtractionSettings()
    assert settings.prompt_design == "two_step", "the schema's default design"
    request = extract.extraction_request("a", "A story.", ["demographics"], settings, 0.0, 7)
    assert list(request.json_schema["properties"])[0] == "facts"
    assert extract.FACTS_RULE in request.messages[-1]["content"]
    answer = json.loads(extract.example_answer(extract.load_worked_examples()[0]["answer"], ["demographics"], True))
    parsed = extract.parse_answer(json.dumps(answer), ["demographics"])
    assert parsed.ok and "facts" not in extract.to_record(parsed.data, ["demographics"])
    one_answer = settings.model_copy(update={"prompt_design": "one_answer"})
    one = extract.extraction_request("a", "A story.", ["demographics"], one_answer, 0.0, 7)
    assert "facts" not in one.json_schema["properties"]


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


def test_the_marker_extractor_leaves_out_occupation_terms_as_feng_et_als_does():
    """Feng et al. App. D.1: the extraction agent proposes markers excluding occupation terms; storybias'
    one-call extractor carries that rule (the four agents in one answer: notebook 06 says so)."""
    prompt = extract.build_prompt("Il était une fois une infirmière.", ["markers"])
    assert "leave out words for occupations or professions" in prompt
    assert "occupations" not in extract.build_prompt("Il était une fois.", ["narrative"])


def test_notebook_03s_unknown_share_and_genders_on_a_hand_made_table():
    """Issue #59 item 3: the share of unknown answers among the parsed answers an extractor gave (a failed
    parse and a label-map-only row are left out), and the genders per design x language, in stage 03's result."""
    demo = extract.demo_columns()
    first, second, rest = demo[0], demo[1], demo[2:]
    rows = [
        # answered: first known in all three; second unknown in one of three; the rest unknown in all three
        {first: "a", second: "unknown", **dict.fromkeys(rest, "unknown")},
        {first: "a", second: "b", **dict.fromkeys(rest, "unknown")},
        {first: "a", second: "b", **dict.fromkeys(rest, "unknown")},
        {first: "unknown", second: "unknown", **dict.fromkeys(rest, "a")},  # does not parse
        {first: "unknown", second: "unknown", **dict.fromkeys(rest, "a")},  # prompt labels only
    ]
    extractions = pd.DataFrame(rows).assign(
        story_id=list("abcde"),
        parse_ok=[True, True, True, False, True],
        extractors=[["m"], ["m", "n"], ["m"], ["m"], ["label-map"]],
        protagonist_gender=["woman", "man", "woman", "woman", "man"],
    )
    shares = extract_stage.unknown_shares(extractions)["share_unknown"]
    assert list(shares.index[:2]) == [first, second]
    assert shares[first] == 0.0 and shares[second] == pytest.approx(1 / 3)
    assert all(shares[c] == 1.0 for c in rest) and len(shares) == len(demo)
    stories = pd.DataFrame(
        {
            "story_id": list("abcde"),
            "design": ["bedtime", "bedtime", "bedtime", "stereotales", "stereotales"],
            "language": ["en", "en", "fr", "fr", "fr"],
            "model": "m",
        }
    )
    genders = extract_stage.gender_by_language(extractions, stories)
    assert genders.to_dict("index") == {
        ("bedtime", "en"): {"man": 1, "woman": 1},
        ("bedtime", "fr"): {"man": 0, "woman": 1},
        ("stereotales", "fr"): {"man": 1, "woman": 1},
    }
