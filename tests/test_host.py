"""The model host's protocol, registry and lifetime (storybias.engines.host), without a model: a scripted
engine behind the real socket. tests/test_extract_slow.py runs the embedded model through a real host."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Listener
from pathlib import Path

import pytest

from storybias.config.params import EngineSettings, ModelSpec, Sampling
from storybias.engines import (
    ChatRequest,
    ChatResult,
    EngineError,
    EngineInfo,
    host,
    local_servers,
    open_engine,
    open_stage_engine,
)


class ScriptedEngine:
    """What the host serves: an info and a stream that records how it ended."""

    def __init__(self, fail_at: int | None = None, seconds_per_answer: float = 0.0):
        self.seconds_per_answer = seconds_per_answer  # a real engine's pace: the client can leave mid-stream
        self.info = EngineInfo(model="m", model_id="scripted", weights="-", device="cpu", startup_seconds=12.5)
        self.fail_at = fail_at
        self.answered: list[str] = []
        self.closed_early = False

    def stream(self, requests: list[ChatRequest]) -> Iterator[ChatResult]:
        finished = False
        try:
            for i, r in enumerate(requests):
                if i == self.fail_at:
                    raise RuntimeError("the engine core died")
                time.sleep(self.seconds_per_answer)
                self.answered.append(r.key)
                yield ChatResult(r.key, f"text of {r.key}", "stop", n_tokens=3, n_prompt_tokens=5)
            finished = True
        finally:
            self.closed_early = not finished


def requests(n: int) -> list[ChatRequest]:
    message = [{"role": "user", "content": "hi"}]
    return [ChatRequest(key=f"k{i}", messages=message, sampling=Sampling(), seed=i) for i in range(n)]


@pytest.fixture
def hosted():
    """A host loop in a thread serving a ScriptedEngine; yields (engine, entry, thread)."""

    def serve_with(engine: ScriptedEngine):
        entry = {"kind": "host", "address": f"\0storybias-test-{secrets.token_hex(6)}", "authkey": secrets.token_hex(8)}
        listener = Listener(entry["address"], family="AF_UNIX", authkey=bytes.fromhex(entry["authkey"]))

        def loop() -> None:
            with listener:
                for _ in range(2):  # a refused handshake, then one client (or two clients)
                    try:
                        conn = listener.accept()
                    except AuthenticationError:
                        continue
                    with conn:
                        try:
                            host._serve_connection(engine, conn)
                        except RuntimeError:  # the failing engine: the real host exits here
                            return

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        return entry, thread

    return serve_with


def client_engine(entry: dict) -> host.HostedEngine:
    spec = ModelSpec(name="m", source="embedded")
    return host.HostedEngine(spec, EngineSettings(), seed=1, run_name="unused", entry=entry)


def test_a_stage_gets_every_answer_then_done_and_the_hosts_identity(hosted):
    engine = ScriptedEngine()
    entry, _ = hosted(engine)
    with client_engine(entry) as client:
        got = list(client.stream(requests(4)))
        again = list(client.stream(requests(2)))  # the same connection serves the next call
    assert [r.key for r in got] == ["k0", "k1", "k2", "k3"] and [r.key for r in again] == ["k0", "k1"]
    assert got[2].text == "text of k2" and not engine.closed_early
    assert client.info.model_id == "scripted" and client.info.device == "cpu"
    assert client.info.startup_seconds < 5  # what this stage waited, not the host's own 12.5 s start


def test_a_stream_closed_early_aborts_the_rest_on_the_host(hosted):
    engine = ScriptedEngine(seconds_per_answer=0.05)
    entry, _ = hosted(engine)
    with client_engine(entry) as client:
        stream = client.stream(requests(50))
        next(stream)
        stream.close()  # a crash or an interrupt in the stage
        deadline = time.time() + 10
        while not engine.closed_early and time.time() < deadline:
            time.sleep(0.05)
    assert engine.closed_early, "the host kept generating for a client that was gone"
    assert len(engine.answered) < 50


def test_an_engine_failure_reaches_the_stage_as_an_engine_error(hosted):
    entry, _ = hosted(ScriptedEngine(fail_at=1))
    with client_engine(entry) as client:
        with pytest.raises(EngineError, match="the engine core died"):
            list(client.stream(requests(3)))


def test_a_wrong_key_is_refused_and_the_host_serves_on(hosted):
    entry, _ = hosted(ScriptedEngine())
    with pytest.raises(AuthenticationError):
        Client(entry["address"], family="AF_UNIX", authkey=b"not the key")
    with client_engine(entry) as client:
        assert len(list(client.stream(requests(2)))) == 2


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.delenv(local_servers.OWNER_VARIABLE, raising=False)
    return "host-test"


def test_a_registered_host_is_found_under_its_name_and_by_its_weights(run):
    spec = ModelSpec(name="writer", source="embedded")
    reader = ModelSpec(name="reader", source="embedded")  # same weights, another name
    other = ModelSpec(name="small", source="embedded", embedded="qwen2.5-coder-0.5b")
    local_servers.register_host(run, spec, {"kind": "host", "address": "\0x", "authkey": "00", "pid": os.getpid()})
    assert local_servers.lookup(run, spec)["address"] == "\0x"
    assert local_servers.lookup(run, reader)["address"] == "\0x"
    assert local_servers.lookup(run, other) is None
    engine = open_engine(reader, EngineSettings(), 1, run_name=run)
    assert isinstance(engine, host.HostedEngine) and engine.entry["address"] == "\0x"


def test_a_dead_host_is_not_used_and_outside_a_session_the_engine_is_in_process(run):
    spec = ModelSpec(name="writer", source="embedded")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    local_servers.register_host(run, spec, {"kind": "host", "address": "\0x", "authkey": "00", "pid": int(dead.stdout)})
    assert local_servers.lookup(run, spec) is None
    assert type(open_engine(spec, EngineSettings(), 1, run_name=run)).__name__ == "Engine"


def test_inside_a_session_a_stage_starts_a_host(run, monkeypatch):
    monkeypatch.setenv(local_servers.OWNER_VARIABLE, str(os.getpid()))
    engine = open_engine(ModelSpec(name="writer", source="embedded"), EngineSettings(), 1, run_name=run)
    assert isinstance(engine, host.HostedEngine) and engine.entry is None  # starts on entering


def test_only_a_model_another_stage_runs_gets_a_host_for_the_run(run, monkeypatch):
    """The default profile's 1.5B writes (01), extracts (03) and judges (04): a host registered for the run
    keeps it loaded. Its 0.5B writes stage 01's occupations only: a host of that stage's own, unregistered,
    instead of one holding it idle through stages 03 to 08. A host already registered for it is used."""
    from storybias.config.params import load

    monkeypatch.setenv(local_servers.OWNER_VARIABLE, str(os.getpid()))
    default = load(Path(__file__).resolve().parents[1] / "params" / "default.yaml")
    large, small = default.generation.models
    assert local_servers.run_by_several_stages(default.profile, large)
    assert not local_servers.run_by_several_stages(default.profile, small)
    shared, own = open_stage_engine(default, large, 1), open_stage_engine(default, small, 1)
    assert isinstance(shared, host.HostedEngine) and not shared.private
    assert isinstance(own, host.HostedEngine) and own.private
    entry = {"kind": "host", "address": "\0s", "authkey": "00", "pid": os.getpid()}
    local_servers.register_host(default.run_name, small, entry)
    engine = open_stage_engine(default, small, 1)
    assert isinstance(engine, host.HostedEngine) and engine.entry["address"] == "\0s" and not engine.private


# A stand-in for `python -m storybias.engines.host` (no model): the same key, socket and protocol; it
# writes the owner it was given to the file named by its third argument.
STAND_IN_HOST = """
import os, sys
from multiprocessing.connection import Listener
from storybias.engines import host
from storybias.engines.base import ChatResult, EngineInfo

