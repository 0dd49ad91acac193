"""Agreement between lenses (issue #30 item 2; storybias.stats.concordance): rank correlations over cells,
a permutation test that shuffles within language only, intervals from the cells' own intervals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from storybias.stats import concordance as C

LANGUAGES = ["en", "fr", "zh", "es"]


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
            for measure in ("assoc_rate", "jsd", "m_s"):
                row[f"{measure}_low"], row[f"{measure}_high"] = row[measure] - 0.2, row[measure] + 0.2
            rows.append(row)
    return pd.DataFrame(rows)


def test_planted_concordant_model_ranks_first_and_the_discordant_one_breaks_its_pair():
    cells = _planted_cells()
    by_model = cells.groupby("model")[["assoc_rate", "jsd", "m_s"]].mean()
    assert by_model["assoc_rate"].idxmax() == "m0" and by_model["m_s"].idxmax() == "m0"
    assert by_model["jsd"].rank(ascending=False)["m0"] <= 2  # m1's JSD alone is higher
    table = C.lens_agreement(cells, ["assoc_rate", "jsd", "m_s"], n_permutations=300, n_replicates=200)
    r = {(row.measure_a, row.measure_b): row.r for row in table.itertuples()}
    assert r[("assoc_rate", "m_s")] > 0.7  # the concordant pair
    # m1 breaks exactly the pairs with JSD
    assert r[("assoc_rate", "jsd")] < r[("assoc_rate", "m_s")] - 0.2
    assert r[("jsd", "m_s")] < r[("assoc_rate", "m_s")] - 0.2
    concordant = table[(table.measure_a == "assoc_rate") & (table.measure_b == "m_s")].iloc[0]
    assert concordant.method == "spearman" and concordant.n_cells == 32
    assert concordant.p_permutation < 0.01 and concordant.ci_low > 0
    assert concordant.verdict.startswith("agree")


def test_a_language_effect_alone_does_not_make_two_measures_agree():
    """Both measures are language means plus independent noise: pooled, they correlate; shuffled within
    language, the agreement is no longer significant."""
    rng = np.random.default_rng(3)
    shift = {"en": 0.0, "fr": 5.0, "zh": 10.0, "es": 15.0}
    languages = [lang for lang in LANGUAGES for _ in range(10)]
    x = np.array([shift[lang] for lang in languages]) + rng.normal(size=40)
    y = np.array([shift[lang] for lang in languages]) + rng.normal(size=40)
    assert C.rank_correlation(x, y, "spearman") > 0.8
    p_within = C.within_group_permutation_p(x, y, languages, "spearman", 500, seed=1)
    p_pooled = C.within_group_permutation_p(x, y, ["all"] * 40, "spearman", 500, seed=1)
    assert p_pooled < 0.01 and p_within > 0.2  # every within-language shuffle keeps the language effect
    # what the within-language test asks is whether the cells agree beyond language: they do not
    residual_x = x - np.array([shift[lang] for lang in languages])
    residual_y = y - np.array([shift[lang] for lang in languages])
    assert abs(C.rank_correlation(residual_x, residual_y, "spearman")) < 0.4


def test_few_cells_use_kendall_and_too_few_are_not_assessed():
    cells = pd.DataFrame(
        {"language": ["en"] * 5, "a": [1, 2, 3, 4, 5.0], "b": [1, 3, 2, 5, 4.0], "c": [1, 2, np.nan, np.nan, np.nan]}
    )
    table = C.lens_agreement(cells, ["a", "b", "c"], n_permutations=100, n_replicates=50).set_index(
        ["measure_a", "measure_b"]
    )
    assert table.loc[("a", "b"), "method"] == "kendall"
    assert table.loc[("a", "b"), "r"] == pytest.approx(0.6)  # tau-b of the two orders
    assert table.loc[("a", "c"), "n_cells"] == 2 and np.isnan(table.loc[("a", "c"), "r"])
    assert table.loc[("a", "c"), "verdict"].startswith("not assessed: 2 cells")
