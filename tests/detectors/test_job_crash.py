"""job_crash: a non-zero exit the job chose itself, classified from its last output."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from sentinel.model.records import Alert, Line, Sample, Severity
from sentinel.rules.job_crash import JobCrashConfig, JobCrashDetector, classify

NOW = 1_700_000_000.0

CUDA_HINT = [
    "CUDA kernel errors might be asynchronously reported at some other API call, so the"
    " stacktrace below might be incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
]

CUDA_OOM = [
    "{'loss': 2.1, 'grad_norm': 0.9, 'learning_rate': 5e-05, 'epoch': 0.3}",
    "Traceback (most recent call last):",
    '  File "/home/me/train.py", line 120, in <module>',
    "    trainer.train()",
    '  File "/opt/venv/lib/python3.11/site-packages/transformers/trainer.py", line 1938, in train',
    "    return inner_training_loop(",
    '  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 116,'
    " in forward",
    "    return F.linear(input, self.weight, self.bias)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total"
    " capacity of 79.15 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process"
    " has 77.91 GiB memory in use. Of the allocated memory 75.12 GiB is allocated by PyTorch, and"
    " 1.29 GiB is reserved by PyTorch but unallocated.",
]

CUDA_ERROR_OOM = [
    "Traceback (most recent call last):",
    '  File "/home/me/train.py", line 40, in <module>',
    "    model.to('cuda')",
    "RuntimeError: CUDA error: out of memory",
    *CUDA_HINT,
]

DEVICE_ASSERT = [
    "../aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [71,0,0],"
    " thread: [96,0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
    "Traceback (most recent call last):",
    '  File "/home/me/train.py", line 88, in <module>',
    "    loss.backward()",
    "RuntimeError: CUDA error: device-side assert triggered",
    *CUDA_HINT,
]

DEVICE_ASSERT_INDEX = [
    "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [0,0,0],"
    ' thread: [32,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of'
    ' bounds"` failed.',
    "Traceback (most recent call last):",
    '  File "/home/me/train.py", line 88, in <module>',
    "    logits = model(batch)",
    "RuntimeError: CUDA error: device-side assert triggered",
    *CUDA_HINT,
]

NCCL_TIMEOUT = [
    "[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation timeout:"
    " WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for"
    " 600039 milliseconds before timing out.",
    "[rank0]:[E ProcessGroupNCCL.cpp:577] [Rank 0] Some NCCL operations have failed or timed out."
    " Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on"
    " corrupted/incomplete data.",
    "[rank0]:[E ProcessGroupNCCL.cpp:583] [Rank 0] To avoid data inconsistency, we are taking the"
    " entire process down.",
]

BAD_INDEX = [
    "Traceback (most recent call last):",
    '  File "/home/me/train.py", line 70, in <module>',
    "    out = model(input_ids)",
    '  File "/opt/venv/lib/python3.11/site-packages/torch/nn/functional.py", line 2264, in'
    " embedding",
    "    return torch.embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)",
    "IndexError: index out of range in self",
]

PLAIN_VALUE_ERROR = [
    "  5%|▌         | 10/200 [00:01<00:19,  9.81it/s]",
    "Traceback (most recent call last):",
    '  File "/home/me/train.py", line 61, in main',
    '    lr = float(config["lr"])',
    "ValueError: could not convert string to float: '3e-4x'",
]


def crashed(lines: list[str], exit_code: int, *, expected: bool = False) -> list[Alert]:
    detector = JobCrashDetector(JobCrashConfig())
    detector.job_started(NOW)
    for text in lines:
        detector.output(Line("stderr", text, NOW))
    return detector.job_exited(exit_code, NOW + 1, expected=expected)


#: fairseq's end when the scale collapses (a torch.distributed spawn wraps it on many GPUs).
FAIRSEQ_MIN_SCALE = [
    "2021-03-04 05:06:07 | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring"
    " gradient, setting loss scale to: 0.0001",
    "Traceback (most recent call last):",
    '  File "/opt/venv/lib/python3.8/site-packages/torch/multiprocessing/spawn.py", line 59,'
    " in _wrap",
    '  File "/opt/fairseq/fairseq/trainer.py", line 1034, in train_step',
    "    raise FloatingPointError(",
    "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding."
    " Try lowering the learning rate, using gradient clipping or increasing the batch size.",
]
DEEPSPEED_MIN_SCALE = [
    '  File "/opt/venv/lib/python3.10/site-packages/deepspeed/runtime/fp16/loss_scaler.py",'
    " line 183, in update_scale",
    "    raise Exception(",
    "Exception: Current loss scale already at minimum - cannot decrease scale anymore."
    " Exiting run.",
]


@pytest.mark.parametrize(
    ("lines", "exit_code", "crash_class"),
    [
        (CUDA_OOM, 1, "oom"),
        (CUDA_ERROR_OOM, 1, "oom"),
        (DEVICE_ASSERT, 1, "device_assert"),
        (DEVICE_ASSERT_INDEX, 1, "device_assert"),
        (NCCL_TIMEOUT, -signal.SIGABRT, "distributed"),
        (BAD_INDEX, 1, "bad_data"),
        ([], -signal.SIGKILL, "oom"),
        ([], 128 + signal.SIGKILL, "oom"),
        (PLAIN_VALUE_ERROR, 1, "other"),
        (FAIRSEQ_MIN_SCALE, 1, "loss_scale"),
        (DEEPSPEED_MIN_SCALE, 1, "loss_scale"),
    ],
    ids=[
        "cuda-oom-traceback",
        "cuda-error-out-of-memory",
        "device-side-assert",
        "device-assert-with-index-out-of-bounds",
        "nccl-watchdog-timeout",
        "index-error",
        "sigkill-no-output-host-oom",
        "exit-137-no-output-host-oom",
        "plain-value-error",
        "fairseq-minimum-loss-scale",
        "deepspeed-loss-scale-at-minimum",
    ],
)
def test_crash_is_classified(lines: list[str], exit_code: int, crash_class: str) -> None:
    (alert,) = crashed(lines, exit_code)
    assert alert.details["class"] == crash_class
    assert crash_class in alert.message


def test_crash_alert_is_critical_with_exit_code_and_last_step() -> None:
    detector = JobCrashDetector(JobCrashConfig())
    detector.job_started(NOW)
    detector.observe(Sample("loss", 2.0, 312), "stdout", NOW)
    for text in PLAIN_VALUE_ERROR:
        detector.output(Line("stderr", text, NOW))
    (alert,) = detector.job_exited(1, NOW + 5, expected=False)
    assert alert.rule == "job_crash"
    assert alert.severity is Severity.CRITICAL
    assert alert.step == 312
    assert alert.value == 1.0
    assert alert.time == NOW + 5
    assert "exited with code 1" in alert.message


@pytest.mark.parametrize(
    ("text", "onset"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", 126),
        ("RuntimeError: NCCL communicator was aborted on rank 1.", 126),
        ("ValueError: Expected parameter logits to satisfy the constraint: found nan", 125),
        ("RuntimeError: something else went wrong", 125),
    ],
)
def test_a_crash_that_corrupts_no_number_began_after_the_last_step(text: str, onset: int) -> None:
    """A Megatron-style job logged and saved iteration 125, then ran out of memory in 126:
    its save of 125 is clean (the onset is 126). A crash on a NaN, or one not told, may have
    written bad numbers first: its onset stays the last step logged."""
    detector = JobCrashDetector(JobCrashConfig())
    detector.job_started(NOW)
    detector.observe(Sample("loss", 2.0, 125), "stdout", NOW)
    detector.output(Line("stderr", text, NOW))
    (alert,) = detector.job_exited(1, NOW + 5, expected=False)
    assert (alert.step, alert.onset_step) == (125, onset)


def test_a_job_whose_exit_status_cannot_be_known_warns_when_it_ended_on_an_exception() -> None:
    """``watch`` beside a job it did not start sees it vanish, never its exit status: one that
    printed a traceback last likely crashed (a warning, with its class); one that ended
    quietly, or on the interpreter's ``Exception ignored in`` at shutdown, raises nothing."""
    crashed = JobCrashDetector(JobCrashConfig())
    crashed.job_started(NOW)
    crashed.observe(Sample("loss", 2.0, 40), "train.log", NOW)
    for text in [
        "Traceback (most recent call last):",
        '  File "train.py", line 12, in <module>',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    ]:
        crashed.output(Line("train.log", text, NOW))
    (alert,) = crashed.job_exited(None, NOW + 1, expected=False)
    assert (alert.severity, alert.step, alert.details["class"]) == (Severity.WARNING, 40, "oom")
    assert "exit status unknown" in alert.message
    quiet = JobCrashDetector(JobCrashConfig())
    quiet.job_started(NOW)
    quiet.output(Line("train.log", "training done", NOW))
    assert quiet.job_exited(None, NOW + 1, expected=False) == []


