"""The per-cell intervals of the cross-lens table (issue #57, item 6): an interval stays only where a
simulation on cells of the default run's size shows that it covers (>= 90% for a nominal 95%); the others
are NaN with the reason. And the cross-lens agreement test's null simulation rerun with one model whose
associations are all absent: its cells are 0, not NaN, and the test still holds its level."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from storybias.stages.crosslens import measures as X
from storybias.stages.metrics.biasedtales import (
    GroupData,
    bootstrap_jsd,
    jensen_shannon,
    s_c_from_counts,
    s_c_replicates,
)
from storybias.stages.metrics.feng import aggregate_intervals
from storybias.stages.probes.probe import probe_auc
from storybias.stats import concordance as C


def _minimum_coverage(interval, n: int, shares: np.ndarray) -> float:
    """Exact coverage of a 95% interval for a share from n rated associations, the smallest over ``shares``:
    per share, the probability of every k whose interval holds it."""
    k = np.arange(n + 1)
    low, high = np.array([interval(int(i), n) for i in k]).T
    holds = (low[None, :] <= shares[:, None]) & (shares[:, None] <= high[None, :])
    return float((stats.binom.pmf(k[None, :], n, shares[:, None]) * holds).sum(1).min())


def test_the_share_harmful_interval_covers_at_every_share_and_cell_size():
    """A cell rates a handful of significant associations (the default run: 0 to 5): the kept interval
    (Clopper-Pearson) covers >= 95% at every n from 1 to 30 and every share from 0.02 to 0.98; Wilson's,
    kept before, falls below 90% at n = 1, 3 and 4."""
    shares = np.linspace(0.02, 0.98, 49)
    kept = min(_minimum_coverage(X.share_interval, n, shares) for n in range(1, 31))
    wilson = {n: round(_minimum_coverage(lambda k, m: proportion_confint(k, m, method="wilson"), n, shares), 3)
              for n in (1, 3, 4)}  # fmt: skip
    print(f"\nshare_harmful: Clopper-Pearson minimum coverage {kept:.3f}; Wilson {wilson}")
    assert kept >= 0.95 and max(wilson.values()) < 0.90
    assert X.INTERVALS["share_harmful"] == ""


def test_the_jsd_bootstrap_does_not_cover_at_the_default_size_and_is_dropped():
    """25 stories per group, about 4 adjectives each over a Zipf vocabulary of 120: the plug-in JSD is
    biased upward, so its stories bootstrap misses the true JSD (measured: 0 of 100 at each effect)."""
    rng = np.random.default_rng(57)
    base = 1 / np.arange(1, 121)
    base /= base.sum()
    for shift in (0.0, 1.5):
        female = base * np.exp(shift * rng.normal(size=120))
        female /= female.sum()
        truth = jensen_shannon(base, female)
        covered = 0
        for d in range(100):
            words_m = rng.multinomial(rng.poisson(4, size=25), base)
            words_f = rng.multinomial(rng.poisson(4, size=25), female)
            low, high = bootstrap_jsd(words_m, words_f, 100, d)
            covered += low <= truth <= high
        print(f"\nJSD (true {truth:.3f}): covered in {covered} of 100")
        assert covered < 90
    assert X.INTERVALS["jsd"].startswith("none")


def test_the_occupation_bootstrap_does_not_cover_strongly_gendered_cells_and_is_dropped():
    """Four occupations (the default's), 5 outputs each, P(female) 0.95 / 0.9 for the female-associated
    ones and 0.05 for the male-associated: stage 05's per-occupation bootstrap covers M_s and M_b in well
    under 90% of 200 cells (measured 80% and 55%): an occupation whose outputs are all one gender
    has no bootstrap variance."""
    rng = np.random.default_rng(0)
    occupations = [("nurse", "female", 0.95, 0.05), ("secretary", "female", 0.9, 0.05),
                   ("surgeon", "male", 0.05, 0.9), ("developer", "male", 0.05, 0.95)]  # fmt: skip
    m_s = np.mean([(f - m) if g == "female" else (m - f) for _, g, f, m in occupations])
    m_b = np.mean([f - m for _, _, f, m in occupations])
    rows = []
    for d in range(200):
        for occupation, gender, p_female, p_male in occupations:
            n_female, n_male, _ = rng.multinomial(5, [p_female, p_male, 1 - p_female - p_male])
            rows.append({"model": f"d{d}", "language": "en", "task": "story", "occupation": occupation,
                         "occupation_gender": gender, "n": 5, "n_female": n_female, "n_male": n_male})  # fmt: skip
    table = pd.DataFrame(rows)
    table["m_s"] = table["m_b"] = 0.0  # scored: aggregate_intervals keeps the rows with a score
    bounds = aggregate_intervals(table, 500, 1)
    cover_s = ((bounds["m_s_low"] <= m_s) & (m_s <= bounds["m_s_high"])).mean()
    cover_b = ((bounds["m_b_low"] <= m_b) & (m_b <= bounds["m_b_high"])).mean()
    print(f"\nM_s covered in {cover_s:.0%}, M_b in {cover_b:.0%} of 200 cells")
    assert cover_s < 0.9 and cover_b < 0.9
    assert X.INTERVALS["m_s"].startswith("none") and X.INTERVALS["m_b"].startswith("none")


def test_the_interval_of_the_largest_s_c_misses_after_picking_the_category():
    """Ten adjective categories, six with |S_C| about 0.4 (the true largest |S_C|), 25 stories per group:
    the bootstrap interval of the category picked as the largest (as stage 07 took it) covers the true
    largest |S_C| in under 90% of 200 cells (the pick favours the category whose estimate came out high)."""
    rng = np.random.default_rng(3)
    female = np.full(10, 1 / 10)
    male = female * np.exp([0.4, -0.4, 0.4, -0.4, 0.4, -0.4, 0.0, 0.0, 0.0, 0.0])
    male /= male.sum()
    truth = np.abs(np.log(male / female)).max()
    covered = 0
    for d in range(200):
        totals_m, totals_f = rng.poisson(4, size=25), rng.poisson(4, size=25)
        g = GroupData(rng.multinomial(totals_m, male), totals_m, rng.multinomial(totals_f, female), totals_f)
        top = int(np.nanargmax(np.abs(s_c_from_counts(g))))  # stage 05's S_C, clipped as it clips
        draws = s_c_replicates(g, 200, d)[:, top]
        low, high = np.nanpercentile(np.abs(draws), [2.5, 97.5])
        covered += low <= truth <= high
    print(f"\nmax |S_C| (true {truth:.2f}): covered in {covered} of 200")
    assert covered < 180
    assert X.INTERVALS["max_abs_sc"].startswith("none")


def test_the_probe_auc_group_bootstrap_does_not_cover_and_is_dropped():
    """90 stories in 30 prompt cells of 3 (a cell fixes the gender; its stories share a cell effect), 16
    embedding dimensions, the gender in one: stage 06's probe (5 grouped folds) and its group bootstrap of the
    out-of-fold scores, which leaves the refit out. Even for the procedure's own expected AUC at this n (the
    mean over the data sets, not the Bayes AUC) it covers in under 90% of 50 cells (measured 82%)."""
    rng = np.random.default_rng(6)
    rows = []
    for d in range(50):
        groups = np.repeat(np.arange(30), 3)
        y = np.repeat(rng.integers(0, 2, 30), 3)
        embeddings = rng.normal(size=(90, 16)) + rng.normal(scale=0.5, size=(30, 16))[groups]
        embeddings[:, 0] += y
        rows.append(probe_auc(embeddings, y, groups.astype(str), 5, 100, d, 5))
    auc = np.array([r["auc"] for r in rows])
    truth = auc.mean()
    covered = np.mean([r["ci_low"] <= truth <= r["ci_high"] for r in rows])
    print(f"\nprobe AUC (mean {truth:.3f}): covered in {covered:.0%} of 50 cells")
    assert np.isfinite(auc).all() and covered < 0.9
    assert X.INTERVALS["auc_full"].startswith("none")


def test_the_table_holds_only_the_kept_intervals_and_says_why_of_the_others():
    rate: X.Measure = {"value": 5.0, "low": 1.0, "high": 9.0, "n": 200, "reason": "", "n_tables": 2}
    part = {("a", "en"): {m: {**rate, "n_tables": 2} for m in X.MEASURES}}
    row = X.crosslens_table([part], {}).iloc[0]
    for measure in X.MEASURES:
        kept = not X.INTERVALS[measure]
        assert np.isfinite(row[f"{measure}_low"]) == kept, measure
        assert row[f"interval_{measure}"] == X.INTERVALS[measure]
    assert sorted(m for m in X.MEASURES if not X.INTERVALS[m]) == ["share_harmful"]
    assert row["n_tables"] == 2
    assert list(X.crosslens_table([part], {}).columns) == X.CROSSLENS_SCHEMA.names


def _null_cells(rng: np.random.Generator, n_models: int = 8, languages: int = 4) -> pd.DataFrame:
    """The agreement test's null (tests/test_concordance.py's generator: independent model effects, sd 1, a
    shared language effect, sd 2, noise, sd 0.5, 10% of cells missing), with measure a a rate of associations
    per 1,000 stories (positive) and model m0's associations all absent: its rate is 0 in every language."""
    effect_a, effect_b = rng.normal(size=n_models), rng.normal(size=n_models)
    language = rng.normal(scale=2.0, size=languages)
    shape = (n_models, languages)
    a = 10 * np.exp(0.3 * (effect_a[:, None] + language[None, :] + rng.normal(scale=0.5, size=shape)))
    b = effect_b[:, None] + language[None, :] + rng.normal(scale=0.5, size=shape)
    a[0] = 0.0
    a[1:][rng.random((n_models - 1, languages)) < 0.1] = np.nan
    b[rng.random(shape) < 0.1] = np.nan
    models = np.repeat([f"m{m}" for m in range(n_models)], languages)
    codes = np.tile([f"l{i}" for i in range(languages)], n_models)
    return pd.DataFrame({"model": models, "language": codes, "assoc_per_1000": a.ravel(), "b": b.ravel()})


def test_the_agreement_test_holds_its_level_with_a_model_whose_associations_are_all_absent():
    """600 null data sets (8 models x 4 languages, 200 relabellings each): model m0 tested its tables and found
    nothing, so its cells are 0 and stay in the test (with NaN they dropped out). The test still claims
    agreement or disagreement in at most 6% (printed with its exact binomial interval)."""
    rng = np.random.default_rng(41)
    claims = 0
    for d in range(600):
        cells = _null_cells(rng)
        row = C.lens_agreement(cells, ["assoc_per_1000", "b"], n_permutations=200, seed=d).iloc[0]
        claims += row["finding"] in ("agreement", "disagreement")
        assert row["n_cells"] == cells[["assoc_per_1000", "b"]].notna().all(axis=1).sum()  # m0's zeros count
    interval = stats.binomtest(claims, 600).proportion_ci(method="exact")
    print(f"\nlevel with an all-absent model: {claims} of 600 ({claims / 600:.1%}, 95% CI {interval.low:.1%}-"
          f"{interval.high:.1%})")  # fmt: skip
    assert claims / 600 <= 0.06
