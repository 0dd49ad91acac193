"""Bounds checked before any work (issue #58 item 8): the size of the plan, counted from the profile's counts
without making it, and each answer's token budget against its model's context.

``samples_per_prompt: 1000000000000`` used to pass check-params and then fill memory in
``storybias.config.plan.plan`` until a ``MemoryError``; :func:`plan_size_problems` refuses it at once, naming
the key and the planned size. ``storybias.config.params.load`` runs both checks on every profile, so every
stage runs them before it starts.
"""

from __future__ import annotations

import os
from typing import Any

from storybias.config.designs import design_cells
from storybias.config.prompts import names as design_names
from storybias.config.prompts import sample_cells

# Stories one plan may hold: 10 million, 15 times StereoTales' ~650,000 stories (the largest of the three
# studies) and 17 times params/paper.yaml's plan; beyond it the plan alone (a prompt and its conditions per
# row) outgrows a machine's memory, and the generation outgrows any GPU budget.
MAX_PLANNED_STORIES = 10_000_000
# Memory one planned row takes in stage 01 (its prompt, conditions and sampling, as Python objects and in
# the data frame), rounded up from about 2 KB measured on the paper profile (tests/test_bounds.py).
PLAN_ROW_BYTES = 4096


def physical_memory_bytes() -> int | None:
    """The machine's memory (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def story_limit(memory: int | None = None) -> int:
    """The most stories a plan may hold here: :data:`MAX_PLANNED_STORIES`, or fewer where the machine's memory
    (``memory`` bytes, default: this machine's) cannot hold that many rows of :data:`PLAN_ROW_BYTES`."""
    memory = physical_memory_bytes() if memory is None else memory
    if memory is None:
        return MAX_PLANNED_STORIES
    return min(MAX_PLANNED_STORIES, memory // PLAN_ROW_BYTES)


def planned_counts(profile: Any) -> dict[str, int]:
    """Stories per enabled design of a generating profile, as ``storybias.config.plan.plan`` would make them
    (cells x models x languages x samples), counted without making a row; empty for a corpus profile."""
    if profile.corpus is not None:
        return {}
    counts: dict[str, int] = {}
    for design in design_names():
        run = getattr(profile.designs, design, None)
        if run is None or not run.enabled:
            continue
        cells = sample_cells(design_cells(design), run.n_prompts, profile.generation.seed, run.restrict or None)
        if run.tasks is not None:
            cells = [c for c in cells if c.conditions.get("cond_task") in run.tasks]
        models = [m for m in profile.generation.models if run.models is None or m.name in run.models]
        counts[design] = len(cells) * len(models) * len(run.languages) * run.samples_per_prompt
    return counts


def plan_size_problems(profile: Any, memory: int | None = None) -> list[str]:
    """The plan's size against :func:`story_limit`: one problem naming the planned size, the largest design's
    ``samples_per_prompt`` key and the limit's reason; none when the plan fits."""
    counts = planned_counts(profile)
    total = sum(counts.values())
    limit = story_limit(memory)
    if total <= limit:
        return []
    largest = max(counts, key=counts.__getitem__)
    reason = (
        f"{MAX_PLANNED_STORIES:,} stories, 15 times StereoTales' corpus"
        if limit == MAX_PLANNED_STORIES
        else f"what this machine's memory holds at {PLAN_ROW_BYTES:,} bytes a planned story"
    )
    return [
        f"designs.{largest}.samples_per_prompt: the plan would hold {total:,} stories "
        f"({largest}: {counts[largest]:,}), above the limit of {limit:,} ({reason}); "
        "lower samples_per_prompt, n_prompts, languages or models"
    ]


def _local(models: Any, key: str, names: list[str] | None = None) -> list[tuple[str, Any]]:
    """The local models of ``models`` (those named in ``names``, when given), each with its key."""
    return [
        (f"{key}[{i}]", m) for i, m in enumerate(models) if m.source != "openai" and (names is None or m.name in names)
    ]


def token_problems(profile: Any) -> list[str]:
    """Every answer budget (``max_tokens``) that does not fit, with a prompt, in the context
    (``max_model_len``) of a local model that answers under it; a served model's context is the endpoint's."""
    problems: list[str] = []
    budgets: list[tuple[str, int, list[tuple[str, Any]]]] = [
        ("extract.max_tokens", profile.extract.max_tokens, _local(profile.extract.models, "extract.models")),
        (
            "associations.judge.max_tokens",
            profile.associations.judge.max_tokens,
            _local(profile.associations.judge.models, "associations.judge.models"),
        ),
    ]
    if profile.corpus is None:
        base = profile.generation.sampling.max_tokens
        for design in design_names():
            run = getattr(profile.designs, design, None)
            if run is None or not run.enabled:
                continue
            override = run.sampling.max_tokens
            key = f"designs.{design}.sampling.max_tokens" if override is not None else "generation.sampling.max_tokens"
            models = _local(profile.generation.models, "generation.models", run.models)
            budgets.append((key, override if override is not None else base, models))
    for key, budget, models in budgets:
        for where, model in models:
            if budget >= model.max_model_len:
                problems.append(
                    f"{key}: {budget:,} tokens do not fit with a prompt in {where}.max_model_len "
                    f"({model.max_model_len:,}, model {model.name!r}); lower max_tokens or raise max_model_len"
                )
    return list(dict.fromkeys(problems))
