"""Story explorer: one self-contained HTML page to browse a run's stories and associations.

``make explorer`` (``python -m storybias.cli explorer PARAMS``) writes ``figures/<run>/explorer.html``.
The page needs no server and nothing from the network: data, CSS and (vanilla) JavaScript are inline,
so it opens from disk (file://) and can be mailed around. The page's HTML skeleton, CSS and script
are package files in ``storybias/stages/explorer/assets/`` (read with ``importlib.resources``); this module
fills them in with the data that :mod:`storybias.stages.explorer.data` builds.

What it shows:

- the stories (prompt, text, validity, extraction), filterable by design, model, language,
  conditioning attribute and value (stereotales: the prompted attribute and its value, plus the
  scenario; bedtime and occupations: their condition columns), validity, extraction state and a
  free-text search;
- stage 04's shared associations (``associations_shared.parquet``), sortable by lift, models
  sharing and harm, each linked to its example stories: stories of the association's models (and
  language, when its scope is one) prompted with ``base_attribute = base_value`` whose extracted
  ``demo_<compared_attribute>`` is ``compared_value`` (parsed extractions only, as in stage 04);
- a compare view, after BiasedTales-ML (Ouyang, Luo, Xiao & Zhu, arXiv:2604.17008), Figs. 8-9: one
  prompt, two sides (each a model x language pair) in two columns, each with the prompt as that side
  was asked it and every story of that side for that prompt (sample order), with validity and
  extraction as in the list. Stories of one prompt share its ``prompt_key`` (``<design>|<prompt_id>``:
  ``prompt_id`` is the language-independent grid cell). A "compare" button on each story opens it
  with that story's prompt and (model, language) on the left and, on the right, the next model in
  the same language (the next language when the design has one model). A side with no story of the
  prompt on the page says so, and whether the per-cell cap left it out.

Stories are LLM output and so untrusted: the data travel as JSON in a
``<script type="application/json">`` element with every ``<``, ``>`` and ``&`` written as a
``\\uXXXX`` escape (nothing inside can close the element), and the script renders every value with
``textContent``, never as markup. A Content-Security-Policy allows only the page's own script (by
hash) and no network access at all.

At paper scale (~650k stories) the page embeds a sample: at most ``max_stories_per_cell`` stories per
design x model x language; within a cell, stories that exemplify an association come first (round
robin over the associations), then the rest; both by sample index, then by prompt in a pseudo-random
order (a hash of the prompt key) that is the same in every cell, so that the cells embed the same
prompts where they can and the compare view finds a prompt's stories for every model and language.
The page says how many stories the run has and how many it embeds.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from storybias.config.params import Params
from storybias.config.prompts import ALL_CONDITION_COLUMNS, LANGUAGES
from storybias.core import artifacts
from storybias.core.io import atomic_open
from storybias.core.locks import holds_run_lock
from storybias.evidence.released_associations import ANY_SCOPE, GLOBAL_SCOPE
from storybias.stages.explorer.data import (
    ASSOC_KEYS,
    CELL,
    EXTRACTION_SKIP,
    association_examples,
    association_records,
    cell_counts,
    clean,
    extraction_rows,
    published_counts,
    sample_story_ids,
    story_record,
)

DEFAULT_MAX_STORIES_PER_CELL = 200


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
    ext_rows = extraction_rows(extractions, stories)
    has_validity = "is_valid" in stories
    story_list = [story_record(row, ext_rows.get(row["story_id"]), has_validity) for row in stories.to_dict("records")]
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
        associations = association_records(
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
        "cells": cell_counts(population, extractions, embedded),
        "stories": story_list,
        "associations": associations,
        "published": None if published is None else published_counts(published),
    }


# --------------------------------------------------------------------------------------------------
# Page
# --------------------------------------------------------------------------------------------------
def _json_for_script(payload: dict[str, Any]) -> str:
    """JSON that cannot end its <script> element: no literal <, > or & anywhere (JSON.parse reads
    the \\u escapes back); NaN never appears (it is not JSON)."""
    text = json.dumps(clean(payload), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _asset(name: str) -> str:
    """One of the page's package files (``storybias/stages/explorer/assets/``: page.html, style.css,
    explorer.js), read exactly as committed: the script's hash in the content-security policy is the
    hash of these bytes."""
    return (resources.files("storybias.stages.explorer") / "assets" / name).read_bytes().decode("utf-8")


def render_html(payload: dict[str, Any]) -> str:
    """The page: inline CSS, the data as JSON, inline vanilla JavaScript. No external resource.
    The three parts are package files (``assets/``), so that they are edited, linted and
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
        extractions = extractions.drop(columns=[c for c in EXTRACTION_SKIP if c in extractions])
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
