"""A tiny OpenAI-compatible chat-completions server for the fast tests (stdlib only, loopback):
scripted answers, injected HTTP errors, a key check and a model list; it records every request body.

``dialect="llama.cpp"`` adds what llama.cpp's ``llama-server -c <slots * n_ctx> -np <slots>`` answers
(tools/server/README.md and server code): ``GET /props`` (``default_generation_settings.n_ctx`` per slot,
``total_slots``), ``POST /apply-template`` (``{"prompt"}``), ``POST /tokenize`` (``{"tokens": [...]}``), and a
chat whose prompt does not fit a slot refused with HTTP 400 and its ``exceed_context_size_error`` body.
``dialect="vllm"`` adds vLLM's ``max_model_len`` to the model list and its ``POST /tokenize``
(``{"count", "max_model_len", "tokens"}``). A token is a whitespace-separated word of the templated prompt.
Live tokens (the progress bar): llama.cpp's ``GET /slots`` (busy slots' ``next_token``, a list of one
object with ``n_decoded``, as llama-cpp-python 0.3.36's server sends it; from ``decoding``) and vLLM's
``GET /metrics`` (``vllm:generation_tokens_total``, from ``generation_tokens``).

The slow tests use the real vLLM server instead (tests/test_openai_endpoint_slow.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeOpenAI:
    """``faults``: a list of (status, retry_after) served to the first chat requests, in order;
    ``answer(body)`` gives the answer text (default: the first choice, or a fixed sentence);
    ``fail_when(body)`` returns a status (e.g. 400) for requests that always fail."""

    def __init__(
        self,
        key: str = "sk-test",
        models: tuple[str, ...] = ("m-1",),
        faults: list[tuple[int, str | None]] | None = None,
        answer: Callable[[dict], str] | None = None,
        fail_when: Callable[[dict], int | None] | None = None,
        delay: float = 0.0,
        finish_reason: str = "stop",
        dialect: str | None = None,
        n_ctx: int = 4096,
        slots: int = 4,
    ):
        self.key, self.models = key, list(models)
        self.faults = list(faults or [])
        self.answer = answer or (lambda body: "A short answer.")
        self.fail_when = fail_when or (lambda body: None)
        self.delay = delay
        self.finish_reason = finish_reason
        self.dialect, self.n_ctx, self.slots = dialect, n_ctx, slots
        self.decoding: list[int] = []  # llama.cpp's /slots: tokens decoded so far by each busy slot
        self.generation_tokens = 0  # vLLM's /metrics: vllm:generation_tokens_total
        self.routes: list[str] = []  # "GET /props", "POST /tokenize", ...: every request's method and path
        self.bodies: list[dict[str, Any]] = []
        self.n_faults_served = 0
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") != f"Bearer {server.key}":
                    self._send(
                        401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}
                    )
                    return False
                return True

            def do_GET(self) -> None:  # noqa: N802
                server.routes.append(f"GET {self.path}")
                if self.path.rstrip("/").endswith("/models"):
                    if self._authorized():
                        listed = [{"id": m, "object": "model"} for m in server.models]
                        if server.dialect == "vllm":
                            listed = [dict(m, max_model_len=server.n_ctx) for m in listed]
                        self._send(200, {"object": "list", "data": listed})
                elif self.path == "/props" and server.dialect == "llama.cpp":
                    if self._authorized():
                        self._send(200, server.props())
                elif self.path == "/slots" and server.dialect == "llama.cpp":
                    busy = [
                        {"id": i, "is_processing": True, "next_token": [{"has_next_token": True, "n_decoded": n}]}
                        for i, n in enumerate(server.decoding)
                    ]
                    idle = {"id": len(busy), "is_processing": False, "next_token": [{"n_decoded": 9}]}
                    self._send(200, [*busy, idle])
                elif self.path == "/metrics" and server.dialect == "vllm":
                    text = (
                        "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
                        "# TYPE vllm:generation_tokens_total counter\n"
                        'vllm:generation_tokens_total{engine="0",model_name="m-1"} '
                        f"{float(server.generation_tokens)}\n"
                    ).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    self.wfile.write(text)
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:  # noqa: N802
                server.routes.append(f"POST {self.path}")
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self._authorized():
                    return
                if self.path in ("/apply-template", "/tokenize"):
                    answer = server.tokenizer_route(self.path, body)
                    self._send(*answer)
                    return
                with server._lock:
                    server.bodies.append(body)
                    fault = server.faults.pop(0) if server.faults else None
                    if fault:
                        server.n_faults_served += 1
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                done = [False]
                try:
                    if fault:
                        status, retry_after = fault
                        self._send(
                            status,
                            {"error": {"message": f"injected {status}"}},
                            {"retry-after": retry_after} if retry_after is not None else None,
                        )
                        return
                    if body.get("model") not in server.models:
                        self._send(404, {"error": {"message": f"The model {body.get('model')} does not exist"}})
                        return
                    refused = server.context_refusal(body)
                    if refused is not None:
                        self._send(400, refused)
                        return
                    status = server.fail_when(body)
                    if status:
                        self._send(status, {"error": {"message": f"refused with {status}"}})
                        return
                    if server.delay:
                        time.sleep(server.delay)
                    text = server.answer(body)
                    with server._lock:  # counted out before the answer leaves: the client may send the next at once
                        server.in_flight -= 1
                        done[0] = True
                    self._send(
                        200,
                        {
                            "id": "chatcmpl-1",
                            "object": "chat.completion",
                            "created": 0,
                            "model": body["model"],
                            "choices": [
                                {
                                    "index": 0,
                                    "message": {"role": "assistant", "content": text},
                                    "finish_reason": server.finish_reason,
                                }
                            ],
                            "usage": {
                                "prompt_tokens": server.prompt_tokens(body["messages"]),
                                "completion_tokens": len(text.split()),
                                "total_tokens": server.prompt_tokens(body["messages"]) + len(text.split()),
                            },
                        },
                    )
                finally:
                    if not done[0]:
                        with server._lock:
                            server.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @staticmethod
    def template(messages: list[dict[str, str]]) -> str:
        """The fake's chat template (ChatML, as the embedded Qwen models use)."""
        turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return turns + "<|im_start|>assistant\n"

    def prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        return len(self.template(messages).split())

    def props(self) -> dict[str, Any]:
        """llama-server's GET /props, cut to the fields storybias reads and a few beside them."""
        return {
            "default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": self.n_ctx, "params": {"n_predict": -1}},
            "total_slots": self.slots,
            "model_path": "model.gguf",
            "build_info": "b0-fake",
        }

    def tokenizer_route(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.dialect == "llama.cpp" and path == "/apply-template":
            return 200, {"prompt": self.template(body["messages"])}
        if self.dialect == "llama.cpp" and path == "/tokenize":
            return 200, {"tokens": list(range(len(str(body.get("content", "")).split())))}
        if self.dialect == "vllm" and path == "/tokenize":
            count = self.prompt_tokens(body["messages"])
            return 200, {"count": count, "max_model_len": self.n_ctx, "tokens": list(range(count))}
        return 404, {"error": {"message": "not found"}}

    def context_refusal(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """llama-server's answer to a prompt that does not fit a slot (server_task_result_error::to_json:
        format_error_response's code, message and type, then n_prompt_tokens and n_ctx); None when it fits."""
        n_prompt = self.prompt_tokens(body["messages"])
        if self.dialect != "llama.cpp" or n_prompt < self.n_ctx:
            return None
        message = (
            f"request ({n_prompt} tokens) exceeds the available context size ({self.n_ctx} tokens), try increasing it"
        )
        error = {"code": 400, "message": message, "type": "exceed_context_size_error"}
        return {"error": dict(error, n_prompt_tokens=n_prompt, n_ctx=self.n_ctx)}

    def chat_bodies(self) -> list[dict[str, Any]]:
        return [b for b in self.bodies if "messages" in b]
