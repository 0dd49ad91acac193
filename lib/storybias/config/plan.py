"""The plan of a run: every story a profile asks for (one row each, with its prompt, seed and
conditions) and the columns of the stories table (``stories.parquet``). Stage 01 generates the plan;
stage 04 and ``make check-params`` size a run from it; the cost and wall-time planners price it."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa

from storybias.config.designs import all_condition_columns, design_cells, render_prompt
from storybias.config.params import Params
from storybias.config.prompts import ALL_CONDITION_COLUMNS, explicit_labels, request_seed, sample_cells, story_id


def stories_schema() -> pa.Schema:
    """stories.parquet: the condition columns of every registered design (storybias.config.designs; the
    built-in designs' columns in their fixed order, then any other design's new ones)."""
    return pa.schema(
        [
            ("story_id", pa.string()),
            ("design", pa.string()),
            ("language", pa.string()),
            ("model", pa.string()),
            ("prompt_id", pa.string()),
            ("sample", pa.int64()),
            ("seed", pa.int64()),
            ("prompt", pa.string()),
            ("text", pa.string()),
            ("finish_reason", pa.string()),
            ("n_tokens", pa.int64()),
            *[(c, pa.string()) for c in all_condition_columns()],
            ("n_prompt_tokens", pa.int64()),
            ("gen_config", pa.string()),  # the key of the story's request in data/<run>/cache (storybias.engines.cache)
            ("generated_at", pa.string()),
            ("error", pa.string()),  # why the request failed (finish_reason "error"); null otherwise
        ]
    )


def plan_columns() -> list[str]:
    return [
        f.name
        for f in stories_schema()
        if f.name not in ("text", "finish_reason", "n_tokens", "n_prompt_tokens", "gen_config", "generated_at", "error")
    ]


# the built-in designs' schema (what stories_schema() is when no other design is registered)
STORIES_SCHEMA = pa.schema(
    [f for f in stories_schema() if not f.name.startswith("cond_") or f.name in ALL_CONDITION_COLUMNS]
)


ERROR = "error"  # finish_reason of a request that failed after retries


def plan(params: Params) -> pd.DataFrame:
    """Every story the run asks for, one row each, with its prompt, seed and conditions."""
    rows = []
    base_seed = params.generation.seed
    condition_columns = all_condition_columns()
    for design, run in params.enabled_designs().items():
        cells = sample_cells(design_cells(design), run.n_prompts, base_seed, run.restrict or None)
        if run.tasks is not None:  # a design with a task condition (params checks it)
            cells = [c for c in cells if c.conditions["cond_task"] in run.tasks]
        sampling = params.sampling_for(design)
        for model in params.generation.models:
            if run.models is not None and model.name not in run.models:
                continue
            for language in run.languages:
                for cell in cells:
                    prompt = render_prompt(cell, language)
                    # the explicit task answers with one of its localised labels (Feng et al.)
                    choice = (
                        list(explicit_labels(language).values())
                        if cell.conditions.get("cond_task") == "explicit"
                        else None
                    )
                    task_sampling = sampling.model_dump()
                    if choice is not None:
                        task_sampling["max_tokens"] = min(task_sampling["max_tokens"], 16)
                    for sample in range(run.samples_per_prompt):
                        sid = story_id(design, language, model.name, cell.prompt_id, sample)
                        row: dict[str, Any] = {c: None for c in condition_columns}
                        row.update(cell.conditions)
                        row.update(
                            story_id=sid,
                            design=design,
                            language=language,
                            model=model.name,
                            prompt_id=cell.prompt_id,
                            sample=sample,
                            seed=request_seed(base_seed, sid),
                            prompt=prompt,
                            _sampling=task_sampling,
                            _choice=choice,
                        )
                        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame["story_id"].duplicated().any():  # would mean two cells share a prompt_id: a design bug
        raise RuntimeError("duplicate story_id in the plan")
    return frame
