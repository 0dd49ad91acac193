"""The cross-lens table (issue #30 items 1 and 5; storybias.stages.crosslens.measures): each lens's measure per
model x language from the stage tables, with intervals, n and reasons, and a planted run in which one model
is biased through every lens and another through one lens only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from storybias.stages.crosslens import measures as X
from storybias.stages.metrics.feng import aggregate_intervals, aggregate_scores
from storybias.stats.concordance import lens_agreement

LANGUAGES = ["en", "fr", "zh"]
KEY = ["base_attribute", "base_value", "compared_attribute", "compared_value"]


def _run(models: dict[str, tuple[float, float, float]], seed: int = 0):
    """Stage tables of a synthetic run: per model, its planted (associations, narrative, occupation) bias in
    [0, 1]: how many significant associations (of 20 tested), how far S_C and JSD move, how stereotyped
    the occupations are."""
    rng = np.random.default_rng(seed)
    values, shared, stories, jsd, sc, occupations, probes = [], [], [], [], [], [], []
    for model, (a, b, c) in models.items():
        for language in LANGUAGES:
            stories += [{"model": model, "language": language}] * 200
            n_sig = int(round(20 * a + rng.integers(0, 2)))
            for i in range(20):
                key = dict(zip(KEY, ("gender", "woman", "age", f"v{i}")))
                values.append({"model": model, "scope": language, **key, "significant": i < n_sig})
                if i < n_sig:
                    shared.append(
                        {
                            "scope": language,
                            **key,
                            "models": [model],
                            "median_harm": 4.0 if i % 2 else 2.0,
                            "harmful": bool(i % 2),
                        }
                    )
            j = 0.05 + 0.5 * b + rng.uniform(0, 0.02)
            jsd.append(
                {
                    "comparison": "child_gender",
                    "model": model,
                    "language": language,
                    "n_m": 30,
                    "n_f": 30,
                    "jsd": j,
                    "ci_low": j - 0.03,
                    "ci_high": j + 0.03,
                    "note": "",
                }
            )
            for k, category in enumerate(("agency", "communality")):
                s = (1.8 * b + rng.uniform(0, 0.1)) * (1 if k == 0 else -0.5)
                sc.append(
                    {
                        "comparison": "child_gender",
                        "model": model,
                        "language": language,
                        "n_m": 30,
                        "n_f": 30,
                        "kind": "adjectives",
                        "category": category,
                        "s_c": s,
                        "ci_low": s - 0.2,
                        "ci_high": s + 0.2,
                    }
                )
            for occupation, gender in (("nurse", "female"), ("surgeon", "male")):
                stereo = int(round(10 + 10 * c))
                n_f = stereo if gender == "female" else 20 - stereo
                occupations.append(
                    {
                        "model": model,
                        "language": language,
                        "task": "story",
                        "occupation": occupation,
                        "occupation_gender": gender,
                        "n": 20,
                        "n_female": n_f,
                        "n_male": 20 - n_f,
                        "m_s": (2 * stereo - 20) / 20,
                        "m_b": (2 * n_f - 20) / 20,
                        "denominator": "all outputs",
                    }
                )
            auc = 0.55 + 0.4 * c + rng.uniform(0, 0.01)
            delta = -0.2 + 0.15 * c + rng.uniform(0, 0.01)
            for variant, value in (("full_sample", auc), ("delta", delta)):
                probes.append(
                    {"model": model, "language": language, "variant": variant, "n": 80,
                     "auc": value, "ci_low": value - 0.05, "ci_high": value + 0.05, "status": "ok"}
                )  # fmt: skip
    frames = (values, shared, stories, jsd, sc, occupations, probes)
    return tuple(pd.DataFrame(f) for f in frames)  # fmt: skip


def _tested(values: pd.DataFrame) -> pd.DataFrame:
    """associations_attributes of the run: one tested table per model x scope that has value-level cells."""
    return values[["model", "scope"]].drop_duplicates().assign(base_attribute="gender", compared_attribute="age")


def _aggregates(occupations: pd.DataFrame) -> pd.DataFrame:
    """Stage 05's metrics_aggregates of the occupations table, with its intervals (computed there, once)."""
    keys = ["model", "language", "task"]
    scores = aggregate_scores(occupations).merge(aggregate_intervals(occupations, 200, 1), on=keys)
    return scores.assign(denominator="all outputs")


