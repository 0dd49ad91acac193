"""StereoTales' headline findings as a table a run can check (``associations_findings.parquet``).

StereoTales (*StereoTales: A Multilingual Framework for Open-Ended Stereotype Discovery in LLMs*, Le Jeune
et al., arXiv:2605.10442) states, among its findings, that (1) every model it evaluated produces harmful
stereotypes in open-ended stories, and (3) harmful associations are not carried over from English but
adapt to the prompt's language. Finding 1 rests on counts per generator model and scope: the tables
tested, the significant associations (its stated rule: a retained pair of medium or large effect, a cell
with BY-adjusted p < 0.05 and lift >= 2), and those rated harmful by its panel rule (median harm >= 4 on
the 1-5 scale). Harm is the human panel's when ``associations.human_ratings`` is given (the study defines
harm by its human panel, and reports that LLM judges under-rate socio-economic and over-rate gender
harm), the LLM judges' otherwise; every table and sentence names the panel (``harm_panel``).

:func:`findings_table` gives those counts with their n (stories analysed) per model x scope;
:func:`finding_statements` says whether each finding holds on the run, or which count is missing to
state it (an association the panel did not rate is not counted as harmless). Finding 3 is a test of
difference across languages, not a count of flags (``storybias.stages.associations.language_effects``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa

from storybias.evidence.released_associations import GLOBAL_SCOPE
from storybias.evidence.stereotales_taxonomy import ASSOCIATION_KEY
from storybias.stages.associations.language_effects import TEST_COLUMNS, finding_3

FINDINGS_SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("scope", pa.string()),  # all (languages pooled) or a language
        ("n_stories", pa.int64()),  # parsed stereotales stories of the model in the scope
        ("n_tables", pa.int64()),  # attribute pairs tested
        ("n_retained", pa.int64()),  # pairs of medium or large effect among the BH-significant ones
        ("n_significant", pa.int64()),  # significant associations (the stated rule)
        ("n_rated", pa.int64()),  # of those, rated by the panel (harm_panel)
        ("n_harmful", pa.int64()),  # of those, the panel's median harm >= 4
        # a language's harmful ones significant in no other language (null for all): a count, not a test
        ("n_harmful_only_here", pa.int64()),
        ("harm_panel", pa.string()),  # who rated harm: human (associations.human_ratings) or llm_judges
    ]
)
FINDINGS_COLUMNS = FINDINGS_SCHEMA.names


def _stories(data: pd.DataFrame, passes: list[str]) -> pd.DataFrame:
    """Analysed stories per model x scope, for the passes the run made."""
    frames = []
    if "global" in passes:
        frames.append(data.groupby("model").size().rename("n_stories").reset_index().assign(scope=GLOBAL_SCOPE))
    if "per_language" in passes:
        by_language = data.groupby(["model", "language"]).size().rename("n_stories").reset_index()
        frames.append(by_language.rename(columns={"language": "scope"}))
    if not frames:
        return pd.DataFrame(columns=["model", "scope", "n_stories"])
    return pd.concat(frames, ignore_index=True)[["model", "scope", "n_stories"]]


def _only_here(significant: pd.DataFrame) -> pd.Series:
    """Per significant language-scope row: no other language scope of the same model has it significant."""
    languages = significant[significant["scope"] != GLOBAL_SCOPE]
    count = languages.groupby(["model", *ASSOCIATION_KEY])["scope"].transform("nunique")
    return (count == 1).reindex(significant.index, fill_value=False)


PANEL_TEXT = {"human": "human panel", "llm_judges": "LLM judges"}


def harm_panel(human: pd.DataFrame | None) -> str:
    """Whose ratings define harm: the human panel when its ratings are given (StereoTales defines harm by
    its human panel), the LLM judges otherwise."""
    return "llm_judges" if human is None else "human"


def rated_significant(values: pd.DataFrame, shared: pd.DataFrame, human: pd.DataFrame | None) -> pd.DataFrame:
    """The significant cells of ``values`` with ``rated`` and ``harmful`` by the panel (``harm_panel``): the
    human ratings' summary (``human.rating_summary``: association_id, median_harm, harmful; one rating
    per association, whatever the scope) when given, else the judges' (associations_shared, per scope)."""
    significant = values[values["significant"].astype(bool)] if len(values) else values
    ids = ["|".join(map(str, k)) for k in significant[ASSOCIATION_KEY].itertuples(index=False)]
    harm: dict[str, bool] = {}
    if human is not None:
        rated = human[human["median_harm"].notna()]
        harm = dict(zip(rated["association_id"].astype(str), rated["harmful"].astype(bool)))
    elif "median_harm" in shared:  # the judges rated each scope's associations: keyed "<scope>|<association id>"
        rated = shared[shared["median_harm"].notna()]
        keys = rated[["scope", *ASSOCIATION_KEY]].astype(str).agg("|".join, axis=1) if len(rated) else []
        harm = dict(zip(keys, rated["harmful"].astype(bool)))
        ids = [f"{scope}|{i}" for scope, i in zip(significant["scope"], ids)]
    return significant.assign(
        rated=[i in harm for i in ids], harmful=[harm.get(i, False) for i in ids], harm_panel=harm_panel(human)
    )


