"""One in-process engine per model per run, kept in a process of its own: the model host.

``make paper`` on a profile with ``generation.engine.shared_server: true`` and ``shared_server_kind:
host`` (the default profile) runs its stages under ``storybias.cli with-servers``, which starts no
model itself but marks the run as a hosting session (``STORYBIAS_HOST_OWNER``, its pid, inherited by
every stage's kernel). The first stage that needs a local model then starts a host for it
(``python -m storybias.engines.host``): the same :class:`~storybias.engines.inprocess.Engine` as the
in-process path, started once, listening on an abstract Unix socket with a random key, registered in
``data/<run>/servers.json`` beside the vLLM servers (``kind: host``). Stages 01, 03 and 04 connect to
it (:class:`HostedEngine`) instead of loading the weights again; ``with-servers`` stops every host of
its run when the command ends, fails or is interrupted, and a host whose owner died stops itself.

Why not vLLM's OpenAI-compatible server (``shared_server_kind: openai``): over HTTP the requests
arrive one by one and the server batches them as they come, so the same seeds gave other texts than
the in-process engine. The host receives a stage's whole request list in one message and queues it
the way the in-process engine does (``enqueue_chat`` then ``step``), so both paths form the same
batches and give the same texts, and a result cached by one is the other's: the cache key is the
same. (stdlib ``multiprocessing.connection``: pickled messages behind an HMAC handshake, no server
framework needed for one client at a time.)
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from storybias.config.models import load_tokenizer
from storybias.config.params import EngineSettings, ModelSpec
from storybias.core import run_folders
from storybias.engines.base import ChatRequest, ChatResult, EngineError, EngineInfo
from storybias.engines.inprocess import Engine
from storybias.engines.local_servers import (
    OWNER_VARIABLE,
    pid_alive,
    preload_environment,
    register_host,
    stop_pid_group,
    wait_until_ready,
)

KEY_VARIABLE = "STORYBIAS_HOST_KEY"  # the host's key, passed in its environment (never on its command line)
START_TIMEOUT_S = 1800.0  # vLLM's CPU start-up took > 8 min on a 2-core machine without AVX-512
OWNER_POLL_S = 2.0
TOKENS_EVERY_S = 1.0  # how often a host tells its client what the running sequences generated


def session_owner() -> int | None:
    """The pid of the ``with-servers`` process this stage runs under, when it hosts models; else None."""
    value = os.environ.get(OWNER_VARIABLE, "")
    return int(value) if value.isdigit() else None


def host_command(spec: ModelSpec, settings: EngineSettings, seed: int, socket_name: str, owner: int) -> list[str]:
    """The host's command line; ``socket_name`` is its abstract socket's name (the address without the
    leading NUL byte, which a command line cannot hold)."""
    return [
        sys.executable,
        "-m",
        "storybias.engines.host",
        "--spec",
        spec.model_dump_json(exclude_defaults=True),  # what a profile would write: no openai-only fields
        "--settings",
        settings.model_dump_json(exclude_defaults=True),
        "--seed",
        str(seed),
        "--socket-name",
        socket_name,
        "--owner",
        str(owner),
    ]


def start_host(spec: ModelSpec, settings: EngineSettings, seed: int, run_name: str, owner: int) -> dict[str, Any]:
    """Start a host for ``spec`` (a process group of its own, logging to ``reports/<run>/host-<model>.log``),
    wait until it accepts connections, and return its registry entry. On failure, stop it and raise
    EngineError with the end of its log."""
    name = f"storybias-host-{secrets.token_hex(8)}"  # an abstract socket: no path-length limit, no file left
    key = secrets.token_hex(24)
    logfile = run_folders.claim_reports(run_name) / f"host-{spec.name}.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{KEY_VARIABLE: key}, **preload_environment(spec, settings))
    with open(logfile, "w", encoding="utf-8") as fh:
        process = subprocess.Popen(
            host_command(spec, settings, seed, name, owner),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # outlives this stage's kernel; with-servers stops its group
        )
    entry = {"kind": "host", "address": f"\0{name}", "authkey": key, "pid": process.pid, "log": str(logfile)}
    started = time.time()
    wait_until_ready(
        process,
        lambda: _accepts(entry),
        f"the model host for {spec.name!r}",
        logfile=logfile,
        started=started,
        timeout_s=START_TIMEOUT_S,
        error=EngineError,
        poll_s=0.5,
    )
    entry["startup_seconds"] = round(time.time() - started, 1)
    return entry


def _reap(pid: int) -> None:
    """Collect our child ``pid``'s exit status if it has ended (a zombie still counts in its group)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _accepts(entry: dict[str, Any]) -> bool:
    try:
        connect(entry).close()
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False


