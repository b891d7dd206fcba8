"""A Keras 3 job (torch backend) with its defaults: ``fit(verbose="auto")``; the inputs of
every batch from global step 60 on are NaN (a bad shard), 50 steps an epoch."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")

from typing import Any

import keras
import numpy as np
from common import NAN_FROM, at_step

BATCH = 32
STEPS_PER_EPOCH = 50
rng = np.random.default_rng(0)
x = rng.normal(size=(BATCH * STEPS_PER_EPOCH, 4)).astype("float32")
y = rng.normal(size=(BATCH * STEPS_PER_EPOCH, 1)).astype("float32")


class Steps(keras.callbacks.Callback):
    step = 0

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        at_step(Steps.step)
        Steps.step += 1


class Data(keras.utils.PyDataset):
    def __len__(self) -> int:
        return STEPS_PER_EPOCH

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        inputs = x[index * BATCH : (index + 1) * BATCH].copy()
        if Steps.step >= NAN_FROM:  # fetched for the step about to begin
            inputs[:] = np.nan
        return inputs, y[index * BATCH : (index + 1) * BATCH]


model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(Data(), epochs=3, callbacks=[Steps()], shuffle=False)
