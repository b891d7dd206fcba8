"""A state dir that cannot take another byte never costs the job its watchdog.

The disk is "full" for sentinel alone, without privileges: its file-size limit
(RLIMIT_FSIZE) is below the size its journal already has, so every append fails
with EFBIG as a full disk fails with ENOSPC (Python ignores SIGXFSZ).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.env import clean_env
from tests.helpers.webhook import WebhookReceiver

pytestmark = pytest.mark.slow

LIMIT_BYTES = 512 * 1024

JOB = textwrap.dedent(
    """
    import json, signal, sys, time
    record = sys.argv[1]
    def on_term(signum, frame):
        open(record, "w").write("sigterm")
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    for step in range(1, 200):
        loss = float("nan") if step == 20 else 1.0
        print(json.dumps({"step": step, "loss": loss}), flush=True)
        time.sleep(0.02 if step != 20 else 60)
    """
)


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, LIMIT_BYTES))


def test_a_nan_still_stops_the_job_when_no_state_write_succeeds(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "alerts.jsonl").write_text("x" * (LIMIT_BYTES + 1024))  # "full": appends fail
    job, record = tmp_path / "job.py", tmp_path / "record"
    job.write_text(JOB)
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state),
         "--max-restarts", "0", "--", sys.executable, str(job), str(record)],
        preexec_fn=_limit_file_size, capture_output=True, text=True, timeout=60,
        env=clean_env(),
    )  # fmt: skip
    assert record.read_text() == "sigterm", result.stderr
    assert result.returncode == 143, result.stderr
    assert "cannot write the alert journal" in result.stderr
    assert "Traceback" not in result.stderr
    assert "CRITICAL nan_inf step=20" in result.stderr


# The job fills the state dir's disk (or waits until the test turns it read-only) at step
# 10, then writes a NaN at step 20; its record of SIGTERM goes outside that disk.
FILLING_JOB = textwrap.dedent(
    """
    import json, os, signal, sys, time
    state, record, fault = sys.argv[1], sys.argv[2], sys.argv[3]
    def on_term(signum, frame):
        open(record, "w").write("sigterm")
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    for step in range(1, 200):
        if step == 10 and fault == "full":
            try:
                with open(os.path.join(state, "filler"), "wb") as filler:
                    while True:
                        filler.write(b"x" * 65536)
                        filler.flush()
            except OSError:
                pass
        if step == 10 and fault == "read-only":
            open(record + ".at10", "w").write("")
            while not os.path.exists(record + ".go"):
                time.sleep(0.02)
        loss = float("nan") if step == 20 else 1.0
        print(json.dumps({"step": step, "loss": loss}), flush=True)
        time.sleep(0.05 if step != 20 else 60)
    """
)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs for the state dir: it really fills, and really turns read-only."""
    mount_point = tmp_path / "state"
    mount_point.mkdir(mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount_point)],
        capture_output=True, text=True,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs CAP_SYS_ADMIN: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _end_leftover_job(state: Path) -> None:
    """A job whose sentinel was killed runs on under its relay (by design): a failed test
    must not leave it behind."""
    with contextlib.suppress(OSError, ValueError):
        os.killpg(int((state / "job" / "job.pid").read_text()), signal.SIGKILL)


def _check_stops_and_tells(tmp_path: Path, state: Path, fault: str) -> None:
    """Run the filling job under sentinel with ``state`` as the state dir; check that the
    NaN still stopped it, that nothing ended in a traceback, and who was told what."""
    job, record = tmp_path / "job.py", tmp_path / "record"
    job.write_text(FILLING_JOB)
    # Read-only for sentinel as a root without CAP_DAC_OVERRIDE or CAP_FOWNER (as in a
    # locked-down pod), once the state dir is another user's.
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner,-chown"]
    with WebhookReceiver() as hook:
        sentinel = subprocess.Popen(
            [*(drop if fault == "read-only" else []),
             sys.executable, "-m", "sentinel", "run", "--state-dir", str(state),
             "--notify", hook.url, "--max-restarts", "0", "--",
             sys.executable, str(job), str(state), str(record), fault],
            stderr=subprocess.PIPE, text=True,
            env={**clean_env(),
                 "SENTINEL_NOTIFY__GROUP_WAIT_S": "0"},
        )  # fmt: skip
        try:
            if fault == "read-only":
                deadline = time.monotonic() + 30
                while not Path(f"{record}.at10").exists():
                    assert time.monotonic() < deadline and sentinel.poll() is None
                    time.sleep(0.02)
                os.chown(state, 65534, 65534)  # another user's now, and not writable by us
                state.chmod(0o755)
                Path(f"{record}.go").write_text("")
            _out, err = sentinel.communicate(timeout=60)
        finally:
            if sentinel.poll() is None:
                sentinel.kill()
                sentinel.communicate()
            _end_leftover_job(state)
        deadline = time.monotonic() + 10
        told = ""
        while not ("nan_inf" in told and "state_dir" in told) and time.monotonic() < deadline:
            time.sleep(0.1)
            told = "\n".join(r.json["message"] for r in hook.accepted)
    assert record.read_text() == "sigterm", err
    assert sentinel.returncode == 143, err
    assert "Traceback" not in err, err
    assert "nan_inf" in told, "the NaN reached a person though the state dir refused it"
    assert "state_dir" in told, f"and so did the state dir's own trouble: {err}"


