"""Stage 04's comparison with the associations StereoTales published (``published_comparison.parquet``).

``associations.published`` names StereoTales' association files (``associations_global`` /
``associations_by_language`` JSONL, a file or a folder) or its human study's ``questions.json``
(``storybias.evidence.released_associations.load_associations``). Each published association (a cell:
base value x compared value of an attribute pair) is compared with the run's test of the same model and
scope, under two rules, each its own column:

- ``status``, the files' own rule: the released files record two decisions, the pair's BH test and the
  cell's BY test (``storybias.evidence.released_associations``). A published cell is ``reproduced`` when
  the run's same pair has BH-adjusted p < 0.05 and the same cell BY-adjusted p < 0.05, whatever the
  effect size and the lift; ``missed`` when the run tested it and did not find it (the pair not
  BH-significant, the cell not BY-significant, or the compared value never observed in the run's
  tested table) though its own table had 80 % power to see the published lift (``run_power``,
  ``cell_power.detection_power``), ``underpowered`` when it did not (a sampled run's small tables);
  ``untested`` when the run has no test of it (the model or scope is absent, the table
  was untestable, the base value had fewer than 10 known answers, or the run's pooled pass did not
  pool what the release's global pass pooled).
- ``status_stated``, StereoTales' stated rule (a medium or large effect and lift >= 2), for the published
  cells that meet it (``not_applicable`` for the others): ``reproduced`` when the run's pair is retained
  (medium or large) and its cell significant (BY-adjusted p < 0.05 and lift >= 2).

Scope ``all`` is compared only when the run's pooled pass pooled what the release's global pass pooled
(its ten languages, no ``additional_en`` prompt, no sample; ``PooledScope``); otherwise ``untested``
with that reason. Every other scope says in ``pool_difference`` how the stories it pooled differ from
the release's slice of that language (a subset of prompted attributes, a sample, the additional_en
variants). A human-study question (``questions.json``) names its models but no scope: it is counted once
per listed model in that model's pooled scope (``counted``), and the outcome in every other scope the
run tested is kept beside it (``counted`` false), so the table says which scope would have found it.

Run models are matched with published ones by name without the provider prefix (``storybias.evidence.
published.model_key``); when no run model matches any published one, every run model is compared, one
row each (``match`` any_model). The run's cells significant under the files' rule that no published
association of the same scope (and, with matched names, the same model) names are rows of status
``not_published``.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa

from storybias.evidence.released_associations import ANY_SCOPE, GLOBAL_SCOPE, STATED_EFFECTS
from storybias.evidence.stereotales_taxonomy import ASSOCIATION_KEY, model_key
from storybias.stages.associations.cell_power import POWER_TARGET, detection_power
from storybias.stages.associations.tables import ALPHA, MIN_LIFT

POOLED_MODELS = "(pooled over models)"  # the `model` of a question compared with every run model

COMPARISON_SCHEMA = pa.schema(
    [
        ("source", pa.string()),  # questions | released | run (a not_published row)
        ("file", pa.string()),
        ("model", pa.string()),  # the published model (POOLED_MODELS: a question compared with every run model)
        ("models", pa.list_(pa.string())),  # the published models
        ("scope", pa.string()),  # the published scope: all, a language, or any (a human-study question)
        ("run_model", pa.string()),  # the run model compared (null: the published model is not in the run)
        ("run_scope", pa.string()),  # the run's scope of this outcome
        ("counted", pa.bool_()),  # the outcome the counts use (a question's other scopes: false)
        *[(k, pa.string()) for k in ASSOCIATION_KEY],
        ("published_fraction", pa.float64()),
        ("published_lift", pa.float64()),
        ("published_p_adjusted", pa.float64()),
        ("published_effect", pa.string()),  # the published pair's effect category (null for questions)
        ("published_stated", pa.bool_()),  # the published cell meets StereoTales' stated rule
        ("match", pa.string()),  # same_model (a run model's name is a published one's) | any_model
        ("status", pa.string()),  # the files' rule: reproduced | missed | untested | not_published
        ("reason", pa.string()),
        ("status_stated", pa.string()),  # the stated rule: the same, or not_applicable
        ("reason_stated", pa.string()),
        ("run_pair_p_adjusted", pa.float64()),  # the run pair's BH-adjusted p
        ("run_effect", pa.string()),  # the run pair's effect category
        ("run_lift", pa.float64()),
        ("run_p_adjusted", pa.float64()),  # the run cell's BY-adjusted p
        ("run_stated", pa.bool_()),  # the run cell meets the stated rule (retained pair, p < 0.05, lift >= 2)
        ("run_power", pa.float64()),  # a cell not reproduced: the run table's power to see the published lift
        ("pool_difference", pa.string()),  # how the run's scope pooled other stories than the release's ("": same)
    ]
)
COMPARISON_COLUMNS = COMPARISON_SCHEMA.names
STATUS_ORDER = ("reproduced", "missed", "underpowered", "untested", "not_published")
STATUS_COLUMN = {"files": "status", "stated": "status_stated"}
NOT_APPLICABLE = "not_applicable"
NAN = float("nan")


class PooledScope(NamedTuple):
    """Whether the run's pooled pass (scope ``all``) pooled what the release's global pass pooled, and how
    the run's per-language scopes differ from the release's per-language slices (every story of the
    language: every prompted attribute, no sample, no additional_en variant)."""

    comparable: bool
    reason: str  # why not ("" when comparable)
    per_language: str = ""  # how every language scope differs ("" when it pooled what the release pooled)
    additional_en: str = ""  # how scope en differs besides (the additional_en variants)

    def difference(self, scope: str) -> str:
        """How the run's ``scope`` pooled other stories than the release's same slice ("" if it did not)."""
        if scope == GLOBAL_SCOPE:
            return self.reason
        return "; ".join(part for part in (self.per_language, self.additional_en if scope == "en" else "") if part)


def pooled_scope(run_pool: dict[str, Any], published_pool: dict[str, Any]) -> PooledScope:
    """Compare what the run's pooled pass pooled with what the published global pass pooled (each a
    ``RELEASE_POOL``-shaped dict: languages, additional_en, attributes, sample)."""
    problems = []
    if sorted(run_pool["languages"]) != sorted(published_pool["languages"]):
        mine, theirs = ", ".join(sorted(run_pool["languages"])) or "no language", ", ".join(published_pool["languages"])
        problems.append(f"pools {mine}, the published global pass {theirs}")
    if bool(run_pool["additional_en"]) != bool(published_pool["additional_en"]):
        pooled = "pools" if run_pool["additional_en"] else "leaves out"
        problems.append(f"{pooled} the additional_en prompt variants, the published global pass does not")
    per_language = []
    for key, what in (("attributes", "prompted attributes"), ("sample", "sample")):
        if run_pool[key] != published_pool[key]:
            mine, theirs = (pool[key] if pool[key] is not None else "all" for pool in (run_pool, published_pool))
            problems.append(f"pools {what} {mine}, the published global pass {theirs}")
            per_language.append(f"pools {what} {mine}, the published pass of the language {theirs}")
    en = ""
    if bool(run_pool["additional_en"]) != bool(published_pool["additional_en"]):
        en = f"{'pools' if run_pool['additional_en'] else 'leaves out'} the additional_en prompt variants"
    return PooledScope(
        not problems,
        "the run's pooled pass " + "; ".join(problems) if problems else "",
        "the run's per-language pass " + "; ".join(per_language) if per_language else "",
        en,
    )


class _Pair(NamedTuple):
    p_adjusted: float
    effect: str
    retained: bool
    rows: frozenset[str]
    cols: frozenset[str]
    table: dict[str, Any]  # the tested table (rows, cols, counts), for the power to see a published cell
    family_size: int  # the tables BH corrected over with this one


class _RunIndex(NamedTuple):
    """The run's tests looked up by (model, scope, base, compared[, values])."""

    pairs: dict[tuple[str, ...], _Pair]
    cells: dict[tuple[str, ...], tuple[float, float]]  # -> (BY-adjusted p, lift)
    scopes: dict[str, set[str]]  # model -> its tested scopes
    models: list[str]


