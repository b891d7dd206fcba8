"""Human-written metric lines: ``step 120 | loss 2.31 | tok/s 15321``, ``loss=2.3, lr=3e-4``.

Three pair forms are read: ``key=value`` and ``key: value`` accept a key that
reads as a metric name (letters, digits, ``_``, ``/``, ``-``, ``.``; not a
CamelCase word such as ``UserWarning``, nor a log level); ``key value`` (space
only) accepts only a known metric name or alias, so prose does not become
metrics, and neither does ``key: value`` followed by a word (``workers: 4
workers``). Values are numbers or nan/inf, signed, any case. A leading
``2024-05-01 12:00:01`` timestamp becomes the samples' time.

Names of two words are read as one where a log writes them so: ``Grad Norm: 1.2``,
``Gradient Norm``, ``Learning Rate``, ``Loss Scale``, ``Total Loss`` (detectron2's and
YOLOX's ``total_loss`` is their loss), ``Val Loss``, ``Global Step``, and the other way
round before a ``:`` or ``=``, ``Loss Train: 1.23 | Loss Val: 1.31`` (LitGPT's ``loss
train:``), the train and the eval loss.

The step comes from any name a log gives it: ``step 120``, ``steps 8400``,
``iter 50``, ``iteration 100/ 500``, ``Global Step: 20``, ``num_updates 5000``,
``updates 10``, a number in brackets that starts a line of pairs (CLU's ``[130]
train/loss=2.31``); timm's ``Train: 2 [ 130/1251 (  8%)]`` is step ``2 x 1251 + 130``, and so
is PyTorch's ImageNet example's ``Epoch: [2][ 130/1251]`` and PyTorch-GAN's ``[Epoch 2/200]
[Batch 130/1251]``; Ignite's ``Epoch[2] Iteration[1130]`` is step 1130 (``Iteration[130/500]``:
the epoch's, 500 + 130); and
``| epoch 2 | 200/ 2983 batches`` (PyTorch's
word_language_model) is step ``2983 + 200``, counting the batches of the epochs
before; so is ``Epoch [2/5], Step [200/2983], Loss: 1.26`` (the PyTorch tutorials'
loop; ``Step [200/2983]`` alone is step 200) and fairseq's older ``| epoch 002:
200 / 2983 loss=...``.

A job's settings printed as it starts are not metrics: a settings object's repr,
``Namespace(lr=0.001, batch_size=32)``, ``TrainingArguments(...)``, and Ultralytics'
``engine/trainer: lr0=0.01, ...`` line (an ``lr`` there is what was asked for, not a rate
at a step).

A message that says what a metric is, as JVM trainers print it, is read too: ``Loss is
1.26``, ``Loss is Infinity``, and Deeplearning4j's ``Score at iteration 1500 is 1.26``
(the score is its loss) at step 1500; only for a known metric name, so prose stays prose.
It takes the step the line names otherwise (``Step 1500: Loss is 1.26``) and goes beside
its other pairs (``Epoch 3 Iteration 1500: Loss is nan``).
"""

from __future__ import annotations

import math
import re

from sentinel.model.records import Sample
from sentinel.parsing.values import (
    ALIASES,
    RECORD_STEP_KEYS,
    as_step,
    iso_to_epoch_seconds,
    normalise_name,
)

#: Names accepted in the space-separated ``key value`` form (lower-case).
KNOWN_KEYS: frozenset[str] = (
    frozenset(ALIASES) | frozenset(ALIASES.values()) | frozenset(RECORD_STEP_KEYS)
)
KNOWN_KEYS |= {"loss", "test_loss", "epoch", "ppl", "perplexity", "mfu", "accuracy", "acc"}
#: Keys of ``key: value`` that are words of a message, not metric names (lower-case).
NOT_METRIC_KEYS: frozenset[str] = frozenset(
    {
        "warning", "warn", "error", "info", "debug", "note", "critical", "fatal", "notice",
        "hint", "tip", "todo", "exception", "traceback", "line", "pid", "port", "errno",
        "code", "exit", "signal", "attempt", "retry", "retries", "version", "worker",
        "workers", "rank", "node", "host", "cuda", "device", "gpu", "file", "id", "to", "from",
        "at", "of", "in", "is", "by", "for", "with", "was", "be",
        # a run's length as it starts ("Starting training..., iters: 2596"), no metric
        "iters", "epochs", "max_iters", "max_steps", "max_epochs", "total_iters",
        "total_steps", "total_epochs", "num_epochs", "num_train_epochs",
        # a model's summary as it starts (Lightning's "Non-trainable params: 0")
        "params", "parameters",
    }
)  # fmt: skip

