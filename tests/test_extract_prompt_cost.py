"""Issue #61 item 2: what stage 03's prompt costs is a setting (worked examples shown, instructions
repeated or once), the default prompt is today's byte for byte, and the variants are compared on the
gold set by a paired bootstrap over the stories."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from fake_engine import FakeEngine
from storybias.config import params
from storybias.core import paths
from storybias.evidence.recorded import RECORDED_COLUMNS
from storybias.stages.extract import answers as extract
from storybias.stages.extract import gold_compare
from storybias.stats.bootstrap import paired_bootstrap_difference
from storybias.tools import gold_variants

SECTION_SETS = [("demographics", "narrative"), ("demographics",), ("narrative",), ("markers",)]


def todays_messages(story: str, sections, settings) -> list[dict[str, str]]:
    """The prompt as stage 03 built it before issue #61: every worked example as (instructions + its
    story, its answer), then the instructions + the story."""
    facts = extract.asks_facts(settings, sections)
    messages = []
    for example in extract.load_worked_examples():
        messages.append(
            {"role": "user", "content": extract.build_prompt(example["text"], sections, facts, settings.design_rules)}
        )
        messages.append({"role": "assistant", "content": extract.example_answer(example["answer"], sections, facts)})
    return [*messages, {"role": "user", "content": extract.build_prompt(story, sections, facts, settings.design_rules)}]


@pytest.mark.parametrize("design", ["two_step", "one_answer"])
@pytest.mark.parametrize("sections", SECTION_SETS)
def test_the_default_prompt_is_todays_byte_for_byte(design, sections):
    settings = params.ExtractionSettings(prompt_design=design, worked_examples=None, example_instructions="every_turn")
    assert settings == params.ExtractionSettings(prompt_design=design), "the defaults are today's prompt"
    request = extract.extraction_request("k", "Il était une fois Amina.", sections, settings, 0.0, 7)
    expected = todays_messages("Il était une fois Amina.", sections, settings)
    assert json.dumps(request.messages, ensure_ascii=False) == json.dumps(expected, ensure_ascii=False)


def test_fewer_worked_examples_keep_the_files_first_ones():
    examples = extract.load_worked_examples()
    for n in range(len(examples) + 1):
        settings = params.ExtractionSettings(worked_examples=n)
        messages = extract.extraction_request("k", "A story.", ["demographics"], settings, 0.0, 7).messages
        assert len(messages) == 2 * n + 1
        assert [m["content"].endswith(e["text"]) for m, e in zip(messages[::2], examples[:n])] == [True] * n
        assert "Rules:" in messages[-1]["content"]
    too_many = params.ExtractionSettings(worked_examples=len(examples) + 1)
    with pytest.raises(ValueError, match="extract.worked_examples: 3 asked, worked_examples.yaml holds 2"):
        extract.extraction_request("k", "A story.", ["demographics"], too_many, 0.0, 7)
    with pytest.raises(ValidationError, match="worked_examples"):
        params.ExtractionSettings(worked_examples=-1)
    with pytest.raises(ValidationError, match="example_instructions"):
        params.ExtractionSettings(example_instructions="never")


def test_instructions_once_are_in_the_first_turn_and_later_turns_carry_the_story_alone():
    settings = params.ExtractionSettings(example_instructions="first_turn")
    messages = extract.extraction_request("k", "A story.", ["demographics"], settings, 0.0, 7).messages
    users = [m["content"] for m in messages if m["role"] == "user"]
    assert "Rules:" in users[0] and extract.FACTS_RULE in users[0]
    assert users[1:] == [f"Story:\n{e['text']}" for e in extract.load_worked_examples()[1:]] + ["Story:\nA story."]
    alone = params.ExtractionSettings(example_instructions="first_turn", worked_examples=0)
    only = extract.extraction_request("k", "A story.", ["demographics"], alone, 0.0, 7).messages
    assert len(only) == 1 and "Rules:" in only[0]["content"], "with no worked example the one turn keeps them"


def test_the_prompt_settings_are_in_stage_03s_stamp():
    base = params.load(paths.repo_root() / "params" / "smoke.yaml")
    for key, value in [("worked_examples", 1), ("example_instructions", "first_turn")]:
        changed = params.load(paths.repo_root() / "params" / "smoke.yaml", f"extract.{key}={value}")
        assert changed.stage_digest("extract") != base.stage_digest("extract"), key


def random_answers(rng: np.random.Generator, n: int) -> tuple[list[dict], list[dict]]:
    fields = [c for c in extract.demo_columns() if c != "demo_gender"]
    values = ["unknown", "a", "b"]
    lemmas = ["brave", "kind", "tired", "old"]
    truths, predictions = [], []
    for _ in range(n):
        truth = {f: values[rng.integers(3)] for f in fields}
        guess = {f: values[rng.integers(3)] for f in fields}
        truth["protagonist_gender"], guess["protagonist_gender"] = rng.choice(["woman", "man"], 2)
        for record in (truth, guess):
            record.update(demo_gender=record["protagonist_gender"], protagonist_name="Amina")
            record["protagonist_gender_fine"] = record["protagonist_gender"]
        truth["adjectives_en"] = list(rng.choice(lemmas, rng.integers(0, 3), replace=False))
        guess["adjectives_en"] = list(rng.choice(lemmas, rng.integers(0, 3), replace=False))
        truths.append(truth)
        predictions.append(guess)
    return truths, predictions


def test_story_counts_sum_to_gold_targets_measures():
    rng = np.random.default_rng(3)
    truths, predictions = random_answers(rng, 40)
    measures = gold_compare.measures_from_counts(gold_compare.story_counts(truths, predictions).sum(0))[0]
    targets = extract.gold_targets(truths, predictions)
    assert measures == pytest.approx([targets[m] for m in gold_compare.MEASURES])


def simulated_pair(rng: np.random.Generator, n_sets: int, n_stories: int, drop: float) -> tuple[np.ndarray, ...]:
    """Per-story counts of a baseline and a variant on ``n_sets`` gold sets of ``n_stories`` stories,
    shaped like the gold set's (18 demographic fields, half known; gender; a few adjectives). Each
    story has its own difficulty, shared by both variants and all its fields (stories are not
    exchangeable units of fields), and the variant gives the baseline's answer 90% of the time (as two
    settings of one model do); otherwise it answers anew, right with the story's probability less ``drop``."""
    n_fields = 18
    difficulty = rng.beta(2, 2, size=(n_sets, n_stories, 1))
    known = rng.random((n_sets, n_stories, n_fields)) < 0.5
    base_right = rng.random((n_sets, n_stories, n_fields)) < difficulty
    fresh = rng.random((n_sets, n_stories, n_fields)) < np.clip(difficulty - drop, 0, 1)
    new_right = np.where(rng.random((n_sets, n_stories, n_fields)) < 0.9, base_right, fresh)

    def counts(right: np.ndarray) -> np.ndarray:
        per_field = np.stack([right & known, known], axis=-1).reshape(n_sets, n_stories, 2 * n_fields)
        answered = (right & known).sum(-1) + (~right & known).sum(-1) // 2
        kept = (right & ~known).sum(-1)
        gender = right[..., 0]
        adjectives = np.stack(
            [right[..., 1:4].sum(-1), np.full((n_sets, n_stories), 3), np.full((n_sets, n_stories), 3)], -1
        )
        tail = np.stack([answered, known.sum(-1), kept, (~known).sum(-1), gender, np.ones_like(gender)], -1)
        return np.concatenate([per_field, tail, adjectives], axis=-1).astype(float)

    return counts(base_right), counts(new_right)


