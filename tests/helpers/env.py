"""The environment a test's own sentinel runs in."""

from __future__ import annotations

import os


def without_settings() -> dict[str, str]:
    """This process's environment without any ``SENTINEL_*`` setting (for a test of how
    settings are read, or of what a job is handed)."""
    return {key: value for key, value in os.environ.items() if not key.startswith("SENTINEL_")}


def clean_env(**extra: str) -> dict[str, str]:
    """``without_settings``, so a sentinel started with it reads only the test's own, and
    with the incident chart off (as tests/conftest.py sets it for the rest of the suite: a
    drawing child per critical incident, waited for at exit); ``extra`` on top."""
    env = without_settings()
    env["SENTINEL_EVIDENCE__CHART"] = "false"
    env.update(extra)
    return env
