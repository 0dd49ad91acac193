"""The embedded models' W8A8 int8 copies (storybias.config.int8_weights): what the conversion writes, that
vLLM's compressed-tensors reader takes it for its int8 W8A8 path, and the error of its weights.

The checkpoint here is a two-layer decoder with Qwen2's tensor names and random weights; the real 0.5B's
layers are checked in test_int8_weights_slow.py."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from storybias.config import int8_weights

HIDDEN, INTERMEDIATE, KV, VOCAB, LAYERS = 64, 160, 16, 96, 2
LINEARS = {
    "self_attn.q_proj": (HIDDEN, HIDDEN),
    "self_attn.k_proj": (KV, HIDDEN),
    "self_attn.v_proj": (KV, HIDDEN),
    "self_attn.o_proj": (HIDDEN, HIDDEN),
    "mlp.gate_proj": (INTERMEDIATE, HIDDEN),
    "mlp.up_proj": (INTERMEDIATE, HIDDEN),
    "mlp.down_proj": (HIDDEN, INTERMEDIATE),
}


def tiny_decoder(folder, seed: int = 0) -> dict[str, torch.Tensor]:
    """A bf16 folder shaped like the converted embedded models: safetensors, config.json, tokenizer files."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.05).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": randn(VOCAB, HIDDEN), "lm_head.weight": randn(VOCAB, HIDDEN)}
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}"
        for name, shape in LINEARS.items():
            tensors[f"{prefix}.{name}.weight"] = randn(*shape)
        for name in ("q_proj", "k_proj", "v_proj"):
            tensors[f"{prefix}.self_attn.{name}.bias"] = randn(LINEARS[f"self_attn.{name}"][0])
        tensors[f"{prefix}.input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    tensors[f"model.layers.0.{'mlp.down_proj'}.weight"][3] = 0  # a row of zeros: its scale must not divide by 0
    tensors["model.norm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    folder.mkdir(parents=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": HIDDEN, "dtype": "bfloat16", "vocab_size": VOCAB}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    return tensors


def read(path) -> dict[str, torch.Tensor]:
    with safe_open(path, framework="pt") as reader:
        return {name: reader.get_tensor(name) for name in reader.keys()}  # noqa: SIM118 (not a dict)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("int8")
    source = tiny_decoder(root / "bf16")
    sha = int8_weights.write_int8_copy(root / "bf16", root / "w8a8")
    return source, root / "w8a8", sha


def test_linear_weights_become_int8_with_one_float32_scale_per_output_channel(converted):
    source, folder, _ = converted
    written = read(folder / "model.safetensors")
    for layer in range(LAYERS):
        for name, (outputs, inputs) in LINEARS.items():
            module = f"model.layers.{layer}.{name}"
            assert written[f"{module}.weight"].dtype == torch.int8
            assert tuple(written[f"{module}.weight"].shape) == (outputs, inputs)
            assert written[f"{module}.weight_scale"].dtype == torch.float32
            assert tuple(written[f"{module}.weight_scale"].shape) == (outputs, 1)
            assert f"{module}.weight_zero_point" not in written, "symmetric: vLLM refuses a zero point"
    kept = [n for n in source if not int8_weights.is_quantized(n)]
    assert "lm_head.weight" in kept and "model.embed_tokens.weight" in kept and len(kept) == 3 + 4 * LAYERS
    for name in kept:  # embedding, head, norms and biases exactly as they were
        assert written[name].dtype == torch.bfloat16 and torch.equal(written[name], source[name])
    assert len(written) == len(source) + len(LINEARS) * LAYERS


def test_the_int8_weights_are_within_half_a_step_of_the_bf16_ones(converted):
    """Round to nearest with the row's largest magnitude / 127.5 as the step: every weight is within half a
    step of its bf16 value, and a row's largest magnitude maps to +-127 (not clipped further)."""
    source, folder, _ = converted
    written = read(folder / "model.safetensors")
    for layer in range(LAYERS):
        for name in LINEARS:
            module = f"model.layers.{layer}.{name}"
            original = source[f"{module}.weight"].float()
            state = {"weight": written[f"{module}.weight"], "weight_scale": written[f"{module}.weight_scale"]}
            error = (int8_weights.dequantized(state) - original).abs()
            step = state["weight_scale"]
            # float32's rounding of weight x scale - bf16 weight: well under 1e-4 of a step
            assert bool((error <= step * (0.5 + 1e-4)).all()), module
            expected_step = original.abs().amax(dim=1, keepdim=True) / 127.5
            nonzero = expected_step > 0
            assert torch.allclose(step[nonzero], expected_step[nonzero], rtol=1e-6)
            assert int(state["weight"].abs().amax()) == 127
    zero_row = written["model.layers.0.mlp.down_proj.weight"][3]
    assert not zero_row.any() and float(written["model.layers.0.mlp.down_proj.weight_scale"][3]) > 0


def test_the_config_says_w8a8_as_vllm_reads_it(converted):
    """config.json carries compressed-tensors' W8A8 scheme; vLLM's own reader picks its int8 W8A8 scheme
    (dynamic per-token activations) for the linear layers and leaves the head unquantized."""
    _, folder, _ = converted
    config = json.loads((folder / "config.json").read_text())
    quant = config["quantization_config"]
    assert (quant["quant_method"], quant["format"], quant["quantization_status"]) == (
        "compressed-tensors",
        "int-quantized",
        "compressed",
    )
    assert quant["ignore"] == ["lm_head"]
    group = quant["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"]
    weights, inputs = group["weights"], group["input_activations"]
    assert (weights["num_bits"], weights["type"], weights["strategy"], weights["symmetric"]) == (
        8,
        "int",
        "channel",
        True,
    )
    assert weights["dynamic"] is False
    assert (inputs["num_bits"], inputs["type"], inputs["strategy"]) == (8, "int", "token")
    assert inputs["symmetric"] is True and inputs["dynamic"] is True
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["dtype"] == "bfloat16"
    assert (folder / "tokenizer.json").is_file()

    # heavy: vLLM's reader of compressed-tensors configs (its CPU build), only to check this config
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import CompressedTensorsW8A8Int8

    read_by_vllm = CompressedTensorsConfig.from_config(quant)
    scheme_args = read_by_vllm.target_scheme_map["Linear"]
    scheme = read_by_vllm._get_scheme_from_parts(scheme_args["weights"], scheme_args["input_activations"])
    assert isinstance(scheme, CompressedTensorsW8A8Int8)
    assert scheme.is_static_input_scheme is False and scheme.input_symmetric is True
    assert read_by_vllm.ignore == ["lm_head"]


def test_the_same_bf16_folder_gives_the_same_bytes(converted, tmp_path):
    """Deterministic, so the copy can be pinned by its sha256 as the GGUF is."""
    _, folder, sha = converted
    again = tmp_path / "again"
    assert int8_weights.write_int8_copy(folder.parent / "bf16", again) == sha
    assert sha == int8_weights.file_sha256(folder / "model.safetensors")
    other = tmp_path / "other"
    tiny_decoder(other / "bf16", seed=1)
    assert int8_weights.write_int8_copy(other / "bf16", other / "w8a8") != sha


def test_a_folder_without_weights_or_linear_layers_is_refused_naming_it(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(int8_weights.Int8Error, match="empty/model.safetensors: missing"):
        int8_weights.write_int8_copy(tmp_path / "empty", tmp_path / "out")
    folder = tmp_path / "no-linears"
    folder.mkdir()
    save_file({"model.norm.weight": torch.ones(4, dtype=torch.bfloat16)}, folder / "model.safetensors")
    (folder / "config.json").write_text("{}")
    with pytest.raises(int8_weights.Int8Error, match="no linear weight named like q_proj"):
        int8_weights.write_int8_copy(folder, tmp_path / "out2")
