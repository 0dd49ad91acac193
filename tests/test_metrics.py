"""Stage 05 formulas against hand computations, scipy, and planted signals."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.spatial.distance import jensenshannon

from storybias.core import artifacts
from storybias.stages import metrics


def test_s_c_hand_computed_with_clipping():
    p_m = np.array([0.2, 0.1, 0.0, 0.3, 0.0])
    p_f = np.array([0.1, 0.2, 0.1, 0.0, 0.0])
    s = metrics.log_probability_ratio(p_m, p_f)
    assert s[0] == pytest.approx(math.log(2))
    assert s[1] == pytest.approx(-math.log(2))
    assert s[2] == -2.0 and s[3] == 2.0  # one-sided categories clip to the bounds
    assert np.isnan(s[4])
    assert metrics.log_probability_ratio(np.array([0.9]), np.array([0.01]))[0] == 2.0  # ln 90 > 2


def test_jsd_matches_scipy_squared_natural_log():
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(12)), rng.dirichlet(np.ones(12))
        ours = metrics.jensen_shannon(p, q, epsilon=0.0)
        assert ours == pytest.approx(jensenshannon(p, q, base=math.e) ** 2, rel=1e-9)
    # with epsilon smoothing, against scipy on the smoothed vectors
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([0.0, 0.5, 0.5])
    eps = metrics.JSD_EPSILON
    ps, qs = (p + eps) / (p + eps).sum(), (q + eps) / (q + eps).sum()
    assert metrics.jensen_shannon(p, q) == pytest.approx(jensenshannon(ps, qs, base=math.e) ** 2)
    assert metrics.jensen_shannon(p, p) == pytest.approx(0.0, abs=1e-12)
    assert metrics.jensen_shannon(np.array([1, 0]), np.array([0, 1])) == pytest.approx(math.log(2), rel=1e-6)


def test_cosine_with_zero_imputation():
    u = {"agency": 1.0, "communality": -1.0}
    v = {"agency": 1.0, "intellect": 1.0}
    # union (agency, communality, intellect): u = (1, -1, 0), v = (1, 0, 1): 1 / (sqrt2 * sqrt2) = 0.5
    assert metrics.cosine_similarity(u, v) == pytest.approx(0.5)
    assert metrics.cosine_similarity({"a": float("nan"), "b": 1.0}, {"a": 5.0, "b": 1.0}) == pytest.approx(
        1 / math.sqrt(26)
    )
    assert math.isnan(metrics.cosine_similarity({"a": 0.0}, {"a": 1.0}))


def test_log_odds_z_hand_computed():
    counts_i = {"brave": 10, "kind": 2}
    counts_j = {"brave": 3, "kind": 9}
    prior = {"brave": 13, "kind": 11}
    out = metrics.log_odds_dirichlet(counts_i, counts_j, prior, prior_scale=24.0).set_index("word")
    # alpha = prior counts (scale 24 = corpus size); a0 = 24; n_i = 12, n_j = 12
    a_b, a0 = 13.0, 24.0
    delta = math.log((10 + a_b) / (12 + a0 - 10 - a_b)) - math.log((3 + a_b) / (12 + a0 - 3 - a_b))
    var = 1 / (10 + a_b) + 1 / (3 + a_b)
    assert out.loc["brave", "delta"] == pytest.approx(delta)
    assert out.loc["brave", "z"] == pytest.approx(delta / math.sqrt(var))
    assert out.loc["brave", "z"] > 0 > out.loc["kind", "z"]


def test_d3_worked_example():
    trials = pd.DataFrame([{"label": "female"}] * 40 + [{"label": "male"}] * 10).assign(
        model="m", language="en", task="story", occupation="nurse", occupation_gender="female"
    )
    other = pd.DataFrame([{"label": "female"}] + [{"label": "male"}] * 49).assign(
        model="m", language="en", task="story", occupation="ceo", occupation_gender="male"
    )
    table = metrics.occupation_scores(pd.concat([trials, other])).set_index("occupation")
    assert table.loc["nurse", "m_s"] == pytest.approx(0.6)
    assert table.loc["ceo", "m_b"] == pytest.approx(-0.96)
    assert table.loc["ceo", "m_s"] == pytest.approx(0.96)


def test_unidentified_labels_stay_in_the_denominator():
    trials = pd.DataFrame([{"label": "female"}] * 3 + [{"label": "male"}] * 1 + [{"label": "unknown"}] * 4).assign(
        model="m", language="en", task="news", occupation="teacher", occupation_gender="female"
    )
    all_out = metrics.occupation_scores(trials).iloc[0]
    assert all_out["m_b"] == pytest.approx((3 - 1) / 8) and all_out["n_unidentified"] == 4
    identified = metrics.occupation_scores(trials, identified_only=True).iloc[0]
    assert identified["m_b"] == pytest.approx((3 - 1) / 4)


@pytest.mark.parametrize(("f_value", "df", "published"), [(21.63, 4, 0.495), (9.07, 4, 0.278), (1.98, 11, 0.106)])
def test_partial_omega_squared_reproduces_the_published_values(f_value, df, published):
    # Feng et al. Sec. 4.1: F(4, 79) = 21.63 -> 0.495, F(4, 79) = 9.07 -> 0.278, F(11, 79) = 1.98 -> 0.106.
    # F is published to 2 decimals and omega to 3: they agree when some F within F +/- 0.005 gives a value
    # that rounds to the published one (omega rises with F). N - df in place of df_err + 1 gives 0.455,
    # 0.246 and 0.098 and fails.
    low = metrics.partial_omega_squared(f_value - 0.005, df, 79)
    high = metrics.partial_omega_squared(f_value + 0.005, df, 79)
    assert low <= published + 0.0005 and high >= published - 0.0005
    assert metrics.partial_omega_squared(f_value, df, 79) == pytest.approx(published, abs=0.001)


def test_partial_omega_squared_three_decimals_where_f_is_exact_enough():
    assert round(metrics.partial_omega_squared(9.07, 4, 79), 3) == 0.278
    assert round(metrics.partial_omega_squared(1.98, 11, 79), 3) == 0.106
    assert round(metrics.partial_omega_squared(21.625, 4, 79), 3) == 0.495


def test_partial_omega_squared_from_anova_sums_of_squares():
    rng = np.random.default_rng(3)
    rows = [
        {"model": f"m{m}", "language": lang, "task": t, "m_s": rng.normal(0.3 if lang == "fr" else 0.0, 0.05)}
        for m in range(5)
        for lang in ("en", "fr")
        for t in ("story", "news")
    ]
    table, _ = metrics.type1_anova(pd.DataFrame(rows), "m_s")
    lang = table.set_index("term").loc["language"]
    import statsmodels.formula.api as smf
    from statsmodels.stats.anova import anova_lm

    fit = smf.ols(
        "m_s ~ C(language, Sum) + C(task, Sum) + C(language, Sum):C(task, Sum) + C(model, Sum)", data=pd.DataFrame(rows)
    ).fit()
    ref = anova_lm(fit, typ=1)
    ms_error = ref.loc["Residual", "sum_sq"] / ref.loc["Residual", "df"]
    # the sums-of-squares form of the same quantity: (SS - df MS_err) / (SS + (df_err + 1) MS_err)
    ss, df = ref.iloc[0]["sum_sq"], ref.iloc[0]["df"]
    expected = (ss - df * ms_error) / (ss + (ref.loc["Residual", "df"] + 1) * ms_error)
    assert lang["partial_omega_sq"] == pytest.approx(expected)
    assert lang["p_value"] < 0.001 and lang["partial_omega_sq"] > 0.5


def _spec_rows(p_balance, p_stereotype):
    terms = ("language", "task", "language:task", "model")
    return pd.DataFrame(
        [
            {"outcome": o, "term": t, "p_value": p, "subset": "all available", "denominator": "all outputs"}
            for o, ps in (("m_b", p_balance), ("m_s", p_stereotype))
            for t, p in zip(terms, ps)
        ]
    )


def test_bh_family_is_the_specification_and_reproduces_the_published_0047():
    # Balance's model term has raw p = 0.0415 and is the 7th smallest of the 8 tests of the specification:
    # 0.0415 x 8 / 7 = 0.0474 -> the published 0.047. A family of 4 per metric would leave it at 0.0415.
    anova = _spec_rows([1e-6, 2e-6, 3e-6, 0.0415], [4e-6, 5e-6, 6e-6, 0.30])
    out = metrics.bh_adjust(anova)
    model = out[(out.outcome == "m_b") & (out.term == "model")]["p_adjusted"].item()
    assert round(model, 3) == 0.047
    assert model == pytest.approx(0.0415 * 8 / 7)
    per_metric = metrics.bh_adjust(anova, family="metric")
    assert per_metric[(per_metric.outcome == "m_b") & (per_metric.term == "model")][
        "p_adjusted"
    ].item() == pytest.approx(0.0415)


def test_bh_families_do_not_mix_specifications():
    a = _spec_rows([0.01, 0.02, 0.03, 0.04], [0.05, 0.06, 0.07, 0.08])
    b = a.assign(subset="common models", p_value=a["p_value"] / 10)
    from statsmodels.stats.multitest import multipletests

    out = metrics.bh_adjust(pd.concat([a, b], ignore_index=True))
    for _subset, g in out.groupby("subset"):
        assert np.allclose(g["p_adjusted"], multipletests(g["p_value"], method="fdr_bh")[1])


def test_trial_glm_uses_the_genres_only():
    # the explicit task (here: a strong, different pattern) must not enter; genre has 1 df (story vs news)
    rng = np.random.default_rng(5)
    rows = []
    for model in ("a", "b", "c"):
        for lang in ("en", "fr"):
            for occ in ("nurse", "ceo", "chef", "lawyer"):
                for task in ("explicit", "story", "news"):
                    p = 0.95 if task == "explicit" else (0.6 if lang == "fr" and task == "news" else 0.4)
                    for _ in range(25):
                        rows.append(
                            {
                                "model": model,
                                "language": lang,
                                "task": task,
                                "occupation": occ,
                                "label": "female" if rng.random() < p else "male",
                            }
                        )
    trials = pd.DataFrame(rows)
    wald, note = metrics.trial_glm(trials, "female")
    assert note == ""
    t = wald.set_index("term")
    assert t.loc["C(task, Sum)", "df"] == 1
    assert (wald["n_trials"] == (trials["task"] != "explicit").sum()).all()
    genres_only, _ = metrics.trial_glm(trials[trials["task"] != "explicit"], "female")
    assert np.allclose(wald["chi2"].to_numpy(), genres_only["chi2"].to_numpy())
    assert "C(language, Sum):C(task, Sum)" in t.index and "C(model, Sum)" in t.index and "C(occupation, Sum)" in t.index


def test_anova_degrees_of_freedom_for_the_papers_design_shape():
    # 12 models, 3 languages (9 models in French), 3 tasks: (12 + 9 + 12) x 3 = 99 aggregates.
    rng = np.random.default_rng(42)
    rows = []
    for m in range(12):
        for lang in ("en", "fr", "zh"):
            if lang == "fr" and m >= 9:
                continue
            for task in ("explicit", "story", "news"):
                rows.append({"model": f"m{m}", "language": lang, "task": task, "m_b": rng.normal()})
    assert len(rows) == 99
    table, note = metrics.type1_anova(pd.DataFrame(rows), "m_b")
    t = table.set_index("term")
    assert note == ""
    assert (t.loc["language:task", "df"], t.loc["language:task", "df_resid"]) == (4, 79)
    assert (t.loc["language", "df"], t.loc["task", "df"], t.loc["model", "df"]) == (2, 2, 11)
    assert (table["p_adjusted"] >= table["p_value"]).all()


def test_anova_degenerate_inputs_explain_instead_of_crashing():
    one = pd.DataFrame([{"model": "m", "language": "en", "task": "story", "m_s": 0.1}])
    table, note = metrics.type1_anova(one, "m_s")
    assert table.empty and "nothing to test" in note
    # one model x 3 languages x 3 tasks: the interaction saturates the model; main effects remain
    rng = np.random.default_rng(1)
    grid = pd.DataFrame(
        [
            {"model": "m", "language": l, "task": t, "m_s": rng.normal()}
            for l in ("en", "fr", "zh")
            for t in ("explicit", "story", "news")
        ]
    )
    table, note = metrics.type1_anova(grid, "m_s")
    assert list(table["term"]) == ["language", "task"] and (table["df_resid"] == 4).all() and "saturated" in note


def _planted_groups(effect: float, n: int, seed: int) -> metrics.GroupData:
    """Stories of 5 adjectives over 3 categories; the male group draws category 0 with extra weight."""
    rng = np.random.default_rng(seed)
    base = np.array([1 / 3, 1 / 3, 1 / 3])
    boosted = base * np.array([math.exp(effect), 1, 1])
    boosted /= boosted.sum()
    counts_m = rng.multinomial(5, boosted, size=n).astype(float)
    counts_f = rng.multinomial(5, base, size=n).astype(float)
    return metrics.GroupData(counts_m, counts_m.sum(1), counts_f, counts_f.sum(1))


def test_planted_gender_effect_has_the_planted_sign():
    g = _planted_groups(effect=0.8, n=300, seed=1)
    s = metrics.s_c_from_counts(g)
    lo, hi = metrics.bootstrap_s_c(g, n_boot=500, seed=2)
    assert s[0] > 0 and lo[0] > 0, "planted male association: S_C and its whole interval positive"
    assert hi[1] < 0 or s[1] < 0  # the other categories lose share


def test_null_effect_interval_covers_zero():
    covered = 0
    for seed in range(10):
        g = _planted_groups(effect=0.0, n=150, seed=seed)
        lo, hi = metrics.bootstrap_s_c(g, n_boot=300, seed=seed + 100)
        covered += lo[0] <= 0 <= hi[0]
    assert covered >= 8  # nominal 95%: at least 8 of 10 intervals cover 0


def test_jsd_bootstrap_interval_contains_estimate():
    rng = np.random.default_rng(5)
    words_m = rng.poisson(1.0, size=(80, 20)).astype(float)
    words_f = rng.poisson(1.0, size=(80, 20)).astype(float)
    est = metrics.jsd_from_counts(words_m.sum(0), words_f.sum(0))
    lo, hi = metrics.bootstrap_jsd(words_m, words_f, n_boot=200, seed=1)
    assert lo <= est <= hi or est < hi


def test_grammatical_gender_test_needs_both_groups():
    one_group = pd.DataFrame({"language": ["en", "zh"], "jsd": [0.1, 0.2]})
    out = metrics.grammatical_gender_test(one_group)
    assert math.isnan(out["p_value"]) and "G:" in out["note"]
    both = pd.DataFrame({"language": ["en", "zh", "fr", "es"], "jsd": [0.1, 0.2, 0.3, 0.4]})
    assert metrics.grammatical_gender_test(both)["n_G"] == 2


def test_lexicon_has_the_required_categories_and_no_duplicates():
    adjectives = set(metrics.categories("adjectives"))
    assert {"agency", "communality", "intellect", "appearance", "emotion", "morality"} <= adjectives
    assert {"domestic", "outdoor_nature", "public_institutional"} <= set(metrics.categories("settings"))
    assert metrics.coverage([["brave", "zzz"], ["kind"]], metrics.load_lexicon()) == pytest.approx(2 / 3)


# --- the stage on a synthetic run -------------------------------------------------------------


def _synthetic_run(tmp_path, monkeypatch, models=("m1", "m2"), languages=("en", "fr"), girls_have_adjectives=True):
    import yaml

    from storybias.config import params
    from storybias.core import io, paths

    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    rng = np.random.default_rng(0)
    rows, ex = [], []
    i = 0
    for model in models:
        for lang in languages:
            for child in ("boy", "girl"):
                for k in range(30):
                    sid = f"b{i}"
                    i += 1
                    adjectives = (
                        (["brave", "bold", "kind"] if child == "boy" else ["kind", "gentle", "brave"])
                        if (child == "boy" or girls_have_adjectives)
                        else []
                    )
                    rows.append(
                        {
                            "story_id": sid,
                            "design": "bedtime",
                            "model": model,
                            "language": lang,
                            "cond_child_gender": child,
                            "cond_social_class": "wealthy" if k % 2 else "working_class",
                            "cond_task": None,
                            "is_valid": True,
                        }
                    )
                    ex.append(
                        {
                            "story_id": sid,
                            "parse_ok": True,
                            "adjectives_en": adjectives,
                            "settings": ["forest" if child == "boy" else "home"],
                            "protagonist_gender": "unknown",
                        }
                    )
            for occ, assoc in (("nurse", "female"), ("ceo", "male")):
                for task in ("explicit", "story", "news"):
                    for k in range(10):
                        sid = f"o{i}"
                        i += 1
                        label = rng.choice(
                            ["female", "male", "unknown"], p=[0.7, 0.2, 0.1] if assoc == "female" else [0.2, 0.7, 0.1]
                        )
                        rows.append(
                            {
                                "story_id": sid,
                                "design": "occupations",
                                "model": model,
                                "language": lang,
                                "cond_task": task,
                                "cond_occupation": occ,
                                "cond_occupation_gender": assoc,
                                "is_valid": True,
                            }
                        )
                        ex.append(
                            {
                                "story_id": sid,
                                "parse_ok": bool(k != 9),
                                "adjectives_en": [],
                                "settings": [],
                                "protagonist_gender": label,
                            }
                        )
    filtered = pd.DataFrame(rows)
    extractions = pd.DataFrame(ex)
    run = "unit-metrics"
    io.write_parquet_atomic(filtered, artifacts.filtered_path(run))
    io.write_parquet_atomic(extractions, artifacts.extractions_path(run))
    vsr = (
        filtered.groupby(["design", "model", "language"])
        .size()
        .rename("n_stories")
        .reset_index()
        .assign(n_valid=lambda d: d.n_stories, vsr=1.0)
    )
    io.write_parquet_atomic(vsr, artifacts.vsr_path(run))
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["run_name"] = run
    raw["metrics"] = {"bootstrap": 200, "min_stories": 20}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(raw))
    return params.load(path)


def test_stage_recovers_planted_signal(tmp_path, monkeypatch):
    p = _synthetic_run(tmp_path, monkeypatch)
    out = metrics.run(p)
    sc = out["sc"]
    gender = sc[(sc.comparison == "child_gender") & (sc.kind == "adjectives")].set_index(
        ["model", "language", "category"]
    )
    assert (gender.xs("agency", level="category")["s_c"] > 0).all()  # brave + bold for boys
    assert (gender.xs("communality", level="category")["s_c"] < 0).all()  # kind + gentle for girls
    assert (gender.xs("agency", level="category")["ci_low"] > 0).all()
    jsd = out["jsd"][out["jsd"].comparison == "child_gender"]
    assert (jsd["jsd"] > 0).all() and not jsd["small_sample"].any()
    cos = out["cosine"][
        (out["cosine"].comparison == "child_gender")
        & (out["cosine"].language_a == "en")
        & (out["cosine"].language_b == "fr")
    ]
    assert (cos["cosine"] > 0.99).all()
    top = out["log_odds"][(out["log_odds"].comparison == "child_gender") & (out["log_odds"].field == "adjectives_en")]
    assert set(top[top.group == "boy"].nlargest(1, "z")["word"]) == {"bold"}
    anova = out["anova"]
    terms = set(anova[(anova.subset == "all available") & (anova.denominator == "all outputs")]["term"])
    assert terms == {"language", "task", "language:task", "model"}
    agg = out["aggregates"][out["aggregates"].denominator == "all outputs"]
    assert (agg["m_s"] > 0).all() and agg["m_s"].mean() == pytest.approx(0.5, abs=0.15)  # planted: 0.7 - 0.2
    assert out["n_excluded"] > 0  # parse failures excluded and counted
    assert not out["glm"].empty
    # trial-level GLMs on story and news only: 2 models x 2 languages x 2 occupations x 2 genres x 9 parsed
    assert set(out["glm"].loc[out["glm"].outcome == "identified", "n_trials"]) == {2 * 2 * 2 * 2 * 9}
    # one BH family per specification over both metrics' terms (Feng et al. Table 2)
    from statsmodels.stats.multitest import multipletests

    for _, spec in anova.groupby(["subset", "denominator"]):
        assert len(spec) == 8
        assert np.allclose(spec["p_adjusted"], multipletests(spec["p_value"], method="fdr_bh")[1])


def test_stage_degenerate_inputs_give_notes_not_crashes(tmp_path, monkeypatch):
    p = _synthetic_run(tmp_path, monkeypatch, models=("m1",), languages=("en",), girls_have_adjectives=False)
    out = metrics.run(p)
    sc = out["sc"]
    adj = sc[(sc.comparison == "child_gender") & (sc.kind == "adjectives")]
    assert adj["s_c"].isna().all() and (adj["note"] == "a group has no adjectives").all()
    jsd = out["jsd"][out["jsd"].comparison == "child_gender"]
    assert jsd["jsd"].isna().all() and (jsd["note"] == "a group has no adjectives").all()
    gg = out["grammatical_gender"]
    assert gg["p_value"].isna().all()
    assert set(out["anova"]["term"]) == {"task"} if not out["anova"].empty else True


def _written_schemas(run_name: str) -> dict:
    import pyarrow.parquet as pq

    from storybias.core import paths

    return {
        name: pq.read_schema(paths.run_dir(run_name) / f"metrics_{name}.parquet").remove_metadata()
        for name in metrics.OUTPUT_SCHEMAS
    }


def test_stage_writes_the_contract_schemas_full_and_empty(tmp_path, monkeypatch):
    from storybias.core import io, paths

    p = _synthetic_run(tmp_path, monkeypatch, models=("m1",), languages=("en", "fr"))
    metrics.run(p)
    assert _written_schemas(p.run_name) == metrics.OUTPUT_SCHEMAS  # a full run: the contract, type for type
    # No extraction at all (every story invalid, or stage 03 found nothing): every table keeps its
    # columns and types, with zero rows, instead of a zero-column parquet file.
    empty = pd.read_parquet(artifacts.extractions_path(p.run_name)).iloc[:0]
    io.write_parquet_atomic(empty, artifacts.extractions_path(p.run_name))
    out = metrics.run(p)
    assert _written_schemas(p.run_name) == metrics.OUTPUT_SCHEMAS
    for name, schema in metrics.OUTPUT_SCHEMAS.items():
        assert pd.read_parquet(paths.run_dir(p.run_name) / f"metrics_{name}.parquet").empty, name
        assert list(out[name].columns) == schema.names and out[name].empty, name
    assert any("nothing to compare" in n for n in out["notes"])


@pytest.mark.parametrize(
    "table, drop",
    [
        ("extractions", ["parse_ok"]),
        ("extractions", ["parse_ok", "adjectives_en"]),
        ("filtered", ["cond_child_gender"]),
        ("vsr", ["vsr"]),
    ],
)
def test_malformed_input_names_the_file_and_the_missing_columns(tmp_path, monkeypatch, table, drop):
    from storybias.core import io, paths

    p = _synthetic_run(tmp_path, monkeypatch, models=("m1",), languages=("en",))
    path = {"extractions": artifacts.extractions_path, "filtered": artifacts.filtered_path, "vsr": artifacts.vsr_path}[
        table
    ](p.run_name)
    io.write_parquet_atomic(pd.read_parquet(path).drop(columns=drop), path)
    with pytest.raises(metrics.InputContractError) as exc:
        metrics.run(p)
    message = str(exc.value)
    assert str(path) in message and all(column in message for column in drop)
    assert not list(paths.run_dir(p.run_name).glob("metrics_*.parquet")), "nothing written before the check"


def test_non_boolean_parse_ok_is_named(tmp_path, monkeypatch):
    from storybias.core import io

    p = _synthetic_run(tmp_path, monkeypatch, models=("m1",), languages=("en",))
    path = artifacts.extractions_path(p.run_name)
    io.write_parquet_atomic(pd.read_parquet(path).assign(parse_ok="yes"), path)
    with pytest.raises(metrics.InputContractError, match="parse_ok must be boolean"):
        metrics.run(p)


def test_lexicon_with_a_repeated_category_is_refused(tmp_path, monkeypatch):
    from storybias.config.params import ParamsError
    from storybias.core import paths

    text = (paths.params_dir() / "lexicon" / "categories.yaml").read_text(encoding="utf-8")
    (tmp_path / "lexicon").mkdir()
    (tmp_path / "lexicon" / "categories.yaml").write_text(text + "\nsettings:\n  domestic: [attic]\n", encoding="utf-8")
    monkeypatch.setattr(paths, "params_dir", lambda: tmp_path)
    metrics.load_lexicon.cache_clear()
    try:
        with pytest.raises(ParamsError, match=r"categories.yaml:\d+: found duplicate key 'settings'"):
            metrics.load_lexicon("settings")
    finally:
        metrics.load_lexicon.cache_clear()


def test_s_c_denominator_is_a_stated_choice():
    """BiasedTales-ML's Eq. 1 says only "normalized frequency" (issue #29 item 9): over every token (a word
    in no category included) the two groups below have the same agency share; over categorized tokens the
    boy's is 1/2 against the girl's 1/3."""
    lexicon = metrics.load_lexicon("adjectives")
    cats = metrics.categories("adjectives")
    boy = [["brave", "kind", "zzz", "zzz"]]
    girl = [["brave", "kind", "kind", "zzz"]]
    agency = cats.index("agency")
    values = {}
    for denominator in ("all_tokens", "categorized"):
        cm, tm = metrics.category_counts(boy, lexicon, cats, denominator)
        cf, tf = metrics.category_counts(girl, lexicon, cats, denominator)
        values[denominator] = metrics.s_c_from_counts(metrics.GroupData(cm, tm, cf, tf))[agency]
    assert values["all_tokens"] == pytest.approx(0.0)
    assert values["categorized"] == pytest.approx(math.log(1.5))


def test_log_odds_compare_cultural_references_too():
    """BiasedTales-ML's distinctive-word figures cover the cultural references as well as adjectives and settings."""
    from storybias.config.params import Comparison

    comparison = Comparison(
        name="religion", design="bedtime", condition="religion", group_m="muslim", group_f="christian"
    )
    data = pd.DataFrame(
        {
            "design": "bedtime",
            "model": "m",
            "cond_religion": ["muslim"] * 20 + ["christian"] * 20,
            "adjectives_en": [["kind"]] * 40,
            "settings": [["home"]] * 40,
            "cultural_refs": [["Eid"]] * 20 + [["christmas"]] * 20,
        }
    )
    table = metrics.log_odds_table(data, comparison, prior_scale=100.0, top=1)
    refs = table[table["field"] == "cultural_refs"].set_index("group")
    assert refs.loc["muslim", "word"] == "eid" and refs.loc["christian", "word"] == "christmas"


