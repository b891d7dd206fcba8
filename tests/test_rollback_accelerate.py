"""A real accelerate job rolled back under ``sentinel run``, then resumed by its own
``load_state()``.

accelerate's automatic checkpoint naming takes every entry of ``checkpoints/`` for one of its
``checkpoint_<i>`` folders, sorted by the number in its name: a ``quarantine/`` or
``.sentinel-kept/`` there made the resumed job's ``load_state()`` fail on an IndexError, and
sentinel gave up on a job it had rolled back correctly. Sentinel's own folders for such a dir
are beside it, in ``checkpoints.sentinel/``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sentinel.checkpoints.keep import KEPT_DIR
from sentinel.checkpoints.scan import QUARANTINE_DIR
from tests.helpers.cli import run_job

pytestmark = pytest.mark.slow

JOB = Path(__file__).parent / "e2e" / "accelerate_job.py"


def test_an_accelerate_job_resumes_its_clean_save_by_load_state_and_finishes(
    tmp_path: Path,
) -> None:
    pytest.importorskip("accelerate")
    project, state, starts = tmp_path / "project", tmp_path / "state", tmp_path / "starts.jsonl"
    saves = project / "checkpoints"
    result = run_job(saves, state, sys.executable, JOB, project, starts, max_restarts=2)
    assert result.returncode == 0, result.stderr[-3000:]
    begun = [json.loads(line) for line in starts.read_text().splitlines()]
    assert len(begun) == 2, begun
    # The NaN batch is step 33, logged at 35: the restart resumes a save from before it,
    # from a checkpoints/ that holds accelerate's folders and nothing else.
    assert 0 < begun[1]["step"] <= 30, begun
    assert all(name.startswith("checkpoint_") for name in begun[1]["entries"]), begun
    assert all(p.name.startswith("checkpoint_") for p in saves.iterdir())
    own = project / "checkpoints.sentinel"
    quarantined = [p.name for folder in (own / QUARANTINE_DIR).iterdir() for p in folder.iterdir()]
    assert any(name.startswith("checkpoint_") for name in quarantined), quarantined
    assert (own / KEPT_DIR).is_dir()
    assert "Result: the job finished with exit status 0 after 1 restart(s)" in result.stderr
