"""StereoTales' finding 3 as a test of difference across languages (issue #57, item 2): each harmful
association's log odds ratio per language, Breslow-Day-Tarone's test of equal odds ratios on the counts
and Benjamini-Hochberg across associations; its level under a null where every language shares the same
effects, at the per-language table sizes of the default profile and of stereotales-three-lenses, and its
power against a planted language-specific association."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from storybias.stages.associations.findings import finding_statements, findings_table, harmful_associations
from storybias.stages.associations.language_effects import (
    FDR_Q,
    association_strata,
    differs_at_fdr,
    finding_3,
    language_heterogeneity,
)
from storybias.stats.heterogeneity import equal_odds_p

VALUES = ["man", "non_binary", "woman"]
FIELDS = ["arts", "care", "stem", "trades"]
# P(compared value | prompted value), shared by every language under the null: woman -> care and
# man -> stem three times as likely as for non_binary (lift about 2 in the pooled table)
SHARED_EFFECTS = np.array([[0.1, 0.1, 0.6, 0.2], [0.25, 0.25, 0.25, 0.25], [0.15, 0.6, 0.05, 0.2]])


def _attribute_rows(model: str, counts_by_language: dict[str, np.ndarray]) -> list[dict]:
    """associations_attributes rows as stage 04 writes them: rows with < 10 known answers and empty columns dropped."""
    rows = []
    for language, counts in counts_by_language.items():
        keep = counts.sum(1) >= 10
        kept = counts[keep]
        if keep.sum() < 2:
            continue
        cols = kept.sum(0) > 0
        table = {"rows": [v for v, k in zip(VALUES, keep) if k], "cols": [f for f, c in zip(FIELDS, cols) if c],
                 "counts": kept[:, cols].tolist()}  # fmt: skip
        pair = {"base_attribute": "gender", "compared_attribute": "professional_field", "retained": True}
        rows.append({"model": model, "scope": language, **pair, "table": json.dumps(table)})
    return rows


def _every_cell_harmful(model: str = "m") -> pd.DataFrame:
    """Every association of the table rated harmful (the worst case for the number of tests)."""
    return pd.DataFrame([{"model": model, "base_attribute": "gender", "base_value": v,
                          "compared_attribute": "professional_field", "compared_value": f, "harm_panel": "llm_judges"}
                         for v in VALUES for f in FIELDS])  # fmt: skip


def _tables(counts_by_language: dict[str, np.ndarray]) -> dict[str, dict]:
    """The tested tables of one model's per-language passes, as ``association_strata`` reads them."""
    rows = _attribute_rows("m", counts_by_language)
    return {r["scope"]: json.loads(r["table"]) for r in rows}


def _simulate(n_datasets: int, languages: list[str], per_value: int, known: float, effects: np.ndarray, seed: int):
    """How many datasets finding 3 'holds' in, and how many had a test (every cell of the table harmful).
    ``effects``: languages x prompted values x compared values; each prompted value has ``per_value`` stories
    in each language, of which Binomial(per_value, known) have a known compared value. Runs what
    ``language_heterogeneity`` runs (strata, test, BH, decision) without its frames, to stay fast."""
    rng = np.random.default_rng(seed)
    holds = stated = 0
    for _ in range(n_datasets):
        known_rows = rng.binomial(per_value, known, size=(len(languages), len(VALUES)))
        draws = rng.multinomial(known_rows, effects)  # languages x values x fields
        tables = _tables(dict(zip(languages, draws)))
        p = []
        for value in VALUES:
            for field in FIELDS:
                strata, _ = association_strata(tables, value, field)
                p.append(equal_odds_p(np.array(list(strata.values()))) if len(strata) >= 2 else np.nan)
        _, differs = differs_at_fdr(np.array(p))
        holds += bool(differs.any())
        stated += bool(np.isfinite(p).any())
    return holds, stated


DEFAULT = (["en", "fr", "zh"], 36, 0.37)  # params/default.yaml: 36 stories per prompted value, ~37% known
THREE_LENSES = (["de", "en", "es", "fr", "hi", "it", "ja", "pt", "ru", "zh"], 30, 0.5)  # 30 per value, 0.5 known


def test_finding_3_holds_its_level_when_every_language_shares_the_same_effects():
    for languages, per_value, known in (DEFAULT, THREE_LENSES):
        effects = np.broadcast_to(SHARED_EFFECTS, (len(languages), *SHARED_EFFECTS.shape))
        holds, stated = _simulate(500, languages, per_value, known, effects, seed=57)
        assert stated >= 450  # nearly every dataset has a table in two languages
        rate, interval = holds / 500, binomtest(holds, 500).proportion_ci(method="exact")
        print(f"{len(languages)} languages, {per_value} per value: holds in {holds} of 500 "
              f"({rate:.1%}, 95% CI {interval.low:.1%}-{interval.high:.1%}); stated in {stated}")  # fmt: skip
        assert rate <= 0.06


