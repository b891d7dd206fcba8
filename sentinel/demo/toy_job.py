"""A toy training job for ``sentinel demo``: pure Python, no torch.

It fits a small vector by noisy gradient descent, in simulated fp16 (values
past 65504 overflow to inf, as half precision does). At ``--jump-step`` its
learning-rate schedule jumps far too high, the gradient norm explodes and the
loss goes NaN. It logs one JSON line a step and saves an HF-style
``checkpoint-N/`` (a real ``model.safetensors`` plus ``trainer_state.json``)
every ``--save-every`` steps, before logging that step, as a Trainer does.

Restarted by sentinel, it reads ``SENTINEL_RESUME_FROM`` to resume and
``SENTINEL_RESTART`` to use a gentler learning rate, as a user's script might.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import struct
import sys
import time
from pathlib import Path
from types import FrameType

FP16_MAX = 65504.0
DIM = 8
#: The loss no model gets under (the data's own entropy, as in a language model's loss), so
#: the logged loss has a realistic level and noise instead of shrinking towards zero.
LOSS_FLOOR = 1.2


def fp16(value: float) -> float:
    """Round-trip through half precision's range: overflow becomes inf, inf - inf NaN."""
    if math.isnan(value) or abs(value) <= FP16_MAX:
        return value
    return math.copysign(math.inf, value)


def save_checkpoint(directory: Path, step: int, weights: list[float], lr: float) -> None:
    """Write ``checkpoint-<step>/`` atomically: a safetensors file and the trainer state."""
    final = directory / f"checkpoint-{step}"
    tmp = directory / f".tmp-checkpoint-{step}"
    tmp.mkdir(parents=True, exist_ok=True)
    header = json.dumps(
        {"w": {"dtype": "F64", "shape": [DIM], "data_offsets": [0, 8 * DIM]}}
    ).encode()
    payload = struct.pack(f"<{DIM}d", *weights)
    (tmp / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + payload)
    state = {"global_step": step, "learning_rate": lr, "log_history": []}
    (tmp / "trainer_state.json").write_text(json.dumps(state))
    tmp.rename(final)


def load_checkpoint(path: Path) -> tuple[int, list[float]]:
    data = (path / "model.safetensors").read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    weights = list(struct.unpack(f"<{DIM}d", data[8 + header_len : 8 + header_len + 8 * DIM]))
    step = int(json.loads((path / "trainer_state.json").read_text())["global_step"])
    return step, weights


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--jump-step", type=int, default=30, help="where the schedule goes wrong")
    parser.add_argument("--jump-lr", type=float, default=1.6)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--step-time", type=float, default=0.04, help="seconds per step")
    args = parser.parse_args(argv)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        print(f"toy job: {signal.Signals(signum).name} received, exiting", file=sys.stderr)
        sys.stderr.flush()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    checkpoints = args.out / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    restart = int(os.environ.get("SENTINEL_RESTART") or 0)
    resume_from = os.environ.get("SENTINEL_RESUME_FROM") or ""
    rng = random.Random(1234 + restart)
    target = [1.0] * DIM
    weights = [0.0] * DIM
    step = 0
    if resume_from:
        step, weights = load_checkpoint(Path(resume_from))
        print(f"toy job: resumed from {resume_from} at step {step}", file=sys.stderr)
    jump_lr = args.jump_lr if restart == 0 else args.lr / (2 * restart)
    if restart:
        print(f"toy job: restart {restart}, using a gentler learning rate", file=sys.stderr)

    while step < args.steps:
        step += 1
        lr = args.lr if step < args.jump_step else jump_lr
        lr = lr if restart == 0 else min(lr, args.lr / (2 * restart))
        grads = [
            fp16(2 * (w - t) + rng.gauss(0, 0.05)) for w, t in zip(weights, target, strict=True)
        ]
        weights = [fp16(w - lr * g) for w, g in zip(weights, grads, strict=True)]
        error = fp16(sum(fp16((w - t) ** 2) for w, t in zip(weights, target, strict=True)) / DIM)
        loss = fp16(LOSS_FLOOR + error)
        grad_norm = fp16(math.sqrt(sum(fp16(g * g) for g in grads)))
        if step % args.save_every == 0:
            save_checkpoint(checkpoints, step, weights, lr)
        record = {"step": step, "loss": loss, "grad_norm": grad_norm, "lr": lr, "time": time.time()}
        # Python's json writes NaN and Infinity bare, as many training scripts' loggers do.
        print(json.dumps(record), flush=True)
        time.sleep(args.step_time)
    print(f"toy job: finished {args.steps} steps, final loss {loss:.4f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