def _run_index(attributes: pd.DataFrame, values: pd.DataFrame) -> _RunIndex:
    pairs: dict[tuple[str, ...], _Pair] = {}
    family = attributes.groupby(["model", "scope", "base_attribute"])["compared_attribute"].transform("size")
    for r, size in zip(attributes.itertuples(index=False), family):
        table = json.loads(r.table) if isinstance(r.table, str) else {"rows": [], "cols": []}
        pairs[(r.model, r.scope, r.base_attribute, r.compared_attribute)] = _Pair(
            float(r.p_adjusted),
            str(r.effect_size),
            bool(r.retained),
            frozenset(table["rows"]),
            frozenset(table["cols"]),
            table,
            int(size),
        )
    cells = {
        (r.model, r.scope, *(getattr(r, k) for k in ASSOCIATION_KEY)): (float(r.p_adjusted), float(r.lift))
        for r in values.itertuples(index=False)
    }
    scopes: dict[str, set[str]] = {}
    for model, scope in zip(attributes["model"], attributes["scope"]):
        scopes.setdefault(model, set()).add(scope)
    return _RunIndex(pairs, cells, scopes, sorted(set(attributes["model"]) | set(values["model"])))


class _Outcome(NamedTuple):
    status: str
    reason: str
    status_stated: str
    reason_stated: str
    pair_p: float = NAN
    effect: str | None = None
    lift: float = NAN
    p_adjusted: float = NAN
    stated: bool | None = None
    power: float = NAN  # files' rule power of the run's table to see the published effect (a non-reproduced cell)


