"""Agreement between lenses (issue #30 item 2, redesigned in issue #41 item 7; storybias.stats.concordance):
a rank correlation centred within each language, a test that relabels whole models, Benjamini-Hochberg
over the cross-lens pairs, and within-lens pairs kept apart. The simulations measure the test's level
and power (their numbers are in the module docstring of storybias.stats.concordance)."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import false_discovery_control, spearmanr

from storybias.stats import concordance as C

LANGUAGES = ["en", "fr", "zh", "es"]
CLAIMS = ("agreement", "disagreement")
SEED = 41


def _planted_cells(seed: int = 0) -> pd.DataFrame:
    """Eight models x four languages. Model m0 is planted biased in every measure and m1 in JSD only;
    the others have a common latent bias, which every measure reads with noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for m in range(8):
        latent = rng.normal()
        for language in LANGUAGES:
            base = latent + rng.normal(scale=0.3)
            row = {"model": f"m{m}", "language": language}
            for measure in ("assoc_rate", "jsd", "m_s"):
                row[measure] = base + rng.normal(scale=0.3)
            if m == 0:
                row.update(assoc_rate=6.0, jsd=6.0, m_s=6.0)
            if m == 1:
                row.update(jsd=7.0, assoc_rate=-4.0, m_s=-4.0)
            rows.append(row)
    return pd.DataFrame(rows)


def _simulated_cells(rng: np.random.Generator, rho: float, n_models: int = 8, n_languages: int = 4) -> pd.DataFrame:
    """Two lenses a and b over models x languages: each its own model effect (sd 1; b's is rho x a's plus
    sqrt(1 - rho^2) x an independent one), a language effect shared by both (sd 2), noise (sd 0.5), and
    10% of each measure's cells missing."""
    effect_a = rng.normal(size=n_models)
    effect_b = rho * effect_a + np.sqrt(1 - rho**2) * rng.normal(size=n_models)
    language = rng.normal(scale=2.0, size=n_languages)
    shape = (n_models, n_languages)
    a = effect_a[:, None] + language[None, :] + rng.normal(scale=0.5, size=shape)
    b = effect_b[:, None] + language[None, :] + rng.normal(scale=0.5, size=shape)
    a[rng.random(shape) < 0.1] = np.nan
    b[rng.random(shape) < 0.1] = np.nan
    models = np.repeat([f"m{m}" for m in range(n_models)], n_languages)
    languages = np.tile(LANGUAGES[:n_languages], n_models)
    return pd.DataFrame({"model": models, "language": languages, "a": a.ravel(), "b": b.ravel()})


def _claim_rate(rho: float, n_datasets: int, n_permutations: int = 300) -> tuple[float, float]:
    """Share of simulated data sets whose verdict claims agreement or disagreement, and the same share
    for a naive test that shuffles b's cells within each language independently (the old design)."""
    rng = np.random.default_rng(SEED)
    claims = naive = 0
    for d in range(n_datasets):
        cells = _simulated_cells(rng, rho)
        row = C.lens_agreement(cells, ["a", "b"], n_permutations=n_permutations, seed=d).iloc[0]
        claims += row["finding"] in CLAIMS
        x, y = C.model_language_matrices(cells, "a", "b")
        shuffled = rng.permuted(np.broadcast_to(y, (n_permutations, *y.shape)), axis=-1)  # each language alone
        null = np.abs(C.within_language_rank_correlation(x, shuffled))
        r = abs(row["r_within_language"])
        naive += np.isfinite(r) and (1 + np.sum(null >= r)) / (1 + n_permutations) < C.ALPHA
    return claims / n_datasets, naive / n_datasets


def test_the_test_holds_its_level_where_cells_of_one_model_are_not_exchangeable():
    """1,000 null data sets (8 models x 4 languages, independent model effects, a shared language effect):
    measured 5.7% claims with whole-model relabelling (4.75% of 6,000 over six seeds); the within-language
    cell shuffle claims 19.0% of the same data sets."""
    level, naive = _claim_rate(rho=0.0, n_datasets=1000)
    print(f"\nnull claim rate: {level:.1%} (whole-model relabelling), {naive:.1%} (within-language cell shuffle)")
    assert level <= 0.06
    assert naive >= 2 * level and naive >= 0.10  # ignoring that cells of one model share its effect


