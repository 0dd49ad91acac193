"""Issue #60, item 1: a served endpoint's context is read before anything is sent (llama.cpp's GET /props,
vLLM's max_model_len, the profile's context_tokens) and a request that cannot fit is refused with the
setting that would make it fit; a stage whose requests all failed (or more than the profile's share)
exits non-zero with the first errors. Against tests/fake_openai.py, a real HTTP server on loopback that
answers /props, /apply-template, /tokenize and context errors the way llama-server does."""

from __future__ import annotations

import json
import threading

import pandas as pd
import pytest
import yaml

from fake_engine import FakeEngine
from fake_openai import FakeOpenAI
from storybias.config import params
from storybias.config.params import ModelSpec, Sampling
from storybias.core import artifacts, io, paths
from storybias.engines import ChatRequest, EngineError, context, openai_endpoint
from storybias.engines.context import EndpointContext, check_requests_fit
from storybias.engines.runner import RequestsFailed, failure_summary
from storybias.stages import extract as extract_stage
from storybias.stages import generate
from storybias.stages.extract.prompt import extraction_request

STORY = " ".join(["Amara walked to the market with her brother and sold the bread she had baked."] * 90)


@pytest.fixture(autouse=True)
def patient_server_reads(monkeypatch):
    """Under `make test` this module's worker yields its cores to the model tests (conftest.py): while
    their engine spins, a read of the fake server in this process took over the product's 15 s (CI,
    2026-12-07: three tests here 21-44 s) and came back as "the server publishes nothing"."""
    monkeypatch.setattr(context, "CONTEXT_TIMEOUT_S", 300.0)


@pytest.fixture()
def key(monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-test")
    return "sk-test"


def spec(base_url: str, **kw) -> ModelSpec:
    return ModelSpec(name="api", source="openai", base_url=base_url, model_id="m-1", api_key_env="FAKE_KEY", **kw)


def short(key: str, max_tokens: int = 64) -> ChatRequest:
    text = f"Write one sentence about {key}."
    return ChatRequest(
        key=key, messages=[{"role": "user", "content": text}], sampling=Sampling(max_tokens=max_tokens), seed=1
    )


def long_extraction(key: str = "story-7|0") -> ChatRequest:
    """Stage 03's real request (instructions, schema, worked examples) for a story of about 1,300 words."""
    settings = params.load(paths.params_dir() / "smoke.yaml").extract
    return extraction_request(key, STORY, ["demographics", "narrative", "markers"], settings, 0.0, 1)


def sent_chats(api: FakeOpenAI) -> list[dict]:
    return [b for b in api.chat_bodies() if b.get("max_tokens") != 1]  # not preflight's 1-token chat


def test_a_long_extraction_prompt_is_refused_at_preflight_by_a_1024_token_llama_server_slot(key):
    """`llama-server -c 4096 -np 4` gives each slot 1,024 tokens: the stage's long request is refused
    before any is sent, naming the request, its size, the limit and the -c that would fit it."""
    long = long_extraction()
    with FakeOpenAI(dialect="llama.cpp", n_ctx=1024, slots=4) as api:
        needed = api.prompt_tokens(long.messages) + long.sampling.max_tokens
        with openai_endpoint.OpenAIEngine(spec(api.base_url), seed=1) as engine:
            with pytest.raises(EngineError) as refused:
                list(engine.stream([short("a"), long, short("b")]))
        assert sent_chats(api) == []  # nothing was sent
    message = str(refused.value)
    assert "1 of 3 requests do not fit" in message and "'story-7|0'" in message
    assert f"needs {needed} tokens" in message and "more than the 1024" in message
    assert f"-c {needed * 4} or more" in message and "-np 4 slots" in message
    assert "'api'" in message and api.base_url in message and "sk-test" not in message


def test_prompts_that_fit_are_counted_once_by_the_servers_tokenizer_and_sent(key):
    with FakeOpenAI(dialect="llama.cpp", n_ctx=4096, slots=2) as api:
        batch = [short("a"), short("b"), short("a")]  # two distinct prompts
        with openai_endpoint.OpenAIEngine(spec(api.base_url), seed=1) as engine:
            first = list(engine.stream(batch))
            again = list(engine.stream(batch))
        tokenized = [r for r in api.routes if r == "POST /tokenize"]
        props = [r for r in api.routes if r == "GET /props"]
    assert len(first) == len(again) == 3 and all(r.error is None for r in first + again)
    assert len(tokenized) == 2, api.routes  # once per distinct prompt, never again in this process
    assert len(props) == 1 and len(sent_chats(api)) == 6


def test_vllms_max_model_len_and_tokenizer_are_read_and_name_its_setting(key):
    with FakeOpenAI(dialect="vllm", n_ctx=600) as api:
        with openai_endpoint.OpenAIEngine(spec(api.base_url), seed=1) as engine:
            with pytest.raises(EngineError, match=r"max_model_len.*--max-model-len \d+ or more"):
                list(engine.stream([long_extraction("x|0")]))
        assert sent_chats(api) == [] and "POST /tokenize" in api.routes


class WordTokenizer:
    """A tokenizer with a chat template: one token per word."""

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=True, **kwargs):
        return list(range(len(FakeOpenAI.template(messages).split())))