def _power(pair: _Pair, key: tuple[str, ...], effect: tuple[float, float]) -> tuple[float, float]:
    """(files' rule, stated rule) power of the run's table of ``pair`` to see the published cell ``key``
    of published (lift, fraction) ``effect`` (``cell_power.detection_power``); NaN without counts."""
    counts = np.asarray(pair.table.get("counts") or [], np.int64)
    lift, fraction = effect
    if counts.ndim != 2 or counts.size == 0 or not (np.isfinite(lift) or np.isfinite(fraction)):
        return NAN, NAN
    cols = list(pair.table["cols"])
    if key[3] not in cols:  # the run never saw the published value: a column of zeros
        counts, cols = np.hstack([counts, np.zeros((len(counts), 1), np.int64)]), [*cols, key[3]]
    row = list(pair.table["rows"]).index(key[1])
    return detection_power(counts, row, cols.index(key[3]), lift, fraction, pair.family_size)


def _by_power(outcome: _Outcome, pair: _Pair, key: tuple[str, ...], effect: tuple[float, float]) -> _Outcome:
    """A cell the run did not reproduce: ``missed`` when its table had POWER_TARGET power to see the
    published effect, ``underpowered`` otherwise (each rule its own power), the power in the reason."""
    files, stated = _power(pair, key, effect)
    if not np.isfinite(files):
        return outcome._replace(reason=f"{outcome.reason}; power unknown (the run's table has no counts)")

    def relabel(status: str, reason: str, power: float) -> tuple[str, str]:
        if status != "missed":
            return status, reason
        label = "missed" if power >= POWER_TARGET else "underpowered"
        return label, f"{reason}; power {power:.0%} to see the published lift with the run's table"

    status, reason = relabel(outcome.status, outcome.reason, files)
    stated_status, stated_reason = relabel(outcome.status_stated, outcome.reason_stated, stated)
    return outcome._replace(
        status=status, reason=reason, status_stated=stated_status, reason_stated=stated_reason, power=files
    )


def _untested(reason: str, stated: bool) -> _Outcome:
    return _Outcome("untested", reason, "untested" if stated else NOT_APPLICABLE, reason if stated else "")


def _stated_outcome(pair: _Pair, cell: tuple[float, float]) -> tuple[str, str]:
    """The stated rule on a run cell whose pair is BH-significant."""
    p_adjusted, lift = cell
    if not pair.retained:
        return "missed", f"the pair's effect is {pair.effect} (the stated rule keeps medium or large)"
    if p_adjusted >= ALPHA:
        return "missed", f"cell not BY-significant (p = {p_adjusted:.3g})"
    if lift < MIN_LIFT:
        return "missed", f"lift {lift:.2f} < {MIN_LIFT:g}"
    return "reproduced", "retained pair, significant cell, lift >= 2"


def cell_outcome(
    run: _RunIndex,
    model: str,
    scope: str,
    key: tuple[str, ...],
    stated: bool,
    pooled: PooledScope,
    effect: tuple[float, float] = (NAN, NAN),
) -> _Outcome:
    """One published cell (``key``) against one run model's test in one scope, under both rules;
    ``stated``: the published cell meets the stated rule (else its stated status is not_applicable);
    ``effect``: its published (lift, fraction), for the power that tells missed from underpowered."""
    outcome = _tested_outcome(run, model, scope, key, stated, pooled)
    pair = run.pairs.get((model, scope, key[0], key[2]))
    if pair is None or "missed" not in (outcome.status, outcome.status_stated):
        return outcome
    return _by_power(outcome, pair, key, effect)


