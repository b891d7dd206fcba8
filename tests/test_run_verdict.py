"""Many nodes, one run: the first sentinel to decide writes the run's verdict, the rest adopt it.

Unit checks of ``sentinel.store.run_verdict`` (the run id, the first-writer-wins record,
writers racing in real processes), then two real ``sentinel watch --pid`` processes,
one per "node", each watching its own job process, on one shared checkpoint dir
(the shared filesystem), paging one real webhook receiver.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sentinel.store import run_verdict, verdict
from sentinel.store.run_verdict import RunVerdict, resolve_run_id
from tests.helpers.webhook import WebhookReceiver


@pytest.mark.parametrize(
    ("given", "environ", "expected"),
    [
        ("run-7", {"SLURM_JOB_ID": "123"}, "run-7"),
        (None, {"SLURM_JOB_ID": "123", "TORCHELASTIC_RUN_ID": "t"}, "123"),
        (None, {"SLURM_JOB_ID": "130", "SLURM_ARRAY_JOB_ID": "123", "SLURM_ARRAY_TASK_ID": "7"},
         "123_7"),
        (None, {"TORCHELASTIC_RUN_ID": "abc"}, "abc"),
        (None, {"TORCHELASTIC_RUN_ID": "none"}, None),
        (None, {}, None),
    ],
    ids=["given", "slurm", "slurm-array", "torchelastic", "torchelastic-default", "none"],
)  # fmt: skip
def test_run_id(given: str | None, environ: dict[str, str], expected: str | None) -> None:
    assert resolve_run_id(given, environ) == expected


def test_no_shared_verdict_without_a_run_id_or_a_checkpoint_dir(tmp_path: Path) -> None:
    assert run_verdict.for_run(tmp_path, None, {}) is None
    assert run_verdict.for_run(None, "run-7", {}) is None
    shared = run_verdict.for_run(tmp_path, None, {"SLURM_JOB_ID": "42"})
    assert shared is not None and shared.directory == tmp_path / ".sentinel-run" / "42"


def test_the_first_writer_wins_and_the_second_gets_its_record(tmp_path: Path) -> None:
    first, second = RunVerdict(tmp_path, "run-7", node="a"), RunVerdict(tmp_path, "run-7", node="b")
    assert second.peek() is None
    record, won = first.claim(91, rule="nan_inf", step=25, resume_from="/ckpt/step_20")
    assert won and record.node == "a"
    seen = second.peek()
    assert seen == record
    theirs, won = second.claim(90, rule="stall", step=30, resume_from=None)
    assert not won and theirs == record, "the loser takes the winner's verdict, not its own"
    assert json.loads(first.path(1).read_text())["code"] == 91
    assert [p.name for p in first.directory.iterdir()] == ["verdict-1.json"], "no temp left"


def test_decisions_are_numbered_so_a_requeued_run_decides_again(tmp_path: Path) -> None:
    node = RunVerdict(tmp_path, "run-7", node="a")
    node.claim(91, rule="nan_inf", step=25, resume_from=None)
    assert node.number == 2 and node.peek() is None
    restarted = RunVerdict(tmp_path, "run-7", node="b")  # a sentinel of the requeued job
    assert restarted.number == 2 and restarted.peek() is None
    record, won = restarted.claim(90, rule="nan_inf", step=25, resume_from=None)
    assert won and record.number == 2
    assert node.peek() == record


def test_an_unsafe_run_id_stays_one_folder(tmp_path: Path) -> None:
    node = RunVerdict(tmp_path, "../team/run 7", node="a")
    assert node.directory == tmp_path / ".sentinel-run" / ".._team_run_7"


CLAIMER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from sentinel.store.run_verdict import RunVerdict
    root, name, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    node = RunVerdict(root, "race", node=name)
    (root / f"ready-{name}").touch()
    while not go.exists():
        time.sleep(0.001)
    record, won = node.claim(91 if name.endswith("0") else 92, rule="nan_inf", step=25,
                             resume_from=None)
    print(json.dumps({"won": won, "node": record.node, "code": record.code}))
    """
)


@pytest.mark.slow
def test_writers_racing_in_real_processes_agree_on_one(tmp_path: Path) -> None:
    go = tmp_path / "go"
    claimers = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(tmp_path), f"node-{n}", str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(8)
    ]
    _wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == len(claimers))
    go.touch()
    answers = [json.loads(c.communicate(timeout=30)[0]) for c in claimers]
    winners = [a for a in answers if a["won"]]
    assert len(winners) == 1
    assert {(a["node"], a["code"]) for a in answers} == {(winners[0]["node"], winners[0]["code"])}


# --- two nodes, end to end ---------------------------------------------------------------

