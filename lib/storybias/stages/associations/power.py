"""Power of stage 04's association tests: the smallest lift a run could have found.

None of the three studies reports this; it is how a student sizes a run before paying for it, and
how a reader of an empty stage 04 tells "no association" from "too few stories to see one".

The test is stage 04's own (``storybias.stages.associations``): the planted tables go through the stage's
cleaning (``testable_tables``: unknown and ``other`` dropped, rows < 10 known stories dropped,
all-zero columns dropped, 2 x 2 at least) and its two steps (``analyse_family``: r x c Fisher,
Benjamini-Hochberg over the base attribute's family, bias-corrected Cramer's V medium or large; then
the cell's one-sided Fisher, Benjamini-Yekutieli over the table's cells, lift >= 2). Nothing is
re-implemented here: this module only plants tables and counts how often the stage finds them.

The planted table (one base attribute with its prompted values as rows, one compared dimension with
``n_values`` values as columns): every row draws its known answers from the same distribution
(uniform over the values) except one cell, the smallest row's first value, whose expected lift
(observed / expected under independence, the stage's ``lift``) is L. That compared value holds
1/n_values of the answers overall (an average value), or 1/L when L > n_values (the row could not
hold more than all its stories). A lift is unreachable when L >= N / n_row (the cell would need more
than every story that has the compared value): with two equal prompted values no lift >= 2 exists.

The family the attribute-level BH corrects over is the base attribute's other compared dimensions:
``n_family - 1`` tables with no association at all (p = 1). So the planted table must reach p <
0.05 / n_family, as a lone true association does when the other tables are null (slightly optimistic:
null tables with small p would raise BH's rank).

Detected = the planted table is retained (BH-adjusted p < 0.05, Cramer's V medium or large) AND its
planted cell is significant (BY-adjusted p < 0.05 and observed lift >= 2). Since the stage asks for
an observed lift >= 2, the minimum detectable lift is never below 2.

Cost: the r x c Fisher test's Monte-Carlo budget is capped at ``max_resamples`` (2,000 by default,
against the stage's 500,000): p-values are then resolved to ~1/2,000, enough to place them against
BH's thresholds 0.05 k / m for the families of one base attribute (m <= 18). The grid of lifts is
walked upwards and stops at the first lift with power >= ``target``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from storybias.config import designs
from storybias.config.params import Params
from storybias.config.plan import plan
from storybias.stages.associations import tables as assoc
from storybias.summaries import ALL_COMPARED

LIFT_GRID: tuple[float, ...] = (1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)
TARGET_POWER = 0.8
SIMULATIONS = 200
SIM_MAX_RESAMPLES = 2_000  # the stage uses 500,000; capped for the simulation (see the module docstring)
_PLANTED = "__planted__"


@dataclass(frozen=True)
class PowerSettings:
    """How the power is simulated: lifts tried, power wanted, simulations per lift, seed, family size
    (the number of compared dimensions BH corrects over) and the Monte-Carlo Fisher budget."""

    lifts: tuple[float, ...] = LIFT_GRID
    target: float = TARGET_POWER
    n_simulations: int = SIMULATIONS
    seed: int = 42
    n_family: int = 1
    max_resamples: int = SIM_MAX_RESAMPLES


@dataclass
class PowerResult:
    """The smallest lift of the grid detected with power >= target (None: none of the reachable
    ones), the power at each lift tried (None: unreachable), and why none when none."""

    row_sizes: tuple[int, ...]
    n_values: int
    min_detectable_lift: float | None
    power: dict[float, float | None] = field(default_factory=dict)
    reason: str = ""


def planted_probabilities(row_sizes: Sequence[int], n_values: int, lift: float) -> np.ndarray | None:
    """Per row (prompted value) the probability of each compared value: uniform except the smallest
    row's first value, whose expected lift is ``lift``; None when that lift is unreachable.

    With n_0 the planted row's size, N the total, rho = p_0 / q the planted row's relative risk
    against the other rows: lift = rho N / (n_0 rho + N - n_0), so rho = L (N - n_0) / (N - L n_0),
    finite for L < N / n_0 (q = 0 at L = N / n_0, the largest lift a cell can have). The value's
    overall share is s = min(1/k, 1/L), p_0 = L s."""
    sizes = np.asarray(row_sizes, float)
    k = int(n_values)
    if k < 2 or sizes.size < 2:
        return None
    planted = int(np.argmin(sizes))
    n0, total = sizes[planted], sizes.sum()
    if lift * n0 > total * (1 + 1e-12):
        return None
    share = min(1.0 / k, 1.0 / lift)
    p0 = min(1.0, lift * share)
    # at L = N / n_0 exactly the value occurs in the planted row only (q = 0)
    q = 0.0 if lift * n0 >= total * (1 - 1e-12) else p0 * (total - lift * n0) / (lift * (total - n0))
    probs = np.empty((sizes.size, k))
    for i in range(sizes.size):
        first = p0 if i == planted else q
        probs[i, 0] = first
        probs[i, 1:] = (1.0 - first) / (k - 1)
    return probs


def _null_table() -> assoc.Table:
    # an exactly independent table: G = 0, p = 1, never open for BH, never retained
    return assoc.Table(np.full((2, 2), 10, np.int64), ["x", "y"], ["u", "v"])


def simulate_power(
    row_sizes: Sequence[int],
    n_values: int,
    lift: float,
    settings: PowerSettings = PowerSettings(),
    decide: float | None = None,
) -> float | None:
    """Share of ``settings.n_simulations`` planted tables (seeded (seed, simulation)) in which the stage's
    two steps find the planted cell: retained at the attribute level and significant at the value level.
    None when the lift is unreachable with these row sizes.

    ``decide``: stop as soon as the share over all simulations is sure to be >= ``decide`` or < it
    (the same decision as running them all, at a fraction of the cost); the share returned is then
    the one over the simulations run."""
    share, _ = _simulate(row_sizes, n_values, lift, settings, decide)
    return share


def _simulate(
    row_sizes: Sequence[int], n_values: int, lift: float, settings: PowerSettings, decide: float | None
) -> tuple[float | None, bool]:
    """(share detected, whether the share over all ``n_simulations`` is >= ``decide`` (or the
    target)): ``simulate_power`` with the decision kept apart from the share, which an early stop
    computes over fewer simulations."""
    target = settings.target if decide is None else decide
    probs = planted_probabilities(row_sizes, n_values, lift)
    if probs is None:
        return None, False
    sizes = np.asarray(row_sizes, np.int64)
    planted_row = int(np.argmin(sizes))
    a = np.repeat(np.arange(sizes.size), sizes)
    a_labels = [f"v{i}" for i in range(sizes.size)]
    b_labels = [f"c{j}" for j in range(n_values)]
    nulls = {f"null{i}": _null_table() for i in range(max(0, settings.n_family - 1))}
    hits, needed = 0, max(1, math.ceil(decide * settings.n_simulations)) if decide is not None else None
    for sim in range(settings.n_simulations):
        if needed is not None and (hits >= needed or hits + settings.n_simulations - sim < needed):
            return hits / sim, hits >= needed
        rng = np.random.default_rng([settings.seed, sim])
        b = (
            np.concatenate([rng.choice(n_values, size=n, p=p) for n, p in zip(sizes, probs)])
            if sizes.sum()
            else np.zeros(0, np.int64)
        )
        tables = assoc.testable_tables(a, a_labels, "base", [(_PLANTED, b.astype(np.int64), b_labels)])
        if _PLANTED not in tables:
            continue
        # the sequential test: the reference's decisions without 500,000 resamples of each null table
        attrs, values = assoc.analyse_family(
            "base", {**tables, **nulls}, settings.seed, settings.max_resamples, fisher="sequential"
        )
        if values.empty or not bool(attrs.loc[attrs["compared_attribute"] == _PLANTED, "retained"].any()):
            continue
        cell = values[
            (values["compared_attribute"] == _PLANTED)
            & (values["base_value"] == a_labels[planted_row])
            & (values["compared_value"] == b_labels[0])
        ]
        hits += int(bool(cell["significant"].any()))
    return hits / settings.n_simulations, hits >= target * settings.n_simulations


def _compute(row_sizes: tuple[int, ...], n_values: int, settings: PowerSettings) -> PowerResult:
    result = PowerResult(row_sizes, n_values, None)
    big = [n for n in row_sizes if n >= assoc.MIN_ROW_TOTAL]
    if len(big) < 2:
        result.reason = f"untestable: < {assoc.MIN_ROW_TOTAL} known per value"
        return result
    if n_values < 2:
        result.reason = "untestable: one compared value"
        return result
    # rows under 10 never reach the table (the stage drops them): plant in the rows it keeps
    sizes = tuple(big)
    for lift in sorted(settings.lifts):
        power, detected = _simulate(sizes, n_values, lift, settings, decide=settings.target)
        result.power[lift] = power
        if detected:
            result.min_detectable_lift = lift
            return result
    reachable = [l for l, p in result.power.items() if p is not None]
    ceiling = f"a cell's lift is at most N / n_row = {sum(sizes) / min(sizes):.3g} with these rows"
    if not any(l >= assoc.MIN_LIFT for l in reachable):
        result.reason = f"no lift >= {assoc.MIN_LIFT:g} possible: {ceiling}"
    else:
        result.reason = f"no lift up to {max(reachable):g} detected with power {settings.target:g} ({ceiling})"
    return result


@lru_cache(maxsize=256)
def _cached(row_sizes: tuple[int, ...], n_values: int, settings: PowerSettings) -> PowerResult:
    return _compute(row_sizes, n_values, settings)


def cache_key(row_sizes: Sequence[int], n_values: int, settings: PowerSettings) -> str:
    """Hash of everything the result depends on (sorted row sizes, number of values, settings)."""
    payload = {
        "rows": sorted(int(n) for n in row_sizes),
        "k": int(n_values),
        "settings": asdict(settings),
        "alpha": assoc.ALPHA,
        "min_lift": assoc.MIN_LIFT,
        "min_row": assoc.MIN_ROW_TOTAL,
        "version": 1,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def minimum_detectable_lift(
    row_sizes: Sequence[int], n_values: int, settings: PowerSettings = PowerSettings(), cache_dir: Path | None = None
) -> PowerResult:
    """The smallest lift of ``settings.lifts`` the stage detects with power >= ``settings.target`` for
    these row sizes (known stories per prompted value) and a compared dimension of ``n_values`` values.
    Cached in memory, and on disk as JSON under ``cache_dir`` when given. Never below 2: the stage
    asks for an observed lift >= 2."""
    sizes = tuple(sorted(int(n) for n in row_sizes))
    path = Path(cache_dir) / f"{cache_key(sizes, n_values, settings)}.json" if cache_dir is not None else None
    if path is not None and path.is_file():
        data = json.loads(path.read_text())
        return PowerResult(
            tuple(data["row_sizes"]),
            data["n_values"],
            data["min_detectable_lift"],
            {float(k): v for k, v in data["power"].items()},
            data["reason"],
        )
    result = _cached(sizes, int(n_values), settings)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**asdict(result), "power": {str(k): v for k, v in result.power.items()}}))
        tmp.replace(path)
    return result


# --- what a run's data allows: per compared dimension, testable or why not ---------------------------


def untestable_reason(counts: np.ndarray, min_row: int = assoc.MIN_ROW_TOTAL) -> str:
    """Why a base x compared table of known answers (rows: prompted values, columns: known compared
    values, ``unknown`` and ``other`` already left out) is not tested, "" when it is: "one prompted
    value", "all unknown", "rows < 10 known stories: x of r values", "one known value"."""
    counts = (
        np.asarray(counts, np.int64).reshape(len(counts), -1)
        if np.size(counts)
        else np.zeros((len(counts), 0), np.int64)
    )
    r = counts.shape[0]
    if r < 2:
        return "one prompted value"
    if counts.sum() == 0:
        return "all unknown"
    small = int((counts.sum(1) < min_row).sum())
    kept = counts[counts.sum(1) >= min_row]
    if kept.shape[0] < 2:
        return f"rows < {min_row} known stories: {small} of {r} values"
    if int((kept.sum(0) > 0).sum()) < 2:
        return "one known value"
    return ""


