"""The remaining time of a batch from tokens, not items (issue #60, item 5).

With 128 sequences in flight, answers end in waves: nothing for minutes, then dozens at once. A rate of
finished items (tqdm's own estimate) is zero between waves and huge at each one, so its estimate swung
from a 19-hour guess to minutes on the same stage. The engine, though, generates tokens at a steady
rate the whole time. :class:`TokenProgress` estimates the remaining time as

    (tokens the unfinished requests are expected to generate - tokens they generated already)
    / (tokens generated so far / elapsed time),

where a request is expected to generate the mean of the finished requests' tokens (before any has
finished: its ``max_tokens``, an upper bound), never more than its ``max_tokens``. "Tokens generated
so far" counts the sequences still running when the engine can tell (``tokens_in_flight``: the
in-process engine and the model host read them from vLLM's step outputs); an engine that cannot tell
(a served endpoint) counts only finished requests' tokens, and the bar says so (``tok_s`` of
``finished`` answers instead of the ``engine``'s).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from storybias.engines.base import ChatRequest, ChatResult

ENGINE_RATE = "engine"  # the bar's rate counts the tokens of running sequences (the engine reports them)
FINISHED_RATE = "finished"  # the engine cannot tell: only finished answers' tokens are counted


def tokens_in_flight(engine: Any) -> int | None:
    """Tokens generated so far by the requests of ``engine``'s current stream that have not finished,
    or None when the engine cannot tell (an engine without ``tokens_in_flight``, or one that says None)."""
    probe = getattr(engine, "tokens_in_flight", None)
    if not callable(probe):
        return None
    value = probe()
    return None if value is None else int(value)


def remaining_seconds(elapsed: float, generated: int, tokens_left: float) -> float | None:
    """Seconds left at the mean rate so far (``generated`` tokens in ``elapsed`` seconds) for
    ``tokens_left`` tokens; None while nothing was generated (no rate yet)."""
    if elapsed <= 0 or generated <= 0:
        return None
    return max(tokens_left, 0.0) / (generated / elapsed)


class TokenProgress:
    """What a batch generated and has left, in tokens. ``finished(result)`` for each result as it
    arrives; ``estimate(elapsed, in_flight)`` for the remaining seconds."""

    def __init__(self, requests: Sequence[ChatRequest]):
        self._budget = {r.key: max(int(r.sampling.max_tokens), 0) for r in requests}
        self._budgets_left: Counter[int] = Counter(self._budget.values())  # max_tokens -> unfinished requests
        self.finished_tokens = 0  # tokens of the answers the engine generated on this run
        self.n_generated = 0  # answers the engine generated on this run (not from the cache)

    def finished(self, result: ChatResult) -> None:
        budget = self._budget.pop(result.key, None)
        if budget is not None:
            self._budgets_left[budget] -= 1
        if not result.cached and result.error is None:
            self.finished_tokens += result.n_tokens
            self.n_generated += 1

    def expected_tokens_left(self) -> float:
        """Tokens the unfinished requests are expected to generate in all (before subtracting what
        running sequences generated already)."""
        if not self.n_generated:
            return float(sum(budget * n for budget, n in self._budgets_left.items()))
        mean = self.finished_tokens / self.n_generated
        return float(sum(min(budget, mean) * n for budget, n in self._budgets_left.items()))

    def generated(self, in_flight: int | None) -> int:
        return self.finished_tokens + (in_flight or 0)

    def estimate(self, elapsed: float, in_flight: int | None) -> float | None:
        """Seconds left (None while no token was generated). ``in_flight``: the running sequences'
        tokens, None when the engine cannot tell."""
        left = self.expected_tokens_left() - (in_flight or 0)
        return remaining_seconds(elapsed, self.generated(in_flight), left)

    def rate(self, elapsed: float, in_flight: int | None) -> float:
        """Tokens per second so far (running sequences included where the engine reports them)."""
        return self.generated(in_flight) / elapsed if elapsed > 0 else 0.0
