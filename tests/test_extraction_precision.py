"""BiasedTales-ML's extractor validation (Ouyang, Luo, Xiao, Zhu; arXiv:2604.17008, Sec. 3): the CSV checks,
check-params naming ``extract.human_validation``, and kappa and precision on files whose answers are
worked out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from sklearn.metrics import cohen_kappa_score

from storybias.config import params
from storybias.stages.extract import extraction_precision
from test_params import _error, write_profile

EXAMPLE = Path(__file__).parent / "data" / "support_ratings_example.csv"
HEADER = "story_id,language,field,item,annotator_id,score\n"


def write(tmp_path, text, name="judged.csv"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def frame(rows):
    """Judgements from (story_id, language, field, item, annotator_id, score) tuples."""
    return pd.DataFrame(rows, columns=list(extraction_precision.COLUMNS))


def row(table, language="all", field="all"):
    return table.set_index(["language", "field"]).loc[(language, field)]


# --- the CSV checks ---------------------------------------------------------------------------------


def test_the_example_file_is_valid_and_loads_with_integer_scores():
    assert extraction_precision.check_support_ratings(EXAMPLE) == []
    judged = extraction_precision.load_support_ratings(EXAMPLE)
    assert list(judged.columns) == list(extraction_precision.COLUMNS) and len(judged) == 30
    assert judged["score"].dtype.kind == "i" and set(judged["score"]) == {0, 1, 2}
    assert set(judged["language"]) == {"en", "fr"} and set(judged["annotator_id"]) == {"a1", "a2"}
    assert "école" in set(judged["item"])  # UTF-8


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("s1,en,adjectives,brave,a1,3\n", "row 2, column score: '3' is not 0, 1 or 2"),
        ("s1,en,adjectives,brave,a1,2.0\n", "row 2, column score: '2.0'"),
        ("s1,en,adjectives,brave,a1,true\n", "row 2, column score: 'true'"),
        ("s1,en,adjectives,brave,a1,\n", "row 2, column score: empty"),
        ("s1,en,adjectives,brave,a1,2\ns1,en,traits,brave,a1,2\n", "row 3, column field: 'traits' is not one of"),
        ("s1,en,adjectives,,a1,2\n", "row 2, column item: empty"),
        ("s1,en,adjectives,brave,,2\n", "row 2, column annotator_id: empty"),
        ("s1,en,adjectives,brave,a1,2\ns1,fr,settings,forest,a1,2\n", "row 3, column language: 'fr', but story"),
        (
            "s1,en,adjectives,brave,a1,2\ns1,en,adjectives,kind,a1,1\ns1,en,adjectives,brave,a1,1\n",
            "row 4, column annotator_id: a second judgement of story_id 's1', field 'adjectives', item 'brave', "
            "annotator_id 'a1' (first on row 2)",
        ),
        ("s1,en,adjectives,brave,a1\n", "row 2: 5 fields, the header has 6"),
    ],
)
def test_a_bad_row_is_named_by_file_row_and_column(tmp_path, body, message):
    path = write(tmp_path, HEADER + body)
    problems = extraction_precision.check_support_ratings(path)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{path}: ") and message in problems[0]
    with pytest.raises(ValueError, match="invalid"):
        extraction_precision.load_support_ratings(path)


def test_row_numbers_count_the_header_as_row_1_and_every_problem_is_listed(tmp_path):
    body = "s1,en,adjectives,brave,a1,2\n\ns1,en,adjectives,brave,a2,5\ns2,en,setting,hill,a1,1\n"
    problems = extraction_precision.check_support_ratings(write(tmp_path, HEADER + body))
    # the blank line is row 3 of the spreadsheet: it is skipped, yet counted
    assert [p.split(": ", 1)[1].split(":")[0] for p in problems] == ["row 4, column score", "row 5, column field"]


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("story_id,language,field,item,annotator_id\n", "row 1 (header): missing column(s) score"),
        (
            "story_id,language,field,item,annotator,score\n",
            "missing column(s) annotator_id; unknown column(s) 'annotator'",
        ),
        ("story_id,language,field,item,annotator_id,score,note\n", "unknown column(s) 'note'"),
    ],
)
def test_a_bad_header_is_named(tmp_path, header, message):
    problems = extraction_precision.check_support_ratings(write(tmp_path, header + "s1,en,adjectives,brave,a1,2\n"))
    assert len(problems) == 1 and message in problems[0] and "(expected story_id, language," in problems[0]


def test_empty_missing_and_headless_files(tmp_path):
    assert "file not found" in extraction_precision.check_support_ratings(tmp_path / "absent.csv")[0]
    assert "the file is empty" in extraction_precision.check_support_ratings(write(tmp_path, ""))[0]
    assert "no judgement below the header" in extraction_precision.check_support_ratings(write(tmp_path, HEADER))[0]
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes((HEADER + "f3,fr,settings,école,a1,2\n").encode("latin-1"))
    assert "not UTF-8" in extraction_precision.check_support_ratings(latin1)[0]


def test_at_most_max_problems_are_listed(tmp_path):
    body = "".join(f"s{i},en,adjectives,brave,a1,9\n" for i in range(50))
    problems = extraction_precision.check_support_ratings(write(tmp_path, HEADER + body))
    assert len(problems) == extraction_precision.MAX_PROBLEMS + 1 and "stopped after" in problems[-1]


# --- check-params -----------------------------------------------------------------------------------


def test_check_params_names_the_key_for_a_missing_or_bad_file(tmp_path):
    absent = tmp_path / "absent.csv"
    message = _error(tmp_path, lambda r: r.setdefault("extract", {}).update(human_validation=str(absent)))
    assert f"extract.human_validation: {absent} does not exist" in message
    bad = write(tmp_path, HEADER + "s1,en,adjectives,brave,a1,2\ns1,en,adjectives,kind,a1,7\n")
    message = _error(tmp_path, lambda r: r.setdefault("extract", {}).update(human_validation=str(bad)))
    assert f"extract.human_validation: {bad}: row 3, column score: '7' is not 0, 1 or 2" in message


def test_check_params_accepts_a_good_file_relative_to_the_repo_root(tmp_path):
    path = write_profile(
        tmp_path,
        lambda r: r.setdefault("extract", {}).update(human_validation="tests/data/support_ratings_example.csv"),
    )
    p = params.load(path)
    assert p.extract.human_validation == "tests/data/support_ratings_example.csv"
    assert params.load("params/smoke.yaml").extract.human_validation is None  # the default: no validation
    table, comparison = extraction_precision.from_settings(p.extract.human_validation)
    assert row(table)["n_judgements"] == 30 and list(comparison["quantity"])[:2] == ["kappa", "precision"]
    assert extraction_precision.from_settings(None) is None
    # stage 03 reads the file for its notebook (its result's human_validation), not for its extractions: setting
    # it leaves the stage's parameter digest as it was
    smoke = params.load("params/smoke.yaml")
    assert p.stage_digest("extract") == smoke.stage_digest("extract")
    changed = params.load(write_profile(tmp_path, lambda r: r.setdefault("extract", {}).update(retries=3)))
    assert changed.stage_digest("extract") != smoke.stage_digest("extract")


# --- the statistics ---------------------------------------------------------------------------------


def test_kappa_and_precision_of_the_example_by_hand():
    table = extraction_precision.precision_and_kappa(extraction_precision.load_support_ratings(EXAMPLE))
    pooled = row(table)
    # 15 items, a1 vs a2 agree on 11: p_o = 11/15. Marginals a1 (2, 1, 0) = (9, 3, 3), a2 = (8, 4, 3):
    # p_e = (9*8 + 3*4 + 3*3) / 15^2 = 93/225, kappa = (165 - 93) / (225 - 93) = 72/132 = 6/11
    assert pooled["kappa"] == pytest.approx(6 / 11)
    assert (pooled["n_items"], pooled["n_items_shared"], pooled["n_annotator_pairs"]) == (15, 15, 1)
    assert (pooled["n_stories"], pooled["n_annotators"], pooled["n_judgements"]) == (6, 2, 30)
    # 6 of the 30 judgements are 0: precision 24/30; 17 are 2 (a1 9, a2 8)
    assert (pooled["n_supported"], pooled["precision"]) == (24, pytest.approx(0.8))
    assert (pooled["n_clear"], pooled["precision_clear"]) == (17, pytest.approx(17 / 30))
    en = row(table, "en")
    # en: 8 items, 6 agreements; a1 (5, 1, 2), a2 (4, 3, 1): p_e = (20 + 3 + 2) / 64, kappa = (48 - 25) / (64 - 25)
    assert en["kappa"] == pytest.approx(23 / 39)
    assert (en["n_supported"], en["n_judgements"], en["n_stories"]) == (13, 16, 3)
    # one list of one language: en's cultural_refs hold a single item both judged 2: kappa undefined
    refs = row(table, "en", "cultural_refs")
    assert refs["n_items"] == 1 and math.isnan(refs["kappa"]) and refs["precision"] == 1.0
    assert list(table["language"].unique()) == ["en", "fr", "all"]
    assert list(row(table).name) == ["all", "all"]
    assert list(table[table["language"] == "fr"]["field"]) == ["adjectives", "settings", "cultural_refs", "all"]


def test_kappa_matches_sklearn_and_perfect_agreement_is_one():
    same = [("s1", "en", "adjectives", w, a, s) for a in ("a1", "a2") for w, s in (("x", 0), ("y", 1), ("z", 2))]
    assert extraction_precision.pairwise_kappa(frame(same))[0] == 1.0
    judged = extraction_precision.load_support_ratings(EXAMPLE)
    wide = judged.pivot(index=["story_id", "field", "item"], columns="annotator_id", values="score")
    assert extraction_precision.pairwise_kappa(judged)[0] == pytest.approx(cohen_kappa_score(wide["a1"], wide["a2"]))


def test_kappa_reads_only_items_both_annotators_scored():
    rows = [
        ("s1", "en", "adjectives", "x", "a1", 2),
        ("s1", "en", "adjectives", "x", "a2", 2),
        ("s1", "en", "adjectives", "y", "a1", 0),
        ("s1", "en", "adjectives", "y", "a2", 0),
        ("s1", "en", "settings", "x", "a1", 1),  # the same word in another list: another item, a1 only
    ]
    kappa, pairs, shared = extraction_precision.pairwise_kappa(frame(rows))
    assert (kappa, pairs, shared) == (1.0, 1, 2)
    pooled = row(extraction_precision.precision_and_kappa(frame(rows)))
    assert (pooled["n_items"], pooled["n_judgements"], pooled["n_supported"]) == (3, 5, 3)


def test_three_annotators_give_the_mean_pairwise_kappa():
    scores = {"a1": [2, 2, 1, 0, 2, 1], "a2": [2, 1, 1, 0, 2, 0], "a3": [2, 2, 0, 0, 1, 1]}
    rows = [("s1", "en", "adjectives", f"w{i}", a, s) for a, col in scores.items() for i, s in enumerate(col)]
    kappa, pairs, shared = extraction_precision.pairwise_kappa(frame(rows))
    expected = [cohen_kappa_score(scores[x], scores[y]) for x, y in (("a1", "a2"), ("a1", "a3"), ("a2", "a3"))]
    assert kappa == pytest.approx(sum(expected) / 3) and (pairs, shared) == (3, 6)


def test_precision_has_a_wilson_interval():
    share, count, n, low, high = extraction_precision.precision(pd.Series([2] * 17 + [1] * 7 + [0] * 6))
    assert (share, count, n) == (pytest.approx(0.8), 24, 30)
    z = 1.959963984540054
    centre = (0.8 + z**2 / 60) / (1 + z**2 / 30)
    half = z * math.sqrt(0.8 * 0.2 / 30 + z**2 / (4 * 30**2)) / (1 + z**2 / 30)
    assert (low, high) == (pytest.approx(centre - half), pytest.approx(centre + half))
    assert extraction_precision.precision(pd.Series([2] * 17 + [1] * 7 + [0] * 6), threshold=2)[:3] == (
        pytest.approx(17 / 30),
        17,
        30,
    )
    assert math.isnan(extraction_precision.precision(pd.Series([], dtype=int))[0])


def test_comparison_with_the_published_numbers():
    assert extraction_precision.PUBLISHED["kappa"] == 0.618 and extraction_precision.PUBLISHED["precision"] == 0.85625
    assert (
        extraction_precision.PUBLISHED["n_stories"] == 800
        and extraction_precision.PUBLISHED["stories_per_language"] == 100
    )
    table = extraction_precision.precision_and_kappa(extraction_precision.load_support_ratings(EXAMPLE))
    comparison = extraction_precision.compare_published(table).set_index("quantity")
    assert comparison.loc["kappa", "published"] == 0.618
    assert comparison.loc["kappa", "reproduced"] == pytest.approx(6 / 11)
    assert comparison.loc["precision", "reproduced"] == pytest.approx(0.8)
    precision = comparison.loc["precision"]
    assert precision["ci_low"] < 0.85625 < precision["ci_high"] and precision["published_in_ci"] is True
    assert "24 of 30 judgements" in precision["note"]
    assert comparison.loc["n_stories", "reproduced"] == 6 and comparison.loc["stories_per_language", "reproduced"] == 3
    assert comparison.loc["n_languages", "reproduced"] == 2 and math.isnan(comparison.loc["kappa", "ci_low"])