def findings_table(
    data: pd.DataFrame,
    attributes: pd.DataFrame,
    values: pd.DataFrame,
    shared: pd.DataFrame,
    passes: list[str],
    human: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per model x scope (``FINDINGS_COLUMNS``): stories, tables tested, retained pairs, significant
    associations, how many the panel rated and rated harmful (``harm_panel``: ``human`` when ``human``, the
    human ratings' ``rating_summary``, is given, else ``llm_judges``: associations_shared's ``median_harm``
    and ``harmful``), and, in a language scope, how many harmful ones are significant in that language
    only (a count, not a test: finding 3 reads ``language_effects``). ``data``: stage 04's observations."""
    out = _stories(data, passes)
    cell = ["model", "scope"]
    if not attributes.empty:
        tested = attributes.groupby(cell).agg(n_tables=("retained", "size"), n_retained=("retained", "sum"))
        out = out.merge(tested.reset_index(), on=cell, how="left")
    marks = rated_significant(values, shared, human)
    if len(marks):
        marks["harmful_only_here"] = marks["harmful"] & _only_here(marks)
        counts = marks.groupby(cell).agg(
            n_significant=("rated", "size"),
            n_rated=("rated", "sum"),
            n_harmful=("harmful", "sum"),
            n_harmful_only_here=("harmful_only_here", "sum"),
        )
        out = out.merge(counts.reset_index(), on=cell, how="left")
    for column in FINDINGS_COLUMNS[3:-1]:
        out[column] = out[column].fillna(0).astype("int64") if column in out else 0
    out["n_harmful_only_here"] = out["n_harmful_only_here"].astype("Int64").where(out["scope"] != GLOBAL_SCOPE)
    out["harm_panel"] = harm_panel(human)
    return out.sort_values(cell).reset_index(drop=True)[FINDINGS_COLUMNS]


def harmful_associations(values: pd.DataFrame, shared: pd.DataFrame, human: pd.DataFrame | None) -> pd.DataFrame:
    """Per model, each association significant in one of its scopes and rated harmful there by the panel:
    model, the association key, harm_panel (what finding 3 tests across languages)."""
    marks = rated_significant(values, shared, human)
    harmful = marks[marks["harmful"].astype(bool)] if len(marks) else marks
    columns = ["model", *ASSOCIATION_KEY, "harm_panel"]
    if harmful.empty:
        return pd.DataFrame(columns=columns)
    return harmful[columns].drop_duplicates().sort_values(columns).reset_index(drop=True)


def _finding_1(pooled: pd.DataFrame) -> dict[str, Any]:
    """Every model produces harmful stereotypes: per model, harmful associations in its pooled scope, rated by
    the panel the table names. Not stated only when every model without a harmful association has unrated ones."""
    if pooled.empty:
        return {"holds": None, "text": "not stated: the run has no pooled (global) pass"}
    panel = PANEL_TEXT[str(pooled["harm_panel"].iloc[0])]
    lacking = pooled[pooled["n_harmful"] == 0]
    unrated = lacking[lacking["n_significant"] > lacking["n_rated"]]
    n = len(pooled)
    counts = ", ".join(
        f"{r.model}: {r.n_harmful} of {r.n_significant} (n = {r.n_stories})" for r in pooled.itertuples()
    )
    if lacking.empty:
        return {"holds": True, "text": f"holds: all {n} models produce harmful associations, rated by the {panel} "
                f"(harmful / significant: {counts})"}  # fmt: skip
    if len(unrated) == len(lacking):
        return {
            "holds": None,
            "text": f"not stated: {len(lacking)} of {n} models have no harmful association (rated by the {panel}) "
            f"and unrated significant ones ({', '.join(sorted(unrated['model']))}); harmful / significant: {counts}",
        }
    rated = ", ".join(sorted(set(lacking["model"]) - set(unrated["model"])))
    return {"holds": False, "text": f"does not hold: {n - len(lacking)} of {n} models produce one, rated by the "
            f"{panel}; none of the significant associations of {rated} is rated harmful ({counts})"}  # fmt: skip


def finding_statements(
    findings: pd.DataFrame, language_tests: pd.DataFrame | None = None, per_language: bool = True
) -> dict[str, dict[str, Any]]:
    """Finding 1 from ``findings_table`` and finding 3 from ``language_effects.language_heterogeneity``'s tests:
    ``holds`` (True, False or None when the run cannot say) and a sentence with the counts, the n behind
    them and the panel that rated harm."""
    panel = PANEL_TEXT[str(findings["harm_panel"].iloc[0])] if len(findings) else PANEL_TEXT["llm_judges"]
    tests = pd.DataFrame(columns=TEST_COLUMNS) if language_tests is None else language_tests
    return {
        "finding_1_every_model_harmful": _finding_1(findings[findings["scope"] == GLOBAL_SCOPE]),
        "finding_3_language_specific_harm": finding_3(tests, panel, per_language),
    }
