"""The README's quickstarts, followed as written: each command line is read out of the README
and run in a fresh folder holding what the quickstart says it needs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.env import clean_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _command_of(section: str) -> str:
    """The one command block of the README's section ``section``."""
    from tests.helpers.manual import section as manual_section

    body = manual_section(section)
    blocks = re.findall(r"```\n(.*?)\n```", body, flags=re.S)
    assert len(blocks) == 1, blocks
    return blocks[0].strip()


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="needs torch: pip install '.[torch]' (CPU build)",
)
def test_the_plain_loop_quickstart_as_written(tmp_path: Path) -> None:
    command = _command_of("Quickstart: a plain PyTorch loop")
    assert command == "NAN_AT=30 sentinel run --checkpoints ckpt -- python examples/plain_loop.py"
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    sentinel = shutil.which("sentinel")
    assert sentinel is not None, "the install puts sentinel on PATH"
    env = clean_env(SENTINEL_JOB__RESTART_BACKOFF_S="0.1")  # the 5 s backoff, shortened
    env["PATH"] = f"{Path(sentinel).parent}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # What the loop saved from step 30 on (before the stop reached it) is set aside; the
    # checkpoints before the NaN stay.
    aside = [p.name for p in (tmp_path / "ckpt" / "quarantine").glob("*/*.pt")]
    assert all(int(name[5:-3]) >= 30 for name in aside), aside
    assert (tmp_path / "ckpt" / "step_20.pt").is_file()
    assert "resumed from" in result.stderr and "step_20.pt (step 20)" in result.stderr
    assert "recovered" in result.stderr
    report = re.search(r"^Report: (.+\.md)$", result.stderr, flags=re.M)
    assert report is not None and (tmp_path / report.group(1)).is_file(), result.stderr[-2000:]
    journal = (tmp_path / ".sentinel" / "alerts.jsonl").read_text().splitlines()
    alerts = [json.loads(line) for line in journal]
    assert [a["step"] for a in alerts if a["rule"] == "nan_inf"] == [30]
