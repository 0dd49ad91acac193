"""Story explorer: one self-contained HTML page to browse a run's stories and associations.

``make explorer`` (``python -m storybias.cli explorer PARAMS``) writes ``figures/<run>/explorer.html``.
The page needs no server and nothing from the network: data, CSS and (vanilla) JavaScript are inline,
so it opens from disk (file://) and can be mailed around. The page's HTML skeleton, CSS and script
are package files in ``storybias/stages/figures/explorer_assets/`` (read with ``importlib.resources``); this module
builds the data and fills them in.

What it shows:

- the stories (prompt, text, validity, extraction), filterable by design, model, language,
  conditioning attribute and value (stereotales: the prompted attribute and its value, plus the
  scenario; bedtime and occupations: their condition columns), validity, extraction state and a
  free-text search;
- stage 04's shared associations (``associations_shared.parquet``), sortable by lift, models
  sharing and harm, each linked to its example stories: stories of the association's models (and
  language, when its scope is one) prompted with ``base_attribute = base_value`` whose extracted
  ``demo_<compared_attribute>`` is ``compared_value`` (parsed extractions only, as in stage 04).

Stories are LLM output and so untrusted: the data travel as JSON in a
``<script type="application/json">`` element with every ``<``, ``>`` and ``&`` written as a
``\\uXXXX`` escape (nothing inside can close the element), and the script renders every value with
``textContent``, never as markup. A Content-Security-Policy allows only the page's own script (by
hash) and no network access at all.

At paper scale (~650k stories) the page embeds a sample: at most ``max_stories_per_cell`` stories per
design x model x language; within a cell, stories that exemplify an association come first (round
robin over the associations), the rest in story-id order (a hash, so pseudo-random). The page says
how many stories the run has and how many it embeds.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from storybias.config.params import Params
from storybias.config.prompts import ALL_CONDITION_COLUMNS, CONDITION_COLUMNS, LANGUAGES
from storybias.core import artifacts
from storybias.core.io import atomic_open
from storybias.core.locks import holds_run_lock
from storybias.evidence.released_associations import ANY_SCOPE, GLOBAL_SCOPE

DEFAULT_MAX_STORIES_PER_CELL = 200
CELL = ["design", "model", "language"]
ASSOC_KEYS = ["base_attribute", "base_value", "compared_attribute", "compared_value"]
# Extraction columns that the page never shows (large or internal).
_EXTRACTION_SKIP = {"raw", "adjectives_orig"}


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------
def _clean(value: Any) -> Any:
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
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_clean(v) for v in value]
    if isinstance(value, (pd.Timestamp, datetime)):
        return value.isoformat()
    return str(value)


def _str(value: Any) -> str | None:
    value = _clean(value)
    return None if value is None else str(value)


def _list(value: Any) -> list[Any]:
    value = _clean(value)
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
    ok = _clean(row.get("parse_ok"))
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
        "cut": bool(_clean(row.get("story_cut")) or False),
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


def sample_story_ids(stories: pd.DataFrame, examples: pd.DataFrame, max_per_cell: int | None) -> list[str]:
    """At most ``max_per_cell`` story ids per design x model x language (all when None). Within a
    cell: association examples first, round robin over associations (each association's first
    example, then each one's second, ...), then the others, in story-id order (story ids are hashes:
    a fixed pseudo-random order)."""
    if max_per_cell is None:
        return stories["story_id"].tolist()
    if max_per_cell < 0:
        raise ValueError(f"max_stories_per_cell must be >= 0, got {max_per_cell}")
    frame = stories[[*CELL, "story_id"]].copy()
    frame["_priority"] = np.inf
    if not examples.empty:
        ranked = examples.merge(frame[["story_id", *CELL]], on="story_id").sort_values("story_id")
        ranked["_rank"] = ranked.groupby([*CELL, "assoc"], dropna=False).cumcount()
        priority = ranked.groupby("story_id")["_rank"].min()
        frame["_priority"] = frame["story_id"].map(priority).fillna(np.inf)
    frame = frame.sort_values([*CELL, "_priority", "story_id"], na_position="last")
    return frame.groupby(CELL, dropna=False, sort=False).head(max_per_cell)["story_id"].tolist()


def _cells(population: pd.DataFrame, extractions: pd.DataFrame | None, embedded: set[str]) -> list[dict[str, Any]]:
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


def _associations(
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
            per_model[tuple(key)] = [_clean(r) for r in group[value_cols].sort_values("model").to_dict("records")]
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
                "n_models": _clean(row.get("n_models")) if row.get("n_models") is not None else len(models),
                **{
                    c: _clean(row.get(c))
                    for c in ("mean_fraction", "mean_lift", "median_harm", "n_ratings", "share_realistic", "harmful")
                },
                "n_examples": int(n_examples.get(position, 0)),
                "per_model": per_model.get(key, []),
                # among StereoTales' published associations (pooled scope only; None: no comparison)
                "published": (key[1:] in published_keys) if published_keys is not None and key[0] == "all" else None,
            }
        )
    return out


def explorer_payload(
    stories: pd.DataFrame,
    extractions: pd.DataFrame | None,
    shared: pd.DataFrame | None,
    values: pd.DataFrame | None = None,
    *,
    run_name: str = "",
    max_stories_per_cell: int | None = None,
    population: pd.DataFrame | None = None,
    notes: list[str] | None = None,
    published: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready Python.

    ``stories``: rows of filtered.parquet (or stories.parquet) to embed; with ``max_stories_per_cell``
    they are sampled here first. ``population``: the run's full story table (metadata columns are
    enough) when ``stories`` is already a sample of it; counts and association examples "in the run"
    come from it (default: ``stories``). ``extractions``/``shared``/``values`` may be None (missing
    artifact): stories then show "not extracted", and the page says that there are no associations.
    ``published``: stage 04's ``published_comparison.parquet`` (the run against StereoTales' published
    associations), or None; with it each pooled association says whether it was published.
    """
    population = stories if population is None else population
    examples = association_examples(population, extractions, shared)
    if max_stories_per_cell is not None:
        keep = set(sample_story_ids(stories, examples, max_stories_per_cell))
        stories = stories[stories["story_id"].isin(keep)]
    stories = stories.sort_values([c for c in (*CELL, "prompt_id", "sample", "story_id") if c in stories])
    ext_rows = _extraction_rows(extractions, stories)
    has_validity = "is_valid" in stories
    story_list = [_story(row, ext_rows.get(row["story_id"]), has_validity) for row in stories.to_dict("records")]
    embedded = {s["id"] for s in story_list}
    associations = None
    if shared is not None:
        published_keys = None
        if published is not None:
            # a released file's global records, or a human-study question (scope "any": it names no pass)
            listed = published[
                (published["status"] != "not_published") & published["scope"].isin([GLOBAL_SCOPE, ANY_SCOPE])
            ]
            published_keys = {tuple(str(v) for v in k) for k in listed[ASSOC_KEYS].to_numpy()}
        associations = _associations(
            shared.reset_index(drop=True), values, examples.groupby("assoc").size(), published_keys
        )
    return {
        "version": 1,
        "run": run_name,
        "built_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "max_per_cell": max_stories_per_cell,
        "n_total": int(len(population)),
        "n_embedded": len(story_list),
        "has_validity": bool(has_validity),
        "has_extractions": extractions is not None,
        "has_values": values is not None,
        "notes": list(notes or []),
        "languages": dict(LANGUAGES),
        "cells": _cells(population, extractions, embedded),
        "stories": story_list,
        "associations": associations,
        "published": None if published is None else _published_counts(published),
    }


