"""A plain PyTorch job that keeps only its newest checkpoint, for test_rotation_rollback.py.

    python newest_only_job.py CKPT RECORD

Every ``SAVE_EVERY`` steps it saves ``CKPT/model_step<N>.pt`` (``torch.save`` of the model,
the optimizer and the step), then deletes the one it saved before, as Lightning's default
``save_top_k=1`` and HF's ``save_total_limit=1`` do. On its first attempt it goes NaN at
``NAN_AT``, right after that step's save (which deleted the last clean one), and trains on.
It resumes from ``SENTINEL_RESUME_FROM`` when set. It appends what it did to RECORD (one
JSON object a line).

A step takes ``STEP_S`` on the first attempt, so its saves are seconds apart (as in real
runs: sentinel keeps a checkpoint once it has not changed for 2 s); a restarted attempt
runs at full speed, as nothing it saves needs keeping for the test.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from attempt import attempt  # this folder's, beside the job

STEPS = 30
SAVE_EVERY = 10
NAN_AT = 20
STEP_S = 0.4


def main() -> None:
    directory, record = Path(sys.argv[1]), Path(sys.argv[2])
    restart, resume_from, note = attempt(record)

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if resume_from:
        state = torch.load(resume_from, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    note(event="start", resume_from=resume_from, start=start)
    previous = Path(resume_from) if resume_from else None
    generator = torch.Generator().manual_seed(1)
    for step in range(start + 1, STEPS + 1):
        loss = model(torch.randn(8, 4, generator=generator)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % SAVE_EVERY == 0:
            path = directory / f"model_step{step}.pt"
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            torch.save(state, path)
            if previous is not None and previous.exists():
                previous.unlink()  # only the newest is kept
            note(event="saved", step=step, deleted=previous.name if previous else None)
            previous = path
        value = float("nan") if restart == 0 and step >= NAN_AT else loss.item()
        print(json.dumps({"step": step, "loss": value}), flush=True)
        time.sleep(STEP_S if restart == 0 else 0.01)
    note(event="finished", step=STEPS)


if __name__ == "__main__":
    main()
