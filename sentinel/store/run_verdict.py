"""One verdict for a run across nodes: the first sentinel to decide writes it, the rest adopt it.

With one sentinel per node, each watching its own ranks, every node may see the
failure (or only one may). The first node whose verdict is final publishes the
run's record on the shared checkpoint filesystem,
``<checkpoints>/.sentinel-run/<run-id>/verdict-<n>.json``, by ``link(2)`` of a
complete, synced temp file: the link fails with EEXIST for every later writer,
so exactly one node wins without a lock server (``O_EXCL`` is not reliable on
NFSv2; ``link`` is, and an unanswered link is settled by the temp file's link
count). The other nodes see the record by looking for it on the supervisor's
clock tick (inotify does not see another node's writes over NFS), stop their
ranks with the winner's verdict, and stay quiet about it.

``n`` numbers the run's decisions: a sentinel starts at one past the highest
record it finds, and moves on after each decision it makes or adopts, so a
requeued run (same job id) can decide again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sentinel.store.verdict import CODES, write_final

log = logging.getLogger(__name__)

RUN_DIR = ".sentinel-run"
_RECORD = re.compile(r"^verdict-(\d+)\.json$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def resolve_run_id(given: str | None, environ: Mapping[str, str]) -> str | None:
    """The run's id, the same on every node: ``given`` (``--run-id``), else the job's own.

    Slurm's ``SLURM_JOB_ID`` (``<array job>_<task>`` for an array task), else
    torchrun's ``TORCHELASTIC_RUN_ID`` (its default, ``none``, names no run). On
    Kubernetes the manifest sets ``SENTINEL_RUN_ID`` from the Job's uid, which is
    ``given``. None: no run id, so no shared verdict.
    """
    if given:
        return given
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    if environ.get("SLURM_JOB_ID"):
        return environ["SLURM_JOB_ID"]
    torch_run = environ.get("TORCHELASTIC_RUN_ID")
    if torch_run and torch_run != "none":
        return torch_run
    return None


@dataclass(frozen=True)
class RunRecord:
    """The run's verdict as the winning node wrote it."""

    number: int
    code: int
    verdict: str
    rule: str | None
    step: int | None
    resume_from: str | None
    node: str
    pid: int
    time: float

    @classmethod
    def from_json(cls, data: Any) -> RunRecord:
        if not isinstance(data, dict) or data.get("code") not in CODES:
            raise ValueError(f"not a run verdict: {data!r}")
        step, resume_from = data.get("step"), data.get("resume_from")
        return cls(
            number=int(data["number"]),
            code=int(data["code"]),
            verdict=str(data["verdict"]),
            rule=None if data.get("rule") is None else str(data["rule"]),
            step=None if step is None else int(step),
            resume_from=None if resume_from is None else str(resume_from),
            node=str(data.get("node", "")),
            pid=int(data.get("pid", 0)),
            time=float(data.get("time", 0.0)),
        )


class RunVerdict:
    """The run's shared verdict records under ``<checkpoints>/.sentinel-run/<run-id>/``."""

    def __init__(self, checkpoints: Path, run_id: str, *, node: str | None = None) -> None:
        self.run_id = run_id
        self.directory = Path(checkpoints) / RUN_DIR / _UNSAFE.sub("_", run_id)
        self.node = node or socket.gethostname()
        #: The decision under way: its record is ``verdict-<number>.json``.
        self.number = 1 + max(self._numbers(), default=0)

    def path(self, number: int | None = None) -> Path:
        return self.directory / f"verdict-{self.number if number is None else number}.json"

    def peek(self) -> RunRecord | None:
        """The record of the decision under way, if a node has written it (a stat a tick)."""
        path = self.path()
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as error:
            log.warning("could not read the run's verdict %s: %s", path, error)
            return None
        try:
            return RunRecord.from_json(json.loads(text))
        except (TypeError, ValueError) as error:
            log.warning("%s is not a run verdict: %s", path, error)
            return None

    def claim(
        self,
        code: int,
        *,
        rule: str | None,
        step: int | None,
        resume_from: str | None,
    ) -> tuple[RunRecord, bool]:
        """Publish this node's verdict unless a node did first: the record in force, and
        whether it is this node's. Moves on to the next decision either way.

        Raises ``OSError`` when neither this node's record nor another's can be had
        (the shared filesystem is gone): the caller decides alone.
        """
        record = RunRecord(
            number=self.number,
            code=code,
            verdict=CODES[code][0],
            rule=rule,
            step=step,
            resume_from=resume_from,
            node=self.node,
            pid=os.getpid(),
            time=time.time(),
        )
        won = self._link(record)
        if not won:
            theirs = self.peek()
            if theirs is None:
                raise OSError(f"{self.path()} exists but cannot be read")
            record = theirs
        self.number += 1
        return record, won

    def adopted(self) -> None:
        """This node has acted on the record of the decision under way: on to the next."""
        self.number += 1

    def _link(self, record: RunRecord) -> bool:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.path()
        temp = self.directory / f".{final.name}.{self.node}.{os.getpid()}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            try:
                os.write(fd, (json.dumps(asdict(record), allow_nan=False) + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(temp, final)
            except FileExistsError:
                return False
            except OSError:
                # Over NFS the reply to a link that was made can be lost: the count tells.
                if os.stat(temp).st_nlink != 2:
                    raise
            return True
        finally:
            with contextlib.suppress(OSError):
                temp.unlink()

    def _numbers(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        except OSError as error:  # the shared filesystem: a claim will say more
            log.warning("could not list the run's verdicts in %s: %s", self.directory, error)
            return []
        return [int(match[1]) for name in names if (match := _RECORD.match(name))]


def for_run(
    checkpoints: Path | None, given: str | None, environ: Mapping[str, str]
) -> RunVerdict | None:
    """The run's shared verdict, when there is a run id and a checkpoint dir to hold it."""
    run_id = resolve_run_id(given, environ)
    if run_id is None or checkpoints is None:
        return None
    return RunVerdict(checkpoints, run_id)


def write_adopted(
    record: RunRecord, state_dir: Path, *, attempt: int, verdict_file: Path | None
) -> bool:
    """This node's final verdict record, the run's (``record``); False, logged, on failure."""
    try:
        write_final(
            state_dir,
            record.code,
            record.verdict,
            record.rule,
            record.step,
            record.resume_from,
            attempt,
            time.time(),
            verdict_file=verdict_file,
        )
    except OSError as error:
        log.error("could not write the verdict (%d): %s", record.code, error)
        return False
    return True
