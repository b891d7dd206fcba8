"""A Lightning job as many users write it, for ``test_lightning_live.py``.

``self.log("train_loss", loss, prog_bar=True)``, ``log_every_n_steps=10``, the default
progress bar (rich's, when rich is installed), ``CSVLogger`` with its defaults; 50 steps
an epoch, 5 epochs, each step about ``STEP_S`` long (a real model's pace, so "within 20
steps" measures sentinel, not a CPU racing through a linear layer). From global step
``NAN_FROM`` the loss is NaN. Each step writes its number to ``last_step``, so the test
knows how far the job got before it was stopped.
"""

from __future__ import annotations

import os
import time

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger

NAN_FROM = 60
STEP_S = float(os.environ.get("STEP_S", "0.04"))


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        with open("last_step", "w") as stream:
            stream.write(str(self.global_step))
        time.sleep(STEP_S)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        if self.global_step >= NAN_FROM:
            loss = loss * float("nan")
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(200, 4), torch.randn(200, 1))
    trainer = L.Trainer(
        max_epochs=5,
        log_every_n_steps=10,
        logger=CSVLogger("."),
        accelerator="cpu",
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=4))
