"""What every sentinel the suite starts shares.

The incident chart is drawn by a child process that imports matplotlib (about a second of
CPU on CI's machine) for each critical incident, and sentinel waits for it when it ends:
across the few hundred tests that stop a job, that was a fifth of the suite's time. The
suite turns it off by default, in this process and in every sentinel it starts (they inherit
the environment); the tests of the chart turn it back on (tests/actions/test_incident_files.py,
tests/e2e/test_evidence_live.py).

The real framework jobs of tests/e2e run torch on a tiny model. With one intra-op thread per
core (torch's default) and the suite's workers on every core, torch's threads spin against
each other: the HF Trainer rollback took 102 s in the suite against 27 s alone. Every job
the suite starts runs torch single-threaded (they inherit the environment).

Most of the suite's time is real child processes waiting on real timeouts, not CPU: on a
2-core machine a third worker cut the suite from 6 min 28 s to 5 min 50 s (``-n auto``
means at least 3 workers here; ``pytest -n 0`` runs it in one process).

The README installs the test environment with ``uv pip install``, which (like ``pip install
--no-compile``) does not byte-compile at install: compiling all of torch and transformers
was 100 s of CI's 160 s pip install, and the suite imports a small part of them. Python
compiles a module when it is first imported and keeps the result, unless
PYTHONDONTWRITEBYTECODE is set; then every job and every sentinel the suite starts (a few
hundred, several importing torch) would compile again from source. The suite writes the byte
code, in this process and in what it starts.
"""

from __future__ import annotations

import os
import sys

os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

os.environ.setdefault("SENTINEL_EVIDENCE__CHART", "false")
for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")


def pytest_xdist_auto_num_workers(config: object) -> int:
    """``-n auto``: a worker per core, and at least 3 (see the module's docstring)."""
    return max(3, os.cpu_count() or 1)
