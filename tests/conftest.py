"""What every sentinel the suite starts shares.

The incident chart is drawn by a child process that imports matplotlib (about a second of
CPU on CI's machine) for each critical incident, and sentinel waits for it when it ends:
across the few hundred tests that stop a job, that was a fifth of the suite's time. The
suite turns it off by default, in this process and in every sentinel it starts (they inherit
the environment); the tests of the chart turn it back on (tests/actions/test_incident_files.py,
tests/e2e/test_evidence_live.py).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("SENTINEL_EVIDENCE__CHART", "false")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the longest tests first, so that on every core they overlap the short ones.

    Collected in file order, the real framework jobs of ``tests/e2e`` (20 to 60 s each)
    came last and ran one after the other while the other workers sat idle: a tail of
    two minutes. ``--dist load`` (addopts) hands the tests out in this order, one at a
    time round the workers; the sort is stable, so files keep their own order.
    """
    items.sort(key=_expected_length)


def _expected_length(item: pytest.Item) -> int:
    """0 for a real framework job, 1 for another slow test, 2 for the rest."""
    if "e2e" in item.path.parts:
        return 0
    return 1 if item.get_closest_marker("slow") is not None else 2