def _extraction_rows(extractions: pd.DataFrame | None, stories: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """The extraction row of each embedded story (story_id -> record), without the columns the page
    never shows; empty without extractions."""
    if extractions is None or extractions.empty:
        return {}
    wanted = extractions[extractions["story_id"].isin(stories["story_id"])]
    wanted = wanted.drop(columns=[c for c in _EXTRACTION_SKIP if c in wanted])
    return {r["story_id"]: r for r in wanted.to_dict("records")}


def _story(row: dict[str, Any], ext: dict[str, Any] | None, has_validity: bool) -> dict[str, Any]:
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
        "sample": _clean(row.get("sample")),
        "prompt": _str(row.get("prompt")) or "",
        "text": _str(row.get("text")) or "",
        "finish_reason": _str(row.get("finish_reason")),
        "valid": _clean(row.get("is_valid")) if has_validity else None,
        "invalid_reason": _str(row.get("invalid_reason")),
        "cond": conditions,
        "facets": _facets(design, conditions),
        "x": None if ext is None else _extraction(ext),
    }


def _published_counts(published: pd.DataFrame) -> dict[str, Any]:
    """The comparison with StereoTales' published associations, in counts (stage 04 classified them)."""
    status = published["status"]
    return {
        "mode": str(published["match"].iloc[0]) if len(published) else "any_model",
        "tested": int(status.isin(["reproduced", "missed"]).sum()),
        "reproduced": int((status == "reproduced").sum()),
        "not_published": int((status == "not_published").sum()),
    }


