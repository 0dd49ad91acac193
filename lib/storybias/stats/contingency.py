"""Tests of association in an r x c contingency table, as StereoTales' attribute-level step uses them:
Fisher's exact test generalised to r x c by Monte-Carlo resampling of tables with the observed margins,
either exactly as the reference pipeline calls scipy (``fisher_reference_p``, the default) or as a
sequential test that stops drawing once the decision at the family's BH threshold is settled (an
option for laptops at paper scale), the G test as a cheap first look, and the bias-corrected Cramér's V
(its Cohen labels: storybias.stats.effect_sizes)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from storybias.stats.multiple_testing import bh_open, bh_thresholds


def cramers_v_corrected(table: np.ndarray) -> float:
    """Bias-corrected Cramer's V (Bergsma 2013):
    phi2+ = max(0, chi2/n - (k-1)(r-1)/(n-1)); k~ = k - (k-1)^2/(n-1); r~ = r - (r-1)^2/(n-1);
    V = sqrt(phi2+ / min(k~ - 1, r~ - 1))."""
    table = np.asarray(table, float)
    n = table.sum()
    r, k = table.shape
    chi2 = stats.chi2_contingency(table, correction=False)[0]
    phi2 = max(0.0, chi2 / n - (k - 1) * (r - 1) / (n - 1))
    k_c = k - (k - 1) ** 2 / (n - 1)
    r_c = r - (r - 1) ** 2 / (n - 1)
    denominator = min(k_c - 1, r_c - 1)
    return float(math.sqrt(phi2 / denominator)) if denominator > 0 else 0.0  # 0 as the reference has it


# The reference pipeline's attribute-level test (Giskard-AI/stereotales-pipeline, step 02): scipy's
# Monte-Carlo Fisher test with 500,000 resamples and a generator seeded 42 afresh for every table.
REFERENCE_RESAMPLES = 500_000
REFERENCE_SEED = 42
# scipy draws a table's resamples with Patefield's algorithm when n > ln(n + 1) * cells, else with
# Boyett's (scipy.stats._multivariate.random_table_gen._rvs_select; tests/test_associations.py checks
# this copy against it). Patefield's stream does not depend on how many tables one call draws, so the
# reference's 500,000 may be drawn in batches (less memory, the same p-value, checked by the tests);
# Boyett's does, so those tables are drawn in one call, as the reference draws them.
REFERENCE_BATCH = 50_000


def batch_invariant(table: np.ndarray) -> bool:
    """Whether scipy draws this table's null tables with Patefield's algorithm, whose stream is the same
    whatever the batch size (see REFERENCE_BATCH)."""
    counts = np.asarray(table)
    n = float(counts.sum())
    return n > math.log(n + 1) * counts.size


def fisher_reference_p(table: np.ndarray, n_resamples: int = REFERENCE_RESAMPLES, seed: int = REFERENCE_SEED) -> float:
    """The reference's p-value of Fisher's exact test for an r x c table:
    ``scipy.stats.fisher_exact(table, method=MonteCarloMethod(n_resamples, rng=default_rng(seed)))``, i.e.
    (1 + #{null tables at most as probable as the observed one, scipy's relative tolerance}) /
    (n_resamples + 1). The table must be in the reference's row and column order (the p-value depends on
    it through the random stream). Batched where that leaves the stream unchanged (REFERENCE_BATCH)."""
    counts = np.asarray(table, np.int64)
    batch = REFERENCE_BATCH if batch_invariant(counts) else None
    method = stats.MonteCarloMethod(n_resamples=n_resamples, rng=np.random.default_rng(seed), batch=batch)
    # (an array of one value when the table has more cells than stories, as scipy then reshapes it)
    return float(np.ravel(stats.fisher_exact(counts, method=method).pvalue)[0])


class _NullTables:
    """A stream of scipy's random tables with the margins of ``table`` and a running count of those at
    most as probable as ``table``, compared as ``scipy.stats.monte_carlo_test`` compares them (the
    probability of each table, with a tolerance of 100 machine epsilons relative to the observed one):
    seeded as the reference seeds a table, the count after all resamples is the reference's."""

    def __init__(self, table: np.ndarray, rng: np.random.Generator):
        self.table = np.asarray(table, np.int64)
        self.law = stats.random_table(self.table.sum(1), self.table.sum(0), seed=rng)
        shape = self.table.shape
        # the observed table reshaped as fisher_exact's statistic reshapes it, for the same float
        flat = self.table.ravel()
        self.observed = float(
            np.ravel(self.law.pmf(flat.reshape((-1, *shape) if flat.size > flat.sum() else shape)))[0]
        )
        self.tolerance = abs(np.finfo(float).eps * 100 * self.observed)
        self.done = 0
        self.count = 0

    def draw(self, size: int) -> None:
        sims = self.law.rvs(size=size)
        self.count += int((self.law.pmf(sims) <= self.observed + self.tolerance).sum())
        self.done += size


