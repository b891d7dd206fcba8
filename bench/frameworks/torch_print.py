"""A plain PyTorch loop that prints ``step N | loss X`` every ``EVERY`` steps (default 1)."""

from __future__ import annotations

import os

import torch
from common import NAN_FROM, at_step

every = int(os.environ.get("EVERY", "1"))
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
    if step % every == 0:
        print(f"step {step} | loss {loss.item():.4f}")
