"""llama.cpp's server for real (issue #60 item 3): a ``llama-server`` (``make llama-server``) started by this
module, serving the embedded 0.5B's GGUF, with stages 01-04 of a profile derived from params/smoke.yaml run
against it in llama.cpp's dialect:

- stages 01-04 complete on it (stage 03's JSON-schema answers, stage 04's judge through a choice grammar);
- a JSON-schema-constrained answer parses and follows a schema the model would not follow unconstrained,
  and a choice comes back as exactly one of its strings;
- a request longer than the server's context per slot (its ``GET /props``) is refused before anything is
  sent, naming its size, the limit and the ``-c`` that would make it fit;
- the server SIGKILLed while stage 01 streams from it: the stage stops, and the rerun (a server of its own)
  loses nothing: no duplicate story id, every stored answer kept verbatim.

Skipped, with the reason, only where the binary is absent (``make test`` builds it first).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.request import Request, urlopen

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from storybias.config import params
from storybias.config.llamacpp import server_binary
from storybias.config.params import Sampling
from storybias.core import paths
from storybias.engines import ChatRequest, EngineError, local_servers, openai_endpoint
from storybias.engines.llamacpp import LlamaServer, start_llama_server
from storybias.stages import associations, extract, filter, generate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.access(server_binary(), os.X_OK),
        reason=f"no llama-server at {server_binary()}: `make llama-server` builds it (make test does first)",
    ),
]
ROOT = paths.repo_root()
MODEL = {"name": "qwen2.5-coder-0.5b", "source": "embedded", "embedded": "qwen2.5-coder-0.5b"}
ENGINE = {
    "shared_server": True,
    "shared_server_kind": "llama.cpp",
    # one slot: the extraction prompts share their worked examples, which llama-server then reads once
    # (its prompt cache), not once per slot; on 2 shared cores it read about 35 prompt tokens/s.
    # One thread: make test runs this module beside another worker, and llama.cpp's threads spin-wait for
    # each other. With a busy loop (`python3 -c "while True: pass"`) on the other core, this module took
    # 134 s at 1 thread and had not finished its second test after 15 minutes at 2 (2026-12-07, 2-core Xeon).
    "llama_cpp": {"ctx_size": 4096, "parallel": 1, "threads": 1},
    "cpu_preload": False,
}
# The model would answer this with a poem: only an applied constraint gives {"zq": 7}.
ODD_SCHEMA = {
    "type": "object",
    "properties": {"zq": {"type": "integer", "minimum": 7, "maximum": 7}},
    "required": ["zq"],
    "additionalProperties": False,
}


def _profile(folder: Path, run_name: str, n_prompts: int = 1, shard_size: int = 2, **sampling: int) -> Path:
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["run_name"] = run_name
    raw["generation"]["models"] = [dict(MODEL)]
    raw["generation"]["engine"] = dict(ENGINE)
    raw["generation"]["sampling"].update(sampling)
    raw["generation"]["shard_size"] = shard_size
    raw["designs"] = {
        "stereotales": {"languages": ["en"], "n_prompts": n_prompts},
        "occupations": {"languages": ["en"], "n_prompts": n_prompts},
    }
    raw["extract"] = {  # the least extraction work that still sends JSON-schema requests
        "models": [dict(MODEL)],
        "sections": {"stereotales": ["demographics"], "occupations": ["markers"]},
        "prompt_design": "one_answer",
        "worked_examples": 0,  # prompts of a few hundred tokens: llama-server reads them on 1 thread
        "max_tokens": 360,  # without worked examples the 0.5B indents its JSON: room for the whole object
        "max_list_items": 2,
        "retries": 0,
        "self_consistency_sample": 0,
        "gold_sample": 0,
    }
    raw["associations"] = {"judge": {"models": [dict(MODEL)]}}
    path = folder / f"{run_name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The module's llama-server, its data folder and the profile's path; stopped at the end."""
    folder = tmp_path_factory.mktemp("llama")
    saved = os.environ.get("STORYBIAS_DATA")
    os.environ["STORYBIAS_DATA"] = str(folder / "data")
    path = _profile(folder, "pytest-llama")
    p = params.load(path)
    spec = p.generation.models[0]
    server = start_llama_server(spec, p.generation.engine, 42, p.run_name, log_dir=folder, log=lambda m: None)
    local_servers.write_registry(
        p.run_name, {spec.name: {**server.entry(), "serve_key": local_servers.serve_key(spec)}}
    )
    try:
        yield server, p, folder
    finally:
        server.stop(grace=5)
        if saved is None:
            os.environ.pop("STORYBIAS_DATA", None)
        else:
            os.environ["STORYBIAS_DATA"] = saved