class Echo:
    info = EngineInfo(model="m", model_id="stand-in", weights="-", device="cpu", startup_seconds=0.0)

    def stream(self, requests):
        for r in requests:
            yield ChatResult(r.key, "text of " + r.key, "stop", n_tokens=1, n_prompt_tokens=1)

open(sys.argv[3], "w").write(sys.argv[2])
key = bytes.fromhex(os.environ.pop(host.KEY_VARIABLE))
with Listener("\\0" + sys.argv[1], family="AF_UNIX", authkey=key) as listener:
    while True:
        with listener.accept() as conn:
            if sys.argv[4:] == ["refuse"]:  # a host that cannot say what it serves
                try:
                    conn.recv()
                    conn.send(("error", "no engine"))
                except EOFError:
                    pass
                continue
            host._serve_connection(Echo(), conn)
"""


def stand_in_command(owner_file: Path, *extra: str):
    return lambda spec, settings, seed, socket_name, owner: [
        sys.executable,
        "-c",
        STAND_IN_HOST,
        socket_name,
        str(owner),
        str(owner_file),
        *extra,
    ]


def test_a_stage_s_own_host_is_owned_by_the_stage_and_gone_when_it_closes(run, monkeypatch, tmp_path):
    """The process that holds the model ends with the engine (its memory is free for the next stages),
    never enters the run's registry, and is owned by the stage's process, so it also stops if the stage
    dies. The shared host, started the same way, stays registered for the run."""
    owner_file = tmp_path / "owner"
    monkeypatch.setattr(host, "host_command", stand_in_command(owner_file))
    monkeypatch.setenv(local_servers.OWNER_VARIABLE, "1")  # the with-servers process: not this one
    spec = ModelSpec(name="small", source="embedded", embedded="qwen2.5-coder-0.5b")
    with open_engine(spec, EngineSettings(), 1, run_name=run, shared=False) as engine:
        pid = engine.entry["pid"]
        assert local_servers.pid_alive(pid) and local_servers.read_registry(run) == {}
        assert [r.text for r in engine.stream(requests(2))] == ["text of k0", "text of k1"]
    assert int(owner_file.read_text()) == os.getpid()
    assert not local_servers.pid_alive(pid), "the stage's own host outlived its engine"
    assert not Path(f"/proc/{pid}").exists(), "its exit status was collected (no zombie)"
    shared = open_engine(spec, EngineSettings(), 1, run_name=run)
    with shared:
        assert local_servers.lookup(run, spec)["pid"] == shared.entry["pid"]
    assert int(owner_file.read_text()) == 1 and local_servers.pid_alive(shared.entry["pid"])
    pid = shared.entry["pid"]
    local_servers.stop_pid_group(pid, reap=lambda: host._reap(pid))


def test_a_stage_s_own_host_that_fails_to_answer_is_stopped_too(run, monkeypatch, tmp_path):
    """The host started, but its first answer is an error: the stage gets the error, and the host it
    started for itself does not live on holding the model until the stage's process ends."""
    monkeypatch.setattr(host, "host_command", stand_in_command(tmp_path / "owner", "refuse"))
    monkeypatch.setenv(local_servers.OWNER_VARIABLE, "1")
    started: list[int] = []
    real_start = host.start_host

    def recorded_start(*args):
        entry = real_start(*args)
        started.append(entry["pid"])
        return entry

    monkeypatch.setattr(host, "start_host", recorded_start)
    spec = ModelSpec(name="small", source="embedded", embedded="qwen2.5-coder-0.5b")
    with pytest.raises(EngineError, match="failed: no engine"):
        with open_engine(spec, EngineSettings(), 1, run_name=run, shared=False):
            pass
    [pid] = started
    assert not local_servers.pid_alive(pid), "the stage's own host outlived a failed start"


