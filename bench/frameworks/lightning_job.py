"""A Lightning job as users write it: ``self.log("train_loss", loss, prog_bar=True)``,
``CSVLogger``, the default bar (rich's when rich is installed). ``BAR=tqdm|none`` and
``LOG_EVERY=N`` (``log_every_n_steps``) change one thing each."""

from __future__ import annotations

import os
from typing import Any

import lightning as L
import torch
from common import NAN_FROM, at_step
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        at_step(self.global_step)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        if self.global_step >= NAN_FROM:
            loss = loss * float("nan")
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(200, 4), torch.randn(200, 1))
options: dict[str, Any] = {}
if "LOG_EVERY" in os.environ:
    options["log_every_n_steps"] = int(os.environ["LOG_EVERY"])
if os.environ.get("BAR") == "none":
    options["enable_progress_bar"] = False
if os.environ.get("BAR") == "tqdm":
    options["callbacks"] = [TQDMProgressBar()]
trainer = L.Trainer(
    max_epochs=3,
    logger=CSVLogger("."),
    accelerator="cpu",
    enable_checkpointing=False,
    enable_model_summary=False,
    **options,
)
trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=4))
