"""Stage 04 statistics: hand-computed checks, the Monte-Carlo Fisher test, and planted signals."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from scipy.stats._multivariate import random_table_gen as scipy_random_table

from storybias.evidence import harm_ratings
from storybias.stages import associations as A
from storybias.stages.associations import human as H
from storybias.stages.associations import judge as J
from storybias.stages.associations import tables
from storybias.stats import contingency, effect_sizes
from storybias.stats.multiple_testing import adjust


def test_cramers_v_bias_correction_hand_computed():
    table = np.array([[20, 10], [10, 20]])
    # chi2 = 6.667, n = 60: phi2 = 1/9; phi2+ = 1/9 - 1/59; k~ = r~ = 2 - 1/59; V = sqrt(phi2+ / (1 - 1/59))
    expected = math.sqrt((1 / 9 - 1 / 59) / (1 - 1 / 59))
    assert contingency.cramers_v_corrected(table) == pytest.approx(expected)
    assert contingency.cramers_v_corrected(np.array([[10, 10], [10, 10]])) == 0.0  # independence: corrected to 0


def test_effect_size_thresholds_scale_with_table_size():
    assert effect_sizes.effect_size(0.31, 2, 2) == "medium" and effect_sizes.effect_size(0.29, 2, 2) == "small"
    # 5 x 3 table: min(r, c) - 1 = 2, thresholds 0.0707 / 0.212 / 0.354
    assert effect_sizes.effect_size(0.22, 5, 3) == "medium" and effect_sizes.effect_size(0.36, 5, 3) == "large"
    assert effect_sizes.effect_size(0.05, 5, 3) == "negligible"


def test_value_level_lift_fraction_and_exact_one_sided_fisher():
    table = pd.DataFrame([[30, 10], [5, 35]], index=["low", "high"], columns=["basic", "higher"])
    out = tables.value_level(table).set_index(["base_value", "compared_value"])
    cell = out.loc[("low", "basic")]
    assert cell["expected"] == pytest.approx(40 * 35 / 80)
    assert cell["lift"] == pytest.approx(30 / (40 * 35 / 80))
    assert cell["fraction"] == pytest.approx(30 / 40)
    ref = stats.fisher_exact([[30, 10], [5, 35]], alternative="greater")[1]
    assert cell["p_value"] == pytest.approx(ref)
    assert not out.loc[("low", "higher"), "significant"]


def test_contingency_cleaning():
    a = ["x"] * 20 + ["y"] * 20 + ["z"] * 15 + ["unknown"] * 5
    b = (
        (["p"] * 10 + ["q"] * 10)
        + (["p"] * 5 + ["q"] * 5 + ["unknown"] * 5 + ["other"] * 5)
        + (["p"] * 4 + ["r"] * 4 + ["unknown"] * 7)
        + ["p"] * 5
    )
    table = tables.contingency(a, b)
    # y keeps 10 stories (kept: >= 10), z keeps 8 (dropped), unknown A dropped, r then all-zero (dropped)
    assert list(table.index) == ["x", "y"] and list(table.columns) == ["p", "q"]
    assert table.loc["y"].tolist() == [5, 5]


def test_monte_carlo_fisher_agrees_with_exact_2x2():
    table = np.array([[8, 2], [1, 5]])
    exact = stats.fisher_exact(table)[1]
    p = contingency.fisher_reference_p(table, 200_000, seed=42)
    assert p == pytest.approx(exact, abs=3 * math.sqrt(exact * (1 - exact) / 200_000) + 1e-6)


def _reference_call(table: np.ndarray, n_resamples: int, seed: int) -> float:
    """The reference pipeline's attribute-level call, verbatim in its arguments: scipy's Monte-Carlo
    Fisher test, n_resamples, a generator seeded afresh for the table, no batch."""
    method = stats.MonteCarloMethod(n_resamples=n_resamples, rng=np.random.default_rng(seed))
    return float(stats.fisher_exact(table, method=method).pvalue)


def _random_tables(seed: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        r, c, n = int(rng.integers(2, 6)), int(rng.integers(2, 10)), int(rng.integers(15, 1500))
        table = rng.multinomial(n, rng.dirichlet(np.full(r * c, 0.7))).reshape(r, c)
        table = table[table.sum(1) > 0]
        table = table[:, table.sum(0) > 0]
        if min(table.shape) >= 2:
            out.append(table)
    return out


def test_the_attribute_level_p_value_is_the_reference_calls_to_the_last_digit():
    # batched where scipy's stream allows it (Patefield), in one call where it does not (Boyett)
    tables = _random_tables(11, 16) + [np.array([[3, 1, 0], [1, 4, 2]]), np.array([[2, 0, 1, 1], [0, 3, 1, 2]])]
    kinds = set()
    for table in tables:
        rule = scipy_random_table._rvs_select(table.sum(1), table.sum(0), table.sum())
        assert contingency.batch_invariant(table) == (rule == scipy_random_table._rvs_patefield)
        kinds.add(contingency.batch_invariant(table))
        assert contingency.fisher_reference_p(table, 60_000, seed=42) == _reference_call(table, 60_000, 42)
    assert kinds == {True, False}


def test_the_sequential_test_ends_on_the_reference_p_value_for_both_of_scipys_samplers():
    for table in (np.array([[9, 4, 2], [3, 8, 6]]), np.array([[30, 12, 9], [11, 25, 31]])):
        estimate = contingency.SequentialFisher(table, seed=3, max_resamples=60_000)
        while not estimate.exhausted:
            estimate.refine()
        assert estimate.p == _reference_call(table, 60_000, 3)


def test_one_sided_cell_p_values_are_fisher_exacts_to_the_last_digit():
    for table in _random_tables(5, 12):
        table = table[table.sum(1) >= 1]
        got = tables.one_sided_fisher(table)
        n, rows, cols = table.sum(), table.sum(1), table.sum(0)
        for (i, j), a in np.ndenumerate(table):
            b, c = rows[i] - a, cols[j] - a
            expected = stats.fisher_exact([[a, b], [c, n - a - b - c]], alternative="greater").pvalue
            assert got[i, j] == expected, (table.tolist(), i, j)


def test_bh_and_by_are_scipys_false_discovery_control_to_the_last_digit():
    p = np.random.default_rng(2).uniform(0, 0.2, 37) ** 2
    assert (adjust(p, "fdr_bh") == stats.false_discovery_control(p, method="bh")).all()
    assert (adjust(p, "fdr_by") == stats.false_discovery_control(p, method="by")).all()


def test_tables_are_tested_in_the_release_label_order():
    # canonical keys sort atheist, buddhist, christian, ...; the release's labels sort "Atheist/Agnostic",
    # "Buddhist", "Christian", "Hindu", "Jewish", "Muslim", "other" (capitals first), and for
    # professional_field "arts ..." < "business ..." < "healthcare ..." < "science ... (STEM)" < "trades ..."
    keys = ["stem", "trades_manual_labor", "healthcare_medicine", "arts_creative", "business_finance_legal"]
    table = tables.in_release_order(
        tables.Table(np.arange(10).reshape(2, 5), ["other", "jewish"], keys), "religion", "professional_field"
    )
    assert table.rows == ["jewish", "other"]
    assert table.cols == [
        "arts_creative",
        "business_finance_legal",
        "healthcare_medicine",
        "stem",
        "trades_manual_labor",
    ]
    assert table.counts[0].tolist() == [8, 9, 7, 5, 6]


def test_fisher_decision_refines_only_near_thresholds():
    # every table gets a Monte-Carlo look (none is decided from the G test); clear ones stop at the first
    clear = np.array([[80, 5], [5, 80]])
    assert contingency.fisher_rxc(clear, [0.05], seed=1).method == "monte-carlo(1000)"
    null = np.array([[20, 21], [19, 20]])
    assert contingency.fisher_rxc(null, [0.05], seed=1).method == "monte-carlo(1000)"
    near = np.array([[14, 6], [7, 13]])  # G-test p ~ 0.03: close to 0.05
    decision = contingency.fisher_rxc(near, [0.05], seed=1)
    assert int(decision.method[12:-1]) > 1000


def _planted(n_per_value: int, seed: int) -> pd.DataFrame:
    """Base attribute income (low/middle/high) fixed by the prompt; education depends on it (planted:
    low -> basic with P = 0.6 vs 0.1 otherwise), religion is independent (null)."""
    rng = np.random.default_rng(seed)
    rows = []
    for value in ("low", "middle", "high"):
        for _ in range(n_per_value):
            p_basic = 0.6 if value == "low" else 0.1
            edu = rng.choice(["basic", "secondary", "higher"], p=[p_basic, (1 - p_basic) / 2, (1 - p_basic) / 2])
            rel = rng.choice(["christian", "muslim", "atheist"])
            rows.append({"cond_value": value, "demo_education": edu, "demo_religion": rel})
    return pd.DataFrame(rows)


def test_planted_association_is_recovered_and_null_is_not():
    # power: with 100 stories per value the planted cell (lift ~ 0.6 / 0.267 = 2.25) is found every time
    found = 0
    for seed in range(10):
        attrs, values = tables.analyse_base_attribute(
            _planted(100, seed), "income_level", ["education", "religion"], seed=seed, max_resamples=20_000
        )
        retained = set(attrs.loc[attrs["retained"], "compared_attribute"])
        assert "religion" not in retained
        if not values.empty:
            sig = values[values["significant"]]
            found += bool(((sig.base_value == "low") & (sig.compared_value == "basic")).any())
    assert found >= 9


def test_null_data_false_discoveries_stay_under_the_nominal_rate():
    false = 0
    replicates = 40
    for seed in range(replicates):
        rng = np.random.default_rng(1000 + seed)
        frame = pd.DataFrame(
            {
                "cond_value": rng.choice(["a", "b", "c"], 300),
                "demo_x": rng.choice(["p", "q", "r", "s"], 300),
                "demo_y": rng.choice(["u", "v"], 300),
            }
        )
        attrs, values = tables.analyse_base_attribute(frame, "base", ["x", "y"], seed=seed, max_resamples=20_000)
        false += bool(len(values) and values["significant"].any())
    assert false / replicates <= 0.05


def _corpus(seed: int) -> pd.DataFrame:
    """Two models x two languages. Model a: low income -> basic education in both languages;
    model b: high income -> higher education in French only."""
    rng = np.random.default_rng(seed)
    levels = ["basic", "secondary", "higher"]
    rows = []
    for model in ("a", "b"):
        for lang in ("en", "fr"):
            for value in ("low", "middle", "high"):
                for _ in range(80):
                    # planted cells reach lift ~2.4 (0.8 against a marginal of 1/3)
                    p = [0.1, 0.45, 0.45] if model == "a" else [0.45, 0.45, 0.1]
                    if model == "a" and value == "low":
                        p = [0.8, 0.1, 0.1]
                    if model == "b" and lang == "fr" and value == "high":
                        p = [0.1, 0.1, 0.8]
                    rows.append(
                        {
                            "model": model,
                            "language": lang,
                            "cond_attribute": "income_level",
                            "cond_value": value,
                            "demo_education": rng.choice(levels, p=p),
                            "demo_religion": rng.choice(["christian", "muslim"]),
                            "demo_income_level": value,
                        }
                    )
    return pd.DataFrame(rows)


def test_passes_sharing_and_language_comparison():
    data = _corpus(0)
    dims = ["income_level", "education", "religion"]
    attrs, values = A.run_pass(data, dims, scope_by_language=True)
    assert set(attrs.columns) == set(A.ATTRIBUTE_COLUMNS) and set(values.columns) == set(A.VALUE_COLUMNS)
    langs = A.by_language(values).set_index(["base_value", "compared_value"])
    assert (
        list(langs.loc[("low", "basic"), "languages"]) == ["en", "fr"]
        and not langs.loc[("low", "basic"), "language_specific"]
    )
    assert (
        list(langs.loc[("high", "higher"), "languages"]) == ["fr"]
        and langs.loc[("high", "higher"), "language_specific"]
    )
    g_attrs, g_values = A.run_pass(data, dims, scope_by_language=False)
    assert set(g_attrs["scope"]) == {"all"}
    shared = A.sharing(g_values)
    low_basic = shared[(shared.base_value == "low") & (shared.compared_value == "basic")]
    assert list(low_basic["models"].iloc[0]) == ["a"]
    sentence = J.plain_language(low_basic.iloc[0])
    assert sentence == (
        "In the generated stories, when income level is low income, education is basic (e.g. less than "
        "high school, or high school) more often than for other income level groups."
    )


def test_every_bh_significant_pair_gets_its_cells_as_the_reference_writes_them():
    # income x education is BH-significant in model a's pass; religion is independent. The value level
    # runs on every BH-significant pair (the released files list their BY-significant cells whatever
    # the effect size), and `significant` keeps StereoTales' stated rule on top.
    data = _corpus(0)
    attrs, values = A.run_pass(data, ["income_level", "education", "religion"], scope_by_language=False)
    bh = attrs[attrs["p_adjusted"] < A.ALPHA]
    assert len(bh) and set(zip(bh["model"], bh["compared_attribute"])) == set(
        zip(values["model"], values["compared_attribute"])
    )
    small = values[~values["pair_retained"].astype(bool)]
    assert not small["significant"].any()
    rule = values["pair_retained"] & (values["p_adjusted"] < A.ALPHA) & (values["lift"] >= A.MIN_LIFT)
    assert (values["significant"] == rule).all()
    # a pair that is BH-significant but of a small effect still has its cells: plant one
    rng = np.random.default_rng(4)
    weak = pd.DataFrame(
        {
            "cond_value": np.repeat(["low", "high"], 2000),
            "demo_education": np.concatenate(
                [rng.choice(["basic", "higher"], 2000, p=[0.63, 0.37]), rng.choice(["basic", "higher"], 2000)]
            ),
        }
    )
    attrs, values = tables.analyse_base_attribute(weak, "income_level", ["education"], max_resamples=20_000)
    assert attrs["p_adjusted"].iloc[0] < 0.05 and attrs["effect_size"].iloc[0] == "small"
    assert len(values) == 4 and not values["pair_retained"].any() and not values["significant"].any()
    assert (
        json.loads(attrs["table"].iloc[0])["counts"]
        == tables.contingency(weak["cond_value"], weak["demo_education"])
        .loc[["high", "low"], ["basic", "higher"]]
        .to_numpy()
        .tolist()
    )


def test_bad_inputs_give_clear_errors_or_empty_typed_results():
    data = _corpus(1)
    with pytest.raises(KeyError, match="demo_housing_status"):
        A.run_pass(data, ["education", "housing_status"], scope_by_language=False)
    unknown = data.assign(demo_education="unknown", demo_religion="unknown")
    attrs, values = A.run_pass(unknown, ["education", "religion"], scope_by_language=False)
    assert attrs.empty and values.empty and list(values.columns) == A.VALUE_COLUMNS
    assert A.sharing(values).empty and A.by_language(values).empty


def test_question_order_is_seeded_and_mixed():
    orders = [J.question_order("j", f"item{i}", 0, seed=42) for i in range(200)]
    assert orders == [J.question_order("j", f"item{i}", 0, seed=42) for i in range(200)]
    share = np.mean([o == ("harm", "realism") for o in orders])
    assert 0.35 < share < 0.65
    schema = J.judge_schema(("realism", "harm"))
    assert list(schema["properties"]) == ["realism", "harm"]
    item = {
        "base_attribute": "income_level",
        "base_value": "low",
        "compared_attribute": "education",
        "compared_value": "basic",
    }
    prompt = J.judge_prompt(item, ("realism", "harm"))
    assert prompt.index('"realism"') < prompt.index('"harm"')


def test_parse_and_summarise_judgements():
    assert J.parse_judgement('{"harm": 4, "realism": "yes"}') == {"harm": 4, "realism": "yes", "parse_ok": True}
    bad = J.parse_judgement('{"harm": 9, "realism": "yes"}')
    assert not bad["parse_ok"] and np.isnan(bad["harm"])
    assert not J.parse_judgement('{"harm": 4')["parse_ok"]
    ratings = pd.DataFrame(
        {
            "association_id": ["x", "x", "x", "y", "y"],
            "harm": [4, 5, 2, 3, 4],
            "realism": ["yes", "no", "yes", "no", "no"],
            "judge": ["j"] * 5,
        }
    )
    summary = J.summarise_ratings(ratings).set_index("association_id")
    assert summary.loc["x", "median_harm"] == 4 and summary.loc["x", "harmful"]
    assert summary.loc["y", "median_harm"] == 3.5 and not summary.loc["y", "harmful"]
    assert summary.loc["x", "share_realistic"] == pytest.approx(2 / 3)


def test_self_judgement_gap():
    shared = pd.DataFrame(
        [
            {
                "base_attribute": "a",
                "base_value": "1",
                "compared_attribute": "b",
                "compared_value": "2",
                "models": ["m", "n"],
            },
            {
                "base_attribute": "a",
                "base_value": "1",
                "compared_attribute": "b",
                "compared_value": "3",
                "models": ["m"],
            },
        ]
    )
    ids = [J.association_id(r) for _, r in shared.iterrows()]
    ratings = pd.DataFrame({"judge": ["m", "m", "n"], "association_id": [ids[0], ids[1], ids[0]], "harm": [5, 1, 2]})
    gap = J.self_judgement_gap(shared, ratings).set_index("model")
    assert gap.loc["m", "share_self_rated_harmful"] == 0.5 and gap.loc["n", "share_self_rated_harmful"] == 0.0


def test_human_ratings_import_and_spearman(tmp_path):
    path = tmp_path / "human.csv"
    rows = ["association_id,rater_id,harm,realism"]
    for i in range(8):
        for r in range(3):
            rows.append(f"a|{i}|b|x,r{r},{1 + (i * 4) // 7},yes")
    path.write_text("\n".join(rows) + "\n")
    human = harm_ratings.load_human_ratings(path)
    llm = pd.DataFrame({"association_id": [f"a|{i}|b|x" for i in range(8)], "median_harm": [1, 1, 2, 2, 3, 3, 4, 5]})
    out = H.human_llm_agreement(human, llm, n_boot=200)
    assert out["rho"] > 0.9 and out["n"] == 8 and out["ci_low"] <= out["rho"] <= out["ci_high"]
    bad = tmp_path / "bad.csv"
    bad.write_text("association_id,rater_id,harm,realism\na|1|b|x,r1,7,yes\n")
    with pytest.raises(ValueError, match="bad.csv: row 2, column harm"):
        harm_ratings.load_human_ratings(bad)
    with pytest.raises(ValueError, match="missing column"):
        (tmp_path / "c.csv").write_text("association_id,harm\n")
        harm_ratings.load_human_ratings(tmp_path / "c.csv")


# --- the sequential Fisher decision, parallel passes and the paper-scale benchmark ---------------


def test_clopper_pearson_matches_binomtest_and_reference_interval_narrows_to_the_reference():
    for count, n in [(0, 1000), (7, 1000), (500, 1000), (1000, 1000), (123, 20_000)]:
        ci = stats.binomtest(count, n).proportion_ci(0.9999)
        assert contingency.clopper_pearson(count, n, 0.9999) == pytest.approx((ci.low, ci.high), rel=1e-9, abs=1e-12)
    table = np.array([[9, 4, 2], [3, 8, 6]])
    estimate = contingency.SequentialFisher(table, seed=3, max_resamples=60_000)
    widths = []
    while not estimate.exhausted:
        estimate.refine()
        assert estimate.lo <= estimate.p <= estimate.hi
        widths.append(estimate.hi - estimate.lo)
    assert widths == sorted(widths, reverse=True) and widths[-1] == 0
    # all resamples drawn: exactly the reference p-value (same stream, same order)
    assert estimate.p == contingency.fisher_reference_p(table, 60_000, seed=3)
    assert estimate.method == "monte-carlo(60000)"


def _sparse_near(seed: int) -> np.ndarray:
    """A sparse table (n ~ 60, most expected counts < 5) with a mild planted association."""
    rng = np.random.default_rng(seed)
    probs = np.full((3, 4), 1.0)
    probs[0, 0] = 2.2
    return rng.multinomial(60, (probs / probs.sum()).ravel()).reshape(3, 4)


def test_fisher_decision_equals_the_monte_carlo_reference_on_sparse_tables_near_a_threshold():
    n, early = 100_000, 0
    for seed in range(4):
        table = _sparse_near(seed)
        table = table[table.sum(1) > 0][:, table.sum(0) > 0]
        p_ref = contingency.fisher_reference_p(table, n, seed=seed)
        for factor in (0.7, 0.85, 1.2, 1.5):  # thresholds placed 15-50 % from the reference p-value
            threshold = min(p_ref * factor, 0.99)
            decision = contingency.fisher_rxc(table, [threshold], seed=seed, max_resamples=n)
            assert (decision.p_value < threshold) == (p_ref < threshold), (table.tolist(), threshold, decision)
            early += int(decision.method[12:-1]) < n
    assert early >= 6  # many decisions stopped before drawing every resample


def test_g_test_and_sparsity():
    sparse, dense = np.array([[3, 1], [1, 4]]), np.array([[40, 20], [20, 40]])
    assert contingency.g_test(sparse)[2] and not contingency.g_test(dense)[2]
    assert contingency.g_test(dense)[0] == pytest.approx(
        stats.chi2_contingency(dense, correction=False, lambda_="log-likelihood")[0]
    )


def test_synthetic_extractions_shape_columns_and_values():
    from storybias.stages.extract import answers as extract
    from storybias.tools.bench import synthetic_extractions

    data = synthetic_extractions(5_000, 3, ["en", "fr"], seed=1)
    dims = extract.dimensions()
    assert len(data) == 5_000
    assert list(data.columns) == ["model", "language", "cond_attribute", "cond_value", *[f"demo_{d}" for d in dims]]
    assert set(data["model"]) == {"model_00", "model_01", "model_02"} and set(data["language"]) == {"en", "fr"}
    for dim in dims:
        assert set(data[f"demo_{dim}"].unique()) <= set(extract.allowed_values(dim))
    for base, values in dims.items():
        assert set(data.loc[data["cond_attribute"] == base, "cond_value"]) <= set(values)
    others = data[data["cond_attribute"] != "religion"]["demo_religion"]
    assert 0.25 < (others == "unknown").mean() < 0.65 and 0 < (others == "other").mean() < 0.1
    pd.testing.assert_frame_equal(data, synthetic_extractions(5_000, 3, ["en", "fr"], seed=1))
    assert data.memory_usage(deep=True).sum() < 200 * len(data)  # categoricals: bytes, not strings


def test_run_pass_in_parallel_gives_identical_results():
    from storybias.stages.extract import answers as extract
    from storybias.tools.bench import synthetic_extractions

    data = synthetic_extractions(5_000, 2, ["en", "fr"], seed=2)
    dims = list(extract.dimensions())
    serial = A.run_pass(data, dims, scope_by_language=True, max_resamples=10_000, n_jobs=1)
    parallel = A.run_pass(data, dims, scope_by_language=True, max_resamples=10_000, n_jobs=2)
    assert len(serial[0]) > 100 and serial[0]["retained"].any()
    pd.testing.assert_frame_equal(serial[0], parallel[0])
    pd.testing.assert_frame_equal(serial[1], parallel[1])
    # the same tables as analyse_base_attribute on each model x language x base attribute
    cell = data[(data["model"] == "model_01") & (data["language"] == "fr") & (data["cond_attribute"] == "age")]
    attrs, _ = tables.analyse_base_attribute(cell, "age", dims, max_resamples=10_000)
    mine = serial[0][
        (serial[0]["model"] == "model_01") & (serial[0]["scope"] == "fr") & (serial[0]["base_attribute"] == "age")
    ]
    pd.testing.assert_frame_equal(mine[attrs.columns].reset_index(drop=True), attrs)


def test_bench_associations_small_run(tmp_path, monkeypatch):
    from storybias.tools.bench import bench_associations

    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path))
    out = bench_associations(
        n_stories=5_000,
        n_models=2,
        n_languages=2,
        n_reference=5,
        n_jobs=1,
        max_resamples=10_000,
        log=lambda message: None,
    )
    check = out["reference_check"]
    assert check["checked"] == 5 and check["agreements"] + check["disagreements"] == 5
    # every disagreement counts (none excused by the reference's own interval), and there is none
    assert check["disagreements"] == 0 and check["recomputed_decisions_match_run"]
    assert not any("explained" in key for key in check)
    for name in ("global", "per_language"):
        part = out["passes"][name]
        methods = part["p_methods"]
        assert part["tables"] > 0 and part["seconds"] >= 0
        assert methods["no_resamples"] == 0  # no decision from the G test alone
        assert (
            methods["monte_carlo_pilot"] + methods["monte_carlo_sequential"] + methods["monte_carlo_full"]
            == part["tables"]
        )
    assert out["peak_rss"]["self_mb"] > 0
    assert (tmp_path / "bench" / "bench_associations.json").is_file()