def _profile(tmp_path: Path, kind: str):
    from storybias.config.params import load

    text = (Path(__file__).resolve().parents[1] / "params" / "smoke.yaml").read_text()
    path = tmp_path / "p.yaml"
    path.write_text(text.replace("engine: {", f"engine: {{shared_server: true, shared_server_kind: {kind}, ", 1))
    params = load(path)
    assert params.generation.engine.shared_server_kind == kind
    return params


def test_with_servers_lends_its_pid_to_the_command_and_stops_the_hosts_started_under_it(run, tmp_path):
    params = _profile(tmp_path, "host")
    # a stand-in host: a process group of its own, registered as a stage registers the host it starts
    script = (
        "import os, subprocess, sys, time\n"
        "from storybias.config.params import ModelSpec\n"
        "from storybias.engines import local_servers\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
        f"local_servers.register_host({params.run_name!r}, ModelSpec(name='qwen2.5-coder-1.5b', source='embedded'),"
        " {'kind': 'host', 'address': '\\0y', 'authkey': '00', 'pid': p.pid})\n"
        f"open({str(tmp_path / 'seen')!r}, 'w')"
        f".write(os.environ['{local_servers.OWNER_VARIABLE}'] + ' ' + str(p.pid))\n"
    )
    logged: list[str] = []
    assert local_servers.with_servers(params, [sys.executable, "-c", script], log=logged.append) == 0
    owner, pid = map(int, (tmp_path / "seen").read_text().split())
    assert owner == os.getpid()
    assert not local_servers.pid_alive(pid), "the host outlived its run"
    assert local_servers.read_registry(params.run_name) == {}
    assert any("stopped 1 model host" in line for line in logged)