def _ask(server: LlamaServer, p: params.Params, requests: list[ChatRequest]) -> dict[str, str]:
    spec = p.generation.models[0]
    with openai_endpoint.OpenAIEngine.for_local_server(spec, server.entry(), p.generation.engine, 1) as engine:
        results = {r.key: r for r in engine.stream(requests)}
    assert all(r.error is None for r in results.values()), results
    return {k: r.text for k, r in results.items()}


def test_a_json_schema_answer_parses_and_a_choice_is_one_of_its_strings(llama):
    server, p, _ = llama
    sampling = Sampling(temperature=1.0, top_p=0.95, top_k=50, repetition_penalty=1.0, max_tokens=30)
    poem = [{"role": "user", "content": "Write a two-line poem about the sea."}]
    color = [{"role": "user", "content": "Name a colour."}]
    texts = _ask(
        server,
        p,
        [
            ChatRequest("schema", poem, sampling, seed=3, json_schema=ODD_SCHEMA),
            ChatRequest("choice", color, sampling, seed=3, choice=["ultramarine blue", 'say "teal"']),
        ],
    )
    assert json.loads(texts["schema"]) == {"zq": 7}, texts
    assert texts["choice"] in {"ultramarine blue", 'say "teal"'}, texts


def test_a_request_longer_than_a_slot_is_refused_before_anything_is_sent(llama):
    """A server of its own with 512 tokens a slot (``-c 1024 -np 2``): llama-server's /props tells the limit,
    the model's tokenizer counts the prompt, and the engine refuses before sending."""
    _, p, folder = llama
    spec = p.generation.models[0]
    small = p.generation.engine.model_copy(
        update={"llama_cpp": p.generation.engine.llama_cpp.model_copy(update={"ctx_size": 1024, "parallel": 2})}
    )
    server = start_llama_server(spec, small, 42, "pytest-llama-small", log_dir=folder, log=lambda m: None)
    sampling = Sampling(temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=1.0, max_tokens=64)
    long_prompt = [{"role": "user", "content": "Summarise: " + "the quiet harbour at dawn " * 150}]
    try:
        with openai_endpoint.OpenAIEngine.for_local_server(spec, server.entry(), small, 1) as engine:
            with pytest.raises(EngineError) as refused:
                list(engine.stream([ChatRequest("long", long_prompt, sampling, seed=1)]))
        asked = Request(f"{server.base_url.removesuffix('/v1')}/slots")
        asked.add_header("Authorization", f"Bearer {server.entry()['api_key']}")
        slots = json.loads(urlopen(asked, timeout=10).read())
    finally:
        server.stop(grace=5)
    message = str(refused.value)
    assert "'long'" in message and "512" in message and "GET /props" in message, message
    assert "-c " in message and "Nothing was sent" in message, message
    assert not any("id_task" in slot for slot in slots), slots  # a slot lists the last task it ran: none ran


def test_the_progress_bar_reads_the_running_tokens_from_llama_servers_slots(llama):
    """The bar's live rate (issue #60 item 5) counts what a running answer decoded so far, from the real
    server's ``GET /slots`` (whose ``next_token`` is a list in this llama.cpp: read as an object before,
    the count was never there, and the bar fell back to finished answers)."""
    server, p, _ = llama
    spec = p.generation.models[0]
    sampling = Sampling(temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=1.0, max_tokens=96)
    count = [{"role": "user", "content": "Count from 1 to 100, one number per line, nothing else."}]
    seen: list[int | None] = []
    done = threading.Event()
    with openai_endpoint.OpenAIEngine.for_local_server(spec, server.entry(), p.generation.engine, 1) as engine:

        def poll() -> None:
            while not done.wait(0.25):
                seen.append(engine.tokens_in_flight())

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            results = list(engine.stream([ChatRequest("count", count, sampling, seed=1)]))
        finally:
            done.set()
            poller.join()
    assert results[0].error is None and results[0].n_tokens > 48, results
    assert max((n for n in seen if n is not None), default=0) > 0, seen