def _measures_of_the_four_parts() -> list[str]:
    """The measures _table's parts give (a measure registered besides them reads its absent reason)."""
    from storybias.stages.crosslens.registry import PARTS

    parts = ("association_part", "narrative_part", "occupation_part", "probe_part")
    return [spec.name for name in parts for spec in PARTS[name].measures]


def _table(models):
    values, shared, stories, jsd, sc, occupations, probes = _run(models)
    parts = [
        X.association_measures(values, shared, stories, _tested(values)),
        X.narrative_measures(jsd, sc, "child_gender"),
        X.occupation_measures(_aggregates(occupations), "story"),
        X.probe_measures(probes),
    ]
    return X.crosslens_table(parts, {})


def test_measures_have_intervals_n_and_the_planted_values():
    table = _table({"a": (0.5, 0.5, 0.5)}).set_index(["model", "language"])
    row = table.loc[("a", "en")]
    assert row["n_assoc_per_1000"] == 200 and row["assoc_per_1000"] in (50.0, 55.0) and row["n_tables"] == 1
    assert row["share_harmful"] == pytest.approx(0.5, abs=0.1) and row["n_share_harmful"] >= 10
    assert row["share_harmful_low"] < row["share_harmful"] < row["share_harmful_high"]
    assert row["m_s"] == pytest.approx(0.5)
    assert row["max_abs_sc"] == pytest.approx(0.9, abs=0.1) and row["jsd"] == pytest.approx(0.3, abs=0.03)
    assert (table[[f"reason_{m}" for m in _measures_of_the_four_parts()]] == "").all().all()


def test_a_missing_lens_says_why():
    values, shared, stories, jsd, sc, occupations, probes = _run({"a": (0.5, 0.5, 0.5)})
    parts = [
        X.association_measures(values, shared, stories.iloc[:5], _tested(values)),
        X.narrative_measures(jsd, sc, "child_gender"),
    ]
    table = X.crosslens_table(parts, {"m_s": "no occupations outputs", "m_b": "no occupations outputs"})
    row = table.set_index(["model", "language"]).loc[("a", "en")]
    assert row["reason_assoc_per_1000"] == "5 stereotales stories (< 10)" and np.isnan(row["assoc_per_1000"])
    assert row["reason_m_s"] == "no occupations outputs" and row["n_m_s"] == 0


def test_a_cell_whose_association_tables_were_untestable_is_missing_not_zero():
    """No table of model a's French pass could be tested: its rate of significant associations is
    unknown (NaN with the reason), not 0 per 1,000 stories; English, tested, keeps its rate."""
    values, shared, stories, *_ = _run({"a": (0.5, 0.5, 0.5)})
    values = values[values["scope"] != "fr"]
    table = X.crosslens_table([X.association_measures(values, shared, stories, _tested(values))], {}).set_index(
        ["model", "language"]
    )
    french, english = table.loc[("a", "fr")], table.loc[("a", "en")]
    for measure in ("assoc_per_1000", "share_harmful"):
        assert np.isnan(french[measure]) and np.isnan(french[f"{measure}_low"]) and np.isnan(french[f"{measure}_high"])
        assert french[f"reason_{measure}"].startswith("no table testable in this language pass")
    assert french["n_assoc_per_1000"] == 200  # the stories were there; no table could be tested
    assert english["assoc_per_1000"] > 0 and english["reason_assoc_per_1000"] == ""


