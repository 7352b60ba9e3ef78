"""A scripted HTTP proxy on loopback that sits in front of an OpenAI-compatible server and injects faults.

Each request is identified by a row key (the text of the last message, the Responses `input`, or the first
embeddings input) and numbered per key; a script maps (key, attempt number) to what happens: forward it upstream,
answer 429/500/anything, stall past the client's timeout, send a truncated JSON body, or answer by itself
(an echo completion, a canned payload). Every attempt is recorded with its arrival and finish times, and the proxy
tracks the most requests it ever had in flight (a stalled request counts until its stall ends, even after the
client gave up on it).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Forward:
    """Pass the request to the upstream server (after `delay_s`)."""

    delay_s: float = 0.0


@dataclass(frozen=True)
class Respond:
    """Answer with this status, JSON body (dict) or raw bytes, and headers."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Stall:
    """Hold the request for `seconds` (past the client's timeout), then answer 504 to whoever is still there."""

    seconds: float


@dataclass(frozen=True)
class Malformed:
    """A 200 with `content-type: application/json` and a body cut off mid-object."""


@dataclass(frozen=True)
class Echo:
    """Answer by itself with a chat completion whose text is `echo:<row key>`, after `delay_s`."""

    delay_s: float = 0.0


@dataclass(frozen=True)
class Reply:
    """Answer 200 with the JSON that `make(request_body)` builds (canned Responses or embeddings payloads)."""

    make: Callable[[dict[str, Any]], dict[str, Any]]


Action = Forward | Respond | Stall | Malformed | Echo | Reply
Script = Callable[[str, int], Action]


@dataclass
class Attempt:
    key: str
    number: int  # 1 for the first request with this key
    path: str
    action: str
    arrived: float  # time.time() when the request was read
    finished: float | None = None  # when the answer was written (or the stall ended)
    status: int | None = None
    authorization: str | None = None
    body: Any = None  # the JSON the client sent
    headers: dict[str, str] = field(default_factory=dict)  # every request header, names in lower case


def row_key(body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    if isinstance(body.get("messages"), list) and body["messages"]:
        content = body["messages"][-1].get("content")
        return content if isinstance(content, str) else json.dumps(content)
    value = body.get("input")
    if isinstance(value, list) and value:
        if isinstance(value[-1], dict):  # Responses API messages: the last one's text
            content = value[-1].get("content")
            return content if isinstance(content, str) else json.dumps(content)
        return str(value[0])  # embeddings: the batch's first text
    return value if isinstance(value, str) else ""


def echo_completion(key: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-echo-{abs(hash(key)) % 10**8}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "echo"),
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": f"echo:{key}"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": len(key.split()), "completion_tokens": 1, "total_tokens": len(key.split()) + 1},
    }


class FaultProxy:
    def __init__(self, script: Script, upstream: str | None = None):
        """`upstream`: the real server's root, e.g. http://127.0.0.1:8080 (request paths are kept as sent)."""
        self.script = script
        self.upstream = upstream.rstrip("/") if upstream else None
        self.attempts: list[Attempt] = []
        self.max_in_flight = 0
        self._in_flight = 0
        self._counts: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._server.request_queue_size = 64
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        """The OpenAI base_url clients use."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def attempts_for(self, key: str) -> list[Attempt]:
        with self._lock:
            return [a for a in self.attempts if a.key == key]

    # -- request handling ------------------------------------------------------------------------------------------
    def _begin(self, key: str, path: str, authorization: str | None, body: Any,
               headers: dict[str, str] | None = None) -> Attempt:
        with self._lock:
            self._counts[key] += 1
            attempt = Attempt(key, self._counts[key], path, "", time.time(), authorization=authorization, body=body,
                              headers=headers or {})
            self.attempts.append(attempt)
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            return attempt

    def _end(self, attempt: Attempt, status: int) -> None:
        with self._lock:
            attempt.finished = time.time()
            attempt.status = status
            self._in_flight -= 1

    def _forward(self, path: str, raw: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if self.upstream is None:
            raise RuntimeError("Forward used on a FaultProxy without an upstream")
        request = urllib.request.Request(self.upstream + path, data=raw, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=120) as resp:
                return resp.status, {"content-type": resp.headers.get("content-type", "application/json")}, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, {"content-type": err.headers.get("content-type", "application/json")}, err.read()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up on this attempt (timeout): expected for Stall

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                key = row_key(body)
                attempt = proxy._begin(key, self.path, self.headers.get("authorization"), body,
                                       {k.lower(): v for k, v in self.headers.items()})
                action = proxy.script(key, attempt.number)
                attempt.action = type(action).__name__
                status = 500
                try:
                    status = self._act(action, key, body, raw)
                finally:
                    proxy._end(attempt, status)

            def _act(self, action: Action, key: str, body: Any, raw: bytes) -> int:
                json_type = {"content-type": "application/json"}
                if isinstance(action, Forward):
                    time.sleep(action.delay_s)
                    headers = {"content-type": "application/json"}
                    if self.headers.get("authorization"):
                        headers["authorization"] = self.headers["authorization"]
                    status, out_headers, out = proxy._forward(self.path, raw, headers)
                    self._send(status, out, out_headers)
                    return status
                if isinstance(action, Respond):
                    payload = action.body if isinstance(action.body, bytes) else json.dumps(action.body).encode()
                    self._send(action.status, payload, {**json_type, **action.headers})
                    return action.status
                if isinstance(action, Stall):
                    time.sleep(action.seconds)
                    self._send(504, b'{"error": {"message": "stalled"}}', json_type)
                    return 504
                if isinstance(action, Malformed):
                    self._send(200, b'{"id": "chatcmpl-cut", "object": "chat.completion", "choices": [{"ind', json_type)
                    return 200
                if isinstance(action, Echo):
                    time.sleep(action.delay_s)
                    self._send(200, json.dumps(echo_completion(key, body or {})).encode(), json_type)
                    return 200
                if isinstance(action, Reply):
                    self._send(200, json.dumps(action.make(body or {})).encode(), json_type)
                    return 200
                raise TypeError(f"unknown action {action!r}")

            def do_GET(self) -> None:
                if proxy.upstream is None:
                    self._send(200, b'{"object": "list", "data": []}', {"content-type": "application/json"})
                    return
                with urllib.request.urlopen(proxy.upstream + self.path, timeout=10) as resp:
                    self._send(resp.status, resp.read(), {"content-type": "application/json"})

        return Handler
