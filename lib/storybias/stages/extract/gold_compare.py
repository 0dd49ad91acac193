"""Two extractor settings compared on the same gold stories (issue #61): ``gold_targets``' measures
written as ratios of per-story counts, so that a paired bootstrap over the stories
(storybias.stats.bootstrap.paired_bootstrap_difference) gives each measure's difference with an
interval, and the table of variants against a baseline with what each costs.

A variant is "not worse" when, for every ruled measure, the 95% interval of its difference from the
baseline includes 0 or lies above it (issue #61's rule); :func:`cheapest_not_worse` picks among those.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from storybias.config.designs import demo_columns
from storybias.stats.bootstrap import paired_bootstrap_difference

MEASURES = ("macro_accuracy_known", "answered_known", "unknown_kept", "gender_accuracy", "adjective_f1")
# measures where the new variant may not lose (the rule); answered_known is shown, but answering more
# is not better by itself (a guess answers), so it is left out of the rule, as unknown_kept holds it
RULED_MEASURES = ("macro_accuracy_known", "unknown_kept", "gender_accuracy", "adjective_f1")


def _fields() -> list[str]:
    return [c for c in demo_columns() if c != "demo_gender"]


def story_counts(truths: list[dict[str, Any]], predictions: list[dict[str, Any]]) -> np.ndarray:
    """(stories x counts): per demographic field but gender, right-and-known then known; then answered
    known, known, kept unknown, unknown, gender right, one (the story), adjective lemmas right,
    predicted, true. :func:`measures_from_counts` of their column sums is ``gold_targets``."""
    fields = _fields()
    rows = []
    for t, p in zip(truths, predictions, strict=True):
        known = [t[f] != "unknown" for f in fields]
        per_field = [x for f, k in zip(fields, known) for x in (k and p[f] == t[f], k)]
        true_adj, pred_adj = set(t["adjectives_en"]), set(p["adjectives_en"])
        rows.append(
            [
                *per_field,
                sum(k and p[f] != "unknown" for f, k in zip(fields, known)),
                sum(known),
                sum(not k and p[f] == "unknown" for f, k in zip(fields, known)),
                len(fields) - sum(known),
                t["protagonist_gender"] == p["protagonist_gender"],
                1,
                len(true_adj & pred_adj),
                len(pred_adj),
                len(true_adj),
            ]
        )
    return np.asarray(rows, dtype=float).reshape(len(rows), 2 * len(fields) + 9)


def measures_from_counts(sums: np.ndarray) -> np.ndarray:
    """(b x counts) summed :func:`story_counts` -> (b x 5) measures in :data:`MEASURES`' order; a ratio
    whose denominator is 0 is NaN (the macro accuracy leaves out a field with no known truth)."""
    sums = np.atleast_2d(np.asarray(sums, float))
    n_fields = (sums.shape[1] - 9) // 2
    right, known = sums[:, 0 : 2 * n_fields : 2], sums[:, 1 : 2 * n_fields : 2]
    rest = sums[:, 2 * n_fields :]
    with np.errstate(invalid="ignore", divide="ignore"):
        per_field = np.where(known > 0, right / np.where(known > 0, known, 1), np.nan)
        has_field = np.isfinite(per_field).any(axis=1)
        macro = np.where(has_field, np.nanmean(np.where(has_field[:, None], per_field, 0), axis=1), np.nan)
        return np.column_stack(
            [
                macro,
                rest[:, 0] / rest[:, 1],
                rest[:, 2] / rest[:, 3],
                rest[:, 4] / rest[:, 5],
                2 * rest[:, 6] / (rest[:, 7] + rest[:, 8]),
            ]
        )


def compare_variants(
    scored: Mapping[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]],
    costs: Mapping[str, Mapping[str, Any]],
    n_boot: int = 2000,
    seed: int = 1234,
    level: float = 0.95,
) -> pd.DataFrame:
    """One row per variant of ``scored`` (name -> (truths, predictions) on the same stories, in the same
    order; the first is the baseline): each measure, its difference from the baseline with the paired
    bootstrap interval, whether it is not worse on every ruled measure, and ``costs``' (name -> the run's
    summary: n_items, n_requests, prompt_tokens, output_tokens, seconds) tokens per story."""
    names = list(scored)
    base = story_counts(*scored[names[0]])
    rows = []
    for name in names:
        counts = story_counts(*scored[name])
        if counts.shape != base.shape:
            raise ValueError(f"variant {name!r}: scored on {len(counts)} stories, the baseline on {len(base)}")
        diff = paired_bootstrap_difference(base, counts, measures_from_counts, n_boot, seed, level)
        row: dict[str, Any] = {"variant": name}
        values = measures_from_counts(counts.sum(0))[0]
        for j, measure in enumerate(MEASURES):
            row[measure] = round(float(values[j]), 3)
            row[f"{measure}_diff"] = round(float(diff["difference"][j]), 3)
            row[f"{measure}_low"] = round(float(diff["lower"][j]), 3)
            row[f"{measure}_high"] = round(float(diff["upper"][j]), 3)
        # the interval includes 0 or lies above it: its upper end is not below 0
        row["not_worse"] = bool(all(diff["upper"][MEASURES.index(m)] >= 0 for m in RULED_MEASURES))
        rows.append({**row, **_cost(costs[name])})
    return pd.DataFrame(rows)


def _cost(summary: Mapping[str, Any]) -> dict[str, Any]:
    n = summary["n_items"]
    return {
        "n_stories": n,
        "n_parsed": summary["n_parsed"],
        "requests_per_story": round(summary["n_requests"] / n, 2),
        "prompt_tokens_per_story": round(summary["prompt_tokens"] / n, 1),
        "output_tokens_per_story": round(summary["output_tokens"] / n, 1),
        "seconds": summary["seconds"],
    }


def cheapest_not_worse(table: pd.DataFrame) -> str:
    """The variant of a :func:`compare_variants` table to choose: among those not worse (the baseline
    is), the ones no other not-worse variant beats on both prompt and output tokens per story (each
    answer's cost: the prompt's tokens are prefilled or read by attention, every output token is a
    decode step); of those, the fewest output tokens, then the fewest prompt tokens."""
    ok = table[table["not_worse"]]
    if ok.empty:
        raise ValueError("table: no variant is not worse than the baseline (the baseline itself should be)")
    cost = ok[["prompt_tokens_per_story", "output_tokens_per_story"]].to_numpy()
    dominated = [bool(((cost <= c).all(1) & (cost < c).any(1)).any()) for c in cost]
    front = ok[~np.array(dominated)]
    return str(front.sort_values(["output_tokens_per_story", "prompt_tokens_per_story"])["variant"].iloc[0])
