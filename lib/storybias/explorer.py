"""Story explorer: one self-contained HTML page to browse a run's stories and associations.

``make explorer`` (``python -m storybias.cli explorer PARAMS``) writes ``figures/<run>/explorer.html``.
The page needs no server and nothing from the network: data, CSS and (vanilla) JavaScript are inline,
so it opens from disk (file://) and can be mailed around.

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
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from . import paths
from .prompts import ALL_CONDITION_COLUMNS, CONDITION_COLUMNS, LANGUAGES
from .locks import holds_run_lock

if TYPE_CHECKING:
    from .published import Comparison

DEFAULT_MAX_STORIES_PER_CELL = 200
CELL = ["design", "model", "language"]
ASSOC_KEYS = ["base_attribute", "base_value", "compared_attribute", "compared_value"]
SHARED_FILE = "associations_shared.parquet"  # stage 04 (docs/data-contract.md)
VALUES_FILE = "associations_values.parquet"
EXPLORER_FILE = "explorer.html"
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


def association_examples(stories: pd.DataFrame, extractions: pd.DataFrame | None,
                         shared: pd.DataFrame | None) -> pd.DataFrame:
    """(``story_id``, ``assoc``) pairs: story ``story_id`` exemplifies row ``assoc`` (position) of
    ``shared``. A story exemplifies an association when it is a stereotales story of one of the
    association's ``models``, in its language unless ``scope`` is ``all``, prompted with
    ``cond_attribute = base_attribute`` and ``cond_value = base_value``, and its parsed extraction has
    ``demo_<compared_attribute> = compared_value``. The page's script applies the same rule."""
    empty = pd.DataFrame({"story_id": pd.Series(dtype=object), "assoc": pd.Series(dtype="int64")})
    needed = {"story_id", "design", "model", "language", "cond_attribute", "cond_value"}
    if shared is None or shared.empty or extractions is None or extractions.empty or not needed <= set(stories):
        return empty
    st = stories.loc[stories["design"] == "stereotales", ["story_id", "model", "language", "cond_attribute", "cond_value"]]
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
    long = ext[["story_id", *demo_cols]].melt(id_vars="story_id", var_name="compared_attribute", value_name="compared_value")
    long = long[long["compared_value"].notna() & ~long["compared_value"].isin(["unknown", "other"])]
    long["compared_attribute"] = long["compared_attribute"].str.removeprefix("demo_")
    long = long.merge(st.rename(columns={"cond_attribute": "base_attribute", "cond_value": "base_value"}), on="story_id")
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
    parsed = set() if extractions is None else set(
        extractions.loc[extractions["parse_ok"].fillna(False).astype(bool), "story_id"]
        if "parse_ok" in extractions else extractions["story_id"])
    frame["extracted"] = frame["story_id"].isin(extracted)
    frame["parsed"] = frame["story_id"].isin(parsed)
    frame["embedded"] = frame["story_id"].isin(embedded)
    out = []
    for key, group in frame.groupby(CELL, dropna=False, sort=True):
        out.append({
            **dict(zip(CELL, (_str(k) for k in key))),
            "n_stories": len(group),
            "n_valid": None if "is_valid" not in population else int(group["valid"].sum()),
            "n_extracted": int(group["extracted"].sum()),
            "n_parsed": int(group["parsed"].sum()),
            "n_embedded": int(group["embedded"].sum()),
        })
    return out


def _associations(shared: pd.DataFrame, values: pd.DataFrame | None, n_examples: pd.Series,
                  published_keys: set[tuple[str, ...]] | None = None) -> list[dict[str, Any]]:
    per_model: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    if values is not None and not values.empty and {"scope", "model", *ASSOC_KEYS} <= set(values):
        keys = shared[["scope", *ASSOC_KEYS]].astype(str).drop_duplicates()
        subset = values.assign(**{c: values[c].astype(str) for c in ("scope", *ASSOC_KEYS)}).merge(keys, on=["scope", *ASSOC_KEYS])
        value_cols = [c for c in ("model", "count", "row_total", "fraction", "expected", "lift", "p_value",
                                  "p_adjusted", "significant") if c in subset]
        for key, group in subset.groupby(["scope", *ASSOC_KEYS], sort=False):
            per_model[tuple(key)] = [_clean(r) for r in group[value_cols].sort_values("model").to_dict("records")]
    out = []
    for position, row in enumerate(shared.to_dict("records")):
        key = tuple(str(row.get(c)) for c in ("scope", *ASSOC_KEYS))
        models = [str(m) for m in _list(row.get("models"))]
        association_id = _str(row.get("association_id")) or "|".join(str(row.get(c)) for c in ASSOC_KEYS)
        out.append({
            "index": position,
            "id": association_id,
            "scope": _str(row.get("scope")) or "all",
            **{c: _str(row.get(c)) for c in ASSOC_KEYS},
            "models": models,
            "n_models": _clean(row.get("n_models")) if row.get("n_models") is not None else len(models),
            **{c: _clean(row.get(c)) for c in ("mean_fraction", "mean_lift", "median_harm", "n_ratings",
                                                "share_realistic", "harmful")},
            "n_examples": int(n_examples.get(position, 0)),
            "per_model": per_model.get(key, []),
            # among StereoTales' published associations (pooled scope only; None: no comparison)
            "published": (key[1:] in published_keys) if published_keys is not None and key[0] == "all" else None,
        })
    return out


