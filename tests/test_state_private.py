"""The state dir is sentinel's alone: 0700, its files 0600, and one sentinel at a time.

Real ``sentinel run`` processes: one that catches a NaN (so that every kind of state
file gets written) under a umask of 0, and two on the same state dir.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sentinel.store.lock import holder
from sentinel.store.state import StateStore, open_private, private_dir
from tests.helpers.env import clean_env

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 30.0

# Healthy steps, then a NaN, then it hangs on: sentinel must stop it.
NAN_JOB = textwrap.dedent(
    """
    import json, time
    for step in range(1, 9):
        loss = float("nan") if step == 6 else 2.0 - step / 100
        print(json.dumps({"step": step, "loss": loss, "grad_norm": 1.0}), flush=True)
        if step == 6:
            time.sleep(60)
        time.sleep(0.01)
    """
)


def modes(root: Path) -> dict[str, int]:
    """Each path under ``root`` (and root itself, as ".") with its permission bits."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def env() -> dict[str, str]:
    return clean_env()


def test_private_dir_and_files_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        private_dir(tmp_path / "a" / "st")
        os.close(open_private(tmp_path / "a" / "st" / "f", os.O_WRONLY))
        StateStore(tmp_path / "a" / "st").close()
    finally:
        os.umask(old)
    assert modes(tmp_path / "a" / "st") == {".": 0o700, "f": 0o600, "state.db": 0o600}


def test_a_looser_state_dir_and_its_files_are_tightened_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "st"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    for name in ("state.db", "state.db-wal"):
        (state / name).touch()
        os.chmod(state / name, 0o644)
    StateStore(state).close()
    assert modes(state)["."] == 0o700
    assert {mode for name, mode in modes(state).items() if name != "."} == {0o600}
    assert f"state dir {state} was 0755, open to others: made it 0700" in caplog.text
    assert f"{state / 'state.db'} was 0644, open to others: made it 0600" in caplog.text
    caplog.clear()
    StateStore(state).close()
    assert caplog.text == ""  # private already: nothing to say


@pytest.mark.slow
def test_a_real_run_leaves_only_private_state_even_with_umask_0(tmp_path: Path) -> None:
    state = tmp_path / "st"
    state.mkdir()
    os.chmod(state, 0o777)  # an older state dir, open to all
    (state / "alerts.jsonl").write_text("")
    os.chmod(state / "alerts.jsonl", 0o666)
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state), "--max-restarts",
         "0", "--", sys.executable, "-c", NAN_JOB],
        capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=120, umask=0,
        check=False,
    )  # fmt: skip
    assert result.returncode != 0, result.stderr  # stopped for the NaN, no restarts left
    found = modes(state)
    assert "state.db" in found and "lock" in found, found
    assert any(name.startswith("reports/") and name.endswith(".md") for name in found), found
    assert json.loads((state / "alerts.jsonl").read_text().splitlines()[0])["rule"] == "nan_inf"
    loose = {
        name: oct(mode)
        for name, mode in found.items()
        if mode != (0o700 if (state / name).is_dir() else 0o600)
    }
    assert loose == {}
    assert f"state dir {state} was 0777, open to others: made it 0700" in result.stderr


@pytest.mark.slow
def test_a_second_sentinel_on_the_same_state_dir_exits_2_naming_the_first(
    tmp_path: Path,
) -> None:
    state = tmp_path / "st"
    first = subprocess.Popen(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state), "--", sys.executable,
         "-c", "import time; time.sleep(60)"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env(), cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + DEADLINE_S
        while holder(state) != first.pid:
            assert first.poll() is None, first.communicate()[1]
            assert time.monotonic() < deadline, "the first sentinel never took the state dir"
            time.sleep(0.05)
        marker = tmp_path / "second-job-ran"
        second = subprocess.run(
            [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state), "--",
             sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
            capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=60, check=False,
        )  # fmt: skip
        assert second.returncode == 2
        assert second.stderr == (
            f"sentinel: another sentinel (pid {first.pid}) holds the state dir {state}\n"
        )
        assert not marker.exists()
        assert first.poll() is None  # the first goes on, its state dir untouched
        assert holder(state) == first.pid
    finally:
        first.send_signal(signal.SIGTERM)
        try:
            first.communicate(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            first.kill()
            first.communicate()
    assert holder(state) is None
