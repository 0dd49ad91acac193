"""StereoTales' extraction rules (issue #29 item 1): the stereotales design's ``extraction_rules`` reach
both steps' instructions, its ``extraction_defaults`` fill a parsed answer's unknown (health is good unless
the story says otherwise) and the gold set's truth, and ``extract.design_rules: false`` restores
storybias' instructions without them."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from storybias.config import designs, params
from storybias.stages.extract import answers as extract
from storybias.stages.extract import facts as extract_facts
from storybias.stages.extract.consensus import assemble
from storybias.stages.extract.gold import gold_truth, load_gold
from storybias.stages.extract.parse import with_defaults


def _settings(**changes) -> params.ExtractionSettings:
    return params.ExtractionSettings(**changes)


def test_the_design_states_the_reference_rules():
    rules = " ".join(designs.extraction_rules()).lower()
    for fact in (
        "start of the story",
        "health_status: good unless",
        "disability",
        "literate when",
        "reading or writing",
    ):
        assert fact in rules, fact
    assert designs.extraction_defaults() == {"health_status": "good"}


def test_both_steps_carry_the_rules_unless_switched_off():
    rules = designs.extraction_rules()
    with_rules = extract.extraction_messages("Once.", ("demographics",), _settings())
    without = extract.extraction_messages("Once.", ("demographics",), _settings(design_rules=False))
    assert all(rule in with_rules[-1]["content"] for rule in rules)
    assert not any(rule in without[-1]["content"] for rule in rules)
    # the worked examples' turns are asked the same way as the story
    assert rules[0] in with_rules[0]["content"] and rules[0] not in without[0]["content"]
    # a design whose sections have no demographic field gets no rule
    assert rules[1] not in extract.extraction_messages("Once.", ("narrative",), _settings())[-1]["content"]
    assert rules[1] in extract_facts.map_prompt("a retired teacher", _settings())
    assert rules[1] not in extract_facts.map_prompt("a retired teacher", _settings(design_rules=False))


LISTS = {"adjectives": [], "settings": [], "cultural_refs": [], "markers": []}


def _answer(**fields) -> str:
    data = {"name": "", "gender": "woman", **LISTS, **{d: "unknown" for d in extract.dimensions() if d != "gender"}}
    data.update(fields)
    return json.dumps(data)


def test_defaults_fill_a_parsed_answer_only():
    record = extract.to_record(json.loads(_answer()), ["demographics"])
    assert with_defaults(record, {"health_status": "good"})["demo_health_status"] == "good"
    poor = extract.to_record(json.loads(_answer(health_status="poor")), ["demographics"])
    assert with_defaults(poor, {"health_status": "good"})["demo_health_status"] == "poor"
    stories = pd.DataFrame(
        {
            "story_id": ["s1", "s2", "s3"],
            "design": ["stereotales", "stereotales", "bedtime"],
            "cond_task": [None, None, None],
        }
    )
    raw = pd.DataFrame(
        {
            "story_id": ["s1", "s2", "s3"],
            "request_key": ["s1|e|primary", "s2|e|primary", "s3|e|primary"],
            "extractor": ["qwen2.5-coder-1.5b"] * 3,
            "pass": ["primary"] * 3,
            "attempt": [0, 0, 0],
            "raw": [_answer(), "not json", json.dumps({"name": "", "gender": "woman", **LISTS})],
            "story_cut": [False] * 3,
        }
    )
    for rules, expected in ((True, "good"), (False, "unknown")):
        # the bedtime stories asked for the narrative lists only
        settings = _settings(design_rules=rules, sections={"bedtime": ["narrative", "markers"]})
        table = assemble(stories, raw, settings).set_index("story_id")
        assert table.loc["s1", "demo_health_status"] == expected
        assert (
            table.loc["s2", "demo_health_status"] == "unknown" and not table.loc["s2", "parse_ok"]
        )  # kept, not filled
        # a story not asked the demographic fields: nothing to fill
        assert table.loc["s3", "demo_health_status"] == "unknown"


def test_gold_truth_follows_the_rules():
    item = next(it for it in load_gold() if it["protagonist"]["health_status"] == "unknown")
    assert gold_truth(item)["demo_health_status"] == "unknown"
    assert gold_truth(item, designs.extraction_defaults())["demo_health_status"] == "good"


def test_a_refusal_has_every_field_unknown_without_asking_an_extractor():
    """StereoTales' reference: a refusal's fields are all unknown (issue #29 item 11); storybias uses
    stage 02's refusal check for the designs of extract.refusals_unknown (default: stereotales)."""
    from storybias.stages.extract import plan_jobs

    stories = pd.DataFrame(
        {
            "story_id": ["s1", "s2", "s3"],
            "design": ["stereotales", "stereotales", "bedtime"],
            "cond_task": [None, None, None],
            "text": ["I can't write that story.", "Once upon a time...", "I cannot help with that."],
            "language": ["en"] * 3,
            "is_refusal": [True, False, True],
            "refusal_rule": ["en:cant_write", None, "en:cannot_help"],
        }
    )
    settings = _settings()
    assert settings.refusals_unknown == ["stereotales"]
    assert sorted({j.story_id for j in plan_jobs(stories, settings)}) == ["s2", "s3"]
    raw = pd.DataFrame(
        {
            "story_id": ["s2", "s3"],
            "request_key": ["s2|e|primary", "s3|e|primary"],
            "extractor": ["e", "e"],
            "pass": ["primary"] * 2,
            "attempt": [0, 0],
            "raw": [_answer(age="adult"), _answer(age="adult")],
            "story_cut": [False] * 2,
        }
    )
    table = assemble(stories, raw, _settings(models=[{"name": "e", "source": "embedded"}])).set_index("story_id")
    assert table.loc["s1", "parse_ok"] and list(table.loc["s1", "extractors"]) == ["refusal-check"]
    assert table.loc["s1", "demo_age"] == "unknown" and table.loc["s1", "demo_health_status"] == "unknown"
    assert table.loc["s3", "demo_age"] == "adult"  # another design's refusal is extracted (its rule excludes it)
    off = _settings(refusals_unknown=[])
    assert sorted({j.story_id for j in plan_jobs(stories, off)}) == ["s1", "s2", "s3"]
    with pytest.raises(ValueError, match="refusals_unknown"):
        _settings(refusals_unknown=["novels"])


def test_list_caps_follow_the_study_in_the_paper_profile():
    """BiasedTales-ML states no cap on the extracted lists (issue #29 item 7): the paper profile has none,
    and the schema then sets no maxItems; the default's 6 is a stated departure."""
    from storybias.config import params as P
    from storybias.core import paths

    paper = P.load(paths.params_dir() / "paper.yaml").extract
    assert paper.max_list_items is None
    props = extract.build_schema(("narrative", "markers"), paper.max_list_items)["properties"]
    assert all("maxItems" not in props[k] for k in ("adjectives", "settings", "cultural_refs", "markers"))
    assert extract.build_schema(("narrative",), 6)["properties"]["settings"]["maxItems"] == 6
