"""The work of a profile before it runs (`make plan PARAMS=...`): per design and model, stage 01's
requests, expected prompt and output tokens, and the wall time on ``planning.gpus`` GPUs at a measured
``planning.tokens_per_second_per_replica``, so a researcher can size a Ray cluster first.

Estimate rule (stated in the printout too):

- requests: exact, from the plan (``generate.plan``: designs x languages x prompts x samples x models);
- prompt tokens: each rendered prompt at ``cost.CHARS_PER_TOKEN`` characters per token plus the chat
  template's ``cost.CHAT_OVERHEAD_TOKENS`` (the rule of the served-model cost estimate; it errs high);
- output tokens: every request at its ``max_tokens`` (an upper bound: most stories stop earlier);
- replicas: ``gpus // tensor_parallel_size`` of the model (at least 1; the Ray backend's
  ``ray.tensor_parallel_size`` wins when set); wall time = output tokens / (tokens/s per replica x
  replicas). The measured tokens/s is end-to-end output tokens/s of a replica at the profile's prompt
  lengths, so prefill is inside it; start-up (minutes per replica) is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from storybias.config.params import ModelSpec, Params, PlanningSettings
from storybias.config.plan import plan
from storybias.tools.cost import CHARS_PER_TOKEN, CHAT_OVERHEAD_TOKENS

RULE = (
    f"prompt tokens = characters / {CHARS_PER_TOKEN} + {CHAT_OVERHEAD_TOKENS} per request; output tokens = "
    "max_tokens per request (upper bound); wall = output tokens / (tokens/s per replica x replicas), "
    "replicas = gpus // tensor_parallel_size; start-up not counted"
)


@dataclass
class PlanRow:
    design: str
    model: str
    requests: int
    prompt_tokens: int
    output_tokens: int
    replicas: int
    wall_seconds: float


def replicas(spec: ModelSpec, planning: PlanningSettings, tensor_parallel_size: int | None = None) -> int:
    """How many replicas of ``spec`` fit on ``planning.gpus`` GPUs (CPU models: one per GPU slot)."""
    tp = tensor_parallel_size or spec.tensor_parallel_size
    return max(1, planning.gpus // tp)


def plan_rows(
    planned: pd.DataFrame, specs: list[ModelSpec], planning: PlanningSettings, tensor_parallel_size: int | None = None
) -> list[PlanRow]:
    """One row per (design, model) of ``planned`` (generate.plan's frame: ``design``, ``model``,
    ``prompt``, ``_sampling`` with ``max_tokens``)."""
    by_name = {s.name: s for s in specs}
    rows = []
    for (design, model), group in planned.groupby(["design", "model"], sort=True):
        prompt_tokens = int(sum(len(p) // CHARS_PER_TOKEN + CHAT_OVERHEAD_TOKENS for p in group["prompt"]))
        output_tokens = int(sum(int(s["max_tokens"]) for s in group["_sampling"]))
        n = replicas(by_name[model], planning, tensor_parallel_size)
        rows.append(
            PlanRow(
                design=str(design),
                model=str(model),
                requests=len(group),
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                replicas=n,
                wall_seconds=output_tokens / (planning.tokens_per_second_per_replica * n),
            )
        )
    return rows


def profile_plan(params: Params) -> list[PlanRow]:

    engine = params.generation.engine
    tp = engine.ray.tensor_parallel_size if engine.backend == "ray" else None
    return plan_rows(plan(params), list(params.generation.models), params.planning, tp)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def format_plan(rows: list[PlanRow], planning: PlanningSettings) -> str:
    lines = [
        f"stage 01 work on {planning.gpus} GPU(s) at {planning.tokens_per_second_per_replica:g} output tokens/s "
        "per replica (planning.*):"
    ]
    for r in rows:
        lines.append(
            f"  {r.design:<12} {r.model:<28} {r.requests:>9,} requests  {r.prompt_tokens:>13,} prompt  "
            f"<= {r.output_tokens:>13,} output tokens  {r.replicas:>3} replica(s)  ~{_duration(r.wall_seconds)}"
        )
    total = sum(r.wall_seconds for r in rows)  # models and designs run one after another
    lines.append(
        f"  total: {sum(r.requests for r in rows):,} requests, <= {sum(r.output_tokens for r in rows):,} "
        f"output tokens, ~{_duration(total)} (designs and models one after another)"
    )
    lines.append(f"  estimate rule: {RULE}")
    return "\n".join(lines)
