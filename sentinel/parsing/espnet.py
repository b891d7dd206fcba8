"""ESPnet2's training log (``exp/*/train.log``; FunASR prints the same).

Each ``log_interval`` batches::

    [host] 2020-04-05 16:34:56,315 (trainer:453) INFO: 2epoch:train:1-10batch: iter_time=0.006,
    forward_time=0.076, loss=50.873, loss_att=35.801, loss_ctc=65.945, acc=0.471, ...,
    optim0_lr0=1.000, train_time=0.203

(FunASR: ``2epoch:train:1-50batch:50num_updates: ...``), and at each epoch's end
``2epoch results: [train] ... loss=..., [valid] loss=..., acc=..., [att_plot] ...``.

The step: FunASR's ``num_updates`` where it prints it. ESPnet's own counts batches within
the epoch, so the step is the batches since the first epoch began (``values.EpochBatches``);
a log that starts after the first epoch (an excerpt, a resumed run) cannot tell the epochs
before: its lines name no step, and are read at the last step known. Each line also gives the
epochs done (``epoch``: 1 during the second epoch), which places an onset among ESPnet's
checkpoints, named by epoch (``3epoch.pth``). The results line's ``[valid]`` values are
evaluations (``loss`` is ``eval_loss``, ``acc`` ``eval_acc``), at the epoch's last step;
its ``[train]`` values are the epoch's means of what the interval lines showed, not read
again. A ``LineFormat``: it counts the batches of its epochs.
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.keyvalue import as_evaluation, find_pairs
from sentinel.parsing.values import EpochBatches

_INTERVAL = re.compile(r"(\d+)epoch:train:(\d+)-(\d+)batch(?::(\d+)num_updates)?:\s*(.*)$")
_RESULTS = re.compile(r"(\d+)epoch results: (.*)$")
_SECTION = re.compile(r"\[(\w+)\]")
#: ``optim0_lr0`` (ESPnet), ``lr_0`` (older): the first optimizer's first group's rate.
_LR = re.compile(r"(?:optim\d+_)?lr_?\d+")


class EspnetLog:
    """Reads ESPnet2's interval and results lines, counting the batches of its epochs."""

    __slots__ = ("_batches",)

    def __init__(self) -> None:
        self._batches = EpochBatches()

    def parse(self, text: str) -> list[Sample] | None:
        """Samples of one stripped line; None for a line in another format."""
        if "epoch" not in text:
            return None
        if "epoch:train:" in text:
            found = _INTERVAL.search(text)
            if found is None:
                return None
            epoch, end = int(found.group(1)), int(found.group(3))
            counted = self._batches.step(epoch, end)
            updates = found.group(4)
            step = int(updates) if updates else counted
            pairs, _ = find_pairs(found.group(5))
            samples = [Sample(_name(name), value, step) for name, value in pairs]
            return [*samples, Sample("epoch", float(epoch - 1), step)]
        if "epoch results:" in text:
            found = _RESULTS.search(text)
            if found is None:
                return None
            epoch = int(found.group(1))
            step = self._batches.epoch_end(epoch)
            return [*_valid(found.group(2), step), Sample("epoch", float(epoch), step)]
        return None


def _name(name: str) -> str:
    return "lr" if _LR.fullmatch(name) else name


def _valid(text: str, step: int | None) -> list[Sample]:
    """The ``[valid]`` section's values as evaluations."""
    parts = _SECTION.split(text)  # ["", "train", "...", "valid", "...", ...]
    samples: list[Sample] = []
    for section, values in zip(parts[1::2], parts[2::2], strict=False):
        if section != "valid":
            continue
        pairs, _ = find_pairs(values)
        for name, value in pairs:
            if name in ("total_count", "time") or name.startswith("gpu_"):
                continue
            samples.append(Sample(as_evaluation(name), value, step))
    return samples
