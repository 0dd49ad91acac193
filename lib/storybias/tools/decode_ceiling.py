"""decode_ceiling (`make decode-ceiling`): the most tokens/s this CPU's matrix units allow a profile's
first model, decoding N sequences at a time and in one `make bench-engine` trial (issue #43).

On the CPU path an engine step is almost all matrix multiplies (docs/benchmarks.md: most of a
bench-engine batch's time is inside vLLM's oneDNN matmul, much of it prefilling the prompts). A step
pushes an M x hidden batch (M = the sequences decoding, or the prompt tokens being prefilled) through
each layer's four projections (qkv, o, gate_up, down) and then the output head.
Timing those alone, through vLLM's own CPU linear (its dispatch picks oneDNN, an AMX kernel or zentorch
by CPU), bounds a step's time from below and the rate from above:

    decode step(N) = layers x (t_qkv + t_o + t_gate_up + t_down)(N) + t_head(N)
    ceiling(N)     = N / step(N)                                                      [tokens/s]
    trial ceiling  = prompts x max_tokens / (prefill + waves x max_tokens x step(N))
    prefill        = P / M x layers x layer time(M) + t_head(prompts),  M = min(P, the step budget)

P counts the trial's prompt tokens (its chat template applied) less what vLLM's prefix cache can hold:
the four warm-up prompts whole, and the others' common prefix. Attention, sampling and the scheduler
come on top, so an engine runs below its ceiling; a trial measured *above* this machine's trial
ceiling ran on a machine with faster matrix units. That is how two machines' times of the same code are
told apart from a code change (docs/benchmarks.md).
The rows go to ``reports/<run>/decode_ceiling.csv``; ``docs/measurements/decode_ceiling.csv`` keeps
the ones the README cites.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storybias.config import models
from storybias.config.params import ModelSpec, Params, load
from storybias.core import machine, run_folders
from storybias.core.io import atomic_open
from storybias.engines.inprocess import cpu_scheduler_kwargs
from storybias.evidence.recorded import RECORDED_COLUMNS
from storybias.tools.bench import bench_rows

COLUMNS = RECORDED_COLUMNS["decode_ceiling"]
SEQUENCES = (32, 64, 128, 256)
WARM_UP_PROMPTS = 4  # bench_engine.trial answers its first four prompts once before the timed batch


@dataclass(frozen=True)
class DecoderShapes:
    """The matrix shapes of a Llama-style decoder (Qwen2 included), from its ``config.json``."""

    hidden: int
    intermediate: int
    layers: int
    q_heads: int
    kv_heads: int
    vocab: int

    def projections(self) -> dict[str, tuple[int, int]]:
        """Each layer's projections as (outputs, inputs): fused qkv, o, fused gate_up, down."""
        head_dim = self.hidden // self.q_heads
        return {
            "qkv": (self.hidden + 2 * self.kv_heads * head_dim, self.hidden),
            "o": (self.hidden, self.hidden),
            "gate_up": (2 * self.intermediate, self.hidden),
            "down": (self.hidden, self.intermediate),
        }

    def head(self) -> tuple[int, int]:
        return self.vocab, self.hidden


def shapes_of(config: dict[str, Any]) -> DecoderShapes:
    """The shapes from a Hugging Face ``config.json``; a key it lacks is named."""
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    missing = [k for k in keys if k not in config]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}: not a decoder this tool knows")
    return DecoderShapes(
        hidden=int(config["hidden_size"]),
        intermediate=int(config["intermediate_size"]),
        layers=int(config["num_hidden_layers"]),
        q_heads=int(config["num_attention_heads"]),
        kv_heads=int(config.get("num_key_value_heads", config["num_attention_heads"])),
        vocab=int(config["vocab_size"]),
    )


def layer_seconds(shapes: DecoderShapes, seconds: dict[str, float]) -> float:
    """One layer's matrix multiplies (``seconds``: one call's time per projection name, and ``head``)."""
    return sum(seconds[name] for name in shapes.projections())