# --------------------------------------------------------------------------------------------------
# Page
# --------------------------------------------------------------------------------------------------
def _json_for_script(payload: dict[str, Any]) -> str:
    """JSON that cannot end its <script> element: no literal <, > or & anywhere (JSON.parse reads
    the \\u escapes back); NaN never appears (it is not JSON)."""
    text = json.dumps(_clean(payload), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _asset(name: str) -> str:
    """One of the page's package files (``storybias/stages/figures/explorer_assets/``: page.html, style.css,
    explorer.js), read exactly as committed: the script's hash in the content-security policy is the
    hash of these bytes."""
    return (resources.files("storybias.stages.figures") / "explorer_assets" / name).read_bytes().decode("utf-8")


def render_html(payload: dict[str, Any]) -> str:
    """The page: inline CSS, the data as JSON, inline vanilla JavaScript. No external resource.
    The three parts are package files (``explorer_assets/``), so that they are edited, linted and
    diffed as HTML, CSS and JavaScript."""
    page, css, script = _asset("page.html"), _asset("style.css"), _asset("explorer.js")
    script_hash = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    csp = (
        f"default-src 'none'; script-src 'sha256-{script_hash}'; style-src 'unsafe-inline'; "
        "img-src 'none'; connect-src 'none'; form-action 'none'; base-uri 'none'"
    )
    title = f"storybias explorer: {payload.get('run') or 'run'}"
    return page.format(
        csp=html.escape(csp, quote=False),
        title=html.escape(title),
        css=css,
        data=_json_for_script(payload),
        script=script,
    )


def _read_optional(path: Path, notes: list[str], what: str, columns: list[str] | None = None) -> pd.DataFrame | None:
    if not path.is_file():
        notes.append(f"{path.name} is missing: {what}.")
        return None
    if columns is None:
        return pd.read_parquet(path)
    available = set(pq.read_schema(path).names)
    return pd.read_parquet(path, columns=[c for c in columns if c in available])


@holds_run_lock("explorer")
def build_explorer(
    profile: Params, max_stories_per_cell: int | None = DEFAULT_MAX_STORIES_PER_CELL, out: Path | None = None
) -> Path:
    """Write ``figures/<run>/explorer.html`` (or ``out``) for the run of ``profile`` (a
    :func:`storybias.config.params.load` result) and return its path.

    Reads ``filtered.parquet`` (or, before stage 02, ``stories.parquet``), ``extractions.parquet`` and
    stage 04's ``associations_shared.parquet`` / ``associations_values.parquet`` from the run's
    folder; everything but the stories is optional. Only the sampled stories' text is loaded, so a
    paper-scale run does not need its whole corpus in memory.
    """

    run_name = profile.run_name
    notes: list[str] = []
    source = artifacts.filtered_path(run_name)
    if not source.is_file():
        source = artifacts.stories_path(run_name)
        if not source.is_file():
            raise FileNotFoundError(
                f"{artifacts.filtered_path(run_name)} is missing (and so is {source.name}): "
                "run the earlier stages first (make filter)"
            )
        notes.append("filtered.parquet is missing (stage 02 not run): validity is unknown.")
    available = set(pq.read_schema(source).names)
    meta_cols = [
        c for c in ("story_id", *CELL, "prompt_id", "sample", "is_valid", *ALL_CONDITION_COLUMNS) if c in available
    ]
    population = pd.read_parquet(source, columns=meta_cols)
    extractions = _read_optional(
        artifacts.extractions_path(run_name), notes, "no story is extracted yet (make extract)"
    )
    if extractions is not None:
        extractions = extractions.drop(columns=[c for c in _EXTRACTION_SKIP if c in extractions])
    shared = _read_optional(
        artifacts.path(run_name, "associations_shared"), notes, "no association table yet (make associations)"
    )
    values = (
        _read_optional(artifacts.path(run_name, "associations_values"), notes, "no per-model association values")
        if shared is not None
        else None
    )
    examples = association_examples(population, extractions, shared)
    keep = sample_story_ids(population, examples, max_stories_per_cell)
    if len(keep) == len(population):
        stories = pd.read_parquet(source)
    else:
        stories = (
            pd.read_parquet(source, filters=[("story_id", "in", keep)]) if keep else pd.read_parquet(source).iloc[:0]
        )
    comparison = None
    if profile.profile.associations.published is not None and values is not None:
        comparison = _read_optional(
            artifacts.path(run_name, "published_comparison"), notes, "no comparison with the published associations"
        )
    payload = explorer_payload(
        stories,
        extractions,
        shared,
        values,
        run_name=run_name,
        population=population,
        notes=notes,
        published=comparison,
    )
    payload["max_per_cell"] = max_stories_per_cell
    target = out if out is not None else artifacts.path(run_name, "explorer")

    with atomic_open(target, "w", encoding="utf-8") as fh:
        fh.write(render_html(payload))
    return target
