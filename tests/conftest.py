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

os.environ.setdefault("SENTINEL_EVIDENCE__CHART", "false")