#: A value; PaddleOCR pads each to six characters with ``x`` (``{:x<6f}``): ``nanxxx``.
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?|nanx*|inf(?:inity|x*))"
_PAIR = re.compile(
    r"(?<![\w/.\-])"
    r"(?P<key>(?:eval|val|valid|validation|test|train|training|total)\s+loss|global\s+step"
    r"|loss\s+(?:train(?:ing)?|val(?:id(?:ation)?)?|eval|test)(?=\s*[:=])"
    r"|grad(?:ient)?\s+norm|learning\s+rate|loss\s+scale|fp16\s+grad\s+scale|[a-z_][\w/.\-]*)"
    r"(?P<sep>\s*=\s*|\s*:\s*|\s+)"
    rf"(?P<value>{_NUMBER})(?P<unit>(?-i:[KMGT])(?![\w%]))?(?:\s*/\s*\d+(?!\.\d))?"
    # Not part of something longer: 12:00:01, 10.0.0.1, 100%, 1.5s/it, 1,000, 2023-03-14.
    r"(?![\w%]|[.:]\w|,\d{3}|-\d\d-)",
    re.IGNORECASE,
)
#: Caffe's softmax loss of a NaN or Inf output, as it prints it: it clamps the probability
#: at ``FLT_MIN``, so the loss reads -ln(FLT_MIN) = 87.3365 and stays there, a NaN in all but
#: name (a GoogLeNet run's 11.23 -> 87.3365 at iteration 100, for good): read as NaN.
CAFFE_CLAMPED = "87.3365"
#: nanotron's ``human_format`` (on its lines only): ``tokens_per_sec: 14.2K``,
#: ``cuda_memory_allocated: 75.2M``.
_UNITS = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
#: nanotron's head, ``[INFO|DP=0|PP=0|TP=0|ip-26-0-160-225]:``: its ranks, no metrics.
_NANOTRON_HEAD = re.compile(r"\[[A-Z]+\|DP=\d+\|PP=\d+\|TP=\d+[^\]]*\]:?")
_LEADING_TIMESTAMP = re.compile(
    r"\[?(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)"
)
_SPACES = re.compile(r"\s+")
#: Names that are the training loss on a human-written line (not in a metrics file, whose
#: records may hold both): Mask R-CNN loops' ``losses``, nanotron's ``lm_loss``, DLLogger's
#: ``step_loss``; and Kaldi-style ``ep=23`` is the epoch.
_LINE_ALIASES = {"losses": "loss", "lm_loss": "loss", "step_loss": "loss", "ep": "epoch"}
#: Names a line gives once: a second ``loss`` (a total beside its part, a validation loss
#: after the training one, a GAN's second network) is not a second value of the training
#: loss, and is read as ``loss#2``.
_ONCE = frozenset({"loss", "grad_norm", "lr"})
#: A micro-batch's index (gradient accumulation): the line's loss is that micro-batch's, not
#: the step's, and is read as ``micro_loss`` (still a loss to ``nan_inf``); the step's own
#: line is the training loss. A loop printing ``step 315 micro 0..3 loss ...`` before
#: ``step 315 loss ...`` had its micro-batches taken for four ranks, and the order of their
#: noise for a critical ``divergence`` of "rank 1" while the step's loss was flat.
_MICRO_KEYS = frozenset(
    {"micro", "micro_step", "microstep", "micro_batch", "microbatch", "micro-batch",
     "micro-step", "accum_step", "accumulation_step"}
)  # fmt: skip
_QUOTED = re.compile(r"'([^'\s]*)'")
#: A value printed as a one-element list (a PaddlePaddle tensor's ``loss: [2.3456]``), not
#: one list followed by another (``Epoch: [2][ 130/500]``).
_LIST_VALUE = re.compile(rf"([:=]\s*)\[\s*({_NUMBER})\s*\](?!\s*\[)", re.IGNORECASE)
#: A key in brackets between pipes, its value after it (a loguru trainer's ``| [Loss] nan |
#: [step]   104 |``): read as ``Loss: nan``, only where the value ends its cell.
_BRACKET_KEY = re.compile(
    rf"(?<=\|)(\s*)\[([a-z][a-z_]*)\]\s+(?=(?:{_NUMBER})\s*(?:\||$))", re.IGNORECASE
)
#: A rate's unit after its value that counts samples, not tokens (``sample_per_sec``).
_SAMPLES_UNIT = re.compile(r"\s*samples?(?:_per_|/)", re.IGNORECASE)
#: TensorFlow's logging prefix, ``INFO:tensorflow:``.
_TF_LOG_PREFIX = re.compile(r"^(?:INFO|WARNING):tensorflow:")
#: glog's and absl's head: ``I1002 21:38:13.425730 139917864867392 logging_writer.py:35] ``.
_GLOG_HEAD = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [\w.\-]+:\d+\] ")
#: A line's step names, by how specific each is (``RECORD_STEP_KEYS``' order): LitGPT's
#: ``iter 400 step 100`` is at step 100, the optimizer's step its checkpoints are named by
#: (``step-00000100``), not at the 400th micro-batch of a run accumulating 4 (the older
#: lit-gpt's ``iter 16 step 1: loss ...``, a line a micro-batch and checkpoints named by
#: the iter, ``iter-000016-ckpt.pth``, is at its iter: ``_ITER_AND_STEP``).
_STEP_NAMES = {name: rank for rank, name in enumerate(RECORD_STEP_KEYS)}
#: The step names that may count within an epoch, where the line names its epoch and the
#: step's total (``_EPOCH_STEP_OF``); ``global_step`` never does.
_WITHIN_EPOCH_RANKS = frozenset(_STEP_NAMES[name] for name in ("step", "iteration", "iter"))
#: A word after a value: prose (``UserWarning: 4 workers``) unless it starts another pair.
#: A word after a value: prose (``time: 5 seconds``), not the next key (``layer_-1_loss: 0.17``,
#: whose ``-`` once made ``layer_`` a word and lost the pair before it).
_WORD_AFTER = re.compile(
    r"[ \t]+[a-z][\w/.\-]*+(?![ \t]*[:=]|[ \t]+(?:[-+]?[\d.]|nan\b|inf))", re.IGNORECASE
)
_CAMEL = re.compile(r"[a-z][A-Z]")
_EPOCH_BATCHES = re.compile(r"\|\s*epoch\s+(\d+)\s*\|\s*(\d+)\s*/\s*(\d+)\s+batches", re.IGNORECASE)
#: ``Train epoch: 0, batch: 790/34799, loss: ...`` (a hand-written loop; epochs from 0 here,
#: where the ``epoch_batch`` format, tried first, counts them from the first one it read).
EPOCH_BATCH_OF = re.compile(
    r"\bepoch\s*[:=]?\s*(\d+)\W{1,4}batch\s*[:=]?\s*(\d+)\s*/\s*(\d+)", re.IGNORECASE
)
#: ``Epoch [2/5], Step [200/2983]`` (epochs from 1), or ``Step [200/2983]`` alone; MindOCR's
#: ``epoch: [1/3] step: [100/1000]``.
_STEP_BRACKETS = re.compile(
    r"(?:\bepoch:?\s*\[\s*(\d+)\s*/\s*\d+\s*\]\W{1,4})?\bstep:?\s*\[\s*(\d+)\s*/\s*(\d+)\s*\]",
    re.IGNORECASE,
)
#: ``Epoch 4 Step 200/500`` (epochs from 1, as the bracketed form) and OpenNMT-lua's
#: ``Epoch 10 ; Iteration 50/213 ;``: the step counts within the epoch, as its total says.
_EPOCH_STEP_OF = re.compile(
    r"\bepoch\s*:?\s*(\d+)(?:\s*/\s*\d+)?\W{1,4}(?:step|iter(?:ation)?)\s*:?\s*(\d+)\s*/\s*(\d+)",
    re.IGNORECASE,
)
#: An iteration of all in brackets: mmcv 1.x's ``Iter [1100/160000]``, ``Iter: [600/1348]``,
#: PaddlePaddle's ICNet ``Iter[110]; train loss: nan``.
_ITER_BRACKETS = re.compile(
    r"\biter(?:ation)?\s*:?\s*\[\s*(\d+)\s*(?:/\s*\d+\s*)?\]", re.IGNORECASE
)
#: A name with a ``loss`` word and its value apart by spaces alone (``loss_total 116.117``):
#: read though the name is no known one, as a loss is what such a line is about.
_LOSS_WORD = re.compile(r"(?:^|_)loss(?:$|_)")
#: PyTorch's ImageNet example (its ``ProgressMeter``): ``Epoch: [2][ 130/500]`` (from 0);
#: with the epochs of all too, Swin Transformer's and SimMIM's ``Train: [6/300][900/1251]``
#: (``f'Train: [{epoch}/{EPOCHS}][{idx}/{num_steps}]'``, from 0) and ``Epoch: [127/300][ 35/464]``.
_EPOCH_BATCH_BRACKETS = re.compile(
    r"\b(?:epoch|train):\s*\[\s*(\d+)\s*(?:/\s*\d+\s*)?\]\s*\[\s*(\d+)\s*/\s*(\d+)\s*\]",
    re.IGNORECASE,
)
#: PyTorch-GAN's ``[Epoch 2/200] [Batch 130/938]`` (epochs from 0).
_EPOCH_OF_BATCH_OF = re.compile(
    r"\[\s*epoch\s+(\d+)\s*/\s*\d+\s*\]\s*\[\s*batch\s+(\d+)\s*/\s*(\d+)\s*\]", re.IGNORECASE
)
#: Ignite's ``Epoch[2] Iteration[1130]`` (the run's iteration), or ``Iteration[130/500]``
#: (the epoch's, epochs from 1).
_IGNITE = re.compile(
    r"\bepoch\s*\[\s*(\d+)\s*\]\s*iteration\s*\[\s*(\d+)\s*(?:/\s*(\d+)\s*)?\]", re.IGNORECASE
)
#: timm's ``Train: 2 [ 130/1251 (  8%)]  Loss: 6.91 (6.93)`` (epochs from 0).
_TIMM_TRAIN = re.compile(r"\btrain:\s*(\d+)\s*\[\s*(\d+)\s*/\s*(\d+)\b", re.IGNORECASE)
#: fairseq's older progress: ``| epoch 002:   200 / 2983 loss=...`` (epochs from 1).
_FAIRSEQ_EPOCH = re.compile(r"\|\s*epoch\s+(\d+)\s*:?\s+(\d+)\s*/\s*(\d+)\b", re.IGNORECASE)
#: OpenNMT-py's legacy progress: ``Epoch  1, 13350/37527; acc: ...; xent: ...`` (from 1).
_EPOCH_COMMA_BATCH = re.compile(r"\bepoch\s+(\d+)\s*,\s*(\d+)\s*/\s*(\d+)\s*;", re.IGNORECASE)
#: The step of its total that starts the line, before its pairs: keras-rl's
#: ``11087/50000: episode: 81, duration: 5.514s, episode steps: 164, ... loss: 0.27``.
_LEADING_OF_TOTAL = re.compile(r"\s*(\d+)/\d+:(?=\s+[a-z_][\w/.\-]*\s*[=:])", re.IGNORECASE)
#: A step in brackets that starts the line, before its pairs: CLU's metric writer (JAX,
#: Flax), ``[130] train/loss=2.31, train/learning_rate=0.001``, and a loop's own
#: ``[100/900] level=0 loss=0.8160`` (the step of its total).
_LEADING_STEP = re.compile(
    r"\[\s*(\d+)\s*(?:/\s*\d+\s*)?\](?=\s+[a-z_][\w/.\-]*\s*[=:])", re.IGNORECASE
)
#: An epoch of all and a batch of the epoch's, in brackets, starting the line: a CRNN's
#: ``[1/25][300/3183] Loss: 22.858639`` (epochs from 1).
_LEADING_EPOCH_ITER = re.compile(r"\[\s*(\d+)\s*/\s*\d+\s*\]\s*\[\s*(\d+)\s*/\s*(\d+)\s*\]")
#: A word before a step's or an epoch's name that makes it a setting's (``Warmup steps:
#: 1000``, ``Total optimization steps = 564``, ``Steps per epoch = 188``, ``Gradient
#: Accumulation steps = 2``, keras-rl's ``episode steps: 164``, Unsloth's banner ``Num
#: Epochs = 1 | Total steps = 300``): read as the step, it put a line ahead of the run's own
#: steps (a stall raised at step 1000 of a run at 500; Unsloth's first two dicts read at
#: step 300, then 15, 20...).
#: How far before a name ``_SETTING_BEFORE`` looks (its longest word and the spaces).
_SETTING_REACH = 24
_SETTING_BEFORE = re.compile(
    r"\b(?:warmup|per|accumulation|max|optimization|num|number|save|saving|logging|log"
    r"|decay|update|checkpoint|scheduler|of|episode)[ \t]+$",
    re.IGNORECASE,
)
#: ``Total`` before a count of steps (``Total steps = 300``) is a setting too; before one
#: step (Paddle's ``Total iter: 10, loss: [nan]``) it is the run's own.
_TOTAL_BEFORE = re.compile(r"\btotal[ \t]+$", re.IGNORECASE)
_COUNTS = frozenset({"steps", "iterations", "iters", "epochs"})
#: A metric indexed by its step: a CRNN's ``train_batch_loss[ 6590 ]:  nan``.
_NAME_AT_STEP = re.compile(rf"([a-z_][\w/.\-]*)\[\s*(\d+)\s*\]:\s*({_NUMBER})", re.I)
#: ``it`` for the iteration, starting the line before its pairs: ``it 130: loss=1.41 lr=0.01``.
_LEADING_IT = re.compile(r"it\s+(\d+)\s*:?(?=\s+[a-z_][\w/.\-]*\s*[=:])", re.IGNORECASE)
#: The older lit-gpt's ``iter 16 step 1: loss nan, train time: 1405.01ms``: each micro-batch
#: (``iter``) a line, ``step`` the optimizer's, shared by the micro-batches of one
#: accumulation; its checkpoints are named by the iter (``iter-000016-ckpt.pth``). Read at
#: ``step``, the 15 micro-batches of step 0 were 14 ranks' values.
_ITER_AND_STEP = re.compile(r"iter (\d+) step \d+: ")
#: PyTorch's MNIST example, ``Train Epoch: 2 [6400/60000 (11%)]\tLoss: 0.1234`` (epochs
#: from 1): the samples seen so far.
_SAMPLES_SEEN = re.compile(r"\bepoch:\s*(\d+)\s*\[\s*(\d+)\s*/\s*(\d+)\s*\(\s*\d+%\)\]", re.I)
#: An epoch of all in brackets, and no batch after it: ``Epoch [001/30] TrainLoss=1.87`` (a
#: loop that logs once an epoch; ``Epoch 3/30`` is read as its ``epoch`` pair).
_EPOCH_OF_ALL = re.compile(
    r"\bepoch\s*:?\s*\[\s*(\d+)\s*/\s*\d+\s*\](?!\W{0,4}(?:\[|batch|step|iter))", re.I
)
#: A loop's evaluation line, ``Test set: Average loss: 0.0500, Accuracy: ...`` (PyTorch's
#: MNIST example), ``Validation set: loss: ...``, OpenNMT-tf's ``Evaluation result for step
#: 435000: loss = 148890.71 ; perplexity = inf`` (behind TensorFlow's ``INFO:tensorflow:``),
#: DETR's MetricLogger ``Test:  [3/4]  eta: ...  loss: 54.98 (56.33) ...`` and the
#: ``Averaged stats:`` after it (the training epoch's own has its ``lr:``): its loss is no
#: training loss.
_EVALUATION_LINE = re.compile(
    r"(?:Test|Validation|Val|Eval(?:uation)?) (?:set:|results? for step \d+:)"
    r"|Test:\s+\["
    r"|Averaged stats: (?!.*\blr: )"
    r"|eval epoch: \d+,",  # Flax's ImageNet example, behind absl's head
    re.I,
)
#: icefall's (k2's) validation, behind its head: ``... (0/8) Epoch 1, validation: loss=8.6,
#: simple_loss=6.902, ... over 944034.00 frames.``
_EPOCH_VALIDATION = re.compile(r"\bEpoch \d+, validation: ")
#: icefall's running average beside the batch's own ``loss[loss=1.621, ...]``:
#: ``tot_loss[loss=3.721, simple_loss=3.037, ..., over 2196903.96 frames. ]``, no value of
#: the step's.
_RUNNING_TOTAL = re.compile(r"\btot_loss\[[^\]]*\]")
#: The HF Flax examples' line: ``Step... (500 | Loss: 2.31, Learning Rate: 1e-4)``, also
#: ``Step... (500/2000 | Training Loss: ...``, ``Step... (500 / 2000 | Loss: ...``.
_FLAX_STEP = re.compile(r"Step\.\.\. \((\d+)(?:\s*/\s*\d+)?\s")
#: A job's settings as it prints them when it starts, not metrics: a settings object's repr
#: (argparse's ``Namespace(lr=0.001, batch_size=32)``, ``TrainingArguments(...)``), the
#: whole line, naming no step (``Metrics(step=5, loss=2.3)`` is a record), and a layer of
#: a model's printed repr (``(0): Linear(in_features=2, out_features=32, bias=True)``); a
#: shell's ``export CPU_NUM=32`` (PaddleRec's log, and ``bash -x``'s ``+ export ...``);
#: Ultralytics' ``engine/trainer: lr0=0.01, momentum=0.937, ...``, coloured or not.
_SETTINGS = re.compile(
    r"(?:\x1b\[[0-9;]*m)*(?:\(\w+\):\s*)?"
    r"(?:[A-Za-z_][\w.]*\((?!.*\b(?:step|global_step|iteration|iter)=)"
    r"\w+=.*\)$|engine/trainer: |(?:\+ )?(?:export|set|setenv) [A-Za-z_]\w*=)"
)
#: ``Loss is 1.26``; ESPnet2's ``WARNING: The grad norm is nan. Skipping updating the
#: model.``; Deeplearning4j's ``Score at iteration 1500 is 1.26``; BigDL's
#: ``Throughput is 408.4 records/second. Loss is 1.26. Current learning rate is 0.046.``
_IS_FORM = re.compile(
    r"\b(?P<key>learning\s+rate|grad(?:ient)?\s+norm|[a-z][\w]*)"
    r"(?:\s+at\s+(?:iteration|step)\s+(?P<step>\d+))?"
    r"\s+is\s+"
    rf"(?P<value>{_NUMBER})(?![\w%]|[.:]\w)",
    re.IGNORECASE,
)


