"""The plain PyTorch loop of ``torch_print.py`` and ``torch_tensorboard.py``: a linear layer,
SGD, ``STEPS`` steps (150), each started with ``at_step``, the loss NaN from ``NAN_FROM``.
Each job reports the loss its own way."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from common import NAN_FROM, at_step


def train(report: Callable[[int, torch.Tensor], None]) -> None:
    """Run the loop, handing ``report`` each step's number and loss after the update."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(int(os.environ.get("STEPS", "150"))):
        at_step(step)
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if step >= NAN_FROM:
            loss = loss * float("nan")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        report(step, loss)
