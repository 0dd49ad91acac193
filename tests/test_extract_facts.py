"""Two-step extraction (extract.prompt_design: two_step): quoted facts, then facts -> fields."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fake_engine import FakeEngine
from storybias.config import params
from storybias.core import artifacts, io, paths
from storybias.engines.cache import ResponseCache
from storybias.stages import extract as extract_stage
from storybias.stages.extract import answers as extract
from storybias.stages.extract import facts as extract_facts

DEMO = ("demographics",)


def step1(facts: str = "fifty-two; rents a flat", **fields) -> str:
    data = {"facts": facts, "name": "Maria", "gender": "woman"}
    data.update({d: "unknown" for d in extract_facts.map_dimensions()})
    data.update(fields)
    return json.dumps(data)


def step2(**fields) -> str:
    data = {d: "unknown" for d in extract_facts.map_dimensions()}
    data.update(fields)
    return json.dumps(data)


def test_map_prompt_lists_every_field_with_its_labels_and_ends_with_the_facts():
    prompt = extract_facts.map_prompt("35 years old; her husband Tom")
    for dim in extract_facts.map_dimensions():
        assert f'"{dim}":' in prompt
    assert '"gender":' not in prompt, "step 1 reads the gender from the whole story"
    assert "adult = adult (30-44)" in prompt and "senior = senior (65+)" in prompt
    assert "rural" in prompt and "rural = rural" not in prompt, "a label that only repeats the key is left out"
    assert prompt.endswith("Phrases about the protagonist:\n35 years old; her husband Tom")
    schema = extract_facts.map_schema()
    assert set(schema["required"]) == set(extract_facts.map_dimensions())
    assert schema["properties"]["age"]["enum"] == extract.allowed_values("age")


def test_worked_examples_precede_the_facts_as_answered_turns():
    settings = params.ExtractionSettings(prompt_design="two_step")
    messages = extract_facts.map_messages("twenty years old", settings)
    examples = extract.load_worked_examples()
    assert [m["role"] for m in messages] == ["user", "assistant"] * len(examples) + ["user"]
    for example, reply in zip(examples, messages[1::2]):
        parsed = extract_facts.parse_map(reply["content"])
        assert parsed is not None and parsed["age"] == example["answer"]["age"]
    assert messages[-1]["content"].endswith("twenty years old")
    # everything before this story's facts is the same for every story (one shared prefix)
    other = extract_facts.map_messages("a retired farmer", settings)
    assert other[:-1] == messages[:-1]


def test_merge_fills_only_what_step_1_left_unknown_and_says_which():
    merged = json.loads(
        extract_facts.merge(
            step1(income_level="middle"), step2(age="middle_aged", income_level="low", urbanicity="unknown")
        )
    )
    assert merged["age"] == "middle_aged", "an unknown field takes step 2's value"
    assert merged["income_level"] == "middle", "a field step 1 answered keeps its answer"
    assert merged["facts_mapped"] == ["age"]
    assert merged["name"] == "Maria" and merged["facts"].startswith("fifty-two")
    assert extract.parse_answer(json.dumps(merged), DEMO).ok


def test_an_unparsable_step_is_kept_as_it_was():
    broken = step2(age="middle_aged")[:30]
    merged = json.loads(extract_facts.merge(step1(), broken))
    assert merged["age"] == "unknown" and merged["facts_mapped"] == []
    assert extract_facts.parse_map(step2(age="ancient")) is None, "a value outside the list does not parse"
    assert extract_facts.merge('{"name": "Ma', step2(age="adult")) == '{"name": "Ma', "step 1's failure stays visible"
    assert extract_facts.facts_of('{"name": "Ma') == "" and extract_facts.facts_of(step1("  x ; y ")) == "x ; y"


def test_map_fields_limit_what_step_2_is_asked_and_what_it_may_fill():
    settings = params.ExtractionSettings(prompt_design="two_step", map_fields=["employment_status", "age"])
    assert extract_facts.map_dimensions(settings) == ["age", "employment_status"], "the taxonomy's order"
    prompt = extract_facts.map_prompt("a retired teacher", settings)
    assert '"employment_status":' in prompt and '"geographic_origin":' not in prompt
    assert set(extract_facts.map_schema(settings)["required"]) == {"age", "employment_status"}
    examples = extract_facts.map_messages("x", settings)[1::2]
    assert all(set(json.loads(m["content"])) == {"age", "employment_status"} for m in examples)
    # an answer with only the chosen fields parses under them (and not under the full list)
    answer = json.dumps({"age": "senior", "employment_status": "retired"})
    assert extract_facts.parse_map(answer, settings) == {"age": "senior", "employment_status": "retired"}
    assert extract_facts.parse_map(answer) is None
    # a field outside the list stays step 1's even when a step-2 answer names it
    merged = json.loads(extract_facts.merge(step1(), step2(age="senior", geographic_origin="europe"), settings))
    assert merged["age"] == "senior" and merged["geographic_origin"] == "unknown"
    assert merged["facts_mapped"] == ["age"]
    # other fields, another request: answers stored under the full list are not reused
    spec = params.ModelSpec(name="e", source="embedded")
    rows = _answers([("s0", "primary", step1("seventy; retired"))])
    every = params.ExtractionSettings(prompt_design="two_step")
    [full] = extract_facts.map_requests(extract_facts.map_jobs(rows, spec, every, {"s0": DEMO}), every, 1)
    [some] = extract_facts.map_requests(extract_facts.map_jobs(rows, spec, settings, {"s0": DEMO}), settings, 1)
    assert full.key == some.key and full.json_schema != some.json_schema and full.messages != some.messages


@pytest.mark.parametrize(
    "extract_settings, message",
    [
        ({"prompt_design": "two_step", "map_fields": ["agee"]}, "unknown field(s) ['agee']"),
        ({"prompt_design": "two_step", "map_fields": ["gender"]}, "unknown field(s) ['gender']"),
        ({"prompt_design": "one_answer", "map_fields": ["age"]}, "map_fields: needs prompt_design: two_step"),
    ],
)
def test_map_fields_errors_name_the_parameter(extract_settings, message):
    with pytest.raises(ValueError, match="map_fields") as error:
        params.ExtractionSettings(**extract_settings)
    assert message in str(error.value)


def _answers(rows):
    return pd.DataFrame(
        [
            {"request_key": f"{sid}|e|{p}|f", "story_id": sid, "extractor": "e", "pass": p, "attempt": 0, "raw": raw}
            for sid, p, raw in rows
        ]
    )


def test_resolve_merges_each_pass_with_its_own_step_2_and_drops_the_step_2_rows():
    answers = _answers(
        [
            ("s0", "primary", step1()),
            ("s0", "primary_map", step2(age="senior")),
            ("s0", "check", step1()),
            ("s0", "check_map", step2(age="adult")),
            ("s1", "primary", step1()),  # no step 2 (no facts, or not asked yet)
        ]
    )
    out = extract_facts.resolve(answers).set_index(["story_id", "pass"])
    assert len(out) == 3 and not out.index.get_level_values("pass").str.endswith("_map").any()
    assert json.loads(out.at[("s0", "primary"), "raw"])["age"] == "senior"
    assert json.loads(out.at[("s0", "check"), "raw"])["age"] == "adult"
    assert json.loads(out.at[("s1", "primary"), "raw"])["age"] == "unknown"
    plain = _answers([("s0", "primary", step1())])
    assert extract_facts.resolve(plain).equals(plain), "other designs pass through unchanged"


def test_map_jobs_need_demographics_parsed_answers_and_quoted_facts():
    spec = params.ModelSpec(name="e", source="embedded")
    settings = params.ExtractionSettings(prompt_design="two_step")
    answers = _answers(
        [
            ("s0", "primary", step1("thirty")),
            ("s1", "primary", step1("")),  # nothing quoted
            ("s2", "primary", step1("thirty")[:20]),  # does not parse
            ("s3", "primary", step1("thirty")),  # a bedtime story: narrative only
            ("s4", "primary_map", step2()),
        ]
    )
    sections = {"s0": DEMO, "s1": DEMO, "s2": DEMO, "s3": ("narrative",), "s4": DEMO}
    jobs = extract_facts.map_jobs(answers, spec, settings, sections)
    assert [j["story_id"] for j in jobs] == ["s0"] and jobs[0]["pass"] == "primary_map"
    again = extract_facts.map_jobs(answers.assign(raw=[step1("forty"), *answers["raw"][1:]]), spec, settings, sections)
    [before] = extract_facts.map_requests(jobs, settings, 1)
    [after] = extract_facts.map_requests(again, settings, 1)
    assert before.messages[-1] != after.messages[-1], "other facts, another step-2 request (another cache entry)"


def test_two_step_asks_for_facts_only_where_demographics_are_asked():
    settings = params.ExtractionSettings(prompt_design="two_step")
    demo = extract.extraction_request("k", "A story.", DEMO, settings, 0.0, 1)
    narrative = extract.extraction_request("k", "A story.", ("narrative",), settings, 0.0, 1)
    assert list(demo.json_schema["properties"])[0] == "facts"
    assert "facts" not in narrative.json_schema["properties"]
    one = extract.extraction_request(
        "k", "A story.", DEMO, params.ExtractionSettings(prompt_design="one_answer"), 0.0, 1
    )
    assert one.json_schema != demo.json_schema, "the two designs never share a cache entry"


class TwoStepExtractor(FakeEngine):
    """Step 1 quotes the story's facts (none for a story containing 'VAGUE') and leaves age unknown;
    step 2 answers age 'senior' and income 'low' (step 1 already said 'middle'); a story containing
    'GARBLED' gets a step-2 answer that does not parse, and one containing 'BROKEN' a step-1 answer cut
    the first time it is asked. ``kill_in_step_2``: the process is killed
    while step 2's n-th answer is computed (step 1 done and stored)."""

    def __init__(self, spec, kill_in_step_2: int | None = None, **kwargs):
        super().__init__(spec, answer=self._answer, **kwargs)
        self.kill_in_step_2, self.step_2_answers = kill_in_step_2, 0
        self.seen: set[str] = set()

    def _answer(self, r):
        if "name" in r.json_schema["properties"]:  # step 1
            story = r.messages[-1]["content"].split("Story:\n", 1)[1]
            facts = "" if "VAGUE" in story else story
            text = step1(facts, income_level="middle")
            first_time = story not in self.seen
            self.seen.add(story)
            return text[:30] if "BROKEN" in story and first_time else text  # cut once, then retried
        self.step_2_answers += 1
        if self.step_2_answers == self.kill_in_step_2:
            raise KeyboardInterrupt("simulated kill in step 2")
        text = step2(age="senior", income_level="low")
        return text[:20] if "GARBLED" in r.messages[-1]["content"] else text


