"""job_crash: the job exited non-zero; classified from its last output.

A job that exits 0 right after printing an exception (one it caught at its top and
swallowed: loguru's ``@logger.catch``, a bare ``except``) warns: its training was cut
short, and its orchestrator saw a success.
"""

from __future__ import annotations

import re
import signal
from collections import deque
from collections.abc import Sequence

from pydantic import Field

from sentinel.model.records import PROGRESS, Alert, Block, Line, Sample, Severity
from sentinel.model.untrusted import clipped
from sentinel.rules.base import BaseDetector, RuleConfig

# Checked in order: a device-side assert often also mentions an index out of
# bounds, and an OOM inside a NCCL call is still an OOM.
CRASH_CLASSES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    (
        "oom",
        "out of memory: lower the batch size, enable gradient checkpointing, or shard more",
        re.compile(
            r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError"
            r"|CUBLAS_STATUS_ALLOC_FAILED"
            r"|RuntimeError: out of memory|\bMemoryError\b|Cannot allocate memory"
            r"|HIP out of memory|XLA.*RESOURCE_EXHAUSTED",
            re.IGNORECASE,
        ),
    ),
    (
        "device_assert",
        "device-side assert: usually a label or token id out of range; rerun with"
        " CUDA_LAUNCH_BLOCKING=1 to find the op",
        # Not bare "device-side assert": torch appends a TORCH_USE_CUDA_DSA hint naming
        # device-side assertions to every CUDA error, OOM included.
        re.compile(
            r"device-side assert(?:ion)? triggered|CUDA error: an illegal memory access",
            re.IGNORECASE,
        ),
    ),
    (
        "loss_scale",
        "the fp16 loss scale collapsed to its minimum (the loss or gradients overflow even"
        " unscaled): roll back, lower the learning rate, clip gradients, or train in bf16",
        # fairseq's FloatingPointError, DeepSpeed's exception; the cause even when a
        # distributed launcher's traceback wraps it.
        re.compile(r"Minimum loss scale reached|loss scale already at minimum", re.IGNORECASE),
    ),
    (
        "non_finite",
        "the model's numbers went NaN or Inf (a distribution's parameters, sampling"
        " probabilities or a checked tensor): a numerical blow-up; roll back to a checkpoint"
        " from before it, lower the learning rate or clip gradients (RL: check the"
        " environment's observations and rewards too)",
        # torch.distributions' argument check (an RL policy's logits gone NaN: SB3's PPO
        # ends so, tests/fixtures/sb3/ppo_nan), torch.normal's (RSL-RL's policy noise gone
        # NaN: tests/fixtures/rsl_rl/nan), binary_cross_entropy's (a sigmoid's output gone
        # NaN: Keras on torch ends so), torch.multinomial, autograd's anomaly mode,
        # RSL-RL's check of the environment's outputs, tf.debugging.check_numerics, numpy's
        # and fairseq's FloatingPointError (its minimum loss scale is loss_scale's, above).
        re.compile(
            r"but found invalid values|probability tensor contains either"
            r"|normal expects all elements of std >= 0"
            r"|all elements of input should be between 0 and 1"
            r"|returned (?:nan|inf) values in its|contains? NaN values"
            r"|Tensor had (?:NaN|Inf) values|\bFloatingPointError\b",
        ),
    ),
    (
        "terminated",
        "stopped from outside by SIGTERM (a preemption, `scancel`, `kill`, an orchestrator's"
        " stop), not a crash of its own: resume from the last checkpoint; if unexpected, the"
        " scheduler's log says who sent it",
        # torchrun's elastic agent, handed the signal: its SignalException names it (and an
        # NCCL teardown may follow it, which is not the cause).
        re.compile(r"got signal: 15\b|\bSIGTERM\b.*(?:received|caught)|received SIGTERM"),
    ),
    (
        "distributed",
        "distributed failure (NCCL/c10d): a rank died or a collective timed out; check"
        " the other ranks' logs and the network",
        re.compile(
            r"NCCL|ProcessGroup|collective operation timeout|torch\.distributed"
            r"|DistBackendError|ChildFailedError|\bc10d\b",
        ),
    ),
    (
        "bad_data",
        "bad data: an index, key or decode error in the input pipeline; inspect the"
        " batch at the failing step",
        re.compile(
            r"\bIndexError\b|index out of range|\bKeyError\b|UnicodeDecodeError"
            r"|JSONDecodeError|stack expects each tensor to be equal size"
            r"|Expected input batch_size",
        ),
    ),
)


#: What to do about a job that exited 0 after an error it swallowed.
_SWALLOWED = (
    "the job caught an exception at its top and exited 0 (loguru's @logger.catch, a bare"
    " except): fix the error, and let it end the process non-zero (reraise=True) so the"
    " orchestrator sees the failure"
)


class JobCrashConfig(RuleConfig):
    """``[rules.job_crash]``."""

    #: How many of the job's last output lines are kept to classify a crash.
    tail_lines: int = Field(default=200, ge=1, le=100_000)