def test_a_job_that_vanished_on_the_nccl_watchdogs_timeout_likely_crashed() -> None:
    """NCCL's watchdog prints no Python traceback before torch tears the process down: the
    job's last line (here after a tqdm redraw and a rank's tag, as a real run printed it)
    is the evidence, a ``distributed`` crash. The same line mid-run, training on after it,
    is not the end."""
    line = (
        "  1%|▏         | 24/1752 [01:08<1:22:56,  2.88s/it][rank5]:[E602 11:17:52.185053341"
        " ProcessGroupNCCL.cpp:632] [Rank 5] Watchdog caught collective operation timeout:"
        " WorkNCCL(SeqNum=96120, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600012 ms"
    )
    vanished = JobCrashDetector(JobCrashConfig())
    vanished.job_started(NOW)
    vanished.output(Line("stderr", line, NOW))
    (alert,) = vanished.job_exited(None, NOW + 1, expected=False)
    assert (alert.severity, alert.details["class"]) == (Severity.WARNING, "distributed")
    assert alert.details["evidence"].startswith("[rank5]:[E602 11:17:52")
    went_on = JobCrashDetector(JobCrashConfig())
    went_on.job_started(NOW)
    went_on.output(Line("stderr", line, NOW))
    went_on.output(Line("stderr", "step 25 loss 1.93", NOW))
    assert went_on.job_exited(None, NOW + 1, expected=False) == []


