"""Served models for real (issue #14): an embedded model (the 0.5B, ``SERVED_MODEL`` in conftest.py)
behind the real vLLM OpenAI-compatible server on loopback (``local_server``: the one server of the
served tests and the sibling-model test; the pipeline's own slow run uses the in-process engine and a
model host).

- the JSON constraint holds (a schema the model would not follow unconstrained), in both ways of
  sending it, and the removed ``guided_json`` field is ignored;
- a seeded request gives the same text twice;
- top-k and top-p reach the server's CPU logits processor (``cpu_top_k_first``) and give vLLM's text;
- a 429/500 burst injected by a tiny proxy in front of the real server is retried and the run completes;
- a bad key or URL stops the stage within seconds with one message;
- the server SIGKILLed mid-generation: the rerun (new server) resumes with nothing lost or duplicated.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from storybias.config import params
from storybias.config.params import ModelSpec, Sampling
from storybias.config.plan import STORIES_SCHEMA
from storybias.core import paths
from storybias.engines import ChatRequest, openai_endpoint
from storybias.stages import generate

pytestmark = pytest.mark.slow
ROOT = paths.repo_root()
KEY_ENV = "STORYBIAS_TEST_SERVER_KEY"

# The model would answer this with a poem: only an applied constraint gives {"zq": 7}.
ODD_SCHEMA = {
    "type": "object",
    "properties": {"zq": {"type": "integer", "minimum": 7, "maximum": 7}},
    "required": ["zq"],
    "additionalProperties": False,
}
POEM = [{"role": "user", "content": "Write a two-line poem about the sea."}]


def served_spec(local_server, monkeypatch, **kw) -> ModelSpec:
    monkeypatch.setenv(KEY_ENV, local_server.server.api_key)
    base = dict(
        name="served",
        source="openai",
        base_url=local_server.server.base_url,
        model_id=local_server.server.model_id,
        api_key_env=KEY_ENV,
        max_concurrency=2,
        request_timeout_s=600,
    )
    return ModelSpec(**{**base, **kw})


def ask(spec: ModelSpec, requests: list[ChatRequest]) -> dict[str, str]:
    with openai_endpoint.OpenAIEngine(spec, seed=1) as engine:
        results = {r.key: r for r in engine.stream(requests)}
    assert all(r.error is None for r in results.values()), results
    return {k: r.text for k, r in results.items()}


def test_the_json_constraint_is_applied(local_server, monkeypatch):
    spec = served_spec(local_server, monkeypatch)
    sampling = Sampling(temperature=1.0, top_p=0.95, top_k=50, repetition_penalty=1.0, max_tokens=30)
    constrained = ChatRequest(key="c", messages=POEM, sampling=sampling, seed=3, json_schema=ODD_SCHEMA)
    free = ChatRequest(key="f", messages=POEM, sampling=sampling, seed=3)
    texts = ask(spec, [constrained, free])
    assert json.loads(texts["c"]) == {"zq": 7}
    assert not texts["f"].strip().startswith('{"zq"'), "unconstrained, the model writes something else"
    # the standard response_format way (constraints: openai), against the same vLLM server
    assert json.loads(ask(served_spec(local_server, monkeypatch, constraints="openai"), [constrained])["c"]) == {
        "zq": 7
    }
    # vLLM 0.32 ignores the removed guided_json field: sent alone, it constrains nothing
    import openai

    client = openai.OpenAI(base_url=spec.base_url, api_key=local_server.server.api_key)
    try:
        old = client.chat.completions.create(
            model=spec.model_id,
            messages=POEM,
            max_tokens=30,
            seed=3,
            temperature=1.0,
            extra_body={"guided_json": ODD_SCHEMA},
        )
        assert old.choices[0].message.content.strip() != '{"zq": 7}'
    except openai.BadRequestError:
        pass  # a server that refuses the old field does not apply it either
    # a choice list (the explicit task) holds too
    choice = ChatRequest(
        key="x",
        messages=[{"role": "user", "content": "Say hello."}],
        sampling=sampling,
        seed=3,
        choice=["alpha", "omega"],
    )
    assert ask(spec, [choice])["x"] in ("alpha", "omega")


def test_a_seeded_request_gives_the_same_text_twice(local_server, monkeypatch):
    spec = served_spec(local_server, monkeypatch)
    sampling = Sampling(temperature=1.0, top_p=0.95, top_k=50, repetition_penalty=1.1, max_tokens=40)
    first = ask(spec, [ChatRequest(key="a", messages=POEM, sampling=sampling, seed=11)])["a"]
    again = ask(spec, [ChatRequest(key="a", messages=POEM, sampling=sampling, seed=11)])["a"]
    other = ask(spec, [ChatRequest(key="a", messages=POEM, sampling=sampling, seed=12)])["a"]
    assert first == again and len(first) > 10  # (the model may answer in Chinese: no spaces to count)
    assert other != first, "another seed samples another text (the seed is applied)"


def test_top_k_first_reaches_the_servers_logits_processor(local_server, monkeypatch):
    """generation.engine.cpu_top_k_first over HTTP (storybias.engines.cpu_sampling): a run's client for
    a local CPU server sends top-k and top-p in ``vllm_xargs`` to the logits processor every such
    server registers. At top-k 1 and temperature 1 the processor leaves only the largest logit, so the
    text is the one vLLM's own top-k 1 gives for the same seed; had the arguments been dropped, the
    request would have sampled the whole vocabulary."""
    local = local_server.params.generation.models[0]
    settings = local_server.params.generation.engine
    assert settings.cpu_top_k_first, "the smoke profile runs the default's sampler"
    entry = {k: getattr(local_server.server, k) for k in ("base_url", "model_id", "api_key")}
    sampling = Sampling(temperature=1.0, top_p=1.0, top_k=1, repetition_penalty=1.0, max_tokens=40)
    request = ChatRequest(key="s", messages=POEM, sampling=sampling, seed=5)
    client = openai_endpoint.OpenAIEngine.for_local_server(local, entry, settings, seed=1)
    assert openai_endpoint.request_kwargs(client.endpoint, request)["extra_body"]["vllm_xargs"]
    with client as engine:
        [through_processor] = list(engine.stream([request]))
    vllms_own = ask(served_spec(local_server, monkeypatch), [request])["s"]
    assert through_processor.error is None and through_processor.text == vllms_own and len(vllms_own) > 10


class FaultProxy:
    """A tiny HTTP proxy in front of the real server: the first chat requests (not the 1-token
    preflight) get the injected statuses, everything else is passed through."""

    def __init__(self, upstream: str, faults: list[tuple[int, str | None]]):
        self.upstream = upstream.rstrip("/").removesuffix("/v1")
        self.faults = list(faults)
        self.injected: list[int] = []
        self.passed = 0
        lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _relay(self, method: str, body: bytes | None) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
                req = urllib.request.Request(proxy.upstream + self.path, data=body, headers=headers, method=method)
                try:
                    with urllib.request.urlopen(req, timeout=900) as resp:
                        status, data = resp.status, resp.read()
                except urllib.error.HTTPError as err:
                    status, data = err.code, err.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                self._relay("GET", None)

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fault = None
                if json.loads(body or b"{}").get("max_tokens", 0) > 1:
                    with lock:
                        fault = proxy.faults.pop(0) if proxy.faults else None
                if fault:
                    status, retry_after = fault
                    proxy.injected.append(status)
                    data = json.dumps({"error": {"message": f"injected {status}"}}).encode()
                    self.send_response(status)
                    if retry_after is not None:
                        self.send_header("retry-after", retry_after)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                proxy.passed += 1
                self._relay("POST", body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _tiny_profile(tmp_path: Path, run_name: str, model: dict, **engine) -> Path:
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["run_name"] = run_name
    raw["generation"]["models"] = [model]
    raw["generation"]["engine"].update(engine)
    raw["designs"] = {
        "bedtime": {"languages": ["en"], "n_prompts": 2},
        "occupations": {"languages": ["en"], "n_prompts": 2},
    }
    path = tmp_path / f"{run_name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_429_and_500_burst_is_retried_and_the_run_completes(local_server, monkeypatch, tmp_path):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv(KEY_ENV, local_server.server.api_key)
    proxy = FaultProxy(local_server.server.base_url, [(429, "0"), (429, "1"), (429, "0"), (500, None), (502, None)])
    try:
        model = {
            "name": "via-proxy",
            "source": "openai",
            "base_url": proxy.base_url,
            "model_id": local_server.server.model_id,
            "api_key_env": KEY_ENV,
            "max_concurrency": 2,
            "max_retries": 6,
        }
        p = params.load(_tiny_profile(tmp_path, "pytest-proxy", model))
        result = generate.run(p, progress=False, log=lambda m: None)
    finally:
        proxy.close()
    assert proxy.injected == [429, 429, 429, 500, 502], "every injected fault was served"
    stories = result["stories"]
    assert len(stories) == len(generate.plan(p)) and stories["story_id"].is_unique
    assert (stories["finish_reason"] != "error").all() and result.manifest["errors_per_model"] == {}
    assert result.manifest["models"][0]["endpoint"] == proxy.base_url


def test_a_bad_key_or_url_stops_the_stage_within_seconds(local_server, monkeypatch, tmp_path):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv(KEY_ENV, "not-the-key")
    model = {
        "name": "bad",
        "source": "openai",
        "base_url": local_server.server.base_url,
        "model_id": local_server.server.model_id,
        "api_key_env": KEY_ENV,
    }
    for edit, message in (
        ({}, "refused the key"),
        ({"base_url": "http://127.0.0.1:9/v1"}, "cannot reach"),
        ({"model_id": "no-such-model"}, "unknown model id"),
    ):
        if "model_id" in edit:
            monkeypatch.setenv(KEY_ENV, local_server.server.api_key)
        path = _tiny_profile(tmp_path, "pytest-bad", {**model, **edit})
        started = time.time()
        proc = subprocess.run(
            [sys.executable, "-m", "storybias.cli", "generate", str(path)],
            cwd=ROOT,
            env=dict(os.environ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode != 0 and time.time() - started < 30
        assert message in proc.stderr and "'bad'" in proc.stderr and KEY_ENV in proc.stderr, proc.stderr[-2000:]
        assert local_server.server.api_key not in proc.stderr + proc.stdout
        assert not (tmp_path / "data" / "pytest-bad" / "cache").exists() or not list(
            (tmp_path / "data" / "pytest-bad" / "cache").glob("part-*")
        ), "nothing was queued"


def test_server_killed_mid_generation_then_a_new_server_resumes(local_server, smoke_profile, tmp_path):
    """Last: it kills the shared server (SIGKILL, whole process group) while stage 01 streams from it,
    and starts a new one for the rerun."""
    _, env, tmp = smoke_profile
    run = "pytest-serverkill"
    local_server.register(run)
    path = tmp / "serverkill.yaml"
    raw = yaml.safe_load((tmp / "served.yaml").read_text())  # 2 at a time, like the server: the kill lands mid-run
    raw["run_name"] = run
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    data = Path(env["STORYBIAS_DATA"]) / run
    work = data / "cache"  # storybias.engines.cache: stage 01's answers
    log = open(tmp_path / "serverkill.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "storybias.cli", "generate", str(path)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None and not list(work.glob("part-*.parquet")):
        time.sleep(0.2)
    assert proc.poll() is None, (tmp_path / "serverkill.log").read_text()[-3000:]
    server = local_server.server
    os.killpg(os.getpgid(server.process.pid), signal.SIGKILL)
    server.process.wait(timeout=30)
    assert proc.wait(timeout=120) != 0, "the stage stops when its server is gone"
    output = (tmp_path / "serverkill.log").read_text()
    assert "cannot reach the endpoint" in output, output[-3000:]
    assert not (data / "stories.parquet").exists()
    before = pd.concat([pq.read_table(s).to_pandas() for s in sorted(work.glob("part-*.parquet"))], ignore_index=True)
    before = before.rename(columns={"logical_key": "story_id"})
    assert before["story_id"].is_unique and (before["finish_reason"] != "error").all()

    local_server.restart()  # a new server, registered for every run of the session
    done = subprocess.run(
        [sys.executable, "-m", "storybias.cli", "generate", str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    stories = pd.read_parquet(data / "stories.parquet")
    manifest = json.loads((data / "manifest_generate.json").read_text())
    planned = generate.plan(params.load(path))
    assert len(stories) == len(planned) and stories["story_id"].is_unique
    assert set(stories["story_id"]) == set(planned["story_id"]) and (stories["finish_reason"] != "error").all()
    assert set(STORIES_SCHEMA.names) == set(stories.columns), "served stories keep the stories contract"
    assert manifest["models"][0]["endpoint"] == local_server.server.base_url
    kept = stories.set_index("story_id").loc[before["story_id"]]
    assert list(kept["text"]) == list(before["text"]), "stories received before the kill are kept verbatim"
    assert manifest["models"][0]["n_reused"] == len(before)
    assert manifest["models"][0]["n_generated_this_run"] == len(planned) - len(before)