def rejection_rates(drop: float, n_sets: int) -> np.ndarray:
    """Share of simulated gold sets whose paired interval excludes 0 from below (the variant is worse),
    per measure."""
    rng = np.random.default_rng(11 if drop else 7)
    base, new = simulated_pair(rng, n_sets, 72, drop)
    worse = np.zeros(len(gold_compare.MEASURES))
    for b, n in zip(base, new):
        result = paired_bootstrap_difference(b, n, gold_compare.measures_from_counts, 500, 5)
        worse += result["upper"] < 0
    return worse / n_sets


def test_paired_bootstrap_rarely_calls_an_equal_variant_worse():
    """Level: under no difference the interval lies below 0 in about 2.5% of gold sets (one side of a 95%
    interval); a paired percentile bootstrap of 72 stories may run a little above, so at most 6%."""
    rates = rejection_rates(0.0, 300)
    assert rates.max() <= 0.06, rates


def test_paired_bootstrap_finds_a_variant_a_tenth_worse():
    """Power: the variant answers anew 10% of the time, right with probability 0.3 lower: the macro
    accuracy on known fields drops by about 0.03, which the 72 paired stories find most of the time."""
    rates = rejection_rates(0.3, 200)
    assert rates[0] >= 0.8, rates


def test_paired_bootstrap_names_bad_input():
    with pytest.raises(ValueError, match="counts_base"):
        paired_bootstrap_difference(np.ones((3, 2)), np.ones((4, 2)), lambda s: s, 10, 0)
    with pytest.raises(ValueError, match="at least 2 units"):
        paired_bootstrap_difference(np.ones((1, 2)), np.ones((1, 2)), lambda s: s, 10, 0)