def _tested_outcome(
    run: _RunIndex, model: str, scope: str, key: tuple[str, ...], stated: bool, pooled: PooledScope
) -> _Outcome:
    """``cell_outcome`` before the power: reproduced, missed or untested."""
    if scope == GLOBAL_SCOPE and not pooled.comparable:
        return _untested(pooled.reason, stated)
    pair = run.pairs.get((model, scope, key[0], key[2]))
    if pair is None:
        if scope not in run.scopes.get(model, set()):
            return _untested(f"the run has no test of this model in scope {scope}", stated)
        return _untested("the run's table of this pair was untestable (see associations_power)", stated)
    if key[1] not in pair.rows:
        return _untested("the base value had fewer than 10 known answers in the run's table", stated)
    pair_p, effect = pair.p_adjusted, pair.effect
    if pair.p_adjusted >= ALPHA:
        reason = f"attribute pair not BH-significant (p = {pair.p_adjusted:.3g})"
        return _Outcome("missed", reason, *_stated_miss(reason, stated), pair_p=pair_p, effect=effect)
    if key[3] not in pair.cols:
        reason = "never observed in the tested table"
        return _Outcome("missed", reason, *_stated_miss(reason, stated), pair_p=pair_p, effect=effect)
    by_p, lift = run.cells[(model, scope, *key)]
    if by_p < ALPHA:
        status, reason = "reproduced", "BH-significant pair, BY-significant cell"
    else:
        status, reason = "missed", f"cell not BY-significant (p = {by_p:.3g})"
    stated_status, stated_reason = _stated_outcome(pair, (by_p, lift)) if stated else (NOT_APPLICABLE, "")
    run_stated = pair.retained and by_p < ALPHA and lift >= MIN_LIFT
    return _Outcome(
        status, reason, stated_status, stated_reason, pair_p, effect, lift=lift, p_adjusted=by_p, stated=run_stated
    )


def _stated_miss(reason: str, stated: bool) -> tuple[str, str]:
    """The stated rule's status and reason when the files' rule already missed the cell."""
    return ("missed", reason) if stated else (NOT_APPLICABLE, "")


def _published_stated(published: pd.DataFrame) -> pd.Series:
    """Whether each published cell meets StereoTales' stated rule: its pair's effect medium or large (a
    question's list was drawn with the rule, so only its lift is checked) and its lift >= 2."""
    effect_ok = published["published_effect"].isna() | published["published_effect"].isin(STATED_EFFECTS)
    return effect_ok & (published["published_lift"].astype(float) >= MIN_LIFT)


def _compared_models(
    published_models: list[str], run_models: list[str], same_model: bool
) -> list[tuple[str, str | None]]:
    """(published model label, run model or None) pairs to compare one published association with."""
    if not same_model:
        return [(published_models[0] if len(published_models) == 1 else POOLED_MODELS, m) for m in run_models]
    out: list[tuple[str, str | None]] = []
    for name in published_models:
        mine = [m for m in run_models if model_key(m) == model_key(name)]
        out.extend((name, m) for m in mine) if mine else out.append((name, None))
    return out


def _rows_of(row: Any, run: _RunIndex, same_model: bool, pooled: PooledScope) -> list[dict[str, Any]]:
    """Every outcome row of one published association: one per compared run model, and for a question
    (scope any) one per scope that model was tested in, its pooled scope the counted one."""
    key = tuple(getattr(row, k) for k in ASSOCIATION_KEY)
    stated = bool(row.published_stated)
    home = GLOBAL_SCOPE if row.scope == ANY_SCOPE else row.scope
    out = []
    for label, run_model in _compared_models(list(row.models), run.models, same_model):
        if run_model is None:
            out.append(_outcome_row(row, label, None, home, _untested("the model is not in the run", stated), True))
            continue
        scopes = [home]
        if row.scope == ANY_SCOPE:
            scopes += sorted(run.scopes.get(run_model, set()) - {GLOBAL_SCOPE})
        effect = (float(row.published_lift), float(row.published_fraction))
        for scope in scopes:
            outcome = cell_outcome(run, run_model, scope, key, stated, pooled, effect)
            out.append(_outcome_row(row, label, run_model, scope, outcome, counted=scope == home))
    return out