def test_finding_3_sees_an_association_planted_in_one_language():
    for languages, per_value, known in (DEFAULT, THREE_LENSES):
        effects = np.repeat(SHARED_EFFECTS[None], len(languages), axis=0)
        # in French only, women's stories turn from care to the arts: the association adapts to the language
        effects[languages.index("fr"), 2] = [0.6, 0.15, 0.05, 0.2]
        holds, _ = _simulate(200, languages, per_value, known, effects, seed=58)
        print(f"{len(languages)} languages, {per_value} per value: power {holds / 200:.0%} ({holds} of 200)")
        assert holds / 200 >= 0.2  # measured: 33% (default), 26% (three lenses): one language among 12 tests


def test_finding_3_reads_the_counts_not_which_language_flagged_it():
    """Woman -> care with the same counts in en and fr, flagged significant in fr only (the old rule counted it
    as language-specific and said 'holds'); then the same association reversed in fr."""
    same = np.array([[4, 2, 8, 2], [4, 4, 4, 4], [1, 10, 1, 2]])
    attributes = pd.DataFrame(_attribute_rows("a", {"en": same, "fr": same}))
    values = pd.DataFrame([{"model": "a", "scope": "fr", "base_attribute": "gender", "base_value": "woman",
                            "compared_attribute": "professional_field", "compared_value": "care",
                            "significant": True}])  # fmt: skip
    shared = pd.DataFrame([{"scope": "fr", "base_attribute": "gender", "base_value": "woman",
                            "compared_attribute": "professional_field", "compared_value": "care",
                            "median_harm": 5.0, "harmful": True}])  # fmt: skip
    data = pd.DataFrame({"model": "a", "language": ["en"] * 48 + ["fr"] * 48})
    harmful = harmful_associations(values, shared, None)
    effects, tests = language_heterogeneity(attributes, harmful)
    assert effects["language"].tolist() == ["en", "fr"] and (effects["reference"] == "en").all()
    assert effects["diff_from_reference"].tolist() == [0.0, 0.0]
    assert tests["p_equal_odds"].iloc[0] > 0.9 and not tests["differs"].iloc[0]
    table = findings_table(data, attributes, values, shared, ["per_language"])
    statement = finding_statements(table, tests)["finding_3_language_specific_harm"]
    assert statement["holds"] is False and statement["text"].startswith("does not hold: 0 of 1 harmful")
    assert "LLM judges" in statement["text"] and f"FDR {FDR_Q}" in statement["text"]
    # the old flag rule, on the same counts: 1 of 1 significant in one language only
    assert table.set_index("scope").loc["fr", "n_harmful_only_here"] == 1
    reversed_fr = np.array([[4, 2, 8, 2], [4, 4, 4, 4], [12, 0, 1, 1]])
    _, tests = language_heterogeneity(pd.DataFrame(_attribute_rows("a", {"en": same, "fr": reversed_fr})), harmful)
    assert tests["differs"].iloc[0]
    assert finding_statements(table, tests)["finding_3_language_specific_harm"]["holds"] is True


def test_finding_3_says_which_n_is_missing_when_it_cannot_test():
    small_fr = np.array([[4, 2, 8, 2], [4, 4, 4, 4], [1, 3, 1, 2]])  # woman: 7 known answers in fr
    attributes = pd.DataFrame(_attribute_rows("a", {"en": np.array([[4, 2, 8, 2], [4, 4, 4, 4], [1, 10, 1, 2]]),
                                                    "fr": small_fr}))  # fmt: skip
    harmful = _every_cell_harmful("a")
    harmful = harmful[harmful["base_value"] == "woman"].head(1)
    effects, tests = language_heterogeneity(attributes, harmful)
    assert tests["n_languages"].tolist() == [1] and np.isnan(tests["p_equal_odds"].iloc[0])
    statement = finding_3(tests, "human panel", per_language=True)
    assert statement["holds"] is None and "fr: row woman has < 10 known answers" in statement["text"]
    assert finding_3(tests, "human panel", per_language=False)["text"] == "not stated: the run has no per-language pass"
    # a language whose pass tested other tables but not this pair says so
    other_pair = pd.DataFrame([{"model": "a", "scope": "zh", "base_attribute": "gender", "compared_attribute": "age",
                                "retained": False, "table": ""}])  # fmt: skip
    _, tests = language_heterogeneity(pd.concat([attributes, other_pair], ignore_index=True), harmful)
    assert "zh: no testable gender x professional_field table" in tests["missing"].iloc[0]