# One rank of a run: logs step and loss to its node's log, checkpoints into the shared dir
# (every 10 steps and right before step 25), goes NaN at step 25 when told, then hangs
# (a rank stuck in a collective) until it is stopped.
RANK = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    ckpt, log_path, go = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[4])
    nan = sys.argv[3] == "nan"
    while not go.exists():
        time.sleep(0.01)
    with log_path.open("a") as log:
        for step in range(1, 1000):
            if step % 10 == 0 or step == 25:
                (ckpt / f"step_{step}").mkdir(parents=True, exist_ok=True)
                (ckpt / f"step_{step}" / "state.json").write_text(json.dumps({"step": step}))
            bad = nan and step == 25
            loss = float("nan") if bad else 2.0 - step / 100
            log.write(json.dumps({"step": step, "loss": loss}) + "\\n")
            log.flush()
            time.sleep(600 if bad else 0.05)
    """
)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _ready(port: int) -> bool:
    try:
        return bool(urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).status)
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("both_nan", [True, False], ids=["both-ranks-nan-racing", "one-rank-nan"])
def test_two_nodes_stop_once_and_page_once(tmp_path: Path, both_nan: bool) -> None:
    ckpt, go = tmp_path / "ckpt", tmp_path / "go"
    ckpt.mkdir()
    (tmp_path / "rank.py").write_text(RANK)
    nodes = ["node-0", "node-1"]
    env = {**os.environ, "SENTINEL_JOB__GRACE_PERIOD_S": "5", "SENTINEL_NOTIFY__GROUP_WAIT_S": "0"}
    env.pop("SLURM_JOB_ID", None)
    ranks, watchers = [], []
    with WebhookReceiver() as hook:
        try:
            for index, node in enumerate(nodes):
                (tmp_path / node).mkdir()
                nan = "nan" if both_nan or index == 0 else "ok"
                log_path = tmp_path / node / "train.log"
                ranks.append(subprocess.Popen(
                    [sys.executable, str(tmp_path / "rank.py"), str(ckpt), str(log_path), nan,
                     str(go)]))  # fmt: skip
            ports = [_free_port() for _ in nodes]
            for rank, node, port in zip(ranks, nodes, ports, strict=True):
                watchers.append(subprocess.Popen(
                    [sys.executable, "-m", "sentinel", "watch", "--pid", str(rank.pid),
                     "--log", str(tmp_path / node / "train.log"), "--checkpoints", str(ckpt),
                     "--state-dir", str(tmp_path / node / "state"), "--run-id", "run-7",
                     "--notify", hook.url, "--http", f"127.0.0.1:{port}"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    env=env))  # fmt: skip
            _wait_for(lambda: all(_ready(port) for port in ports))
            go.touch()
            codes = [rank.wait(timeout=60) for rank in ranks]
            states = [tmp_path / node / "state" for node in nodes]
            _wait_for(lambda: all((v := verdict.read(s)) and v.final for s in states))
            # Let every message that would go, go (a loser's would come right after).
            _wait_for(lambda: any("actions" in _kinds(r.json) for r in hook.accepted))
            time.sleep(2)
        finally:
            for process in [*ranks, *watchers]:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            errors = [w.communicate(timeout=30)[1] for w in watchers]
            for rank in ranks:
                rank.wait(timeout=30)
        requests = list(hook.accepted)

    assert codes == [-signal.SIGTERM] * 2, "both ranks stopped by their node's sentinel"
    assert [w.returncode for w in watchers] == [0, 0], errors
    records = sorted(p.name for p in (ckpt / ".sentinel-run" / "run-7").iterdir())
    assert records == ["verdict-1.json"], "exactly one first writer"
    shared = json.loads((ckpt / ".sentinel-run" / "run-7" / "verdict-1.json").read_text())
    local = [verdict.read(s) for s in states]
    assert [(v.code, v.rule, v.step) for v in local if v] == [(91, "nan_inf", 25)] * 2
    assert shared["code"] == 91 and shared["pid"] in [w.pid for w in watchers]
    winner = [w.pid for w in watchers].index(shared["pid"])
    assert "verdict 91 for the run, from node" in errors[1 - winner], "the other one adopted it"
    assert not (ckpt / "step_25").exists() and (ckpt / "step_20").exists(), "rolled back"

    # One page: every opening of the incident carries one key (what a paging service folds
    # by), and one node only says what was done.
    news = [r for r in requests if {"opened", "escalated"} & set(_kinds(r.json))]
    keys = {_message(r.json)["key"] for r in news}
    assert len(keys) == 1 and keys == {r.headers["Idempotency-Key"] for r in news}, keys
    assert next(iter(keys)).startswith("run-7:nan_inf:25:")
    assert len(news) == (2 if both_nan else 1), "a rank that never went NaN opens nothing"
    assert sum("actions" in _kinds(r.json) for r in requests) == 1


def _message(body: object) -> dict[str, Any]:
    """sentinel's JSON message, as apprise's json:// wraps it (in "message")."""
    assert isinstance(body, dict)
    message: dict[str, Any] = json.loads(body["message"])
    return message


def _kinds(body: object) -> list[str]:
    return [notice["kind"] for notice in _message(body)["notices"]]


def test_an_unreadable_run_folder_costs_the_numbering_not_the_start(tmp_path: Path) -> None:
    folder = tmp_path / ".sentinel-run" / "run-7"
    folder.parent.mkdir()
    folder.write_text("not a folder")  # listing it fails with ENOTDIR
    node = RunVerdict(tmp_path, "run-7", node="a")
    assert node.number == 1 and node.peek() is None
    with pytest.raises(OSError):
        node.claim(91, rule="nan_inf", step=25, resume_from=None)