def explorer_payload(stories: pd.DataFrame, extractions: pd.DataFrame | None, shared: pd.DataFrame | None,
                     values: pd.DataFrame | None = None, *, run_name: str = "", max_stories_per_cell: int | None = None,
                     population: pd.DataFrame | None = None, notes: list[str] | None = None,
                     published: Comparison | None = None) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready Python.

    ``stories``: rows of filtered.parquet (or stories.parquet) to embed; with ``max_stories_per_cell``
    they are sampled here first. ``population``: the run's full story table (metadata columns are
    enough) when ``stories`` is already a sample of it; counts and association examples "in the run"
    come from it (default: ``stories``). ``extractions``/``shared``/``values`` may be None (missing
    artifact): stories then show "not extracted", and the page says that there are no associations.
    ``published``: a :class:`storybias.published.Comparison` of the run with StereoTales' published
    associations, or None; with it each pooled association says whether it was published.
    """
    population = stories if population is None else population
    examples = association_examples(population, extractions, shared)
    if max_stories_per_cell is not None:
        keep = set(sample_story_ids(stories, examples, max_stories_per_cell))
        stories = stories[stories["story_id"].isin(keep)]
    stories = stories.sort_values([c for c in (*CELL, "prompt_id", "sample", "story_id") if c in stories])
    ext_rows: dict[str, dict[str, Any]] = {}
    if extractions is not None and not extractions.empty:
        wanted = extractions[extractions["story_id"].isin(stories["story_id"])]
        wanted = wanted.drop(columns=[c for c in _EXTRACTION_SKIP if c in wanted])
        ext_rows = {r["story_id"]: r for r in wanted.to_dict("records")}
    has_validity = "is_valid" in stories
    story_list = []
    for row in stories.to_dict("records"):
        design = _str(row.get("design")) or ""
        conditions = _conditions(row, design)
        ext = ext_rows.get(row["story_id"])
        story_list.append({
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
        })
    embedded = {s["id"] for s in story_list}
    associations = None
    if shared is not None:
        published_keys = None
        if published is not None:
            published_keys = {tuple(str(v) for v in k) for k in published.published[ASSOC_KEYS].to_numpy()}
        associations = _associations(shared.reset_index(drop=True), values, examples.groupby("assoc").size(), published_keys)
    return {
        "version": 1,
        "run": run_name,
        "built_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
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
        "published": None if published is None else {
            "mode": published.mode,
            "tested": int((published.published["status"] != "untested").sum()),
            "reproduced": int((published.published["status"] == "reproduced").sum()),
            "not_published": int(len(published.new)),
        },
    }


# --------------------------------------------------------------------------------------------------
# Page
# --------------------------------------------------------------------------------------------------
def _json_for_script(payload: dict[str, Any]) -> str:
    """JSON that cannot end its <script> element: no literal <, > or & anywhere (JSON.parse reads
    the \\u escapes back); NaN never appears (it is not JSON)."""
    text = json.dumps(_clean(payload), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def render_html(payload: dict[str, Any]) -> str:
    """The page: inline CSS, the data as JSON, inline vanilla JavaScript. No external resource."""
    script_hash = base64.b64encode(hashlib.sha256(_SCRIPT.encode("utf-8")).digest()).decode("ascii")
    csp = (f"default-src 'none'; script-src 'sha256-{script_hash}'; style-src 'unsafe-inline'; "
           "img-src 'none'; connect-src 'none'; form-action 'none'; base-uri 'none'")
    title = f"storybias explorer: {payload.get('run') or 'run'}"
    return _PAGE.format(
        csp=html.escape(csp, quote=False),
        title=html.escape(title),
        css=_CSS,
        data=_json_for_script(payload),
        script=_SCRIPT,
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
def build_explorer(profile, max_stories_per_cell: int | None = DEFAULT_MAX_STORIES_PER_CELL, out: Path | None = None) -> Path:
    """Write ``figures/<run>/explorer.html`` (or ``out``) for the run of ``profile`` (a
    :func:`storybias.params.load` result) and return its path.

    Reads ``filtered.parquet`` (or, before stage 02, ``stories.parquet``), ``extractions.parquet`` and
    stage 04's ``associations_shared.parquet`` / ``associations_values.parquet`` from the run's
    folder; everything but the stories is optional. Only the sampled stories' text is loaded, so a
    paper-scale run does not need its whole corpus in memory.
    """
    run_name = profile.run_name
    folder = paths.run_dir(run_name)
    notes: list[str] = []
    source = paths.filtered_path(run_name)
    if not source.is_file():
        source = paths.stories_path(run_name)
        if not source.is_file():
            raise FileNotFoundError(f"{paths.filtered_path(run_name)} is missing (and so is {source.name}): "
                                    "run the earlier stages first (make filter)")
        notes.append("filtered.parquet is missing (stage 02 not run): validity is unknown.")
    available = set(pq.read_schema(source).names)
    meta_cols = [c for c in ("story_id", *CELL, "prompt_id", "sample", "is_valid", *ALL_CONDITION_COLUMNS) if c in available]
    population = pd.read_parquet(source, columns=meta_cols)
    extractions = _read_optional(paths.extractions_path(run_name), notes, "no story is extracted yet (make extract)")
    if extractions is not None:
        extractions = extractions.drop(columns=[c for c in _EXTRACTION_SKIP if c in extractions])
    shared = _read_optional(folder / SHARED_FILE, notes, "no association table yet (make associations)")
    values = _read_optional(folder / VALUES_FILE, notes, "no per-model association values") if shared is not None else None
    examples = association_examples(population, extractions, shared)
    keep = sample_story_ids(population, examples, max_stories_per_cell)
    if len(keep) == len(population):
        stories = pd.read_parquet(source)
    else:
        stories = pd.read_parquet(source, filters=[("story_id", "in", keep)]) if keep else pd.read_parquet(source).iloc[:0]
    comparison = None
    published_file = profile.profile.associations.published
    if published_file is not None and values is not None:
        from . import published as published_mod

        comparison = published_mod.compare(values, published_mod.load_published(paths.resolve(published_file)))
    payload = explorer_payload(stories, extractions, shared, values, run_name=run_name, population=population, notes=notes,
                               published=comparison)
    payload["max_per_cell"] = max_stories_per_cell
    target = out if out is not None else paths.figures_dir(run_name) / EXPLORER_FILE
    from .io import atomic_open

    with atomic_open(target, "w", encoding="utf-8") as fh:
        fh.write(render_html(payload))
    return target


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
<header>
<h1 id="title">storybias explorer</h1>
<p id="summary"></p>
<p id="sample-note"></p>
<ul id="notes"></ul>
<noscript><p>This page needs JavaScript (inline, no network access).</p></noscript>
</header>
<main>
<section id="cells-section">
<details><summary>Stories per design &times; model &times; language</summary>
<table id="cells-table"><thead><tr><th>design</th><th>model</th><th>language</th><th class="num">stories</th>
<th class="num">valid</th><th class="num">extracted</th><th class="num">parsed</th><th class="num">on this page</th></tr></thead>
<tbody></tbody></table>
</details>
</section>
<section id="assoc-section">
<h2>Associations shared across models (stage 04)</h2>
<p id="assoc-note"></p>
<div id="assoc-controls" class="controls" hidden>
<label>scope <select id="assoc-scope"><option value="">all scopes</option></select></label>
<label><input type="checkbox" id="assoc-harmful"> harmful only</label>
<span id="assoc-count"></span>
</div>
<div class="table-wrap"><table id="assoc-table" hidden><thead><tr>
<th>scope</th><th>association (prompted &rarr; extracted)</th>
<th data-sort="n_models" class="num"><button type="button" class="sort" data-sort="n_models">models sharing</button></th>
<th class="num">mean fraction</th>
<th data-sort="mean_lift" class="num"><button type="button" class="sort" data-sort="mean_lift">mean lift</button></th>
<th data-sort="median_harm" class="num"><button type="button" class="sort" data-sort="median_harm">median harm</button></th>
<th class="num">ratings</th><th class="num">realistic</th><th>harmful</th><th>stories</th>
</tr></thead><tbody id="assoc-body"></tbody></table></div>
</section>
<section id="stories-section">
<h2>Stories</h2>
<div id="filters" class="controls">
<label>design <select id="f-design"><option value="">all</option></select></label>
<label>model <select id="f-model"><option value="">all</option></select></label>
<label>language <select id="f-language"><option value="">all</option></select></label>
<label>condition <select id="f-cond"><option value="">any</option></select></label>
<label>value <select id="f-value"><option value="">any</option></select></label>
<label>validity <select id="f-validity"><option value="">all</option><option value="valid">valid</option>
<option value="invalid">invalid</option></select></label>
<label>extraction <select id="f-extraction"><option value="">all</option><option value="extracted">extracted</option>
<option value="parsed">parsed</option><option value="failed">did not parse</option>
<option value="none">not extracted</option></select></label>
<label>search <input type="search" id="f-search" placeholder="text, prompt, name"></label>
<button type="button" id="f-reset">reset filters</button>
</div>
<p id="assoc-filter" hidden><span id="assoc-filter-text"></span> <button type="button" id="assoc-clear">clear</button></p>
<p><strong id="story-count"></strong> <span id="page-note"></span></p>
<div id="stories"></div>
<p><button type="button" id="more" hidden></button></p>
</section>
</main>
<script type="application/json" id="explorer-data">{data}</script>
<script>{script}</script>
</body>
</html>
"""

