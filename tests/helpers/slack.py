"""A Slack incoming webhook stand-in on 127.0.0.1, and a route to it for apprise's requests.

apprise's Slack plugin always posts to ``https://hooks.slack.com/services/...``;
no URL parameter changes that host. So the interception is at the HTTP layer:
``slack_routed_to(receiver)`` mounts a ``requests`` transport adapter, on every
``requests.Session`` made while it is active, that sends requests for
``https://hooks.slack.com/`` to the receiver instead. The plugin, its payload
and the HTTP exchange are all real; only the destination address changes. The
receiver answers ``200 ok`` as Slack's webhook does (the plugin checks the body).

    with SlackReceiver() as slack, slack_routed_to(slack):
        send_envelope("slack://T1/B1/C1", envelope, 5.0)
        (payload,) = slack.wait_for(1)
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

SLACK_WEBHOOK_PREFIX = "https://hooks.slack.com/"


@dataclass(frozen=True)
class SlackPost:
    """One POST as it arrived: the path (``/services/T/B/C``) and the JSON payload."""

    path: str
    payload: Any


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    receiver: SlackReceiver


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.receiver._record(SlackPost(self.path, json.loads(body)))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        """Keep request lines off stderr."""


class SlackReceiver:
    """An HTTP server on 127.0.0.1 that answers like Slack's webhook and records payloads."""

    def __init__(self) -> None:
        self.posts: list[SlackPost] = []
        self._condition = threading.Condition()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.receiver = self
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def wait_for(self, count: int, timeout: float = 5.0) -> list[SlackPost]:
        """Block until ``count`` posts have arrived; fail after ``timeout`` seconds."""
        with self._condition:
            if not self._condition.wait_for(lambda: len(self.posts) >= count, timeout):
                raise AssertionError(f"expected {count} posts within {timeout}s: {self.posts}")
            return list(self.posts)

    def _record(self, post: SlackPost) -> None:
        with self._condition:
            self.posts.append(post)
            self._condition.notify_all()

    def __enter__(self) -> SlackReceiver:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _Reroute(HTTPAdapter):
    """A transport adapter that sends each request to ``base_url``, keeping path and query."""

    def __init__(self, base_url: str) -> None:
        super().__init__()
        self._base_url = base_url

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float | None, float | None] | None = None,
        verify: bool | str = True,
        cert: str | tuple[str, str] | None = None,
        proxies: dict[str, str] | None = None,
    ) -> requests.Response:
        parts = urlsplit(request.url or "")
        request.url = self._base_url + parts.path + (f"?{parts.query}" if parts.query else "")
        return super().send(request, stream, timeout, verify, cert, proxies)


@contextmanager
def slack_routed_to(receiver: SlackReceiver) -> Iterator[None]:
    """While active, requests for ``https://hooks.slack.com/`` go to ``receiver``."""
    original: Callable[..., None] = requests.Session.__init__

    @functools.wraps(original)
    def init(self: requests.Session, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.mount(SLACK_WEBHOOK_PREFIX, _Reroute(receiver.base_url))

    requests.Session.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        requests.Session.__init__ = original  # type: ignore[method-assign]
