"""Know a served endpoint's context before sending (issue #60, item 1).

llama.cpp's ``llama-server -c 8192 -np 4`` gives each of its 4 slots 2,048 tokens; an extraction
request of 2,997 tokens came back ``request (2997 tokens) exceeds the available context size (2048
tokens)``, and nothing had said so before the run. Before a served model's requests are sent,
:func:`check_requests_fit` reads the context each request may use and refuses the batch when one
request (prompt + ``max_tokens``) cannot fit, naming the longest, its size, the limit and the
server setting that would make it fit.

Where the limit comes from (:func:`read_context`), first found wins:

- llama.cpp's server: ``GET /props`` (at the server's root, not under ``/v1``):
  ``default_generation_settings.n_ctx`` is one slot's context, ``total_slots`` the slots (``-np``);
  ``-c`` is divided among them (llama.cpp's tools/server/README.md);
- vLLM's server: ``max_model_len`` of the model's entry in ``GET /v1/models``;
- the profile: the model's ``context_tokens``, for providers that publish none;
- none of these: nothing is checked (the endpoint's own errors still come back as data).

Prompt tokens are counted with the model's tokenizer where storybias has it (a local model behind a
local server), else with the server's: llama.cpp's ``POST /apply-template`` (the chat template) then
``POST /tokenize`` (``{"content", "add_special"}`` -> ``{"tokens": [...]}``), or vLLM's ``POST /tokenize``
(``{"model", "messages"}`` -> ``{"count": n, ...}``). Each prompt is counted once per process
(:data:`_counted`), so a stage never pays for the same prompt twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from storybias.config.params import ModelSpec
from storybias.engines.base import ChatRequest, EngineError

LLAMA_CPP = "llama.cpp"
VLLM = "vllm"
PROFILE = "profile"
CONTEXT_TIMEOUT_S = 15.0

# (where the count came from, the chat messages' digest) -> prompt tokens
_counted: dict[tuple[str, str], int] = {}


@dataclass(frozen=True)
class EndpointContext:
    """The tokens one request (prompt + answer) may use at an endpoint, and where that was read."""

    tokens: int
    dialect: str  # LLAMA_CPP, VLLM or PROFILE
    slots: int = 1  # llama.cpp's parallel slots (-np), among which its -c is divided

    def described(self) -> str:
        if self.dialect == LLAMA_CPP:
            return f"llama-server's context per slot (GET /props: n_ctx {self.tokens}, {self.slots} slots)"
        if self.dialect == VLLM:
            return f"the server's max_model_len (GET /v1/models: {self.tokens})"
        return f"the profile's context_tokens ({self.tokens})"

    def remedy(self, needed: int) -> str:
        """The setting that would make a request of ``needed`` tokens fit."""
        if self.dialect == LLAMA_CPP:
            return (
                f"start llama-server with -c {needed * self.slots} or more (-c is divided among its "
                f"-np {self.slots} slots; or fewer slots), or lower the stage's max_tokens"
            )
        if self.dialect == VLLM:
            return f"start the vLLM server with --max-model-len {needed} or more, or lower the stage's max_tokens"
        return "use a model with a longer context (and raise context_tokens to match), or lower the stage's max_tokens"


def server_root(base_url: str) -> str:
    """The server's root: ``base_url`` without its trailing ``/v1`` (llama.cpp's and vLLM's own routes)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


JsonGet = Callable[[str], Any]  # GET a URL: its JSON, or None when the endpoint has no such route
JsonPost = Callable[[str, dict[str, Any]], Any]  # POST JSON to a URL: its JSON, or None


def llama_cpp_context(props: Any) -> EndpointContext | None:
    """The per-slot context in llama-server's ``GET /props`` answer, None when it is not one."""
    if not isinstance(props, Mapping):
        return None
    settings = props.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, Mapping) else None
    if not isinstance(n_ctx, int) or n_ctx <= 0:
        return None
    slots = props.get("total_slots")
    return EndpointContext(n_ctx, LLAMA_CPP, slots if isinstance(slots, int) and slots > 0 else 1)