SPARSE_EXPECTED = 5.0  # Cochran's rule: below an expected count of 5 the chi-square approximation is doubtful


# The sequential test's error budget. TABLE_ERROR bounds, for one table, the probability that any of its
# intervals, at any of its looks, misses the reference p-value; it is spent evenly over the table's
# looks (``look_count``). When no interval misses, ``fisher_family`` stops only once BH's decisions are
# those of the reference p-values (``bh_open``), so a family of m tables decides differently from the
# reference with probability at most m x TABLE_ERROR, and then at most its m decisions differ: over a
# run, E[#decisions differing from the reference] <= sum_f m_f^2 x TABLE_ERROR <= max m x N x TABLE_ERROR.
# The paper-scale bench (N = 85,014 tables, families of at most 18): 18 x 85,014 x 5e-9 = 0.0077 < 0.01.
TABLE_ERROR = 5e-9


def disagreement_bound(family_sizes: Sequence[int], table_error: float = TABLE_ERROR) -> float:
    """The bound on the expected number of BH decisions of a ``sequential`` run that differ from the
    ``reference`` run: sum over families of m^2 x ``table_error`` (TABLE_ERROR's arithmetic), for the
    run's ``family_sizes`` (tables per BH family)."""
    sizes = np.asarray(family_sizes, float)
    if (sizes < 0).any():
        raise ValueError("family_sizes must be counts of tables (>= 0)")
    return float((sizes**2).sum() * table_error)


PILOT_RESAMPLES = (1_000, 5_000)  # cumulative sizes of the pilot stages (their own stream)


MC_CHUNK = 20_000  # resamples per look at the reference stream (a Patefield table: any chunk gives its stream)


# A table scipy draws with Boyett's algorithm (small n) gets the reference's resamples only in one call of
# max_resamples (and memory for all of them): before that, these further stages of its own stream. Measured
# with make bench-associations: without them the per-language pass drew 967 tables in full (889 s); with
# them see docs/benchmarks.md.
BOYETT_PILOT_RESAMPLES = (25_000, 50_000, 100_000)


def g_test_p(table: np.ndarray) -> float:
    """Asymptotic p-value of the likelihood-ratio (G) test of independence."""
    return float(stats.chi2_contingency(np.asarray(table, float), correction=False, lambda_="log-likelihood")[1])


def g_test(table: np.ndarray) -> tuple[float, int, bool]:
    """(G, degrees of freedom, sparse) with G = 2 sum O ln(O / E) over the non-zero cells,
    E = row total x column total / n, df = (r - 1)(c - 1), sparse = some E < 5. The same G as
    ``g_test_p`` (chi2_contingency, lambda_="log-likelihood"), written out to skip its per-call
    overhead and to get E for the sparsity check."""
    observed = np.asarray(table, float)
    expected = np.outer(observed.sum(1), observed.sum(0)) / observed.sum()
    nonzero = observed > 0
    g = 2.0 * float((observed[nonzero] * np.log(observed[nonzero] / expected[nonzero])).sum())
    return g, (observed.shape[0] - 1) * (observed.shape[1] - 1), bool((expected < SPARSE_EXPECTED).any())


@dataclass
class FisherDecision:
    p_value: float
    method: str  # "reference(<B>)" or "monte-carlo(<B>)", B the resamples behind p_value
    exact: bool = True  # p_value is the reference's own (all B resamples of its seeded stream), not an estimate


