"""``generation.engine.backend: ray``: a stage's requests through Ray Data's vLLM batch processor
(``ray.data.llm``: ``vLLMEngineProcessorConfig`` + ``build_processor``, ray 2.60), implementing the
same :class:`storybias.engines.ChatEngine` interface as the in-process engine.

- The same vLLM engine arguments as :class:`storybias.engines.Engine` (dtype, context, engine seed,
  ``max_num_seqs``, the CPU scheduler settings of :func:`engines.cpu_scheduler_kwargs`), one replica
  per GPU (``ray.concurrency``; ``ray.tensor_parallel_size`` GPUs each) or, on CPU, per explicit CPU
  bundle (``placement_group_config``); ``log_engine_metrics=False`` (metrics need ``ray[serve]``).
- Each request keeps its own sampling, seed, ``max_tokens`` and constraint (choice list or JSON
  schema), mapped to the processor's per-row ``sampling_params`` (:func:`request_row`).
- The chat template is applied here, on the driver, with the model's tokenizer exactly as vLLM's
  ``LLM.chat`` does (the profile's template and ``chat_template_kwargs``, a generation prompt, no
  extra special tokens); the processor gets the token ids, so its own template / tokenize /
  detokenize stages are off and vLLM's detokenised text is kept.
- Requests are sorted and partitioned by key (story_id): every key is in exactly one block, and each
  result is yielded as soon as its block leaves the processor (``iter_rows`` streams), so
  ``runner.run_requests`` writes the same atomic shards and a killed job resumes without loss or
  duplicates.
- Ray's output has no finish reason: it is derived from the token count (:func:`finish_reason`).

``ray`` is imported only here, when the backend is used: everything else works without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from storybias.config.params import EngineSettings, ModelSpec
from storybias.core import paths
from storybias.engines.base import ChatRequest, ChatResult, EngineError, EngineInfo, package_versions, record_start
from storybias.engines.inprocess import cpu_engine_variables, cpu_scheduler_kwargs, preflight

INSTALL_HINT = "make venv EXTRAS=ray (or .venv/bin/pip install -r requirements/extra-ray.txt)"


def ray_available() -> bool:
    return importlib.util.find_spec("ray") is not None


def require_ray() -> None:
    if not ray_available():
        raise EngineError(
            f"generation.engine.backend is 'ray' but Ray is not installed in this environment; run `{INSTALL_HINT}`"
        )


def finish_reason(n_tokens: int, max_tokens: int) -> str:
    """Ray Data's vLLM output carries no finish reason: a request that used its whole ``max_tokens``
    budget is "length", any other "stop" (an end-of-sequence token or a completed constraint). A text
    that ends on a stop token exactly at ``max_tokens`` is counted "length" (vLLM would say "stop")."""
    return "length" if n_tokens >= max_tokens else "stop"


def sampling_params(request: ChatRequest) -> dict[str, Any]:
    """The processor's per-row ``sampling_params`` (kwargs of vLLM's SamplingParams): the same fields
    the in-process engine sets (``Engine.sampling_params``). A constraint the processor cannot carry
    is an error, never dropped."""
    s = request.sampling
    params: dict[str, Any] = dict(
        temperature=float(s.temperature),
        top_p=float(s.top_p),
        top_k=int(s.top_k),
        repetition_penalty=float(s.repetition_penalty),
        max_tokens=int(s.max_tokens),
        seed=int(request.seed),
        ignore_eos=bool(request.ignore_eos),
    )
    if request.choice is not None and request.json_schema is not None:
        raise EngineError(
            f"request {request.key!r}: both a choice list and a JSON schema; the Ray backend "
            "passes one structured-output constraint per request"
        )
    if request.choice is not None:
        if not request.choice or not all(isinstance(c, str) for c in request.choice):
            raise EngineError(f"request {request.key!r}: a choice constraint must be a non-empty list of strings")
        params["structured_outputs"] = {"choice": list(request.choice)}
    elif request.json_schema is not None:
        # As a JSON string: Ray Data stores rows as Arrow, where nested schemas of different requests
        # would be merged into one struct type; vLLM's StructuredOutputsParams(json=...) takes a string.
        params["structured_outputs"] = {"json": json.dumps(request.json_schema, sort_keys=True)}
    return params


def request_row(request: ChatRequest, prompt: str, prompt_token_ids: list[int]) -> dict[str, Any]:
    """One input row of the processor: the key travels through it untouched and names the result."""
    return {
        "key": request.key,
        "prompt": prompt,
        "tokenized_prompt": list(prompt_token_ids),
        "sampling_params": sampling_params(request),
        "max_tokens": int(request.sampling.max_tokens),
    }


def result_from_row(row: dict[str, Any]) -> ChatResult:
    """A processor output row (after :func:`_postprocess`) as a ChatResult."""
    error = row.get("error") or None
    if error:
        return ChatResult.failed(str(row["key"]), str(error))
    n_tokens = int(row["n_tokens"])
    return ChatResult(
        key=str(row["key"]),
        text=str(row["text"]),
        finish_reason=finish_reason(n_tokens, int(row["max_tokens"])),
        n_tokens=n_tokens,
        n_prompt_tokens=int(row["n_prompt_tokens"]),
    )


def _postprocess(row: dict[str, Any]) -> dict[str, Any]:
    """Keep only what a ChatResult needs (runs in Ray workers: module-level, no closures)."""
    return {
        "key": row["key"],
        "text": row.get("generated_text") or "",
        "n_tokens": int(row.get("num_generated_tokens") or 0),
        "n_prompt_tokens": int(row.get("num_input_tokens") or 0),
        "max_tokens": int(row["max_tokens"]),
        "error": row.get("__inference_error__") or "",
        "seconds_in_vllm": float(row.get("time_taken_llm") or 0.0),
    }


def partition(requests: Sequence[ChatRequest], batch_size: int) -> list[list[ChatRequest]]:
    """Requests sorted by key, cut into blocks of ``batch_size``: each key in exactly one block.
    Raises on a repeated key (two results could not be told apart, and the shard store keys by it)."""
    keys = [r.key for r in requests]
    if len(set(keys)) != len(keys):
        repeated = sorted({k for k in keys if keys.count(k) > 1})[:5]
        raise EngineError(f"the Ray backend needs one request per key; repeated: {', '.join(repeated)}")
    ordered = sorted(requests, key=lambda r: r.key)
    return [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]


def engine_kwargs(spec: ModelSpec, settings: EngineSettings, seed: int) -> dict[str, Any]:
    """vLLM engine arguments of one replica: those of the in-process ``Engine``."""
    kwargs: dict[str, Any] = dict(
        dtype=spec.dtype,
        max_model_len=spec.max_model_len,
        seed=seed,
        max_num_seqs=settings.max_num_seqs,
        enforce_eager=settings.enforce_eager,
        **cpu_scheduler_kwargs(spec),
    )
    if settings.compact_json:
        kwargs["structured_outputs_config"] = {"backend": "xgrammar", "disable_any_whitespace": True}
    if spec.device == "cuda":
        kwargs.update(
            tensor_parallel_size=settings.ray.tensor_parallel_size or spec.tensor_parallel_size,
            gpu_memory_utilization=spec.gpu_memory_utilization,
        )
    return kwargs


def processor_config_kwargs(spec: ModelSpec, settings: EngineSettings, seed: int, folder: str) -> dict[str, Any]:
    """Keyword arguments of ``vLLMEngineProcessorConfig`` (a plain dict: testable without Ray)."""
    rs = settings.ray
    kwargs: dict[str, Any] = dict(
        model_source=folder,
        engine_kwargs=engine_kwargs(spec, settings, seed),
        batch_size=rs.batch_size,
        concurrency=rs.concurrency,
        log_engine_metrics=False,
        should_continue_on_error=True,  # a failed request comes back as a row with its error, as on every engine
        chat_template_stage={"enabled": False},
        tokenize_stage={"enabled": False},
        detokenize_stage={"enabled": False},
    )
    if spec.device == "cpu":
        kwargs["placement_group_config"] = {"bundles": [{"CPU": rs.cpus_per_replica}], "strategy": "PACK"}
        kwargs["runtime_env"] = {"env_vars": cpu_engine_variables(settings, local=rs.address == "local")}
    return kwargs


class RayEngine:
    """A local model through Ray Data's vLLM processor. Use as a context manager: entering connects to
    (or starts) Ray and builds the processor; the replicas start when the first requests arrive."""

    def __init__(self, spec: ModelSpec, settings: EngineSettings, seed: int):
        self.spec, self.settings, self.seed = spec, settings, seed
        self.info: EngineInfo | None = None
        self.processor: Any = None
        self._tokenizer: Any = None
        self._started_ray = False
        self.last_stream: dict[str, float] = {}  # timings of the last stream (bench: start-up vs generation)

    def __enter__(self) -> RayEngine:
        require_ray()
        folder, described = preflight(self.spec)
        started = time.time()
        # optional extra (EXTRAS=ray): Ray and its vLLM processor
        import ray
        from ray.data.llm import build_processor, vLLMEngineProcessorConfig

        rs = self.settings.ray
        if not ray.is_initialized():
            if rs.address == "local":
                # Ray's memory monitor kills workers when the whole machine passes 95% memory, whoever uses
                # it: on a shared machine it killed the replica (another process's vLLM held 10 of 23 GB)
                # and Ray Data restarted it over and over. A local Ray leaves that to the kernel.
                os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
                ray.init(num_cpus=rs.num_cpus, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=rs.address, log_to_driver=False)
            self._started_ray = True
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # the stage's own bar (storybias.engines.runner) counts the results
        context.print_on_execution_start = False
        # heavy: the tokenizer for the chat template
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(str(folder))
        config = vLLMEngineProcessorConfig(**processor_config_kwargs(self.spec, self.settings, self.seed, str(folder)))
        self.processor = build_processor(config, postprocess=_postprocess)
        versions = package_versions()
        versions["ray"] = ray.__version__
        self.info = EngineInfo(
            model=self.spec.name,
            model_id=described,
            weights=str(folder),
            device=self.spec.device,
            startup_seconds=round(time.time() - started, 1),
            versions=versions,
            endpoint=f"ray:{rs.address}",
        )
        record_start(self.spec.name, "ray", self.info.startup_seconds, self.settings.enforce_eager)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.processor = None
        if self._started_ray:
            # optional extra (EXTRAS=ray): Ray and its vLLM processor
            import ray

            ray.shutdown()
            self._started_ray = False

    def _chat_template(self) -> str | None:
        if self.spec.chat_template:
            return paths.resolve(self.spec.chat_template).read_text(encoding="utf-8")
        return None

    def render(self, request: ChatRequest) -> tuple[str, list[int]]:
        """The prompt text and token ids vLLM's LLM.chat would build for ``request``."""
        prompt = self._tokenizer.apply_chat_template(
            request.messages,
            tokenize=False,
            add_generation_prompt=True,
            chat_template=self._chat_template(),
            **dict(self.spec.chat_template_kwargs),
        )
        return prompt, self._tokenizer.encode(prompt, add_special_tokens=False)

    def stream(self, requests: Sequence[ChatRequest]) -> Iterator[ChatResult]:
        """Every request through the processor; each result as soon as its block is done (any order)."""
        if self.processor is None:
            raise EngineError("engine not started")
        if not requests:
            return
        # optional extra (EXTRAS=ray): Ray and its vLLM processor
        import ray

        blocks = partition(requests, self.settings.ray.batch_size)
        rows = [request_row(r, *self.render(r)) for block in blocks for r in block]
        started = time.time()
        dataset = ray.data.from_items(rows, override_num_blocks=len(blocks))
        first = None
        in_vllm = 0.0
        for row in self.processor(dataset).iter_rows():
            if first is None:
                first = time.time() - started
            in_vllm = max(in_vllm, float(row.get("seconds_in_vllm") or 0.0))
            self.last_stream = {
                "seconds": round(time.time() - started, 2),
                "first_result_seconds": round(first, 2),
                "max_request_seconds_in_vllm": round(in_vllm, 2),
            }
            yield result_from_row(row)

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise EngineError("engine not started")
        return self._tokenizer
