"""Tests of association in an r x c contingency table, as StereoTales' attribute-level step uses them:
Fisher's exact test generalised to r x c by Monte-Carlo resampling of tables with the observed margins
(a sequential test that stops drawing once the decision at the family's BH threshold is settled), the
G test as a cheap first look, and the bias-corrected Cramér's V with Cohen's effect-size labels."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from storybias.stats.multiple_testing import bh_open, bh_thresholds

EFFECT_LABELS = ("negligible", "small", "medium", "large")


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
    return float(math.sqrt(phi2 / denominator)) if denominator > 0 else float("nan")


def effect_size(v: float, n_rows: int, n_cols: int) -> str:
    """Effect category of V: thresholds 0.1, 0.3, 0.5 divided by sqrt(min(r, c) - 1)."""
    if not np.isfinite(v):
        return "negligible"
    scale = math.sqrt(min(n_rows, n_cols) - 1)
    for label, threshold in (("large", 0.5), ("medium", 0.3), ("small", 0.1)):
        if v >= threshold / scale:
            return label
    return "negligible"


def _log_factorials(n: int) -> np.ndarray:
    """log k! for k = 0..n."""
    return special.gammaln(np.arange(n + 1) + 1)


def _log_table_probability(tables: np.ndarray, log_factorials: np.ndarray | None = None) -> np.ndarray:
    """-sum log(n_ij!) per table (up to the margins' constant): larger = more probable. With
    ``log_factorials`` (``_log_factorials(n)``) the cells are looked up instead of passed to gammaln:
    the same values, several times faster on millions of simulated cells."""
    if log_factorials is None:
        return -special.gammaln(tables + 1).sum(axis=(-2, -1))
    return -log_factorials[tables].sum(axis=(-2, -1))


def sample_tables(row_totals: np.ndarray, col_totals: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` random tables with the given margins (the multivariate hypergeometric null of Fisher's
    test), drawn cell by cell with vectorised hypergeometric draws: size x r x c. The work arrays are
    cell-major (one contiguous vector of ``size`` per cell) and the pool left before a row is the same
    for every table, so nothing is strided or summed per draw; the draws are the same as drawing into a
    size x r x c array."""
    r, c = len(row_totals), len(col_totals)
    out = np.zeros((r, c, size), dtype=np.int64)
    col_left = np.repeat(np.asarray(col_totals, np.int64)[:, None], size, axis=1)
    remaining = int(np.sum(col_totals))
    for i in range(r - 1):
        row_left = np.full(size, int(row_totals[i]), np.int64)
        pool = np.full(size, remaining, np.int64)  # stories left in columns j+1.. after the next line
        for j in range(c - 1):
            pool -= col_left[j]
            # (no skip when every row_left is 0: numpy draws no random number for a zero-size sample,
            # so the stream is the same, and the check cost more than the rare call it saved)
            draw = rng.hypergeometric(col_left[j], pool, row_left)
            out[i, j] = draw
            row_left -= draw
            col_left[j] -= draw
        out[i, c - 1] = row_left
        col_left[c - 1] -= row_left
        remaining -= int(row_totals[i])
    out[r - 1] = col_left
    return np.ascontiguousarray(out.transpose(2, 0, 1))


class _NullTables:
    """A stream of random tables with the margins of ``table`` and a running count of those at most
    as probable as ``table`` (the numerator of the Monte-Carlo Fisher p-value)."""

    def __init__(self, table: np.ndarray, rng: np.random.Generator):
        self.table = np.asarray(table, np.int64)
        self.rng = rng
        self.log_factorials = _log_factorials(int(self.table.sum()))
        self.observed = _log_table_probability(self.table[None], self.log_factorials)[0]
        self.done = 0
        self.count = 0

    def draw(self, size: int) -> None:
        sims = sample_tables(self.table.sum(1), self.table.sum(0), size, self.rng)
        self.count += int((_log_table_probability(sims, self.log_factorials) <= self.observed + 1e-7).sum())
        self.done += size


def fisher_rxc_monte_carlo(table: np.ndarray, n_resamples: int, seed: int, chunk: int = 20_000) -> tuple[float, int]:
    """Monte-Carlo p-value of Fisher's exact test for an r x c table (as R's
    fisher.test(simulate.p.value = TRUE)): p = (1 + #{simulated tables at most as probable as the
    observed one}) / (B + 1). Returns (p, count)."""
    stream = _NullTables(table, np.random.default_rng(seed))
    while stream.done < n_resamples:
        stream.draw(min(chunk, n_resamples - stream.done))
    return (1 + stream.count) / (n_resamples + 1), stream.count


SPARSE_EXPECTED = 5.0  # Cochran's rule: below an expected count of 5 the chi-square approximation is doubtful


# How far below and above the G-test p Fisher's exact p may lie: (factor below, factor above). Measured
# on 1,200 synthetic paper-scale tables with 1e-6 < p < 0.5 against 20,000-resample Monte-Carlo
# p-values: dense tables within 3x either way; sparse ones (the per-language tables, n ~ 80) up to 3.4x
# below and 13x above (the G-test is anti-conservative on sparse tables, so the margin is lopsided).
DENSE_MARGIN = (10.0, 10.0)


SPARSE_MARGIN = (10.0, 100.0)


MC_CONFIDENCE = 0.9999  # level of every interval at every look of the sequential Monte-Carlo test


PILOT_RESAMPLES = (1_000, 5_000)  # cumulative sizes of the pilot stages (their own stream)


MC_CHUNK = 20_000  # the reference stream's chunk, as fisher_rxc_monte_carlo's default


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
    method: str  # "asymptotic" or "monte-carlo(<B>)", B the resamples behind p_value


def asymptotic_interval(
    p: float,
    sparse: bool,
    dense_margin: tuple[float, float] = DENSE_MARGIN,
    sparse_margin: tuple[float, float] = SPARSE_MARGIN,
) -> tuple[float, float]:
    """Where Fisher's exact p may lie given the asymptotic p: [p / below, min(1, p * above)]."""
    below, above = sparse_margin if sparse else dense_margin
    return p / below, min(1.0, p * above)


def clopper_pearson(count: float, n: float, confidence: float) -> tuple[float, float]:
    """Exact binomial interval of count / n: lo = I^-1(a/2; k, n - k + 1), hi = I^-1(1 - a/2; k + 1, n - k)
    with a = 1 - confidence (I^-1 the inverse regularized incomplete beta; real k and n allowed). The
    same interval as scipy.stats.binomtest(k, n).proportion_ci(confidence), written out because it runs
    at every look of every refined table and binomtest's set-up costs more than the two inverse betas."""
    a = 1.0 - confidence
    lo = 0.0 if count <= 0 else float(special.betaincinv(count, n - count + 1, a / 2))
    hi = 1.0 if count >= n else float(special.betaincinv(count + 1, n - count, 1 - a / 2))
    return lo, hi


def reference_interval(
    count: int, drawn: int, total: int, prefix: bool, confidence: float = MC_CONFIDENCE
) -> tuple[float, float]:
    """Where the reference p-value (1 + C) / (total + 1) will lie, C its count over ``total`` resamples
    (``fisher_rxc_monte_carlo(table, total, seed)``), given ``count`` of ``drawn`` resamples: C / total
    is predicted around pi^ = count / drawn as a binomial proportion with an effective size B_eff
    matching its variance, and the interval is Clopper-Pearson's at B_eff (real-valued counts):

    - ``prefix``: the drawn resamples are the reference's first ones, C = count + R with
      R ~ Binomial(total - drawn, pi): Var(C / total) = pi (1 - pi) (rest / total^2) (1 + rest / drawn),
      rest = total - drawn, so 1 / B_eff = rest (drawn + rest) / (total^2 drawn); exact (zero width)
      once rest = 0.
    - otherwise (an independent pilot stream): C ~ Binomial(total, pi), 1 / B_eff = 1 / total + 1 / drawn.
    """
    rest = total - drawn
    if prefix and rest <= 0:
        return (1 + count) / (total + 1), (1 + count) / (total + 1)
    b_eff = total * total * drawn / (rest * (drawn + rest)) if prefix else 1.0 / (1.0 / total + 1.0 / drawn)
    lo, hi = clopper_pearson(count / drawn * b_eff, b_eff, confidence)
    return (1 + total * lo) / (total + 1), (1 + total * hi) / (total + 1)


class SequentialFisher:
    """One table's Monte-Carlo Fisher p-value with ``max_resamples`` resamples (the reference,
    ``fisher_rxc_monte_carlo(table, max_resamples, seed)``), as an interval [lo, hi] that narrows on
    demand (``reference_interval``), with the point estimate ``p`` inside it.

    It starts at the G-test p: the exact p-value pi lies in ``asymptotic_interval``, and the
    reference in the Clopper-Pearson interval of Binomial(max_resamples, pi) around it. Each
    ``refine()`` draws more resamples, p = (1 + count) / (B + 1) and ``reference_interval``: the pilot
    stages (PILOT_RESAMPLES, a stream of its own seeded (seed, 1)), then 20,000-resample chunks of the
    reference's own stream (seeded ``seed``, drawn in its order): the count so far is part of the
    reference's, and once ``exhausted`` the p-value is the reference's exactly.
    """

    def __init__(
        self,
        table: np.ndarray,
        seed: int,
        max_resamples: int = 500_000,
        dense_margin: tuple[float, float] = DENSE_MARGIN,
        sparse_margin: tuple[float, float] = SPARSE_MARGIN,
    ):
        self.table = np.asarray(table, np.int64)
        self.seed = seed
        self.max_resamples = max_resamples
        g, df, self.sparse = g_test(self.table)
        self.p = float(stats.chi2.sf(g, df))
        pi_lo, pi_hi = asymptotic_interval(self.p, self.sparse, dense_margin, sparse_margin)
        if max_resamples > 0:
            n = max_resamples
            pi_lo = (1 + n * clopper_pearson(n * pi_lo, n, MC_CONFIDENCE)[0]) / (n + 1)
            pi_hi = (1 + n * clopper_pearson(n * pi_hi, n, MC_CONFIDENCE)[1]) / (n + 1)
        self.lo, self.hi = pi_lo, pi_hi
        self.method = "asymptotic"
        self.resamples = 0
        self._pilots = [size for size in PILOT_RESAMPLES if size < max_resamples]
        self._pilot: _NullTables | None = None
        self._reference: _NullTables | None = None

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
            stream.draw(min(MC_CHUNK, self.max_resamples - stream.done))
        self.resamples = stream.done
        self.p = (1 + stream.count) / (stream.done + 1)
        self.lo, self.hi = reference_interval(stream.count, stream.done, self.max_resamples, stream is self._reference)
        self.method = f"monte-carlo({stream.done})"

    def decision(self) -> FisherDecision:
        return FisherDecision(self.p, self.method)


def fisher_rxc(
    table: np.ndarray, thresholds: Sequence[float], seed: int, max_resamples: int = 500_000, margin: float = 10.0
) -> FisherDecision:
    """Fisher r x c p-value good enough to decide against every threshold in ``thresholds``, one
    table alone (``fisher_family`` decides a family of tables, refining only what BH needs).

    The asymptotic p is kept when its interval (``margin`` either way for a dense table,
    SPARSE_MARGIN for a sparse one) holds no threshold; otherwise ``SequentialFisher`` adds resamples
    until the interval holds none, or ``max_resamples`` is reached.
    """
    estimate = SequentialFisher(table, seed, max_resamples, dense_margin=(margin, margin))
    t = np.asarray(thresholds, float)
    while not estimate.exhausted and ((estimate.lo < t) & (estimate.hi >= t)).any():
        estimate.refine()
    return estimate.decision()


def fisher_family(
    tables: Sequence[np.ndarray], seed: int, max_resamples: int = 500_000, alpha: float = 0.05
) -> list[FisherDecision]:
    """Fisher r x c p-values of one BH family, each good enough that BH's decisions (adjusted p < alpha)
    are those of the reference p-values (``fisher_rxc_monte_carlo(table, max_resamples, seed)``): every
    table starts asymptotic; while ``bh_open`` reports open tables, each gets its next Monte-Carlo stage
    of ``SequentialFisher``. A table that has drawn every resample has the reference p-value itself."""
    if not len(tables):
        return []
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
