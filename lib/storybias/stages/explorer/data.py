"""The story explorer's data: everything :func:`storybias.stages.explorer.page.explorer_payload`
puts on the page, as JSON-ready Python, built from a run's frames (stories, extractions, stage 04's
association tables). Pure functions of their frames: no file is read here.

- :func:`association_examples`: which stories exemplify which shared association;
- :func:`prompt_key`: the prompt a story answers, the same across models and languages (the page's
  compare view groups the stories of one prompt by it);
- :func:`sample_story_ids`: the per-cell sample the page embeds at paper scale;
- :func:`story_record`, :func:`cell_counts`, :func:`association_records`, :func:`published_counts`:
  the page's records.
"""

from __future__ import annotations

import hashlib
import math
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from storybias.config.prompts import CONDITION_COLUMNS
from storybias.evidence.stereotales_taxonomy import ASSOCIATION_KEY

CELL = ["design", "model", "language"]
ASSOC_KEYS = ASSOCIATION_KEY  # an association's identity
# Extraction columns that the page never shows (large or internal).
EXTRACTION_SKIP = {"raw", "adjectives_orig"}


def clean(value: Any) -> Any:
    """A JSON-ready copy: numpy scalars and arrays to Python, NaN / NA / None to None."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [clean(v) for v in value]
    if isinstance(value, (pd.Timestamp, datetime)):
        return value.isoformat()
    return str(value)


def _str(value: Any) -> str | None:
    value = clean(value)
    return None if value is None else str(value)


def _list(value: Any) -> list[Any]:
    value = clean(value)
    return value if isinstance(value, list) else []


def _conditions(row: dict[str, Any], design: str) -> dict[str, str]:
    """The story's non-null condition columns, without the ``cond_`` prefix."""
    columns = CONDITION_COLUMNS.get(design) or [c for c in row if c.startswith("cond_")]
    out = {}
    for column in columns:
        value = _str(row.get(column))
        if value is not None:
            out[column.removeprefix("cond_")] = value
    return out


def _facets(design: str, conditions: dict[str, str]) -> list[list[str]]:
    """(key, value) pairs the condition filter offers. Stereotales: the prompted attribute is the key
    (``stereotales:gender`` = ``woman``), plus scenario category and scenario; other designs: one
    key per condition column (``bedtime:nationality`` = ``egyptian``)."""
    if design == "stereotales":
        out = []
        if conditions.get("attribute") is not None and conditions.get("value") is not None:
            out.append([f"stereotales:{conditions['attribute']}", conditions["value"]])
        for key in ("scenario_category", "scenario"):
            if key in conditions:
                out.append([f"stereotales:{key}", conditions[key]])
        return out
    return [[f"{design}:{key}", value] for key, value in conditions.items()]


def _extraction(row: dict[str, Any]) -> dict[str, Any]:
    demo = {}
    for column, value in row.items():
        if column.startswith("demo_"):
            value = _str(value)
            if value is not None and value != "unknown":
                demo[column.removeprefix("demo_")] = value
    markers = []
    for marker in _list(row.get("markers")):
        if isinstance(marker, dict):
            markers.append({k: marker.get(k) for k in ("text", "text_en", "category", "keep")})
    ok = clean(row.get("parse_ok"))
    return {
        "ok": True if ok is None else bool(ok),
        "demo": demo,
        "gender": _str(row.get("protagonist_gender")),
        "gender_fine": _str(row.get("protagonist_gender_fine")),
        "name": _str(row.get("protagonist_name")),
        "adjectives": _list(row.get("adjectives_en")),
        "settings": _list(row.get("settings")),
        "refs": _list(row.get("cultural_refs")),
        "markers": markers,
        "explicit": _str(row.get("explicit_label")),
        "cut": bool(clean(row.get("story_cut")) or False),
        "extractors": _list(row.get("extractors")),
    }