def test_a_negative_wald_statistic_is_no_test():
    """A cluster-robust covariance that is not positive definite (few clusters, a separated outcome) can
    give Wald chi2 < 0 (the default run's female intercept: -132.7): its chi2 and p are emptied, named."""
    from storybias.stages.metrics.feng import drop_unusable_wald

    wald = pd.DataFrame(
        {"outcome": ["female"] * 2, "term": ["Intercept", "C(model, Sum)"], "chi2": [-132.7, 5.72],
         "p_value": [1.0, 0.017], "df": [1, 1], "n_trials": [55, 55]}
    )  # fmt: skip
    out, unusable = drop_unusable_wald(wald)
    assert unusable == ["Intercept"] and np.isnan(out.loc[0, "chi2"]) and np.isnan(out.loc[0, "p_value"])
    assert out.loc[1, "chi2"] == 5.72 and wald.loc[0, "chi2"] == -132.7  # the input is not changed


def test_answers_at_the_list_cap_are_counted_per_list_among_parsed_answers():
    from storybias import summaries

    extractions = pd.DataFrame(
        {
            "parse_ok": [True, True, True, False],
            "adjectives_en": [["a", "b", "c"], ["a"], None, ["a", "b", "c", "d"]],
            "settings": [["x"], ["x", "y", "z"], ["x", "y", "z", "w"], ["x", "y", "z"]],
        }
    )
    counts = summaries.answers_at_list_cap(extractions, 3, ["adjectives_en", "settings", "cultural_refs"])
    assert counts.to_dict() == {"adjectives_en": 1, "settings": 2}  # the unparsed answer and a missing list left out
    assert counts.name == "answers at the cap (3) of 3 parsed"
    assert summaries.answers_at_list_cap(extractions, None, ["settings"]).to_dict() == {"settings": 0}