POWER_SCHEMA = assoc.POWER_SCHEMA  # associations_power.parquet (stage 04's OUTPUT_SCHEMAS)
POWER_COLUMNS = POWER_SCHEMA.names
# a compared dimension's kept rows are rounded down to this grid (10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100, ...)
ROW_GRID: tuple[int, ...] = tuple(
    sorted({int(m * 10**e) for e in range(1, 7) for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8)})
)


def rounded_rows(sizes: Sequence[int]) -> list[int]:
    """The rows the stage keeps (>= 10 known stories), each taken as the smallest of them rounded down
    to ``ROW_GRID``: tables of similar sizes then share one cached simulation (a paper-scale run has
    about a thousand tested tables, each would otherwise cost its own), and fewer stories never make a
    smaller lift detectable, so the estimate errs on the large side (by at most a 25% smaller row)."""
    kept = [n for n in sizes if n >= assoc.MIN_ROW_TOTAL]
    if not kept:
        return []
    return [max(g for g in ROW_GRID if g <= min(kept))] * len(kept)


def _known_counts(a: np.ndarray, a_labels: list, b: np.ndarray, b_labels: list) -> tuple[np.ndarray, list]:
    """Prompted value x known compared value counts (the stage's cleaning with no row minimum)."""
    table = assoc.clean_table(a, a_labels, b, b_labels, min_row=0)
    full = np.zeros((len(a_labels), table.counts.shape[1]), np.int64)
    for i, label in enumerate(table.rows):
        full[a_labels.index(label)] = table.counts[i]
    keep = [i for i, label in enumerate(a_labels) if label != "unknown"]
    return full[keep], [a_labels[i] for i in keep]


