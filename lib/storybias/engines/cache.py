"""One cache for every model call: stage 01's stories, stage 03's answers (both steps) and stage 04's
ratings are all stored and reused here, under one key and one rule.

The design follows lm-evaluation-harness' ``CachingLM`` and HELM's ``CachingClient``: a wrapper around
any :class:`~storybias.engines.ChatEngine` that answers a request from the store when the very same
request was answered before by the very same model under the same output-shaping settings, and asks
the engine otherwise. The key of a request is the hash of five parts, each hashed on its own so that
a miss can say what changed against the closest stored answer of the same logical request
(``ChatRequest.key``: a story id, an answer key, a rating key):

- ``prompt``: the chat messages;
- ``sampling``: the sampling parameters and the seed;
- ``constraint``: the answer constraint (choice list or JSON schema) and ``ignore_eos``;
- ``model``: the model's identity (:func:`model_identity`: the embedded weights' sha256, a local
  folder, a hub id, or an endpoint and its model id) with every model setting that can change an
  output (dtype, max model length, device, chat template and its content, ...);
- ``engine``: every engine setting that can change an output (:data:`OUTPUT_ENGINE_FIELDS`:
  whitespace-free JSON, eager mode, deterministic CPU attention, top-k first on CPU).

Settings that change how fast or how often a model is asked but not what it writes (concurrency,
timeouts, retries, rate limits, the key's variable, prices, KV-cache size, thread binding, the
transport: in process, shared server or Ray) are left out (:data:`OPERATIONAL_MODEL_FIELDS`,
:data:`OPERATIONAL_ENGINE_FIELDS`), so changing them reuses every answer. Every field of
``ModelSpec`` and ``EngineSettings`` is in exactly one of the two lists (a test checks it), so a new
field has to be classified before it can be used.

A failed request (``error`` set) is never stored: a rerun asks again. The store is append-only and
content-addressed, so nothing paid for is ever overwritten: an answer of a changed prompt is a new
entry beside the old one, and the old one comes back if the prompt is changed back. Each stage
counts why each request was or was not answered from the store (``reasons``) in its manifest.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from storybias.config import models
from storybias.config.llamacpp import LLAMA_CPP
from storybias.config.output_fields import (  # noqa: F401  (the classification, re-exported for the cache's readers)
    ADDED_MODEL_FIELDS,
    LOADED_ONLY_FIELDS,
    LOADED_OUTPUT_FIELDS,
    MODEL_FIELD_CLASSES,
    OPERATIONAL_ENGINE_FIELDS,
    OPERATIONAL_MODEL_FIELDS,
    OUTPUT_ENGINE_FIELDS,
    OUTPUT_MODEL_FIELDS,
    REQUEST_OUTPUT_FIELDS,
    SERVER_MODEL_FIELDS,
)
from storybias.config.params import EngineSettings, ModelSpec
from storybias.core import paths
from storybias.core.io import ShardStore
from storybias.engines.base import ChatEngine, ChatRequest, ChatResult, EngineError, EngineInfo
from storybias.engines.progress import sequences_in_flight, tokens_in_flight

PARTS = ("prompt", "sampling", "constraint", "model", "engine")
REUSED = "reused"
NEW = "new"


def _digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def model_identity(spec: ModelSpec, fields: frozenset[str] = OUTPUT_MODEL_FIELDS) -> dict[str, Any]:
    """What of ``spec`` shapes its outputs (``fields``: :data:`OUTPUT_MODEL_FIELDS`; the server key reads
    :data:`SERVER_MODEL_FIELDS`), with an embedded model named by its weights' pinned sha256 and a chat
    template by its file's content."""
    dumped = spec.model_dump(mode="json")
    identity = {k: dumped[k] for k in sorted(fields) if ADDED_MODEL_FIELDS.get(k, object()) != dumped[k]}
    # the weights loaded, by their pinned sha256: the GGUF's for the bf16 folder, the int8 copy's for int8
    identity["embedded"] = models.pinned_sha256(spec)  # None: not read for other sources
    if spec.chat_template:
        template = paths.resolve(spec.chat_template)
        identity["chat_template"] = template.read_text(encoding="utf-8") if template.is_file() else spec.chat_template
    return identity