def test_planted_agreement_between_model_effects_is_found():
    """Lens b's model effect = 0.9 x lens a's + an independent part: measured power 64.0% of 400 data sets
    at 8 models x 4 languages (few models: eight units carry the evidence, not 32 cells)."""
    power, _ = _claim_rate(rho=0.9, n_datasets=400)
    print(f"\npower at rho = 0.9: {power:.1%}")
    assert power >= 0.55


def test_planted_concordant_measures_agree_and_the_discordant_model_weakens_its_pairs():
    cells = _planted_cells()
    table = C.lens_agreement(cells, ["assoc_rate", "jsd", "m_s"], n_permutations=500)
    r = {(row.measure_a, row.measure_b): row.r_within_language for row in table.itertuples()}
    assert r[("assoc_rate", "m_s")] > 0.7  # the concordant pair
    assert r[("assoc_rate", "jsd")] < r[("assoc_rate", "m_s")] - 0.1  # m1 breaks exactly the pairs with JSD
    assert r[("jsd", "m_s")] < r[("assoc_rate", "m_s")] - 0.1
    concordant = table.set_index(["measure_a", "measure_b"]).loc[("assoc_rate", "m_s")]
    assert concordant["n_cells"] == 32 and concordant["n_models"] == 8 and concordant["n_languages"] == 4
    assert concordant["p_bh"] < 0.01 and concordant["finding"] == "agreement"
    assert concordant["kind"] == C.ACROSS and set(table.columns) == set(C.AGREEMENT_COLUMNS)


def test_language_offsets_do_not_move_the_statistic():
    """Adding any offset per language to either measure leaves r_within_language unchanged, while the
    correlation of the pooled cells follows the offsets."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(4, 10)), rng.normal(size=(4, 10))
    shifted_x = x + np.array([0.0, 5.0, 10.0, 15.0])[:, None]
    shifted_y = y + np.array([0.0, 6.0, 12.0, 18.0])[:, None]
    assert spearmanr(shifted_x.ravel(), shifted_y.ravel()).statistic > 0.8
    r = C.within_language_rank_correlation(x, y)
    assert abs(r) < 0.4
    assert C.within_language_rank_correlation(shifted_x, shifted_y) == pytest.approx(r)


def test_a_pair_reversed_within_each_language_is_a_disagreement():
    """Six models whose order on b is the reverse of a in both languages, with language offsets that make
    the pooled correlation positive (the old design said: no evidence, r = 0.52, p = 1.00)."""
    rows = []
    for language, offset in (("en", 0.0), ("fr", 100.0)):
        for m in range(6):
            rows.append({"model": f"m{m}", "language": language, "a": m + offset, "b": 5 - m + 1.5 * offset})
    cells = pd.DataFrame(rows)
    assert spearmanr(cells["a"], cells["b"]).statistic > 0.4
    row = C.lens_agreement(cells, ["a", "b"]).iloc[0]
    assert row["r_within_language"] == pytest.approx(-1.0)
    assert row["exact"] and row["n_permutations"] == 720  # 6! relabellings, fewer than the 2,000 asked for
    assert row["p_permutation"] == pytest.approx(2 / 720)  # the identity and the reversal reach |r| = 1
    assert row["finding"] == "disagreement" and row["verdict"].startswith("disagreement between lenses")


def test_the_p_value_relabels_whole_models_the_same_way_in_every_language():
    """For 5 models the p-value is the share of all 120 relabellings, each applied to every language at
    once, whose |r| reaches the observed one (cells missing in either measure dropped)."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(3, 5))
    y = rng.normal(size=(3, 5)) + 0.5 * x
    x[0, 1], y[2, 4] = np.nan, np.nan
    observed = abs(C.within_language_rank_correlation(x, y))
    null = [abs(C.within_language_rank_correlation(x, y[:, list(pi)])) for pi in permutations(range(5))]
    by_hand = np.mean(np.nan_to_num(null) >= observed - 1e-12)
    p, n_used, exact = C.model_permutation_p(x, y, n_permutations=2000, seed=0)
    assert exact and n_used == 120 and p == pytest.approx(by_hand)
    p_sampled, n_sampled, exact_sampled = C.model_permutation_p(x, y, n_permutations=100, seed=0)
    assert not exact_sampled and n_sampled == 100 and 0 < p_sampled <= 1


