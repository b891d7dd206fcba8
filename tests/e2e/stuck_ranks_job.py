"""A 2-rank gloo job whose rank 1 hangs in its data loader while rank 0 waits in all_reduce.

    python stuck_ranks_job.py

Run without ``RANK`` it is the launcher: it starts ``torchrun --standalone
--nproc-per-node 2`` on itself and logs a step line every 0.2 s until the ranks have
taken their first step together (torch's import takes seconds on a busy machine: that
is no stall). Then rank 1 stops in ``read_shard`` and rank 0 blocks in the next step's
all_reduce: the distributed hang whose evidence must name both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

STARTED = Path(os.environ.get("STUCK_RANKS_STARTED", "started"))


def log_steps() -> None:
    step = 0
    while not STARTED.exists():
        step += 1
        print(json.dumps({"step": step, "loss": 2.0}), flush=True)
        time.sleep(0.2)


def launch() -> int:
    threading.Thread(target=log_steps, daemon=True).start()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return subprocess.call([*torchrun, "--nproc-per-node", "2", __file__])


def read_shard(rank: int) -> None:
    time.sleep(3600)  # a data loader that never returns


def train_step(tensor: object) -> object:
    import torch.distributed as dist

    dist.all_reduce(tensor)  # type: ignore[arg-type]
    return tensor


def main() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensor = torch.ones(4)
    train_step(tensor)
    if rank == 0:
        STARTED.touch()
    else:
        read_shard(rank)
    train_step(tensor)


if __name__ == "__main__":
    if "RANK" in os.environ:
        main()
    else:
        sys.exit(launch())
