"""Served models: any OpenAI-compatible chat-completions endpoint as a :class:`~storybias.engines.ChatEngine`.

Used for ``source: openai`` models (an API such as OpenRouter or OpenAI, or a lab's vLLM deployment)
and for the run's shared local vLLM server (``storybias.engines.local_servers``). The contract is the in-process
engine's: every request carries its seed, ``max_tokens``, temperature and top-p (top-k and the
repetition penalty too where the server accepts them: ``constraints: vllm``) and its answer
constraint; results stream back as they finish, in any order, one per request.

- Constraints: ``constraints: vllm`` sends vLLM's ``structured_outputs`` ({"json": schema} or
  {"choice": [...]}) in the request body. (vLLM 0.32 silently ignores the removed ``guided_json``
  field, so the slow tests prove the constraint is applied.) ``constraints: openai`` sends the standard
  ``response_format`` json_schema; a choice list becomes ``{"answer": <enum>}`` and the answer is
  unwrapped, so stages see the chosen string as with vLLM. ``constraints: llama.cpp`` speaks llama.cpp's
  server (a GBNF grammar for a choice, top_k, repeat_penalty: storybias.engines.llamacpp_dialect).
- Retries: the ``openai`` SDK's own (408/409/429/5xx and connection errors, honouring retry-after),
  ``max_retries`` times with ``request_timeout_s`` per attempt. Concurrency is capped by a semaphore
  (``max_concurrency``), request starts by an optional requests-per-minute limiter.
- Failure is data: a request that still fails (another 4xx, a content filter, a timeout) comes back
  as a result with ``error`` set. Only what makes every further request pointless stops the stream
  with :class:`~storybias.engines.EngineError`: the endpoint unreachable, the key refused (401), the
  model unknown (404).
- :func:`preflight_endpoint` checks key, URL and model id with real requests (the model list, then a
  1-token chat) before any work is queued, and fails within seconds with one message naming the
  model, the URL and the variable holding the key (never the key).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from storybias.config.models import load_tokenizer
from storybias.config.params import EngineSettings, ModelSpec
from storybias.core.secrets import key_problem, scrub
from storybias.engines import llamacpp_dialect
from storybias.engines.base import (
    ChatRequest,
    ChatResult,
    EngineError,
    EngineInfo,
    package_versions,
    top_k_first,
    top_k_top_p_fields,
)
from storybias.engines.context import check_fits, endpoint_context, fetch_from_root
from storybias.engines.server_metrics import ServedTokens, for_dialect

# A served model's key when the endpoint needs none (a local vLLM server started without --api-key):
# the SDK refuses an empty key.
NO_KEY = "EMPTY"


@dataclass(frozen=True)
class Endpoint:
    """Where and how to ask one served model (what OpenAIEngine needs; built from a ModelSpec or from
    the run's shared-server registry)."""

    name: str
    base_url: str
    model_id: str
    api_key: str = field(default=NO_KEY, repr=False)  # never in a repr, a log or a message
    api_key_env: str | None = None  # for messages only
    max_concurrency: int = 8
    requests_per_minute: float | None = None
    timeout_s: float = 600.0
    max_retries: int = 6
    constraints: str = "vllm"
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""  # the model's id for the manifest (weights for a local server)
    # a local vLLM server of a CPU model with generation.engine.cpu_top_k_first: top-k and top-p go to
    # the server's logits processor (``vllm_xargs``) instead of its sort (storybias.engines.cpu_sampling)
    top_k_first: bool = False
    # the tokens a request may use (the model's max_model_len): llama.cpp's repetition window
    context_tokens: int = 4096

    def where(self) -> str:
        key = f"key from ${self.api_key_env}" if self.api_key_env else "no key"
        return f"model {self.name!r} ({self.model_id} at {self.base_url}; {key})"


def api_key(spec: ModelSpec) -> str:
    """The key of a served model, read from the variable ``api_key_env`` names (never from a profile)."""
    if spec.api_key_env is None:
        return NO_KEY
    value = os.environ.get(spec.api_key_env, "")
    if not value:
        raise EngineError(
            f"model {spec.name!r}: the environment variable {spec.api_key_env} (api_key_env) is not set; "
            f"export it with your key for {spec.base_url} (the profile names the variable, never the key)"
        )
    problem = key_problem(spec.api_key_env, value)
    if problem is not None:  # httpx would quote the whole header, key included, in its error
        raise EngineError(f"model {spec.name!r} (api_key_env): {problem}")
    return value


def endpoint_of(spec: ModelSpec) -> Endpoint:
    assert spec.base_url and spec.model_id
    return Endpoint(
        name=spec.name,
        base_url=spec.base_url.rstrip("/"),
        model_id=spec.model_id,
        api_key=api_key(spec),
        api_key_env=spec.api_key_env,
        max_concurrency=spec.max_concurrency,
        requests_per_minute=spec.requests_per_minute,
        timeout_s=spec.request_timeout_s,
        max_retries=spec.max_retries,
        constraints=spec.constraints,
        chat_template_kwargs=dict(spec.chat_template_kwargs),
        description=spec.model_id,
        context_tokens=spec.max_model_len,
    )


# --- request bodies ------------------------------------------------------------------------------

CHOICE_FIELD = "answer"


def choice_schema(choice: Sequence[str]) -> dict[str, Any]:
    """A choice list as a JSON schema for APIs without a choice constraint (``constraints: openai``)."""
    return {
        "type": "object",
        "properties": {CHOICE_FIELD: {"type": "string", "enum": list(choice)}},
        "required": [CHOICE_FIELD],
        "additionalProperties": False,
    }


def request_kwargs(endpoint: Endpoint, request: ChatRequest) -> dict[str, Any]:
    """The keyword arguments of ``client.chat.completions.create`` for one request."""
    s = request.sampling
    kwargs: dict[str, Any] = {
        "model": endpoint.model_id,
        "messages": request.messages,
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "seed": request.seed,
    }
    extra: dict[str, Any] = {}
    if endpoint.constraints == "vllm":
        fields = top_k_top_p_fields(s, endpoint.top_k_first)
        kwargs["top_p"] = fields["top_p"]
        extra.update(top_k=fields["top_k"], repetition_penalty=s.repetition_penalty)
        if "extra_args" in fields:
            extra["vllm_xargs"] = fields["extra_args"]
        if request.ignore_eos:
            extra["ignore_eos"] = True
        if request.choice is not None:
            extra["structured_outputs"] = {"choice": list(request.choice)}
        elif request.json_schema is not None:
            extra["structured_outputs"] = {"json": request.json_schema}
        if endpoint.chat_template_kwargs:
            extra["chat_template_kwargs"] = dict(endpoint.chat_template_kwargs)
    elif endpoint.constraints == "llama.cpp":  # storybias.engines.llamacpp_dialect
        extra.update(llamacpp_dialect.sampling_fields(s, request.ignore_eos, endpoint.context_tokens))
        constraint = llamacpp_dialect.constraint_fields(request.choice, request.json_schema)
        if "response_format" in constraint:
            kwargs["response_format"] = constraint.pop("response_format")
        extra.update(constraint)
        if endpoint.chat_template_kwargs:
            extra["chat_template_kwargs"] = dict(endpoint.chat_template_kwargs)
    else:
        if request.choice is not None:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "choice", "strict": True, "schema": choice_schema(request.choice)},
            }
        elif request.json_schema is not None:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "strict": True, "schema": request.json_schema},
            }
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