def step_seconds(shapes: DecoderShapes, seconds: dict[str, float]) -> float:
    """One step's matrix multiplies: every layer's projections, then the head (all at the step's rows)."""
    return shapes.layers * layer_seconds(shapes, seconds) + seconds["head"]


def ceiling(shapes: DecoderShapes, seconds: dict[str, float], sequences: int) -> float:
    """Tokens/s decoding ``sequences`` at a time when a step costs only its matrix multiplies."""
    return sequences / step_seconds(shapes, seconds)


def layer_flops(shapes: DecoderShapes, rows: int) -> int:
    return sum(2 * rows * n * k for n, k in shapes.projections().values())


def step_flops(shapes: DecoderShapes, rows: int) -> int:
    """A decode step's multiply-adds x 2: every layer at ``rows`` rows, and the head."""
    vocab, hidden = shapes.head()
    return shapes.layers * layer_flops(shapes, rows) + 2 * rows * vocab * hidden


def computed_prompt_tokens(prompts: Sequence[Sequence[int]], warm_up: int = WARM_UP_PROMPTS) -> int:
    """The prompt tokens a trial must prefill at the least: the warm-up prompts are in the prefix cache
    whole, and of the others only what follows their common prefix is counted (vLLM caches whole blocks,
    so it computes at least this many)."""
    timed = [list(p) for p in prompts]
    if not timed:
        return 0
    shared = 0
    while all(len(p) > shared and p[shared] == timed[0][shared] for p in timed):
        shared += 1
    return sum(len(p) - shared for p in timed[warm_up:])


def trial_seconds(
    shapes: DecoderShapes,
    decode: dict[str, float],
    prefill: dict[str, float],
    prefill_rows: int,
    prompt_tokens: int,
    waves: int,
    max_tokens: int,
) -> float:
    """The least time a bench-engine trial takes: its prompt tokens through every layer at the prefill
    step's rate (``prefill`` timed at ``prefill_rows`` rows, its head at one row per prompt), then
    ``waves`` x ``max_tokens`` decode steps (``decode``)."""
    # nothing left to prefill (one prompt, answered whole in the warm-up): the head still runs once
    steps = prompt_tokens / prefill_rows if prompt_tokens else 0.0
    prefill_seconds = steps * shapes.layers * layer_seconds(shapes, prefill) + prefill["head"]
    return prefill_seconds + waves * max_tokens * step_seconds(shapes, decode)


def bf16_linear(outputs: int, inputs: int) -> Callable[[Any], Any]:
    """vLLM's CPU linear for a bf16 weight of (outputs, inputs), as its unquantized layers dispatch it."""
    # heavy: torch and vLLM's CPU build, only when measuring
    import torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(outputs, inputs, dtype=torch.bfloat16), requires_grad=False)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    return lambda x: layer.cpu_linear(x, layer.weight, None)


def int8_linear(outputs: int, inputs: int) -> Callable[[Any], Any]:
    """vLLM's CPU linear for an int8 weight of (outputs, inputs) with one float32 scale per output channel
    and bf16 inputs quantized to int8 per token in the call (dynamic, symmetric): the kernel vLLM picks for
    the compressed-tensors W8A8 copy (storybias.config.int8_weights), with the layout it repacks the weight
    into (oneDNN's, or the AMX int8 kernel's where the CPU has one). The values do not change its time."""
    # heavy: torch and vLLM's CPU build, only when measuring
    import torch
    from vllm.model_executor.kernels.linear import init_int8_linear_kernel

    kernel = init_int8_linear_kernel(
        is_channelwise=True, is_static_input_scheme=False, input_symmetric=True, module_name="CompressedTensorsW8A8Int8"
    )
    layer = torch.nn.Module()
    layer.logical_widths = [outputs]
    weight = torch.randint(-127, 128, (outputs, inputs), dtype=torch.int8)
    layer.register_parameter("weight", torch.nn.Parameter(weight, requires_grad=False))
    scale = torch.full((outputs, 1), 1e-3, dtype=torch.float32)
    layer.register_parameter("weight_scale", torch.nn.Parameter(scale, requires_grad=False))
    for absent in ("input_scale", "input_zero_point", "azp_adj", "bias"):  # dynamic, symmetric, no bias
        layer.register_parameter(absent, None)
    kernel.process_weights_after_loading(layer)
    return lambda x: kernel.apply_weights(layer, x, None)


