"""storybias.stats, the shared statistics: kappa against hand-computed and textbook values, BH/BY
against statsmodels and against the step-up definition, the bootstrap's streams and interval coverage."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score
from statsmodels.stats.multitest import multipletests

from storybias.stats.agreement import (
    cohen_kappa,
    fleiss_kappa,
    fleiss_kappa_counts,
    quadratic_kappa,
    quadratic_kappa_fixed_chance,
    weighted_kappa,
)
from storybias.stats.bootstrap import (
    bootstrap_group_counts,
    bootstrap_indices,
    bootstrap_mean_interval,
    percentile_bounds,
    percentile_interval,
)
from storybias.stats.multiple_testing import adjust, bh_open, bh_rejections, bh_thresholds

# --- Cohen's kappa ---------------------------------------------------------------------------------


def test_cohen_kappa_hand_computed_two_by_two():
    # 50 items: yes/yes 20, yes/no 5, no/yes 10, no/no 15. p_o = 0.7; rater a says yes 25/50, rater b
    # 30/50: p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5; kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4
    a = ["yes"] * 25 + ["no"] * 25
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    # 10 items: 4 + 4 agreements, one disagreement each way: p_o = 0.8, p_e = 0.5, kappa = 0.6
    a = ["y"] * 5 + ["n"] * 5
    b = ["y", "y", "y", "y", "n", "y", "n", "n", "n", "n"]
    assert cohen_kappa(a, b) == pytest.approx(0.6)


def test_cohen_kappa_perfect_chance_and_undefined():
    labels = ["f", "m", "u", "f", "m"]
    assert cohen_kappa(labels, labels) == pytest.approx(1.0)
    # complete disagreement on two balanced categories: p_o = 0, p_e = 0.5 -> -1
    assert cohen_kappa(["a", "b", "a", "b"], ["b", "a", "b", "a"]) == pytest.approx(-1.0)
    assert np.isnan(cohen_kappa([], []))
    assert np.isnan(cohen_kappa(["x", "x"], ["x", "x"]))  # one category: p_e = 1, undefined
    # labels are compared as strings: None and mixed types are categories, not errors
    assert cohen_kappa([None, "a", 1], [None, "a", 1]) == pytest.approx(1.0)


def test_cohen_kappa_weights_are_repeated_items():
    a, b = ["x", "x", "y", "y", "x"], ["x", "y", "y", "y", "y"]
    w = [2, 1, 3, 1, 2]
    repeated_a = [v for v, n in zip(a, w) for _ in range(n)]
    repeated_b = [v for v, n in zip(b, w) for _ in range(n)]
    assert cohen_kappa(a, b, sample_weight=np.array(w, float)) == pytest.approx(cohen_kappa(repeated_a, repeated_b))
    assert np.isnan(cohen_kappa(a, b, sample_weight=np.zeros(5)))


def test_weighted_kappa_quadratic_hand_computed():
    # a = 1, 2, 3 against b = 1, 3, 2: sum w O = 0 + 1 + 1 = 2 with w_ij = (i - j)^2; E_ij = 1/3 in
    # every cell, sum w E = (1/3) * 12 = 4; kappa = 1 - 2/4 = 0.5
    assert weighted_kappa([1, 2, 3], [1, 3, 2], labels=(1, 2, 3)) == pytest.approx(0.5)
    assert weighted_kappa([1, 2, 3], [1, 2, 3], labels=(1, 2, 3)) == pytest.approx(1.0)
    assert np.isnan(weighted_kappa([4, 4], [4, 4], labels=range(1, 8)))
    # the scale is the labels given: 2 and 4 are two steps apart on 1-7, one step among the observed
    h, a = [2, 4, 4, 2, 3], [2, 4, 2, 4, 3]
    assert weighted_kappa(h, a, labels=range(1, 8)) == pytest.approx(
        cohen_kappa_score(h, a, weights="quadratic", labels=list(range(1, 8)))
    )


def test_vectorised_quadratic_kappa_equals_sklearn():
    rng = np.random.default_rng(0)
    h, a = rng.integers(1, 8, 200), rng.integers(1, 8, 200)
    a[:120] = h[:120]
    w = rng.integers(0, 4, 200)
    scale = list(range(1, 8))
    assert quadratic_kappa(h, a)[0] == pytest.approx(cohen_kappa_score(h, a, weights="quadratic", labels=scale))
    assert quadratic_kappa(h, a, w[None, :])[0] == pytest.approx(
        cohen_kappa_score(h, a, weights="quadratic", labels=scale, sample_weight=w)
    )
    # one row per resample: each row is the kappa of that row's weights alone
    rows = quadratic_kappa(h, a, np.stack([w, np.ones(200)]))
    assert rows[0] == pytest.approx(quadratic_kappa(h, a, w)[0]) and rows[1] == pytest.approx(quadratic_kappa(h, a)[0])
    assert quadratic_kappa([1, 2, 3], [1, 3, 2])[0] == pytest.approx(0.5)  # the hand-computed case above
    assert np.isnan(quadratic_kappa([3, 3], [3, 3])[0])


def test_quadratic_kappa_fixed_chance_on_permutations_is_the_kappa_of_each_permutation():
    rng = np.random.default_rng(1)
    h, a = rng.integers(1, 8, 40).astype(float), rng.integers(1, 8, 40).astype(float)
    rows = np.stack([a, *(rng.permutation(a) for _ in range(5))])
    fixed = quadratic_kappa_fixed_chance(h, a, rows)
    assert fixed.shape == (6,)
    # a permutation keeps a's marginals, so the chance term is the same: the plain kappa of each row
    assert fixed == pytest.approx([quadratic_kappa(h, row)[0] for row in rows])
    assert np.isnan(quadratic_kappa_fixed_chance(np.full(3, 2.0), np.full(3, 2.0), np.full((2, 3), 2.0))).all()


# --- Fleiss' kappa -----------------------------------------------------------------------------------

# Fleiss (1971) as reproduced on Wikipedia ("Fleiss' kappa", worked example): 10 subjects, 14 raters,
# 5 categories; P_bar = 0.378, P_e = 0.213, kappa = 0.210
FLEISS_TABLE = np.array(
    [
        [0, 0, 0, 0, 14],
        [0, 2, 6, 4, 2],
        [0, 0, 3, 5, 6],
        [0, 3, 9, 2, 0],
        [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0],
        [3, 2, 6, 3, 0],
        [2, 5, 3, 2, 2],
        [6, 5, 2, 1, 0],
        [0, 2, 2, 3, 7],
    ]
)


def test_fleiss_kappa_textbook_example():
    n = FLEISS_TABLE.sum(1)[0]
    p_i = ((FLEISS_TABLE**2).sum(1) - n) / (n * (n - 1))
    p_j = FLEISS_TABLE.sum(0) / FLEISS_TABLE.sum()
    assert p_i.mean() == pytest.approx(0.378, abs=5e-4) and (p_j**2).sum() == pytest.approx(0.213, abs=5e-4)
    kappa = fleiss_kappa_counts(FLEISS_TABLE)
    assert kappa == pytest.approx((p_i.mean() - (p_j**2).sum()) / (1 - (p_j**2).sum()))
    assert kappa == pytest.approx(0.210, abs=5e-4)
    # the same ratings written items x raters
    ratings = [[c for c, k in enumerate(row) for _ in range(k)] for row in FLEISS_TABLE]
    assert fleiss_kappa(ratings) == pytest.approx(kappa)


def test_fleiss_kappa_hand_computed_and_undefined():
    # 4 items x 3 raters; P_i = 1, 1/3, 1, 1/3 -> P_bar = 2/3; p_a = p_b = 0.5 -> P_e = 0.5; kappa = 1/3
    ratings = [["a", "a", "a"], ["a", "a", "b"], ["b", "b", "b"], ["a", "b", "b"]]
    assert fleiss_kappa(ratings) == pytest.approx(1 / 3)
    assert fleiss_kappa([["a", "a"], ["b", "b"], ["a", "a"]]) == pytest.approx(1.0)
    assert np.isnan(fleiss_kappa([["a", "a"], ["a", "a"]]))  # one category
    assert np.isnan(fleiss_kappa([]))
    assert np.isnan(fleiss_kappa_counts(np.array([[3], [3]])))


# --- BH / BY ---------------------------------------------------------------------------------------

P_FIXED = np.array([0.04, 0.001, 0.3, 0.012, 0.02, 0.9, 0.0105, 0.049])


def _step_up(p: np.ndarray, c: float = 1.0) -> np.ndarray:
    """p~_(i) = min_{j >= i} min(1, c p_(j) m / j), back in the input's order."""
    m = len(p)
    order = np.argsort(p)
    scaled = np.minimum(1.0, c * p[order] * m / np.arange(1, m + 1))
    out = np.empty(m)
    out[order] = np.minimum.accumulate(scaled[::-1])[::-1]
    return out


