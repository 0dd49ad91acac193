"""StereoTales' headline findings from a run's counts (issue #41, item 6): per model and language scope,
the tables tested, the significant associations and those rated harmful, with n; findings 1 and 3
stated, or what is missing to state them."""

from __future__ import annotations

import pandas as pd

from storybias.stages.associations.findings import FINDINGS_COLUMNS, finding_statements, findings_table

KEY = ["base_attribute", "base_value", "compared_attribute", "compared_value"]


def _data(models=("a", "b"), languages=("en", "fr"), n=30):
    rows = [{"model": m, "language": lang} for m in models for lang in languages for _ in range(n)]
    return pd.DataFrame(rows).assign(cond_attribute="gender")


def _values(rows):
    """Significant cells: (model, scope, base value, compared value)."""
    return pd.DataFrame(
        [
            {"model": m, "scope": s, "base_attribute": "gender", "base_value": b,
             "compared_attribute": "professional_field", "compared_value": c, "significant": True}
            for m, s, b, c in rows
        ]
    )  # fmt: skip


def _attributes(models=("a", "b"), scopes=("all", "en", "fr")):
    return pd.DataFrame(
        [{"model": m, "scope": s, "retained": True} for m in models for s in scopes]
        + [{"model": m, "scope": s, "retained": False} for m in models for s in scopes]
    )


def _shared(rows):
    """Rated associations: (scope, base value, compared value, median harm)."""
    return pd.DataFrame(
        [
            {"scope": s, "base_attribute": "gender", "base_value": b, "compared_attribute": "professional_field",
             "compared_value": c, "median_harm": h, "harmful": h >= 4}
            for s, b, c, h in rows
        ]
    )  # fmt: skip


def test_every_model_produces_harmful_stereotypes_is_stated_from_the_pooled_counts():
    values = _values([("a", "all", "woman", "care"), ("a", "all", "man", "stem"), ("b", "all", "woman", "care")])
    shared = _shared([("all", "woman", "care", 4.5), ("all", "man", "stem", 2.0)])
    table = findings_table(_data(), _attributes(), values, shared, ["global", "per_language"])
    assert list(table.columns) == FINDINGS_COLUMNS
    pooled = table[table["scope"] == "all"].set_index("model")
    counts = ["n_stories", "n_tables", "n_retained", "n_significant", "n_rated", "n_harmful"]
    assert pooled.loc["a", counts].tolist() == [60, 2, 1, 2, 2, 1]
    assert pooled.loc["b", "n_harmful"] == 1 and pd.isna(pooled.loc["b", "n_harmful_only_here"])
    statement = finding_statements(table)["finding_1_every_model_harmful"]
    assert statement["holds"] is True and "all 2 models" in statement["text"] and "(n = 60)" in statement["text"]
    # a model without a harmful association: the finding does not hold; unrated ones: it cannot be stated
    no_b = findings_table(_data(), _attributes(), values[values["model"] == "a"], shared, ["global"])
    assert finding_statements(no_b)["finding_1_every_model_harmful"]["holds"] is False
    unrated = findings_table(_data(), _attributes(), values, shared.iloc[1:], ["global"])
    assert finding_statements(unrated)["finding_1_every_model_harmful"]["holds"] is None


def test_the_per_language_counts_of_associations_significant_in_one_language_only():
    values = _values(
        [
            ("a", "en", "woman", "care"),  # harmful in en and fr: not language-specific
            ("a", "fr", "woman", "care"),
            ("a", "fr", "man", "arts"),  # harmful, French only
            ("b", "fr", "man", "arts"),  # harmful, French only for b
            ("b", "en", "man", "stem"),  # rated not harmful
        ]
    )
    shared = _shared(
        [
            ("en", "woman", "care", 4.0),
            ("fr", "woman", "care", 5.0),
            ("fr", "man", "arts", 4.0),
            ("en", "man", "stem", 1),
        ]
    )
    table = findings_table(_data(), _attributes(), values, shared, ["per_language"]).set_index(["model", "scope"])
    assert table.loc[("a", "fr"), ["n_significant", "n_harmful", "n_harmful_only_here"]].tolist() == [2, 2, 1]
    assert table.loc[("a", "en"), "n_harmful_only_here"] == 0 and table.loc[("b", "fr"), "n_harmful_only_here"] == 1
    assert "all" not in table.index.get_level_values("scope")
    assert (table["harm_panel"] == "llm_judges").all()