def result_of(endpoint: Endpoint, request: ChatRequest, response: Any) -> ChatResult:
    """A ChatResult from a chat-completions response (finish reason and token counts from the response)."""
    choice = response.choices[0]
    message = choice.message
    text = message.content if message.content is not None else (getattr(message, "refusal", None) or "")
    finish = str(choice.finish_reason or "unknown")
    usage = getattr(response, "usage", None)
    n_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
    n_prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
    if finish == "content_filter":
        return ChatResult(
            key=request.key,
            text="",
            finish_reason="error",
            n_tokens=n_tokens,
            n_prompt_tokens=n_prompt,
            error="content_filter: the provider's content filter withheld the answer",
        )
    if endpoint.constraints == "openai" and request.choice is not None and text:
        try:
            text = str(json.loads(text)[CHOICE_FIELD])
        except (ValueError, KeyError, TypeError):
            pass  # kept verbatim: the stage sees an answer outside the list
    return ChatResult(key=request.key, text=text, finish_reason=finish, n_tokens=n_tokens, n_prompt_tokens=n_prompt)


# --- rate limiting -------------------------------------------------------------------------------


class RateLimiter:
    """At most ``per_minute`` request starts per minute, spaced evenly (one every 60 / per_minute s):
    an even spacing never bursts above a provider's per-minute quota, whatever its window."""

    def __init__(
        self,
        per_minute: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ):
        self.interval = 60.0 / per_minute
        self.clock, self.sleep = clock, sleep
        self._next = float("-inf")
        self._lock: asyncio.Lock | None = None

    async def acquire(self) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            now = self.clock()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            await self.sleep(start - now)


