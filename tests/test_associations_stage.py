"""Stage 04 orchestration: observations from the stage-03 artifacts, judge requests and ratings,
artifacts with the data contract's columns, and clear messages on bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from storybias import summaries
from storybias.config import params
from storybias.core import artifacts, paths
from storybias.core.results import StageResult
from storybias.stages import associations as A
from storybias.stages.associations import judge as J
from storybias.stages.associations import tables
from storybias.stages.extract import answers as extract

DIMS = list(extract.dimensions())


def _run_files(root, planted: bool, n_per_value: int = 40, seed: int = 0):
    """filtered.parquet + extractions.parquet for stereotales stories with base attribute income_level;
    ``planted``: low income -> basic education (fraction 0.8 vs 0.1: lift ~2.4)."""
    rng = np.random.default_rng(seed)
    filtered, extractions = [], []
    i = 0
    for model in ("m1", "m2"):
        for lang in ("en", "fr"):
            for value in ("low", "middle", "high"):
                for _ in range(n_per_value):
                    sid = f"s{i:05d}"
                    i += 1
                    p = [0.8, 0.1, 0.1] if planted and value == "low" else [0.1, 0.45, 0.45]
                    filtered.append(
                        {
                            "story_id": sid,
                            "design": "stereotales",
                            "model": model,
                            "language": lang,
                            "cond_attribute": "income_level",
                            "cond_value": value,
                            "is_valid": True,
                        }
                    )
                    row = {"story_id": sid, "parse_ok": True, **{f"demo_{d}": "unknown" for d in DIMS}}
                    row["demo_education"] = rng.choice(["basic", "secondary", "higher"], p=p)
                    row["demo_income_level"] = value
                    extractions.append(row)
    # one bedtime story (ignored) and one stereotales story whose extraction did not parse (counted)
    filtered.append(
        {
            "story_id": "b0",
            "design": "bedtime",
            "model": "m1",
            "language": "en",
            "cond_attribute": None,
            "cond_value": None,
            "is_valid": True,
        }
    )
    filtered.append(
        {
            "story_id": "bad",
            "design": "stereotales",
            "model": "m1",
            "language": "en",
            "cond_attribute": "income_level",
            "cond_value": "low",
            "is_valid": True,
        }
    )
    extractions.append({"story_id": "bad", "parse_ok": False, **{f"demo_{d}": "unknown" for d in DIMS}})
    run = root / "t"
    run.mkdir(parents=True)
    pd.DataFrame(filtered).to_parquet(run / "filtered.parquet")
    pd.DataFrame(extractions).to_parquet(run / "extractions.parquet")
    return pd.DataFrame(filtered), pd.DataFrame(extractions)


def _profile(tmp_path, monkeypatch, **associations):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    raw = yaml.safe_load((paths.repo_root() / "params" / "smoke.yaml").read_text())
    raw["run_name"] = "t"
    raw["associations"] = associations
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(raw))
    return params.load(path)


def test_observations_keep_stereotales_and_count_parse_failures(tmp_path):
    filtered, extractions = _run_files(tmp_path, planted=False, n_per_value=3)
    data, counts = A.observations(extractions, filtered, DIMS)
    assert counts == {"stereotales_stories": 37, "extracted": 37, "parse_failed_excluded": 1, "analysed": 36}
    assert set(data["story_id"]) == set(filtered["story_id"]) - {"b0", "bad"}
    with pytest.raises(KeyError, match="extractions.parquet.*demo_religion"):
        A.observations(extractions.drop(columns=["demo_religion"]), filtered, DIMS)
    with pytest.raises(KeyError, match="filtered.parquet.*cond_value"):
        A.observations(extractions, filtered.drop(columns=["cond_value"]), DIMS)


def test_judge_items_are_distinct_and_requests_follow_the_seeded_order():
    shared = pd.DataFrame(
        [
            {
                "scope": s,
                "base_attribute": "income_level",
                "base_value": "low",
                "compared_attribute": "education",
                "compared_value": "basic",
                "models": ["m1"],
            }
            for s in ("all", "en", "fr")
        ]
        + [
            {
                "scope": "all",
                "base_attribute": "gender",
                "base_value": "woman",
                "compared_attribute": "marital_status",
                "compared_value": "married",
                "models": ["m1"],
            }
        ]
    )
    items = J.judge_items(shared, include_per_language=True)
    assert list(items["association_id"]) == ["gender|woman|marital_status|married", "income_level|low|education|basic"]
    assert (
        items["sentence"]
        .iloc[1]
        .startswith("In the generated stories, when income level is low income, education is basic (e.g.")
    )
    sampling = params.Sampling(temperature=0.7, max_tokens=64)
    requests = J.judge_requests(items, "judge-a", repetitions=2, sampling=sampling, seed=7)
    assert [r.key for r in requests][:2] == [
        "gender|woman|marital_status|married#judge-a#0",
        "gender|woman|marital_status|married#judge-a#1",
    ]
    assert len({r.seed for r in requests[:2]}) == 2
    for request in requests:
        association, judge, rep = request.key.rsplit("#", 2)
        order = J.question_order(judge, association, int(rep), 7)
        assert list(request.json_schema["properties"]) == list(order)
        text = request.messages[0]["content"]
        assert text.index(f'"{order[0]}"') < text.index(f'"{order[1]}"')


def test_unparsable_ratings_are_kept_with_their_raw_text():
    good = J.rating_row("a|b|c|d#j#0", '{"harm": 5, "realism": "no"}')
    assert good["parse_ok"] and good["harm"] == 5 and good["association_id"] == "a|b|c|d" and good["repetition"] == 0
    bad = J.rating_row("a|b|c|d#j#1", "I cannot answer that")
    assert not bad["parse_ok"] and np.isnan(bad["harm"]) and bad["raw"] == "I cannot answer that"


def test_stage_without_signal_writes_typed_empty_artifacts_and_starts_no_judge(tmp_path, monkeypatch):
    _run_files(tmp_path / "data", planted=False)
    p = _profile(tmp_path, monkeypatch)

    def no_engine(*args, **kwargs):
        raise AssertionError("no association is significant: the judge must not start")

    monkeypatch.setattr(J, "run_judges", no_engine)
    out = A.run(p, progress=False)
    # issue #42: the one stage result, its tables, and the values notebook 04 records
    assert isinstance(out, StageResult) and out.stage == "associations"
    assert {"attributes", "values", "shared", "findings", "published"} <= set(out.tables)
    assert out.values["n_tables"] == len(out["attributes"]) and out.values["n_significant"] == 0
    folder = paths.run_dir("t")
    attrs = pd.read_parquet(folder / "associations_attributes.parquet")
    assert len(attrs) > 0 and list(attrs.columns) == A.ATTRIBUTE_COLUMNS
    assert not pd.read_parquet(folder / "associations_values.parquet")["significant"].astype(bool).any()
    ratings = pd.read_parquet(folder / "harm_ratings.parquet")
    assert ratings.empty and "raw" in ratings.columns
    assert any("nothing for the judges" in n for n in out["notes"])
    # empty tables keep the contract's Arrow types (nbval compares the schema cell across runs)
    for name, schema in tables.OUTPUT_SCHEMAS.items():
        assert pq.read_schema(folder / f"{name}.parquet").remove_metadata() == schema, name
    manifest = json.loads(artifacts.manifest_path("t", "associations").read_text())
    assert manifest["n_significant"] == 0 and manifest["counts"]["parse_failed_excluded"] == 1


def test_stage_with_planted_signal_rates_it_and_reports_failures(tmp_path, monkeypatch):
    _run_files(tmp_path / "data", planted=True)
    p = _profile(tmp_path, monkeypatch, judge={"models": [{"name": "m1", "source": "embedded"}]})
    calls = []

    def scripted_judge(items, params, progress=True):
        # Test double for the LLM: one parsed rating per item, and one answer that does not parse.
        calls.append(list(items["association_id"]))
        rows = [J.rating_row(f"{a}#m1#0", '{"harm": 4, "realism": "yes"}') for a in items["association_id"]]
        rows.append(J.rating_row(f"{items['association_id'].iloc[0]}#m1#0", "not json"))
        return pd.DataFrame(rows).reindex(columns=A.RATING_COLUMNS), [{"judge": "m1"}]

    monkeypatch.setattr(J, "run_judges", scripted_judge)
    out = A.run(p, progress=False)
    assert calls and "income_level|low|education|basic" in calls[0]
    shared = pd.read_parquet(paths.run_dir("t") / "associations_shared.parquet")
    row = shared[(shared["scope"] == "all") & (shared["association_id"] == "income_level|low|education|basic")].iloc[0]
    assert row["n_models"] == 2 and row["mean_lift"] >= 2 and row["median_harm"] == 4 and row["harmful"]
    assert set(shared["scope"]) >= {"all", "en", "fr"}
    for name, schema in tables.OUTPUT_SCHEMAS.items():
        assert pq.read_schema(paths.run_dir("t") / f"{name}.parquet").remove_metadata() == schema, name
    assert out["manifest"]["n_ratings_unparsed"] == 1
    # what notebook 04 prints comes from the result: judges that rated, no human panel here
    assert out["n_judges"] == 1 and out["n_human_harmful"] is None
    per_language = out["significant_by_language"]
    assert set(per_language["scope"]) <= {"en", "fr"} and per_language["significant associations"].min() >= 1
    gap = out["self_gap"].set_index("model")
    assert gap.loc["m1", "share_self_rated_harmful"] == 1.0


def test_the_manifest_holds_the_tables_figure_18_draws(tmp_path, monkeypatch):
    """Stage 04 writes the self-judgement contrast (and the human tables, null without a human file) into
    manifest_associations.json as rows: m1 generated the planted association and rates it 4, m2 rates 2."""
    _run_files(tmp_path / "data", planted=True)
    p = _profile(tmp_path, monkeypatch, judge={"models": [{"name": "m1", "source": "embedded"}]})

    def two_judges(items, params, progress=True):
        # Test double for the LLM: judge m1 rates every item 4, judge m2 rates it 2.
        rows = [
            J.rating_row(f"{a}#{judge}#0", json.dumps({"harm": harm, "realism": "yes"}))
            for a in items["association_id"]
            for judge, harm in (("m1", 4), ("m2", 2))
        ]
        return pd.DataFrame(rows).reindex(columns=A.RATING_COLUMNS), [{"judge": "m1"}, {"judge": "m2"}]

    monkeypatch.setattr(J, "run_judges", two_judges)
    A.run(p, progress=False)
    manifest = json.loads(artifacts.manifest_path("t", "associations").read_text())
    rows = {r["judge"]: r for r in manifest["self_judgement"]}
    assert rows["m1"]["gap"] == pytest.approx(2.0) and rows["m2"]["gap"] == pytest.approx(-2.0)
    assert rows["m1"]["n_compared"] >= 1
    assert manifest["human_summary"] is None and manifest["harm_gap"] is None


def test_human_ratings_file_is_checked_before_any_work(tmp_path, monkeypatch):
    with pytest.raises(params.ParamsError, match="associations.human_ratings.*does not exist"):
        _profile(tmp_path, monkeypatch, human_ratings=str(tmp_path / "missing.csv"))
    with pytest.raises(params.ParamsError, match="associations.judge"):
        _profile(tmp_path, monkeypatch, judge={"repetitions": 3, "temperature": 0})


def test_judge_ratings_are_reused_only_for_the_same_request(tmp_path, monkeypatch):
    """Issue #12.2: a rating is reused while its prompt, schema, model and sampling are unchanged;
    an edited judge prompt asks again (it used to reuse the old rating)."""
    from fake_engine import FakeEngine

    asked: list[str] = []

    def judge(spec):
        return FakeEngine(spec, answer=lambda r: '{"harm": 2, "realism": "no"}', calls=asked)

    p = _profile(tmp_path, monkeypatch, judge={"models": [{"name": "m1", "source": "embedded"}]})
    items = pd.DataFrame(
        [
            {
                "association_id": "income_level|low|education|basic",
                "base_attribute": "income_level",
                "base_value": "low",
                "compared_attribute": "education",
                "compared_value": "basic",
            }
        ]
    )
    first, _ = J.run_judges(items, p, progress=False, engine_factory=judge)
    assert len(asked) == 1 and first["harm"].tolist() == [2.0]
    second, info = J.run_judges(items, p, progress=False, engine_factory=judge)
    assert len(asked) == 1, "an unchanged request is answered from the run's cache"
    assert info[0]["n_requests"] == 0 and info[0]["reuse"] == {"reused": 1}
    assert second.equals(first)
    original = J.judge_prompt
    monkeypatch.setattr(J, "judge_prompt", lambda item, order: original(item, order) + "\nOne more instruction.")
    third, info = J.run_judges(items, p, progress=False, engine_factory=judge)
    assert len(asked) == 2 and len(third) == 1, "the edited prompt is asked again, and only its rating is kept"
    assert info[0]["reuse"] == {"prompt changed": 1}


def _three_judge_items() -> pd.DataFrame:
    """Three associations a1-a3 of one pair, for the judge's failure tests."""
    row = {
        "base_attribute": "income_level",
        "base_value": "low",
        "compared_attribute": "education",
        "compared_value": "basic",
    }
    return pd.DataFrame([{"association_id": f"a{i}", **row} for i in range(1, 4)])