def test_bh_and_by_match_statsmodels_and_the_step_up_definition():
    bh, by = adjust(P_FIXED, "fdr_bh"), adjust(list(P_FIXED), "fdr_by")
    assert bh == pytest.approx(multipletests(P_FIXED, method="fdr_bh")[1])
    assert by == pytest.approx(multipletests(P_FIXED, method="fdr_by")[1])
    assert bh == pytest.approx(_step_up(P_FIXED))
    assert by == pytest.approx(_step_up(P_FIXED, c=sum(1 / k for k in range(1, len(P_FIXED) + 1))))
    # by hand: sorted 0.001, 0.0105, 0.012, 0.02, 0.04, 0.049, 0.3, 0.9; m = 8
    assert bh[1] == pytest.approx(0.008)  # 0.001 * 8 / 1
    assert bh[6] == pytest.approx(0.032) and bh[3] == pytest.approx(0.032)  # min(0.0105 * 8/2, 0.012 * 8/3)
    assert bh[5] == pytest.approx(0.9)
    assert adjust([], "fdr_bh").shape == (0,)


def test_by_is_more_conservative_than_bh():
    p = [0.001, 0.01, 0.02, 0.03, 0.04]
    bh, by = adjust(p, "fdr_bh"), adjust(p, "fdr_by")
    # BH: p_(i) * m / i, monotone; BY multiplies by c(m) = sum 1/k
    assert bh[0] == pytest.approx(0.005)
    assert by[0] == pytest.approx(0.005 * sum(1 / k for k in range(1, 6)))
    assert (by >= bh).all()