_CSS = """
:root { --fg:#1d1d1f; --muted:#666; --line:#ddd; --bg:#fafafa; --accent:#0b5cad; --bad:#a4262c; --ok:#1e7b34; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", sans-serif; color: var(--fg);
       margin: 0 auto; max-width: 1200px; padding: 0 1rem 4rem; background: #fff; }
h1 { font-size: 1.5rem; margin: 1rem 0 .3rem; } h2 { font-size: 1.2rem; margin: 1.6rem 0 .5rem; }
.muted, #sample-note, #notes { color: var(--muted); }
table { border-collapse: collapse; width: 100%; } th, td { border-bottom: 1px solid var(--line); padding: .25rem .4rem;
  text-align: left; vertical-align: top; } th { background: var(--bg); position: sticky; top: 0; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
.table-wrap { max-height: 28rem; overflow: auto; border: 1px solid var(--line); }
.controls { display: flex; flex-wrap: wrap; gap: .4rem .9rem; align-items: center; margin: .4rem 0; }
.controls label { white-space: nowrap; }
button { font: inherit; cursor: pointer; }
td button { white-space: nowrap; }
button.sort { border: 0; background: none; padding: 0; color: var(--accent); font-weight: 600; }
th[aria-sort="descending"] button.sort::after { content: " \\25BC"; }
th[aria-sort="ascending"] button.sort::after { content: " \\25B2"; }
tr.active { background: #eef5fd; }
#assoc-filter { background: #eef5fd; border: 1px solid #b7d3f2; padding: .4rem .6rem; }
article.story { border: 1px solid var(--line); border-radius: 6px; padding: .5rem .75rem; margin: .6rem 0; }
article.story header { display: flex; flex-wrap: wrap; gap: .3rem .6rem; align-items: baseline; }
.badge { background: var(--bg); border: 1px solid var(--line); border-radius: 3px; padding: 0 .3rem; font-size: .85em; }
.valid { color: var(--ok); border-color: var(--ok); } .invalid { color: var(--bad); border-color: var(--bad); }
.story-id { color: var(--muted); font-family: ui-monospace, monospace; font-size: .8em; }
.conds { margin: .2rem 0; color: var(--muted); }
.story-text, .prompt-text { white-space: pre-wrap; overflow-wrap: anywhere; margin: .3rem 0; }
.prompt-text { color: #333; background: var(--bg); padding: .3rem .5rem; }
.extraction { font-size: .92em; border-top: 1px dashed var(--line); margin-top: .3rem; padding-top: .3rem; }
.extraction dl { display: grid; grid-template-columns: max-content 1fr; gap: 0 .8rem; margin: 0; }
.extraction dt { color: var(--muted); } .extraction dd { margin: 0; overflow-wrap: anywhere; }
.not-extracted { color: var(--muted); font-style: italic; }
"""