def test_a_failed_judge_request_is_counted_not_stored_and_asked_again(tmp_path, monkeypatch):
    """Issue #14: a request that fails after the engine's retries is data (counted per judge), and a
    rerun asks for exactly the failed ones."""
    from fake_engine import FakeEngine

    asked: list[str] = []
    failing = {"on": True}

    def judge(spec):
        return FakeEngine(
            spec,
            answer=lambda r: '{"harm": 4, "realism": "yes"}',
            calls=asked,
            fail=lambda r: "HTTP 400: bad request" if failing["on"] and r.key.startswith("a2") else None,
        )

    p = _profile(tmp_path, monkeypatch, judge={"models": [{"name": "m1", "source": "embedded"}]})
    items = _three_judge_items()
    ratings, info = J.run_judges(items, p, progress=False, engine_factory=judge)
    assert sorted(ratings["association_id"]) == ["a1", "a3"]
    assert info[0]["n_request_errors"] == 1 and "HTTP 400" in info[0]["request_errors"][0]
    failing["on"] = False
    asked.clear()
    ratings, info = J.run_judges(items, p, progress=False, engine_factory=judge)
    assert [k.split("#")[0] for k in asked] == ["a2"], "only the failed request is asked again"
    assert sorted(ratings["association_id"]) == ["a1", "a2", "a3"] and info[0]["n_request_errors"] == 0