# --- errors --------------------------------------------------------------------------------------


class _Fatal(Exception):
    """Every further request would fail the same way: stop the stream."""


def _describe(exc: BaseException) -> str:
    # heavy (about 1 s): only a profile that names an endpoint needs the client
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return "timeout: no answer within request_timeout_s (after the retries)"
    if isinstance(exc, openai.APIStatusError):
        message = getattr(exc, "message", str(exc))
        return scrub(f"HTTP {exc.status_code}: {message}")[:500]
    return scrub(f"{type(exc).__name__}: {exc}")[:500]


def _classify(endpoint: Endpoint, exc: BaseException) -> str:
    """The stored error text of a failed request, or raise _Fatal when no later request can succeed."""
    # heavy (about 1 s): only a profile that names an endpoint needs the client
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return _describe(exc)
    if isinstance(exc, openai.APIConnectionError):
        raise _Fatal(
            f"{endpoint.where()}: cannot reach the endpoint ({scrub(str(exc), [endpoint.api_key])}); "
            "finished answers are stored, a rerun asks only for the rest"
        )
    if isinstance(exc, openai.AuthenticationError):
        raise _Fatal(f"{endpoint.where()}: the endpoint refused the key ({_describe(exc)})")
    if isinstance(exc, openai.NotFoundError):
        raise _Fatal(f"{endpoint.where()}: the endpoint does not know this model ({_describe(exc)})")
    return _describe(exc)


# --- the engine ----------------------------------------------------------------------------------


