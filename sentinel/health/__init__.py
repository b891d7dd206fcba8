"""sentinel's own health and metrics: Prometheus series, ``/livez``, ``/readyz``.

:class:`Metrics` holds the series the loop updates; :class:`HealthServer` serves them
with the probes (``--http``); :meth:`Metrics.write_textfile` writes them for
node_exporter's textfile collector (``--metrics-textfile``). Both speak of sentinel
itself: the job's health is in the series, never in a probe.
"""

from __future__ import annotations

from sentinel.health.metrics import Metrics
from sentinel.health.server import HealthServer, parse_http_address, state_dir_usable

__all__ = ["HealthServer", "Metrics", "parse_http_address", "state_dir_usable"]
