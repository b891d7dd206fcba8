"""A real HF ``Trainer`` run whose loss turns NaN at a known step, printing only what the
Trainer prints (its tqdm bar and metrics dicts, no ``trainer_state.json``: nothing saved).

Usage: ``python hf_nan_job.py NAN_AT``: 2 epochs of 16 steps, ``logging_steps=4``; the
forward pass of step ``NAN_AT`` returns NaN, which the Trainer logs at the next multiple
of 4 (and every loss after it, the weights being NaN by then).
"""

from __future__ import annotations

import sys
import time

import torch
from transformers import Trainer, TrainingArguments


class Tiny(torch.nn.Module):
    """A linear regression that returns NaN on its ``nan_at``-th training forward pass."""

    def __init__(self, nan_at: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.nan_at, self.calls = nan_at, 0

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls += self.training
        time.sleep(0.02)  # a step takes a while, as a real one does: tqdm redraws in between
        loss = torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)
        if self.training and self.calls == self.nan_at:
            loss = loss * float("nan")
        return {"loss": loss}


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = [{"x": row, "y": row.sum()} for row in x]
    args = TrainingArguments(
        output_dir="out",
        num_train_epochs=2,
        per_device_train_batch_size=4,
        logging_steps=4,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=False,
    )
    Trainer(model=Tiny(int(sys.argv[1])), args=args, train_dataset=data).train()


if __name__ == "__main__":
    main()
