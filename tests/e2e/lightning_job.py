"""A Lightning job as many users write it, for ``test_lightning_live.py``.

``self.log("train_loss", loss, prog_bar=True)``, ``log_every_n_steps=10``, the default
progress bar (rich's, when rich is installed), ``CSVLogger`` with its defaults; 50 steps
an epoch, 5 epochs, each step about ``STEP_S`` long (a real model's pace, so "within 20
steps" measures sentinel, not a CPU racing through a linear layer). From global step
``NAN_FROM`` the loss is NaN. Each step writes its number to ``last_step``, so the test
knows how far the job got before it was stopped.

The benchmark's Lightning job (``bench/frameworks/lightning_job.py``) runs this model
through ``fit`` too, with its own step hook and trainer options.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger

NAN_FROM = 60
STEP_S = float(os.environ.get("STEP_S", "0.04"))


class Model(L.LightningModule):
    """A linear layer; ``at_step(global_step)`` starts each step; NaN from ``nan_from``."""

    def __init__(self, at_step: Callable[[int], None], nan_from: int = NAN_FROM) -> None:
        super().__init__()
        self._at_step, self._nan_from = at_step, nan_from
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        self._at_step(self.global_step)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        if self.global_step >= self._nan_from:
            loss = loss * float("nan")
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(at_step: Callable[[int], None], nan_from: int = NAN_FROM, **options: Any) -> None:
    """Train ``Model`` on CPU over 200 seeded samples in batches of 4 (50 steps an epoch),
    logging with ``CSVLogger`` to the working directory, no checkpoints, no model summary;
    ``options`` for the rest of the ``Trainer``."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(200, 4), torch.randn(200, 1))
    trainer = L.Trainer(
        logger=CSVLogger("."),
        accelerator="cpu",
        enable_checkpointing=False,
        enable_model_summary=False,
        **options,
    )
    trainer.fit(Model(at_step, nan_from), torch.utils.data.DataLoader(data, batch_size=4))


def note_step(step: int) -> None:
    """Write ``step`` to ``last_step``, then take ``STEP_S``."""
    with open("last_step", "w") as stream:
        stream.write(str(step))
    time.sleep(STEP_S)


if __name__ == "__main__":
    fit(note_step, max_epochs=5, log_every_n_steps=10)
