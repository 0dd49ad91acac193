"""Cohen's effect-size labels for Cramér's V, as StereoTales' attribute-level step names them (and its
released associations file spells them). Kept apart from ``storybias.stats.contingency`` so that reading a
profile (``storybias.config``, every ``make`` call) does not import scipy for four words."""

from __future__ import annotations

import math

EFFECT_LABELS = ("negligible", "small", "medium", "large")
COHEN_THRESHOLDS = {"small": 0.1, "medium": 0.3, "large": 0.5}  # for a 2 x 2 table (one degree of freedom)


def effect_size(v: float, n_rows: int, n_cols: int) -> str:
    """Effect category of V: Cohen's thresholds 0.1, 0.3, 0.5 divided by sqrt(min(r, c) - 1)."""
    if not math.isfinite(v):
        return EFFECT_LABELS[0]
    scale = math.sqrt(min(n_rows, n_cols) - 1)
    for label in reversed(EFFECT_LABELS[1:]):
        if v >= COHEN_THRESHOLDS[label] / scale:
            return label
    return EFFECT_LABELS[0]
