"""sentinel: a watchdog sidecar for ML training jobs."""

from __future__ import annotations

__version__ = "0.1.0"