def association_examples(
    stories: pd.DataFrame, extractions: pd.DataFrame | None, shared: pd.DataFrame | None
) -> pd.DataFrame:
    """(``story_id``, ``assoc``) pairs: story ``story_id`` exemplifies row ``assoc`` (position) of
    ``shared``. A story exemplifies an association when it is a stereotales story of one of the
    association's ``models``, in its language unless ``scope`` is ``all``, prompted with
    ``cond_attribute = base_attribute`` and ``cond_value = base_value``, and its parsed extraction has
    ``demo_<compared_attribute> = compared_value``. The page's script applies the same rule."""
    empty = pd.DataFrame({"story_id": pd.Series(dtype=object), "assoc": pd.Series(dtype="int64")})
    needed = {"story_id", "design", "model", "language", "cond_attribute", "cond_value"}
    if shared is None or shared.empty or extractions is None or extractions.empty or not needed <= set(stories):
        return empty
    st = stories.loc[
        stories["design"] == "stereotales", ["story_id", "model", "language", "cond_attribute", "cond_value"]
    ]
    ext = extractions[extractions["story_id"].isin(st["story_id"])]
    if "parse_ok" in ext:
        ext = ext[ext["parse_ok"].fillna(False).astype(bool)]
    demo_cols = [c for c in ext.columns if c.startswith("demo_")]
    if st.empty or ext.empty or not demo_cols:
        return empty
    wanted = set(shared["compared_attribute"].astype(str))
    demo_cols = [c for c in demo_cols if c.removeprefix("demo_") in wanted]
    if not demo_cols:
        return empty
    long = ext[["story_id", *demo_cols]].melt(
        id_vars="story_id", var_name="compared_attribute", value_name="compared_value"
    )
    long = long[long["compared_value"].notna() & ~long["compared_value"].isin(["unknown", "other"])]
    long["compared_attribute"] = long["compared_attribute"].str.removeprefix("demo_")
    long = long.merge(
        st.rename(columns={"cond_attribute": "base_attribute", "cond_value": "base_value"}), on="story_id"
    )
    assoc = shared[[*ASSOC_KEYS, "scope", "models"]].reset_index(drop=True).copy()
    assoc["assoc"] = np.arange(len(assoc), dtype="int64")
    assoc["models"] = assoc["models"].map(_list)
    assoc = assoc.explode("models").rename(columns={"models": "model"}).dropna(subset=["model"])
    for column in (*ASSOC_KEYS, "model"):
        long[column] = long[column].astype(str)
        assoc[column] = assoc[column].astype(str)
    pairs = long.merge(assoc, on=[*ASSOC_KEYS, "model"])
    pairs = pairs[(pairs["scope"] == "all") | (pairs["scope"] == pairs["language"])]
    return pairs[["story_id", "assoc"]].drop_duplicates().reset_index(drop=True)


def prompt_key(design: Any, prompt_id: Any) -> str | None:
    """The prompt a story answers, the same for every model and language: ``<design>|<prompt_id>``
    (``prompt_id`` is the language-independent grid cell, docs/data-contract.md: the stories of one
    prompt differ in model, language and sample only). None without a prompt_id."""
    design, prompt_id = _str(design), _str(prompt_id)
    return None if prompt_id is None else f"{design or ''}|{prompt_id}"