def engine_identity(settings: EngineSettings) -> dict[str, Any]:
    """The engine settings of :data:`OUTPUT_ENGINE_FIELDS` (those that can change an output)."""
    dumped = settings.model_dump(mode="json")
    identity = {k: dumped[k] for k in sorted(OUTPUT_ENGINE_FIELDS)}
    if settings.shared_server_kind == LLAMA_CPP:
        # another runtime on other weights (the Q4_K_M GGUF, not its bf16 conversion): its answers are not
        # vLLM's; other kinds of server add nothing, so their stored answers keep their keys
        identity["runtime"] = LLAMA_CPP
    return identity


@dataclass(frozen=True)
class CacheKey:
    """The key of one request: its logical key and the hash of each of :data:`PARTS`."""

    logical_key: str
    parts: tuple[str, str, str, str, str]

    @property
    def value(self) -> str:
        return _digest(list(self.parts))

    def changed_against(self, other: CacheKey) -> list[str]:
        return [name for name, mine, theirs in zip(PARTS, self.parts, other.parts) if mine != theirs]


def request_parts(request: ChatRequest) -> tuple[str, str, str]:
    """The hashes of a request's own parts: prompt, sampling (with the seed) and constraint."""
    return (
        _digest(request.messages),
        _digest({"sampling": request.sampling.model_dump(mode="json"), "seed": request.seed}),
        _digest({"choice": request.choice, "json_schema": request.json_schema, "ignore_eos": request.ignore_eos}),
    )


def cache_key(request: ChatRequest, model_hash: str, engine_hash: str) -> CacheKey:
    return CacheKey(request.key, (*request_parts(request), model_hash, engine_hash))


CACHE_SCHEMA = pa.schema(
    [
        ("cache_key", pa.string()),
        ("logical_key", pa.string()),
        *[(f"{part}_hash", pa.string()) for part in PARTS],
        ("text", pa.string()),
        ("finish_reason", pa.string()),
        ("n_tokens", pa.int64()),
        ("n_prompt_tokens", pa.int64()),
        ("model", pa.string()),  # the profile's name of the model that answered (for a reader)
        ("model_id", pa.string()),  # what the engine reported it ran
        ("created_at", pa.string()),
    ]
)


def cache_dir(run_name: str) -> Path:
    """``data/<run>/cache/``: every answer of every model call of the run."""
    return paths.run_dir(run_name) / "cache"


@dataclass
class Lookup:
    """Which of a batch of requests the store answers, and why each other one must be asked."""

    hits: dict[str, ChatResult]  # request key -> the stored result
    misses: list[ChatRequest]
    reasons: dict[str, str]  # request key -> "reused" / "new" / "<part> and <part> changed"

    def counts(self) -> dict[str, int]:
        return dict(Counter(self.reasons.values()))