def test_a_state_dir_whose_disk_fills_mid_run_still_stops_the_job_and_tells(
    tmp_path: Path, small_disk: Path
) -> None:
    _check_stops_and_tells(tmp_path, small_disk, "full")


def test_a_state_dir_turned_read_only_mid_run_still_stops_the_job_and_tells(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to hand the state dir to another user (chown) mid-run")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run sentinel without CAP_DAC_OVERRIDE")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    try:
        _check_stops_and_tells(tmp_path, state, "read-only")
    finally:
        os.chown(state, 0, 0)
        state.chmod(0o700)


# -- a checkpoint dir whose disk is full at the rollback -----------------------------------

DEEPSPEED = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "deepspeed"


def _deepspeed_run(ck: Path) -> None:
    """DeepSpeed saves at steps 20, 40, 60, its ``latest`` naming the newest."""
    for step in (20, 40, 60):
        shutil.copytree(DEEPSPEED / "global_step40", ck / f"global_step{step}")
        (ck / "latest").write_text(f"global_step{step}")


def _nothing_moved(ck: Path) -> None:
    assert sorted(p.name for p in ck.glob("global_step*")) == [
        "global_step20", "global_step40", "global_step60"
    ]  # fmt: skip
    assert (ck / "latest").read_text() == "global_step60"
    assert list(ck.glob(".sentinel-replace-*")) == []


def test_a_full_disk_for_the_new_pointer_stops_the_rollback_before_any_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sentinel.checkpoints.quarantine import MANIFEST
    from sentinel.checkpoints.rollback import apply_rollback, plan_rollback

    ck = tmp_path / "ck"
    _deepspeed_run(ck)
    plan = plan_rollback(ck, 50)
    assert [c.path.name for c in plan.quarantine] == ["global_step60"]
    real_open = os.open

    def full_for_pointers(path: object, flags: int, *args: object, **kwargs: object) -> int:
        name = Path(os.fspath(path))  # type: ignore[arg-type]
        if name.parent == ck and name.name.startswith(".sentinel-replace-"):  # the new latest
            raise OSError(28, "No space left on device", os.fspath(path))  # type: ignore[arg-type]
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", full_for_pointers)
    with pytest.raises(OSError) as raised:
        apply_rollback(plan, ck, label="full")
    assert raised.value.errno == 28
    _nothing_moved(ck)
    # The manifest, written before, says what is where: planned, nothing moved.
    manifest = json.loads((ck / "quarantine" / "full" / MANIFEST).read_text())
    assert [(i["name"], i["moved"]) for i in manifest["items"]] == [("global_step60", False)]
    assert manifest["complete"] is False


def test_a_disk_full_from_the_start_moves_nothing(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    _deepspeed_run(ck)
    script = textwrap.dedent(
        f"""
        import resource, sys
        from pathlib import Path
        from sentinel.checkpoints.rollback import apply_rollback, plan_rollback
        plan = plan_rollback(Path({str(ck)!r}), 50)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16))  # no file may grow past 16 bytes
        try:
            apply_rollback(plan, Path({str(ck)!r}), label="full")
        except OSError as error:
            print(error.errno)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=clean_env(),
        timeout=60,
    )  # fmt: skip
    assert done.stdout.strip() == "27", done.stderr  # EFBIG: the disk is full for it
    _nothing_moved(ck)