def test_notebook_05s_cosine_matrices_and_capped_answers_on_hand_made_tables(tmp_path, monkeypatch):
    """Issue #59 item 3: the cosine table as one language matrix per (comparison, model), and the parsed
    answers at stage 03's list cap read from the run's extractions, in stage 05's result."""
    cosine = pd.DataFrame(
        {
            "comparison": ["c"] * 4 + ["d"] * 4,
            "model": "m",
            "language_a": ["en", "en", "fr", "fr"] * 2,
            "language_b": ["en", "fr", "en", "fr"] * 2,
            "cosine": [1.0, 0.4, 0.4, 1.0, 1.0, -0.2, -0.2, 1.0],
        }
    )
    matrices = metrics.cosine_matrices(cosine)
    assert list(matrices) == [("c", "m"), ("d", "m")]
    assert matrices[("d", "m")].to_dict() == {"en": {"en": 1.0, "fr": -0.2}, "fr": {"en": -0.2, "fr": 1.0}}
    assert metrics.cosine_matrices(cosine.iloc[:0]) == {}
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path))
    (tmp_path / "r").mkdir()
    pd.DataFrame(
        {
            "story_id": ["a", "b", "c"],
            "parse_ok": [True, True, False],
            "adjectives_en": [["x", "y"], ["x"], ["x", "y", "z"]],  # a reaches a cap of 2; c does not parse
            "settings": [["s"], ["s", "t", "u"], ["s", "t"]],  # b reaches it
        }
    ).to_parquet(artifacts.extractions_path("r"))
    capped = metrics.capped_answers("r", 2)  # no cultural_refs column: that list is not counted
    assert (
        capped.to_dict() == {"adjectives_en": 1, "settings": 1} and capped.name == "answers at the cap (2) of 2 parsed"
    )
    assert metrics.capped_answers("r", None).to_dict() == {"adjectives_en": 0, "settings": 0}
