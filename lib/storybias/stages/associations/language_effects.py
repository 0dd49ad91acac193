"""StereoTales' finding 3 as a test of difference: does a harmful association's strength differ between the
prompt's languages?

StereoTales (*StereoTales: A Multilingual Framework for Open-Ended Stereotype Discovery in LLMs*, Le Jeune
et al., arXiv:2605.10442) finds that harmful associations do not simply carry over from English but adapt
to the prompt's language. Per model and harmful association (prompted value a of base attribute A,
compared value b of dimension B), each language's per-language pass tested the cleaned A x B table
(``associations_attributes.table``); the association's 2 x 2 table in a language is {a, not a} x {b, not b}
of that table, the "not a" rows being the prompted values every compared language kept (so that each
language's odds ratio compares a with the same values). Each language gets its log odds ratio with a Woolf
interval and its difference from the reference language (English where the run has it); the association
gets Breslow-Day's test (Tarone's correction) that its odds ratio is the same in every language
(``storybias.stats.heterogeneity``), and Benjamini-Hochberg over the harmful associations decides which
differ. The test reads counts, never significance flags.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from storybias.evidence.released_associations import GLOBAL_SCOPE
from storybias.evidence.stereotales_taxonomy import ASSOCIATION_KEY
from storybias.stats.heterogeneity import difference_interval, equal_odds_p, log_odds_ratio
from storybias.stats.multiple_testing import adjust

FDR_Q = 0.05
REFERENCE_LANGUAGE = "en"
EFFECT_COLUMNS = ["model", *ASSOCIATION_KEY, "language", "reference", "n", "count", "row_total", "col_total",
                  "log_or", "log_or_low", "log_or_high", "diff_from_reference", "diff_low", "diff_high"]  # fmt: skip
TEST_COLUMNS = ["model", *ASSOCIATION_KEY, "harm_panel", "n_languages", "languages", "missing",
                "p_equal_odds", "p_bh", "differs"]  # fmt: skip
PAIR = ["model", "base_attribute", "compared_attribute"]


def _tables_by_language(attributes: pd.DataFrame) -> dict[tuple[str, str, str], dict[str, dict]]:
    """(model, base attribute, compared attribute) -> language -> the tested table (rows, cols, counts)."""
    languages = attributes[attributes["scope"] != GLOBAL_SCOPE] if len(attributes) else attributes
    out: dict[tuple[str, str, str], dict[str, dict]] = {}
    for r in languages[[*PAIR, "scope", "table"]].itertuples(index=False):
        if isinstance(r.table, str) and r.table:
            out.setdefault((r.model, r.base_attribute, r.compared_attribute), {})[r.scope] = json.loads(r.table)
    return out


def association_strata(tables: dict[str, dict], base_value: str, compared_value: str) -> tuple[dict, list[str]]:
    """language -> 2 x 2 table [[a & b, a & not b], [not a & b, not a & not b]] for every language whose
    table kept the row ``base_value``, over the rows all of them kept (a column the table lacks counts 0);
    and, per language left out, why (the n that is missing)."""
    kept = {lang: t for lang, t in tables.items() if str(base_value) in t["rows"]}
    missing = [f"{lang}: row {base_value} has < 10 known answers" for lang in sorted(set(tables) - set(kept))]
    common = set.intersection(*(set(t["rows"]) for t in kept.values())) if kept else set()
    strata = {}
    for language, table in sorted(kept.items()):
        counts = np.asarray(table["counts"], np.int64)
        rows = [i for i, row in enumerate(table["rows"]) if row in common]
        counts = counts[rows]
        a = [table["rows"][i] for i in rows].index(str(base_value))
        column = (
            counts[:, table["cols"].index(str(compared_value))]
            if str(compared_value) in table["cols"]
            else 0 * counts[:, 0]
        )
        ab, a_total, b_total, n = int(column[a]), int(counts[a].sum()), int(column.sum()), int(counts.sum())
        strata[language] = np.array([[ab, a_total - ab], [b_total - ab, n - a_total - b_total + ab]])
    return strata, missing


def _effect_rows(model: str, key: tuple, strata: dict[str, np.ndarray]) -> list[dict]:
    """One row per language: counts, log odds ratio with its interval, difference from the reference."""
    reference = REFERENCE_LANGUAGE if REFERENCE_LANGUAGE in strata else (min(strata) if strata else "")
    estimates = {lang: log_odds_ratio(t) for lang, t in strata.items()}
    ref_estimate, _, _, ref_variance = estimates.get(reference, (np.nan,) * 4)
    rows = []
    for language, table in strata.items():
        estimate, low, high, variance = estimates[language]
        difference = difference_interval(estimate, variance, ref_estimate, ref_variance)
        rows.append({"model": model, **dict(zip(ASSOCIATION_KEY, key)), "language": language,
                     "reference": reference, "n": int(table.sum()), "count": int(table[0, 0]),
                     "row_total": int(table[0].sum()), "col_total": int(table[:, 0].sum()),
                     "log_or": estimate, "log_or_low": low, "log_or_high": high,
                     "diff_from_reference": difference[0] if language != reference else 0.0,
                     "diff_low": difference[1] if language != reference else np.nan,
                     "diff_high": difference[2] if language != reference else np.nan})  # fmt: skip
    return rows


def differs_at_fdr(p_values: np.ndarray, q: float = FDR_Q) -> tuple[np.ndarray, np.ndarray]:
    """Benjamini-Hochberg over the associations tested (NaN: not tested, left out): adjusted p-values (NaN
    where untested) and which differ across languages at FDR ``q``. Finding 3 holds when any does."""
    p_bh = np.full(len(p_values), np.nan)
    tested = np.isfinite(p_values)
    if tested.any():
        p_bh[tested] = adjust(p_values[tested], "fdr_bh")
    return p_bh, np.nan_to_num(p_bh, nan=1.0) < q


def language_heterogeneity(attributes: pd.DataFrame, harmful: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per model x harmful association (``harmful``: model, the association key, harm_panel): each language's
    strength (``EFFECT_COLUMNS``) and the test that it is the same in every language (``TEST_COLUMNS``:
    Breslow-Day-Tarone p, BH-adjusted over the associations tested, ``differs`` at FDR ``FDR_Q``; ``missing``
    says which languages had no table for it and why)."""
    tables = _tables_by_language(attributes)
    languages = attributes[attributes["scope"] != GLOBAL_SCOPE] if len(attributes) else attributes
    passes = languages.groupby("model")["scope"].agg(set).to_dict() if len(languages) else {}
    effects, tests = [], []
    for r in harmful[["model", *ASSOCIATION_KEY, "harm_panel"]].drop_duplicates().itertuples(index=False):
        key = (r.base_attribute, r.base_value, r.compared_attribute, r.compared_value)
        by_language = tables.get((r.model, r.base_attribute, r.compared_attribute), {})
        strata, missing = association_strata(by_language, r.base_value, r.compared_value)
        untested = sorted(passes.get(r.model, set()) - set(by_language))
        missing += [f"{lang}: no testable {r.base_attribute} x {r.compared_attribute} table" for lang in untested]
        effects += _effect_rows(r.model, key, strata)
        p = equal_odds_p(np.array(list(strata.values()))) if len(strata) >= 2 else np.nan
        tests.append({"model": r.model, **dict(zip(ASSOCIATION_KEY, key)), "harm_panel": r.harm_panel,
                      "n_languages": len(strata), "languages": ", ".join(strata), "missing": "; ".join(missing),
                      "p_equal_odds": p})  # fmt: skip
    test_table = pd.DataFrame(tests, columns=TEST_COLUMNS[:-2])
    test_table["p_bh"], test_table["differs"] = differs_at_fdr(test_table["p_equal_odds"].to_numpy(float))
    return pd.DataFrame(effects, columns=EFFECT_COLUMNS), test_table[TEST_COLUMNS]