def test_the_profiles_context_tokens_holds_for_an_endpoint_that_publishes_none(key):
    with FakeOpenAI() as api:  # a provider's API: neither /props nor max_model_len nor /tokenize
        s = spec(api.base_url, context_tokens=80)
        endpoint = openai_endpoint.endpoint_of(s)
        context.check_fits(s, endpoint, [short("a", max_tokens=16)], WordTokenizer())  # fits
        with pytest.raises(EngineError, match=r"more than the 80 of the profile's context_tokens"):
            context.check_fits(s, endpoint, [short("a", max_tokens=100)], WordTokenizer())
        assert context.endpoint_context(openai_endpoint.endpoint_of(spec(api.base_url))) is None  # nothing to check


def test_the_fake_answers_an_overlong_chat_as_llama_server_does(key):
    """What storybias met before this check: the context error comes back as data (HTTP 400 with
    llama.cpp's exceed_context_size_error body), stored for the rerun."""
    long = long_extraction()
    with FakeOpenAI(dialect="llama.cpp", n_ctx=1024) as api:
        body = api.context_refusal({"messages": long.messages})
    assert body is not None and body["error"]["type"] == "exceed_context_size_error"
    assert body["error"]["code"] == 400 and body["error"]["n_ctx"] == 1024
    assert "exceeds the available context size (1024 tokens)" in body["error"]["message"]
    json.dumps(body)


def test_the_check_counts_the_answer_too():
    fits = EndpointContext(100, "profile")
    check_requests_fit([short("a", max_tokens=60)], [40], fits, "m")
    with pytest.raises(EngineError, match="needs 101 tokens"):
        check_requests_fit([short("a", max_tokens=61)], [40], fits, "m")


# --- a stage whose requests all failed stops -----------------------------------------------------


def test_the_failure_rule_every_one_or_more_than_the_share():
    assert failure_summary("s", 6, 6, ["k1: HTTP 400: no"], 1.0) is not None
    assert failure_summary("s", 6, 5, ["k1: HTTP 400: no"], 1.0) is None
    assert failure_summary("s", 10, 3, [], 0.25) is not None and failure_summary("s", 10, 2, [], 0.25) is None
    assert failure_summary("s", 0, 0, [], 0.0) is None  # nothing sent (all cached): nothing failed


def _profile(tmp_path, monkeypatch, share: float | None = None):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(generate, "preflight", lambda s: (None, "fake"))
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["run_name"] = "all-failed"
    if share is not None:
        raw["generation"].setdefault("engine", {})["max_failed_share"] = share
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    return params.load(path)


def test_a_stage_whose_every_request_failed_exits_non_zero_with_the_first_errors(tmp_path, monkeypatch):
    """Issue #60: `make extract` got six context errors back and exited 0. Now the stage raises with a
    summary; the manifest keeps the errors and a rerun asks for every failed request again."""
    p = _profile(tmp_path, monkeypatch)
    context_error = "HTTP 400: request (2997 tokens) exceeds the available context size (2048 tokens)"
    with pytest.raises(RequestsFailed) as failed:
        generate.run(
            p, progress=False, log=lambda m: None, engine_factory=lambda s: FakeEngine(s, fail=lambda r: context_error)
        )
    n = len(generate.plan(p))
    assert f"generate: {n} of {n} requests failed (every one)" in str(failed.value)
    assert "exceeds the available context size" in str(failed.value)
    manifest = json.loads(artifacts.path(p.run_name, "manifest_generate").read_text())
    assert sum(m["n_errors_this_run"] for m in manifest["models"]) == n
    calls: list[str] = []
    again = generate.run(p, progress=False, log=lambda m: None, engine_factory=lambda s: FakeEngine(s, calls=calls))
    assert len(calls) == n and again["stories"]["error"].isna().all()


def test_more_failures_than_the_profiles_share_stop_the_stage(tmp_path, monkeypatch):
    p = _profile(tmp_path, monkeypatch, share=0.1)
    doomed = set(generate.plan(p)["story_id"].iloc[:2])
    with pytest.raises(RequestsFailed, match=r"2 of \d+ requests failed \(more than 10%\)"):
        generate.run(
            p,
            progress=False,
            log=lambda m: None,
            engine_factory=lambda s: FakeEngine(s, fail=lambda r: "HTTP 500: down" if r.key in doomed else None),
        )