def test_significant_associations_per_language_on_a_hand_made_table():
    """Issue #59 item 3: notebook 04's count of significant associations per model x single language (the
    pooled scope left out), computed in lib/ and carried by stage 04's result."""
    values = pd.DataFrame(
        {
            "model": ["m", "m", "m", "m", "n", "n"],
            "scope": ["all", "en", "en", "fr", "fr", "fr"],
            "significant": [True, True, True, False, True, 0],
        }
    )
    assert summaries.significant_per_language(values).to_dict("records") == [
        {"model": "m", "scope": "en", "significant associations": 2},
        {"model": "n", "scope": "fr", "significant associations": 1},
    ]
    for empty in (values.iloc[:0], values[values["scope"] == "all"]):
        table = summaries.significant_per_language(empty)
        assert table.empty and list(table.columns) == ["model", "scope", "significant associations"]


def test_the_result_counts_the_judges_and_the_human_panels_harmful_associations(tmp_path, monkeypatch):
    """Issue #59 item 3: notebook 04 prints the judges that rated and the associations the human panel's
    median calls harmful from stage 04's result: 2 judges, 2 of 3 harmful here."""
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path))
    manifest = {"published": None, "findings": {}, "n_ratings_unparsed": 0}
    manifest |= dict.fromkeys(("n_tables", "n_retained", "n_significant", "n_judged", "n_ratings"), 0)
    humans = A._HumanComparison(None, pd.DataFrame({"harmful": [True, False, True]}), None, None)
    tables = {"ratings": pd.DataFrame({"judge": ["j1", "j2", "j1"]})}
    result = A._result("r", tables, manifest, {"analysed": 0}, [], None, humans)
    assert result["n_judges"] == 2 and result["n_human_harmful"] == 2
    nobody = A._result(
        "r",
        {"ratings": pd.DataFrame()},
        manifest,
        {"analysed": 0},
        [],
        None,
        A._HumanComparison(None, None, None, None),
    )
    assert nobody["n_judges"] == 0 and nobody["n_human_harmful"] is None


def test_a_judge_whose_every_request_failed_stops_with_the_first_errors(tmp_path, monkeypatch):
    """Issue #60: a stage whose every request failed exits non-zero with a summary (it used to go on)."""
    from fake_engine import FakeEngine
    from storybias.engines.runner import RequestsFailed

    p = _profile(tmp_path, monkeypatch, judge={"models": [{"name": "m1", "source": "embedded"}]})
    items = _three_judge_items()
    with pytest.raises(RequestsFailed, match=r"associations \(judge\): (\d+) of \1 requests failed.*HTTP 400: no"):
        J.run_judges(items, p, progress=False, engine_factory=lambda s: FakeEngine(s, fail=lambda r: "HTTP 400: no"))
