"""``make bench-generate LLAMA=1``: the llama.cpp column, side by side with the CPU vLLM engine in one sitting.

The same rows (stage 01's prompts and seeds, every request exactly ``max_tokens`` tokens: ``ignore_eos`` on
both), the same sampling and the same concurrency (``generation.engine.max_num_seqs`` sequences: vLLM's
batch, llama-server's ``-np`` slots), each through stage 01's own path (``generate_with`` through the cache):
first the in-process vLLM engine on the embedded model's bf16 conversion, then ``llama-server`` on its
Q4_K_M GGUF (storybias.engines.llamacpp), never both at once. Start-up is timed apart from decoding; after
a warm-up each path runs ``repeats`` times and the median tokens/s is reported, with the ratio llama.cpp /
vLLM and the machine (storybias.core.machine). The result goes to ``data/<run>/bench_generate_llamacpp.json``.

Not a like-for-like of the weights: llama.cpp decodes the 4-bit file the model ships as, vLLM its bf16
conversion. That is the comparison a researcher choosing between the two backends on a CPU faces.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from storybias.config.llamacpp import LlamaCppSettings
from storybias.config.params import EngineSettings, Params
from storybias.core import machine, paths
from storybias.core.io import write_json_atomic
from storybias.engines import ChatEngine, Engine
from storybias.engines.llamacpp import start_llama_server
from storybias.engines.openai_endpoint import OpenAIEngine
from storybias.stages.generate import prepare_models
from storybias.tools.bench import bench_rows, fixed_length, timed_pipeline, trial_record

PATHS = ("vllm_cpu", "llama_cpp")
PROMPT_ROOM = 1024  # tokens of a story prompt (with the chat template) in one llama-server slot


def llama_settings(settings: EngineSettings, concurrency: int, max_tokens: int) -> EngineSettings:
    """``settings`` with llama-server sized for the bench: one slot per sequence vLLM batches, each with
    room for a prompt and ``max_tokens``; threads as the profile says (default every core)."""
    slot = PROMPT_ROOM + max_tokens
    llama = LlamaCppSettings(ctx_size=slot * concurrency, parallel=concurrency, threads=settings.llama_cpp.threads)
    return settings.model_copy(update={"llama_cpp": llama, "shared_server_kind": "llama.cpp"})


def _time_path(
    engine: ChatEngine, params: Params, rows: list[dict[str, Any]], repeats: int, folder: Path, name: str, log: Callable
) -> tuple[list[float], list[dict[str, Any]]]:
    """A warm-up, then ``repeats`` timed passes of stage 01's path on the started ``engine``."""
    timed_pipeline(engine, params, rows[: min(4, len(rows))], folder)
    rates, trials = [], []
    for i in range(repeats):
        seconds, tokens = timed_pipeline(engine, params, rows, folder)
        rates.append(tokens / seconds)
        trials.append(trial_record(i, name, seconds, tokens))
        log(f"  {name:9s} repeat {i}: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.1f} tokens/s")
    return rates, trials


def bench_llama_cpp(
    params: Params, n_prompts: int = 24, repeats: int = 2, max_tokens: int = 200, log: Callable = print
) -> dict[str, Any]:
    """The vLLM CPU engine and llama-server on the same rows, one after the other (module docstring)."""
    spec = params.generation.models[0]
    settings, seed = params.generation.engine, params.generation.seed
    rows = fixed_length(bench_rows(params, n_prompts), max_tokens)
    concurrency = min(settings.max_num_seqs, len(rows))
    vllm_settings = settings.model_copy(update={"max_num_seqs": concurrency, "shared_server_kind": "host"})
    llama = llama_settings(settings, concurrency, max_tokens)
    prepare_models(params, log=log)
    log(
        f"bench-generate (llama.cpp): {len(rows)} prompts x {max_tokens} tokens, model {spec.name}, "
        f"{concurrency} at once"
    )
    rates: dict[str, list[float]] = {}
    startup: dict[str, float] = {}
    trials: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in PATHS:
            started, server = time.time(), None
            engine: ChatEngine
            if name == "vllm_cpu":
                engine = Engine(spec, vllm_settings, seed)
            else:
                server = start_llama_server(spec, llama, seed, params.run_name, log=log)
                engine = OpenAIEngine.for_local_server(spec, server.entry(), llama, seed)
            try:
                with engine:
                    startup[name] = round(time.time() - started, 1)
                    log(f"{name}: start-up {startup[name]:.1f} s")
                    rates[name], done = _time_path(engine, params, rows, repeats, Path(tmp) / name, name, log)
                    trials += done
            finally:
                if server is not None:
                    server.stop()
    result = bench_result(rates, startup, trials, len(rows), max_tokens, spec.name, concurrency)
    out = paths.run_dir(params.run_name) / "bench_generate_llamacpp.json"
    write_json_atomic(result, out)
    log(format_columns(result))
    log(f"written to {out}")
    return result


def bench_result(
    rates: dict[str, list[float]],
    startup: dict[str, float],
    trials: list[dict[str, Any]],
    n_prompts: int,
    max_tokens: int,
    model: str,
    concurrency: int,
) -> dict[str, Any]:
    """The bench's record: median tokens/s per path, the ratio llama.cpp / vLLM, start-ups, the machine."""
    medians = {name: round(statistics.median(rates[name]), 2) for name in PATHS}
    return {
        "n_prompts": n_prompts,
        "tokens_per_request": max_tokens,
        "concurrency": concurrency,
        "model": model,
        "startup_seconds": startup,
        "tokens_per_second": medians,
        "ratio_llama_cpp_over_vllm_cpu": round(medians["llama_cpp"] / medians["vllm_cpu"], 3),
        "machine": machine.describe(probe=False).record(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "trials": trials,
    }


def format_columns(result: dict[str, Any]) -> str:
    """The two columns as a small table, and which is faster on this machine."""
    rates, startup = result["tokens_per_second"], result["startup_seconds"]
    lines = [f"{'':22s}{'vLLM CPU':>12s}{'llama.cpp':>12s}"]
    lines.append(f"{'start-up (s)':22s}{startup['vllm_cpu']:>12.1f}{startup['llama_cpp']:>12.1f}")
    lines.append(f"{'decode (tokens/s)':22s}{rates['vllm_cpu']:>12.1f}{rates['llama_cpp']:>12.1f}")
    ratio = result["ratio_llama_cpp_over_vllm_cpu"]
    faster = "llama.cpp" if ratio > 1 else "vLLM CPU"
    lines.append(f"ratio llama.cpp / vLLM CPU = {ratio:.3f}: {faster} is faster on this machine")
    return "\n".join(lines)
