"""`make decode-ceiling` (storybias.tools.decode_ceiling): the shapes of a decoder, and the arithmetic that
turns timed matrix multiplies into the most tokens/s a step and a bench-engine trial can reach. The
timing itself, on the embedded model, is in test_decode_ceiling_slow.py."""

from __future__ import annotations

import pytest
import torch

from storybias.tools import decode_ceiling
from storybias.tools.decode_ceiling import (
    DecoderShapes,
    ceiling,
    computed_prompt_tokens,
    shapes_of,
    step_flops,
    step_seconds,
    trial_seconds,
)

# The keys of the embedded 1.5B's config.json that the tool reads (Qwen2.5-Coder-1.5B-Instruct)
QWEN_1_5B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}


def test_the_shapes_of_qwen2_5_1_5b_hold_its_published_parameter_count():
    shapes = shapes_of(QWEN_1_5B)
    assert shapes.projections() == {
        "qkv": (1536 + 2 * 2 * 128, 1536),  # 12 query heads of 128, 2 key-value heads (grouped-query attention)
        "o": (1536, 1536),
        "gate_up": (2 * 8960, 1536),
        "down": (1536, 8960),
    }
    assert shapes.head() == (151936, 1536)
    # Qwen2.5's report: 1.54B parameters, 1.31B of them outside the embedding (biases and norms are the rest)
    in_layers = shapes.layers * sum(n * k for n, k in shapes.projections().values())
    assert in_layers == pytest.approx(1.31e9, rel=0.01)
    assert in_layers + 151936 * 1536 == pytest.approx(1.54e9, rel=0.01)
    # a decode step: two multiply-adds per weight and sequence, the head included
    assert step_flops(shapes, 64) == 2 * 64 * (in_layers + 151936 * 1536)


def test_a_config_without_a_decoder_s_keys_is_named():
    with pytest.raises(ValueError, match="intermediate_size, num_hidden_layers"):
        shapes_of({"hidden_size": 8, "num_attention_heads": 2, "vocab_size": 10})
    no_gqa = {k: v for k, v in QWEN_1_5B.items() if k != "num_key_value_heads"}
    assert shapes_of(no_gqa).kv_heads == 12, "without the key, every head has its own keys and values"


def test_step_and_trial_time_add_up_from_the_timed_calls():
    shapes = DecoderShapes(hidden=8, intermediate=16, layers=2, q_heads=2, kv_heads=1, vocab=32)
    decode = {"qkv": 0.001, "o": 0.001, "gate_up": 0.001, "down": 0.001, "head": 0.002}
    assert step_seconds(shapes, decode) == pytest.approx(2 * 0.004 + 0.002)
    assert ceiling(shapes, decode, 64) == pytest.approx(64 / 0.010)
    prefill = {"qkv": 0.01, "o": 0.01, "gate_up": 0.01, "down": 0.01, "head": 0.005}
    # 2000 prompt tokens at 1000 rows a step: two steps through both layers, one head; then 3 x 10 decode steps
    seconds = trial_seconds(shapes, decode, prefill, prefill_rows=1000, prompt_tokens=2000, waves=3, max_tokens=10)
    assert seconds == pytest.approx(2 * 2 * 0.04 + 0.005 + 3 * 10 * 0.010)
    # `--n-prompts 1`: the one prompt is in the prefix cache after the warm-up, so no prefill step is left
    assert computed_prompt_tokens([[1, 2, 3, 4]]) == 0
    one = trial_seconds(shapes, decode, prefill, prefill_rows=1, prompt_tokens=0, waves=1, max_tokens=10)
    assert one == pytest.approx(0.005 + 10 * 0.010)


def test_the_prefill_counted_leaves_out_what_the_prefix_cache_holds():
    system = [1, 2, 3]  # the chat template's opening, the same in every prompt
    prompts = [system + [10, 11], system + [20], system + [30, 31, 32], system + [40, 41]]
    # the first prompt was answered in the warm-up: cached whole; the others pay for what follows the prefix
    assert computed_prompt_tokens(prompts, warm_up=1) == 1 + 3 + 2
    assert computed_prompt_tokens(prompts, warm_up=0) == 2 + 1 + 3 + 2
    assert computed_prompt_tokens([system, system], warm_up=0) == 0, "identical prompts: all cached"
    assert computed_prompt_tokens([], warm_up=4) == 0


def test_the_int8_kernel_is_timed_as_vllm_runs_the_w8a8_copy():
    """vLLM's CPU int8 scaled mm (the activations' per-token quantization in the call) on a small shape:
    it runs, takes bf16 rows and gives bf16 outputs of the layer's width; an unknown numerics is named."""
    call = decode_ceiling.int8_linear(64, 128)
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    out = call(x)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (4, 64)
    assert decode_ceiling.time_linear(64, 128, 4, "int8", windows=1, window_seconds=0.01) > 0
    assert decode_ceiling.NUMERICS == ("bf16", "int8")
    with pytest.raises(ValueError, match="numerics: 'int4' is not one of bf16, int8"):
        decode_ceiling.time_linear(64, 128, 4, "int4")