def connect(entry: dict[str, Any]) -> Connection:
    return Client(entry["address"], family="AF_UNIX", authkey=bytes.fromhex(entry["authkey"]))


class HostedEngine:
    """The run's host for ``spec`` as a ChatEngine: connects to a running one (``entry``) or, in a hosting
    session, starts one on entering. Closing a stream early closes the connection: the host aborts what
    was still running.

    ``private``: a host for this engine alone, for a model no other stage of the run runs. It is owned by
    this process (it stops itself if this process dies), never registered, and stopped when the engine
    closes, so its memory is free for the next stages. A host rather than an engine in this process because
    only a process that starts with ``LD_PRELOAD`` gets the preload, which speeds the default's decoding
    (``make bench-engine``; docs/benchmarks.md)."""

    def __init__(
        self,
        spec: ModelSpec,
        settings: EngineSettings,
        seed: int,
        run_name: str,
        entry: dict[str, Any] | None = None,
        private: bool = False,
    ):
        self.spec = spec
        self.settings = settings
        self.seed = seed
        self.run_name = run_name
        self.entry = entry
        self.private = private and entry is None
        self.info: EngineInfo | None = None
        self._conn: Connection | None = None
        self._tokenizer: Any = None
        # the host's last word on its running sequences' tokens: by request key, or their sum
        self._live: dict[str, int] | int | None = None

    def __enter__(self) -> HostedEngine:
        started = time.time()
        if self.entry is None:
            owner = os.getpid() if self.private else session_owner()
            if owner is None:
                raise EngineError("no model host is running and this process is not under `with-servers`")
            self.entry = start_host(self.spec, self.settings, self.seed, self.run_name, owner)
            if not self.private:
                register_host(self.run_name, self.spec, self.entry)
        try:
            self._conn = connect(self.entry)
            self._conn.send(("info", None))
            hosted = EngineInfo(**self._receive("info"))
        except BaseException:  # no engine for the stage: a private host it started goes too
            self.__exit__(None, None, None)
            raise
        # what this stage paid to get the engine: the host's start-up if it started it here, else ~0
        self.info = EngineInfo(**{**asdict(hosted), "startup_seconds": round(time.time() - started, 1)})
        return self

    def __exit__(self, *exc: Any) -> None:
        self._close()
        if self.private and self.entry is not None:
            pid = int(self.entry["pid"])
            stop_pid_group(pid, reap=lambda: _reap(pid))
            self.entry = None

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _receive(self, expected: str) -> Any:
        assert self._conn is not None
        kind = "tokens"
        while kind == "tokens":  # between results, the host says what its running sequences generated
            try:
                kind, payload = self._conn.recv()
            except (EOFError, OSError) as exc:
                self._close()
                raise EngineError(
                    f"the model host for {self.spec.name!r} went away ({exc!r}); see {self.entry}"
                ) from None
            if kind == "tokens":
                self._live = payload
        if kind == "error":
            raise EngineError(f"the model host for {self.spec.name!r} failed: {payload}")
        if kind != expected:
            raise EngineError(f"the model host for {self.spec.name!r} answered {kind!r}, expected {expected!r}")
        return payload

    def stream(self, requests: Sequence[ChatRequest]) -> Iterator[ChatResult]:
        if not requests:
            return
        if self._conn is None:
            raise EngineError("engine not started")
        self._conn.send(("stream", list(requests)))
        done = False
        try:
            for _ in range(len(requests)):
                yield self._receive("result")
            self._receive("done")
            done = True
        finally:
            self._live = None
            if not done:  # closed early: the host sees the connection drop and aborts the rest
                self._close()

    def tokens_in_flight(self) -> int | None:
        """What the host last said its running sequences generated (storybias.engines.progress)."""
        live = self._live
        return sum(live.values()) if isinstance(live, dict) else live

    def sequences_in_flight(self) -> dict[str, int] | None:
        """What the host last said each running request generated, by key; None if it said only the sum."""
        live = self._live
        return dict(live) if isinstance(live, dict) else None

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.spec)
        return self._tokenizer


