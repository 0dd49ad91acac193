"""The one resumable loop of every LLM stage: requests in, results streamed to a row builder,
buffered and flushed as atomic shards every ``shard_size`` rows, with a progress bar (:class:`TokenBar`:
items done, the engine's tokens/s and the remaining time estimated from tokens, storybias.engines.progress).
An engine that starts only when a request needs it (``CachingEngine``) is started first, in a phase of
its own that shows its elapsed time (``startup_phase``: vLLM's start-up takes minutes on a CPU), so the
items bar and its estimate start with the first request.

Stage 01 (stories), stage 03 (extraction answers) and stage 04's judge (ratings) all run through
:func:`run_requests`; each decides what a stored row is and which stored rows a rerun skips. Rows
already built are flushed even when the stream stops early (an exception, an interrupt, an
unreachable endpoint), so a rerun never asks again for an answer that was received.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm  # text bars: readable in papermill logs and JupyterLab without ipywidgets

from storybias.core.io import ShardStore
from storybias.engines.base import ChatEngine, ChatRequest, ChatResult, EngineError
from storybias.engines.progress import (
    ENGINE_RATE,
    FINISHED_RATE,
    TokenProgress,
    sequences_in_flight,
    tokens_in_flight,
)

RowBuilder = Callable[[ChatResult], "dict[str, Any] | Iterable[dict[str, Any]] | None"]


@dataclass
class RunStats:
    """What one call of :func:`run_requests` received."""

    n_results: int = 0
    n_cached: int = 0  # results answered from the cache (storybias.engines.cache): no tokens generated
    n_errors: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    seconds: float = 0.0
    finish_reasons: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)  # the first few error texts, for the manifest

    @property
    def tokens_per_second(self) -> float:
        return round(self.output_tokens / self.seconds, 2) if self.seconds else 0.0

    def add(self, other: RunStats) -> RunStats:
        self.n_results += other.n_results
        self.n_cached += other.n_cached
        self.n_errors += other.n_errors
        self.output_tokens += other.output_tokens
        self.prompt_tokens += other.prompt_tokens
        self.seconds = round(self.seconds + other.seconds, 2)
        self.finish_reasons.update(other.finish_reasons)
        self.errors = (self.errors + other.errors)[:MAX_ERRORS_KEPT]
        return self

    def as_dict(self) -> dict[str, Any]:
        return {
            "n_results": self.n_results,
            "n_cached": self.n_cached,
            "n_errors": self.n_errors,
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "finish_reasons": dict(self.finish_reasons),
            "errors": list(self.errors),
        }


MAX_ERRORS_KEPT = 5


class RequestsFailed(EngineError):
    """A stage whose sent requests all failed, or more than the profile's share of them
    (``generation.engine.max_failed_share``): it stops with a non-zero exit and this summary."""


def failure_summary(
    stage: str, n_sent: int, n_failed: int, errors: Sequence[str], max_failed_share: float
) -> str | None:
    """Why ``stage`` must stop, or None: every one of its ``n_sent`` requests failed, or more than
    ``max_failed_share`` of them did. Names the first ``errors`` (their stored texts)."""
    if n_sent <= 0 or n_failed <= 0:
        return None
    if n_failed < n_sent and n_failed / n_sent <= max_failed_share:
        return None
    how = "every one" if n_failed == n_sent else f"more than {max_failed_share:.0%}"
    shown = "; ".join(errors[:MAX_ERRORS_KEPT]) or "(no error text)"
    return (
        f"{stage}: {n_failed} of {n_sent} requests failed ({how}); the first errors: {shown}. "
        "What arrived is stored and the failed requests were not cached: fix the cause and rerun, "
        "only those are asked again"
    )


def raise_if_failed(stage: str, n_sent: int, n_failed: int, errors: Sequence[str], max_failed_share: float) -> None:
    """Raise :class:`RequestsFailed` with :func:`failure_summary`'s text when ``stage`` must stop."""
    summary = failure_summary(stage, n_sent, n_failed, errors, max_failed_share)
    if summary is not None:
        raise RequestsFailed(summary)


STARTUP_REFRESH_S = 1.0  # how often a bar waiting on the engine is redrawn
WAITING_FOR_FIRST_ANSWER = "reading the prompts, no answer yet"


@contextmanager
def redrawn_every_second(line: tqdm) -> Iterator[None]:
    """Redraw ``line`` every second while the block runs, so that its elapsed time moves when nothing
    else does (tqdm redraws a bar only when it is updated). A disabled bar draws nothing: no thread."""
    if line.disable:
        yield
        return
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(STARTUP_REFRESH_S):
            # tqdm's refresh() takes its write lock without try/finally: a line that raised while drawing
            # kept the lock, and the stage then hung for ever in bar.close(). `with` gives it back.
            with line.get_lock():
                line.refresh(nolock=True)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()


