"""llama.cpp's server as a backend (issue #60 item 2), without a server: its command line, the request body
in its dialect, the profile checks, the cache identity and the GGUF re-joined on demand.
(The real server: tests/test_llamacpp_slow.py.)"""

from __future__ import annotations

import hashlib
import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from storybias.config import llamacpp as llama_config
from storybias.config import models
from storybias.config.llamacpp import LlamaCppSettings
from storybias.config.params import EngineSettings, ModelSpec, ParamsError, Sampling, load
from storybias.core import paths
from storybias.engines import LlamaServerEngine, llamacpp, local_servers, open_engine, openai_endpoint, server_starter
from storybias.engines.base import ChatRequest
from storybias.engines.cache import engine_identity
from storybias.engines.context import tokenizer_counter
from storybias.engines.llamacpp import server_command, server_environment
from storybias.engines.llamacpp_dialect import choice_grammar, gbnf_literal
from storybias.stages.extract import facts as extract_facts
from storybias.tools import bench_llamacpp

SPEC = ModelSpec(name="qwen2.5-coder-0.5b", source="embedded", embedded="qwen2.5-coder-0.5b")


@pytest.fixture()
def fake_binary(tmp_path, monkeypatch) -> Path:
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(llama_config.BINARY_VARIABLE, str(binary))
    return binary


def _profile(tmp_path: Path, engine: dict, model: dict | None = None) -> Path:
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw["run_name"] = "llama-unit"
    raw["generation"]["engine"] = {"shared_server": True, "shared_server_kind": "llama.cpp", **engine}
    if model is not None:
        raw["generation"]["models"] = [model]
        raw["extract"]["models"] = [dict(model)]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# --- the command line ----------------------------------------------------------------------------


def test_the_command_line_serves_the_gguf_on_loopback_with_the_profiles_sizes_and_the_key_stays_off_it():
    cmd = server_command(
        Path("/x/llama-server"),
        Path("/m/q.gguf"),
        LlamaCppSettings(ctx_size=8192, parallel=4, threads=2),
        port=4321,
        seed=7,
        alias="qwen2.5-coder-0.5b",
    )

    def value(flag: str) -> str:
        return cmd[cmd.index(flag) + 1]

    assert cmd[0] == "/x/llama-server" and value("--model") == "/m/q.gguf"
    assert value("--host") == "127.0.0.1" and value("--port") == "4321"
    assert (value("--ctx-size"), value("--parallel"), value("--threads")) == ("8192", "4", "2")
    assert value("--alias") == "qwen2.5-coder-0.5b" and value("--seed") == "7"
    assert "--jinja" in cmd and not any("api-key" in c for c in cmd)
    assert "--no-repack" in cmd, "repacking (llama.cpp's AMX path) is off unless the profile turns it on"
    assert server_environment("-starts-with-a-dash")["LLAMA_API_KEY"] == "-starts-with-a-dash"
    assert "--chat-template-file" not in cmd


def test_threads_default_to_the_cores_this_process_may_use_and_a_chat_template_file_is_passed(monkeypatch):
    # the cores of the process' affinity (taskset, a cpuset, a pinned `make test` worker), not the machine's
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {2, 3, 5, 7, 11, 13})
    cmd = server_command(
        Path("b"),
        Path("g"),
        LlamaCppSettings(),
        port=1,
        seed=1,
        alias="m",
        chat_template=Path("/t.jinja"),
    )
    assert cmd[cmd.index("--threads") + 1] == "6"
    assert "--no-repack" not in server_command(
        Path("b"), Path("g"), LlamaCppSettings(repack=True), port=1, seed=1, alias="m"
    )
    assert cmd[cmd.index("--chat-template-file") + 1] == "/t.jinja"
    assert LlamaCppSettings(ctx_size=8192, parallel=4).slot_context() == 2048


# --- the request body ----------------------------------------------------------------------------

ENDPOINT = openai_endpoint.Endpoint(
    name="m", base_url="http://127.0.0.1:1/v1", model_id="m", constraints="llama.cpp", context_tokens=2048
)
SAMPLING = Sampling(temperature=0.7, top_p=0.9, top_k=-1, repetition_penalty=1.1, max_tokens=64)


def test_a_choice_becomes_a_grammar_of_exactly_the_strings_and_sampling_takes_llama_cpps_names():
    request = ChatRequest("k", [{"role": "user", "content": "?"}], SAMPLING, seed=3, choice=["yes", 'say "no"'])
    kwargs = openai_endpoint.request_kwargs(ENDPOINT, request)
    body = kwargs["extra_body"]
    assert body["grammar"] == 'root ::= "yes" | "say \\"no\\""'
    assert "structured_outputs" not in body and "response_format" not in kwargs
    assert body["top_k"] == 0, "vLLM's -1 (no top-k) is llama.cpp's 0"
    assert body["repeat_penalty"] == 1.1 and body["repeat_last_n"] == 2048 and body["min_p"] == 0.0
    assert kwargs["seed"] == 3 and kwargs["top_p"] == 0.9 and kwargs["max_tokens"] == 64


