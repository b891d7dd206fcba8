"""A job whose loss shifts up and stays, saving fast and keeping only its newest checkpoint,
for test_rotation_rollback.py.

    python shift_job.py CKPT RECORD

It logs ``{"step": N, "loss": L}`` each step (a loss about 2.0 with a little noise) and
saves ``CKPT/model_step<N>.pt`` every ``SAVE_EVERY`` steps (``torch.save``), deleting the
one it saved before (``save_top_k=1``, ``save_total_limit=1``). On its first attempt the
loss goes x3 at ``SHIFT_AT`` and stays: sentinel warns within a few values and acts once the
shift has held, by which time the job has saved ``SAVES_AFTER`` more times, and deleted every
checkpoint from before the shift. It resumes from ``SENTINEL_RESUME_FROM`` when set, and
appends what it did to RECORD (one JSON object a line).
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import torch
from attempt import attempt  # this folder's, beside the job

STEPS = 60
SHIFT_AT = 31
SAVE_EVERY = 3
#: Before the shift, steps come fast; from it on, slow enough that sentinel sees each save.
STEP_S = (0.03, 0.35)


def main() -> None:
    directory, record = Path(sys.argv[1]), Path(sys.argv[2])
    restart, resume_from, note = attempt(record)

    start = 0
    if resume_from:
        start = int(torch.load(resume_from, weights_only=True)["step"])
    note(event="start", resume_from=resume_from, start=start)
    noise = random.Random(start)
    previous = Path(resume_from) if resume_from else None
    for step in range(start + 1, STEPS + 1):
        shifted = restart == 0 and step >= SHIFT_AT
        loss = (2.0 + noise.uniform(-0.1, 0.1)) * (3.0 if shifted else 1.0)
        print(json.dumps({"step": step, "loss": round(loss, 4)}), flush=True)
        if step % SAVE_EVERY == 0:
            path = directory / f"model_step{step}.pt"
            torch.save({"step": step, "weights": torch.zeros(4)}, path)
            if previous is not None and previous.exists():
                previous.unlink()  # only the newest is kept
            note(event="saved", step=step, deleted=previous.name if previous else None)
            previous = path
        time.sleep(STEP_S[step >= SHIFT_AT and restart == 0])
    note(event="finished", step=STEPS)


if __name__ == "__main__":
    main()
