"""The int8 copy of the embedded 0.5B as `make model` writes it (storybias.config.models.prepare_int8): its
sha256 is the pinned one, and its real layers are within half a quantization step of the bf16 weights.
Writing it takes about 15 s of CPU and 0.9 GB of disk, once per models folder (its stamp is kept)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from storybias.config import int8_weights, models

pytestmark = pytest.mark.slow
SMALL = "qwen2.5-coder-0.5b"
# a layer of each kind: attention's first projection at the last block, the MLP's in and out at others
REAL_LAYERS = ("model.layers.0.mlp.down_proj", "model.layers.12.mlp.gate_proj", "model.layers.23.self_attn.q_proj")


@pytest.fixture(scope="module")
def small_int8():
    return models.prepare_int8(SMALL, log=lambda m: None)


def test_the_int8_copy_of_the_small_model_is_the_pinned_one(small_int8):
    stamp = json.loads((small_int8 / models.STAMP).read_text())
    assert (
        stamp["sha256"]
        == models.embedded_weights(SMALL).int8_sha256
        == int8_weights.file_sha256(small_int8 / int8_weights.WEIGHTS_FILE)
    )
    assert stamp["source_sha256"] == models.embedded_weights(SMALL).sha256
    config = json.loads((small_int8 / "config.json").read_text())
    assert config["quantization_config"]["format"] == "int-quantized"
    assert (small_int8 / "tokenizer.json").is_file() and (small_int8 / "chat_template.jinja").is_file()


@pytest.mark.parametrize("module", REAL_LAYERS)
def test_a_real_layer_is_within_half_a_step_of_its_bf16_weights(small_int8, module):
    """Round to nearest per output channel: no weight further than half its row's step from the bf16 one,
    and the layer as a whole within 2% (Frobenius norm; 1.3-1.5% measured on these three layers)."""
    with safe_open(models.embedded_model_dir(SMALL) / int8_weights.WEIGHTS_FILE, framework="pt") as bf16:
        original = bf16.get_tensor(f"{module}.weight").float()
    with safe_open(small_int8 / int8_weights.WEIGHTS_FILE, framework="pt") as int8:
        state = {
            "weight": int8.get_tensor(f"{module}.weight"),
            "weight_scale": int8.get_tensor(f"{module}.weight_scale"),
        }
        head = int8.get_tensor("lm_head.weight")
    assert state["weight"].dtype == torch.int8 and head.dtype == torch.bfloat16
    restored = int8_weights.dequantized(state)
    assert bool(((restored - original).abs() <= state["weight_scale"] * (0.5 + 1e-4)).all())
    assert float((restored - original).norm() / original.norm()) < 0.02
