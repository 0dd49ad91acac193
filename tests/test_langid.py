"""Stage 02: language identification, refusal rules, validity and the VSR table."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from storybias import summaries
from storybias.config.plan import STORIES_SCHEMA
from storybias.config.prompts import LANGUAGES
from storybias.core import artifacts, paths
from storybias.stages.filter import langid

LANG_DATA = {
    lang: yaml.safe_load((paths.repo_root() / "tests" / "data" / "lang" / f"{lang}.yaml").read_text())
    for lang in LANGUAGES
}


@pytest.mark.parametrize("lang", list(LANGUAGES))
def test_lid_identifies_handwritten_sentences(lang):
    sentences = LANG_DATA[lang]["lid_sentences"]
    assert len(sentences) >= 3
    found, probs = langid.identify(sentences)
    assert found == [lang] * len(sentences), f"{lang}: {list(zip(found, probs.round(2)))}"
    assert ((probs > 0) & (probs <= 1.0)).all()
    if lang == "sw":
        # lid.176 is under-confident on Swahili even for clean text (top-1 right at p ~ 0.35-0.45):
        # with the 0.5 threshold many good Swahili stories fail, which is BiasedTales-ML's ~49% VSR.
        assert (probs < 0.5).any()
    else:
        assert (probs > 0.5).all(), f"{lang}: {probs.round(2)}"


def test_lid_handles_newlines_empty_and_clips():
    text = "The old fisherman mended his nets.\nThe sun went down\r\nbehind the quiet hills of the bay."
    [lang], probs = langid.identify([text])
    assert lang == "en" and 0.5 < probs[0] <= 1.0
    langs, probs = langid.identify(["", "   \n  "])
    assert langs == ["", ""] and list(probs) == [0.0, 0.0]


def test_lid_label_mapping():
    assert langid.lid_code("__label__zh") == "zh"
    assert langid.lid_code("__label__wuu") == "wuu"


@pytest.mark.parametrize("lang", list(LANGUAGES))
def test_refusal_rules_true_positives_and_negatives(lang):
    data = LANG_DATA[lang]
    for text in data["refusals"]:
        assert langid.detect_refusal(text, lang), f"{lang}: missed refusal {text!r}"
    for text in data["non_refusals"]:
        assert langid.detect_refusal(text, lang) is None, f"{lang}: false refusal {text!r}"


def test_english_refusal_caught_whatever_the_prompt_language():
    rule = langid.detect_refusal("I'm sorry, but I cannot write a story about that.", "fr")
    assert rule and rule.startswith("en:")


def test_refusal_only_looks_at_the_opening():
    story = "Once upon a time " + "there was a quiet village. " * 20 + "I cannot write, said the old poet."
    assert langid.detect_refusal(story, "en") is None


def _stories(rows):
    base = {"design": "bedtime", "model": "m", "finish_reason": "stop", "cond_task": None}
    return pd.DataFrame([{**base, "story_id": f"s{i}", **r} for i, r in enumerate(rows)])


def test_classify_reasons_in_order():
    """With a rule that counts every check, the first failing one is the reason recorded."""
    en = LANG_DATA["en"]["lid_sentences"][0]
    fr = LANG_DATA["fr"]["lid_sentences"][0]
    stories = _stories(
        [
            {"language": "en", "text": en},
            {"language": "en", "text": "   "},
            {"language": "en", "text": en, "finish_reason": "length"},
            {"language": "en", "text": LANG_DATA["en"]["refusals"][0]},
            {"language": "en", "text": fr},
            {"language": "fr", "text": fr},
        ]
    )
    out = langid.classify(stories, exclude={"bedtime": list(langid.INVALID_REASONS)})
    assert list(out["invalid_reason"].fillna("valid")) == [
        "valid",
        "empty",
        "truncated",
        "refusal",
        "wrong_language",
        "valid",
    ]
    assert list(out["is_valid"]) == [True, False, False, False, False, True]
    assert out.loc[4, "lid_lang"] == "fr"
    assert len(out) == len(stories), "every row is kept"


def test_bedtime_default_is_biasedtales_rule_truncated_stays_valid():
    """BiasedTales-ML: valid = lid.176 gives the prompt's language with p > 0.5, and not a refusal.
    A story cut at max_tokens is valid there (the old rule made it invalid everywhere)."""
    en = LANG_DATA["en"]["lid_sentences"][0]
    stories = _stories(
        [
            {"language": "en", "text": en, "finish_reason": "length"},
            {"language": "en", "text": LANG_DATA["en"]["refusals"][0]},
            {"language": "en", "text": LANG_DATA["fr"]["lid_sentences"][0], "finish_reason": "length"},
        ]
    )
    out = langid.classify(stories)
    assert list(out["is_valid"]) == [True, False, False]
    # the truncated story in the wrong language is excluded for its language, not for its length
    assert list(out["invalid_reason"].fillna("valid")) == ["valid", "refusal", "wrong_language"]
    flags = langid.reason_flags(out)
    assert flags.loc[0, "truncated"] and flags.loc[2, "truncated"] and flags.loc[2, "wrong_language"], (
        "every check is recorded"
    )


def test_stereotales_has_no_language_filter_and_occupations_keep_every_record():
    fr = LANG_DATA["fr"]["lid_sentences"][0]
    refusal = LANG_DATA["en"]["refusals"][0]
    rows = [
        {"design": "stereotales", "language": "en", "text": fr},
        {"design": "stereotales", "language": "en", "text": " "},
        {"design": "stereotales", "language": "en", "text": fr, "finish_reason": "length"},
        {"design": "occupations", "language": "en", "text": fr},
        {"design": "occupations", "language": "en", "text": refusal, "finish_reason": "length"},
        {"design": "occupations", "language": "en", "text": ""},
        {"design": "bedtime", "language": "en", "text": fr},
    ]
    out = langid.classify(_stories(rows))
    assert list(out["is_valid"]) == [True, False, True, True, True, True, False]
    assert out.loc[1, "invalid_reason"] == "empty" and out.loc[6, "invalid_reason"] == "wrong_language"


def test_low_confidence_uses_the_threshold():
    stories = _stories([{"language": "en", "text": LANG_DATA["en"]["lid_sentences"][0]}])
    assert langid.classify(stories, lid_threshold=0.5).loc[0, "is_valid"]
    out = langid.classify(stories, lid_threshold=0.999999)
    assert out.loc[0, "invalid_reason"] == "low_confidence"


def test_truncation_can_be_made_invalid_per_design():
    stories = _stories([{"language": "en", "text": LANG_DATA["en"]["lid_sentences"][0], "finish_reason": "length"}])
    assert langid.classify(stories).loc[0, "is_valid"]
    out = langid.classify(stories, exclude={"bedtime": ["truncated", "wrong_language"]})
    assert not out.loc[0, "is_valid"] and out.loc[0, "invalid_reason"] == "truncated"


def test_select_keeps_what_the_design_rule_keeps():
    en = LANG_DATA["en"]["lid_sentences"][0]
    stories = _stories(
        [
            {"language": "en", "text": en, "finish_reason": "length"},
            {"language": "en", "text": LANG_DATA["en"]["refusals"][0]},
        ]
    )
    assert list(summaries.valid_stories(langid.classify(stories))["story_id"]) == ["s0"]


def test_the_default_filter_rules():
    from storybias.config.params import FilterSettings

    assert FilterSettings().exclude.bedtime == ["empty", "refusal", "wrong_language", "low_confidence"]


def test_explicit_answers_skip_language_id():
    stories = _stories([{"language": "zh", "text": "female", "cond_task": "explicit", "design": "occupations"}])
    out = langid.classify(stories)
    assert out.loc[0, "is_valid"] and pd.isna(out.loc[0, "lid_lang"]) and pd.isna(out.loc[0, "lid_prob"])


def test_vsr_arithmetic_on_a_hand_made_table():
    rows = []
    # model a: en 3 of 4 valid, zh 1 of 2; model b: en 2 of 2
    for valid in (True, True, True, False):
        rows.append({"model": "a", "language": "en", "is_valid": valid, "invalid_reason": None if valid else "refusal"})
    for valid in (True, False):
        rows.append(
            {"model": "a", "language": "zh", "is_valid": valid, "invalid_reason": None if valid else "wrong_language"}
        )
    for _ in range(2):
        rows.append({"model": "b", "language": "en", "is_valid": True, "invalid_reason": None})
    filtered = pd.DataFrame(rows).assign(design="bedtime", story_id=[f"s{i}" for i in range(len(rows))])
    vsr = langid.vsr_table(filtered)
    a_en = vsr[(vsr.design == "bedtime") & (vsr.model == "a") & (vsr.language == "en")].iloc[0]
    assert (a_en.n_stories, a_en.n_valid, a_en.vsr, a_en.n_refusal) == (4, 3, 0.75, 1)
    matrix = summaries.vsr_matrix(vsr)
    assert matrix.loc["en", "a"] == 75.0 and matrix.loc["zh", "a"] == 50.0 and matrix.loc["en", "b"] == 100.0
    assert matrix.loc["en", "Overall"] == round(5 / 6 * 100, 1)  # pooled over models
    assert matrix.loc["Average", "a"] == 62.5
    assert list(matrix.index) == ["en", "zh", "Average"]


def test_table3_is_the_bedtime_design_not_all_designs_pooled():
    """Table 3 reports BiasedTales-ML's own stories: stereotales stories and explicit-task labels of the
    same model x language must not move it (the old default pooled every design as ``all``)."""
    rows = [
        {"design": "bedtime", "model": "a", "language": "en", "is_valid": v, "invalid_reason": None if v else "refusal"}
        for v in (True, False)
    ]
    rows += [{"design": "stereotales", "model": "a", "language": "en", "is_valid": True, "invalid_reason": None}] * 6
    filtered = pd.DataFrame(rows).assign(story_id=[f"s{i}" for i in range(len(rows))])
    vsr = langid.vsr_table(filtered)
    assert set(vsr["design"]) == {"bedtime", "stereotales"}, "no pooled 'all' row"
    assert summaries.vsr_matrix(vsr).loc["en", "a"] == 50.0
    assert summaries.vsr_matrix(vsr, "stereotales").loc["en", "a"] == 100.0


def test_reason_counts_count_every_check_per_design():
    en = LANG_DATA["en"]["lid_sentences"][0]
    stories = _stories(
        [
            {"language": "en", "text": en, "finish_reason": "length"},
            {"language": "en", "text": LANG_DATA["fr"]["lid_sentences"][0], "finish_reason": "length"},
        ]
    )
    counts = langid.reason_counts(langid.classify(stories)).iloc[0]
    assert (counts.truncated, counts.wrong_language, counts.refusal) == (2, 1, 0)


def test_refusal_files_exist_for_all_languages():
    for lang in LANGUAGES:
        assert langid.refusal_rules(lang), lang


def test_stage_writes_typed_columns_when_every_story_is_valid(tmp_path, monkeypatch):
    """No refusal and no invalid story: refusal_rule and invalid_reason are all None, yet stay strings."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from storybias.config import params
    from storybias.core import io
    from storybias.stages import filter as filter_stage

    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    text = LANG_DATA["en"]["lid_sentences"][0]
    rows = []
    for i in range(3):
        row = {field.name: None for field in STORIES_SCHEMA}
        row.update(
            story_id=f"s{i}",
            design="bedtime",
            language="en",
            model="m",
            prompt_id=f"p{i}",
            sample=0,
            seed=i,
            prompt="Tell a story.",
            text=text,
            finish_reason="stop",
            n_tokens=20,
        )
        rows.append(row)
    io.write_parquet_atomic(pd.DataFrame(rows), artifacts.stories_path("typed"), schema=STORIES_SCHEMA)
    profile = params.Profile.model_validate(
        {
            "run_name": "typed",
            "generation": {"models": [{"name": "m", "source": "embedded"}]},
            "designs": {"bedtime": {"languages": ["en"]}},
        }
    )
    filtered = filter_stage.run(params.Params(profile, tmp_path / "typed.yaml"))["filtered"]
    assert filtered["is_valid"].all() and filtered["refusal_rule"].isna().all()
    schema = pq.read_schema(artifacts.filtered_path("typed"))
    assert schema.field("refusal_rule").type == pa.string() and schema.field("invalid_reason").type == pa.string()
    assert schema.field("lid_prob").type == pa.float64() and schema.field("is_valid").type == pa.bool_()