def test_planted_models_are_recovered_and_the_discordant_one_breaks_its_pairs():
    """m_all is biased through every lens, m_narr through BiasedTales-ML's only; the rest share a
    common bias level. The concordant model ranks first on every measure; m_narr tops JSD and |S_C| and
    lowers the agreement of exactly the pairs that include them."""
    rng = np.random.default_rng(5)
    models = {"m_all": (0.95, 0.95, 0.95), "m_narr": (0.0, 1.0, 0.0)}
    models.update({f"m{i}": (level, level, level) for i, level in enumerate(rng.uniform(0.1, 0.7, 8))})
    table = _table(models)
    mean = table.groupby("model")[list(X.MEASURES)].mean()
    for measure in ("assoc_per_1000", "m_s", "auc_full", "delta_auc"):
        assert mean[measure].idxmax() == "m_all", measure
    for measure in ("jsd", "max_abs_sc"):
        assert mean[measure].idxmax() == "m_narr" and mean[measure].rank(ascending=False)["m_all"] == 2
    agreement = lens_agreement(table, ["assoc_per_1000", "jsd", "m_s"], n_permutations=300, lenses=X.LENS_OF)
    r = {(row.measure_a, row.measure_b): row.r_within_language for row in agreement.itertuples()}
    assert r[("assoc_per_1000", "m_s")] > 0.7
    assert r[("assoc_per_1000", "jsd")] < r[("assoc_per_1000", "m_s")] - 0.2
    assert r[("jsd", "m_s")] < r[("assoc_per_1000", "m_s")] - 0.2
    assert (agreement["kind"] == "across lenses").all()


def test_the_comparison_must_be_one_with_s_c_and_the_default_is_the_first(tmp_path):
    import yaml

    from storybias.config import params
    from storybias.config.params import ParamsError
    from storybias.core import paths

    default = params.load(paths.params_dir() / "default.yaml")
    assert default.crosslens_comparison() == "child_gender"
    with open(paths.params_dir() / "smoke.yaml", encoding="utf-8") as fh:
        base = yaml.safe_load(fh)
    profile = tmp_path / "bad.yaml"
    profile.write_text(yaml.safe_dump({**base, "crosslens": {"comparison": "nope"}}))
    with pytest.raises(ParamsError, match=r"crosslens\.comparison: 'nope'"):
        params.load(profile)


def test_the_crosslens_stage_reads_the_runs_artifacts(tmp_path, monkeypatch):
    """run_tables reads the run's stage 03-06 tables (the registry's paths): the parsed stories from
    extractions and filtered, stage 04's associations, stage 05's narrative metrics and aggregates (with
    their M_s / M_b intervals), stage 06's per-model probes; a table a stage did not write gives reasons."""
    from storybias.config.params import CrossLensSettings

    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    probes = write_run(tmp_path / "data" / "x", {"a": (0.5, 0.5, 0.5), "b": (0.2, 0.2, 0.2)})
    run = tmp_path / "data" / "x"
    table, agreement = X.run_tables("x", "child_gender", CrossLensSettings(n_permutations=100))
    assert len(table) == 6 and table["assoc_per_1000"].notna().all() and table["jsd"].notna().all()
    assert table["m_s"].notna().all() and table["m_s_low"].isna().all()  # no interval shown to cover
    assert set(table["reason_auc_full"]) == {X.LENS_REASONS["auc_full"]}  # stage 06 wrote no per-model probe
    probes.to_parquet(run / "probes_per_model.parquet")
    table, agreement = X.run_tables("x", "child_gender", CrossLensSettings(n_permutations=100))
    assert table["auc_full"].notna().all()
    n_measures = len(X.MEASURES)  # 8, or more with a measure registered later: every pair once
    assert list(agreement.columns) == X.CROSSLENS_AGREEMENT_SCHEMA.names
    assert len(agreement) == n_measures * (n_measures - 1) // 2
    within = agreement[agreement["kind"] == "within one lens"]
    assert sorted(zip(within["measure_a"], within["measure_b"])) == [
        ("assoc_per_1000", "share_harmful"), ("auc_full", "delta_auc"), ("jsd", "max_abs_sc"), ("m_s", "m_b")
    ]  # fmt: skip
    assert set(agreement["finding"]) == {"not assessed"}  # two models cannot be relabelled into a test


def write_run(run: Path, models: dict[str, tuple[float, float, float]]) -> pd.DataFrame:
    """Write the stage 03-05 tables of a synthetic run of ``models`` into the run folder ``run``; returns
    stage 06's per-model probes, unwritten (a test writes them when it wants the probe lens)."""
    values, shared, stories, jsd, sc, occupations, probes = _run(models)
    stories = stories.assign(story_id=[f"s{i}" for i in range(len(stories))], design="stereotales")
    run.mkdir(parents=True)
    stories.to_parquet(run / "filtered.parquet")
    stories[["story_id"]].assign(parse_ok=True).to_parquet(run / "extractions.parquet")
    values.to_parquet(run / "associations_values.parquet")
    _tested(values).to_parquet(run / "associations_attributes.parquet")
    shared.to_parquet(run / "associations_shared.parquet")
    jsd.to_parquet(run / "metrics_jsd.parquet")
    sc.to_parquet(run / "metrics_sc.parquet")
    _aggregates(occupations).to_parquet(run / "metrics_aggregates.parquet")
    return probes


