"""Stage 04's comparison with the associations StereoTales published (``published_comparison.parquet``).

``associations.published`` names StereoTales' association files (``associations_global`` /
``associations_by_language`` JSONL, a file or a folder) or its human study's ``questions.json``
(``storybias.evidence.released_associations.load_associations``). Each published association is compared
with the run's tests of the same model and scope: a released file's global records with the run's pooled
pass, each language's records with that language's pass. The human study's list names no model and no
scope: it mixes associations of the global pass with ones found in a single language's pass (StereoTales'
summary counts 784 global ones of its 1,580), so each of its questions (scope ``any``) is compared with
every scope the run tested, and ``run_scope`` says which one its status comes from.

A published association's ``status`` for one run model:

- ``reproduced``: the run's cell is significant (BY-adjusted p < 0.05 and lift >= 2);
- ``missed``: the run tested it and did not find it: its attribute pair was not retained (attribute-level
  BH test or effect size), or the cell is not significant (``reason`` says which, and when only the lift
  rule, which the reference does not apply, failed);
- ``untested``: the run has no test of it: the model or scope is absent, the table was untestable (< 10
  known stories per value, see ``associations_power.parquet``), or the value was dropped from the table.

Run models are matched with published ones by name without the provider prefix (``storybias.evidence.
published.model_key``); when no run model matches any published one, every run model is compared (the
best status counts). The run's significant associations absent from the published ones of the same scope
(and, with matched names, the same model) are rows of status ``not_published``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pandas as pd
import pyarrow as pa

from storybias.evidence.published import KEY, model_key
from storybias.evidence.released_associations import ANY_SCOPE
from storybias.stages.associations.tables import ALPHA, MIN_LIFT

POOLED_MODELS = "(pooled over models)"  # the `model` of a human-study question: its list is in `models`

COMPARISON_SCHEMA = pa.schema(
    [
        ("source", pa.string()),  # questions | released | run (a not_published row)
        ("file", pa.string()),
        ("model", pa.string()),  # the published model (released), POOLED_MODELS (questions) or the run model
        ("models", pa.list_(pa.string())),  # the published models
        ("scope", pa.string()),  # the published scope: all, a language, or any (a human-study question)
        ("run_scope", pa.string()),  # the run's scope the status comes from (null when none was tested)
        *[(k, pa.string()) for k in KEY],
        ("published_fraction", pa.float64()),
        ("published_lift", pa.float64()),
        ("published_p_adjusted", pa.float64()),
        ("match", pa.string()),  # same_model (a run model's name is a published one's) | any_model
        ("status", pa.string()),  # reproduced | missed | untested | not_published
        ("reason", pa.string()),
        ("compared_models", pa.list_(pa.string())),  # the run models it was compared with
        ("reproduced_by", pa.list_(pa.string())),
        ("run_lift", pa.float64()),
        ("run_p_adjusted", pa.float64()),
    ]
)
COMPARISON_COLUMNS = COMPARISON_SCHEMA.names
STATUS_ORDER = ("reproduced", "missed", "untested", "not_published")


class _Outcome(NamedTuple):
    status: str
    reason: str
    lift: float
    p_adjusted: float
    scope: str | None = None


class _RunIndex(NamedTuple):
    """The run's tests looked up by (model, scope, base, compared[, values])."""

    pairs: dict[tuple[str, ...], bool]  # -> retained
    cells: dict[tuple[str, ...], tuple[bool, float, float]]  # -> (significant, lift, p_adjusted)
    models: list[str]
    scopes: list[str]


def _run_index(attributes: pd.DataFrame, values: pd.DataFrame) -> _RunIndex:
    pairs: dict[tuple[str, ...], bool] = {
        (r.model, r.scope, r.base_attribute, r.compared_attribute): bool(r.retained)
        for r in attributes.itertuples(index=False)
    }
    cells: dict[tuple[str, ...], tuple[bool, float, float]] = {
        (r.model, r.scope, *(getattr(r, k) for k in KEY)): (bool(r.significant), float(r.lift), float(r.p_adjusted))
        for r in values.itertuples(index=False)
    }
    models = sorted(set(attributes["model"]) | set(values["model"]))
    return _RunIndex(pairs, cells, models, sorted(set(attributes["scope"]) | set(values["scope"])))


def _cell_outcome(run: _RunIndex, model: str, scope: str, key: tuple[str, ...]) -> _Outcome:
    """One published association against one run model's tests in one scope."""
    nan = float("nan")
    retained = run.pairs.get((model, scope, key[0], key[2]))
    if retained is None:
        return _Outcome("untested", "no test of this attribute pair in this scope (untestable or absent)", nan, nan)
    if not retained:
        return _Outcome("missed", "attribute pair not retained (BH-adjusted p or effect size)", nan, nan, scope)
    cell = run.cells.get((model, scope, *key))
    if cell is None:
        return _Outcome("untested", "value not in the tested table (too few known stories)", nan, nan, scope)
    significant, lift, p_adjusted = cell
    if significant:
        return _Outcome("reproduced", "significant", lift, p_adjusted, scope)
    if p_adjusted < ALPHA:
        reason = f"significant but lift {lift:.2f} < {MIN_LIFT:g} (a rule the reference omits)"
        return _Outcome("missed", reason, lift, p_adjusted, scope)
    return _Outcome("missed", "cell not significant (BY-adjusted p)", lift, p_adjusted, scope)