def test_nothing_to_state_without_significant_associations():
    empty = pd.DataFrame(columns=["model", "scope", *KEY, "significant"])
    table = findings_table(_data(), _attributes(), empty, _shared([]), ["global", "per_language"])
    assert (table["n_significant"] == 0).all() and (table["n_stories"] > 0).all()
    statements = finding_statements(table)
    assert statements["finding_1_every_model_harmful"]["holds"] is False
    assert statements["finding_3_language_specific_harm"]["holds"] is None


# --- finding 1: the human panel when its ratings are given (issue #57, item 3) ---------------------


def _human(rows):
    """The human panel's rating summary: (base value, compared value, median harm)."""
    return pd.DataFrame(
        [
            {"association_id": f"gender|{b}|professional_field|{c}", "median_harm": h, "harmful": h >= 4}
            for b, c, h in rows
        ]
    )


def test_finding_1_reads_the_human_panel_when_its_ratings_are_given_and_names_it():
    values = _values([("a", "all", "woman", "care"), ("b", "all", "man", "stem")])
    llm = _shared([("all", "woman", "care", 5.0), ("all", "man", "stem", 5.0)])  # the judges: both harmful
    human = _human([("woman", "care", 4.5), ("man", "stem", 2.0)])  # the panel: only a's
    table = findings_table(_data(), _attributes(), values, llm, ["global"], human)
    assert (table["harm_panel"] == "human").all()
    assert table.set_index("model")["n_harmful"].to_dict() == {"a": 1, "b": 0}
    statement = finding_statements(table)["finding_1_every_model_harmful"]
    assert statement["holds"] is False and "human panel" in statement["text"]
    judges = finding_statements(findings_table(_data(), _attributes(), values, llm, ["global"]))
    assert judges["finding_1_every_model_harmful"]["holds"] is True
    assert "LLM judges" in judges["finding_1_every_model_harmful"]["text"]


def test_finding_1_is_not_stated_only_for_models_without_a_harmful_association_that_have_unrated_ones():
    models = ("a", "b", "c")
    values = _values([("a", "all", "woman", "care"), ("a", "all", "man", "arts"), ("b", "all", "man", "stem"),
                      ("c", "all", "woman", "arts")])  # fmt: skip
    # a: one harmful and one unrated; b: none harmful, all rated; c: none rated
    shared = _shared([("all", "woman", "care", 4.5), ("all", "man", "stem", 1.0)])
    table = findings_table(_data(models), _attributes(models), values, shared, ["global"])
    statement = finding_statements(table)["finding_1_every_model_harmful"]
    assert statement["holds"] is False and "none of the significant associations of b" in statement["text"]
    # b and c both lack a harmful association and have unrated ones: it cannot be stated
    unrated = findings_table(_data(models), _attributes(models), values, shared.iloc[:1], ["global"])
    statement = finding_statements(unrated)["finding_1_every_model_harmful"]
    assert statement["holds"] is None and "(b, c)" in statement["text"]


def test_the_findings_figure_names_the_panel_that_rated_harm():
    from storybias.stages.figures.findings import headline_findings

    values = _values([("a", "all", "woman", "care"), ("b", "all", "man", "stem")])
    llm = _shared([("all", "woman", "care", 5.0), ("all", "man", "stem", 5.0)])
    human = _human([("woman", "care", 4.5), ("man", "stem", 2.0)])
    for panel, rated_by in ((human, "the human panel's"), (None, "the LLM judges'")):
        fig, stats = headline_findings(findings_table(_data(), _attributes(), values, llm, ["global"], panel))
        assert rated_by in fig._suptitle.get_text().replace("\n", " ")
    assert stats["n_models_harmful"] == 2