LINEARS = {"bf16": bf16_linear, "int8": int8_linear}
NUMERICS = tuple(LINEARS)


def time_linear(
    outputs: int, inputs: int, rows: int, numerics: str = "bf16", windows: int = 3, window_seconds: float = 0.1
) -> float:
    """Seconds per call of vLLM's CPU linear (``numerics``: bf16 or int8 weights) of (outputs, inputs) on
    ``rows`` bf16 rows: the fastest of ``windows`` timed windows (machine.best_seconds_per_call; a ceiling,
    so the fastest)."""
    # heavy: torch, only when measuring
    import torch

    if numerics not in LINEARS:
        raise ValueError(f"numerics: {numerics!r} is not one of {', '.join(NUMERICS)}")
    call = LINEARS[numerics](outputs, inputs)
    x = torch.randn(rows, inputs, dtype=torch.bfloat16)
    return machine.best_seconds_per_call(lambda: call(x), windows, window_seconds)


def time_step(
    shapes: DecoderShapes, rows: int, head_rows: int | None = None, numerics: str = "bf16"
) -> dict[str, float]:
    """One call's seconds per projection at ``rows`` rows in ``numerics``, and the head's at ``head_rows``
    (default ``rows``) in bf16: the int8 copy keeps its head in bf16 (int8_weights.KEPT_IN_BF16)."""
    seconds = {name: time_linear(o, i, rows, numerics) for name, (o, i) in shapes.projections().items()}
    seconds["head"] = time_linear(*shapes.head(), head_rows or rows)
    return seconds


def trial_prompts(params: Params, folder: Path, n_prompts: int) -> list[list[int]]:
    """The token ids of a bench-engine trial's prompts, the model's chat template applied."""
    # heavy: the tokenizer, only when measuring
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = []
    for row in bench_rows(params, n_prompts):
        messages = [{"role": "user", "content": row["prompt"]}]
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids.append(list(encoded["input_ids"] if isinstance(encoded, Mapping) else encoded))
    return ids


def _row(spec: ModelSpec, what: str, numerics: str, sequences: int, prompt_tokens: Any, gflops: float, seconds: float):
    return {
        "model": spec.name,
        "what": what,
        "numerics": numerics,
        "sequences": sequences,
        "prompt_tokens": prompt_tokens,
        "gflops": round(gflops, 1),
        "seconds": round(seconds, 3),
    }


@dataclass(frozen=True)
class Trial:
    """A bench-engine trial's size: prompts, tokens each, sequences at a time, and its prefill."""

    n_prompts: int
    max_tokens: int
    batch: int  # sequences decoding at a time (the profile's max_num_seqs, or fewer prompts)
    prompt_tokens: int  # to prefill, less what the prefix cache holds (computed_prompt_tokens)
    prefill_rows: int  # prompt tokens per prefill step


