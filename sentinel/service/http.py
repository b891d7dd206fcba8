"""The ``--http`` endpoints: ``/metrics``, ``/livez``, ``/readyz`` (and ``/healthz``).

A small ``ThreadingHTTPServer`` on a daemon thread of its own, so a slow scraper
never holds the detection loop. The probes speak only of sentinel itself:

- ``/livez`` (and its alias ``/healthz``): the detection loop turned within
  ``live_within_s``. 503 means sentinel is wedged: restart it.
- ``/readyz``: the config is loaded, the state dir is usable and HTTP answers, so
  sentinel can do its work. It never waits for the job: a native sidecar's startup
  probe gates the trainer's start, so waiting for the job would deadlock the pod. It does
  wait for a stop a killed sentinel left unfinished (at most the rest of its grace, then
  the rollback: ``supervisor.core``).

Neither probe ever reflects the job's health: a NaN in the job must never get
the kubelet to restart its watchdog. The job's state is in ``/metrics``
(``sentinel_target_up``, ``sentinel_incidents_active``...). ``?verbose`` lists each
check for a person, as the Kubernetes API server does.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from prometheus_client.exposition import choose_encoder

from sentinel.config.addresses import DEFAULT_HOST, CannotListen, parse_http_address
from sentinel.service.metrics import Metrics

__all__ = ["DEFAULT_HOST", "CannotListen", "HealthServer", "parse_http_address", "state_dir_usable"]

log = logging.getLogger(__name__)

Check = Callable[[], bool]

_LANDING_PAGE = b"""<!doctype html>
<html><head><title>sentinel</title></head><body>
<h1>sentinel</h1>
<p><a href="/metrics">/metrics</a> (Prometheus), <a href="/livez?verbose">/livez</a>
(the detection loop turns), <a href="/readyz?verbose">/readyz</a> (sentinel is ready).
Neither probe reflects the training job's health.</p>
</body></html>
"""


def state_dir_usable(path: str | os.PathLike[str]) -> Check:
    """A readiness check: ``path`` is a directory sentinel can write in."""
    directory = Path(path)

    def check() -> bool:
        return directory.is_dir() and os.access(directory, os.W_OK | os.X_OK)

    return check


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    health: HealthServer


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class HealthServer:
    """Serves ``metrics`` and the probes on ``address`` (``ADDR:PORT``) until :meth:`stop`.

    ``live_within_s``: how long the loop may go without a turn before ``/livez``
    answers 503 (the supervisor's bound is 3 x tick + 5 s). ``ready_checks`` are
    named checks that ``/readyz`` runs besides its own: that :meth:`set_ready` was
    called once config and state were loaded. ``live_checks`` are more for
    ``/livez`` (for example, that no source's thread has died): checks of sentinel,
    never of the job. ``poll_interval_s`` bounds how long :meth:`stop` waits for the
    serving thread to notice.
    """

    def __init__(
        self,
        metrics: Metrics,
        address: str = f"{DEFAULT_HOST}:0",
        *,
        live_within_s: float,
        ready_checks: Mapping[str, Check] | None = None,
        live_checks: Mapping[str, Check] | None = None,
        poll_interval_s: float = 0.5,
    ) -> None:
        self.metrics = metrics
        self.live_within_s = live_within_s
        self._ready_checks = dict(ready_checks or {})
        self._live_checks = dict(live_checks or {})
        self._ready = False
        host, port = parse_http_address(address)
        server_class = _IPv6Server if ":" in host else _Server
        try:
            self._server = server_class((host, port), _Handler, bind_and_activate=True)
        except OSError as error:  # the port is taken, the name does not resolve...
            why = error.strerror or str(error)
            raise CannotListen(error.errno, f"cannot listen at {address}: {why}") from None
        self._server.health = self
        self._poll_interval_s = poll_interval_s
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The bound host and port (the port picked when 0 was asked)."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def start(self) -> None:
        """Serve on a daemon thread of its own."""
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(self._poll_interval_s,),
            name="http",
            daemon=True,
        )
        self._thread.start()
        log.info("serving /metrics, /livez and /readyz on %s", self.url)

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def set_ready(self, ready: bool = True) -> None:
        """Config and state are loaded: sentinel can do its work (``/readyz``)."""
        self._ready = ready

    def liveness(self) -> dict[str, bool]:
        """Each check of ``/livez`` and whether it passes."""
        checks = {"loop": self.metrics.loop_idle_s() < self.live_within_s}
        checks.update(_run(self._live_checks))
        return checks

    def readiness(self) -> dict[str, bool]:
        """Each check of ``/readyz`` and whether it passes."""
        checks = {"config": self._ready}
        checks.update(_run(self._ready_checks))
        checks["http"] = True  # it is answering
        return checks


def _run(checks: Mapping[str, Check]) -> dict[str, bool]:
    results = {}
    for name, check in checks.items():
        try:
            results[name] = bool(check())
        except Exception:
            log.exception("health check %s raised", name)
            results[name] = False
    return results


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "sentinel"

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        health = self.server.health
        if url.path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._reply(200, encoder(health.metrics.registry), content_type)
        elif url.path in ("/livez", "/healthz"):
            self._probe(url.path, health.liveness(), verbose="verbose" in url.query)
        elif url.path == "/readyz":
            self._probe(url.path, health.readiness(), verbose="verbose" in url.query)
        elif url.path == "/":
            self._reply(200, _LANDING_PAGE, "text/html; charset=utf-8")
        else:
            self._reply(404, b"not found\n", "text/plain; charset=utf-8")

    def _probe(self, path: str, checks: dict[str, bool], *, verbose: bool) -> None:
        ok = all(checks.values())
        lines = (
            [
                f"[{'+' if passed else '-'}]{name} {'ok' if passed else 'failed'}"
                for name, passed in checks.items()
            ]
            if verbose
            else []
        )
        lines.append(f"{path.lstrip('/')} {'ok' if ok else 'failed'}")
        self._reply(200 if ok else 503, ("\n".join(lines) + "\n").encode(), "text/plain")

    def _reply(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s " + format, self.address_string(), *args)