def test_a_probe_that_could_not_be_fitted_gives_its_status():
    rows = pd.DataFrame(
        [
            {"model": "a", "language": "en", "variant": "full_sample", "n": 12, "auc": np.nan,
             "ci_low": np.nan, "ci_high": np.nan, "status": "fewer than 5 groups per class"},
            {"model": "a", "language": "en", "variant": "delta", "n": 0, "auc": -0.1,
             "ci_low": -0.2, "ci_high": 0.0, "status": "ok"},
        ]
    )  # fmt: skip
    cell = X.probe_measures(rows)[("a", "en")]
    assert cell["auc_full"]["reason"] == "probe not fitted: fewer than 5 groups per class"
    assert np.isnan(cell["auc_full"]["value"]) and cell["auc_full"]["n"] == 12
    assert cell["delta_auc"]["value"] == -0.1 and cell["delta_auc"]["reason"] == ""


def test_model_probes_refit_each_models_stories_and_find_the_separating_one():
    """Stage 06's per-model probes: a model whose embeddings carry the label gets a high AUC, one whose
    embeddings are noise about 0.5; only the task genre is probed."""
    from storybias.config.params import ProbeSettings
    from storybias.stages.probes import model_probes

    rng = np.random.default_rng(0)
    rows, X_full, X_del = [], {}, {}
    for model, signal in (("sep", 3.0), ("noise", 0.0)):
        for i in range(120):
            label = "female" if i % 2 else "male"
            sid = f"{model}{i}"
            rows.append({"story_id": sid, "model": model, "language": "en", "genre": "story",
                         "label": label, "group": f"{model}|occ{i % 12}"})  # fmt: skip
            X_full[sid] = rng.normal(size=8) + signal * (label == "female")
            X_del[sid] = rng.normal(size=8) + 0.5 * signal * (label == "female")
    probed = pd.DataFrame(rows)
    other = probed.assign(genre="news", story_id=probed["story_id"] + "n")
    X_full.update({k + "n": v for k, v in X_full.items()})
    settings = ProbeSettings(n_bootstrap=200)
    table = model_probes(pd.concat([probed, other]), probed, X_full, X_del, settings, "story")
    auc = table.set_index(["model", "variant"])["auc"]
    assert list(table.columns) == X.MODEL_PROBE_COLUMNS and len(table) == 4
    assert auc[("sep", "full_sample")] > 0.95 and abs(auc[("noise", "full_sample")] - 0.5) < 0.15
    assert auc[("sep", "delta")] < 0 and (table["status"] == "ok").all()


def test_a_language_pass_whose_tables_were_tested_and_found_nothing_has_rate_zero():
    """Issue #57, item 1: associations_values holds only the cells of BH-significant pairs, so a French pass
    whose three tables were tested and found nothing has no row there; its rate is 0 per 1,000 stories with
    its n and the tables tested beside it, not NaN (which would drop the least-biased cells from the
    agreement). A pass with no tested table stays NaN, with the reason."""
    values, shared, stories, *_ = _run({"a": (0.5, 0.5, 0.5)})
    tested = pd.concat([_tested(values)] + [_tested(values[values["scope"] == "fr"])] * 2, ignore_index=True)
    values = values[values["scope"] != "fr"]
    table = X.crosslens_table([X.association_measures(values, shared, stories, tested)], {})
    french = table.set_index(["model", "language"]).loc[("a", "fr")]
    assert french["assoc_per_1000"] == 0 and french["reason_assoc_per_1000"] == ""
    assert french["n_assoc_per_1000"] == 200 and french["n_tables"] == 3
    assert np.isnan(french["share_harmful"]) and french["reason_share_harmful"] == "no significant association"
    untested = X.association_measures(values, shared, stories, tested[tested["scope"] != "fr"])[("a", "fr")]
    assert np.isnan(untested["assoc_per_1000"]["value"]) and untested["assoc_per_1000"]["reason"].startswith("no table")