def vllm_context(models: Any, model_id: str) -> EndpointContext | None:
    """``max_model_len`` of ``model_id`` in vLLM's ``GET /v1/models`` answer, None when absent."""
    data = models.get("data") if isinstance(models, Mapping) else None
    for entry in data if isinstance(data, list) else []:
        if isinstance(entry, Mapping) and entry.get("id") == model_id:
            limit = entry.get("max_model_len")
            if isinstance(limit, int) and limit > 0:
                return EndpointContext(limit, VLLM)
    return None


def read_context(base_url: str, model_id: str, get: JsonGet) -> EndpointContext | None:
    """The context one request may use as the server at ``base_url`` publishes it (llama.cpp's /props,
    else vLLM's /v1/models); None when it publishes none."""
    found = llama_cpp_context(get(server_root(base_url) + "/props"))
    return found if found is not None else vllm_context(get(base_url.rstrip("/") + "/models"), model_id)


def or_profile(published: EndpointContext | None, context_tokens: int | None) -> EndpointContext | None:
    """The server's context where it publishes one, else the profile's ``context_tokens`` (None: unknown)."""
    if published is not None or context_tokens is None:
        return published
    return EndpointContext(context_tokens, PROFILE)


def messages_digest(messages: Sequence[Mapping[str, str]]) -> str:
    return hashlib.sha256(json.dumps(list(messages), sort_keys=True).encode()).hexdigest()


def tokenizer_counter(tokenizer: Any, template_kwargs: Mapping[str, Any]) -> Callable[[ChatRequest], int]:
    """Prompt tokens of a request by the model's own tokenizer and chat template."""

    def count(request: ChatRequest) -> int:
        encoded = tokenizer.apply_chat_template(
            request.messages, tokenize=True, add_generation_prompt=True, **dict(template_kwargs)
        )
        return len(encoded["input_ids"] if isinstance(encoded, Mapping) else encoded)

    return count


def server_counter(
    context: EndpointContext, base_url: str, model_id: str, post: JsonPost
) -> Callable[[ChatRequest], int] | None:
    """Prompt tokens of a request by the server's own tokenizer (llama.cpp's or vLLM's dialect), None
    for a server without one (a provider's API)."""
    root = server_root(base_url)
    if context.dialect == LLAMA_CPP:

        def count_llama(request: ChatRequest) -> int:
            templated = post(root + "/apply-template", {"messages": request.messages})
            prompt = templated.get("prompt") if isinstance(templated, Mapping) else None
            tokens = post(root + "/tokenize", {"content": prompt, "add_special": True}) if prompt else None
            if not isinstance(tokens, Mapping) or not isinstance(tokens.get("tokens"), list):
                raise EngineError(f"{root}: llama-server's /apply-template or /tokenize gave no tokens")
            return len(tokens["tokens"])

        return count_llama
    if context.dialect == VLLM:

        def count_vllm(request: ChatRequest) -> int:
            answer = post(root + "/tokenize", {"model": model_id, "messages": request.messages})
            if not isinstance(answer, Mapping) or not isinstance(answer.get("count"), int):
                raise EngineError(f"{root}: vLLM's /tokenize gave no count")
            return int(answer["count"])

        return count_vllm
    return None


def prompt_tokens(requests: Sequence[ChatRequest], count: Callable[[ChatRequest], int], counted_by: str) -> list[int]:
    """Each request's prompt tokens, each distinct prompt counted once per process (``counted_by``
    names the tokenizer: the same messages count differently under another)."""
    out = []
    for request in requests:
        key = (counted_by, messages_digest(request.messages))
        if key not in _counted:
            _counted[key] = count(request)
        out.append(_counted[key])
    return out


