"""A plain PyTorch DDP job, as users write one, for the rollback tests (run under torchrun).

    python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_job.py LAYOUT CKPT RECORD
    python ddp_job.py LAYOUT CKPT RECORD    # one process: a process group of one, no torchrun

LAYOUT is how it saves every ``SAVE_EVERY`` steps (rank 0 saves, as DDP scripts do):

- ``hf-names``: ``CKPT/checkpoint-<N>/model.pt`` (HF-like folder names, plain ``torch.save``)
- ``step-files``: ``CKPT/model_step<N>.pt``
- ``one-file``: ``CKPT/ckpt.pt``, rewritten in place at every save (nanoGPT's habit)

On its first attempt it goes NaN at ``NAN_AT``, right after that step's save, and trains on
(as a real job would). It resumes from ``RESUME_FROM`` (the checkpoint file) when set. Each rank
appends what it did to RECORD (one JSON object a line): its pid, restart, where it resumed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 80
SAVE_EVERY = 20
NAN_AT = 60
#: Seconds a step takes: long enough that saves are seconds apart, as in real runs.
STEP_S = float(os.environ.get("DDP_STEP_S", "0.1"))


def checkpoint_path(layout: str, directory: Path, step: int) -> Path:
    if layout == "hf-names":
        return directory / f"checkpoint-{step}" / "model.pt"
    if layout == "step-files":
        return directory / f"model_step{step}.pt"
    return directory / "ckpt.pt"


def main() -> None:
    layout, directory, record = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank()
    restart = int(os.environ.get("SENTINEL_RESTART") or 0)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    resume_from = os.environ.get("RESUME_FROM") or ""
    if resume_from:
        state = torch.load(resume_from, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])

    def note(**fields: object) -> None:
        fields.update(rank=rank, pid=os.getpid(), restart=restart)
        with record.open("a") as handle:
            handle.write(json.dumps(fields) + "\n")

    note(event="start", resume_from=resume_from, start=start)
    generator = torch.Generator().manual_seed(rank)
    for step in range(start + 1, STEPS + 1):
        inputs = torch.randn(8, 4, generator=generator)
        loss = model(inputs).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % SAVE_EVERY == 0 and rank == 0:
            path = checkpoint_path(layout, directory, step)
            path.parent.mkdir(parents=True, exist_ok=True)
            state = {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step,
            }
            torch.save(state, path)
        value = float("nan") if restart == 0 and step >= NAN_AT else loss.item()
        if rank == 0:
            print(json.dumps({"step": step, "loss": value}), flush=True)
        time.sleep(STEP_S)
    note(event="finished", step=STEPS)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
