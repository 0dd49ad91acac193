"""What a run will ask of its served models (``source: openai``), printed by ``make check-params``:
requests and tokens per stage and model, and the cost where the profile gives prices
(``price_input_per_mtok`` / ``price_output_per_mtok``, per million tokens; storybias knows no prices).

Counts are exact (the plan); tokens are estimates: prompts at ``CHARS_PER_TOKEN`` characters per
token (fewer than most tokenizers' average, so the estimate errs high), outputs at their ``max_tokens``
(an upper bound: most answers stop earlier). Retries of unparsed answers and the judge's ratings (their
number depends on the associations found) are not counted; the judge's cost per rating is shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from storybias.config.params import ModelSpec, Params
from storybias.config.plan import plan
from storybias.stages.extract.answers import extraction_messages
from storybias.stages.extract.facts import map_messages

CHARS_PER_TOKEN = 3
CHAT_OVERHEAD_TOKENS = 12  # role markers of the chat template


@dataclass
class CostRow:
    stage: str
    model: str
    requests: int
    input_tokens: int
    output_tokens: int  # upper bound (max_tokens)
    cost: float | None  # None when the profile gives no price

    def line(self) -> str:
        money = (
            f"{self.cost:,.2f}"
            if self.cost is not None
            else "(no price: set price_input_per_mtok / price_output_per_mtok)"
        )
        return (
            f"  {self.stage:<9} {self.model:<28} {self.requests:>9,} requests  {self.input_tokens:>13,} input  "
            f"<= {self.output_tokens:>13,} output tokens  cost <= {money}"
        )


def _tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN + CHAT_OVERHEAD_TOKENS


def _cost(spec: ModelSpec, input_tokens: int, output_tokens: int) -> float | None:
    if spec.price_input_per_mtok is None or spec.price_output_per_mtok is None:
        return None
    return (input_tokens * spec.price_input_per_mtok + output_tokens * spec.price_output_per_mtok) / 1e6


def estimate(params: Params) -> list[CostRow]:
    """One row per (stage, served model): generation and extraction; the judge per rating."""
    served = [
        m
        for m in (*params.generation.models, *params.extract.models, *params.associations.judge.models)
        if m.source == "openai"
    ]
    if not served:
        return []

    rows: list[CostRow] = []
    planned = plan(params)
    for spec in params.generation.models:
        if spec.source != "openai":
            continue
        mine = planned[planned["model"] == spec.name]
        inputs = int(sum(_tokens(p) for p in mine["prompt"]))
        outputs = int(sum(s["max_tokens"] for s in mine["_sampling"]))
        rows.append(CostRow("generate", spec.name, len(mine), inputs, outputs, _cost(spec, inputs, outputs)))
    settings = params.extract
    stories = planned[planned["cond_task"].fillna("") != "explicit"]
    for spec in settings.models:
        if spec.source != "openai":
            continue
        n_check = 0
        if len(settings.models) == 1 and settings.self_consistency_sample != 0:
            n_check = (
                len(stories)
                if settings.self_consistency_sample is None
                else min(settings.self_consistency_sample, len(stories))
            )
        n = len(stories) + n_check
        story_tokens = [s["max_tokens"] for s in stories["_sampling"]]
        # the worked examples are sent with every story (an endpoint's prefix cache may bill them less)
        instructions = {
            d: _tokens(
                "".join(m["content"] for m in extraction_messages("", tuple(getattr(settings.sections, d)), settings))
            )
            for d in stories["design"].unique()
        }
        inputs = int(sum(instructions[d] + t for d, t in zip(stories["design"], story_tokens)))
        inputs = int(inputs * n / max(len(stories), 1))
        outputs = n * settings.max_tokens
        if settings.prompt_design == "two_step":  # step 2: the facts (at most 400 characters) -> the fields
            with_demo = [d for d in stories["design"].unique() if "demographics" in getattr(settings.sections, d)]
            n_map = int(stories["design"].isin(with_demo).sum() * n / max(len(stories), 1))
            map_prompt = _tokens("".join(m["content"] for m in map_messages("", settings))) + _tokens("x" * 400)
            inputs += n_map * map_prompt
            outputs += n_map * settings.max_tokens
            n += n_map
        rows.append(CostRow("extract", spec.name, n, inputs, outputs, _cost(spec, inputs, outputs)))
    judge = params.associations.judge
    for spec in judge.models:
        if spec.source != "openai":
            continue
        per = _tokens("x" * 2400)  # the judge prompt is about 2,400 characters
        rows.append(CostRow("judge", spec.name, 1, per, judge.max_tokens, _cost(spec, per, judge.max_tokens)))
    return rows


def format_estimate(rows: list[CostRow]) -> str:
    lines = [
        "served models: what this run asks (outputs at max_tokens, an upper bound; judge: per rating, "
        "times repetitions x associations found):"
    ]
    lines += [r.line() for r in rows]
    priced = [r.cost for r in rows if r.stage != "judge"]
    known = [c for c in priced if c is not None]
    if priced and len(known) == len(priced):
        lines.append(f"  total (generation + extraction) <= {sum(known):,.2f}")
    return "\n".join(lines)
