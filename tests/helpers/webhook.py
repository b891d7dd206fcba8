"""A real HTTP webhook receiver on 127.0.0.1 for tests.

It records every POST (and GET, as a heartbeat ping is), can answer with chosen
error statuses, hang before answering, or stop listening and start again on the
same port, so "endpoint down, then up" is a real refused connection followed by
a real server.

    with WebhookReceiver() as hook:
        notifier = Notifier(Outbox(store, [hook.url]))
        ...
        (request,) = hook.wait_for(1, timeout=5)
        assert request.json["title"] == "NaN in loss"
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as it arrived, when (epoch seconds), and the status it was answered with."""

    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    status: int
    received_at: float
    method: str = "POST"

    @property
    def accepted(self) -> bool:
        return 200 <= self.status < 300


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True  # SO_REUSEADDR: rebind the same port after stop()
    daemon_threads = True
    block_on_close = False
    receiver: WebhookReceiver


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self._answer(self.rfile.read(length))

    def do_GET(self) -> None:
        self._answer(b"")

    def _answer(self, body: bytes) -> None:
        status, extra_headers, delay_s = self.server.receiver._record(self, body)
        if delay_s > 0:
            self.server.receiver._release.wait(delay_s)
        self.send_response(status)
        for name, value in extra_headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Keep request lines off stderr."""


class WebhookReceiver:
    """An HTTP server on a fixed free port of 127.0.0.1 that records POSTs and GETs."""

    def __init__(self, *, listening: bool = True) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self.requests: list[ReceivedRequest] = []
        #: Seconds to hold each answer (a hanging endpoint); release() ends the wait.
        self.delay_s = 0.0
        self._condition = threading.Condition()
        self._planned: deque[tuple[int, dict[str, str]]] = deque()
        self._release = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        if listening:
            self.start()

    @property
    def url(self) -> str:
        """The apprise URL of this receiver."""
        return f"json://127.0.0.1:{self.port}/hook"

    def http_url(self, path: str = "/") -> str:
        """A plain URL of this receiver (for ``requests``, e.g. a heartbeat ping)."""
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def listening(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Listen (again) on the same port."""
        if self._server is not None:
            return
        self._release.clear()
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.receiver = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop listening; connections are refused until start()."""
        server, self._server = self._server, None
        if server is None:
            return
        self._release.set()
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def respond(self, status: int, times: int = 1, headers: dict[str, str] | None = None) -> None:
        """Answer the next ``times`` requests with ``status`` (and headers), then 200 again.

        ``respond(429, 2, {"Retry-After": "1"})`` rate-limits the next two requests.
        """
        with self._condition:
            self._planned.extend([(status, dict(headers or {}))] * times)

    def release(self) -> None:
        """Answer requests held by ``delay_s`` now, and hold no more."""
        self.delay_s = 0.0
        self._release.set()

    def wait_for(
        self, count: int, timeout: float = 5.0, *, accepted_only: bool = True
    ) -> list[ReceivedRequest]:
        """Block until ``count`` requests (2xx-answered ones by default) have arrived."""

        def matching() -> list[ReceivedRequest]:
            return [r for r in self.requests if r.accepted or not accepted_only]

        with self._condition:
            if not self._condition.wait_for(lambda: len(matching()) >= count, timeout):
                raise AssertionError(
                    f"expected {count} requests within {timeout}s, got {len(matching())}:"
                    f" {[r.status for r in self.requests]}"
                )
            return matching()

    @property
    def accepted(self) -> list[ReceivedRequest]:
        with self._condition:
            return [r for r in self.requests if r.accepted]

    def _record(
        self, handler: BaseHTTPRequestHandler, body: bytes
    ) -> tuple[int, dict[str, str], float]:
        try:
            parsed: Any = json.loads(body) if body else None
        except ValueError:
            parsed = None
        with self._condition:
            status, headers = self._planned.popleft() if self._planned else (200, {})
            self.requests.append(
                ReceivedRequest(
                    handler.path,
                    dict(handler.headers.items()),
                    body,
                    parsed,
                    status,
                    time.time(),
                    handler.command,
                )
            )
            self._condition.notify_all()
        return status, headers, self.delay_s

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