_SCRIPT = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("explorer-data").textContent);
  var PAGE = 100, PREVIEW = 600;
  var stories = D.stories || [];
  var assocs = D.associations;
  var state = {design: "", model: "", language: "", cond: "", value: "", validity: "", extraction: "",
               search: "", assoc: null, shown: PAGE};
  var sort = {key: "n_models", dir: -1};

  function $(id) { return document.getElementById(id); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function num(n) { return (n === null || n === undefined) ? "\u2013" : Number(n).toLocaleString("en-US"); }
  function fix(x, d) { return (x === null || x === undefined) ? "\u2013" : Number(x).toFixed(d); }
  // Values from the run (model names, condition values, keys) are never used as keys of a plain
  // object: a model called "hasOwnProperty", "__proto__" or "constructor" would hit Object.prototype.
  // Sets hold seen values, and objects parsed from the JSON are read through own().
  function own(obj, key) {
    return (obj !== null && obj !== undefined && Object.prototype.hasOwnProperty.call(obj, key)) ? obj[key] : undefined;
  }
  function langLabel(code) { var n = own(D.languages, code); return n ? code + " (" + n + ")" : code; }
  function facetLabel(key) {
    var i = key.indexOf(":"), design = key.slice(0, i), name = key.slice(i + 1);
    if (design === "stereotales" && name !== "scenario" && name !== "scenario_category") {
      return design + " \u00b7 " + name + " (prompted attribute)";
    }
    return design + " \u00b7 " + name;
  }
  function uniq(values) {
    var seen = new Set(), out = [];
    values.forEach(function (v) { if (v !== null && v !== undefined && !seen.has(v)) { seen.add(v); out.push(v); } });
    return out.sort();
  }
  function fillSelect(select, values, label, keepFirst) {
    var current = select.value;
    while (select.options.length > (keepFirst ? 1 : 0)) { select.remove(select.options.length - 1); }
    values.forEach(function (v) {
      var o = document.createElement("option");
      o.value = v; o.textContent = label ? label(v) : v;
      select.appendChild(o);
    });
    select.value = values.indexOf(current) >= 0 ? current : "";
    return select.value;
  }

  // ---- header -------------------------------------------------------------------------------
  $("title").textContent = "storybias explorer \u2014 run " + (D.run || "?");
  $("summary").textContent = "Run \u201c" + (D.run || "?") + "\u201d: " + num(D.n_total) + " stories in the run; " +
    num(D.n_embedded) + " on this page. Built " + D.built_at + ".";
  if (D.n_embedded < D.n_total) {
    $("sample-note").textContent = "This page shows a sample: " + num(D.n_embedded) + " of " + num(D.n_total) +
      " stories, at most " + num(D.max_per_cell) + " per design \u00d7 model \u00d7 language (stories that exemplify " +
      "an association first, the others in story-id order, which is pseudo-random). Counts below are over the sample.";
  } else {
    $("sample-note").textContent = "Every story of the run is on this page.";
  }
  (D.notes || []).forEach(function (n) { $("notes").appendChild(el("li", null, n)); });

  var cellBody = document.querySelector("#cells-table tbody");
  (D.cells || []).forEach(function (c) {
    var tr = el("tr");
    tr.appendChild(el("td", null, c.design)); tr.appendChild(el("td", null, c.model));
    tr.appendChild(el("td", null, langLabel(c.language)));
    [c.n_stories, c.n_valid, c.n_extracted, c.n_parsed, c.n_embedded].forEach(function (v) { tr.appendChild(el("td", "num", num(v))); });
    cellBody.appendChild(tr);
  });

  // ---- stories --------------------------------------------------------------------------------
  function assocMatch(a, s) {
    return s.design === "stereotales" && a.models.indexOf(s.model) >= 0 &&
      (a.scope === "all" || s.language === a.scope) &&
      own(s.cond, "attribute") === a.base_attribute && own(s.cond, "value") === a.base_value &&
      s.x !== null && s.x.ok === true && own(s.x.demo, a.compared_attribute) === a.compared_value;
  }
  function haystack(s) {
    if (s._hay === undefined) {
      s._hay = (s.text + "\n" + s.prompt + "\n" + ((s.x && s.x.name) || "") + "\n" + s.id).toLowerCase();
    }
    return s._hay;
  }
  function matches(s) {
    if (state.design && s.design !== state.design) { return false; }
    if (state.model && s.model !== state.model) { return false; }
    if (state.language && s.language !== state.language) { return false; }
    if (state.cond) {
      var f = null;
      for (var i = 0; i < s.facets.length; i++) { if (s.facets[i][0] === state.cond) { f = s.facets[i]; break; } }
      if (!f || (state.value && f[1] !== state.value)) { return false; }
    }
    if (state.validity === "valid" && s.valid !== true) { return false; }
    if (state.validity === "invalid" && s.valid !== false) { return false; }
    if (state.extraction === "extracted" && !s.x) { return false; }
    if (state.extraction === "parsed" && !(s.x && s.x.ok)) { return false; }
    if (state.extraction === "failed" && !(s.x && !s.x.ok)) { return false; }
    if (state.extraction === "none" && s.x) { return false; }
    if (state.search && haystack(s).indexOf(state.search) < 0) { return false; }
    if (state.assoc && !assocMatch(state.assoc, s)) { return false; }
    return true;
  }

  function field(dl, name, value) {
    if (value === null || value === undefined || value === "" || (Array.isArray(value) && !value.length)) { return; }
    dl.appendChild(el("dt", null, name));
    dl.appendChild(el("dd", null, Array.isArray(value) ? value.join(", ") : value));
  }
  function storyCard(s) {
    var card = el("article", "story");
    card.setAttribute("data-story-id", s.id);
    var head = el("header");
    head.appendChild(el("span", "badge", s.design));
    head.appendChild(el("span", "badge", s.model));
    head.appendChild(el("span", "badge", langLabel(s.language)));
    if (s.valid === true) { head.appendChild(el("span", "badge valid", "valid")); }
    else if (s.valid === false) { head.appendChild(el("span", "badge invalid", "invalid: " + (s.invalid_reason || "?"))); }
    else { head.appendChild(el("span", "badge", "validity unknown")); }
    head.appendChild(el("span", "story-id", (s.prompt_id || "") + " \u00b7 sample " + s.sample + " \u00b7 " + s.id));
    card.appendChild(head);
    var conds = Object.keys(s.cond).map(function (k) { return k + " = " + s.cond[k]; });
    if (conds.length) { card.appendChild(el("p", "conds", conds.join(" \u00b7 "))); }
    var pd = el("details", "prompt");
    pd.appendChild(el("summary", null, "prompt"));
    pd.appendChild(el("div", "prompt-text", s.prompt));
    card.appendChild(pd);
    var text = el("div", "story-text");
    var long = s.text.length > PREVIEW;
    text.textContent = long ? s.text.slice(0, PREVIEW) + "\u2026" : (s.text || "(empty)");
    card.appendChild(text);
    if (long) {
      var toggle = el("button", "toggle", "show full story (" + num(s.text.length) + " characters)");
      toggle.type = "button";
      toggle.setAttribute("aria-expanded", "false");
      toggle.addEventListener("click", function () {
        var open = toggle.getAttribute("aria-expanded") === "true";
        text.textContent = open ? s.text.slice(0, PREVIEW) + "\u2026" : s.text;
        toggle.textContent = open ? "show full story (" + num(s.text.length) + " characters)" : "collapse";
        toggle.setAttribute("aria-expanded", open ? "false" : "true");
      });
      card.appendChild(toggle);
    }
    var ex = el("div", "extraction");
    if (!s.x) {
      ex.appendChild(el("span", "not-extracted", "not extracted"));
    } else {
      if (!s.x.ok) { ex.appendChild(el("p", "invalid", "extraction did not parse (excluded from statistics)")); }
      var dl = el("dl");
      field(dl, "protagonist", [s.x.name || "(unnamed)", s.x.gender_fine || s.x.gender].filter(Boolean).join(", "));
      field(dl, "explicit label", s.x.explicit);
      Object.keys(s.x.demo).sort().forEach(function (k) { field(dl, k, s.x.demo[k]); });
      field(dl, "adjectives", s.x.adjectives);
      field(dl, "settings", s.x.settings);
      field(dl, "cultural refs", s.x.refs);
      field(dl, "markers", s.x.markers.map(function (m) {
        return (m.text_en || m.text || "?") + (m.category ? " [" + m.category + "]" : "") + (m.keep === false ? " (removed)" : "");
      }));
      if (s.x.cut) { field(dl, "note", "story cut to fit the extractor's context"); }
      field(dl, "extractors", s.x.extractors);
      ex.appendChild(dl);
    }
    card.appendChild(ex);
    return card;
  }

  function renderStories() {
    var list = stories.filter(matches);
    var count = $("story-count");
    count.textContent = num(list.length) + " of " + num(stories.length) + " stories shown";
    count.setAttribute("data-matching", String(list.length));
    count.setAttribute("data-total", String(stories.length));
    var n = Math.min(list.length, state.shown);
    var box = $("stories");
    var frag = document.createDocumentFragment();
    for (var i = 0; i < n; i++) { frag.appendChild(storyCard(list[i])); }
    box.replaceChildren(frag);
    $("page-note").textContent = list.length > n ? "(listing the first " + num(n) + ")" : "";
    var more = $("more");
    more.hidden = list.length <= n;
    more.textContent = "show " + num(Math.min(PAGE, list.length - n)) + " more";
  }

  // ---- filters ------------------------------------------------------------------------------
  var selects = {design: $("f-design"), model: $("f-model"), language: $("f-language"), cond: $("f-cond"),
                 value: $("f-value"), validity: $("f-validity"), extraction: $("f-extraction")};
  fillSelect(selects.design, uniq(stories.map(function (s) { return s.design; })), null, true);
  fillSelect(selects.model, uniq(stories.map(function (s) { return s.model; })), null, true);
  fillSelect(selects.language, uniq(stories.map(function (s) { return s.language; })), langLabel, true);
  function refreshConditions() {
    var pool = stories.filter(function (s) { return !state.design || s.design === state.design; });
    var keys = uniq([].concat.apply([], pool.map(function (s) { return s.facets.map(function (f) { return f[0]; }); })));
    state.cond = fillSelect(selects.cond, keys, facetLabel, true);
    var vals = state.cond ? uniq([].concat.apply([], pool.map(function (s) {
      return s.facets.filter(function (f) { return f[0] === state.cond; }).map(function (f) { return f[1]; });
    }))) : [];
    state.value = fillSelect(selects.value, vals, null, true);
    selects.value.disabled = !state.cond;
  }
  refreshConditions();
  Object.keys(selects).forEach(function (k) {
    selects[k].addEventListener("change", function () {
      state[k] = selects[k].value;
      if (k === "design" || k === "cond") { refreshConditions(); }
      state.shown = PAGE;
      renderStories();
    });
  });
  $("f-search").addEventListener("input", function () {
    state.search = $("f-search").value.trim().toLowerCase();
    state.shown = PAGE;
    renderStories();
  });
  function resetFilters() {
    Object.keys(selects).forEach(function (k) { state[k] = ""; selects[k].value = ""; });
    state.search = ""; $("f-search").value = "";
    refreshConditions();
  }
  $("f-reset").addEventListener("click", function () { resetFilters(); setAssoc(null); });
  $("more").addEventListener("click", function () { state.shown += PAGE; renderStories(); });

  // ---- associations -------------------------------------------------------------------------
  function assocLabel(a) {
    return a.base_attribute + " = " + a.base_value + " \u2192 " + a.compared_attribute + " = " + a.compared_value;
  }
  function setAssoc(a) {
    state.assoc = a;
    state.shown = PAGE;
    var box = $("assoc-filter");
    box.hidden = !a;
    $("assoc-filter-text").textContent = a ? "Example stories of " + assocLabel(a) + " (scope " + a.scope +
      "; models " + a.models.join(", ") + "): prompted " + a.base_attribute + " = " + a.base_value +
      ", extracted " + a.compared_attribute + " = " + a.compared_value + "." : "";
    document.querySelectorAll("#assoc-body tr").forEach(function (tr) {
      tr.classList.toggle("active", !!a && tr.getAttribute("data-index") === String(a.index));
    });
    renderStories();
  }
  $("assoc-clear").addEventListener("click", function () { setAssoc(null); });

  function cmp(a, b, key, dir) {
    var x = a[key], y = b[key];
    if (x === null || x === undefined) { return (y === null || y === undefined) ? 0 : 1; }
    if (y === null || y === undefined) { return -1; }
    return dir * (x - y);
  }
  function sortedAssocs(list) {
    var second = sort.key === "mean_lift" ? "n_models" : "mean_lift";
    return list.slice().sort(function (a, b) {
      return cmp(a, b, sort.key, sort.dir) || cmp(a, b, second, -1) || (a.index - b.index);
    });
  }
  function renderAssocs() {
    var scope = $("assoc-scope").value, harmful = $("assoc-harmful").checked;
    var list = sortedAssocs(assocs.filter(function (a) {
      return (!scope || a.scope === scope) && (!harmful || a.harmful === true);
    }));
    document.querySelectorAll("#assoc-table th[data-sort]").forEach(function (th) {
      var key = th.getAttribute("data-sort");
      if (key === sort.key) { th.setAttribute("aria-sort", sort.dir < 0 ? "descending" : "ascending"); }
      else { th.removeAttribute("aria-sort"); }
    });
    var body = $("assoc-body");
    var frag = document.createDocumentFragment();
    list.forEach(function (a) {
      var tr = el("tr");
      tr.setAttribute("data-association-id", a.id);
      tr.setAttribute("data-scope", a.scope);
      tr.setAttribute("data-index", String(a.index));
      if (state.assoc && state.assoc.index === a.index) { tr.classList.add("active"); }
      tr.appendChild(el("td", null, a.scope === "all" ? "all languages" : langLabel(a.scope)));
      var label = el("td");
      label.appendChild(el("div", null, assocLabel(a)));
      if (a.published === true) { label.appendChild(el("div", "muted published", "published by StereoTales")); }
      if (a.per_model && a.per_model.length) {
        var det = el("details");
        det.appendChild(el("summary", "muted", "per model"));
        var ul = el("ul");
        a.per_model.forEach(function (r) {
          ul.appendChild(el("li", null, r.model + ": " + num(r.count) + " of " + num(r.row_total) + " (" +
            fix(r.fraction, 3) + "), lift " + fix(r.lift, 2) + ", adjusted p " +
            (r.p_adjusted === null || r.p_adjusted === undefined ? "\u2013" : Number(r.p_adjusted).toPrecision(2)) +
            (r.significant ? ", significant" : "")));
        });
        det.appendChild(ul);
        label.appendChild(det);
      }
      tr.appendChild(label);
      var models = el("td", "num", num(a.n_models));
      models.title = a.models.join(", ");
      models.appendChild(el("div", "muted", a.models.join(", ")));
      tr.appendChild(models);
      tr.appendChild(el("td", "num", fix(a.mean_fraction, 3)));
      tr.appendChild(el("td", "num", fix(a.mean_lift, 2)));
      tr.appendChild(el("td", "num", a.median_harm === null ? "not rated" : fix(a.median_harm, 1)));
      tr.appendChild(el("td", "num", num(a.n_ratings)));
      tr.appendChild(el("td", "num", fix(a.share_realistic, 2)));
      tr.appendChild(el("td", null, a.harmful === true ? "yes" : (a.harmful === false ? "no" : "\u2013")));
      var cell = el("td");
      var shown = stories.filter(function (s) { return assocMatch(a, s); }).length;
      var btn = el("button", "assoc-show", num(shown) + " stories");
      btn.type = "button";
      btn.title = num(shown) + " example stories on this page, " + num(a.n_examples) + " in the run";
      btn.addEventListener("click", function () {
        resetFilters();
        setAssoc(a);
        $("stories-section").scrollIntoView();
      });
      cell.appendChild(btn);
      tr.appendChild(cell);
      frag.appendChild(tr);
    });
    body.replaceChildren(frag);
    $("assoc-count").textContent = num(list.length) + " of " + num(assocs.length) + " associations";
  }

  if (assocs === null || assocs === undefined) {
    $("assoc-note").textContent = "No association table for this run: associations_shared.parquet is not in the " +
      "run's data folder yet (stage 04: make associations). Stories can still be browsed below.";
  } else if (!assocs.length) {
    $("assoc-note").textContent = "Stage 04 found no association shared across models in this run.";
  } else {
    $("assoc-note").textContent = "Click a column title to sort (again to reverse); \u201cstories\u201d lists the " +
      "association\u2019s example stories on this page: its models" + "\u2019 stories (in its language unless the scope is all) " +
      "prompted with the base value whose parsed extraction has the compared value." +
      (D.has_values ? "" : " Per-model values: associations_values.parquet is missing.") +
      (D.published ? " Compared with StereoTales\u2019 published associations (" + D.published.mode.replace("_", " ") +
        "): " + num(D.published.reproduced) + " of " + num(D.published.tested) + " tested ones reproduced, " +
        num(D.published.not_published) + " significant associations of this run not published." : "");
    $("assoc-controls").hidden = false;
    $("assoc-table").hidden = false;
    fillSelect($("assoc-scope"), uniq(assocs.map(function (a) { return a.scope; })), function (v) {
      return v === "all" ? "all languages" : langLabel(v);
    }, true);
    $("assoc-scope").addEventListener("change", renderAssocs);
    $("assoc-harmful").addEventListener("change", renderAssocs);
    document.querySelectorAll("#assoc-table button.sort").forEach(function (b) {
      b.addEventListener("click", function () {
        var key = b.getAttribute("data-sort");
        if (sort.key === key) { sort.dir = -sort.dir; } else { sort.key = key; sort.dir = -1; }
        renderAssocs();
      });
    });
    renderAssocs();
  }
  renderStories();
  document.body.setAttribute("data-ready", "1");
})();
"""
