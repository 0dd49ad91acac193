"""The scripted engine of the fast tests: a :class:`storybias.engines.ChatEngine` that answers without a
model (the slow tests run the real embedded model through vLLM)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

from storybias.config.params import ModelSpec
from storybias.engines import ChatRequest, ChatResult, EngineInfo


class FakeEngine:
    """A scripted :class:`ChatEngine` for tests: ``answer(request)`` gives each text (default: the
    first allowed choice, else a sentence naming the key); ``fail(request)`` returns an error text for
    requests that should fail as a served endpoint's would; ``crash_after`` raises KeyboardInterrupt
    before the n-th result (a killed process). Every request asked is appended to ``calls`` (shared by
    the instances a test's factory makes: pass the same list)."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        answer: Callable[[ChatRequest], str] | None = None,
        fail: Callable[[ChatRequest], str | None] | None = None,
        crash_after: int | None = None,
        calls: list[str] | None = None,
        tokenizer: Any = None,
        n_tokens: int = 7,
        n_prompt_tokens: int = 11,
    ):
        self.spec = spec
        self.answer = answer or (
            lambda r: r.choice[0] if r.choice else f"Story for {r.key} at temperature {r.sampling.temperature}."
        )
        self.fail = fail or (lambda r: None)
        self.crash_after = crash_after
        self.calls = calls if calls is not None else []
        self._tokenizer = tokenizer
        self.n_tokens, self.n_prompt_tokens = n_tokens, n_prompt_tokens
        self.info: EngineInfo | None = None
        self.entered = self.exited = 0

    def __enter__(self) -> FakeEngine:
        self.entered += 1
        self.info = EngineInfo(model=self.spec.name, model_id="fake", weights="-", device="cpu", startup_seconds=0.0)
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        self.exited += 1
        return False

    def stream(self, requests: Sequence[ChatRequest]) -> Iterator[ChatResult]:
        for i, r in enumerate(requests):
            if self.crash_after is not None and i == self.crash_after:
                raise KeyboardInterrupt("simulated kill")
            self.calls.append(r.key)
            error = self.fail(r)
            if error is not None:
                yield ChatResult.failed(r.key, error)
                continue
            yield ChatResult(
                key=r.key,
                text=self.answer(r),
                finish_reason="stop",
                n_tokens=self.n_tokens,
                n_prompt_tokens=self.n_prompt_tokens,
            )

    def tokenizer(self) -> Any:
        return self._tokenizer
