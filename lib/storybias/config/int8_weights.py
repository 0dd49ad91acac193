"""The embedded models' int8 copies: W8A8 in the compressed-tensors format, written from the bf16 folder.

vLLM's CPU build runs a compressed-tensors W8A8 checkpoint through oneDNN's int8 kernels (AMX int8 or
AVX-512 VNNI): each linear layer's weight is stored as int8 with one scale per output channel (symmetric,
round to nearest, the scale from the row's largest magnitude), and its input activations are quantized
to int8 per token as they arrive (dynamic, symmetric). The embedding and the output head stay bf16.

The scheme, the config vLLM reads (``quantization_config`` in ``config.json``) and the quantization itself
are compressed-tensors' own (its ``W8A8`` preset, ``calculate_qparams`` and its ``int-quantized``
compressor). What it leaves to an observer (llm-compressor, which is not installed here) is the range
each scale is computed from; for a weight with round-to-nearest that range is just each row's minimum
and maximum, so :func:`channel_scales` takes them itself (two lines). No calibration data is needed:
the activations are quantized at run time.

The copy is written tensor by tensor in the bf16 file's order, so the same bf16 folder always gives the
same bytes: its sha256 is pinned beside the GGUF's (``storybias.config.models.EmbeddedWeights``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# the seven linear layers of a Qwen2 / Llama decoder block; the embedding and the output head are kept
QUANTIZED_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
KEPT_IN_BF16 = ["lm_head"]  # compressed-tensors' ``ignore``: the head (the embedding is no Linear)
WEIGHTS_FILE = "model.safetensors"
# what is copied from the bf16 folder as it is (config.json is rewritten with the quantization config)
COPIED_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
SCHEME_NAME = "W8A8"  # compressed-tensors' preset: int8 channel-wise symmetric weights, int8 per-token dynamic inputs
FORMAT = "int-quantized"


class Int8Error(RuntimeError):
    """A bf16 folder that cannot be converted, or a copy that is not what was pinned."""


def w8a8_scheme() -> Any:
    """compressed-tensors' W8A8 scheme, targeting every Linear."""
    # heavy: compressed-tensors imports torch; only a conversion or a test needs it
    from compressed_tensors.quantization import preset_name_to_scheme

    return preset_name_to_scheme(SCHEME_NAME, targets=["Linear"])


def quantization_config() -> dict[str, Any]:
    """The ``quantization_config`` entry of the copy's config.json, as compressed-tensors writes it."""
    # heavy: compressed-tensors (torch)
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus

    config = QuantizationConfig(
        config_groups={"group_0": w8a8_scheme()},
        format=FORMAT,
        quantization_status=QuantizationStatus.COMPRESSED,
        ignore=list(KEPT_IN_BF16),
    )
    return config.model_dump(mode="json")


def is_quantized(name: str) -> bool:
    """Whether tensor ``name`` of the bf16 file is the weight of a linear layer the copy stores in int8."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in QUANTIZED_LINEARS


def channel_scales(weight: Any, args: Any) -> Any:
    """One float32 scale per output channel (row) of ``weight`` for the quantization ``args``: what an
    observer would measure for round-to-nearest (each row's minimum and maximum), turned into scales by
    compressed-tensors' ``calculate_qparams`` (symmetric: the largest magnitude / 127.5)."""
    # heavy: compressed-tensors (torch)
    from compressed_tensors.quantization.utils import calculate_qparams

    rows = weight.float()
    scale, _ = calculate_qparams(rows.amin(dim=1, keepdim=True), rows.amax(dim=1, keepdim=True), args)
    return scale.float()


def quantize_linear(weight: Any, scheme: Any) -> dict[str, Any]:
    """``{"weight": int8, "weight_scale": float32 (outputs, 1)}`` for one linear layer's bf16 weight,
    through compressed-tensors' int-quantized compressor."""
    # heavy: compressed-tensors (torch)
    from compressed_tensors.compressors import BaseCompressor

    if weight.ndim != 2:
        raise Int8Error(f"a linear weight must be 2-D, got shape {tuple(weight.shape)}")
    compressor = BaseCompressor.get_value_from_registry(FORMAT)
    state = {"weight": weight.float(), "weight_scale": channel_scales(weight, scheme.weights)}
    return dict(compressor.compress(state, scheme))


def dequantized(state: dict[str, Any]) -> Any:
    """The float32 weight an int8 layer stands for (``weight`` x ``weight_scale``)."""
    return state["weight"].float() * state["weight_scale"]


def quantize_state(tensors: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """The copy's tensors from the bf16 file's (name, tensor) pairs, read one at a time: each linear weight
    replaced by its int8 weight and ``weight_scale``, every other tensor (embedding, head, norms, biases)
    as it was."""
    scheme = w8a8_scheme()
    out: dict[str, Any] = {}
    for name, tensor in tensors:
        if not is_quantized(name):
            out[name] = tensor
            continue
        module = name.removesuffix(".weight")
        for local, value in quantize_linear(tensor, scheme).items():
            out[f"{module}.{local}"] = value.contiguous()
    if not any(is_quantized(name) for name in out):
        raise Int8Error(f"no linear weight named like {', '.join(QUANTIZED_LINEARS)}: not a decoder this knows")
    return out


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_int8_copy(source: Path, target: Path) -> str:
    """Write the W8A8 copy of the bf16 model folder ``source`` into the (new, empty) folder ``target``;
    returns the sha256 of its weights file."""
    # heavy: safetensors' torch reader, only when converting
    from safetensors import safe_open
    from safetensors.torch import save_file

    weights = source / WEIGHTS_FILE
    config_file = source / "config.json"
    for needed in (weights, config_file):
        if not needed.is_file():
            raise Int8Error(f"{needed}: missing; the bf16 folder is incomplete (run `make model`)")
    with safe_open(weights, framework="pt") as reader:  # one bf16 tensor in memory at a time, besides the copy
        copy = quantize_state((name, reader.get_tensor(name)) for name in reader.keys())  # noqa: SIM118
    target.mkdir(parents=True, exist_ok=True)
    save_file(copy, target / WEIGHTS_FILE, metadata={"format": "pt"})
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["quantization_config"] = quantization_config()
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for name in COPIED_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)
    return file_sha256(target / WEIGHTS_FILE)