def power_table(
    data: pd.DataFrame,
    dimensions: Sequence[str],
    scope_by_language: bool,
    settings: PowerSettings = PowerSettings(),
    n_values: dict[str, int] | None = None,
    cache_dir: Path | None = None,
) -> pd.DataFrame:
    """For every model x scope x base attribute of ``data`` (stage 04's observations): one row with the
    stories per prompted value and the minimum detectable lift as if every answer were known (for a
    compared dimension of the median number of values), then one row per compared dimension with its
    known stories per prompted value, whether the stage could test it and, if not, why. In the pooled
    pass (``scope_by_language`` False) the tested ones also carry their own minimum detectable lift
    (the family: the base attribute's tested dimensions; rows as ``rounded_rows``); the per-language
    pass, with one scope per language, gives only the base row's lift, to keep the stage's cost down."""

    n_of: dict[str, int] = n_values or {d: len(v) for d, v in designs.dimensions().items()}
    typical = int(np.median([n_of.get(d, 2) for d in dimensions])) if dimensions else 2
    rows = []
    if data.empty:
        return pd.DataFrame(columns=POWER_COLUMNS)
    scope = data["language"] if scope_by_language else pd.Series("all", index=data.index)
    for (model, scope_name, base), group in data.groupby([data["model"], scope, data["cond_attribute"]], sort=True):
        where = {"model": model, "scope": scope_name, "base_attribute": base}
        a, a_labels = assoc.codes(group["cond_value"])
        per_dim = _compared_counts(group, a, a_labels, base, dimensions)
        rows.append(_base_row(where, a, a_labels, len(per_dim), typical, settings, cache_dir))
        rows.extend(_compared_rows(where, per_dim, n_of, scope_by_language, settings, cache_dir))
    out = pd.DataFrame(rows, columns=POWER_COLUMNS)
    out["min_detectable_lift"] = out["min_detectable_lift"].astype(float)
    return out


