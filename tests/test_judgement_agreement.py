"""Human validation (Feng et al. App. D.2): the CSV checks, and the statistics on synthetic files whose
answers are known by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from sklearn.metrics import cohen_kappa_score

from storybias.evidence.human_files import HumanFileError
from storybias.stages.probes import judgement_agreement
from storybias.stats.bootstrap import bootstrap_group_counts

# marker A (en, automated 6): raters 6, 7; B (en, 2): 5, 2; C (fr, 4): 4, 6; D (fr, 7): 1
MARKERS = """marker_id,language,rater_id,human,automated,keep
A,en,r1,6,6,keep
A,en,r2,7,6,keep
B,en,r1,5,2,remove
B,en,r2,2,2,keep
C,fr,r3,4,4,keep
C,fr,r4,6,4,
D,fr,r3,1,7,remove
"""


def write(tmp_path, text, name="ratings.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_marker_statistics_by_hand(tmp_path):
    ratings = judgement_agreement.load_marker_ratings(write(tmp_path, MARKERS))
    table = judgement_agreement.marker_agreement(ratings, n_boot=300, n_perm=300, seed=1).set_index("metric")
    # |human - automated| = 0, 1, 3, 0, 0, 2, 6
    assert table.loc["within_two", "estimate"] == pytest.approx(5 / 7)
    assert table.loc["mae", "estimate"] == pytest.approx(12 / 7)
    h, a = [6, 7, 5, 2, 4, 6, 1], [6, 6, 2, 2, 4, 4, 7]
    # on the whole 1-7 scale: with only the observed labels, sklearn would space 2 and 4 one step apart
    scale = list(range(1, 8))
    assert table.loc["kappa_quadratic", "estimate"] == pytest.approx(
        cohen_kappa_score(h, a, weights="quadratic", labels=scale)
    )
    # marker level: mean human A 6.5, B 3.5, C 5, D 1 against automated 6, 2, 4, 7 -> sum d^2 = 12, rho = -0.2
    assert table.loc["spearman", "estimate"] == pytest.approx(-0.2)
    assert table.loc["within_two", "n_comparisons"] == 7 and table.loc["within_two", "n_markers"] == 4
    # human-human pairs: A (6, 7), B (2, 5), C (4, 6): MAE (1 + 3 + 2) / 3, within two 2 / 3
    assert table.loc["human_human_mae", "estimate"] == pytest.approx(2.0)
    assert table.loc["human_human_within_two", "estimate"] == pytest.approx(2 / 3)
    assert table.loc["human_human_kappa_quadratic", "estimate"] == pytest.approx(
        cohen_kappa_score([6, 5, 4], [7, 2, 6], weights="quadratic", labels=scale)
    )
    # keep decisions given on 6 rows, 4 of them keep
    assert table.loc["keep_endorsement", "estimate"] == pytest.approx(4 / 6)
    for metric in ("within_two", "mae", "kappa_quadratic"):
        assert table.loc[metric, "ci_low"] <= table.loc[metric, "estimate"] <= table.loc[metric, "ci_high"]


def _agreeing_markers(n_markers, noise, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for m in range(n_markers):
        auto = int(rng.integers(1, 8))
        for r in range(3):
            human = int(np.clip(auto + rng.integers(-noise, noise + 1), 1, 7))
            rows.append(
                {
                    "marker_id": f"m{m}",
                    "language": ("en", "fr", "zh")[m % 3],
                    "rater_id": f"r{r}",
                    "human": human,
                    "automated": auto,
                }
            )
    return pd.DataFrame(rows)


def test_permutation_baselines_separate_agreement_from_chance():
    close = judgement_agreement.marker_agreement(
        _agreeing_markers(60, 1, 3), n_boot=200, n_perm=1000, seed=2
    ).set_index("metric")
    for metric in judgement_agreement.MARKER_METRICS:
        assert close.loc[metric, "permutation_p"] < 0.01, metric
    assert close.loc["mae", "permutation_mean"] > close.loc["mae", "estimate"]
    # automated scores unrelated to the human ones: no metric beats its baseline
    unrelated = _agreeing_markers(60, 1, 3)
    rng = np.random.default_rng(11)
    independent = dict(zip(unrelated["marker_id"].unique(), rng.integers(1, 8, 60)))
    unrelated["automated"] = unrelated["marker_id"].map(independent)
    far = judgement_agreement.marker_agreement(unrelated, n_boot=200, n_perm=1000, seed=2).set_index("metric")
    for metric in judgement_agreement.MARKER_METRICS:
        assert far.loc[metric, "permutation_p"] > 0.01, metric


def test_marker_bootstrap_resamples_markers_not_comparisons():
    data = _agreeing_markers(30, 2, 5)
    table = judgement_agreement.marker_agreement(data, n_boot=400, n_perm=100, seed=4).set_index("metric")
    # explicit marker resamples with the same generator reproduce the interval
    counts = bootstrap_group_counts(30, 400, 4)
    codes, _ = pd.factorize(data.sort_values(["marker_id", "rater_id"])["marker_id"])
    sorted_data = data.sort_values(["marker_id", "rater_id"]).reset_index(drop=True)
    diff = np.abs(sorted_data["human"] - sorted_data["automated"]).to_numpy()
    boots = []
    for row in counts[:5]:
        idx = np.concatenate([np.flatnonzero(codes == m) for m in range(30) for _ in range(int(row[m]))])
        boots.append(diff[idx].mean())
    w = counts[:5, codes]
    assert np.allclose(boots, w @ diff / w.sum(1))
    lo, hi = np.percentile(counts[:, codes] @ diff / counts[:, codes].sum(1), [2.5, 97.5])
    assert (table.loc["mae", "ci_low"], table.loc["mae", "ci_high"]) == pytest.approx((lo, hi))


# --- protagonist labels ---------------------------------------------------------------------------

LABELS = """item_id,language,genre,automated,rater_id,human
i1,en,story,female,a,female
i1,en,story,female,b,female
i1,en,story,female,c,male
i2,en,story,female,a,male
i2,en,story,female,b,male
i3,en,story,male,a,male
i3,en,story,male,b,male
i3,en,story,male,c,male
i4,en,news,unknown,a,unclear
i4,en,news,unknown,b,non_binary
i4,en,news,unknown,c,female
i5,en,news,unknown,a,female
i5,en,news,unknown,b,male
i6,en,news,female,a,female
"""


def test_label_reference_poststratification_and_kappa_by_hand(tmp_path):
    ratings = judgement_agreement.load_label_ratings(write(tmp_path, LABELS))
    items = judgement_agreement.item_reference(ratings).set_index("item_id")
    # majority of >= 2 ratings; finer outcomes count as unknown; a tie or a single rating is unresolved
    assert items["reference"].dropna().to_dict() == {"i1": "female", "i2": "male", "i3": "male", "i4": "unknown"}
    assert items["reference"].isna().sum() == 2
    corpus = pd.DataFrame(
        {
            "language": "en",
            "genre": ["story", "story", "news", "news"],
            "label": ["female", "male", "unknown", "female"],
            "n": [70, 10, 20, 0],
        }
    )
    row = judgement_agreement.label_agreement(ratings, corpus).iloc[0]
    # cells: story/female 0.7 (i1 agrees, i2 not: 0.5), story/male 0.1 (i3: 1), news/unknown 0.2 (i4: 1)
    assert row["agreement_weighted"] == pytest.approx(0.7 * 0.5 + 0.1 + 0.2)
    assert row["agreement_unweighted"] == pytest.approx(3 / 4)
    assert (row["n_items"], row["n_resolved"]) == (6, 4)
    weights = [0.35, 0.35, 0.1, 0.2]  # i1, i2, i3, i4
    assert row["kappa_weighted"] == pytest.approx(
        cohen_kappa_score(
            ["female", "female", "male", "unknown"], ["female", "male", "male", "unknown"], sample_weight=weights
        )
    )
    unweighted = judgement_agreement.label_agreement(ratings, None).iloc[0]
    assert unweighted["agreement_weighted"] == pytest.approx(3 / 4) and not unweighted["poststratified"]


def test_fleiss_kappa_by_hand():
    # 3 items x 2 raters: (F, F), (M, M), (F, M): P_bar = 2/3, P_e = 0.5, kappa = 1/3
    ratings = pd.DataFrame(
        {
            "item_id": ["x", "x", "y", "y", "z", "z"],
            "rater_id": list("ababab"),
            "human": ["female", "female", "male", "male", "female", "male"],
        }
    )
    kappa, n_items, k = judgement_agreement.fleiss(ratings)
    assert kappa == pytest.approx(1 / 3) and (n_items, k) == (3, 2)
    # an item with a third rating is cut to the common two; an item with one rating is left out
    extra = pd.concat(
        [ratings, pd.DataFrame({"item_id": ["x", "w"], "rater_id": ["c", "a"], "human": ["female", "male"]})]
    )
    kappa, n_items, k = judgement_agreement.fleiss(extra)
    assert kappa == pytest.approx(1 / 3) and (n_items, k) == (3, 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("marker_id,language,rater_id,human\nA,en,r1,3\n", "row 1 (header): missing column(s) automated"),
        (
            "marker_id,language,rater_id,human,automated\nA,en,r1,3,6\nB,en,r1,8,6\n",
            "row 3, column human: '8' is not an integer from 1 to 7",
        ),
        ("marker_id,language,rater_id,human,automated\nA,en,r1,3,6\nA,en,r2,4,5\n", "row 3, column automated"),
        (
            "marker_id,language,rater_id,human,automated\nA,en,r1,3,6\nA,en,r1,4,6\n",
            "row 3, column rater_id: a second rating",
        ),
        ("marker_id,language,rater_id,human,automated\nA,,r1,3,6\n", "row 2, column language: empty"),
        ("marker_id,language,rater_id,human,automated,keep\nA,en,r1,3,6,maybe\n", "row 2, column keep"),
    ],
)
def test_marker_csv_problems_name_file_row_and_column(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(HumanFileError) as err:
        judgement_agreement.load_marker_ratings(path)
    assert str(path) in str(err.value) and message in str(err.value)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("i9,en,poem,female,a,female", "column genre: 'poem' is not story or news"),
        ("i9,en,story,woman,a,female", "column automated: 'woman' is not female, male or unknown"),
        ("i9,en,story,female,a,maybe", "column human: 'maybe'"),
        ("i1,en,news,female,d,female", "column genre: 'news', but item_id 'i1' has 'story'"),
    ],
)
def test_label_csv_problems_name_file_row_and_column(tmp_path, row, message):
    path = write(tmp_path, LABELS + row + "\n")
    with pytest.raises(HumanFileError) as err:
        judgement_agreement.load_label_ratings(path)
    assert str(path) in str(err.value) and f"row {len(LABELS.splitlines()) + 1}" in str(err.value)
    assert message in str(err.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(HumanFileError, match="file not found"):
        judgement_agreement.load_label_ratings(tmp_path / "absent.csv")


def test_spearman_matches_scipy_on_marker_means():
    data = _agreeing_markers(40, 3, 8)
    table = judgement_agreement.marker_agreement(data, n_boot=100, n_perm=100, seed=0).set_index("metric")
    per_marker = data.groupby("marker_id").agg(h=("human", "mean"), a=("automated", "first"))
    assert table.loc["spearman", "estimate"] == pytest.approx(
        stats.spearmanr(per_marker["h"], per_marker["a"]).statistic
    )


# automated context scores (en, fr, zh): A (en) 6/3/2: own highest, advantage 3.5; B (en) 2/5/1: not
# highest, -1; C (fr) 4/4/3: tied, not strictly highest, 0.5; D (fr, one rating: not in the subset)
CONTEXT_MARKERS = """marker_id,language,rater_id,human,automated,automated_en,automated_fr,automated_zh
A,en,r1,6,6,6,3,2
A,en,r2,7,6,6,3,2
B,en,r1,5,2,2,5,1
B,en,r2,4,2,2,5,1
C,fr,r3,4,4,4,4,3
C,fr,r4,5,4,4,4,3
E,fr,r3,1,6,1,6,2
E,fr,r4,6,6,1,6,2
D,fr,r3,1,7,1,7,1
"""


def test_high_agreement_subset_by_hand(tmp_path):
    """Feng et al. App. D.2.1: markers with >= 2 ratings spanning at most one point (A, B, C; not E,
    whose raters differ by 5, nor D, rated once); mean self-context advantage (3.5 - 1 + 0.5) / 3 and
    the share whose own context is strictly highest, 1/3."""
    from storybias.stages.figures import probes_advantage

    ratings = judgement_agreement.load_marker_ratings(write(tmp_path, CONTEXT_MARKERS))
    table = judgement_agreement.marker_agreement(ratings, n_boot=300, n_perm=100, seed=1).set_index("metric")
    advantage = table.loc[judgement_agreement.SUBSET_ADVANTAGE]
    assert advantage["estimate"] == pytest.approx(1.0) and advantage["n_markers"] == 3
    assert advantage["ci_low"] <= 1.0 <= advantage["ci_high"]
    assert table.loc[judgement_agreement.SUBSET_SELF_HIGHEST, "estimate"] == pytest.approx(1 / 3)
    # the names figure 19 reads (the figures may not import stage 06)
    assert (probes_advantage.SUBSET_ADVANTAGE, probes_advantage.SUBSET_SELF_HIGHEST) == (
        judgement_agreement.SUBSET_ADVANTAGE,
        judgement_agreement.SUBSET_SELF_HIGHEST,
    )
    without = judgement_agreement.marker_agreement(
        judgement_agreement.load_marker_ratings(write(tmp_path, MARKERS)), 100, 100
    )
    assert judgement_agreement.SUBSET_ADVANTAGE not in set(without["metric"])  # no context scores, no subset
    partial = "marker_id,language,rater_id,human,automated,automated_en,automated_fr\nA,en,r1,6,6,6,3\n"
    with pytest.raises(HumanFileError, match=r"row 1 \(header\).*without automated_zh"):
        judgement_agreement.load_marker_ratings(write(tmp_path, partial, "partial.csv"))