def clopper_pearson(count: float, n: float, confidence: float) -> tuple[float, float]:
    """Exact binomial interval of count / n: lo = I^-1(a/2; k, n - k + 1), hi = I^-1(1 - a/2; k + 1, n - k)
    with a = 1 - confidence (I^-1 the inverse regularized incomplete beta). The same interval as
    scipy.stats.binomtest(k, n).proportion_ci(confidence), written out because it runs at every look of
    every table and binomtest's set-up costs more than the two inverse betas."""
    a = 1.0 - confidence
    lo = 0.0 if count <= 0 else float(special.betaincinv(count, n - count + 1, a / 2))
    hi = 1.0 if count >= n else float(special.betaincinv(count + 1, n - count, 1 - a / 2))
    return lo, hi


def reference_interval(count: int, drawn: int, total: int, prefix: bool, error: float) -> tuple[float, float]:
    """An interval that holds the reference p-value (1 + C) / (total + 1) with probability >= 1 - error,
    C its count over ``total`` resamples, given ``count`` of ``drawn`` resamples of one stream:

    - pi, the probability that a null table is at most as probable as the observed one, lies in the
      Clopper-Pearson interval [pi_lo, pi_hi] of count / drawn at confidence 1 - error / 2;
    - the resamples still to come, F of them, count R ~ Binomial(F, pi), and R lies in
      [q(error / 4; F, pi_lo), q(1 - error / 4; F, pi_hi)], q the binomial quantile (increasing in pi):
      each tail misses with probability <= error / 4 whatever pi in [pi_lo, pi_hi].
    With ``prefix`` the drawn resamples are the reference's first ones: C = count + R, F = total - drawn,
    exact once F = 0; otherwise (an independent pilot stream) C = R, F = total. A union bound over the
    two steps gives the stated level: a proof, not a measured margin.
    """
    rest = total - drawn if prefix else total
    base = count if prefix else 0
    if rest <= 0:
        return (1 + base) / (total + 1), (1 + base) / (total + 1)
    pi_lo, pi_hi = clopper_pearson(count, drawn, 1.0 - error / 2)
    c_lo = base + float(stats.binom.ppf(error / 4, rest, pi_lo))
    c_hi = base + float(stats.binom.ppf(1.0 - error / 4, rest, pi_hi))
    return (1 + c_lo) / (total + 1), (1 + c_hi) / (total + 1)


def look_count(table: np.ndarray, max_resamples: int) -> int:
    """The most looks ``SequentialFisher`` can take at one table: its pilot stages, then every chunk of
    the reference stream (one look for a table drawn with Boyett's algorithm)."""
    pilots = [size for size in PILOT_RESAMPLES if size < max_resamples]
    if not batch_invariant(table):
        return len(pilots) + len([size for size in BOYETT_PILOT_RESAMPLES if size < max_resamples]) + 1
    return len(pilots) + max(1, math.ceil(max_resamples / MC_CHUNK))


