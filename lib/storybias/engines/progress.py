"""The remaining time of a batch from tokens, not items (issue #60, item 5).

With 128 sequences in flight, answers end in waves: nothing for minutes, then dozens at once. A rate of
finished items (tqdm's own estimate) is zero between waves and huge at each one, so its estimate swung
from a 19-hour guess to minutes on the same stage. The engine, though, generates tokens at a steady
rate the whole time. :class:`TokenProgress` estimates the remaining time as

    (tokens the unfinished requests are expected to generate still) / (tokens generated so far / elapsed)

What a request is expected to generate still conditions on what is known about it:

- a running sequence that generated ``g`` tokens: E[L - g | L > g], never past its ``max_tokens``;
- a request not started: E[L];

where L, a request's answer length, follows the Kaplan-Meier estimate (statsmodels' ``SurvfuncRight``) of
the lengths of the requests with the same ``max_tokens`` (in a stage, one budget is one design or task):
finished answers are events, running sequences are censored at ``g``. Taking the finished answers' mean
instead (as this module did) is biased low: the first answers to end are the short ones (on a default
run the bar said 00:00 left at 6 of 280 stories, the 2-token answers of a 16-token task having ended).

The prior is ``max_tokens``: an answer of that length, counted as ``PRIOR_WEIGHT`` answers, joins each
budget's lengths. It is the one bound known for sure and stage 01's commonest length (195 of the default
run's 280 stories were cut there), so before an answer of a budget ends, its requests are expected to run
to ``max_tokens`` (the estimate starts high, not at zero), and a few short answers ending first cannot
drive the curve to zero (Kaplan-Meier does when the longest length seen is a finished one: two 14-token
answers of a 200-token task, with 8 in flight, made every other one expected to end at 14).

What the engine says of its running sequences (``sequences_in_flight``, by request key): the in-process
vLLM engine reads each running request's tokens so far from its output processor (the model host
forwards them); a served model's server counts them in all (vLLM's ``vllm:generation_tokens_total``) or
per slot without naming the request (llama-server's ``/slots``; storybias.engines.server_metrics), so
each request the client has sent and not received gets an equal share (storybias.engines.openai_endpoint). An
engine that tells only the sum (``tokens_in_flight``) gets the old form: every unfinished request's E[L]
less the sum. One that tells nothing counts finished answers' tokens only, and the bar says so (``tok_s``
of ``finished`` answers instead of the ``engine``'s).

The rate's clock starts at the engine's first token, not at the bar's start. Before it, the engine reads
the batch's prompts (stage 03's worked examples: minutes on a CPU), and a rate over the whole elapsed
time counted that reading as slow decoding: a resumed default run's extraction on llama-server read
``4:55:51`` left after 59 s and ``1:28:41`` after 89 s, for 20 minutes of work. Where the engine
reports its running sequences, the bar knows when the first token came (the last look that saw none:
``TokenProgress.look``); where it does not, a finished answer's tokens may have begun at any time since
the start, so the whole elapsed time stays the denominator.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from statsmodels.duration.survfunc import SurvfuncRight

from storybias.engines.base import ChatRequest, ChatResult

ENGINE_RATE = "engine"  # the bar's rate counts the tokens of running sequences (the engine reports them)
FINISHED_RATE = "finished"  # the engine cannot tell: only finished answers' tokens are counted
# The prior answer of max_tokens counts as this many answers (length_survival). On the default run's
# replay (tests/test_progress.py), the worst ratio of estimate to truth with 8 in flight was 0.62 at a
# weight of 1, 0.84 at 4 and at 8; with 128 in flight, 0.85, 0.93 and 0.95.
PRIOR_WEIGHT = 4.0


def tokens_in_flight(engine: Any) -> int | None:
    """Tokens generated so far by the requests of ``engine``'s current stream that have not finished,
    or None when the engine cannot tell (an engine without ``tokens_in_flight``, or one that says None)."""
    probe = getattr(engine, "tokens_in_flight", None)
    if not callable(probe):
        return None
    value = probe()
    return None if value is None else int(value)


def sequences_in_flight(engine: Any) -> dict[str, int] | None:
    """Each running request's tokens so far, by request key, or None when ``engine`` cannot tell (it has
    no ``sequences_in_flight``, or says None)."""
    probe = getattr(engine, "sequences_in_flight", None)
    if not callable(probe):
        return None
    value = probe()
    return None if value is None else {str(key): int(n) for key, n in value.items()}


def remaining_seconds(elapsed: float, generated: int, tokens_left: float) -> float | None:
    """Seconds left at the mean rate so far (``generated`` tokens in ``elapsed`` seconds) for
    ``tokens_left`` tokens; None while nothing was generated (no rate yet)."""
    if elapsed <= 0 or generated <= 0:
        return None
    return max(tokens_left, 0.0) / (generated / elapsed)


def length_survival(
    finished: Sequence[int], running: Sequence[int], max_tokens: int, prior_weight: float = PRIOR_WEIGHT
) -> np.ndarray:
    """S[t] = P(L > t) for t = 0 .. ``max_tokens`` (S[max_tokens] = 0): the Kaplan-Meier estimate of an
    answer's length L from the ``finished`` answers' lengths (events), the ``running`` sequences' tokens
    so far (censored: L > g), and the prior, an answer of ``max_tokens`` counted ``prior_weight`` times.
    With no answer finished, S = 1 up to ``max_tokens``; the prior also keeps S above zero below the
    budget when the longest length seen so far is a finished one (a few short answers ending first
    would otherwise say that nothing runs longer)."""
    times = np.concatenate([np.asarray(finished, dtype=float), np.asarray(running, dtype=float), [max_tokens]])
    status = np.concatenate([np.ones(len(finished)), np.zeros(len(running)), [1.0]])
    weights = np.concatenate([np.ones(len(finished) + len(running)), [prior_weight]])
    curve = SurvfuncRight(np.minimum(times, max_tokens), status, freq_weights=weights)
    event_times, probs = np.asarray(curve.surv_times), np.asarray(curve.surv_prob)
    last_event = np.searchsorted(event_times, np.arange(max_tokens + 1), side="right") - 1
    return np.where(last_event >= 0, probs[np.maximum(last_event, 0)], 1.0)


def expected_tokens_left(survival: np.ndarray, generated: Iterable[int], n_not_started: int) -> float:
    """Tokens still to come under the length distribution ``survival`` (:func:`length_survival`) from
    running sequences that generated ``generated`` tokens each, E[L - g | L > g], and from
    ``n_not_started`` requests, E[L] each. Discrete lengths: E[L - g | L > g] = sum_{t >= g} S(t) / S(g)."""
    max_tokens = len(survival) - 1
    tail = np.concatenate([np.cumsum(survival[::-1])[::-1], [0.0]])  # tail[g] = sum_{t >= g} S(t)
    g = np.minimum(np.fromiter(generated, dtype=int), max_tokens)
    at_g = survival[g]
    # S(g) = 0 only past the budget or for a length KM rules out: nothing more is expected from it
    running = np.divide(tail[g], at_g, out=np.zeros(len(g)), where=at_g > 0)
    return float(running.sum() + n_not_started * tail[0])


class TokenProgress:
    """What a batch generated and has left, in tokens. ``finished(result)`` for each result as it
    arrives; ``estimate(elapsed, in_flight, sequences)`` for the remaining seconds."""

    def __init__(self, requests: Sequence[ChatRequest]):
        self._budget = {r.key: max(int(r.sampling.max_tokens), 0) for r in requests}  # unfinished requests
        self._lengths: dict[int, list[int]] = defaultdict(list)  # max_tokens -> this run's finished lengths
        self.finished_tokens = 0  # tokens of the answers the engine generated on this run
        self.n_generated = 0  # answers the engine generated on this run (not from the cache)
        self.reading_until = 0.0  # elapsed seconds at the last look that saw no token generated (look)

    def finished(self, result: ChatResult) -> None:
        budget = self._budget.pop(result.key, None)
        if not result.cached and result.error is None:
            self.finished_tokens += result.n_tokens
            self.n_generated += 1
            if budget is not None:
                self._lengths[budget].append(int(result.n_tokens))

    def expected_tokens_left(self, sequences: Mapping[str, int] | None = None) -> float:
        """Tokens the unfinished requests are expected to generate still, given ``sequences`` (each
        running request's tokens so far, by key); without it, each unfinished request's E[L] in all
        (the caller subtracts what running sequences generated already)."""
        running: dict[int, list[int]] = defaultdict(list)
        for key, generated in (sequences or {}).items():
            if key in self._budget:  # a request this batch has not seen finish
                running[self._budget[key]].append(generated)
        unfinished: dict[int, int] = defaultdict(int)
        for budget in self._budget.values():
            unfinished[budget] += 1
        left = 0.0
        for budget, n in unfinished.items():
            survival = length_survival(self._lengths[budget], running[budget], budget)
            left += expected_tokens_left(survival, running[budget], n - len(running[budget]))
        return left

    def generated(self, in_flight: int | None) -> int:
        return self.finished_tokens + (in_flight or 0)

    def look(self, elapsed: float, in_flight: int | None) -> None:
        """Note what the engine says at ``elapsed`` seconds: while it reports its running sequences
        (``in_flight`` not None) and no token was generated, it is still reading prompts, and the rate's
        clock has not started."""
        if in_flight is not None and self.generated(in_flight) == 0:
            self.reading_until = elapsed

    def generating_seconds(self, elapsed: float, in_flight: int | None) -> float:
        """The seconds the rate divides by: since the last look before the first token where the engine
        reports running sequences; the whole ``elapsed`` time where it does not (then a finished answer's
        tokens may have begun at any time)."""
        return elapsed if in_flight is None else elapsed - self.reading_until

    def estimate(
        self, elapsed: float, in_flight: int | None, sequences: Mapping[str, int] | None = None
    ) -> float | None:
        """Seconds left (None while no token was generated). ``in_flight``: the running sequences'
        tokens, None when the engine cannot tell; ``sequences``: the same by request key, where the
        engine tells them (then ``in_flight`` is their sum)."""
        if sequences is not None:
            left = self.expected_tokens_left(sequences)
        else:
            left = self.expected_tokens_left() - (in_flight or 0)
        return remaining_seconds(self.generating_seconds(elapsed, in_flight), self.generated(in_flight), left)

    def rate(self, elapsed: float, in_flight: int | None) -> float:
        """Tokens per second so far (running sequences included where the engine reports them), from the
        first token where the engine reports running sequences (:meth:`generating_seconds`)."""
        seconds = self.generating_seconds(elapsed, in_flight)
        return self.generated(in_flight) / seconds if seconds > 0 else 0.0
