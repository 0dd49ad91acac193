"""Top-k then top-p sampling on CPU without sorting the vocabulary (``generation.engine.cpu_top_k_first``).

vLLM 0.32's CPU sampler applies a request's top-k and top-p by sorting its whole logits row (151,936
entries for Qwen2.5) at every decoding step, and on a CPU that sort is a large share of a step. When a
request has a top-k, only its k largest logits can survive both filters, so the same two filters can be
applied to those k candidates alone (``torch.topk``), which costs a small fraction of the sort. What it
bought on the default's model is recorded in docs/benchmarks.md (`make bench-engine`) and
docs/measurements/engine_settings.csv.

:func:`top_k_top_p_mask` is that computation: the k largest logits (every logit tied with the k-th
kept, as vLLM keeps them), then of those, in ascending order, the ones whose cumulative probability is
at most ``1 - p`` set to ``-inf`` (the largest always kept): vLLM's rule (``apply_top_k_top_p``).
Two things can differ from vLLM's sort, both only where the nucleus boundary falls inside a tie or
within a rounding error: which of two tied logits is cut (vLLM's CPU sort is not stable; here ties are
ordered by token id), and the last bit of the softmax sum (summed over k entries instead of the whole
row). The engine field is therefore part of the cache key (storybias.engines.cache).

:class:`TopKTopPFirst` runs it inside vLLM through its documented extension point, a custom logits
processor (``LLM(logits_processors=[...])``; ``--logits-processors`` for the server): processors that
cannot change the argmax run after the temperature and just before vLLM's own top-k/top-p, which is
exactly where these filters belong. The engine then sends top-k and top-p in
``SamplingParams.extra_args`` and leaves vLLM's own off (``storybias.engines.base.top_k_top_p_fields``),
so vLLM's sampler skips its sort and draws from the masked logits. Whether the texts stay those of vLLM's
sort on the same seeds was measured (docs/benchmarks.md), not assumed; the cache key holds the setting.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, process_dict_updates

from storybias.engines.base import TOP_K_ARG, TOP_P_ARG


def candidate_width(logits: torch.Tensor, kth: torch.Tensor) -> int:
    """How many of each row's largest logits to take: every logit tied with the row's k-th (``kth``) is
    kept, as vLLM's ``logits_sort < kth`` mask keeps it. A logit already -inf (a structured-output
    constraint left fewer than k tokens) has no probability in either filter, so it is no candidate:
    counted, such a row would make the whole batch sort its vocabulary."""
    candidates = (logits >= kth) & (logits > -float("inf"))
    return max(int(candidates.sum(dim=1).max()), 1)


def top_k_top_p_mask(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``logits`` [rows, vocab] with every entry outside each row's top-``k`` (int, >= 1) and then
    outside its top-``p`` nucleus (float in (0, 1]) set to ``-inf``; a new tensor."""
    k = k.clamp(min=1, max=logits.shape[1]).to(torch.long)
    kth = logits.topk(int(k.max()), dim=1).values.gather(1, (k - 1).unsqueeze(1))
    values, ids = logits.topk(candidate_width(logits, kth), dim=1)
    values = values.masked_fill(values < kth, -float("inf"))
    # ascending by (value, token id): sort by id, then a stable sort by value
    ids, by_id = ids.sort(dim=1)
    values, by_value = values.gather(1, by_id).sort(dim=1, stable=True)
    ids = ids.gather(1, by_value)
    cumulative = values.softmax(dim=1).cumsum(dim=1)
    cut = cumulative <= 1 - p.to(cumulative.dtype).unsqueeze(1)
    cut[:, -1] = False  # the largest logit always stays
    masked = torch.full_like(logits, -float("inf"))
    return masked.scatter_(1, ids, values.masked_fill(cut, -float("inf")))


def _row_setting(params: SamplingParams, prompt_ids: Any, output_ids: Any) -> tuple[int, float] | None:
    extra = params.extra_args or {}
    if TOP_K_ARG not in extra:
        return None
    return int(extra[TOP_K_ARG]), float(extra.get(TOP_P_ARG, 1.0))


class TopKTopPFirst(LogitsProcessor):
    """vLLM logits processor: :func:`top_k_top_p_mask` on the rows whose request carries the settings."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool):
        self.rows: dict[int, tuple[int, float]] = {}

    def is_argmax_invariant(self) -> bool:
        return True  # the largest logit is never cut: runs after the temperature, skipped for greedy

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, _row_setting)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        index = torch.tensor(sorted(self.rows), dtype=torch.long)
        k = torch.tensor([self.rows[i][0] for i in index.tolist()], dtype=torch.long)
        p = torch.tensor([self.rows[i][1] for i in index.tolist()], dtype=torch.float32)
        logits[index] = top_k_top_p_mask(logits[index], k, p)
        return logits
