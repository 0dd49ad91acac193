"""Confidence intervals of counts (the bootstrap ones are in ``storybias.stats.bootstrap``)."""

from __future__ import annotations

from scipy.stats import chi2


def poisson_interval(count: int, level: float = 0.95) -> tuple[float, float]:
    """Garwood's exact interval for a Poisson count: [chi2(alpha/2; 2k) / 2, chi2(1 - alpha/2; 2k + 2) / 2],
    0 below when the count is 0. scipy has the chi-square quantiles but no such interval."""
    alpha = 1 - level
    low = 0.0 if count == 0 else chi2.ppf(alpha / 2, 2 * count) / 2
    return float(low), float(chi2.ppf(1 - alpha / 2, 2 * (count + 1)) / 2)