def numerics_rows(
    spec: ModelSpec, shapes: DecoderShapes, numerics: str, sequences: Sequence[int], trial: Trial
) -> list[dict]:
    """Decode-step rows per batch size and the trial's row, with the linear layers in ``numerics``."""
    rows, steps = [], {}
    for n in sorted({*sequences, trial.batch}):
        steps[n] = time_step(shapes, n, numerics=numerics)
        seconds = step_seconds(shapes, steps[n])
        row = _row(spec, "decode step", numerics, n, "", step_flops(shapes, n) / seconds / 1e9, seconds)
        rows.append(row | {"ceiling_tokens_per_s": round(n / seconds, 1)})
    prefill = time_step(shapes, trial.prefill_rows, head_rows=trial.n_prompts, numerics=numerics)
    waves = -(-trial.n_prompts // trial.batch)  # batches of max_num_seqs, one after the other
    seconds = trial_seconds(
        shapes, steps[trial.batch], prefill, trial.prefill_rows, trial.prompt_tokens, waves, trial.max_tokens
    )
    prefill_gflops = layer_flops(shapes, trial.prefill_rows) / layer_seconds(shapes, prefill) / 1e9
    what = f"bench-engine trial, {trial.n_prompts} prompts x {trial.max_tokens} tokens"
    row = _row(spec, what, numerics, trial.batch, trial.prompt_tokens, prefill_gflops, seconds)
    rows.append(row | {"ceiling_tokens_per_s": round(trial.n_prompts * trial.max_tokens / seconds, 1)})
    return rows


def measure(
    path: str,
    sequences: Sequence[int] = SEQUENCES,
    n_prompts: int = 64,
    max_tokens: int = 128,
    log: Callable[[str], None] = print,
    numerics: Sequence[str] = NUMERICS,
) -> list[dict]:
    """Decode-step rows per batch size and one bench-engine trial row (``n_prompts`` x ``max_tokens``
    at the profile's ``max_num_seqs``) for the profile's first model, once per ``numerics`` (bf16 and int8
    linear layers: a stage's rate is read against the ceiling of the weights it runs); writes
    reports/<run>/decode_ceiling.csv."""
    params = load(path)
    spec = params.generation.models[0]
    if spec.device != "cpu" or spec.source == "openai":
        raise ValueError(f"decode-ceiling: {spec.name!r} does not run on this CPU (device {spec.device!r})")
    unknown = [n for n in numerics if n not in LINEARS]
    if unknown:
        raise ValueError(f"decode-ceiling: numerics {', '.join(unknown)} unknown; known: {', '.join(NUMERICS)}")
    folder, _ = models.resolve_weights(spec)
    shapes = shapes_of(json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")))
    ran_on = machine.describe().summary()
    log(f"decode-ceiling: {spec.name} on {ran_on}")
    prompt_tokens = computed_prompt_tokens(trial_prompts(params, Path(folder), n_prompts))
    trial = Trial(
        n_prompts=n_prompts,
        max_tokens=max_tokens,
        batch=min(n_prompts, params.generation.engine.max_num_seqs),
        prompt_tokens=prompt_tokens,
        prefill_rows=max(1, min(prompt_tokens, cpu_scheduler_kwargs(spec)["max_num_batched_tokens"])),
    )
    rows = [row for name in numerics for row in numerics_rows(spec, shapes, name, sequences, trial)]
    command = f"decode-ceiling --n-prompts {n_prompts} --max-tokens {max_tokens}"
    sitting = f"{datetime.date.today()} {command} ({params.run_name})"
    rows = [r | {"machine": ran_on, "sitting": sitting} for r in rows]
    for r in rows:
        log(
            f"  {r['what']} at {r['sequences']}, {r['numerics']}: {r['gflops']} GFLOP/s, "
            f"at most {r['ceiling_tokens_per_s']} tokens/s"
        )
    out = run_folders.claim_reports(params.run_name) / "decode_ceiling.csv"
    with atomic_open(out, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    log(f"decode-ceiling: written to {out}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m storybias.tools.decode_ceiling")
    parser.add_argument("params")
    parser.add_argument("--sequences", type=int, nargs="+", default=list(SEQUENCES))
    parser.add_argument("--n-prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--numerics", nargs="+", choices=NUMERICS, default=list(NUMERICS))
    args = parser.parse_args()
    measure(args.params, args.sequences, args.n_prompts, args.max_tokens, numerics=args.numerics)


if __name__ == "__main__":
    main()