def _outcome_row(row: Any, label: str, run_model: str | None, scope: str, o: _Outcome, counted: bool) -> dict[str, Any]:
    return {
        **{c: getattr(row, c) for c in ("source", "file", "models", "scope", *ASSOCIATION_KEY)},
        **{c: getattr(row, c) for c in ("published_fraction", "published_lift", "published_p_adjusted")},
        "published_effect": row.published_effect,
        "published_stated": bool(row.published_stated),
        "model": label,
        "run_model": run_model,
        "run_scope": scope if run_model is not None else None,
        "counted": counted,
        "status": o.status,
        "reason": o.reason,
        "status_stated": o.status_stated,
        "reason_stated": o.reason_stated,
        "run_pair_p_adjusted": o.pair_p,
        "run_effect": o.effect,
        "run_lift": o.lift,
        "run_p_adjusted": o.p_adjusted,
        "run_stated": o.stated,
        "run_power": o.power,
        "pool_difference": None,
    }


def _pair_keys(attributes: pd.DataFrame, mask: pd.Series) -> set[tuple[str, ...]]:
    return {
        tuple(k) for k in attributes.loc[mask, ["model", "scope", "base_attribute", "compared_attribute"]].to_numpy()
    }


def _unlisted(published: pd.DataFrame, cells: pd.DataFrame, same_model: bool, any_scope: bool) -> list[bool]:
    """Which run cells no published association names (same scope unless ``any_scope``; same model key
    when ``same_model``)."""

    def where(model: str, scope: str) -> tuple[str, str]:
        return (model_key(model) if same_model else "", "" if any_scope else scope)

    listed = {
        (*where(m, r.scope), *(getattr(r, k) for k in ASSOCIATION_KEY))
        for r in published.itertuples(index=False)
        for m in (r.models if same_model else [""])
    }
    return [
        (*where(r.model, r.scope), *(getattr(r, k) for k in ASSOCIATION_KEY)) not in listed
        for r in cells.itertuples(index=False)
    ]


def _not_published(
    published: pd.DataFrame, values: pd.DataFrame, attributes: pd.DataFrame, same_model: bool, pooled: PooledScope
) -> pd.DataFrame:
    """The run's cells significant under the files' rule (BH-significant pair, BY-significant cell) that no
    published association names: for released files, of the same scope (the files' scopes); for a
    question list, which names no scope, in any scope the run tested; with matched names, of the same
    model. Scope all only where the pooled passes are comparable."""
    any_scope = bool((published["scope"] == ANY_SCOPE).any())
    scopes = set(values["scope"]) if any_scope else set(published["scope"])
    if not pooled.comparable:
        scopes.discard(GLOBAL_SCOPE)
    pair_ok = _pair_keys(attributes, attributes["p_adjusted"] < ALPHA)
    retained = _pair_keys(attributes, attributes["retained"].astype(bool))
    cells = values[values["scope"].isin(scopes) & (values["p_adjusted"].astype(float) < ALPHA)]
    pair_of = list(zip(cells["model"], cells["scope"], cells["base_attribute"], cells["compared_attribute"]))
    cells = cells[np.array([k in pair_ok for k in pair_of], dtype=bool)]
    if same_model:
        published_keys = {model_key(m) for ms in published["models"] for m in ms}
        cells = cells[np.array([model_key(m) in published_keys for m in cells["model"]], dtype=bool)]
    rows = cells[np.array(_unlisted(published, cells, same_model, any_scope), dtype=bool)]
    with_lift = zip(rows["model"], rows["scope"], rows["base_attribute"], rows["compared_attribute"], rows["lift"])
    stated = [(m, s, b, c) in retained and lift >= MIN_LIFT for m, s, b, c, lift in with_lift]
    reason = "significant in the run (files' rule), not among the published associations" + (
        "" if any_scope else " of this scope"
    )
    return pd.DataFrame(
        {
            "source": "run",
            "file": "",
            "model": rows["model"],
            "models": [[] for _ in range(len(rows))],
            "scope": rows["scope"],
            "run_model": rows["model"],
            "run_scope": rows["scope"],
            "counted": True,
            **{k: rows[k] for k in ASSOCIATION_KEY},
            "published_stated": False,
            "status": "not_published",
            "reason": reason,
            "status_stated": ["not_published" if s else NOT_APPLICABLE for s in stated],
            "reason_stated": [reason if s else "" for s in stated],
            "run_lift": rows["lift"].astype(float),
            "run_p_adjusted": rows["p_adjusted"].astype(float),
            "run_stated": stated,
        }
    )