def reads_as_metric_name(key: str) -> bool:
    """Whether a ``key: value`` key names a metric, not a word of a message
    (``UserWarning``, ``RuntimeError``, ``Note``, ``workers``)."""
    if _CAMEL.search(key) is not None:
        return False
    lowered = key.lower()
    return lowered not in NOT_METRIC_KEYS and not lowered.endswith(("warning", "error"))


def _float(value: str) -> float:
    """A value as ``_NUMBER`` matched it: PaddleOCR's padding (``nanxxx``) dropped."""
    return float(value.rstrip("xX")) if value[-1:] in "xX" else float(value)


def find_pairs(text: str) -> tuple[list[tuple[str, float]], int | None]:
    """The metric (name, value) pairs in a line, names normalised, and its step if any."""
    if "':" in text:
        # PaddleDetection's ``'loss': '1.263390'``, PaddleOCR 1.1's ``'loss': nan``: the
        # quotes around names and values go.
        text = _QUOTED.sub(r"\1", text)
    if text[:1] in "IWEF" and "] " in text:
        # glog's and absl's head (``I1002 21:38:13.425730 139917864867392
        # logging_writer.py:35] [400] train_loss=3.21``): what follows is the line.
        head = _GLOG_HEAD.match(text)
        if head is not None:
            text = text[head.end() :]
    if "[" in text:
        if "tot_loss[" in text:
            text = _RUNNING_TOTAL.sub("", text)
        if ": [" in text or ":[" in text or "=[" in text or "= [" in text:
            text = _LIST_VALUE.sub(r"\1\2", text)  # only where a value may open a list
        if "| [" in text:
            text = _BRACKET_KEY.sub(r"\1\2: ", text)
    scaled = "|DP=" in text
    if scaled:
        text = _NANOTRON_HEAD.sub("", text, count=1)
    pairs: list[tuple[str, float]] = []
    step: int | None = None
    step_rank = len(_STEP_NAMES)
    micro = False
    # ``| Val Loss: 0.34, Acc: 0.86, F1: 0.85``: the pairs after an evaluation's, up to the
    # next ``|``, are the evaluation's too (its Acc was read as the training one's).
    sections = "|" in text
    evaluation_at = -1
    for match in _PAIR.finditer(text):
        key, separator, value = match.group("key", "sep", "value")
        if " " in key or "\t" in key:
            key = _SPACES.sub("_", key)
        lowered = key.lower()
        if lowered in _MICRO_KEYS:
            micro = True
            continue
        # Prose guard: an unknown key needs "=" or ": " (so not "cuda:0", "batch 8"), and
        # after ": " a name that reads as a metric's and no word after its value.
        if lowered not in KNOWN_KEYS and "=" not in separator:
            spaced_loss = ":" not in separator and _LOSS_WORD.search(lowered) is not None
            if not spaced_loss and (
                ":" not in separator or separator[-1] == ":" or not reads_as_metric_name(key)
            ):
                continue
            if _WORD_AFTER.match(text, match.end()) is not None:
                continue
        rank = _STEP_NAMES.get(lowered)
        if rank is not None or lowered == "epoch":
            start = match.start()
            reach = max(0, start - _SETTING_REACH)
            if _SETTING_BEFORE.search(text, reach, start) or (
                lowered in _COUNTS and _TOTAL_BEFORE.search(text, reach, start)
            ):
                continue  # a setting's last word: ``Warmup steps: 1000``, ``Steps per epoch = 188``
        if rank is not None:
            if rank < step_rank and (stepped := as_step(value)) is not None:
                step, step_rank = stepped, rank
            continue
        name = _LINE_ALIASES.get(lowered) or normalise_name(key)
        if name == "tokens_per_sec" and _SAMPLES_UNIT.match(text, match.end()) is not None:
            name = "samples_per_sec"  # ColossalAI's ``throughput=0.29466 sample_per_sec``
        if lowered == "val" and pairs and pairs[-1][0] == "loss":
            name = "eval_loss"  # LitGPT's ``loss train: 2.846, val: 2.861``
        if sections:
            if name.startswith("eval_"):
                evaluation_at = match.end()
            elif evaluation_at >= 0:
                if "|" in text[evaluation_at : match.start()]:
                    evaluation_at = -1
                else:
                    name = as_evaluation(name)
                    evaluation_at = match.end()
        if name in _ONCE:
            again = sum(1 for known, _ in pairs if known.split("#")[0] == name)
            if again:
                # The first is the line's ``loss``; another (a GAN's ``[D loss: ..] [G loss:
                # ..]``, a validation loss after the training one) is ``loss#2``: still a
                # loss to nan_inf, not a second value of the one series the others judge.
                name = f"{name}#{again + 1}"
        unit = match.group("unit")
        if unit and not scaled:
            continue  # ``max_mem: 1234M`` (detectron2's MiB): no unit known to scale by
        number = _float(value) * _UNITS[unit] if unit else _float(value)
        if value == CAFFE_CLAMPED and name.split("#")[0] == "loss":
            number = math.nan  # Caffe's softmax loss of a NaN output: -ln(FLT_MIN)
        pairs.append((name, number))
    if (
        step is not None
        and step_rank in _WITHIN_EPOCH_RANKS
        and "/" in text
        and ("poch" in text or "POCH" in text)
    ):
        within = _EPOCH_STEP_OF.search(text)
        if within is not None:
            epoch, batch, per_epoch = map(int, within.groups())
            step = max(epoch - 1, 0) * per_epoch + batch
    if step is None and "batches" in text:
        batches = _EPOCH_BATCHES.search(text)
        if batches is not None:
            epoch, batch, per_epoch = map(int, batches.groups())
            step = max(epoch - 1, 0) * per_epoch + batch
    if step is None and "atch" in text:  # batch, Batch
        counted = EPOCH_BATCH_OF.search(text)
        if counted is not None:
            epoch, batch, per_epoch = map(int, counted.groups())
            step = epoch * per_epoch + batch
    if step is None and "]" in text and ("poch" in text or "POCH" in text or "rain:" in text):
        step = _bracketed_epoch_step(text)  # each of its forms names the epoch (or Train:)
    if step is None and "[" in text:
        bracketed = _STEP_BRACKETS.search(text)
        if bracketed is not None:
            epoch_text, batch_text, per_epoch_text = bracketed.groups()
            epoch = int(epoch_text) if epoch_text is not None else 1
            step = max(epoch - 1, 0) * int(per_epoch_text) + int(batch_text)
    if step is None and "[" in text and ("ter" in text or "TER" in text):
        iteration = _ITER_BRACKETS.search(text)
        if iteration is not None:
            step = int(iteration.group(1))
    if step is None and "[" in text and pairs and pairs[0][0] == "train":
        timm = _TIMM_TRAIN.search(text)
        if timm is not None:
            epoch, batch, per_epoch = map(int, timm.groups())
            step = epoch * per_epoch + batch
            del pairs[0]  # "Train: 2" is the epoch, not a metric
    if step is None and "|" in text and "/" in text:
        fairseq = _FAIRSEQ_EPOCH.search(text)
        if fairseq is not None:
            epoch, batch, per_epoch = map(int, fairseq.groups())
            step = max(epoch - 1, 0) * per_epoch + batch
    if step is None and ";" in text and "/" in text:
        opennmt = _EPOCH_COMMA_BATCH.search(text)
        if opennmt is not None:
            epoch, batch, per_epoch = map(int, opennmt.groups())
            step = max(epoch - 1, 0) * per_epoch + batch
    if step is None and "[" in text and ("poch" in text or "POCH" in text):
        seen = _SAMPLES_SEEN.search(text)
        if seen is not None:
            epoch, done, per_epoch = map(int, seen.groups())
            step = max(epoch - 1, 0) * per_epoch + done  # in samples, as the line counts
    if step is None and "[" in text and ("poch" in text or "POCH" in text):
        whole = _EPOCH_OF_ALL.search(text)
        if whole is not None:
            step = int(whole.group(1))
    if step is None and "Step... (" in text:
        flax = _FLAX_STEP.search(text)
        if flax is not None:
            step = int(flax.group(1))
    if step is None and text[:1] == "[" and pairs:
        leading = _LEADING_STEP.match(text)
        if leading is not None:
            step = int(leading.group(1))
        else:
            both = _LEADING_EPOCH_ITER.match(text)
            if both is not None:
                epoch, batch, per_epoch = map(int, both.groups())
                step = max(epoch - 1, 0) * per_epoch + batch
    if step is None and text[:3].lower() == "it " and pairs:
        leading = _LEADING_IT.match(text)
        if leading is not None:
            step = int(leading.group(1))
    if step is None and pairs and text.find("/", 0, 24) >= 0:
        counted = _LEADING_OF_TOTAL.match(text)
        if counted is not None:
            step = int(counted.group(1))
    if text[:5] == "iter " and pairs:
        litgpt = _ITER_AND_STEP.match(text)
        if litgpt is not None:
            step = int(litgpt.group(1))
    if " is " in text:
        # ``Step 1500: Loss is 1.26``, ``Epoch 1 Iteration 100: Loss is nan``: the message
        # form beside the pairs and the step the line names otherwise.
        said, said_step = _is_form(text)
        named = {name for name, _ in pairs}
        pairs += [pair for pair in said if pair[0] not in named]
        if step is None:
            step = said_step
    if micro:
        pairs = [(f"micro_{name}" if name.startswith("loss") else name, v) for name, v in pairs]
    return pairs, step