# --- the host process ----------------------------------------------------------------------------


def _serve_connection(engine: Any, conn: Connection) -> None:
    """Answer one client until it disconnects: ``info`` -> the engine's info; ``stream`` -> one
    ``result`` message per request, then ``done``. A client gone mid-stream aborts the rest. ``engine``: a
    started :class:`Engine` (its ``stream`` a generator, closed to abort), or the tests' scripted one."""
    while True:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            return
        if kind == "info":
            conn.send(("info", asdict(engine.info)))
            continue
        if hasattr(engine, "on_step"):
            engine.on_step = _tokens_sender(conn)
        results = engine.stream(payload)
        try:
            for result in results:
                conn.send(("result", result))
            conn.send(("done", None))
        except OSError:  # the client is gone (a crash, an interrupt, a closed stream)
            results.close()  # aborts the requests still running
            return
        except Exception as exc:  # the engine failed: say why, and stop (the next stage starts a fresh host)
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
            raise


def _tokens_sender(conn: Connection, every_s: float | None = None) -> Callable[[dict[str, int] | int | None], None]:
    """What the engine calls after each step: at most every ``every_s`` seconds, a ``tokens`` message
    with its running sequences' tokens, by request key (or their sum: a scripted engine's), for the
    client's progress bar (storybias.engines.progress). Called
    from the thread that sends the results, so messages never interleave."""
    interval = TOKENS_EVERY_S if every_s is None else every_s
    last = [float("-inf")]

    def send(live: dict[str, int] | int | None) -> None:
        now = time.monotonic()
        if live is not None and now - last[0] >= interval:
            last[0] = now
            conn.send(("tokens", live))

    return send


def _stop_with_owner(owner: int) -> None:
    """End this host's process group once its owner is gone (a CPU host runs vLLM's engine core in process)."""
    while pid_alive(owner):
        time.sleep(OWNER_POLL_S)
    print(f"model host: owner {owner} is gone; stopping", flush=True)
    os.killpg(os.getpgid(0), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m storybias.engines.host")
    for name in ("--spec", "--settings", "--socket-name"):
        parser.add_argument(name, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--owner", type=int, required=True)
    args = parser.parse_args(argv)
    spec = ModelSpec.model_validate_json(args.spec)
    settings = EngineSettings.model_validate_json(args.settings)
    key = bytes.fromhex(os.environ.pop(KEY_VARIABLE))
    threading.Thread(target=_stop_with_owner, args=(args.owner,), daemon=True).start()
    engine = Engine(spec, settings, args.seed, start_kind="host").start()
    assert engine.info is not None  # set by start()
    print(f"model host: {spec.name} started in {engine.info.startup_seconds} s; listening", flush=True)
    with Listener(f"\0{args.socket_name}", family="AF_UNIX", authkey=key) as listener:
        while True:
            try:
                conn = listener.accept()
            except (OSError, EOFError, AuthenticationError) as exc:  # a failed handshake (wrong key): refuse and go on
                print(f"model host: refused a connection ({exc!r})", flush=True)
                continue
            with conn:
                _serve_connection(engine, conn)


if __name__ == "__main__":
    sys.exit(main())