def compare_published(
    published: pd.DataFrame, attributes: pd.DataFrame, values: pd.DataFrame, pooled: PooledScope
) -> pd.DataFrame:
    """Every published association with its outcomes against the run under both rules
    (``COMPARISON_COLUMNS``), then the run's significant associations that were not published.
    ``published``: ``load_associations``'s table; ``attributes`` / ``values``: associations_attributes /
    associations_values; ``pooled``: whether scope all may be compared."""
    if published.empty:
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    run = _run_index(attributes, values)
    published = published.assign(published_stated=_published_stated(published))
    published_models = {model_key(m) for ms in published["models"] for m in ms}
    same_model = any(model_key(m) in published_models for m in run.models)
    rows = [r for row in published.itertuples(index=False) for r in _rows_of(row, run, same_model, pooled)]
    frames = [pd.DataFrame(rows), _not_published(published, values, attributes, same_model, pooled)]
    out = pd.concat([f for f in frames if len(f)], ignore_index=True).reindex(columns=COMPARISON_COLUMNS)
    out["match"] = "same_model" if same_model else "any_model"
    out["pool_difference"] = [pooled.difference(s if isinstance(s, str) else GLOBAL_SCOPE) for s in out["run_scope"]]
    return out


def comparison_counts(
    comparison: pd.DataFrame, by: tuple[str, ...] = ("source", "model", "run_model", "scope"), rule: str = "files"
) -> pd.DataFrame:
    """Per group of ``by``, over the counted rows: how many published associations the run reproduces,
    misses, could not see (underpowered) and cannot test, how many of its significant ones were not
    published, and the reproduced share of the tested ones its tables could see (reproduced / (reproduced
    + missed), underpowered cells left out; NaN when none), under the
    files' rule (``rule`` files) or StereoTales' stated rule (``stated``; not_applicable rows left out)."""
    keys = list(by)
    columns = [*keys, *STATUS_ORDER, "reproduced_share"]
    if comparison.empty:
        return pd.DataFrame(columns=columns)
    status = STATUS_COLUMN[rule]
    counted = comparison[comparison["counted"].astype(bool) & (comparison[status] != NOT_APPLICABLE)]
    if counted.empty:
        return pd.DataFrame(columns=columns)
    counts = counted.groupby([*keys, status], dropna=False).size().unstack(status, fill_value=0)
    counts = counts.reindex(columns=list(STATUS_ORDER), fill_value=0).reset_index()
    counts.columns.name = None
    tested = counts["reproduced"] + counts["missed"]
    counts["reproduced_share"] = (counts["reproduced"] / tested.where(tested > 0)).astype(float)
    return counts[columns]


def pair_agreement(released_pairs: pd.DataFrame, attributes: pd.DataFrame) -> dict[str, Any]:
    """The released files' tested pairs against the run's same pairs (same model name, scope and
    attributes): how many the run tested, how many share the BH decision, and how many have the released
    BH-adjusted p-value to the last digit (a re-test of the released data with ``associations.fisher:
    reference`` must give every one)."""
    if released_pairs.empty or attributes.empty:
        return {"released_pairs": int(len(released_pairs)), "tested_by_run": 0}
    run = attributes.assign(_key=attributes["model"].map(model_key))
    mine = released_pairs.assign(_key=released_pairs["model"].map(model_key)).merge(
        run, on=["_key", "scope", "base_attribute", "compared_attribute"], suffixes=("_published", "")
    )
    published_p, run_p = mine["p_adjusted_published"].to_numpy(float), mine["p_adjusted"].to_numpy(float)
    return {
        "released_pairs": int(len(released_pairs)),
        "tested_by_run": int(len(mine)),
        "same_bh_decision": int(((published_p < ALPHA) == (run_p < ALPHA)).sum()),
        "identical_p_adjusted": int((published_p == run_p).sum()),
        "max_abs_p_difference": float(np.abs(published_p - run_p).max()) if len(mine) else None,
    }
