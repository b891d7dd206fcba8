"""A Lightning job as users write it: ``self.log("train_loss", loss, prog_bar=True)``,
``CSVLogger``, the default bar (rich's when rich is installed). ``BAR=tqdm|none`` and
``LOG_EVERY=N`` (``log_every_n_steps``) change one thing each.

The model and its training are the end-to-end test's (``tests/e2e/lightning_job.py``,
found through the ``PYTHONPATH`` that ``measure.py`` sets); here each step starts with
``at_step`` and the run lasts 3 epochs."""

from __future__ import annotations

import os
from typing import Any

from common import NAN_FROM, at_step
from lightning.pytorch.callbacks import TQDMProgressBar

from tests.e2e.lightning_job import fit

options: dict[str, Any] = {}
if "LOG_EVERY" in os.environ:
    options["log_every_n_steps"] = int(os.environ["LOG_EVERY"])
if os.environ.get("BAR") == "none":
    options["enable_progress_bar"] = False
if os.environ.get("BAR") == "tqdm":
    options["callbacks"] = [TQDMProgressBar()]
fit(at_step, NAN_FROM, max_epochs=3, **options)