class OpenAIEngine:
    """A served model as a ChatEngine. Use as a context manager (entering runs the preflight for an
    external endpoint; a local server was checked when it started)."""

    def __init__(
        self,
        spec: ModelSpec,
        seed: int,
        endpoint: Endpoint | None = None,
        tokenizer_from: ModelSpec | None = None,
        check: bool = True,
    ):
        self.spec = spec
        self.seed = seed
        self._endpoint = endpoint
        self._tokenizer_from = tokenizer_from
        self._tokenizer: Any = None
        self._check = check
        self.info: EngineInfo | None = None
        self._served_tokens: ServedTokens | None = None  # the running stream's poller, where the server tells
        self._sent: set[str] = set()  # keys of the requests sent and not answered yet

    @classmethod
    def for_local_server(
        cls, spec: ModelSpec, entry: dict[str, Any], settings: EngineSettings, seed: int
    ) -> OpenAIEngine:
        """The run's shared local server for ``spec`` (a registry entry of storybias.engines.local_servers): as many
        requests in flight as the in-process engine would batch, long timeouts (CPU decoding)."""
        endpoint = Endpoint(
            name=spec.name,
            base_url=entry["base_url"],
            model_id=entry["model_id"],
            api_key=entry.get("api_key") or NO_KEY,
            max_concurrency=int(entry.get("max_concurrency", settings.max_num_seqs)),
            timeout_s=3600.0,
            max_retries=2,
            constraints=entry.get("constraints", "vllm"),  # a llama-server's entry says "llama.cpp"
            chat_template_kwargs=dict(spec.chat_template_kwargs),
            description=entry.get("described", entry["model_id"]),
            top_k_first=top_k_first(spec, settings) and entry.get("constraints", "vllm") == "vllm",
            context_tokens=spec.max_model_len,
        )
        return cls(spec, seed, endpoint=endpoint, tokenizer_from=spec, check=False)

    @property
    def endpoint(self) -> Endpoint:
        if self._endpoint is None:
            self._endpoint = endpoint_of(self.spec)
        return self._endpoint

    def __enter__(self) -> OpenAIEngine:
        started = time.time()
        endpoint = self.endpoint
        if self._check and time.time() - _preflighted.get(_preflight_id(endpoint), float("-inf")) > PREFLIGHT_VALID_S:
            preflight_endpoint(self.spec)
        self.info = EngineInfo(
            model=self.spec.name,
            model_id=endpoint.description,
            weights="-",
            device="served",
            startup_seconds=round(time.time() - started, 1),
            versions=package_versions() if self._tokenizer_from is not None else {},
            endpoint=endpoint.base_url,
        )
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def tokenizer(self) -> Any | None:
        """The local model's tokenizer (read from its weights folder); None for an external endpoint."""
        if self._tokenizer_from is None:
            return None
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self._tokenizer_from)
        return self._tokenizer

    def tokens_in_flight(self) -> int | None:
        """What the running requests generated so far, where the server tells it (llama-server's /slots,
        vLLM's /metrics: storybias.engines.server_metrics); None otherwise (the bar counts finished answers)."""
        poller = self._served_tokens
        return poller.in_flight() if poller is not None else None

    def sequences_in_flight(self) -> dict[str, int] | None:
        """Each request sent and not answered, credited an equal share of what the running requests
        generated (:meth:`tokens_in_flight`): a server tells the sum (vLLM's /metrics) or counts per slot
        without the request (llama-server's /slots), so an equal share is the closest it tells. None
        when the server tells nothing."""
        total, sent = self.tokens_in_flight(), list(self._sent)
        if total is None:
            return None
        return {key: total // len(sent) for key in sent}

    def stream(self, requests: Sequence[ChatRequest]) -> Iterator[ChatResult]:
        """Send every request (at most ``max_concurrency`` in flight) and yield each result as it
        arrives. Closing the generator early (a crash, an interrupt) cancels what is in flight."""
        if not requests:
            return
        endpoint = self.endpoint
        check_fits(self.spec, endpoint, requests, self.tokenizer())  # before anything is sent
        context = endpoint_context(endpoint, self.spec.context_tokens)
        poller = for_dialect(context.dialect if context else None, lambda path: fetch_from_root(endpoint, path))
        self._served_tokens = poller
        results: queue.Queue = queue.Queue()
        state: dict[str, Any] = {}
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            state["loop"] = loop
            try:
                task = loop.create_task(_send_all(endpoint, list(requests), results, self._sent))
                state["task"] = task
                ready.set()
                loop.run_until_complete(task)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                results.put(exc)
            finally:
                ready.set()
                loop.close()

        thread = threading.Thread(target=run, name=f"served-{endpoint.name}", daemon=True)
        thread.start()
        ready.wait()
        received = 0
        try:
            while received < len(requests):
                item = results.get()
                if isinstance(item, _Fatal):
                    raise EngineError(str(item))
                if isinstance(item, asyncio.CancelledError):
                    raise EngineError(f"{endpoint.where()}: requests cancelled")
                if isinstance(item, BaseException):
                    raise _without_key(item, endpoint)
                received += 1
                if poller is not None:
                    poller.finished(item.n_tokens)
                yield item
        finally:
            self._served_tokens = None
            loop, task = state.get("loop"), state.get("task")
            if thread.is_alive() and loop is not None and task is not None:
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:  # the loop closed meanwhile
                    pass
            thread.join(timeout=30)


def _without_key(exc: BaseException, endpoint: Endpoint) -> BaseException:
    """``exc`` itself, or an EngineError with its text scrubbed where it quotes a header value or the key
    (raised from None: the original, with the key in it, is not chained into the traceback)."""
    text = str(exc)
    clean = scrub(text, [endpoint.api_key])
    if clean == text:
        return exc
    return EngineError(f"{endpoint.where()}: {type(exc).__name__}: {clean}")


async def _send_all(
    endpoint: Endpoint, requests: list[ChatRequest], results: queue.Queue, sent: set[str] | None = None
) -> None:
    """Send ``requests`` (at most ``max_concurrency`` at a time), each result or failure put on
    ``results``; ``sent`` holds the keys of those sent and not answered yet."""
    sent = set() if sent is None else sent
    # heavy (about 1 s): only a profile that names an endpoint needs the client
    import httpx
    import openai

    client = openai.AsyncOpenAI(
        base_url=endpoint.base_url,
        api_key=endpoint.api_key,
        max_retries=endpoint.max_retries,
        timeout=endpoint.timeout_s,
        # openai's stubs name its vendored httpx2.Limits; httpx.Limits is the class it uses
        http_client=openai.DefaultAsyncHttpxClient(
            limits=httpx.Limits(  # type: ignore[arg-type]
                max_connections=endpoint.max_concurrency + 4, max_keepalive_connections=endpoint.max_concurrency + 4
            )
        ),
    )
    semaphore = asyncio.Semaphore(endpoint.max_concurrency)
    limiter = RateLimiter(endpoint.requests_per_minute) if endpoint.requests_per_minute else None
    fatal: list[_Fatal] = []

    async def one(request: ChatRequest) -> None:
        try:
            if limiter is not None:
                await limiter.acquire()
            sent.add(request.key)
            response = await client.chat.completions.create(**request_kwargs(endpoint, request))
            sent.discard(request.key)  # before its answer can be taken
            results.put(result_of(endpoint, request, response))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes data or a fatal stop
            sent.discard(request.key)
            try:
                results.put(ChatResult.failed(request.key, _classify(endpoint, exc)))
            except _Fatal as stop:
                if not fatal:
                    fatal.append(stop)
                    results.put(stop)
        finally:
            sent.discard(request.key)
            semaphore.release()

    tasks: set[asyncio.Task] = set()
    try:
        for request in requests:
            await semaphore.acquire()
            if fatal:
                break
            task = asyncio.create_task(one(request))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks and not fatal:
            await asyncio.wait(set(tasks), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in list(tasks):
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()


# --- preflight -----------------------------------------------------------------------------------

PREFLIGHT_TIMEOUT_S = 15.0
PREFLIGHT_VALID_S = 600.0  # a stage preflights every model first; the engine does not ask again within this
_preflighted: dict[tuple[str, str, int], float] = {}


def _preflight_id(endpoint: Endpoint) -> tuple[str, str, int]:
    return endpoint.base_url, endpoint.model_id, hash(endpoint.api_key)


def preflight_endpoint(spec: ModelSpec, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> str:
    """Check a served model before any work is queued: its key variable is set, the endpoint answers,
    it knows ``model_id`` (its model list, where it has one) and accepts the key (a 1-token chat).
    Raises EngineError with one message naming the model, the URL and the key's variable; returns a
    description for the manifest."""
    # heavy (about 1 s): only a profile that names an endpoint needs the client
    import openai

    endpoint = endpoint_of(spec)  # raises when the key variable is unset
    client = openai.OpenAI(
        base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=1, timeout=min(timeout_s, endpoint.timeout_s)
    )
    where = endpoint.where()
    try:
        try:
            listed = [m.id for m in client.models.list().data]
        except openai.NotFoundError:
            listed = []  # no model list at this endpoint: the chat below decides
        if listed and endpoint.model_id not in listed:
            shown = ", ".join(listed[:8]) + (" ..." if len(listed) > 8 else "")
            raise EngineError(f"{where}: unknown model id {endpoint.model_id!r}; the endpoint serves: {shown}")
        client.chat.completions.create(
            model=endpoint.model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=1, temperature=0
        )
    except EngineError:
        raise
    except openai.AuthenticationError as exc:
        raise EngineError(
            f"{where}: the endpoint refused the key ({_describe(exc)}); check ${spec.api_key_env or '(none)'}"
        ) from None
    except openai.NotFoundError as exc:
        raise EngineError(f"{where}: unknown model id {endpoint.model_id!r} ({_describe(exc)})") from None
    except openai.APITimeoutError:
        raise EngineError(f"{where}: no answer from the endpoint within {timeout_s:.0f} s") from None
    except openai.APIConnectionError as exc:
        raise EngineError(
            f"{where}: cannot reach the endpoint ({scrub(str(exc.__cause__ or exc), [endpoint.api_key])})"
        ) from None
    except openai.APIStatusError as exc:
        raise EngineError(f"{where}: the endpoint refused a 1-token test request ({_describe(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - any other failure, its text scrubbed of the key
        raise _without_key(exc, endpoint) from None
    finally:
        client.close()
    _preflighted[_preflight_id(endpoint)] = time.time()
    context = endpoint_context(endpoint, spec.context_tokens)
    known = f"; each request may use {context.tokens} tokens ({context.described()})" if context else ""
    return f"{endpoint.model_id} at {endpoint.base_url}{known}"


# --- the endpoint's context (storybias.engines.context) ----------------------------------------------


def check_endpoint_fits(spec: ModelSpec, requests: Sequence[ChatRequest]) -> None:
    """A stage's preflight for a served model (``source: openai``) and the requests it will send: refuse
    them all before any work when one cannot fit (:func:`check_fits`); nothing to do for a local model.
    The counts are kept, so the engine's own check before sending costs nothing more."""
    if spec.source == "openai" and requests:
        check_fits(spec, endpoint_of(spec), requests)