def test_evidence_is_the_matching_line() -> None:
    (alert,) = crashed(CUDA_OOM, 1)
    assert alert.details["evidence"].startswith("torch.OutOfMemoryError: CUDA out of memory")


def test_other_crash_evidence_is_last_output_line() -> None:
    (alert,) = crashed(PLAIN_VALUE_ERROR, 1)
    assert alert.details["evidence"] == "ValueError: could not convert string to float: '3e-4x'"


def test_other_crash_evidence_is_the_exception_not_the_bar_drawn_after_it() -> None:
    """As a real accelerate job printed it: tqdm draws its bar again as it closes, after
    the traceback; the evidence is the exception, not that bar."""
    bar = "Training:  58%|█████▊    | 699/1200 [00:00<00:00, 799.21it/s, loss=1.28]"
    lines = [
        bar.replace("799.21", "950.89") + "Traceback (most recent call last):",
        '  File "job.py", line 21, in <module>',
        '    raise RuntimeError(f"corrupt record in shard 3 at offset 81920 (step {step})")',
        "RuntimeError: corrupt record in shard 3 at offset 81920 (step 700)",
        "",
        bar,
    ]
    (alert,) = crashed(lines, 1)
    assert alert.details["evidence"] == (
        "RuntimeError: corrupt record in shard 3 at offset 81920 (step 700)"
    )
    (plain,) = crashed(["step 5 loss 2.1", "saving the last checkpoint", bar], 1)
    assert plain.details["evidence"] == "saving the last checkpoint"


#: The end of a real loop whose top-level ``@logger.catch`` (loguru) swallowed its crash at
#: step 580 of 1500: the process exited 0.
SWALLOWED = [
    "2026-11-29 17:40:02.120 | INFO     | __main__:<module>:30 - step 580/1500 loss 0.4431",
    "2026-11-29 17:40:02.125 | ERROR    | __main__:<module>:33 - An error has been caught in"
    " function '<module>', process 'MainProcess' (2411), thread 'MainThread' (1400):",
    "Traceback (most recent call last):",
    '  File "job.py", line 27, in <module>',
    "    loss = model(x).sum()",
    "RuntimeError: mat1 and mat2 shapes cannot be multiplied (32x11 and 12x32)",
]


def test_a_job_that_exits_0_right_after_an_error_it_swallowed_warns() -> None:
    (alert,) = crashed(SWALLOWED, 0)
    assert (alert.severity, alert.details["class"]) == (Severity.WARNING, "swallowed")
    assert "mat1 and mat2" in alert.details["evidence"]
    assert crashed([*SWALLOWED, "training done: 1500 steps"], 0) == []
    shutdown = [
        "training done",
        "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f>",
        "Traceback (most recent call last):",
        '  File "dataloader.py", line 1477, in __del__',
        "TypeError: 'NoneType' object is not callable",
    ]
    assert crashed(shutdown, 0) == []


def test_signal_is_named_in_message() -> None:
    (alert,) = crashed([], -signal.SIGKILL)
    assert "SIGKILL" in alert.message