_Compared = tuple[str, np.ndarray, list, str]  # (compared dimension, known counts, row values, untestable reason)


def _compared_counts(
    group: pd.DataFrame, a: np.ndarray, a_labels: list, base: str, dimensions: Sequence[str]
) -> list[_Compared]:
    """Per compared dimension of one base attribute's stories: its known counts, rows and why it is untestable."""
    per_dim = []
    for other in dimensions:
        if other == base:
            continue
        b, b_labels = assoc.codes(group[f"demo_{other}"])
        counts, values = _known_counts(a, a_labels, b, b_labels)
        per_dim.append((other, counts, values, untestable_reason(counts)))
    return per_dim


def _base_row(
    where: dict[str, Any],
    a: np.ndarray,
    a_labels: list,
    n_compared: int,
    typical: int,
    settings: PowerSettings,
    cache_dir: Path | None,
) -> dict[str, Any]:
    """The base attribute's row: stories per prompted value and the minimum detectable lift as if every
    answer were known, for a compared dimension of ``typical`` values (family: every compared dimension)."""
    own = PowerSettings(
        settings.lifts,
        settings.target,
        settings.n_simulations,
        settings.seed,
        max(1, n_compared),
        settings.max_resamples,
    )
    sizes = [int((a == i).sum()) for i, label in enumerate(a_labels) if label != "unknown"]
    head = minimum_detectable_lift(sizes, typical, own, cache_dir)
    return {
        **where,
        "compared_attribute": ALL_COMPARED,
        "n_values": typical,
        "row_values": [l for l in a_labels if l != "unknown"],
        "row_sizes": sizes,
        "testable": not head.reason.startswith("untestable"),
        "reason": head.reason if head.reason.startswith("untestable") else "",
        "min_detectable_lift": head.min_detectable_lift,
        "power_note": power_note(head),
        "n_family": own.n_family,
        "n_simulations": own.n_simulations,
    }


