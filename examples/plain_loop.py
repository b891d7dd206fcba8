"""A plain PyTorch training loop that sentinel can watch, roll back and restart.

    sentinel run --checkpoints ckpt -- python examples/plain_loop.py

It prints one JSON line per logging step (what sentinel reads), saves ``ckpt/step_<N>.pt``
every ``--save-every`` steps (the step in the name: what a rollback sorts by), and resumes
from ``SENTINEL_RESUME_FROM`` when sentinel restarts it. ``NAN_AT=30`` makes its first attempt's
loss NaN from step 30 on, to see sentinel act (a restarted attempt runs clean).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--log-every", type=int, default=1)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--ckpt", type=Path, default=Path("ckpt"))
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    resume = os.environ.get("SENTINEL_RESUME_FROM")
    if resume:  # sentinel restarted the job after a rollback: continue from the clean state
        state = torch.load(resume, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"resumed from {resume} at step {start}", flush=True)
    nan_at = int(os.environ.get("NAN_AT", "0"))
    first_attempt = not os.environ.get("SENTINEL_RESTART")

    data = torch.randn(256, 16)
    target = data @ torch.linspace(-1, 1, 16).unsqueeze(1)
    args.ckpt.mkdir(parents=True, exist_ok=True)
    for step in range(start + 1, args.steps + 1):
        batch = torch.randint(0, 256, (32,))
        loss = torch.nn.functional.mse_loss(model(data[batch]), target[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        value = loss.item()
        if first_attempt and nan_at and step >= nan_at:
            value = math.nan  # what a blown-up run prints
        if step % args.log_every == 0:
            print(json.dumps({"step": step, "loss": value}), flush=True)
        if step % args.save_every == 0:
            state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, args.ckpt / f"step_{step}.pt")


if __name__ == "__main__":
    main()