class TokenBar(tqdm):
    """An items bar whose remaining time comes from tokens (:class:`TokenProgress`), not from tqdm's rate
    of finished items, and whose ``tok_s`` is the engine's live rate where it reports one (``engine``),
    else finished answers' (``finished``). Its line keeps tqdm's ``n/total [elapsed<remaining, ...]``
    shape, which the terminal echo of a stage's log reads (storybias.tools.notebook_runner)."""

    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{token_remaining}{postfix}]"

    def __init__(self, tokens: TokenProgress, engine: Any, **kwargs: Any):
        self.tokens, self.engine, self.n_errors = tokens, engine, 0
        super().__init__(bar_format=self.BAR_FORMAT, **kwargs)

    @property
    def format_dict(self) -> dict[str, Any]:
        shown = super().format_dict
        if self.disable and not hasattr(self, "unit"):  # tqdm's placeholder of a bar disabled from the start
            return shown
        sequences, in_flight = self._engine_counts()
        elapsed = shown["elapsed"]
        self.tokens.look(elapsed, in_flight)
        if self.n >= (self.total or 0):
            left: float | None = 0.0
        else:
            left = self.tokens.estimate(elapsed, in_flight, sequences)
        shown["token_remaining"] = "?" if left is None else tqdm.format_interval(left)
        # answers from the cache (a resumed run) are no sign that the engine answers yet
        if self.tokens.generated(in_flight) == 0 and self.tokens.n_generated == 0 and self.n_errors == 0:
            shown["postfix"] = WAITING_FOR_FIRST_ANSWER
        else:
            source = FINISHED_RATE if in_flight is None else ENGINE_RATE
            rate = self.tokens.rate(elapsed, in_flight)
            shown["postfix"] = f"tok_s={rate:.1f} ({source}), errors={self.n_errors}"
        return shown

    def _engine_counts(self) -> tuple[dict[str, int] | None, int | None]:
        """Each running request's tokens and their sum, where the engine tells them. A bar is only a view:
        an engine that cannot answer (its server just died) leaves the counts unknown, never the stage hung
        or stopped by its progress line."""
        try:
            sequences = sequences_in_flight(self.engine)
            in_flight = sum(sequences.values()) if sequences is not None else tokens_in_flight(self.engine)
        except Exception:  # whatever the engine raises (its server gone), the line shows "?" rather than fail
            return None, None
        return sequences, in_flight


@contextmanager
def startup_phase(desc: str, progress: bool = True) -> Iterator[None]:
    """A line ``<desc>: starting the engine [elapsed]`` redrawn every second until the block ends (tqdm's
    bar format, so the terminal echo of a stage's log shows it like a bar: storybias.tools.notebook_runner)."""
    line = tqdm(total=None, desc=desc, bar_format="{desc}: starting the engine [{elapsed}]", disable=not progress)
    try:
        with redrawn_every_second(line):
            yield
    finally:
        line.bar_format = "{desc}: engine started [{elapsed}]"
        line.close()


def run_requests(
    engine: ChatEngine,
    requests: Sequence[ChatRequest],
    build_row: RowBuilder,
    store: ShardStore | None,
    shard_size: int,
    desc: str,
    unit: str = "item",
    progress: bool = True,
    on_result: Callable[[ChatResult], None] | None = None,
) -> RunStats:
    """Stream ``requests`` through a started ``engine``; each result goes to ``build_row`` (one row,
    several, or None) and the rows to ``store`` in shards of ``shard_size``. Returns what was received."""
    stats = RunStats()
    buffer: list[dict[str, Any]] = []
    prepare = getattr(engine, "prepare", None)  # an engine that starts only when a request needs it
    if callable(prepare):
        prepare(requests, lambda: startup_phase(desc, progress))
    started = time.time()
    # A batch's prompts are all read before its first answer ends (minutes for stage 03's long prompts on
    # a CPU): until then the bar says so, and its elapsed time keeps moving (redrawn_every_second).
    tokens = TokenProgress(requests)
    bar = TokenBar(tokens, engine, total=len(requests), desc=desc, unit=unit, disable=not progress)

    def flush() -> None:
        if store is not None and buffer:
            store.append(buffer)
        buffer.clear()

    try:
        with redrawn_every_second(bar):
            for result in engine.stream(requests):
                stats.n_results += 1
                stats.finish_reasons[result.finish_reason] += 1
                if result.cached:
                    stats.n_cached += 1
                else:
                    stats.output_tokens += result.n_tokens
                    stats.prompt_tokens += result.n_prompt_tokens
                if result.error is not None:
                    stats.n_errors += 1
                    if len(stats.errors) < MAX_ERRORS_KEPT:
                        stats.errors.append(f"{result.key}: {result.error}")
                tokens.finished(result)
                if on_result is not None:
                    on_result(result)
                rows = build_row(result)
                if isinstance(rows, dict):
                    buffer.append(rows)
                elif rows is not None:
                    buffer.extend(rows)
                bar.n_errors = stats.n_errors
                bar.update(1)
                if len(buffer) >= shard_size:
                    flush()
    finally:
        flush()  # rows received before a crash or an interrupt are kept
        bar.close()
        stats.seconds = round(time.time() - started, 2)
    return stats
