"""generation.engine.cpu_top_k_first (storybias.engines.cpu_sampling): top-k then top-p on the k largest
logits gives the logits vLLM's sort-based filter gives, the processor follows vLLM's batch updates, and
every path that talks to a CPU engine sends the settings where the processor reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

from storybias.config.params import EngineSettings, ModelSpec, Sampling
from storybias.engines import openai_endpoint
from storybias.engines.base import TOP_K_ARG, TOP_K_FIRST_PROCESSOR, TOP_P_ARG, ChatRequest, top_k_top_p_fields
from storybias.engines.cpu_sampling import TopKTopPFirst, candidate_width, top_k_top_p_mask

VOCAB = 151_936  # Qwen2.5's vocabulary: the row vLLM sorts at every step


def vllm_filter(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return apply_top_k_top_p_pytorch(logits.clone(), k.clone(), p.clone(), allow_cpu_sync=True)


def kept(row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(~torch.isinf(row)).flatten().tolist())


def test_without_ties_the_masked_logits_equal_vllms():
    """Continuous logits (no two equal): the same kept sets and the same values, row by row, for a
    spread of k and p (a nucleus of one token, of the whole top-k, and in between)."""
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(24, VOCAB, generator=generator) * 3
    logits[:, :300] += torch.randn(24, 300, generator=generator) * 5  # a peaked head, as a language model's
    k = torch.tensor([1, 2, 5, 20, 50, 50, 50, 50, 100, 400, 1000, 50] * 2)
    p = torch.tensor([1.0, 0.5, 0.9, 0.95, 0.95, 0.99, 1.0, 0.05, 0.8, 0.95, 0.7, 0.3] * 2)
    ours, theirs = top_k_top_p_mask(logits, k, p), vllm_filter(logits, k, p)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert torch.equal(ours[~torch.isinf(ours)], theirs[~torch.isinf(theirs)])
    assert len(kept(ours[0])) == 1 and len(kept(ours[6])) == 50, "k=1 keeps one; p=1 keeps the whole top-k"


def test_bf16_ties_only_change_which_tied_token_is_cut():
    """bf16 logits tie often. Every logit tied with the k-th is kept by both; where the nucleus
    boundary falls inside a tie, the two filters may cut different members of it, and only that: same
    number kept, and the tokens kept by one filter only all carry the boundary's value."""
    generator = torch.Generator().manual_seed(11)
    logits = (torch.randn(64, VOCAB, generator=generator) * 2.5).to(torch.bfloat16).float()
    logits[:, :200] += (torch.randn(64, 200, generator=generator) * 4).to(torch.bfloat16).float()
    k, p = torch.full((64,), 50), torch.full((64,), 0.95)
    ours, theirs = top_k_top_p_mask(logits, k, p), vllm_filter(logits, k, p)
    differing = 0
    for row, (a, b) in enumerate(zip(ours, theirs)):
        mine, vllms = kept(a), kept(b)
        assert len(mine) == len(vllms), row
        if mine != vllms:
            differing += 1
            boundary = {float(logits[row, i]) for i in mine ^ vllms}
            assert len(boundary) == 1 and min(float(logits[row, i]) for i in vllms) in boundary, row
    assert differing < len(ours), "most rows are identical"


def test_a_constrained_row_with_fewer_finite_logits_than_k_matches_vllm():
    """A structured-output constraint sets all but a few logits to -inf before sampling (e.g. the explicit
    task's four words): both filters keep the finite ones, and the other rows are filtered as usual."""
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(3, VOCAB, generator=generator) * 3
    allowed = torch.tensor([11, 500, 70_000, 151_000])
    logits[1] = logits[1].masked_fill(~torch.isin(torch.arange(VOCAB), allowed), -float("inf"))
    k, p = torch.full((3,), 50), torch.tensor([0.95, 1.0, 0.9])
    ours, theirs = top_k_top_p_mask(logits, k, p), vllm_filter(logits, k, p)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert torch.equal(ours[~torch.isinf(ours)], theirs[~torch.isinf(theirs)])
    assert kept(ours[1]) == set(allowed.tolist()) and len(kept(ours[2])) <= 50
    kth = logits.topk(50, dim=1).values[:, -1:]
    assert candidate_width(logits, kth) == 50, "the constrained row does not widen the batch to its vocabulary"