def _why_untested(tests: pd.DataFrame) -> str:
    """What n is missing: per harmful association not tested, the languages with its table and why others lack it."""
    untested = tests[tests["p_equal_odds"].isna()]
    parts = [
        f"{r.base_value} -> {r.compared_value} ({r.model}): table in {r.languages or 'no language'}"
        + (f"; {r.missing}" if r.missing else "; no count in a cell of the pooled 2 x 2 table")
        for r in untested.head(3).itertuples(index=False)
    ]
    more = f" and {len(untested) - 3} more" if len(untested) > 3 else ""
    return "; ".join(parts) + more


def finding_3(tests: pd.DataFrame, panel: str, per_language: bool) -> dict:
    """Finding 3 stated from ``language_heterogeneity``'s tests: holds when at least one harmful association's
    odds ratio differs across languages at FDR ``FDR_Q``; does not hold when associations were tested and
    none differs; not stated (with the missing n) when none could be tested."""
    if not per_language:
        return {"holds": None, "text": "not stated: the run has no per-language pass"}
    if tests.empty:
        return {"holds": None, "text": f"not stated: no significant association rated harmful by the {panel}"}
    tested = tests[tests["p_equal_odds"].notna()]
    if tested.empty:
        return {"holds": None, "text": "not stated: no harmful association (rated by the "
                f"{panel}) has a testable table in two languages ({_why_untested(tests)})"}  # fmt: skip
    differ = tested[tested["differs"].astype(bool)]
    smallest = tested.sort_values("p_bh").iloc[0]
    where = (
        f"{smallest.base_value} -> {smallest.compared_value} ({smallest.model}), BH-adjusted p = {smallest.p_bh:.3g}"
    )
    untested = f"; {len(tests) - len(tested)} not tested ({_why_untested(tests)})" if len(tested) < len(tests) else ""
    verdict = "holds" if len(differ) else "does not hold"
    return {
        "holds": bool(len(differ)),
        "text": f"{verdict}: {len(differ)} of {len(tested)} harmful associations (rated by the {panel}) differ in "
        f"strength across languages (Breslow-Day-Tarone test of equal odds ratios, Benjamini-Hochberg at FDR "
        f"{FDR_Q}; smallest: {where}){untested}",
    }