class ResponseCache:
    """The append-only store of every answered request of a run (``data/<run>/cache/``), in shards of
    ``shard_size`` rows. Read once when opened; new answers are appended as they arrive."""

    def __init__(self, folder: Path, shard_size: int = 16):
        if shard_size < 1:
            raise ValueError(f"shard_size must be at least 1, not {shard_size}")
        self.store = ShardStore(folder, key="cache_key", schema=CACHE_SCHEMA)
        self.shard_size = shard_size
        self._rows: dict[str, dict[str, Any]] = {}
        self._by_logical: dict[str, list[CacheKey]] = {}
        for row in self.store.read_all().to_pylist():
            self._remember(row)

    @classmethod
    def for_run(cls, run_name: str, shard_size: int = 16) -> ResponseCache:
        return cls(cache_dir(run_name), shard_size)

    def __len__(self) -> int:
        return len(self._rows)

    def _remember(self, row: dict[str, Any]) -> None:
        self._rows[row["cache_key"]] = row
        parts = (
            row["prompt_hash"],
            row["sampling_hash"],
            row["constraint_hash"],
            row["model_hash"],
            row["engine_hash"],
        )
        self._by_logical.setdefault(row["logical_key"], []).append(CacheKey(row["logical_key"], parts))

    def reason(self, key: CacheKey) -> str:
        """``reused``, ``new`` (no stored answer of this logical request) or what changed against the
        stored answer of the same logical request that differs in the fewest parts."""
        if key.value in self._rows:
            return REUSED
        earlier = self._by_logical.get(key.logical_key, [])
        if not earlier:
            return NEW
        changed = min((key.changed_against(other) for other in earlier), key=len)
        return f"{' and '.join(changed)} changed"

    def lookup(self, requests: Sequence[ChatRequest], model_hash: str, engine_hash: str) -> Lookup:
        hits: dict[str, ChatResult] = {}
        misses: list[ChatRequest] = []
        reasons: dict[str, str] = {}
        for request in requests:
            key = cache_key(request, model_hash, engine_hash)
            reasons[request.key] = self.reason(key)
            row = self._rows.get(key.value)
            if row is None:
                misses.append(request)
            else:
                hits[request.key] = ChatResult(
                    key=request.key,
                    text=row["text"],
                    finish_reason=row["finish_reason"],
                    n_tokens=int(row["n_tokens"]),
                    n_prompt_tokens=int(row["n_prompt_tokens"]),
                    cached=True,
                    answered_at=row["created_at"],
                )
        return Lookup(hits, misses, reasons)

    def append(self, rows: Sequence[dict[str, Any]]) -> None:
        """Store answered rows (one shard) and remember them."""
        fresh = [r for r in rows if r["cache_key"] not in self._rows]
        if fresh:
            self.store.append(fresh)
        for row in fresh:
            self._remember(row)


def _cache_row(key: CacheKey, result: ChatResult, model: str, model_id: str) -> dict[str, Any]:
    return {
        "cache_key": key.value,
        "logical_key": key.logical_key,
        **{f"{part}_hash": value for part, value in zip(PARTS, key.parts)},
        "text": result.text,
        "finish_reason": result.finish_reason,
        "n_tokens": result.n_tokens,
        "n_prompt_tokens": result.n_prompt_tokens,
        "model": model,
        "model_id": model_id,
        "created_at": result.answered_at or _now(),
    }


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class CacheStats:
    """What one :class:`CachingEngine` did: why each request was (not) answered from the store."""

    reasons: Counter = field(default_factory=Counter)
    n_stored: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"reasons": dict(self.reasons), "n_stored": self.n_stored}


