"""A tiny OpenAI-compatible chat-completions server for the fast tests (stdlib only, loopback):
scripted answers, injected HTTP errors, a key check and a model list; it records every request body.

The slow tests use the real vLLM server instead (tests/test_served_slow.py)."""

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
    ):
        self.key, self.models = key, list(models)
        self.faults = list(faults or [])
        self.answer = answer or (lambda body: "A short answer.")
        self.fail_when = fail_when or (lambda body: None)
        self.delay = delay
        self.finish_reason = finish_reason
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
                if self.path.rstrip("/").endswith("/models"):
                    if self._authorized():
                        self._send(
                            200, {"object": "list", "data": [{"id": m, "object": "model"} for m in server.models]}
                        )
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self._authorized():
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
                                "prompt_tokens": 21,
                                "completion_tokens": len(text.split()),
                                "total_tokens": 21 + len(text.split()),
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

    def chat_bodies(self) -> list[dict[str, Any]]:
        return [b for b in self.bodies if "messages" in b]
