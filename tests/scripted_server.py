"""A small OpenAI chat-completions server on localhost whose replies come from a test's script.

It speaks the real protocol over real HTTP (``GET /v1/models``, ``POST /v1/chat/completions``) so
rlkit's endpoint policy is exercised through the ``openai`` client exactly as against vLLM or a
hosted teacher. ``reply(request) -> dict`` returns either an assistant message (``content`` and/or
``tool_calls`` with ``name`` and ``arguments`` dict), ``{"status": 500}`` for an HTTP error (``"headers":
{"Retry-After": "1"}`` adds response headers),
``{"sleep": seconds, ...}`` to answer late, or ``{"trickle": seconds, ...}`` to send the answer one byte
every ``seconds`` (a server that never times out a read), or ``{"raw": text, "content_type": ...}`` to send a
body that is not a chat completion (an HTML error page: ``text/html``; broken JSON: ``application/json``). Like vLLM, it answers 404 to a request for a
model it does not serve. rlkit's preflight request goes to ``preflight`` (default: answer "OK") and is
kept in ``preflights``, not in ``requests``, so a test's script sees only episode requests.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rlkit.agents.endpoint import PREFLIGHT_PROMPT


class ScriptedServer:
    def __init__(self, reply: Callable[[dict[str, Any]], dict[str, Any]], model: str = "scripted-teacher",
                 preflight: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        self.reply, self.model = reply, model
        self.preflight = preflight or (lambda body: {"content": "OK"})
        self.requests: list[dict[str, Any]] = []
        self.preflights: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model",
                                                                 "created": 0, "owned_by": "test"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if body.get("model") != server.model:
                    self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                               "type": "NotFoundError"}})
                    return
                if body["messages"] == [{"role": "user", "content": PREFLIGHT_PROMPT}]:
                    server.preflights.append(body)
                    script = server.preflight(body)
                else:
                    server.requests.append(body)
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    script = server.reply(body)
                if script.get("sleep"):
                    time.sleep(script["sleep"])
                if "raw" in script:
                    self._send(200, script["raw"], content_type=script.get("content_type", "text/html"))
                    return
                if script.get("status", 200) != 200:
                    self._send(script["status"], {"error": {"message": script.get("message", "scripted failure"),
                                                           "type": "server_error"}}, headers=script.get("headers"))
                    return
                self._send(200, server.completion(body, script), trickle=script.get("trickle"))

            def _send(self, status: int, payload: dict[str, Any] | str, trickle: float | None = None,
                      content_type: str = "application/json", headers: dict[str, str] | None = None) -> None:
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if trickle:
                        for i in range(len(data)):
                            self.wfile.write(data[i:i + 1])
                            self.wfile.flush()
                            time.sleep(trickle)
                    else:
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def completion(self, request: dict[str, Any], script: dict[str, Any]) -> dict[str, Any]:
        calls = [{"id": f"call_{len(self.requests)}_{i}", "type": "function",
                  "function": {"name": c["name"], "arguments": c["arguments"] if isinstance(c["arguments"], str)
                               else json.dumps(c["arguments"])}}
                 for i, c in enumerate(script.get("tool_calls", []))]
        message = {"role": "assistant", "content": script.get("content")}
        if "reasoning" in script:  # vLLM's reasoning parser puts thinking here
            message["reasoning"] = script["reasoning"]
        if calls:
            message["tool_calls"] = calls
        # Deterministic usage: 10 prompt tokens per request message, 1 completion token per 4 characters.
        prompt_tokens = 10 * len(request["messages"])
        completion_tokens = max(1, len(json.dumps(message)) // 4)
        return {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 0,
                "model": request["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else script.get("finish_reason", "stop")}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