def test_exit_zero_raises_nothing_after_a_clean_end() -> None:
    assert crashed([*CUDA_OOM, "retrying with a smaller batch", "training done"], 0) == []
    # The OOM the last thing it printed, then 0: swallowed, a warning, never a crash.
    (alert,) = crashed(CUDA_OOM, 0)
    assert (alert.severity, alert.details["class"]) == (Severity.WARNING, "swallowed")


@pytest.mark.parametrize(
    "exit_code", [1, -signal.SIGTERM, -signal.SIGKILL], ids=["code-1", "sigterm", "sigkill"]
)
def test_expected_exit_raises_nothing(exit_code: int) -> None:
    assert crashed(CUDA_OOM, exit_code, expected=True) == []


def test_job_started_forgets_previous_attempts_output() -> None:
    detector = JobCrashDetector(JobCrashConfig())
    detector.job_started(NOW)
    for text in CUDA_OOM:
        detector.output(Line("stderr", text, NOW))
    detector.job_started(NOW + 10)
    for text in PLAIN_VALUE_ERROR:
        detector.output(Line("stderr", text, NOW + 11))
    (alert,) = detector.job_exited(1, NOW + 12, expected=False)
    assert alert.details["class"] == "other"


def test_only_the_last_tail_lines_are_kept() -> None:
    detector = JobCrashDetector(JobCrashConfig(tail_lines=3))
    for text in [*CUDA_OOM, "step 1", "step 2", "step 3"]:
        detector.output(Line("stdout", text, NOW))
    (alert,) = detector.job_exited(1, NOW, expected=False)
    assert alert.details["class"] == "other"


#: What each library raises when NaN reaches it (the messages as their sources write them).
NON_FINITE = {
    "torch-multinomial": "RuntimeError: probability tensor contains either `inf`, `nan` or"
    " element < 0",
    "autograd-anomaly": "RuntimeError: Function 'DivBackward0' returned nan values in its 0th"
    " output.",
    "rsl-rl-check-nan": "ValueError: The rewards returned by the environment contain NaN values."
    " This usually indicates a bug in the environment's reward computation.",
    "tf-check-numerics": "tensorflow.python.framework.errors_impl.InvalidArgumentError:"
    " gradients/loss : Tensor had NaN values",
    "fairseq-gradients": "FloatingPointError: gradients are Nan/Inf",
    "torch-bce-on-nan": "RuntimeError: all elements of input should be between 0 and 1",
}


@pytest.mark.parametrize("text", NON_FINITE.values(), ids=NON_FINITE.keys())
def test_a_crash_on_a_nan_is_non_finite(text: str) -> None:
    (alert,) = crashed(["Traceback (most recent call last):", text], 1)
    assert (alert.details["class"], alert.details["evidence"]) == ("non_finite", text)


@pytest.mark.parametrize("run", ["sb3/ppo_nan", "rsl_rl/nan"])
def test_an_rl_run_whose_policy_went_nan_ends_in_a_non_finite_crash(run: str) -> None:
    """Real runs (tests/fixtures/sb3/ppo_nan, rsl_rl/nan): the value network NaN, the
    policy NaN after one clipped step, and torch's argument check ends the run (SB3: its
    tensor of NaN logits printed after the exception's line)."""
    folder = Path(__file__).resolve().parents[1] / "fixtures" / run
    lines = (folder / "console.txt").read_text().splitlines()
    truth = json.loads((folder / "expected.json").read_text())
    (alert,) = crashed(lines[-200:], 1)
    assert alert.details["class"] == "non_finite"
    assert alert.details["evidence"] == truth["crash"].strip()


def test_classify_prefers_device_assert_over_bad_data() -> None:
    crash_class, _, evidence = classify(DEVICE_ASSERT_INDEX, 1)
    assert crash_class == "device_assert"
    assert "device-side assert" in evidence


def test_a_token_that_straddles_the_quotes_cut_is_left_out_not_cut_in_the_clear() -> None:
    """The message quotes 300 characters of the crash: cut through a token, its first 15
    went to every target unmasked (its shape needs more to be recognised). The word the
    cut goes through is left out whole; one that fits is quoted whole (masked where it is
    shown)."""
    token = "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0"
    (alert,) = crashed(["RuntimeError: " + "x" * 270 + " " + token], 1)
    assert "ghp_" not in alert.message, alert.message
    assert alert.message.endswith("x" * 270 + "...)"), alert.message
    (alert,) = crashed(["RuntimeError: bad " + token], 1)
    assert f"(RuntimeError: bad {token})" in alert.message