def test_vsr_by_language_pools_models_and_is_empty_for_a_run_without_the_design():
    """Notebook 02 records the bedtime VSR per language; a profile without bedtime stories (a
    stereotales-only pilot) must record an empty mapping, not fail (it once raised a TypeError there)."""
    rows = [
        {"design": "bedtime", "model": "a", "language": "en", "is_valid": v, "invalid_reason": None} for v in (1, 1, 0)
    ]
    rows += [{"design": "bedtime", "model": "b", "language": "en", "is_valid": 1, "invalid_reason": None}]
    rows += [{"design": "stereotales", "model": "a", "language": "fr", "is_valid": 0, "invalid_reason": "refusal"}]
    filtered = pd.DataFrame(rows).assign(story_id=[f"s{i}" for i in range(len(rows))])
    filtered["is_valid"] = filtered["is_valid"].astype(bool)
    vsr = langid.vsr_table(filtered)
    assert summaries.vsr_by_language(vsr) == {"en": 0.75}
    assert summaries.vsr_by_language(vsr, "stereotales") == {"fr": 0.0}
    assert summaries.vsr_by_language(vsr[vsr.design == "stereotales"], "bedtime") == {}


def test_notebook_02s_invalid_examples_and_refusal_counts_on_a_hand_made_table():
    """Issue #59 item 3: the first invalid story per (reason, language), its text cut, and the stories per
    refusal rule, computed here instead of in notebook 02's cells."""
    filtered = pd.DataFrame(
        {
            "is_valid": [True, False, False, False, False],
            "invalid_reason": [None, "refusal", "refusal", "wrong_language", "refusal"],
            "language": ["en", "en", "en", "fr", "fr"],
            "lid_lang": ["en", "en", "en", "en", "fr"],
            "lid_prob": [0.9, 0.8, 0.7, 0.95, 0.6],
            "refusal_rule": [None, "sorry", "cannot", None, "sorry"],
            "text": ["ok", "x" * 200, "second", "English text", "désolé"],
        }
    )
    examples = langid.invalid_examples(filtered)
    assert list(examples.index) == [1, 3, 4] and list(examples.columns) == langid.EXAMPLE_COLUMNS
    assert examples["text"].tolist() == ["x" * 160, "English text", "désolé"]
    counts = langid.refusal_rule_counts(filtered)
    assert list(counts.columns) == ["stories"] and counts["stories"].to_dict() == {"sorry": 2, "cannot": 1}
