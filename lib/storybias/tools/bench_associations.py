"""``make bench-associations``: stage 04's association tests at paper scale (650,000 synthetic stories,
23 models, 10 languages, 19 dimensions): wall and CPU time of the global and the per-language pass
(target <= 10 minutes together), peak memory, how each table got its p-value, and a check of the
decisions against the 500,000-resample Monte-Carlo Fisher test on a stratified sample of tables.

Run by hand (timings are reported, not asserted by tests); ``storybias.tools.bench`` re-exports its
public names next to the other benchmarks.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from storybias.core import paths
from storybias.core.io import write_json_atomic
from storybias.core.machine import available_cores
from storybias.stages.associations.tables import (
    ALPHA,
    Table,
    contingency,
    in_release_order,
    map_tasks,
    run_pass,
    value_level,
)
from storybias.stages.extract import answers as extract
from storybias.stats.contingency import (
    BOYETT_PILOT_RESAMPLES,
    MC_CHUNK,
    PILOT_RESAMPLES,
    TABLE_ERROR,
    cramers_v_corrected,
    fisher_reference_p,
    g_test,
)
from storybias.stats.effect_sizes import effect_size
from storybias.stats.multiple_testing import adjust, bh_thresholds

LANGUAGES = ("en", "fr", "es", "it", "pt", "ru", "zh", "ja", "ko", "ar")


def _planted_logits(
    rng: np.random.Generator, n_models: int, n_languages: int, n_pairs: int, k: int, own_pairs: np.ndarray
) -> np.ndarray:
    """Logits of one dimension's k values for every model x language x prompted pair: a marginal tilt
    per dimension and per model x language (normal, sd 0.6 and 0.4), plus planted associations, each
    raising one value's odds by a factor U(2, 6): shared stereotypes (12 % of pairs, carried by each
    model with probability 0.7, strength x U(0.6, 1.4)), model-specific (3 %) and model x
    language-specific (1 %) ones. Pairs of the dimension itself (``own_pairs``) get neither."""
    logits = np.zeros((n_models, n_languages, n_pairs, k), np.float32)
    logits += rng.normal(0, 0.6, k).astype(np.float32)
    logits += rng.normal(0, 0.4, (n_models, n_languages, 1, k)).astype(np.float32)

    def boost(mask: np.ndarray) -> np.ndarray:
        """log U(2, 6) on one random value where ``mask``: mask.shape x k."""
        target = rng.integers(k, size=mask.shape)
        out = np.zeros((*mask.shape, k), np.float32)
        strength = np.log(rng.uniform(2, 6, mask.shape)) * mask
        np.put_along_axis(out, target[..., None], strength[..., None].astype(np.float32), axis=-1)
        return out

    shared = boost(rng.random(n_pairs) < 0.12)  # pairs x k
    carried = (rng.random((n_models, n_pairs)) < 0.7) * rng.uniform(0.6, 1.4, (n_models, n_pairs))
    logits += (shared[None] * carried[..., None])[:, None]
    logits += boost(rng.random((n_models, n_pairs)) < 0.03)[:, None]
    logits += boost(rng.random((n_models, n_languages, n_pairs)) < 0.01)
    logits[:, :, own_pairs] = 0
    return logits


def synthetic_extractions(
    n_stories: int = 650_000, n_models: int = 23, languages: Sequence[str] = LANGUAGES, seed: int = 42
) -> pd.DataFrame:
    """A stereotales extraction table at any scale, built with vectorised numpy draws (seconds at
    paper scale): columns ``model``, ``language``, ``cond_attribute``, ``cond_value`` and
    ``demo_<dim>`` for the design's 19 dimensions, all categoricals (one byte per cell).

    Each story fixes one of the design's 79 (dimension, value) pairs, uniformly (the prompt grid is
    79 pairs x 36 scenarios per language). Its own dimension's column repeats the prompted value (90 %)
    or is ``unknown``; every other dimension is ``unknown`` with a per model x dimension share
    (about 30-60 %), ``other`` with 4 % where the design allows it, else one of the design's values drawn
    from softmax(logits) of ``_planted_logits``.
    """
    rng = np.random.default_rng(seed)
    dims = extract.dimensions()
    names = list(dims)
    pairs = [(d, v) for d, values in dims.items() for v in values]
    pair_dim = np.array([names.index(d) for d, _ in pairs])
    cond_values = sorted({v for _, v in pairs})
    pair_value = np.array([cond_values.index(v) for _, v in pairs])
    pair_local = np.array([dims[d].index(v) for d, v in pairs])  # the value's index within its dimension
    n_lang = len(languages)
    model = rng.integers(n_models, size=n_stories)
    language = rng.integers(n_lang, size=n_stories)
    pair = rng.integers(len(pairs), size=n_stories)
    columns: dict[str, Any] = {
        "model": pd.Categorical.from_codes(model, [f"model_{i:02d}" for i in range(n_models)]),
        "language": pd.Categorical.from_codes(language, list(languages)),
        "cond_attribute": pd.Categorical.from_codes(pair_dim[pair], names),
        "cond_value": pd.Categorical.from_codes(pair_value[pair], cond_values),
    }
    for b, (dim, values) in enumerate(dims.items()):
        categories = extract.allowed_values(dim)  # the values, then "other" where allowed, then "unknown"
        k = len(values)
        logits = _planted_logits(rng, n_models, n_lang, len(pairs), k, np.flatnonzero(pair_dim == b))
        row_logits = logits.reshape(-1, k)[(model * n_lang + language) * len(pairs) + pair]
        # Gumbel-max: argmax(logits + Gumbel noise) is one draw from softmax(logits)
        codes = np.argmax(row_logits + rng.gumbel(size=row_logits.shape).astype(np.float32), axis=1)
        unknown_share = np.clip(rng.uniform(0.3, 0.6) + rng.normal(0, 0.05, n_models), 0.25, 0.65)
        u = rng.random(n_stories)
        codes[u < unknown_share[model]] = categories.index("unknown")
        if "other" in categories:
            codes[(u >= unknown_share[model]) & (u < unknown_share[model] + 0.04)] = categories.index("other")
        own = pair_dim[pair] == b
        codes[own] = np.where(rng.random(int(own.sum())) < 0.9, pair_local[pair[own]], categories.index("unknown"))
        columns[f"demo_{dim}"] = pd.Categorical.from_codes(codes.astype(np.int8), categories)
    return pd.DataFrame(columns)


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children (the pass's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _method_counts(methods: pd.Series, max_resamples: int) -> dict[str, int]:
    """How many tables got each kind of p-value: none without resamples (the sequential test decides
    nothing from the G test), a pilot Monte-Carlo stage, part of the reference stream, or all of it
    (then the p-value is the reference's)."""
    resamples = methods.str.extract(r"\((\d+)\)")[0].astype(float).fillna(0).astype(int)
    pilots = {size for size in (*PILOT_RESAMPLES, *BOYETT_PILOT_RESAMPLES) if size < max_resamples}
    return {
        "no_resamples": int((resamples == 0).sum()),
        "monte_carlo_pilot": int(resamples.isin(pilots).sum()),
        "monte_carlo_sequential": int(((resamples > 0) & ~resamples.isin(pilots) & (resamples < max_resamples)).sum()),
        "monte_carlo_full": int((resamples >= max_resamples).sum()),
        "resamples_total": int(resamples.sum()),
    }


def _threshold_distance(attrs: pd.DataFrame) -> pd.Series:
    """Per tested pair: min_k |log10(p / t_k)|, its distance to the nearest BH threshold t_k = k/m alpha
    of its family (m = the family's size)."""
    m = attrs.groupby(["model", "scope", "base_attribute"])["p_value"].transform("size").to_numpy()
    p = attrs["p_value"].to_numpy(float)
    out = np.empty(len(attrs))
    for size in np.unique(m):
        rows = m == size
        thresholds = np.asarray(bh_thresholds(int(size)))
        out[rows] = np.abs(np.log10(p[rows, None] / thresholds[None, :])).min(1)
    return pd.Series(out, index=attrs.index)


def _reference_sample(attrs: pd.DataFrame, n: int, max_resamples: int, rng: np.random.Generator) -> pd.DataFrame:
    """``n`` tested pairs for the reference check, stratified towards the decisions at risk, each
    stratum the pairs closest to a threshold of their family: Monte-Carlo p-values that stopped early
    on the reference's own stream (35 %) and in the pilot stages (30 %); then p-values that drew every
    resample (10 %, the reference itself) and random pairs (the rest)."""
    attrs = attrs.assign(distance=_threshold_distance(attrs))
    resamples = attrs["p_method"].str.extract(r"\((\d+)\)")[0].astype(float).fillna(0)
    pilot = resamples.isin([size for size in (*PILOT_RESAMPLES, *BOYETT_PILOT_RESAMPLES) if size < max_resamples])
    quotas = {
        "near_monte_carlo_sequential": round(0.35 * n),
        "near_monte_carlo_pilot": round(0.30 * n),
        "full_monte_carlo": round(0.10 * n),
    }
    quotas["random"] = 0  # the rest, including what a short stratum could not fill
    pools = {
        "near_monte_carlo_sequential": (resamples > 0) & ~pilot & (resamples < max_resamples),
        "near_monte_carlo_pilot": pilot,
        "full_monte_carlo": resamples >= max_resamples,
    }
    picked: list[pd.DataFrame] = []
    taken = pd.Series(False, index=attrs.index)
    for stratum, quota in quotas.items():
        pool = attrs[~taken & pools.get(stratum, True)]
        if stratum == "random":
            quota = n - int(taken.sum())
        if stratum in ("random", "full_monte_carlo"):
            chosen = pool.iloc[rng.permutation(len(pool))[:quota]]
        else:  # the closest to a threshold, ties broken at random
            chosen = pool.iloc[rng.permutation(len(pool))].sort_values("distance", kind="stable").head(quota)
        taken[chosen.index] = True
        picked.append(chosen.assign(stratum=stratum))
    return pd.concat(picked)


def _stories(data: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    """The stories behind one tested pair's family: its model, scope and base attribute."""
    mask = (data["model"] == row["model"]) & (data["cond_attribute"] == row["base_attribute"])
    if row["scope"] != "all":
        mask &= data["language"] == row["scope"]
    return data[mask]


def _reference_p(job: tuple[np.ndarray, int, int]) -> tuple[float, int, float]:
    """(the reference p-value, its count of null tables at most as probable, seconds it took)."""
    table, resamples, seed = job
    started = time.time()
    p = fisher_reference_p(table, resamples, seed)
    return p, round(p * (resamples + 1)) - 1, time.time() - started


REFERENCE_RESAMPLES = 500_000


def _decisions(family: pd.DataFrame, tables: dict[str, pd.DataFrame]) -> tuple[set, set, set]:
    """BH-significant pairs, retained pairs and significant value cells of one family from its p-values
    (the steps of ``analyse_family`` after the p-values)."""
    p_adjusted = adjust(family["p_value"], "fdr_bh")
    significant, retained, cells = set(), set(), set()
    for other, p in zip(family["compared_attribute"], p_adjusted):
        if p >= ALPHA:
            continue
        significant.add(other)
        counts = tables[other].to_numpy()
        if effect_size(cramers_v_corrected(counts), *counts.shape) in ("medium", "large"):
            retained.add(other)
            sig = value_level(tables[other])
            sig = sig[sig["significant"]]
            cells |= {(other, a, b) for a, b in zip(sig["base_value"], sig["compared_value"])}
    return significant, retained, cells


_FAMILY_KEY = ["pass", "model", "scope", "base_attribute"]  # one BH family of tested pairs


def _reference_check(
    data: pd.DataFrame, attrs: pd.DataFrame, n_reference: int, max_resamples: int, seed: int, n_jobs: int | None, log
) -> dict[str, Any]:
    """Recompute a stratified sample of tested pairs (``_reference_sample``) with the reference, the
    Monte-Carlo Fisher test with ``max_resamples`` (500,000) resamples seeded ``seed`` as the passes
    were, and redo each one's family decisions (BH, retained pairs, significant value cells) with the
    reference p-value in place of ours. Every disagreement counts: the reference's p-value is the one
    the sequential test promises to decide as, wherever it lies."""
    started = time.time()
    sample = _reference_sample(attrs, n_reference, max_resamples, np.random.default_rng(seed))
    family_of = attrs.groupby(_FAMILY_KEY, observed=True).groups  # (pass, model, scope, base) -> row labels
    families, tables = _sample_tables(data, attrs, sample, family_of)
    references = map_tasks(_reference_p, [(t, max_resamples, seed) for t in tables], [t.size for t in tables], n_jobs)
    rows = []
    for (idx, row), table, (p_ref, count, _) in zip(sample.iterrows(), tables, references):
        key = tuple(row[_FAMILY_KEY])
        rows.append(
            _checked_row(idx, row, attrs.loc[family_of[key]], families[key], table, p_ref, count, max_resamples)
        )
    result = _check_summary(pd.DataFrame(rows), max_resamples)
    result["seconds"] = round(time.time() - started, 1)
    result["reference_seconds_per_table"] = _seconds_per_table(sample, [r[2] for r in references], attrs)
    result["tables"] = rows
    log(
        f"reference check: {result['checked']} tables in {result['seconds']:.0f} s: {result['agreements']} agree, "
        f"{result['disagreements']} disagree"
    )
    return result


def _seconds_per_table(sample: pd.DataFrame, seconds: list[float], attrs: pd.DataFrame) -> dict[str, Any]:
    """The reference test's cost, measured on the sampled tables of the random stratum (the others are
    chosen by their p-value, which does not set the cost: the table's size does), and what it would
    cost on every table of the passes on one core."""
    random = np.asarray(seconds)[(sample["stratum"] == "random").to_numpy()]
    if not len(random):
        return {"n": 0}
    mean = float(random.mean())
    return {
        "n": int(len(random)),
        "mean": round(mean, 3),
        "max": round(float(random.max()), 3),
        "all_tables_one_core_hours": round(mean * len(attrs) / 3600, 1),
    }


def _release_ordered(frame: pd.DataFrame, row: pd.Series, other: str) -> pd.DataFrame:
    """A contingency frame in the order the stage tests it (``in_release_order``)."""
    table = Table(frame.to_numpy(np.int64), list(frame.index), list(frame.columns))
    return in_release_order(table, row["base_attribute"], other).frame()


def _sample_tables(
    data: pd.DataFrame, attrs: pd.DataFrame, sample: pd.DataFrame, family_of: Any
) -> tuple[dict[tuple, dict[str, pd.DataFrame]], list[np.ndarray]]:
    """The contingency tables of every family a sampled pair belongs to (by family key, then compared
    attribute), and each sampled pair's own table, in the sample's order."""
    families: dict[tuple, dict[str, pd.DataFrame]] = {}
    tables = []
    for _, row in sample.iterrows():
        key = tuple(row[_FAMILY_KEY])
        if key not in families:
            stories = _stories(data, row)
            families[key] = {
                other: _release_ordered(contingency(stories["cond_value"], stories[f"demo_{other}"]), row, other)
                for other in attrs.loc[family_of[key], "compared_attribute"]
            }
        tables.append(families[key][row["compared_attribute"]].to_numpy())
    return families, tables


def _checked_row(
    idx: Any,
    row: pd.Series,
    family: pd.DataFrame,
    family_tables: dict[str, pd.DataFrame],
    table: np.ndarray,
    p_ref: float,
    count: int,
    max_resamples: int,
) -> dict[str, Any]:
    """One sampled pair checked: its family's decisions with our p-value and with the reference's
    in its place, and whether they agree."""
    ours = _decisions(family, family_tables)
    consistent = ours[1] == set(family.loc[family["retained"].astype(bool), "compared_attribute"])
    swapped = family.assign(p_value=np.where(family.index == idx, p_ref, family["p_value"]))
    theirs = _decisions(swapped, family_tables)
    agree = ours == theirs
    return {
        "stratum": row["stratum"],
        "pass": row["pass"],
        "model": row["model"],
        "scope": row["scope"],
        "base_attribute": row["base_attribute"],
        "compared_attribute": row["compared_attribute"],
        "shape": list(table.shape),
        "n": int(table.sum()),
        "sparse": bool(g_test(table)[2]),
        "p_method": row["p_method"],
        "p_value": float(row["p_value"]),
        "p_reference": p_ref,
        "reference_count": count,
        "same_p": bool(p_ref == row["p_value"]),
        "agree": bool(agree),
        "recomputed_matches_run": bool(consistent),
    }


def _check_summary(checked: pd.DataFrame, max_resamples: int) -> dict[str, Any]:
    """The reference check's counts: agreements and disagreements (none excused), per stratum."""
    return {
        "checked": len(checked),
        "agreements": int(checked["agree"].sum()),
        "disagreements": int((~checked["agree"]).sum()),
        "by_stratum": {
            stratum: {"checked": len(group), "agreements": int(group["agree"].sum())}
            for stratum, group in checked.groupby("stratum")
        },
        "identical_p_values": int(checked["same_p"].sum()),
        "recomputed_decisions_match_run": bool(checked["recomputed_matches_run"].all()),
    }


def bench_associations(
    n_stories: int = 650_000,
    n_models: int = 23,
    n_languages: int = 10,
    n_reference: int = 100,
    seed: int = 42,
    n_jobs: int | None = None,
    max_resamples: int = REFERENCE_RESAMPLES,
    log=print,
) -> dict[str, Any]:
    """Stage 04's association tests at paper scale on ``synthetic_extractions``: the global and the
    per-language pass (``run_pass``), timed (wall and CPU seconds), with peak memory (maxrss of this
    process and of its largest worker), the number of tables and how each got its p-value; then the
    reference check (``_reference_check``). Written to data/bench/bench_associations.json."""
    if not 1 <= n_languages <= len(LANGUAGES):
        raise ValueError(f"n_languages must be 1-{len(LANGUAGES)}")
    jobs = available_cores() if n_jobs is None else n_jobs
    load_start = os.getloadavg()
    started = time.time()
    data = synthetic_extractions(n_stories, n_models, LANGUAGES[:n_languages], seed)
    generate_seconds = time.time() - started
    log(
        f"bench-associations: {n_stories:,} synthetic stories, {n_models} models, {n_languages} languages "
        f"({generate_seconds:.1f} s to build); {jobs} worker process(es); load average {load_start[0]:.2f}"
    )
    passes, attrs = timed_passes(data, seed, max_resamples, n_jobs, log, fisher="sequential")
    total = passes["global"]["seconds"] + passes["per_language"]["seconds"]
    rss = {
        "self_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "largest_child_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
    }
    log(
        f"  both passes: {total:.1f} s (target <= 600 s); peak RSS {rss['self_mb']:.0f} MB (main), "
        f"{rss['largest_child_mb']:.0f} MB (largest worker)"
    )
    check = _reference_check(data, attrs, n_reference, max_resamples, seed, n_jobs, log) if n_reference else {}
    if check.get("reference_seconds_per_table", {}).get("n"):
        cost = check["reference_seconds_per_table"]
        log(
            f"  associations.fisher: reference (the default) would take {cost['mean']:.2f} s a table on average "
            f"({cost['n']} random tables): about {cost['all_tables_one_core_hours']:.0f} core-hours for "
            f"{len(attrs):,} tables, against {total:.0f} s for associations.fisher: sequential on {jobs} cores"
        )
    result = {
        "n_stories": n_stories,
        "n_models": n_models,
        "languages": list(LANGUAGES[:n_languages]),
        "seed": seed,
        "n_jobs": jobs,
        "cpu_count": os.cpu_count(),
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "generate_seconds": round(generate_seconds, 1),
        "passes": passes,
        "total_seconds": round(total, 1),
        "target_seconds": 600,
        "meets_target": total <= 600,
        "peak_rss": rss,
        "fisher": "sequential",
        "decision_rule": _decision_rule(max_resamples),
        "reference_check": check,
    }
    out = paths.data_root() / "bench" / "bench_associations.json"
    write_json_atomic(result, out)
    log(f"written to {out}")
    return result


def timed_passes(
    data: pd.DataFrame, seed: int, max_resamples: int, n_jobs: int | None, log, fisher: str = "sequential"
) -> tuple[dict[str, Any], pd.DataFrame]:
    """The global and the per-language pass (``run_pass``) on ``data``, each timed: (per pass its wall
    and CPU seconds, tables, significant and retained pairs, value cells and p-value methods; every
    pass's attribute-level tests with a ``pass`` column). The benchmarks time ``associations.fisher:
    sequential``, the option for paper scale on a laptop; the reference method's cost is measured per
    table by ``bench_associations``' reference check."""
    dimensions = list(extract.dimensions())
    passes: dict[str, Any] = {}
    frames = []
    for name, by_language in (("global", False), ("per_language", True)):
        wall, cpu = time.time(), _cpu_seconds()
        attrs, values = run_pass(
            data, dimensions, by_language, seed=seed, max_resamples=max_resamples, n_jobs=n_jobs, fisher=fisher
        )
        wall, cpu = time.time() - wall, _cpu_seconds() - cpu
        passes[name] = {
            "seconds": round(wall, 1),
            "cpu_seconds": round(cpu, 1),
            "tables": len(attrs),
            "significant_pairs": int((attrs["p_adjusted"] < ALPHA).sum()),
            "retained_pairs": int(attrs["retained"].sum()),
            "value_cells_tested": len(values),
            "significant_values": int(values["significant"].astype(bool).sum()),
            "p_methods": _method_counts(attrs["p_method"], max_resamples),
        }
        log(
            f"  {name}: {len(attrs):,} tables in {wall:.1f} s ({cpu:.0f} CPU s); {passes[name]['retained_pairs']:,} "
            f"retained, {passes[name]['significant_values']:,} significant values; "
            f"p-values: {passes[name]['p_methods']}"
        )
        frames.append(attrs.assign(**{"pass": name}))
    return passes, pd.concat(frames, ignore_index=True)


def _decision_rule(max_resamples: int) -> dict[str, Any]:
    """The sequential Fisher test's settings the timings were measured with."""
    return {
        "table_error": TABLE_ERROR,
        "pilot_resamples": list(PILOT_RESAMPLES),
        "boyett_pilot_resamples": list(BOYETT_PILOT_RESAMPLES),
        "chunk": MC_CHUNK,
        "max_resamples": max_resamples,
    }