def _is_evaluation_line(text: str) -> bool:
    """Whether a line is an evaluation's (``_EVALUATION_LINE``), behind TensorFlow's prefix
    or not."""
    prefix = _TF_LOG_PREFIX.match(text) or _GLOG_HEAD.match(text)
    return _EVALUATION_LINE.match(text, prefix.end() if prefix else 0) is not None


def as_evaluation(name: str) -> str:
    """A metric of an evaluation line under its evaluation name: ``loss`` -> ``eval_loss``."""
    return name if name.startswith(("eval_", "test_")) or name == "epoch" else f"eval_{name}"


def _bracketed_epoch_step(text: str) -> int | None:
    """The step of an epoch and a batch in brackets: PyTorch's ImageNet example, PyTorch-GAN
    and Ignite (``_EPOCH_BATCH_BRACKETS``, ``_EPOCH_OF_BATCH_OF``, ``_IGNITE``)."""
    for pattern in (_EPOCH_BATCH_BRACKETS, _EPOCH_OF_BATCH_OF):
        found = pattern.search(text)
        if found is not None:
            epoch, batch, per_epoch = map(int, found.groups())
            return epoch * per_epoch + batch
    ignite = _IGNITE.search(text)
    if ignite is None:
        return None
    epoch_text, iteration_text, per_epoch_text = ignite.groups()
    if per_epoch_text is None:
        return int(iteration_text)
    return max(int(epoch_text) - 1, 0) * int(per_epoch_text) + int(iteration_text)


