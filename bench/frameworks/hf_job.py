"""An HF ``Trainer`` job with its defaults (``logging_steps=500``, ``logging_nan_inf_filter``),
but ``save_strategy="no"``. ``LOGGING_STEPS=N`` and ``NO_FILTER=1`` change one thing each."""

from __future__ import annotations

import os
from typing import Any

import torch
from common import NAN_FROM, at_step
from transformers import Trainer, TrainingArguments


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.layer(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(4096, 4, generator=generator)
        self.y = torch.randn(4096, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "labels": self.y[index]}


class NanTrainer(Trainer):
    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **kw: Any) -> Any:
        at_step(self.state.global_step)
        loss = super().compute_loss(model, inputs, return_outputs=return_outputs, **kw)
        if self.state.global_step >= NAN_FROM and not return_outputs:
            loss = loss * float("nan")
        return loss


options: dict[str, Any] = {}
if "LOGGING_STEPS" in os.environ:
    options["logging_steps"] = int(os.environ["LOGGING_STEPS"])
if os.environ.get("NO_FILTER"):
    options["logging_nan_inf_filter"] = False
arguments = TrainingArguments(
    output_dir="out",
    max_steps=int(os.environ.get("STEPS", "600")),
    use_cpu=True,
    save_strategy="no",
    **options,
)
NanTrainer(model=Tiny(), args=arguments, train_dataset=Data()).train()