def check_requests_fit(
    requests: Sequence[ChatRequest], sizes: Sequence[int], context: EndpointContext, where: str
) -> None:
    """Raise EngineError, before anything is sent, when a request's prompt (``sizes``) plus its
    ``max_tokens`` exceeds ``context``: naming the longest request, its size, the limit, how many do
    not fit and the setting that would make them fit."""
    needs = [size + r.sampling.max_tokens for r, size in zip(requests, sizes)]
    over = [i for i, need in enumerate(needs) if need > context.tokens]
    if not over:
        return
    worst = max(over, key=lambda i: needs[i])
    request = requests[worst]
    raise EngineError(
        f"{where}: {len(over)} of {len(requests)} requests do not fit the endpoint's context; the longest, "
        f"{request.key!r}, needs {needs[worst]} tokens ({sizes[worst]} prompt + {request.sampling.max_tokens} "
        f"max_tokens), more than the {context.tokens} of {context.described()}. To make it fit: "
        f"{context.remedy(needs[worst])}. Nothing was sent."
    )


# --- at an endpoint ------------------------------------------------------------------------------


class ServedEndpoint(Protocol):
    """What the checks need of a served model's endpoint (storybias.engines.openai_endpoint.Endpoint)."""

    @property
    def base_url(self) -> str: ...

    @property
    def model_id(self) -> str: ...

    @property
    def api_key(self) -> str: ...

    @property
    def timeout_s(self) -> float: ...

    @property
    def chat_template_kwargs(self) -> dict[str, Any]: ...

    @property
    def description(self) -> str: ...

    def where(self) -> str: ...


_contexts: dict[tuple[str, str, int], EndpointContext | None] = {}


def _json_call(endpoint: ServedEndpoint, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    """One request to a route of the endpoint's server: its JSON (its text where it is not JSON, e.g.
    Prometheus metrics); None when the server has no such route (a provider's API has neither /props
    nor /tokenize) or cannot be reached."""
    # heavy (about 1 s with openai): only a profile that names an endpoint needs the client
    import httpx

    headers = {"Authorization": f"Bearer {endpoint.api_key}"}
    try:
        response = httpx.request(
            method, url, json=body, headers=headers, timeout=min(CONTEXT_TIMEOUT_S, endpoint.timeout_s)
        )
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return response.text


def fetch_from_root(endpoint: ServedEndpoint, path: str) -> Any:
    """GET ``path`` at the endpoint's server root (llama.cpp's /slots, vLLM's /metrics): JSON, text or None."""
    return _json_call(endpoint, "GET", server_root(endpoint.base_url) + path)


def endpoint_context(endpoint: ServedEndpoint, context_tokens: int | None = None) -> EndpointContext | None:
    """The context one request may use at ``endpoint`` (llama.cpp's /props, vLLM's /v1/models, else the
    profile's ``context_tokens``), read once per process and endpoint."""
    key = (endpoint.base_url, endpoint.model_id, hash(endpoint.api_key))
    if key not in _contexts:  # what the server publishes, asked once
        _contexts[key] = read_context(
            endpoint.base_url, endpoint.model_id, lambda url: _json_call(endpoint, "GET", url)
        )
    return or_profile(_contexts[key], context_tokens)


def check_fits(
    spec: ModelSpec, endpoint: ServedEndpoint, requests: Sequence[ChatRequest], tokenizer: Any = None
) -> None:
    """Refuse ``requests`` (EngineError naming the longest, its size, the limit and the setting to
    change) when one cannot fit the endpoint's context; nothing to check when the endpoint tells no
    context, or when neither the model's tokenizer (``tokenizer``) nor the server can count tokens."""
    context = endpoint_context(endpoint, spec.context_tokens)
    if context is None or not requests:
        return
    if tokenizer is not None:
        count = tokenizer_counter(tokenizer, endpoint.chat_template_kwargs)
        counted_by = f"tokenizer of {spec.name} ({endpoint.description})"
    else:
        served = server_counter(
            context, endpoint.base_url, endpoint.model_id, lambda url, body: _json_call(endpoint, "POST", url, body)
        )
        if served is None:
            return
        count, counted_by = served, f"{endpoint.base_url} {endpoint.model_id}"
    check_requests_fit(requests, prompt_tokens(requests, count, counted_by), context, endpoint.where())