def test_every_logit_tied_with_the_kth_is_kept():
    logits = torch.full((1, 1000), -5.0)
    logits[0, :3] = torch.tensor([4.0, 3.0, 2.0])
    logits[0, 10:14] = 2.0  # four more ties with the 3rd largest
    out = top_k_top_p_mask(logits, torch.tensor([3]), torch.tensor([1.0]))
    assert (
        kept(out[0])
        == {0, 1, 2, 10, 11, 12, 13}
        == kept(vllm_filter(logits, torch.tensor([3]), torch.tensor([1.0]))[0])
    )


def added(index: int, params: SamplingParams) -> tuple:
    return (index, params, [1, 2], [])


def test_the_processor_filters_only_the_rows_that_ask_and_follows_the_batch():
    """Rows whose request carries the arguments are filtered, others untouched; a removed request's row
    is forgotten and a moved one is followed (vLLM's persistent batch)."""
    proc = TopKTopPFirst(None, torch.device("cpu"), False)
    asking = SamplingParams(temperature=1.0, extra_args={TOP_K_ARG: 2, TOP_P_ARG: 1.0})
    plain = SamplingParams(temperature=1.0)
    proc.update_state(
        BatchUpdate(batch_size=3, removed=[], added=[added(0, asking), added(1, plain), added(2, asking)], moved=[])
    )
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]] * 3)
    out = proc.apply(logits.clone())
    assert torch.isinf(out[0, :2]).all() and torch.equal(out[0, 2:], torch.tensor([3.0, 4.0]))
    assert torch.equal(out[1], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert proc.is_argmax_invariant()
    proc.update_state(
        BatchUpdate(batch_size=2, removed=[0], added=[], moved=[(2, 0, MoveDirectionality.UNIDIRECTIONAL)])
    )
    out = proc.apply(logits[:2].clone())
    assert torch.isinf(out[0, :2]).all() and not torch.isinf(out[1]).any()


def test_the_settings_travel_in_extra_args_only_when_on_and_a_top_k_is_set():
    s = Sampling(temperature=1.0, top_p=0.95, top_k=50)
    assert top_k_top_p_fields(s, False) == {"top_k": 50, "top_p": 0.95}
    assert top_k_top_p_fields(s, True) == {"top_k": 0, "top_p": 1.0, "extra_args": {TOP_K_ARG: 50, TOP_P_ARG: 0.95}}
    no_k = s.model_copy(update={"top_k": -1})
    assert top_k_top_p_fields(no_k, True) == {"top_k": -1, "top_p": 0.95}, "no top-k: vLLM's own top-p"
    assert SamplingParams(**top_k_top_p_fields(s, True)).extra_args == {TOP_K_ARG: 50, TOP_P_ARG: 0.95}


def test_a_local_vllm_server_gets_the_processor_and_the_request_its_arguments(monkeypatch):
    from storybias.engines import local_servers

    cpu = ModelSpec(name="m", source="embedded")
    command = local_servers.server_command(cpu, EngineSettings(), 1, 8000, None, Path("/w"), "m")
    assert command[command.index("--logits-processors") + 1] == TOP_K_FIRST_PROCESSOR
    entry = {"base_url": "http://127.0.0.1:8000/v1", "model_id": "m"}
    monkeypatch.setattr(
        openai_endpoint.OpenAIEngine, "__init__", lambda self, spec, seed, **kw: setattr(self, "kw", kw)
    )
    engine = openai_endpoint.OpenAIEngine.for_local_server(cpu, entry, EngineSettings(cpu_top_k_first=True), 1)
    request = ChatRequest("k", [{"role": "user", "content": "Write."}], Sampling(top_k=50, top_p=0.95), 3)
    body = openai_endpoint.request_kwargs(engine.kw["endpoint"], request)
    assert body["top_p"] == 1.0 and body["extra_body"]["top_k"] == 0
    assert body["extra_body"]["vllm_xargs"] == {TOP_K_ARG: 50, TOP_P_ARG: 0.95}
    off = openai_endpoint.OpenAIEngine.for_local_server(cpu, entry, EngineSettings(), 1)
    assert "vllm_xargs" not in openai_endpoint.request_kwargs(off.kw["endpoint"], request)["extra_body"]


def test_the_ray_backend_refuses_the_setting():
    with pytest.raises(ValueError, match="cpu_top_k_first"):
        EngineSettings(backend="ray", cpu_top_k_first=True)