def test_a_json_schema_goes_in_response_format_and_ignore_eos_is_passed():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    request = ChatRequest(
        "k", [{"role": "user", "content": "?"}], SAMPLING, seed=3, json_schema=schema, ignore_eos=True
    )
    kwargs = openai_endpoint.request_kwargs(ENDPOINT, request)
    assert kwargs["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    assert kwargs["extra_body"]["ignore_eos"] is True and "grammar" not in kwargs["extra_body"]


def test_gbnf_literals_escape_what_the_grammar_format_reads():
    assert gbnf_literal('a\\b"c\nd') == '"a\\\\b\\"c\\nd"'
    with pytest.raises(ValueError, match="choice"):
        choice_grammar([])


# --- the profile checks --------------------------------------------------------------------------


def test_a_llama_cpp_profile_loads_when_the_binary_is_there(tmp_path, fake_binary):
    p = load(_profile(tmp_path, {"llama_cpp": {"ctx_size": 16384, "parallel": 4, "threads": 2}}))
    assert p.generation.engine.shared_server_kind == "llama.cpp"
    assert p.generation.engine.llama_cpp.slot_context() == 4096


@pytest.mark.parametrize(
    ("engine", "model", "says"),
    [
        ({"compact_json": True}, None, "compact_json"),
        ({"cpu_top_k_first": True}, None, "cpu_top_k_first"),
        ({}, {"name": "m", "source": "local", "path": "data/models/x"}, "GGUF"),
        ({}, {"name": "m", "source": "embedded", "weights": "int8"}, "llama.cpp serves the model's 4-bit GGUF"),
        ({"llama_cpp": {"ctx_size": 8192, "parallel": 4}}, None, "raise ctx_size to at least 16384"),
    ],
)
def test_check_params_names_what_llama_cpp_cannot_do(tmp_path, fake_binary, engine, model, says):
    with pytest.raises(ParamsError, match=says):
        load(_profile(tmp_path, engine, model))


def test_check_params_says_how_to_build_a_missing_binary(tmp_path, monkeypatch):
    monkeypatch.setenv(llama_config.BINARY_VARIABLE, str(tmp_path / "absent"))
    with pytest.raises(ParamsError, match="make llama-server"):
        load(_profile(tmp_path, {}))


def test_ray_and_llama_cpp_are_exclusive():
    with pytest.raises(ValueError, match="exclusive"):
        EngineSettings(backend="ray", shared_server_kind="llama.cpp")


# --- identity, engines, the GGUF -----------------------------------------------------------------


def test_llama_cpps_answers_get_cache_keys_of_their_own_and_the_other_servers_keep_theirs():
    host, openai = EngineSettings(shared_server_kind="host"), EngineSettings(shared_server_kind="openai")
    llama = EngineSettings(shared_server_kind="llama.cpp")
    assert engine_identity(host) == engine_identity(openai)
    assert engine_identity(llama) != engine_identity(host)
    assert engine_identity(llama) == engine_identity(
        EngineSettings(shared_server_kind="llama.cpp", llama_cpp={"parallel": 2})
    )


def test_open_engine_uses_the_runs_llama_server_in_its_dialect_else_starts_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path))
    settings = EngineSettings(shared_server_kind="llama.cpp", llama_cpp={"parallel": 3})
    assert isinstance(open_engine(SPEC, settings, 1, run_name="r"), LlamaServerEngine)
    entry = {
        "base_url": "http://127.0.0.1:9/v1",
        "model_id": SPEC.name,
        "api_key": "k",
        "pid": 1,  # alive
        "kind": "llama.cpp",
        "constraints": "llama.cpp",
        "max_concurrency": 3,
        "serve_key": local_servers.serve_key(SPEC),
    }
    local_servers.write_registry("r", {SPEC.name: entry})
    monkeypatch.setattr(local_servers, "health_ok", lambda url, timeout=3.0: True)
    engine = open_engine(SPEC, settings, 1, run_name="r")
    assert isinstance(engine, openai_endpoint.OpenAIEngine)
    assert engine.endpoint.constraints == "llama.cpp" and engine.endpoint.max_concurrency == 3
    assert not engine.endpoint.top_k_first