def _one_lens_pair_and_four_lenses() -> tuple[pd.DataFrame, dict[str, str]]:
    """Five models x two languages. a and a2 are two readings of lens A; b (lens B) orders the models as
    a does; c and d (lenses C, D) order them otherwise."""
    orders = {
        "a": {"en": [1, 2, 3, 4, 5], "fr": [1, 2, 3, 4, 5]},
        "c": {"en": [3, 5, 1, 2, 4], "fr": [4, 1, 5, 3, 2]},
        "d": {"en": [2, 5, 4, 1, 3], "fr": [5, 3, 1, 2, 4]},
    }
    rows = []
    for language, offset in (("en", 0.0), ("fr", 10.0)):
        for m in range(5):
            a, c, d = (float(orders[k][language][m]) for k in ("a", "c", "d"))
            measures = {"a": a + offset, "a2": 2 * a, "b": a + 3 * offset, "c": c, "d": d}
            rows.append({"model": f"m{m}", "language": language, **measures})
    return pd.DataFrame(rows), {"a": "A", "a2": "A", "b": "B", "c": "C", "d": "D"}


def test_a_pair_within_one_lens_is_kept_apart_and_bh_runs_over_the_cross_lens_pairs_only():
    cells, lenses = _one_lens_pair_and_four_lenses()
    table = C.lens_agreement(cells, ["a", "a2", "b", "c", "d"], lenses=lenses)
    within = table[table["kind"] == C.WITHIN]
    assert list(zip(within["measure_a"], within["measure_b"])) == [("a", "a2")]
    assert within["finding"].iloc[0] == "consistent within the lens"
    assert "not agreement between lenses" in within["verdict"].iloc[0]
    assert not within["finding"].isin(CLAIMS).any()
    cross = table[table["kind"] == C.ACROSS]
    assert len(cross) == 9
    np.testing.assert_allclose(cross["p_bh"], false_discovery_control(cross["p_permutation"]))
    # with the within-lens pair in the family, the adjusted p-values would differ
    pooled = false_discovery_control(table["p_permutation"])[cross.index]
    assert not np.allclose(cross["p_bh"], pooled)
    ab = cross.set_index(["measure_a", "measure_b"]).loc[("a", "b")]
    assert ab["p_permutation"] < C.ALPHA <= ab["p_bh"]  # passes raw, not after Benjamini-Hochberg
    assert ab["finding"] == "no evidence"


def test_too_few_cells_or_models_are_not_assessed_with_the_reason():
    few_models = pd.DataFrame(
        {
            "model": ["m0", "m1", "m2", "m3"] * 2,
            "language": ["en"] * 4 + ["fr"] * 4,
            "a": [1.0, 2, 3, 4, 1, 2, 3, 4],
            "b": [1.0, 2, 3, 4, 1, 2, 3, 4],
            "c": [1.0, 2, np.nan, np.nan, np.nan, np.nan, np.nan, np.nan],
        }
    )
    table = C.lens_agreement(few_models, ["a", "b", "c"], n_permutations=100).set_index(["measure_a", "measure_b"])
    ab, ac = table.loc[("a", "b")], table.loc[("a", "c")]
    assert ab["r_within_language"] == pytest.approx(1.0)  # described, but four models cannot be tested
    assert np.isnan(ab["p_permutation"]) and ab["finding"] == "not assessed"
    assert "at most 4 models have both measures in one language" in ab["verdict"]
    assert ac["n_cells"] == 2 and np.isnan(ac["r_within_language"])
    assert ac["verdict"] == f"not assessed: 2 cells have both measures (at least {C.MIN_CELLS} needed)"