def test_a_host_whose_owner_died_stops_itself(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    watcher = subprocess.Popen(
        [sys.executable, "-c", f"from storybias.engines import host; host._stop_with_owner({owner.pid})"],
        start_new_session=True,
    )
    owner.wait()
    try:
        assert watcher.wait(timeout=30) == -signal.SIGTERM
    finally:
        if watcher.poll() is None:
            watcher.kill()


def test_the_host_is_given_the_profiles_model_and_settings_exactly():
    """The host rebuilds the spec and engine settings from its command line: a round trip that must keep
    every setting (an openai-only default written out would be refused, a lost one would load another engine)."""
    from storybias.config.params import load

    p = load(Path(__file__).resolve().parents[1] / "params" / "default.yaml")
    for spec in p.generation.models:
        command = host.host_command(spec, p.generation.engine, 42, "storybias-host-x", owner=1)
        args = dict(zip(command[3::2], command[4::2]))
        assert ModelSpec.model_validate_json(args["--spec"]) == spec
        assert EngineSettings.model_validate_json(args["--settings"]) == p.generation.engine
        assert "\0" not in "".join(command) and args["--socket-name"] == "storybias-host-x"


class SteppingEngine(ScriptedEngine):
    """A scripted engine that, like the in-process one, reports each running sequence's tokens by key
    after each step (``on_step``, set by the host) before each answer ends."""

    on_step = None

    def stream(self, requests: list[ChatRequest]) -> Iterator[ChatResult]:
        for i, r in enumerate(requests):
            if self.on_step is not None:
                self.on_step({x.key: 100 * (i + 1) // (len(requests) - i) for x in requests[i:]})
            yield ChatResult(r.key, "t", "stop", n_tokens=3, n_prompt_tokens=5)


def test_the_host_forwards_its_running_sequences_tokens_to_the_client_bar(hosted, monkeypatch):
    """Issue #60: the default profile's stages run on the model host; their progress bar counts the
    tokens of sequences still running (storybias.engines.progress), which only the host's engine knows:
    each one's by request key, for the bar's expected rest of each running sequence."""
    monkeypatch.setattr(host, "TOKENS_EVERY_S", 0.0)
    entry, _ = hosted(SteppingEngine())
    seen = []
    with client_engine(entry) as client:
        assert client.tokens_in_flight() is None and client.sequences_in_flight() is None
        for result in client.stream(requests(3)):
            seen.append((result.key, client.tokens_in_flight(), client.sequences_in_flight()))
        assert client.tokens_in_flight() is None  # the stream ended: nothing runs
        assert client.sequences_in_flight() is None
    assert seen == [
        ("k0", 99, {"k0": 33, "k1": 33, "k2": 33}),
        ("k1", 200, {"k1": 100, "k2": 100}),
        ("k2", 300, {"k2": 300}),
    ]