def _compared_rows(
    where: dict[str, Any],
    per_dim: list[_Compared],
    n_of: dict[str, int],
    scope_by_language: bool,
    settings: PowerSettings,
    cache_dir: Path | None,
) -> list[dict[str, Any]]:
    """One row per compared dimension: its known stories per prompted value, testable or why not, and
    (pooled pass, tested only) its own minimum detectable lift, the family being the tested dimensions."""
    family = max(1, len([d for d in per_dim if not d[3]]))
    fam = PowerSettings(
        settings.lifts, settings.target, settings.n_simulations, settings.seed, family, settings.max_resamples
    )
    rows = []
    for other, counts, values, reason in per_dim:
        known = [int(n) for n in counts.sum(1)]
        result = (
            None
            if reason or scope_by_language
            else minimum_detectable_lift(rounded_rows(known), n_of.get(other, int(counts.shape[1])), fam, cache_dir)
        )
        rows.append(
            {
                **where,
                "compared_attribute": other,
                "n_values": int(n_of.get(other, int(counts.shape[1]))),
                "row_values": values,
                "row_sizes": known,
                "testable": not reason,
                "reason": reason,
                "min_detectable_lift": None if result is None else result.min_detectable_lift,
                "power_note": power_note(result) if result is not None else ("pooled pass only" if not reason else ""),
                "n_family": family,
                "n_simulations": fam.n_simulations if result is not None else 0,
            }
        )
    return rows


def power_note(result: PowerResult) -> str:
    """One line: the minimum detectable lift (never below 2, the stage's lift threshold) or why none."""
    if result.min_detectable_lift is not None:
        return (
            f"lift >= {result.min_detectable_lift:g} detected with power >= {TARGET_POWER:g}"
            " (never below 2: the stage requires an observed lift >= 2)"
        )
    return result.reason


# --- check-params: the same estimate from a profile's plan, before it runs ---------------------------


