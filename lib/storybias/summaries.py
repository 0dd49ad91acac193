"""Readings of one artifact that a stage and the figures (or two stages) both show: the stories the
analyses read (stage 02's validity rule), the valid-story-rate table, and why stage 04's power table
says nothing could be found. Pure functions on the artifact's frame; they sit below the stages so that
no stage imports another."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from storybias.config.prompts import LANGUAGES


def vsr_matrix(vsr: pd.DataFrame, design: str = "bedtime") -> pd.DataFrame:
    """BiasedTales-ML Table 3 layout for one design (default: bedtime, the study's own stories): VSR in
    percent, languages as rows, models as columns, an ``Overall`` column (pooled over models) and an
    ``Average`` row (mean over languages)."""
    sub = vsr[vsr["design"] == design]
    matrix = sub.pivot(index="language", columns="model", values="vsr") * 100
    pooled = sub.groupby("language")[["n_valid", "n_stories"]].sum()
    matrix["Overall"] = pooled["n_valid"] / pooled["n_stories"] * 100
    order = [lang for lang in LANGUAGES if lang in matrix.index]
    matrix = matrix.loc[order]
    matrix.loc["Average"] = matrix.mean(axis=0)
    return matrix.round(1)


def vsr_by_language(vsr: pd.DataFrame, design: str = "bedtime") -> dict[str, float]:
    """One design's valid-story rate per language, pooled over models (n_valid / n_stories, BiasedTales-ML
    Appendix C), rounded to 4 digits; empty when the run has no story of ``design``."""
    sub = vsr[vsr["design"] == design]
    pooled = sub.groupby("language", sort=True)[["n_valid", "n_stories"]].sum()
    return {str(lang): round(float(row.n_valid / row.n_stories), 4) for lang, row in pooled.iterrows()}


def valid_stories(filtered: pd.DataFrame) -> pd.DataFrame:
    """The stories the analyses read: those valid by their design's rule (``is_valid``, set at stage 02
    from ``filter.exclude``)."""
    return filtered[filtered["is_valid"].astype(bool)].reset_index(drop=True)


def significant_per_language(values: pd.DataFrame) -> pd.DataFrame:
    """Stage 04's significant value-level associations per model x single language (the pooled scope
    ``all`` left out), column ``significant associations``; no row when there is none."""
    if values.empty:
        return pd.DataFrame(columns=["model", "scope", "significant associations"])
    chosen = values[(values["scope"] != "all") & values["significant"].astype(bool)]
    return chosen.groupby(["model", "scope"]).size().rename("significant associations").reset_index()


ALL_COMPARED = "(stories per value)"  # the base attribute's own row: every story, as if all known


def why_nothing_found(power: pd.DataFrame | None) -> str | None:
    """Why stage 04 found nothing, from its power table (``associations_power.parquet``; pooled scope
    when present): per base attribute, the stories per prompted value, how many compared dimensions
    were testable, the reasons of the others with their counts and, when some were, the smallest
    detectable lift. None without a power table."""
    if (
        power is None
        or power.empty
        or not {"base_attribute", "compared_attribute", "testable", "reason"} <= set(power.columns)
    ):
        return None
    pooled = power[power["scope"] == "all"] if "scope" in power.columns and (power["scope"] == "all").any() else power
    several = "model" in pooled.columns and pooled["model"].nunique() > 1
    parts = []
    for keys, g in pooled.groupby(
        ["model", "base_attribute"] if "model" in pooled.columns else ["base_attribute"], sort=True
    ):
        model, base = (
            keys if isinstance(keys, tuple) and len(keys) == 2 else (None, keys[0] if isinstance(keys, tuple) else keys)
        )
        head = g[g["compared_attribute"] == ALL_COMPARED]
        dims = g[g["compared_attribute"] != ALL_COMPARED]
        testable = dims["testable"].fillna(False).astype(bool)
        sizes = "/".join(str(int(n)) for n in head["row_sizes"].iloc[0]) if len(head) and "row_sizes" in head else "?"
        reasons = dims.loc[~testable, "reason"].value_counts()
        why = "; ".join(f"{r} ({n} dimension{'s' if n > 1 else ''})" for r, n in reasons.items())
        lift = (
            dims.loc[testable, "min_detectable_lift"].dropna()
            if "min_detectable_lift" in dims
            else pd.Series(dtype=float)
        )
        tail = f"; smallest detectable lift {lift.min():g}" if len(lift) else ""
        parts.append(
            f"{f'{model}: ' if several else ''}{base} ({sizes} stories per prompted value): "
            f"{int(testable.sum())} of {len(dims)} compared dimensions testable{tail}" + (f"; {why}" if why else "")
        )
    return "stage 04 found nothing to show — " + " | ".join(parts) if parts else None


def answers_at_list_cap(extractions: pd.DataFrame, cap: int | None, lists: Sequence[str]) -> pd.Series:
    """Per list column of ``lists``: how many parsed answers (``parse_ok``) hold ``cap`` items or more, i.e.
    reached stage 03's list cap (``extract.max_list_items``; None: no cap, so none did)."""
    parsed = extractions[extractions["parse_ok"].astype(bool)]
    counts = {
        column: 0 if cap is None else int(parsed[column].map(lambda v: v is not None and len(v) >= cap).sum())
        for column in lists
        if column in parsed
    }
    return pd.Series(counts, name=f"answers at the cap ({cap}) of {len(parsed)} parsed", dtype="int64")