class SequentialFisher:
    """One table's Monte-Carlo Fisher p-value with ``max_resamples`` resamples (the reference,
    ``fisher_reference_p(table, max_resamples, seed)``), as an interval [lo, hi] that narrows on
    demand (``reference_interval``), with the point estimate ``p`` inside it.

    Each ``refine()`` draws more resamples and takes a look: the pilot stages (PILOT_RESAMPLES, a stream
    of its own seeded (seed, 1)), then 20,000-resample chunks of the reference's own stream (seeded
    ``seed``, drawn in its order): the count so far is part of the reference's, and once ``exhausted``
    the p-value is the reference's exactly. A table whose stream depends on the batch size
    (``batch_invariant`` false: small n, scipy draws it with Boyett's algorithm) has longer pilots
    (BOYETT_PILOT_RESAMPLES) and gets the reference p-value in one step when they do not settle it.
    The first look is taken at once: no p-value comes from an asymptotic approximation. Every look's
    interval misses with probability at most ``table_error / look_count`` (TABLE_ERROR: the run's bound).
    """

    def __init__(self, table: np.ndarray, seed: int, max_resamples: int = 500_000, table_error: float = TABLE_ERROR):
        self.table = np.asarray(table, np.int64)
        self.seed = seed
        self.max_resamples = max_resamples
        self.look_error = table_error / look_count(self.table, max_resamples)
        self.lo, self.hi, self.p = 0.0, 1.0, 1.0
        self.method = "none"
        self.resamples = 0
        self._pilots = [size for size in PILOT_RESAMPLES if size < max_resamples]
        if not batch_invariant(self.table):  # the reference's stream comes whole: more pilot stages first
            self._pilots += [size for size in BOYETT_PILOT_RESAMPLES if size < max_resamples]
        self._pilot: _NullTables | None = None
        self._reference: _NullTables | None = None
        if max_resamples > 0:
            self.refine()

    @property
    def exhausted(self) -> bool:
        """No resample left: the reference stream has drawn ``max_resamples``."""
        return self.max_resamples <= 0 or (self._reference is not None and self._reference.done >= self.max_resamples)

    def refine(self) -> None:
        if self._pilots:
            if self._pilot is None:
                self._pilot = _NullTables(self.table, np.random.default_rng([self.seed, 1]))
            stream = self._pilot
            stream.draw(self._pilots.pop(0) - stream.done)
        else:
            if self._reference is None:
                self._reference = _NullTables(self.table, np.random.default_rng(self.seed))
            stream = self._reference
            if batch_invariant(self.table):
                stream.draw(min(MC_CHUNK, self.max_resamples - stream.done))
            else:  # Boyett's stream: the reference's count only from one call of max_resamples
                p = fisher_reference_p(self.table, self.max_resamples, self.seed)
                stream.count, stream.done = round(p * (self.max_resamples + 1)) - 1, self.max_resamples
        self.resamples = stream.done
        prefix = stream is self._reference
        self.lo, self.hi = reference_interval(stream.count, stream.done, self.max_resamples, prefix, self.look_error)
        # the estimate, kept inside the interval so that the decisions BH takes from it are the settled ones
        self.p = min(max((1 + stream.count) / (stream.done + 1), self.lo), self.hi)
        self.method = f"monte-carlo({stream.done})"

    def decision(self) -> FisherDecision:
        return FisherDecision(self.p, self.method, self.exhausted)


def fisher_rxc(
    table: np.ndarray, thresholds: Sequence[float], seed: int, max_resamples: int = 500_000
) -> FisherDecision:
    """Fisher r x c p-value good enough to decide against every threshold in ``thresholds``, one
    table alone (``fisher_family`` decides a family of tables, refining only what BH needs):
    ``SequentialFisher`` adds resamples until its interval holds no threshold, or ``max_resamples`` is
    reached."""
    estimate = SequentialFisher(table, seed, max_resamples)
    t = np.asarray(thresholds, float)
    while not estimate.exhausted and ((estimate.lo < t) & (estimate.hi >= t)).any():
        estimate.refine()
    return estimate.decision()


FISHER_METHODS = ("reference", "sequential")


def fisher_family(
    tables: Sequence[np.ndarray],
    seed: int,
    max_resamples: int = REFERENCE_RESAMPLES,
    alpha: float = 0.05,
    method: str = "reference",
) -> list[FisherDecision]:
    """Fisher r x c p-values of one BH family.

    - ``reference`` (default): every table's p-value is the reference pipeline's,
      ``fisher_reference_p(table, max_resamples, seed)``: what a re-test of the released data must give.
    - ``sequential``: each p-value only good enough that BH's decisions (adjusted p < alpha) are those of
      the reference p-values: every table gets a first Monte-Carlo look; while ``bh_open`` reports open
      tables, each gets its next stage of ``SequentialFisher``. A table that has drawn every resample has
      the reference p-value itself (``exact``); the others have an estimate (``method`` says from how
      many resamples). The decisions differ from the reference's with probability at most m x
      TABLE_ERROR for a family of m tables (TABLE_ERROR states the run's bound and its arithmetic).
    """
    if not len(tables):
        return []
    if method == "reference":
        return [
            FisherDecision(fisher_reference_p(t, max_resamples, seed), f"reference({max_resamples})", True)
            for t in tables
        ]
    if method != "sequential":
        raise ValueError(f"Fisher method {method!r} is not one of {', '.join(FISHER_METHODS)}")
    thresholds = np.asarray(bh_thresholds(len(tables), alpha))
    estimates = [SequentialFisher(t, seed, max_resamples) for t in tables]
    while True:
        lo = np.array([e.lo for e in estimates])
        hi = np.array([e.hi for e in estimates])
        todo = bh_open(lo, hi, thresholds) & ~np.array([e.exhausted for e in estimates])
        if not todo.any():
            return [e.decision() for e in estimates]
        for i in np.flatnonzero(todo):
            estimates[i].refine()
