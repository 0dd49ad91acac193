"""How far one 2 x 2 association differs across strata (languages): each stratum's log odds ratio with its
interval, its difference from a reference stratum, and a test that the odds ratios are equal in every
stratum (Breslow-Day with Tarone's correction, statsmodels' ``StratifiedTable.test_equal_odds``).

A 2 x 2 table here is [[a, b], [c, d]]: rows the prompted value (a, not a), columns the compared value
(b, not b). The test reads the counts, never a per-stratum significance flag: that an association is
significant in one language and not in another is no evidence that it differs between them.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy import stats
from statsmodels.stats.contingency_tables import StratifiedTable, Table2x2


def informative(table: npt.ArrayLike) -> bool:
    """A 2 x 2 table whose four margins are all positive: the only kind that says anything on its odds ratio."""
    t = np.asarray(table, float)
    return bool((t.sum(0) > 0).all() and (t.sum(1) > 0).all())


def log_odds_ratio(table: npt.ArrayLike, level: float = 0.95) -> tuple[float, float, float, float]:
    """Log odds ratio of a 2 x 2 table, its Woolf (Wald) interval at ``level`` and its variance, with 0.5
    added to every cell when one is zero (statsmodels' ``Table2x2(shift_zeros=True)``); NaN for a table
    with an empty margin."""
    if not informative(table):
        return float("nan"), float("nan"), float("nan"), float("nan")
    fitted = Table2x2(np.asarray(table, float), shift_zeros=True)
    low, high = fitted.log_oddsratio_confint(alpha=1 - level)
    return float(fitted.log_oddsratio), float(low), float(high), float(fitted.log_oddsratio_se**2)


def difference_interval(
    estimate: float, variance: float, reference: float, reference_variance: float, level: float = 0.95
) -> tuple[float, float, float]:
    """A stratum's log odds ratio minus the reference stratum's, with the Wald interval of the difference of
    two independent estimates (their variances add)."""
    z = float(stats.norm.ppf(0.5 + level / 2))
    difference = estimate - reference
    half = z * float(np.sqrt(variance + reference_variance))
    return float(difference), float(difference - half), float(difference + half)


def equal_odds_p(tables: npt.ArrayLike) -> float:
    """p-value of the Breslow-Day test (Tarone's adjustment) that every stratum's odds ratio is the same;
    ``tables``: (strata x 2 x 2). Strata with an empty margin are left out; NaN when fewer than two remain,
    or when no stratum has a count in its first cell or none in its second (the common odds ratio
    is then 0 or infinite and the test is undefined)."""
    strata = np.asarray(tables, float).reshape(-1, 2, 2)
    strata = strata[[informative(t) for t in strata]]
    if len(strata) < 2 or strata[:, 0, 0].sum() == 0 or strata[:, 0, 1].sum() == 0:
        return float("nan")
    if strata[:, 1, 0].sum() == 0 or strata[:, 1, 1].sum() == 0:
        return float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):  # a stratum of zero variance gives NaN: no test
        result = StratifiedTable(np.transpose(strata, (1, 2, 0))).test_equal_odds(adjust=True)
    return float(result.pvalue) if np.isfinite(result.pvalue) else float("nan")