def test_an_extraction_whose_every_answer_failed_exits_non_zero(tmp_path, monkeypatch):
    """The issue's new user: six stories, an extractor whose every request came back with a context
    error, and `make extract` exited 0. Now stage 03 stops with the summary, after its manifest."""
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setattr("storybias.stages.extract.preflight", lambda spec: (None, "scripted"))
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["run_name"] = "all-failed-extract"
    raw["extract"] = {"retries": 0, "self_consistency_sample": 0, "gold_sample": 0, "prompt_design": "one_answer"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    p = params.load(path)
    stories = pd.DataFrame(
        {
            "story_id": [f"s{i}" for i in range(6)],
            "design": ["stereotales"] * 6,
            "language": ["en"] * 6,
            "model": ["m"] * 6,
            "text": [f"Story {i} about a baker." for i in range(6)],
            "cond_task": [None] * 6,
            "is_valid": [True] * 6,
        }
    )
    io.write_parquet_atomic(stories, artifacts.filtered_path(p.run_name))
    refused = "HTTP 400: request (2997 tokens) exceeds the available context size (1024 tokens), try increasing it"
    with pytest.raises(RequestsFailed, match=r"extract: (\d+) of \1 requests failed \(every one\).*2997 tokens"):
        extract_stage.run(
            p, progress=False, log=lambda m: None, engine_factory=lambda s: FakeEngine(s, fail=lambda r: refused)
        )
    manifest = json.loads(artifacts.path(p.run_name, "manifest_extract").read_text())
    assert "exceeds the available context size" in json.dumps(manifest)
    assert not artifacts.extractions_path(p.run_name).exists()  # Make's target is not written


# --- a served model's live tokens, for the progress bar (issue #60 item 5) -------------------------


def test_a_llama_servers_busy_slots_give_the_bar_its_running_tokens(key):
    with FakeOpenAI(dialect="llama.cpp", delay=0.2) as api:
        api.decoding = [120, 30]
        with openai_endpoint.OpenAIEngine(spec(api.base_url, max_concurrency=1), seed=1) as engine:
            assert engine.tokens_in_flight() is None  # no stream: nothing runs
            seen = [engine.tokens_in_flight() for _ in engine.stream([short("a"), short("b")])]
            assert engine.tokens_in_flight() is None
    assert seen == [150, 150] and "GET /slots" in api.routes


def test_vllms_counter_less_the_answers_received_gives_the_running_tokens(key):
    with FakeOpenAI(dialect="vllm", delay=0.2) as api:
        api.generation_tokens = 5_000  # what the server generated before this stream
        with openai_endpoint.OpenAIEngine(spec(api.base_url, max_concurrency=1), seed=1) as engine:
            stream = engine.stream([short("a"), short("b")])
            first = next(stream)
            api.generation_tokens = 5_000 + first.n_tokens + 40  # the first answer, and 40 of the running one's
            assert engine.tokens_in_flight() == 40
            list(stream)
    assert first.n_tokens == 3


def test_a_served_models_running_requests_share_the_tokens_its_server_counts(key):
    """A server counts its running requests' tokens in all (vLLM's /metrics) or per slot without the
    request (llama-server's /slots): each request sent and not answered gets an equal share, what the
    bar's expected rest per running sequence needs (storybias.engines.progress)."""

    release = threading.Event()  # the slow answers wait for it: a sleep raced a loaded CI machine

    def answer(body: dict) -> str:
        if "slow" in json.dumps(body):
            release.wait(timeout=60)  # still running when the fast answer is back
        return "A short answer."

    with FakeOpenAI(dialect="vllm", answer=answer) as api:
        api.generation_tokens = 1_000
        with openai_endpoint.OpenAIEngine(spec(api.base_url, max_concurrency=3), seed=1) as engine:
            assert engine.sequences_in_flight() is None  # no stream: nothing runs
            stream = engine.stream([short("slow-1"), short("fast"), short("slow-2")])
            try:
                first = next(stream)
                api.generation_tokens = 1_000 + first.n_tokens + 41
                assert first.key == "fast" and engine.sequences_in_flight() == {"slow-1": 20, "slow-2": 20}
            finally:
                release.set()
            assert sorted(result.key for result in stream) == ["slow-1", "slow-2"]
            assert engine.sequences_in_flight() is None  # the stream ended


def test_an_endpoint_that_tells_nothing_leaves_the_bar_on_finished_answers(key):
    with FakeOpenAI(delay=0.1) as api:
        with openai_endpoint.OpenAIEngine(spec(api.base_url), seed=1) as engine:
            seen = [(engine.tokens_in_flight(), engine.sequences_in_flight()) for _ in engine.stream([short("a")])]
    assert seen == [(None, None)]