def _sample_order(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (its index reset) with the sampling order's columns: ``_sample`` (the sample index,
    0 without one) and ``_prompt``, a pseudo-random rank of the story's prompt that is the same in
    every cell (sha256 of its :func:`prompt_key`; the story id without a prompt_id)."""
    out = frame.reset_index(drop=True)
    sample = out["sample"] if "sample" in out else pd.Series(0, index=out.index)
    out["_sample"] = pd.to_numeric(sample, errors="coerce").fillna(0)
    if "prompt_id" not in out:
        out["_prompt"] = out["story_id"].astype(str)
        return out
    prompts = out[["design", "prompt_id"]].drop_duplicates()
    keys = [prompt_key(d, p) for d, p in zip(prompts["design"], prompts["prompt_id"], strict=True)]
    prompts["_prompt"] = [None if k is None else hashlib.sha256(k.encode("utf-8")).hexdigest()[:16] for k in keys]
    out = out.merge(prompts, on=["design", "prompt_id"], how="left")
    out["_prompt"] = out["_prompt"].fillna(out["story_id"].astype(str))
    return out


def sample_story_ids(stories: pd.DataFrame, examples: pd.DataFrame, max_per_cell: int | None) -> list[str]:
    """At most ``max_per_cell`` story ids per design x model x language (all when None). Within a
    cell: association examples first, round robin over associations (each association's first
    example, then each one's second, ...), then the others. Both in the same order: by sample index,
    then by prompt in a pseudo-random order that is the same in every cell (see :func:`_sample_order`),
    so that every cell embeds the same prompts when it can: the compare view then finds a prompt's
    stories for every model and language (sample 0 of each prompt first, then sample 1, ...)."""
    if max_per_cell is None:
        return stories["story_id"].tolist()
    if max_per_cell < 0:
        raise ValueError(f"max_stories_per_cell must be >= 0, got {max_per_cell}")
    columns = [c for c in (*CELL, "story_id", "prompt_id", "sample") if c in stories]
    frame = _sample_order(stories[columns])
    order = ["_sample", "_prompt", "story_id"]
    priority = pd.Series(dtype="float64")
    if not examples.empty:
        ranked = examples.merge(frame, on="story_id").sort_values(order)
        ranked["_rank"] = ranked.groupby([*CELL, "assoc"], dropna=False).cumcount()
        priority = ranked.groupby("story_id")["_rank"].min()
    frame["_priority"] = frame["story_id"].map(priority).fillna(np.inf)
    frame = frame.sort_values([*CELL, "_priority", *order], na_position="last")
    return frame.groupby(CELL, dropna=False, sort=False).head(max_per_cell)["story_id"].tolist()


def cell_counts(population: pd.DataFrame, extractions: pd.DataFrame | None, embedded: set[str]) -> list[dict[str, Any]]:
    frame = population[[*CELL, "story_id"]].copy()
    frame["valid"] = population["is_valid"].fillna(False).astype(bool) if "is_valid" in population else np.nan
    extracted = set() if extractions is None else set(extractions["story_id"])
    parsed = (
        set()
        if extractions is None
        else set(
            extractions.loc[extractions["parse_ok"].fillna(False).astype(bool), "story_id"]
            if "parse_ok" in extractions
            else extractions["story_id"]
        )
    )
    frame["extracted"] = frame["story_id"].isin(extracted)
    frame["parsed"] = frame["story_id"].isin(parsed)
    frame["embedded"] = frame["story_id"].isin(embedded)
    out = []
    for key, group in frame.groupby(CELL, dropna=False, sort=True):
        out.append(
            {
                **dict(zip(CELL, (_str(k) for k in key))),
                "n_stories": len(group),
                "n_valid": None if "is_valid" not in population else int(group["valid"].sum()),
                "n_extracted": int(group["extracted"].sum()),
                "n_parsed": int(group["parsed"].sum()),
                "n_embedded": int(group["embedded"].sum()),
            }
        )
    return out


def association_records(
    shared: pd.DataFrame,
    values: pd.DataFrame | None,
    n_examples: pd.Series,
    published_keys: set[tuple[str, ...]] | None = None,
) -> list[dict[str, Any]]:
    per_model: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    if values is not None and not values.empty and {"scope", "model", *ASSOC_KEYS} <= set(values):
        keys = shared[["scope", *ASSOC_KEYS]].astype(str).drop_duplicates()
        subset = values.assign(**{c: values[c].astype(str) for c in ("scope", *ASSOC_KEYS)}).merge(
            keys, on=["scope", *ASSOC_KEYS]
        )
        value_cols = [
            c
            for c in (
                "model",
                "count",
                "row_total",
                "fraction",
                "expected",
                "lift",
                "p_value",
                "p_adjusted",
                "significant",
            )
            if c in subset
        ]
        for key, group in subset.groupby(["scope", *ASSOC_KEYS], sort=False):
            per_model[tuple(key)] = [clean(r) for r in group[value_cols].sort_values("model").to_dict("records")]
    out = []
    for position, row in enumerate(shared.to_dict("records")):
        key = tuple(str(row.get(c)) for c in ("scope", *ASSOC_KEYS))
        models = [str(m) for m in _list(row.get("models"))]
        association_id = _str(row.get("association_id")) or "|".join(str(row.get(c)) for c in ASSOC_KEYS)
        out.append(
            {
                "index": position,
                "id": association_id,
                "scope": _str(row.get("scope")) or "all",
                **{c: _str(row.get(c)) for c in ASSOC_KEYS},
                "models": models,
                "n_models": clean(row.get("n_models")) if row.get("n_models") is not None else len(models),
                **{
                    c: clean(row.get(c))
                    for c in ("mean_fraction", "mean_lift", "median_harm", "n_ratings", "share_realistic", "harmful")
                },
                "n_examples": int(n_examples.get(position, 0)),
                "per_model": per_model.get(key, []),
                # among StereoTales' published associations (pooled scope only; None: no comparison)
                "published": (key[1:] in published_keys) if published_keys is not None and key[0] == "all" else None,
            }
        )
    return out


def extraction_rows(extractions: pd.DataFrame | None, stories: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """The extraction row of each embedded story (story_id -> record), without the columns the page
    never shows; empty without extractions."""
    if extractions is None or extractions.empty:
        return {}
    wanted = extractions[extractions["story_id"].isin(stories["story_id"])]
    wanted = wanted.drop(columns=[c for c in EXTRACTION_SKIP if c in wanted])
    return {r["story_id"]: r for r in wanted.to_dict("records")}


def story_record(row: dict[str, Any], ext: dict[str, Any] | None, has_validity: bool) -> dict[str, Any]:
    """One embedded story as the page reads it: metadata, prompt and text, validity, conditions and
    their facets, and its extraction (None when it has none)."""
    design = _str(row.get("design")) or ""
    conditions = _conditions(row, design)
    return {
        "id": _str(row["story_id"]),
        "design": design,
        "model": _str(row.get("model")) or "",
        "language": _str(row.get("language")) or "",
        "prompt_id": _str(row.get("prompt_id")),
        "prompt_key": prompt_key(design, row.get("prompt_id")),
        "sample": clean(row.get("sample")),
        "prompt": _str(row.get("prompt")) or "",
        "text": _str(row.get("text")) or "",
        "finish_reason": _str(row.get("finish_reason")),
        "valid": clean(row.get("is_valid")) if has_validity else None,
        "invalid_reason": _str(row.get("invalid_reason")),
        "cond": conditions,
        "facets": _facets(design, conditions),
        "x": None if ext is None else _extraction(ext),
    }


def published_counts(published: pd.DataFrame) -> dict[str, Any]:
    """The comparison with StereoTales' published associations, in counts under the files' rule (stage
    04 classified them): a published association counts once, reproduced when some run model it was
    compared with reproduces it (a question's outcomes in its other scopes are kept but not counted)."""
    counted = published[published["counted"].astype(bool)] if "counted" in published else published
    listed = counted[counted["status"] != "not_published"]
    per_association = listed.groupby(["source", "file", "model", "scope", *ASSOC_KEYS], dropna=False)["status"]
    tested = per_association.agg(lambda s: bool(s.isin(["reproduced", "missed", "underpowered"]).any()))
    reproduced = per_association.agg(lambda s: bool((s == "reproduced").any()))
    return {
        "mode": str(published["match"].iloc[0]) if len(published) else "any_model",
        "tested": int(tested.sum()),
        "reproduced": int(reproduced.sum()),
        "not_published": int((counted["status"] == "not_published").sum()),
    }
