"""The committed tests/fixtures/tb/diverge/ is what its generator makes, here and now.

``tests/fixtures/make_tb_events.py`` trains a small numpy MLP that really
diverges and writes the scalars with tensorboard's own ``EventFileWriter``.
It needs only numpy and tensorboard (both in the test venv), so this test
re-runs it in a child process and checks the regenerated event file and
``expected.json`` against the committed ones.  A change in tensorboard's
writer or reader, or in numpy's float32 arithmetic, shows up here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.util import tensor_util

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GENERATOR = FIXTURES / "make_tb_events.py"
COMMITTED = FIXTURES / "tb" / "diverge"
# Versions are facts about the run that made the file, not about its content.
VERSION_KEYS = {"numpy", "tensorboard", "python"}


def decode(path: Path) -> tuple[list[str], list[tuple[int, float, str, float]]]:
    """(file_version of the first event, [(step, wall_time, tag, value)] of every scalar)."""
    versions: list[str] = []
    scalars: list[tuple[int, float, str, float]] = []
    for event in EventFileLoader(str(path)).Load():
        if event.HasField("file_version"):
            versions.append(event.file_version)
        for value in event.summary.value:
            if value.HasField("simple_value"):
                number = float(value.simple_value)
            else:
                number = float(tensor_util.make_ndarray(value.tensor).item())
            scalars.append((event.step, event.wall_time, value.tag, number))
    return versions, scalars


def same_number(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=0.0)


def same_json(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return same_number(a, b)
    return type(a) is type(b) and a == b


def only_event_file(folder: Path) -> Path:
    files = sorted(folder.glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    return files[0]


@pytest.mark.slow
def test_regenerated_tb_events_match_the_committed_fixture(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(GENERATOR), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

    committed_file = only_event_file(COMMITTED)
    fresh_file = only_event_file(tmp_path)
    assert fresh_file.name == committed_file.name

    committed_versions, committed = decode(committed_file)
    fresh_versions, fresh = decode(fresh_file)
    assert committed_versions == fresh_versions == ["brain.Event:2"]
    assert len(fresh) == len(committed) == 600
    assert [(s, w, t) for s, w, t, _ in fresh] == [(s, w, t) for s, w, t, _ in committed]
    diffs = [
        (c[0], c[2], c[3], f[3])
        for c, f in zip(committed, fresh, strict=True)
        if not same_number(c[3], f[3])
    ]
    assert not diffs, diffs[:10]

    committed_exp = json.loads((COMMITTED / "expected.json").read_text())
    fresh_exp = json.loads((tmp_path / "expected.json").read_text())
    for exp in (committed_exp, fresh_exp):
        for key in VERSION_KEYS:
            exp.pop(key)
    assert same_json(fresh_exp, committed_exp), (fresh_exp, committed_exp)


def test_committed_expected_json_agrees_with_the_committed_events() -> None:
    expected = json.loads((COMMITTED / "expected.json").read_text())
    _, scalars = decode(only_event_file(COMMITTED))
    values: dict[tuple[int, str], float] = {(s, t): v for s, _, t, v in scalars}
    first = expected["first_nonfinite_step"]
    metric = expected["metric"]
    # everything is finite before the first non-finite step, and that step's metric is not
    assert all(math.isfinite(v) for (s, _), v in values.items() if s < first)
    assert not math.isfinite(values[(first, f"train/{metric}")])
    # the LR was raised before the blow-up and no value was injected: the grad norm
    # grew step by step from the raise to the first non-finite value
    assert expected["lr_raised_at_step"] < first
    norms = [values[(s, "train/grad_norm")] for s in range(expected["lr_raised_at_step"], first)]
    assert norms == sorted(norms)
    assert norms[-1] > 1000 * norms[0]
    recorded = [v for _, v in expected["grad_norm_before_first_nonfinite"]]
    start = first - len(recorded)
    assert recorded == [values[(s, "train/grad_norm")] for s in range(start, first)]
