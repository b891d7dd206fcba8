"""A plain PyTorch loop logging to TensorBoard only (``SummaryWriter`` defaults), no prints."""

from __future__ import annotations

import torch
from torch.utils.tensorboard import SummaryWriter
from torch_loop import train

writer = SummaryWriter("runs/exp")


def report(step: int, loss: torch.Tensor) -> None:
    writer.add_scalar("train/loss", loss.item(), step)


train(report)
writer.close()