def _is_form(text: str) -> tuple[list[tuple[str, float]], int | None]:
    """``Loss is 1.26``, ``Score at iteration 1500 is 1.26``: known metrics only, each
    message of the line (BigDL says throughput, loss and learning rate in one)."""
    pairs: list[tuple[str, float]] = []
    step: int | None = None
    for found in _IS_FORM.finditer(text):
        key = _SPACES.sub("_", found.group("key").lower())
        if key == "score":
            key = "loss"  # Deeplearning4j's score is the loss it minimises
        if key not in KNOWN_KEYS or key in _STEP_NAMES:
            continue
        pairs.append((normalise_name(key), _float(found.group("value"))))
        if step is None and found.group("step") is not None:
            step = int(found.group("step"))
    return pairs, step


def parse_keyvalue(text: str) -> list[Sample] | None:
    """Samples of one human-written metric line; None when it has no metric (plain text),
    or when it is a job's settings printed at its start (``_SETTINGS``)."""
    if "]:" in text:
        indexed = _NAME_AT_STEP.fullmatch(text.strip())
        if indexed is not None:
            name, step, value = indexed.groups()
            return [Sample(normalise_name(name), _float(value), int(step))]
    if "=" in text and _SETTINGS.match(text) is not None:
        return None
    pairs, step = find_pairs(text)
    if not pairs:
        return None
    if step is None and len(pairs) == 1 and text[:2] == "- ":
        # A list item of one setting or result, a model card's (``- Loss: 1.6051`` under
        # "results on the evaluation set", ``- seed: 42``): no record of the run's. Read as
        # the training loss, it put the final evaluation's before the run's first value.
        return None
    if (text[:1] in "TVEIA" and _is_evaluation_line(text)) or (
        ", validation: " in text and _EPOCH_VALIDATION.search(text) is not None
    ):
        pairs = [(as_evaluation(name), value) for name, value in pairs]
    time = None
    stamp = _LEADING_TIMESTAMP.match(text.lstrip())
    if stamp is not None:
        time = iso_to_epoch_seconds(stamp.group(1))
    return [Sample(name, value, step, time) for name, value in pairs]