def test_compare_variants_flags_a_variant_worse_than_the_baseline():
    rng = np.random.default_rng(5)
    truths, predictions = random_answers(rng, 72)
    worse = [{**p, "protagonist_gender": "unclear"} if i % 2 else p for i, p in enumerate(predictions)]
    cost = {
        "n_items": 72,
        "n_parsed": 72,
        "n_requests": 144,
        "prompt_tokens": 72_000,
        "output_tokens": 7_200,
        "seconds": 9.0,
    }
    table = gold_compare.compare_variants(
        {"baseline": (truths, predictions), "same": (truths, list(predictions)), "worse": (truths, worse)},
        {"baseline": cost, "same": {**cost, "prompt_tokens": 36_000}, "worse": cost},
        n_boot=400,
    ).set_index("variant")
    assert table.loc["same", "gender_accuracy_diff"] == 0 and table.loc["same", "not_worse"]
    assert table.loc["worse", "gender_accuracy_high"] < 0 and not table.loc["worse", "not_worse"]
    assert table.loc["same", "prompt_tokens_per_story"] == 500 and table.loc["baseline", "requests_per_story"] == 2


def test_the_cheapest_not_worse_variant_is_on_the_token_front():
    table = pd.DataFrame(
        {
            "variant": ["baseline", "worse_but_cheap", "short_prompt", "short_answer", "both_shorter"],
            "not_worse": [True, False, True, True, True],
            "prompt_tokens_per_story": [2000.0, 100.0, 900.0, 1900.0, 1000.0],
            "output_tokens_per_story": [130.0, 20.0, 125.0, 80.0, 100.0],
        }
    )
    assert gold_compare.cheapest_not_worse(table) == "short_answer"
    assert gold_compare.cheapest_not_worse(table[table["variant"] != "short_answer"]) == "both_shorter"
    with pytest.raises(ValueError, match="no variant is not worse"):
        gold_compare.cheapest_not_worse(table.assign(not_worse=False))


def test_gold_variants_runs_each_variant_once_and_writes_the_table(tmp_path, monkeypatch):
    (tmp_path / "docs" / "measurements").mkdir(parents=True)
    for name in ("params", "config"):
        (tmp_path / name).symlink_to(paths.repo_root() / name)
    monkeypatch.setattr(paths, "repo_root", lambda: tmp_path)
    calls: list[str] = []
    monkeypatch.setattr(gold_variants, "open_engine", lambda spec, *a: FakeEngine(spec, calls=calls))
    p = params.load(tmp_path / "params" / "smoke.yaml")
    args = ["baseline", "one:worked_examples=1"]
    text = gold_variants.gold_variants(p, args, table_only=False, n_boot=50)
    n_gold = len(extract.load_gold())
    assert len(calls) == 2 * n_gold  # one answer per story and variant (the fake's answers do not parse)
    table = pd.read_csv(tmp_path / gold_variants.TABLE_PATH)
    assert list(table["variant"]) == ["baseline", "one"] and "macro_accuracy_known_low" in text
    assert table["settings"].fillna("").tolist() == ["", "worked_examples=1"] and table["chosen"].sum() == 1
    assert tuple(table.columns) == RECORDED_COLUMNS["extraction_prompt_variants"], "the recorded table's columns"
    assert table["prompt_tokens_per_story"].tolist() == [11.0, 11.0] and table["n_parsed"].tolist() == [0, 0]
    gold_variants.gold_variants(p, [*args, "two:worked_examples=1,prompt_design=one_answer,map_fields=null"], False, 50)
    assert len(calls) == 3 * n_gold, "kept variants are not asked again"
    with pytest.raises(ValueError, match="unknown extract setting"):
        gold_variants.gold_variants(p, ["baseline", "x:examples=1"], False, 50)
    with pytest.raises(ValueError, match="not key=value"):
        gold_variants.parse_variant("x:worked_examples")
