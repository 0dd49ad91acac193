"""The sequential Fisher test keeps its promise: BH families decided as the reference decides them, every
table with a Monte-Carlo look, intervals whose error is proven (and simulated), a bounded run."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from storybias.config.analysis_sections import AssociationSettings
from storybias.core import paths
from storybias.stages.associations import tables
from storybias.stages.extract import answers as extract
from storybias.stats import contingency
from storybias.stats.multiple_testing import adjust
from storybias.tools.bench import synthetic_extractions

# Three BH families of the bench corpus (one model at the paper's stories per model), chosen as the ones
# where the sequential test stops on the reference's own stream before its end, in the pooled pass and in
# the per-language pass: the reference takes about 8 s a family here.
FAMILIES = [("all", "disability_status"), ("en", "literacy_status"), ("fr", "parental_status")]


def _family_tables(data, scope: str, base: str) -> list[np.ndarray]:
    stories = data[data["cond_attribute"] == base]
    if scope != "all":
        stories = stories[stories["language"] == scope]
    a, labels = tables.codes(stories["cond_value"])
    compared = [(other, *tables.codes(stories[f"demo_{other}"])) for other in extract.dimensions() if other != base]
    return [t.counts for t in tables.testable_tables(a, labels, base, compared).values()]


def test_whole_bh_families_of_the_bench_corpus_are_decided_as_the_reference_decides_them():
    data = synthetic_extractions(n_stories=28_000, n_models=1, seed=42)  # 650,000 / 23 stories: one model's
    refined = 0
    for scope, base in FAMILIES:
        family = _family_tables(data, scope, base)
        assert len(family) >= 14
        sequential = contingency.fisher_family(family, 42, method="sequential")
        reference = contingency.fisher_family(family, 42, method="reference")
        mine = adjust([d.p_value for d in sequential], "fdr_bh") < 0.05
        theirs = adjust([d.p_value for d in reference], "fdr_bh") < 0.05
        assert (mine == theirs).all(), (scope, base, [d.method for d in sequential])
        assert 0 < theirs.sum() < len(family)  # a family with decisions both ways
        for mc, ref in zip(sequential, reference):
            assert mc.method.startswith("monte-carlo(")  # no decision from the G test alone
            assert ref.exact and mc.exact == (mc.method == "monte-carlo(500000)")
            if mc.exact:
                assert mc.p_value == ref.p_value
        refined += sum(int(d.method[12:-1]) > contingency.PILOT_RESAMPLES[-1] for d in sequential)
    assert refined >= 3  # the families exercise the reference stream, not only the pilots


def _coverage(count_p: float, drawn: int, total: int, prefix: bool, error: float, n: int, seed: int) -> float:
    """Share of n simulated streams whose reference p-value lies in ``reference_interval``."""
    rng = np.random.default_rng(seed)
    counts = rng.binomial(drawn, count_p, n)
    rest = rng.binomial(total - drawn if prefix else total, count_p, n)
    final = counts + rest if prefix else rest
    hits = 0
    for count, c in zip(counts, final):
        lo, hi = contingency.reference_interval(int(count), drawn, total, prefix, error)
        hits += lo <= (1 + c) / (total + 1) <= hi
    return hits / n


@pytest.mark.parametrize("prefix", [True, False])
def test_reference_interval_misses_at_most_its_error(prefix):
    # level: at a stated error of 0.1 (large enough to see misses), over p-values near BH thresholds and
    # in the tails, the interval misses the reference p-value at most 10 % of the time
    for pi in (0.0005, 0.003, 0.04, 0.3):
        coverage = _coverage(pi, 5_000 if not prefix else 60_000, 500_000, prefix, 0.1, 400, seed=int(pi * 1e4))
        assert coverage >= 0.9, (pi, coverage)


def test_intervals_narrow_with_resamples_and_decide_most_tables_early():
    # power: the interval is useful, not only valid: at the run's per-look error, p = 0.003 vs a
    # threshold of 0.01 is settled by the reference stream's first chunk, and the width shrinks as it grows
    error = contingency.TABLE_ERROR / contingency.look_count(np.full((3, 3), 100), 500_000)
    widths = []
    for drawn in (20_000, 100_000, 400_000):
        lo, hi = contingency.reference_interval(round(0.003 * drawn), drawn, 500_000, True, error)
        assert lo <= 0.003 <= hi < 0.01
        widths.append(hi - lo)
    assert widths == sorted(widths, reverse=True)
    assert contingency.reference_interval(1_500, 500_000, 500_000, True, error) == (1_501 / 500_001,) * 2


def test_the_run_bound_on_decisions_differing_from_the_reference():
    # families of 18 tables, as many as the paper-scale bench's 85,014 tables: expected differences < 0.01
    sizes = [18] * (85_014 // 18)
    assert contingency.disagreement_bound(sizes) < 0.01
    assert contingency.disagreement_bound(sizes) == pytest.approx(contingency.TABLE_ERROR * 18 * 18 * len(sizes))
    with pytest.raises(ValueError, match="family_sizes"):
        contingency.disagreement_bound([3, -1])


def test_the_profiles_that_read_the_release_use_sequential_and_reference_stays_selectable():
    for name in ("stereotales-published.yaml", "stereotales-three-lenses.yaml"):
        shipped = yaml.safe_load((paths.repo_root() / "params" / name).read_text())
        assert AssociationSettings(**shipped["associations"]).fisher == "sequential", name
    assert AssociationSettings().fisher == "reference"  # the default elsewhere, selectable by name
    assert AssociationSettings(fisher="reference").fisher == "reference"
