"""A plain PyTorch loop that prints ``step N | loss X`` every ``EVERY`` steps (default 1)."""

from __future__ import annotations

import os

import torch
from torch_loop import train

every = int(os.environ.get("EVERY", "1"))


def report(step: int, loss: torch.Tensor) -> None:
    if step % every == 0:
        print(f"step {step} | loss {loss.item():.4f}")


train(report)
