"""llama.cpp's ``llama-server`` as the run's local server: its profile settings and what it cannot do.

A profile selects it with ``generation.engine.shared_server_kind: llama.cpp`` (an engine setting, like the
other kinds of shared server, because it decides how every local model of the run is served, not one
model's weights); ``generation.engine.llama_cpp`` holds the server's own settings (``-c``, ``-np``, ``-t``).
The server runs the GGUF file an embedded model ships as (``storybias.config.models.embedded_gguf``);
``storybias.engines.llamacpp`` starts it and speaks its dialect.

:func:`llama_cpp_problems` is what check-params says about a profile that asks llama.cpp for something it
has no equivalent of, so that a run never learns it mid-way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

LLAMA_CPP = "llama.cpp"
# Where `make llama-server` (scripts/build-llama-server.sh) installs the binary; the variable overrides it.
BINARY_VARIABLE = "STORYBIAS_LLAMA_SERVER"


class LlamaCppSettings(BaseModel):
    """``generation.engine.llama_cpp``: the llama-server command line's sizes. Each of the ``parallel``
    slots gets ``ctx_size / parallel`` tokens of context (prompt and answer together): by default 8,192.
    A model's default ``max_model_len`` (4,096) bounds a prompt, but stage 03's second step on the smoke
    profile asked for 3,458 prompt tokens plus its 700 max_tokens, which 4,096 a slot refused before sending."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    ctx_size: Annotated[int, Field(ge=256)] = 32768  # -c: the whole KV cache (about 1 GB for the 1.5B), shared out
    parallel: Annotated[int, Field(ge=1)] = 4  # -np: requests decoded together (storybias sends as many at once)
    threads: Annotated[int, Field(ge=1)] | None = None  # -t; null: the cores this process may use (taskset, cpuset)
    # llama.cpp's weight repacking into its extra CPU buffer types (AVX-512 layouts, and AMX where the CPU has
    # it). Off (--no-repack) by default: on the AMX machine of the build, the server died with SIGSEGV in
    # ggml_backend_amx_mul_mat at its first matrix product; turn it on where the AMX path works (or no AMX).
    repack: bool = False

    def slot_context(self) -> int:
        """The tokens one request may use (llama-server divides ``-c`` among its ``-np`` slots)."""
        return self.ctx_size // self.parallel


def server_binary() -> Path:
    """The llama-server that storybias starts: ``$STORYBIAS_LLAMA_SERVER``, else the environment's
    ``bin/llama-server`` (what ``make llama-server`` installs)."""
    override = os.environ.get(BINARY_VARIABLE)
    return Path(override) if override else Path(sys.prefix) / "bin" / "llama-server"


def llama_cpp_problems(engine: Any, local_specs: Sequence[Any]) -> list[str]:
    """What a profile with ``shared_server_kind: llama.cpp`` asks that llama-server cannot give, one line
    each naming the key: ``engine`` is ``generation.engine``, ``local_specs`` every local model of the
    profile (``storybias.config.checks.local_models``). Empty for another kind of server."""
    if engine.shared_server_kind != LLAMA_CPP:
        return []
    where = "generation.engine"
    problems = []
    if not os.access(server_binary(), os.X_OK):
        problems.append(
            f"{where}.shared_server_kind: llama.cpp needs the llama-server binary, not found at "
            f"{server_binary()}; run `make llama-server` (builds it once, a few minutes) or set ${BINARY_VARIABLE}"
        )
    if engine.compact_json:
        problems.append(
            f"{where}.compact_json: llama.cpp's JSON-schema grammar has no whitespace-free switch; set it to false"
        )
    if engine.cpu_top_k_first:
        problems.append(
            f"{where}.cpu_top_k_first: a vLLM logits processor; llama.cpp applies top-k before top-p itself: "
            "set it to false"
        )
    for spec in local_specs:
        if spec.source != "embedded":
            problems.append(
                f"model {spec.name!r}: llama.cpp serves GGUF files, and storybias has one only for the embedded "
                f"models (source 'embedded'), not for source {spec.source!r}"
            )
        if spec.device != "cpu":
            problems.append(f"model {spec.name!r}: the llama-server that `make llama-server` builds runs on CPU only")
        if spec.weights == "int8":
            problems.append(
                f"model {spec.name!r}: weights int8 is the W8A8 copy vLLM runs; llama.cpp serves the model's "
                "4-bit GGUF: remove `weights: int8` or use another shared_server_kind"
            )
        if spec.max_model_len > engine.llama_cpp.slot_context():
            problems.append(
                f"model {spec.name!r}: max_model_len {spec.max_model_len} exceeds llama-server's context per "
                f"request, {where}.llama_cpp.ctx_size / parallel = {engine.llama_cpp.ctx_size} / "
                f"{engine.llama_cpp.parallel} = {engine.llama_cpp.slot_context()}; raise ctx_size to at least "
                f"{spec.max_model_len * engine.llama_cpp.parallel} or lower max_model_len"
            )
    return list(dict.fromkeys(problems))
