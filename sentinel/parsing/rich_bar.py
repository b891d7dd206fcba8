"""Lightning's progress bars: the rich one and the tqdm one, with the run's global step.

Lightning draws its training bar per epoch, so the count on it starts again at every
epoch; the step a metric on it belongs to is the global one, ``epoch x batches per
epoch + count - 1`` (the bar counts a batch once it is done; Lightning numbers the
step of batch 0 as 0, as its ``metrics.csv`` does). That holds for one optimizer step
a batch, Lightning's default; with ``accumulate_grad_batches`` it counts batches. A bar
whose metrics name the global step (NeMo logs ``global_step=5.000`` to it) is at that
step, which counts optimizer steps as the checkpoints' names do.

- rich (``RichProgressBar``, picked once ``rich`` is installed), one line a redraw::

      Epoch 1/4  ━━━━━━━━╸━━━━ 11/50 0:00:00 • 0:00:01 415.01it/s v_num: 0.000 train_loss: nan

  (``Epoch 4/-2`` where the run sets no ``max_epochs``, only ``max_steps``.)

  On a narrow terminal its metrics wrap onto the next line (``train_loss: nan`` alone),
  which the key-value parser reads at the step this bar's progress sample set.
  ``Validation`` and ``Sanity Checking`` bars are recognised and give nothing.
- tqdm (``TQDMProgressBar``)::

      Epoch 1:  24%|██▍       | 12/50 [00:01<00:02, 12.3it/s, v_num=0, train_loss=2.310]

  Lightning pads its numbers to five characters, so a NaN reads ``nan.0``. tqdm redraws
  once for the count and once for the metrics, so the first frame of a step may still
  show the step before's values (the NaN is still read at its own step). A bar at 0 of
  an epoch names no step: tqdm draws the old epoch's description at 0 when it resets.

Escape sequences (colours, cursor moves) are dropped before reading; ``v_num`` (the
logger's version) is not a metric.
"""

from __future__ import annotations

import re

from sentinel.model.records import PROGRESS, Sample
from sentinel.parsing.keyvalue import find_pairs

#: CSI sequences (colours, erases, cursor moves), OSC ones (titles, links), and the rest.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]")
_CLOCK = r"(?:\d+:)?\d+:\d{2}"
_RICH = re.compile(
    r"(?P<description>[A-Z][\w ]*?(?:\s+(?P<epoch>\d+)(?:/-?\d+)?)?)\s+"
    r"[━╸╺╾╼─\s]*?"  # the bar itself, absent when the terminal is narrow
    r"(?P<count>\d+)/(?P<total>\d+|\S+)\s+"
    rf"{_CLOCK}\s+•\s+(?:{_CLOCK}|-:--:--)\s+"
    r"(?:[\d.]+|\?)\s*it/s"
    r"(?P<rest>.*)$"
)
_TQDM = re.compile(
    r"Epoch (?P<epoch>\d+):\s+(?:\d{1,3}%\|[^|]*\|\s*)?"
    r"(?P<count>\d+)/(?P<total>\d+|\?)\s+"
    r"\[[^\],]*(?:,(?P<rest>[^\]]*))?\]\s*$"
)
#: Lightning's padding of a non-finite number (``nan.0``, ``-inf.``).
_PADDED = re.compile(r"\b(nan|inf)\.0*(?![\w.])", re.IGNORECASE)
#: Bar fields that are not metrics: the logger's version number.
_NOT_METRICS = frozenset({"v_num"})


def strip_escapes(text: str) -> str:
    """``text`` without terminal escape sequences."""
    return _ESCAPES.sub("", text) if "\x1b" in text else text


def parse_rich_bar(text: str) -> list[Sample] | None:
    """A Lightning bar's metrics and progress at the global step; ``[]`` for its other bars
    (validation, sanity check); None for no Lightning bar."""
    if "it/s" not in text and "Epoch" not in text:
        return None
    text = strip_escapes(text).strip()
    bar = _RICH.match(text)
    if bar is None:
        bar = _TQDM.match(text)
        if bar is None:
            return None
    elif not bar.group("description").startswith("Epoch"):
        return []  # Validation, Sanity Checking, Testing, Predicting
    epoch_text = bar.group("epoch")
    total_text = bar.group("total")
    count = int(bar.group("count"))
    step: int | None = None
    # At 0 a bar has done nothing this epoch, and tqdm's reset draws the old epoch at 0.
    if epoch_text is not None and total_text.isdigit() and count > 0:
        step = int(epoch_text) * int(total_text) + count - 1
    samples: list[Sample] = []
    rest = bar.group("rest")
    if rest:
        if "." in rest:
            rest = _PADDED.sub(r"\1", rest)
        pairs, named = find_pairs(rest)
        if named is not None:
            step = named  # the trainer's own global step (NeMo logs it): accumulation counted
        samples = [Sample(name, value, step) for name, value in pairs if name not in _NOT_METRICS]
    if step is not None:
        samples.append(Sample(PROGRESS, float(step), step))
    return samples