def test_stage_runs_both_steps_resumes_after_a_kill_and_never_asks_twice(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setattr("storybias.stages.extract.preflight", lambda spec: (Path("."), "scripted"))
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["run_name"] = "unit-twostep"
    raw["extract"] = {
        "self_consistency_sample": 0,
        "gold_sample": 0,
        "prompt_design": "two_step",
        "sections": {"stereotales": ["demographics"]},
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    p = params.load(path)
    texts = ["A retired widow.", "A VAGUE story.", "A GARBLED story.", "A fourth story.", "A BROKEN story."]
    io.write_parquet_atomic(
        pd.DataFrame(
            {
                "story_id": [f"s{i}" for i in range(5)],
                "design": ["stereotales"] * 5,
                "language": ["en"] * 5,
                "model": ["m"] * 5,
                "text": texts,
                "cond_task": [None] * 5,
                "is_valid": [True] * 5,
            }
        ),
        artifacts.filtered_path("unit-twostep"),
    )
    # killed in step 2's second answer, after the five step-1 answers were stored: the finished step-2
    # answer is stored on the way out (storybias.engines.runner flushes what it received)
    with pytest.raises(KeyboardInterrupt):
        extract_stage.run(
            p, progress=False, log=lambda m: None, engine_factory=lambda spec: TwoStepExtractor(spec, kill_in_step_2=2)
        )
    stored = ResponseCache.for_run("unit-twostep").store.read_all().to_pandas()
    # five step-1 answers, one of them in two attempts (the first was cut), and one step-2 answer
    assert sorted(k.split("|")[2] for k in stored["logical_key"]) == ["primary"] * 6 + ["primary_map"]
    calls: list[str] = []
    result = extract_stage.run(
        p, progress=False, log=lambda m: None, engine_factory=lambda spec: TwoStepExtractor(spec, calls=calls)
    )
    assert not any(c.split("|")[2] == "primary" for c in calls), "stored step-1 answers are never asked again"
    assert sorted(c.split("|")[0] for c in calls) == ["s2", "s3", "s4"], (
        "the owed step-2 answers, and only where facts were quoted"
    )
    ex = result["extractions"].set_index("story_id")
    assert ex["parse_ok"].all()
    assert ex.at["s0", "demo_age"] == "senior", "filled from the facts"
    assert ex.at["s0", "demo_income_level"] == "middle", "step 1's answer is kept"
    assert ex.at["s1", "demo_age"] == "unknown", "no facts, no step 2"
    assert ex.at["s2", "demo_age"] == "unknown", "a step-2 answer that does not parse fills nothing"
    final = result["raw"]
    assert ex.at["s4", "demo_age"] == "senior", "the retried answer's facts were mapped"
    assert final["answer_key"].is_unique and len(final) == 10  # 6 step-1 attempts + 4 step-2 answers
    garbled = final[(final.story_id == "s2") & final["pass"].str.endswith("_map")]
    assert not garbled["parse_ok"].iloc[0] and garbled["raw"].iloc[0], "kept and counted, not dropped"
    manifest = io.read_json(paths.run_dir("unit-twostep") / "manifest_extract.json")
    assert manifest["two_step"] == {  # answers, not attempts
        "n_step1": 5,
        "n_with_facts": 4,
        "n_step2": 4,
        "n_step2_parse_failed": 1,
        "n_fields_filled": 3,
        "filled_per_field": {"age": 3},
    }
    calls.clear()
    again = extract_stage.run(
        p, progress=False, log=lambda m: None, engine_factory=lambda spec: TwoStepExtractor(spec, calls=calls)
    )
    assert calls == [] and again["raw"].shape == final.shape, "a finished run has nothing left to ask"


def test_the_api_cost_estimate_counts_step_2_for_the_stories_asked_demographics(tmp_path):
    from storybias.tools.cost import estimate

    raw = yaml.safe_load((paths.params_dir() / "api-example.yaml").read_text())
    served = raw["generation"]["models"][0]
    raw["designs"] = {
        "stereotales": {"languages": ["en"], "n_prompts": 6},
        "occupations": {"languages": ["en"], "n_prompts": 4},
    }
    raw["extract"] = {
        "models": [dict(served)],  # a copy: one object twice would be dumped as a YAML alias, which is refused
        "self_consistency_sample": 0,
        "gold_sample": 0,
        "sections": {"stereotales": ["demographics"], "occupations": ["markers"]},
    }
    rows = {}
    for design in ("one_answer", "two_step"):
        raw["extract"]["prompt_design"] = design
        path = tmp_path / f"{design}.yaml"
        path.write_text(yaml.safe_dump(raw))
        rows[design] = {r.stage: r for r in estimate(params.load(path))}["extract"]
    one, two = rows["one_answer"], rows["two_step"]
    assert two.requests - one.requests == 6, "one step-2 request per stereotales story, none for occupations"
    assert two.output_tokens - one.output_tokens == 6 * params.ExtractionSettings().max_tokens
    assert two.input_tokens > one.input_tokens