#: Crash classes that leave the weights as the last step made them: the step that crashed
#: applied no update (out of memory, a collective that failed, a batch that did not load, a
#: kernel's index assert). A numerical blow-up (``non_finite``, ``loss_scale``) and an
#: unknown crash (``other``) may have written bad numbers first.
HARMLESS_TO_WEIGHTS = frozenset({"oom", "distributed", "bad_data", "device_assert", "terminated"})


def classify(lines: list[str], exit_code: int) -> tuple[str, str, str]:
    """(class, advice, evidence line) for a crash, from the job's last output lines."""
    for crash_class, advice, pattern in CRASH_CLASSES:
        for text in reversed(lines):
            if pattern.search(text):
                return crash_class, advice, text.strip()
    if exit_code == -signal.SIGKILL or exit_code == 128 + signal.SIGKILL:
        return (
            "oom",
            "killed by SIGKILL with no error printed: most likely the kernel's OOM killer"
            " (check `dmesg`); lower host memory use (dataloader workers, pinned memory)",
            "",
        )
    return "other", "see the job's last output", _last_word(lines)


#: A Python exception's own line: ``RuntimeError: corrupt record ...``, ``KeyError``.
_EXCEPTION = re.compile(r"(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Interrupt)\b(?::|$)")
#: A progress bar's redraw (tqdm, rich): what a job prints last as often as not.
_BAR = re.compile(r"\d+%\||it/s\b|s/it\b")


def _last_word(lines: list[str]) -> str:
    """What the job said last about its end: the last exception it printed, else its last
    line that is no progress bar (tqdm draws its bar again as it closes, after the
    traceback), else its last line."""
    stripped = [text.strip() for text in lines if text.strip()]
    for text in reversed(stripped):
        if _EXCEPTION.match(text):
            return text
    for text in reversed(stripped):
        if not _BAR.search(text):
            return text
    return stripped[-1] if stripped else ""


def swallowed_error(lines: list[str]) -> str | None:
    """The exception a job that exited 0 printed last, where it printed nothing after it: a
    crash it caught at its top and swallowed (loguru's ``@logger.catch``, a bare
    ``except: traceback.print_exc()``), its training cut short. None otherwise, and for
    the interpreter's own ``Exception ignored in ...`` at shutdown (a ``__del__``'s)."""
    stripped = [text.strip() for text in lines if text.strip()]
    if not stripped or not _EXCEPTION.match(stripped[-1]):
        return None
    tracebacks = [
        i for i, text in enumerate(stripped) if "Traceback (most recent call last)" in text
    ]
    if not tracebacks:
        return None
    after = stripped[max(0, tracebacks[-1] - 1) :]
    if any(text.startswith("Exception ignored in") for text in after):
        return None
    return stripped[-1]


#: NCCL's watchdog on a collective that timed out, as the job's last line (torch then
#: tears the process down; a rank's own tag and a tqdm bar may come before it on the line).
_WATCHDOG = re.compile(
    r"(?:\[rank\d+\]:)?(?:\[E[^\]]*\]\s*)?(?:\[Rank \d+\]\s*)?"
    r"Watchdog caught collective.*"
)


def watchdog_timeout(lines: list[str]) -> str | None:
    """The NCCL watchdog's timeout a job's output ended on (no Python traceback follows
    one: a real NeMo run hung 7 hours, then its log ended so), else None."""
    stripped = [text.strip() for text in lines if text.strip()]
    found = _WATCHDOG.search(stripped[-1]) if stripped else None
    return None if found is None else found.group(0)


#: The shell's word for a child killed by SIGKILL, as the job's last line: bash's bare
#: ``Killed`` (a job in the foreground), or ``./run.sh: line 3: 12345 Killed    python ...``.
_KILLED = re.compile(r"Killed$|.*:\s*(?:line \d+:\s*)?\d+\s+Killed\s.*")


def killed(lines: list[str]) -> str | None:
    """The shell's ``Killed`` a job's output ended on (the kernel's OOM killer, most often:
    nothing else is printed), else None."""
    stripped = [text.strip() for text in lines if text.strip()]
    return stripped[-1] if stripped and _KILLED.fullmatch(stripped[-1]) else None


#: How much of the job's last words an alert's message quotes.
QUOTED_CHARS = 300


def _quoted(evidence: str) -> str:
    """The job's words as the message quotes them (``clipped``)."""
    return clipped(evidence, QUOTED_CHARS)


def describe_exit(exit_code: int) -> str:
    if exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"exited with code {exit_code}"


