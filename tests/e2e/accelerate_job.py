"""A real accelerate loop that saves with ``automatic_checkpoint_naming`` and ``total_limit``
and resumes with ``load_state()`` (the newest ``checkpoints/checkpoint_<i>``), as accelerate's
own examples do.

Usage: ``python accelerate_job.py PROJECT_DIR STARTS_FILE``: 60 steps, a save and then a
logged loss (a JSON line) every 5. The first attempt feeds a NaN batch at step 33, which
poisons the weights; every start appends what it resumed to ``STARTS_FILE``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration

STEPS, SAVE_EVERY, LOG_EVERY, NAN_AT = 60, 5, 5, 33


class Counter:
    """The step, saved and loaded with the model as a registered object."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]


def main() -> None:
    project, starts = Path(sys.argv[1]), Path(sys.argv[2])
    config = ProjectConfiguration(
        project_dir=str(project), automatic_checkpoint_naming=True, total_limit=3
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    saves = project / "checkpoints"
    if saves.is_dir() and os.listdir(saves):
        accelerator.load_state()  # the newest checkpoint_<i>, by the number in its name
        numbers = [
            int(m[1]) for p in saves.iterdir() if (m := re.fullmatch(r"checkpoint_(\d+)", p.name))
        ]
        accelerator.project_configuration.iteration = max(numbers) + 1  # as its error asks
    first = not os.environ.get("SENTINEL_RESTART")
    with starts.open("a") as record:
        record.write(
            json.dumps(
                {
                    "step": counter.step,
                    "entries": sorted(os.listdir(saves)) if saves.is_dir() else [],
                }
            )
            + "\n"
        )
    weights = torch.randn(8, 1)
    while counter.step < STEPS:
        counter.step += 1
        x = torch.randn(16, 8)
        if first and counter.step == NAN_AT:
            x[0, 0] = float("nan")  # a bad batch: Adam carries the NaN into every weight
        loss = torch.nn.functional.mse_loss(model(x), x @ weights)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        if counter.step % SAVE_EVERY == 0:
            accelerator.save_state()  # before the step's line: the save of step 35 holds the NaN
        if counter.step % LOG_EVERY == 0:
            print(json.dumps({"step": counter.step, "loss": loss.item()}), flush=True)
        time.sleep(0.03)


if __name__ == "__main__":
    main()
