"""A 2-rank DDP job whose ranks each print their own loss, an order of magnitude apart.

    torchrun --standalone --nproc-per-node 2 ranks_job.py STEPS NAN_STEP [plain] [JSONL_DIR]

The ranks train one tiny linear regression under DDP (gloo all-reduces the gradients), each
on its own batches, and print ``[rank<r>] step <n> | loss <x>`` every step. Both fit one line, but
rank 1's targets carry about ten times the noise of rank 0's, so once the model has learned
its loss stays an order of magnitude above rank 0's (about 10 against 1). At ``NAN_STEP``
(0: never) rank 1 alone prints a NaN loss, as a rank whose batch went bad does. With
``plain`` the lines carry no ``[rank<r>]`` of their own (torchrun's ``--tee 3`` labels them
``[default<r>]:``; ``tests/fixtures/ranks/make_ranks_logs.sh``). With ``JSONL_DIR`` each
rank also appends ``{"step": n, "loss": x}`` to its own ``JSONL_DIR/metrics_rank<r>.jsonl``,
as scripts that log every rank do. A line is
written with one ``os.write``, so two ranks sharing a pipe never glue their lines.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    steps, nan_step = int(sys.argv[1]), int(sys.argv[2])
    plain = sys.argv[3:4] == ["plain"]
    jsonl_dir = sys.argv[4] if len(sys.argv) > 4 else None
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
    noise = 10.0**0.5 if rank == 1 else 1.0
    for step in range(1, steps + 1):
        inputs = torch.randn(64, 8, generator=generator)
        targets = inputs.sum(dim=1, keepdim=True) + 3.0
        targets += noise * torch.randn(64, 1, generator=generator)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        value = float("nan") if rank == 1 and step == nan_step else loss.item()
        label = "" if plain else f"[rank{rank}] "
        os.write(1, f"{label}step {step} | loss {value:.4f}\n".encode())
        if jsonl_dir is not None:
            with open(os.path.join(jsonl_dir, f"metrics_rank{rank}.jsonl"), "a") as metrics:
                metrics.write(json.dumps({"step": step, "loss": value}) + "\n")
    # Both ranks done before either tears down: gloo's teardown while the other rank is
    # still in its last collective fails the job now and then on a loaded machine.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