def _eligible(published_models: list[str], run_models: list[str], same_model: bool) -> list[str]:
    if not same_model:
        return run_models
    keys = {model_key(m) for m in published_models}
    return [m for m in run_models if model_key(m) in keys]


def _compare_row(row: Any, run: _RunIndex, same_model: bool) -> dict[str, Any]:
    """A published association's best outcome over the run models it is compared with."""
    key = tuple(getattr(row, k) for k in KEY)
    models = _eligible(list(row.models), run.models, same_model)
    scopes = run.scopes if row.scope == ANY_SCOPE else [row.scope]
    outcomes = {(m, s): _cell_outcome(run, m, s, key) for m in models for s in scopes}
    reproducers = sorted({m for (m, _), o in outcomes.items() if o.status == "reproduced"})
    if outcomes:
        best = min(outcomes.values(), key=lambda o: STATUS_ORDER.index(o.status))
    else:
        best = _Outcome("untested", "the model is not in the run", float("nan"), float("nan"))
    return {
        "status": best.status,
        "reason": best.reason,
        "run_scope": best.scope,
        "compared_models": models,
        "reproduced_by": reproducers,
        "run_lift": best.lift,
        "run_p_adjusted": best.p_adjusted,
    }


def _listing(model: str, scope: str, key: tuple[str, ...], same_model: bool) -> tuple[str, ...]:
    """What makes an association "the same" as a published one: scope and key, and the model when names match."""
    return (model_key(model) if same_model else "", scope, *key)


def _not_published(
    published: pd.DataFrame, values: pd.DataFrame, same_model: bool, published_models: set[str]
) -> pd.DataFrame:
    """The run's significant cells in the published scopes that no published association names
    (``published_models``: the published models' ``model_key``s)."""
    scopes = set(published["scope"])
    sig = values[values["significant"].astype(bool)]
    if ANY_SCOPE not in scopes:
        sig = sig[sig["scope"].isin(scopes)]
    if same_model:
        sig = sig[[model_key(m) in published_models for m in sig["model"]]]
    listed = {
        _listing(m, row.scope, tuple(getattr(row, k) for k in KEY), same_model)
        for row in published.itertuples(index=False)
        for m in (row.models if same_model else [""])
    }
    mine = [
        all(
            _listing(r.model, scope, tuple(getattr(r, k) for k in KEY), same_model) not in listed
            for scope in (r.scope, ANY_SCOPE)
        )
        for r in sig.itertuples(index=False)
    ]
    rows = sig[mine]
    return pd.DataFrame(
        {
            "source": "run",
            "file": "",
            "model": rows["model"],
            "models": [[] for _ in range(len(rows))],
            "scope": rows["scope"],
            "run_scope": rows["scope"],
            **{k: rows[k] for k in KEY},
            "status": "not_published",
            "reason": "significant in the run, not among the published associations of this scope",
            "compared_models": [[m] for m in rows["model"]],
            "reproduced_by": [[] for _ in range(len(rows))],
            "run_lift": rows["lift"].astype(float),
            "run_p_adjusted": rows["p_adjusted"].astype(float),
        }
    )


def compare_published(published: pd.DataFrame, attributes: pd.DataFrame, values: pd.DataFrame) -> pd.DataFrame:
    """Every published association with its status against the run (``COMPARISON_COLUMNS``), then the
    run's significant associations that were not published. ``published``: ``load_associations``'s
    table; ``attributes`` / ``values``: ``associations_attributes`` / ``associations_values``."""
    if published.empty:
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    run = _run_index(attributes, values)
    published_models = {model_key(m) for ms in published["models"] for m in ms}
    same_model = any(model_key(m) in published_models for m in run.models)
    compared = pd.DataFrame(
        [_compare_row(row, run, same_model) for row in published.itertuples(index=False)],
        columns=["status", "reason", "run_scope", "compared_models", "reproduced_by", "run_lift", "run_p_adjusted"],
        index=published.index,
    )
    table = pd.concat([published, compared], axis=1)
    sources_models = zip(table["source"], table["models"], strict=True)
    table["model"] = [ms[0] if src == "released" else POOLED_MODELS for src, ms in sources_models]
    frames = [table, _not_published(published, values, same_model, published_models)]
    out = pd.concat([f for f in frames if len(f)], ignore_index=True).reindex(columns=COMPARISON_COLUMNS)
    out["match"] = "same_model" if same_model else "any_model"
    return out


def comparison_counts(comparison: pd.DataFrame, by: tuple[str, ...] = ("source", "model", "scope")) -> pd.DataFrame:
    """Per group of ``by`` (default: source, model and scope): how many published associations the run
    reproduces, misses and cannot test, how many of its significant ones were not published, and the
    reproduced share of the tested ones (reproduced / (reproduced + missed); NaN when none was tested)."""
    keys = list(by)
    if comparison.empty:
        return pd.DataFrame(columns=[*keys, *STATUS_ORDER, "reproduced_share"])
    counts = comparison.groupby([*keys, "status"]).size().unstack("status", fill_value=0)
    counts = counts.reindex(columns=list(STATUS_ORDER), fill_value=0).reset_index()
    counts.columns.name = None
    tested = counts["reproduced"] + counts["missed"]
    counts["reproduced_share"] = (counts["reproduced"] / tested.where(tested > 0)).astype(float)
    return counts