class CachingEngine:
    """A :class:`ChatEngine` that answers from a :class:`ResponseCache` what it holds and asks the
    engine made by ``open_inner()`` for the rest, storing each answer as it arrives.

    The inner engine is started only when a request misses, so a run whose answers are all stored
    loads no model. ``tokenizer()`` reads the model's tokenizer from its weights folder (None for a
    served model), so a stage can fit its prompts before it knows whether a model must be loaded.
    """

    def __init__(
        self,
        open_inner: Callable[[], ChatEngine],
        spec: ModelSpec,
        settings: EngineSettings,
        cache: ResponseCache,
    ):
        self.open_inner = open_inner
        self.spec = spec
        self.cache = cache
        self.model_hash = _digest(model_identity(spec))
        self.engine_hash = _digest(engine_identity(settings))
        self.stats = CacheStats()
        self._inner: ChatEngine | None = None  # the context manager open_inner() made
        self._entered: ChatEngine | None = None  # what its __enter__ returned: the engine that answers
        self._tokenizer: Any = None
        self.model_loaded = False  # whether a request missed and the inner engine was started
        self.info: EngineInfo | None = None
        self._prepared: tuple[Sequence[ChatRequest], Lookup] | None = None  # prepare()'s lookup, for stream()

    def __enter__(self) -> CachingEngine:
        self.model_loaded = False
        self.info = EngineInfo(
            model=self.spec.name, model_id="(answered from the cache)", weights="-", device="-", startup_seconds=0.0
        )
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._inner is not None and self.model_loaded:
            self._inner.__exit__(*exc)
        self._inner = self._entered = None

    def lookup(self, requests: Sequence[ChatRequest]) -> Lookup:
        return self.cache.lookup(requests, self.model_hash, self.engine_hash)

    def key_of(self, request: ChatRequest) -> str:
        """The cache key ``request`` is stored under for this engine's model and settings."""
        return cache_key(request, self.model_hash, self.engine_hash).value

    def _built(self) -> ChatEngine:
        """The inner engine, made but not started (making one loads nothing)."""
        if self._inner is None:
            self._inner = self.open_inner()
        return self._inner

    def _start(self) -> ChatEngine:
        """The started engine: what the inner context manager's ``__enter__`` returned (the benchmarks
        lend a started engine through a wrapper whose ``__enter__`` returns it and whose exit keeps it)."""
        inner = self._built()
        if self._entered is None or not self.model_loaded:
            self._entered = inner.__enter__()
            self.model_loaded = True
            self.info = self._entered.info
        return self._entered

    def prepare(
        self, requests: Sequence[ChatRequest], phase: Callable[[], AbstractContextManager[Any]] = nullcontext
    ) -> Lookup:
        """Look ``requests`` up and, when one misses, start the inner engine inside ``phase()`` (the
        runner's start-up line): the start-up is over before anything is streamed. ``stream`` of the same
        requests then reuses this lookup."""
        found = self.lookup(requests)
        self._prepared = (requests, found)
        if found.misses and not self.model_loaded:
            with phase():
                self._start()
        return found

    def stream(self, requests: Sequence[ChatRequest]) -> Iterator[ChatResult]:
        """Stored answers first, then the inner engine's, each stored as it arrives (in shards of the
        cache's ``shard_size``; what arrived before a crash or an interrupt is stored too)."""
        prepared, self._prepared = self._prepared, None
        found = prepared[1] if prepared is not None and prepared[0] is requests else self.lookup(requests)
        self.stats.reasons.update(found.reasons.values())
        yield from found.hits.values()
        if not found.misses:
            return
        inner = self._start()
        keys = {r.key: cache_key(r, self.model_hash, self.engine_hash) for r in found.misses}
        model_id = inner.info.model_id if inner.info is not None else ""
        buffer: list[dict[str, Any]] = []
        try:
            for result in inner.stream(found.misses):
                result.answered_at = result.answered_at or _now()
                if result.error is None:  # a failed request is never stored: a rerun asks again
                    buffer.append(_cache_row(keys[result.key], result, self.spec.name, model_id))
                    if len(buffer) >= self.cache.shard_size:
                        self._flush(buffer)
                yield result
        finally:
            self._flush(buffer)

    def _flush(self, buffer: list[dict[str, Any]]) -> None:
        if buffer:
            self.cache.append(buffer)
            self.stats.n_stored += len(buffer)
            buffer.clear()

    def tokens_in_flight(self) -> int | None:
        """The started inner engine's running sequences' tokens (storybias.engines.progress), None when
        it cannot tell or none was started."""
        if self._entered is None or not self.model_loaded:
            return None
        return tokens_in_flight(self._entered)

    def sequences_in_flight(self) -> dict[str, int] | None:
        """The started inner engine's running requests' tokens by key (storybias.engines.progress), None
        when it cannot tell or none was started."""
        if self._entered is None or not self.model_loaded:
            return None
        return sequences_in_flight(self._entered)

    def tokenizer(self) -> Any | None:
        """The inner engine's tokenizer; before it is started, one read from the model's weights folder
        when the engine needs a started model to give it (None for a served model)."""
        inner = self._built()
        if self.model_loaded:
            return self._start().tokenizer()
        try:
            return inner.tokenizer()
        except EngineError:  # an in-process or Ray engine knows its tokenizer once started
            pass
        if self._tokenizer is None and self.spec.source != "openai":
            self._tokenizer = models.load_tokenizer(self.spec)
        return self._tokenizer
