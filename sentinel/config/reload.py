"""SIGHUP: read the config again; keep the running one, and say why, when the new one is bad."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sentinel.config import ConfigError, Settings

log = logging.getLogger(__name__)

#: What a running sentinel cannot take over: its sources and its own places.
NEEDS_RESTART = ("logs", "checkpoints", "state_dir", "http", "tail", "gpu", "process", "watch")


def reloaded(current: Settings, load: Callable[[], Settings] | None) -> Settings | None:
    """The new settings, or None (logged) when there are none or they are invalid."""
    if load is None:
        log.warning("SIGHUP: no config to reload")
        return None
    try:
        settings = load()
    except ConfigError as error:
        log.error(
            "SIGHUP: the new config is invalid, keeping the running one: %s",
            "; ".join(error.problems),
        )
        return None
    changed = [key for key in NEEDS_RESTART if getattr(settings, key) != getattr(current, key)]
    if changed:
        log.warning(
            "SIGHUP: %s changed: that takes effect when sentinel restarts", ", ".join(changed)
        )
    log.info("SIGHUP: config reloaded")
    return settings