def test_stages_01_to_04_run_against_llama_server(llama):
    server, p, _ = llama
    stories = generate.run(p, progress=False, log=lambda m: None)["stories"]
    assert len(stories) == len(generate.plan(p)) and stories["story_id"].is_unique
    assert (stories["finish_reason"] != "error").all()
    filter.run(p, progress=False)
    result = extract.run(p, progress=False, log=lambda m: None)
    raw = result.tables["raw"]
    assert len(raw) and raw["parse_ok"].any(), raw[["raw", "error"]].to_string()
    assert result.manifest["timings"][p.extract.models[0].name]["endpoint"] == server.base_url
    associations.run(p, progress=False)
    manifest = json.loads((paths.run_dir(p.run_name) / "manifest_associations.json").read_text())
    assert manifest, "stage 04 wrote its manifest"


def test_server_killed_mid_generation_then_the_rerun_loses_nothing(llama):
    """Last: a server of its own for a run of six stories, SIGKILLed once the first answers are stored;
    the rerun finds no server registered and starts its own (``LlamaServerEngine``)."""
    _, _, folder = llama
    # six stories, each stored as it arrives (shard_size 1): the kill falls after the first and before the last.
    # 48 tokens a story (96 before): alone, the test took 58 s instead of 70 s (2026-12-07, 2-core Xeon).
    path = _profile(folder, "pytest-llama-kill", n_prompts=3, shard_size=1, max_tokens=48)
    p = params.load(path)
    spec = p.generation.models[0]
    engine = p.generation.engine.model_copy(
        update={"llama_cpp": p.generation.engine.llama_cpp.model_copy(update={"parallel": 2, "ctx_size": 8192})}
    )
    server = start_llama_server(spec, engine, 42, p.run_name, log_dir=folder, log=lambda m: None)
    entry = {**server.entry(), "serve_key": local_servers.serve_key(spec)}
    local_servers.write_registry(p.run_name, {spec.name: entry})
    data, env = paths.run_dir(p.run_name), dict(os.environ)
    with open(folder / "kill.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "storybias.cli", "generate", str(path)], cwd=ROOT, env=env, stdout=log, stderr=log
        )
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not list((data / "cache").glob("part-*.parquet")):
        time.sleep(0.1)
    assert proc.poll() is None, (folder / "kill.log").read_text()[-3000:]
    assert list((data / "cache").glob("part-*.parquet")), (folder / "kill.log").read_text()[-3000:]
    os.killpg(os.getpgid(server.process.pid), signal.SIGKILL)
    server.process.wait(timeout=30)
    assert proc.wait(timeout=300) != 0, "the stage stops when its server is gone"
    assert "cannot reach the endpoint" in (folder / "kill.log").read_text()
    parts = sorted((data / "cache").glob("part-*.parquet"))
    before = pd.concat([pq.read_table(s).to_pandas() for s in parts], ignore_index=True)
    assert before["logical_key"].is_unique and len(before) < len(generate.plan(p))

    local_servers.write_registry(p.run_name, {})
    done = subprocess.run(
        [sys.executable, "-m", "storybias.cli", "generate", str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    stories = pd.read_parquet(data / "stories.parquet")
    planned = generate.plan(p)
    assert len(stories) == len(planned) and stories["story_id"].is_unique
    assert set(stories["story_id"]) == set(planned["story_id"]) and (stories["finish_reason"] != "error").all()
    kept = stories.set_index("story_id").loc[before["logical_key"]]
    assert list(kept["text"]) == list(before["text"]), "answers stored before the kill are kept verbatim"
    manifest = json.loads((data / "manifest_generate.json").read_text())
    assert manifest["models"][0]["n_reused"] == len(before)