def planned_rows(params: Params, stories: pd.DataFrame | None = None) -> pd.DataFrame:
    """Stories per model x base attribute x prompted value of the stereotales design: from ``stories``
    (stage 01's plan, e.g. an imported table's own rows read without their text), else from the profile's
    prompt grid (no model needed). Columns model, base_attribute, base_value, stories."""

    columns = ["model", "base_attribute", "base_value", "stories"]
    if stories is None:
        if "stereotales" not in params.enabled_designs():
            return pd.DataFrame(columns=columns)
        stories = plan(params)
    planned = stories[stories["design"].eq("stereotales") & stories["cond_value"].notna()] if len(stories) else stories
    if planned.empty:
        return pd.DataFrame(columns=columns)
    return (
        planned.groupby(["model", "cond_attribute", "cond_value"])
        .size()
        .rename("stories")
        .reset_index()
        .rename(columns={"cond_attribute": "base_attribute", "cond_value": "base_value"})
    )


def planned_power(
    params: Params,
    known_share: float | None = None,
    settings: PowerSettings | None = None,
    stories: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per base attribute of the stereotales stories planned (pooled pass, the model with the fewest
    stories): stories per prompted value, the known answers expected per value (x
    ``associations.power_known_share``), and the minimum detectable lift for a compared dimension of the
    median number of values, the family being every other dimension (in-memory cache). ``stories``: stage
    01's plan (``storybias.stages.generate.plan``: an imported corpus' own counts); default the grid."""

    share = params.associations.power_known_share if known_share is None else known_share
    dims = designs.dimensions()
    rows = planned_rows(params, stories)
    out = []
    if rows.empty:
        return pd.DataFrame(
            columns=["base_attribute", "stories_per_value", "known_per_value", "min_detectable_lift", "note"]
        )
    smallest = rows.groupby("model", sort=True)["stories"].sum().idxmin()
    for base, group in rows[rows["model"] == smallest].groupby("base_attribute", sort=True):
        per_value = group["stories"].to_numpy()
        known = [int(math.floor(n * share)) for n in per_value]
        others = [len(v) for d, v in dims.items() if d != base]
        s = settings or PowerSettings(
            seed=params.associations.seed,
            n_family=max(1, len(others)),
            n_simulations=params.associations.power_simulations,
        )
        result = minimum_detectable_lift(known, int(np.median(others)) if others else 2, s)
        spv = f"{per_value.min()}" if per_value.min() == per_value.max() else f"{per_value.min()}-{per_value.max()}"
        kpv = f"{min(known)}" if min(known) == max(known) else f"{min(known)}-{max(known)}"
        out.append(
            {
                "model": smallest,
                "base_attribute": base,
                "stories_per_value": spv,
                "known_per_value": kpv,
                "min_detectable_lift": result.min_detectable_lift,
                "note": power_note(result),
            }
        )
    return pd.DataFrame(out)


def format_planned(table: pd.DataFrame, known_share: float) -> str:
    """The check-params table as text."""
    if table.empty:
        return "power: no stereotales stories planned: stage 04 has nothing to test"
    model = f"model {table['model'].iloc[0]}, " if "model" in table else ""
    lines = [
        f"power (stage 04, pooled pass; {model}known share {known_share:g}, "
        f"{TARGET_POWER:.0%} power, alpha {assoc.ALPHA}, lift >= {assoc.MIN_LIFT:g}):",
        f"  {'base attribute':<22}{'stories/value':>14}{'known/value':>12}  minimum detectable lift",
    ]
    for r in table.itertuples(index=False):
        mdl = (
            f"{r.min_detectable_lift:g}"
            if r.min_detectable_lift is not None and np.isfinite(r.min_detectable_lift)
            else r.note
        )
        lines.append(f"  {r.base_attribute:<22}{r.stories_per_value:>14}{r.known_per_value:>12}  {mdl}")
    lines.append("  (never below 2: the stage requires an observed lift >= 2)")
    return "\n".join(lines)
