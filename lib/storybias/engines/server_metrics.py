"""The tokens a served endpoint's running requests generated so far, where its server tells them: the
live rate of the progress bar (storybias.engines.progress) for a served model.

- llama.cpp's ``llama-server``: ``GET /slots`` (on by default) lists each slot with ``is_processing`` and
  ``next_token``, a list of one object whose ``n_decoded`` is the tokens its running request decoded so far
  (``server_slot::to_json`` in the llama.cpp tree of llama-cpp-python 0.3.36; the server's README shows an
  object, which older servers sent: both are read);
- vLLM's server: ``GET /metrics`` (Prometheus text) counts every generated token in
  ``vllm:generation_tokens_total``, running requests included; the running ones' share is the counter's
  growth since the stream began minus the tokens of the answers already received. The counter is the
  server's: another client's requests at the same time count too.
- Any other endpoint (a provider's API) tells nothing: None, and the bar counts finished answers only.

A poll costs one HTTP request, so :class:`ServedTokens` asks at most every ``every_s`` seconds.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from storybias.engines.context import LLAMA_CPP, VLLM

POLL_EVERY_S = 1.0
_VLLM_GENERATED = re.compile(r"^vllm:generation_tokens_total(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)


def llama_cpp_running_tokens(slots: Any) -> int | None:
    """Tokens decoded so far by llama-server's busy slots (its ``GET /slots`` answer), None when it is not one."""
    if not isinstance(slots, list):
        return None
    total = 0
    for slot in slots:
        if not isinstance(slot, Mapping):
            return None
        if slot.get("is_processing"):
            total += sum(_decoded(entry) for entry in _as_list(slot.get("next_token")))
    return total


def _as_list(next_token: Any) -> list[Any]:
    """A slot's ``next_token``: a list (llama.cpp since 2025), an object (older servers), or absent."""
    if isinstance(next_token, list):
        return next_token
    return [next_token] if isinstance(next_token, Mapping) else []


def _decoded(entry: Any) -> int:
    decoded = entry.get("n_decoded", 0) if isinstance(entry, Mapping) else 0
    return int(decoded) if isinstance(decoded, int | float) else 0


def vllm_generated_tokens(metrics: Any) -> float | None:
    """vLLM's ``vllm:generation_tokens_total`` summed over its label sets, None when absent."""
    if not isinstance(metrics, str):
        return None
    values = [float(v) for v in _VLLM_GENERATED.findall(metrics)]
    return sum(values) if values else None


class ServedTokens:
    """Polls a server for its running requests' tokens during one stream. ``fetch(path)`` gets a route
    at the server's root (JSON for /slots, text for /metrics; None when absent); ``finished(n)`` for each
    answer received (vLLM's counter includes them)."""

    def __init__(
        self,
        dialect: str,
        fetch: Callable[[str], Any],
        every_s: float = POLL_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.dialect, self.fetch, self.every_s, self.clock = dialect, fetch, every_s, clock
        self._finished = 0
        self._last: tuple[float, int | None] | None = None
        self._lock = threading.Lock()
        self._baseline = vllm_generated_tokens(fetch("/metrics")) if dialect == VLLM else None

    def finished(self, n_tokens: int) -> None:
        with self._lock:
            self._finished += n_tokens

    def _read(self) -> int | None:
        if self.dialect == LLAMA_CPP:
            return llama_cpp_running_tokens(self.fetch("/slots"))
        if self.dialect == VLLM and self._baseline is not None:
            now = vllm_generated_tokens(self.fetch("/metrics"))
            with self._lock:
                return None if now is None else max(int(now - self._baseline) - self._finished, 0)
        return None

    def in_flight(self) -> int | None:
        """The running requests' tokens, at most ``every_s`` seconds old; None when the server cannot tell."""
        with self._lock:
            last = self._last
        if last is not None and self.clock() - last[0] < self.every_s:
            return last[1]
        value = self._read()
        with self._lock:
            self._last = (self.clock(), value)
        return value


def for_dialect(dialect: str | None, fetch: Callable[[str], Any]) -> ServedTokens | None:
    """A poller for a llama.cpp or vLLM server; None for an endpoint that tells nothing."""
    return ServedTokens(dialect, fetch) if dialect in (LLAMA_CPP, VLLM) else None