def test_the_gguf_is_joined_on_demand_checked_and_reused(tmp_path, monkeypatch):
    parts = [tmp_path / "p1.bin", tmp_path / "p2.bin"]
    parts[0].write_bytes(b"GGUF-head")
    parts[1].write_bytes(b"-tail")
    data = b"GGUF-head-tail"
    fake = models.EmbeddedWeights(
        "fake",
        "fake",
        "fake{}",
        2,
        hashlib.sha256(data).hexdigest(),
        len(data),
        "fake-bf16",
        "fake.gguf",
        "0" * 64,
        "fake-w8a8",
    )
    monkeypatch.setitem(models.EMBEDDED, "fake", fake)
    monkeypatch.setattr(models, "embedded_part_paths", lambda key: parts)
    joins: list[int] = []
    real_join = models.join_parts
    monkeypatch.setattr(models, "join_parts", lambda *a: joins.append(1) or real_join(*a))
    gguf = models.embedded_gguf("fake", folder=tmp_path / "m", log=lambda m: None)
    assert gguf.read_bytes() == data and len(joins) == 1
    assert models.embedded_gguf("fake", folder=tmp_path / "m", log=lambda m: None) == gguf and len(joins) == 1
    gguf.with_name("fake.gguf.sha256").write_text("0" * 64)  # a stamp of other weights: joined again
    models.embedded_gguf("fake", folder=tmp_path / "m", log=lambda m: None)
    assert len(joins) == 2 and gguf.with_name("fake.gguf.sha256").read_text().strip() == fake.sha256


# --- the side-by-side bench (make bench-generate LLAMA=1) ----------------------------------------


def test_the_bench_gives_llama_server_one_slot_per_sequence_vllm_batches():
    settings = bench_llamacpp.llama_settings(EngineSettings(max_num_seqs=16), concurrency=8, max_tokens=200)
    assert settings.shared_server_kind == "llama.cpp"
    assert settings.llama_cpp.parallel == 8 and settings.llama_cpp.slot_context() >= 200 + bench_llamacpp.PROMPT_ROOM


def test_the_bench_reports_both_columns_the_ratio_and_the_machine():
    rates = {"vllm_cpu": [10.0, 12.0, 11.0], "llama_cpp": [20.0, 24.0, 22.0]}
    result = bench_llamacpp.bench_result(rates, {"vllm_cpu": 35.0, "llama_cpp": 1.5}, [], 4, 16, "m", 4)
    assert result["tokens_per_second"] == {"vllm_cpu": 11.0, "llama_cpp": 22.0}
    assert result["ratio_llama_cpp_over_vllm_cpu"] == 2.0 and result["machine"]["cores"] >= 1
    table = bench_llamacpp.format_columns(result)
    assert "llama.cpp is faster on this machine" in table and "35.0" in table and "22.0" in table


# --- the wiring, with a stand-in llama-server ----------------------------------------------------