class JobCrashDetector(BaseDetector):
    """Raises a critical alert when the job exits non-zero on its own."""

    rule = "job_crash"
    config_model = JobCrashConfig
    evidence_before_stop = True

    def __init__(self, config: JobCrashConfig) -> None:
        super().__init__(config)
        self._tail: deque[str] = deque(maxlen=config.tail_lines)
        self._last_step: int | None = None

    def job_started(self, now: float) -> None:
        self._tail.clear()
        self._last_step = None

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        if sample.step is not None:
            self._last_step = sample.step
        return []

    def observe_samples(
        self, samples: list[Sample], source: str, now: float
    ) -> list[tuple[int, Alert]]:
        """Only the line's last step matters: the one ``observe`` would keep last."""
        for sample in reversed(samples):
            step = sample[2]
            if step is not None and sample[0] != PROGRESS:
                self._last_step = step
                break
        return []

    def output(self, line: Line) -> list[Alert]:
        return self.output_text(line.text, line.source, line.time)

    def output_text(self, text: str, source: str, now: float) -> list[Alert]:
        self._tail.append(text)
        return []

    def can_absorb(self, block: Block) -> bool:
        """Always: this rule speaks only when the job exits. Output and samples only keep
        the tail it classifies from and the last step, which ``absorb`` keeps as well."""
        return True

    def absorb(self, block: Block) -> None:
        tail = self._tail
        if block.output:
            # The deque keeps its last ``maxlen`` lines: those are all it needs to see.
            tail.extend(block.texts[-(tail.maxlen or len(block.texts)) :])
        if block.names:
            self._last_step = block.steps[-1]

    def log_ended(self, now: float, tail: Sequence[str]) -> list[Alert]:
        """A replayed log that ends right after an exception (``tail``: its last lines): a
        warning that the job likely crashed, as ``watch`` says of a job it did not start (a
        log holds no exit status); one that ends on NCCL's watchdog timeout, or on the
        shell's ``Killed`` (a SIGKILL: the OOM killer, most often), too. Three real crash
        logs (an OOM, two NCCL timeouts) gave nothing, nor a stable-baselines3 run whose
        log ends in ``Killed``."""
        lines = list(tail)[-(self._tail.maxlen or len(tail)) :]
        return self._ended_on_error(now, "the log ends on an error", lines)

    def _vanished(self, now: float) -> list[Alert]:
        """A warning for a job whose exit status cannot be known (``watch`` beside a job it
        did not start) that ended right after printing an exception: it likely crashed.
        Not critical: a job may print one and exit 0, and nothing here says which."""
        return self._ended_on_error(
            now,
            "job ended right after an error, its exit status unknown (sentinel did not start it)",
            list(self._tail),
        )

    def _ended_on_error(self, now: float, what: str, lines: list[str]) -> list[Alert]:
        evidence = swallowed_error(lines) or watchdog_timeout(lines)
        code = 1
        if evidence is None:
            evidence, code = killed(lines), -signal.SIGKILL
        if evidence is None:
            return []
        crash_class, advice, _ = classify(lines, code)
        return [
            Alert(
                rule=self.rule,
                severity=Severity.WARNING,
                message=(
                    f"{what}: stopped from outside, not a crash ({_quoted(evidence)})"
                    if crash_class == "terminated"
                    else f"{what}: likely a crash, {crash_class} ({_quoted(evidence)})"
                ),
                time=now,
                source="job",
                step=self._last_step,
                metric="exit_code",
                details={"class": crash_class, "advice": advice, "evidence": evidence},
            )
        ]

    def _swallowed(self, now: float) -> list[Alert]:
        """A warning for a job that exited 0 right after printing an exception."""
        evidence = swallowed_error(list(self._tail))
        if evidence is None:
            return []
        return [
            Alert(
                rule=self.rule,
                severity=Severity.WARNING,
                message=(
                    "job exited with code 0 right after printing an error it caught, its"
                    f" training likely cut short ({_quoted(evidence)})"
                ),
                time=now,
                source="job",
                step=self._last_step,
                metric="exit_code",
                value=0.0,
                details={"class": "swallowed", "advice": _SWALLOWED, "evidence": evidence},
            )
        ]

    def job_exited(self, exit_code: int | None, now: float, *, expected: bool) -> list[Alert]:
        if expected:
            return []
        if exit_code is None:
            return self._vanished(now)
        if exit_code == 0:
            return self._swallowed(now)
        crash_class, advice, evidence = classify(list(self._tail), exit_code)
        message = f"job {describe_exit(exit_code)}: {crash_class}"
        if evidence:
            message += f" ({_quoted(evidence)})"
        last = self._last_step
        # A crash that corrupts no number began after the last step logged: a save of that
        # step, written before the crash, is clean (a real Megatron-style job saved 125 and
        # ran out of memory in 126; its save of 125 was set aside, 25 iterations lost).
        onset = last + 1 if last is not None and crash_class in HARMLESS_TO_WEIGHTS else last
        return [
            Alert(
                rule=self.rule,
                severity=Severity.CRITICAL,
                message=message,
                time=now,
                source="job",
                step=self._last_step,
                metric="exit_code",
                value=float(exit_code),
                onset_step=onset,
                details={"class": crash_class, "advice": advice, "evidence": evidence},
            )
        ]