def test_bh_thresholds_and_rejections_are_the_step_up_procedure():
    assert bh_thresholds(4) == pytest.approx([0.0125, 0.025, 0.0375, 0.05])
    assert bh_thresholds(2, alpha=0.1) == pytest.approx([0.05, 0.1])
    rng = np.random.default_rng(7)
    for m in (1, 3, 10, 40):
        t = np.asarray(bh_thresholds(m))
        for _ in range(50):
            p = np.where(rng.random(m) < 0.3, rng.random(m) * 0.01, rng.random(m))
            k = bh_rejections(p, t)
            # k* = max{k : p_(k) < k/m alpha}
            below = np.flatnonzero(np.sort(p) < t)
            assert k == (below[-1] + 1 if below.size else 0)
            assert k == int((adjust(p, "fdr_bh") < 0.05).sum())


def test_bh_open_only_flags_what_can_change_a_decision():
    t = np.asarray(bh_thresholds(4))  # 0.0125, 0.025, 0.0375, 0.05
    lo, hi = np.array([1e-6, 1e-5, 0.2, 0.5]), np.array([1e-4, 1e-3, 0.6, 0.9])
    assert not bh_open(lo, hi, t).any()
    assert bh_rejections(hi, t) == 2
    # the third p-value straddles t_3: it decides whether k* is 2 or 3
    lo[2], hi[2] = 0.03, 0.06
    assert bh_open(lo, hi, t).tolist() == [False, False, True, False]
    # a p-value far above every threshold never needs refining, even when the others are open
    lo[0], hi[0] = 0.001, 0.02
    assert not bh_open(lo, hi, t)[3]
    p = np.array([0.001, 0.02, 0.03, 0.9])
    assert bh_rejections(p, t) == int((adjust(p, "fdr_bh") < 0.05).sum())


# --- bootstrap -------------------------------------------------------------------------------------


def test_bootstrap_streams_are_deterministic_for_a_seed():
    a = bootstrap_indices(7, 20, np.random.default_rng(3))
    assert a.shape == (20, 7) and a.min() >= 0 and a.max() <= 6
    assert (a == bootstrap_indices(7, 20, np.random.default_rng(3))).all()
    assert not (a == bootstrap_indices(7, 20, np.random.default_rng(4))).all()
    # one generator, two resamplings: the second continues the stream, in the order of the calls
    rng = np.random.default_rng(3)
    first, second = bootstrap_indices(7, 20, rng), bootstrap_indices(5, 10, rng)
    ref = np.random.default_rng(3)
    assert (first == ref.integers(0, 7, size=(20, 7))).all() and (second == ref.integers(0, 5, size=(10, 5))).all()

    counts = bootstrap_group_counts(12, 300, seed=5)
    assert counts.shape == (300, 12) and counts.dtype == np.float64
    assert (counts.sum(1) == 12).all() and (counts == bootstrap_group_counts(12, 300, seed=5)).all()
    assert not (counts == bootstrap_group_counts(12, 300, seed=6)).all()
    assert counts.mean() == pytest.approx(1.0)


def test_percentile_interval_drops_non_finite_values():
    assert percentile_bounds(0.95) == pytest.approx((2.5, 97.5))
    assert percentile_bounds(0.9) == pytest.approx((5.0, 95.0))
    values = np.arange(101.0)
    assert percentile_interval(values) == pytest.approx((2.5, 97.5))
    assert percentile_interval(values, level=0.5) == pytest.approx((25.0, 75.0))
    assert percentile_interval([*values, np.nan, np.inf, -np.inf]) == percentile_interval(values)
    lo, hi = percentile_interval([np.nan, np.inf])
    assert np.isnan(lo) and np.isnan(hi)
    assert all(np.isnan(percentile_interval([])))


def test_bootstrap_mean_interval_is_the_count_resamples_and_covers_the_mean():
    rng = np.random.default_rng(11)
    x = rng.normal(size=30)
    counts = bootstrap_group_counts(30, 400, seed=2)
    explicit = [np.repeat(x, c.astype(int)).mean() for c in counts]
    assert bootstrap_mean_interval(x, 400, seed=2) == pytest.approx(tuple(np.percentile(explicit, [2.5, 97.5])))
    assert bootstrap_mean_interval(x, 400, seed=2) == bootstrap_mean_interval(x, 400, seed=2)
    assert all(np.isnan(bootstrap_mean_interval([1.0], 400, seed=2)))
    # coverage of the true mean (0) by the nominal 95% interval, n = 60: near 0.95 (a percentile
    # bootstrap of a mean undercovers a little at this n)
    covered = 0
    for seed in range(300):
        lo, hi = bootstrap_mean_interval(rng.normal(size=60), 500, seed=seed)
        covered += lo <= 0.0 <= hi
    assert 0.88 <= covered / 300 <= 0.99