FAKE_SERVER = """
import json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
key = os.environ["LLAMA_API_KEY"]
seen = os.environ["FAKE_LLAMA_SEEN"]
with open(seen, "a") as fh:
    fh.write(json.dumps({"argv": args}) + "\\n")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(200 if self.path == "/health" else 404, {"status": "ok"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(seen, "a") as fh:
            fh.write(json.dumps({"body": body}) + "\\n")
        if self.headers.get("Authorization") != f"Bearer {key}":
            return self.reply(401, {"error": {"code": 401, "message": "Invalid API Key"}})
        text = body["grammar"].split('"')[1] if "grammar" in body else "free"
        message = {"role": "assistant", "content": text}
        usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        self.reply(200, {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                         "choices": [choice], "usage": usage})


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture()
def stand_in(tmp_path, monkeypatch) -> Path:
    """A stand-in llama-server (stdlib HTTP: /health and chat completions) recording its argv and bodies."""
    script = tmp_path / "llama-server"
    script.write_text(f"#!{sys.executable}\n{FAKE_SERVER}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(llama_config.BINARY_VARIABLE, str(script))
    monkeypatch.setenv("FAKE_LLAMA_SEEN", str(tmp_path / "seen.jsonl"))
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(llamacpp, "embedded_gguf", lambda key, log=print: tmp_path / "model.gguf")
    return tmp_path / "seen.jsonl"


def _seen(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_engine_without_a_run_server_starts_its_own_and_stops_it(stand_in, tmp_path):
    settings = EngineSettings(shared_server_kind="llama.cpp", llama_cpp={"parallel": 2, "threads": 1})
    request = ChatRequest("k", [{"role": "user", "content": "?"}], SAMPLING, seed=3, choice=["left", "right"])
    with open_engine(SPEC, settings, 1, run_name="r") as engine:
        [result] = list(engine.stream([request]))
        pid = engine._server.process.pid
    assert result.error is None and result.text == "left"
    argv, body = _seen(stand_in)[0]["argv"], _seen(stand_in)[1]["body"]
    assert argv[argv.index("--model") + 1] == str(tmp_path / "model.gguf") and argv[argv.index("--parallel") + 1] == "2"
    assert body["grammar"] == 'root ::= "left" | "right"' and body["repeat_last_n"] == SPEC.max_model_len
    assert not local_servers.pid_alive(pid), "the engine's own server is stopped when the engine closes"


def test_with_servers_registers_one_llama_server_in_its_dialect_and_stops_it(stand_in, tmp_path):
    p = load(_profile(tmp_path, {"llama_cpp": {"parallel": 3, "threads": 1}}))
    out = tmp_path / "entries.json"
    probe = (
        "import json; from storybias.config import checks, params; from storybias.engines import local_servers; "
        f"p = params.load({str(p.source)!r}); "
        "entries = {m.name: local_servers.lookup(p.run_name, m) for m in checks.local_models(p.profile)}; "
        f"json.dump(entries, open({str(out)!r}, 'w'))"
    )
    code = local_servers.with_servers(
        p, [sys.executable, "-c", probe], log=lambda m: None, start=server_starter(p.generation.engine)
    )
    assert code == 0
    [entry] = json.loads(out.read_text()).values()
    assert entry["kind"] == "llama.cpp" and entry["constraints"] == "llama.cpp" and entry["max_concurrency"] == 3
    assert not local_servers.pid_alive(entry["pid"]) and not local_servers.registry_path(p.run_name).exists()


# --- step 2's prompts, bounded before step 1 answers ------------------------------------------------


def test_step_twos_bound_holds_a_real_step_two_request_and_grows_with_its_facts():
    """The bound: the prompt without facts, plus max_tokens of facts, plus max_tokens to answer. A step-2
    request with facts of n tokens (counted by the same tokenizer) needs at most fixed + n + max_tokens."""
    p = load(paths.params_dir() / "smoke.yaml")
    settings = p.extract
    spec = settings.models[0]
    tokenizer = models.load_tokenizer(spec)
    count = tokenizer_counter(tokenizer, spec.chat_template_kwargs)
    fixed, need = extract_facts.map_context_need(settings, count)
    assert need == fixed + 2 * settings.max_tokens and fixed > 1000  # the worked examples are in it
    phrase = "35 years old; a nurse at the night shift; rents a small flat with her two sons; "
    for repeats in (1, 8, 24):
        facts = (phrase * repeats).strip()
        n_facts = len(tokenizer.encode(facts, add_special_tokens=False))
        real = extract_facts.map_requests([{"request_key": "k", "facts": facts}], settings, 1)[0]
        assert fixed < count(real) <= fixed + n_facts + 2, (repeats, count(real), fixed, n_facts)


@pytest.mark.parametrize(
    ("engine", "extract", "refused"),
    [
        ({"llama_cpp": {"ctx_size": 16384, "parallel": 4}}, {}, True),  # the smoke run's refusal, after step 1
        ({"llama_cpp": {"ctx_size": 16384, "parallel": 4}}, {"max_tokens": 200}, False),
        ({"llama_cpp": {"ctx_size": 16384, "parallel": 4}}, {"prompt_design": "one_answer"}, False),
        ({}, {}, False),  # the default 32,768 over 4 slots
    ],
)
def test_a_slot_too_small_for_step_two_is_refused_at_check_params(tmp_path, fake_binary, engine, extract, refused):
    path = _profile(tmp_path, {"cpu_top_k_first": False, **engine})
    raw = yaml.safe_load(path.read_text())
    raw["extract"].update(extract)
    path.write_text(yaml.safe_dump(raw))
    problems = extract_facts.llama_cpp_map_problems(load(path))
    assert bool(problems) == refused, problems
    if refused:
        (problem,) = problems
        assert "generation.engine.llama_cpp.ctx_size / parallel = 16384 / 4 = 4096" in problem, problem
        assert "extract.max_tokens" in problem and "raise ctx_size to at least" in problem, problem
        # the check-params command says the same and exits 2
        ran = subprocess.run(
            [sys.executable, "-m", "storybias.cli", "check-params", str(path)], capture_output=True, text=True
        )
        assert ran.returncode == 2 and "step 2's prompts" in ran.stderr, ran.stderr[-2000:]


def test_a_vllm_run_is_not_asked_about_llama_cpps_slots(tmp_path):
    p = load(paths.params_dir() / "smoke.yaml")
    assert p.generation.engine.shared_server_kind != "llama.cpp"
    assert extract_facts.llama_cpp_map_problems(p) == []
