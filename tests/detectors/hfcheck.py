"""HF Trainer console output through every kind of trouble, drawn by a real tqdm.

``troubled_hf`` runs the HF Trainer's ``ProgressCallback`` loop (a ``tqdm`` bar over
the steps, ``bar.write(str(logs))`` for each log dict, a second bar over the eval
batches) into a string, then splits it as replay reads it (``\\r`` ends a line). It
is the log the HF block path (``parsers.hf_blocks``) is checked on against line by
line; ``tests.detectors.blockcheck.run`` feeds it.
"""

from __future__ import annotations

import functools
import io
import math
import random
from typing import Any

from tqdm import tqdm

from sentinel.parsing.lines import LineSplitter

#: Lines a block must refuse, or read exactly as line by line does.
ODD_LINES = (
    "***** Running training *****",
    "  Total optimization steps = 3,000",
    "Saving model checkpoint to out/checkpoint-{step}",
    "Map: 100%|██████████| 1000/1000 [00:00<00:00, 9000.00 examples/s]",
    "Training:  45%|████▌     | {step}/3000 [00:01<00:02, 25.3it/s, loss=2.3]",
    "{{'loss': '2.5', 'grad_norm': '1.0', 'learning_rate': '0.0005', 'ep",
    "{{'loss': 2.5, 'grad_norm': nan, 'learning_rate': 0.0005, 'epoch': 0.5}}",
    "{{'loss': '2.5', 'grad_norm': '1.0', 'learning_rate': '0.0005', 'epoch': 1}}",
    "{{'train_runtime': '12.5', 'train_loss': '2.4', 'epoch': '1.0'}}",
    "",
)


def troubled_hf(
    seed: int, steps: int = 3003, *, logging_steps: int = 1, strings: bool = True
) -> list[str]:
    """An HF Trainer's output over ``steps`` steps, logging every ``logging_steps``.

    Trouble: LR warmup, loss spikes, grad-norm runs, NaN/Inf, a plateau, evaluations
    (their own bar and dict), dicts of one metric, a callback's dicts of no training
    metric, bars after the last dict, and odd lines (``ODD_LINES``: other bars, a postfix bar,
    text, a cut-off dict, 4.x bare ``nan``, ints, the end-of-training summary).
    ``strings``: values printed as strings (transformers 5.x) or as floats (4.x).
    Everything goes to one stream, as a job's stdout and stderr do to one log (tqdm
    writes its bars to stderr, the Trainer its dicts to stdout). Drawing one takes about
    1.5 s, and many cases read the same one: each is drawn once per worker.
    """
    return list(_draw(seed, steps, logging_steps, strings))


@functools.lru_cache(maxsize=8)
def _draw(seed: int, steps: int, logging_steps: int, strings: bool) -> tuple[str, ...]:
    """What ``troubled_hf`` returns, drawn once per worker for each set of arguments."""
    rng = random.Random(seed)
    stream = io.StringIO()
    # What HF's ProgressCallback opens; mininterval=0 redraws every step (as a slow step
    # does), ascii=False draws the Unicode blocks a terminal gets (a StringIO gets "#").
    bar = tqdm(total=steps, dynamic_ncols=True, file=stream, mininterval=0, miniters=1, ascii=False)
    loss, eval_loss = 4.0, 3.0
    mode, left = "calm", 200
    for step in range(1, steps + 1):
        if left <= 0:
            mode = rng.choice(
                ["calm"] * 5 + ["spike", "grad", "nan", "flat", "odd", "sparse", "extra"]
            )
            left = rng.randint(5, 60) if mode != "calm" else rng.randint(100, 600)
        left -= 1
        bar.update(1)
        if mode == "odd" and rng.random() < 0.3:
            bar.write(rng.choice(ODD_LINES).format(step=step), file=stream)
        if step % logging_steps:
            continue
        if mode != "flat":
            loss = max(0.5, loss * 0.999)
        value = loss * (1 + 0.02 * rng.gauss(0, 1))
        if mode == "spike" and rng.random() < 0.3:
            value *= rng.choice([3, 6])
        grad = 1 + 0.1 * rng.gauss(0, 1)
        if mode == "grad":
            grad *= rng.choice([1, 8, 20])
        logs: dict[str, float] = {
            "loss": value,
            "grad_norm": grad,
            "learning_rate": min(1e-5 * step, 5e-4) * (1 - step / (2 * steps)),
            "epoch": step / 1000,
        }
        if mode == "nan" and rng.random() < 0.2:
            logs[rng.choice(["loss", "grad_norm"])] = rng.choice([math.nan, math.inf])
        if mode == "sparse":
            logs = {"loss": value}  # one metric: its line is no new step past the bar's
        if mode == "extra":
            # A callback's own dict instead, with no training metric: no logged step.
            logs = {"tokens_per_sec": 15000 * (1 + 0.01 * rng.gauss(0, 1)), "epoch": step / 1000}
        bar.write(_printed(logs, strings), file=stream)
        if step % 200 == 0:
            eval_loss *= 1.05 if mode == "flat" else 0.97
            _evaluate(stream, rng.randint(3, 40))
            evaluation = {"eval_loss": eval_loss, "eval_runtime": 0.5, "epoch": step / 1000}
            bar.write(_printed(evaluation, strings), file=stream)
    bar.close()
    splitter = LineSplitter()
    return tuple(splitter.feed(stream.getvalue().encode()) + splitter.flush())


def _evaluate(stream: io.StringIO, batches: int) -> None:
    """The eval loop's own bar, which counts batches from 0 again (no progress). Drawn
    below the training bar, each of its frames ends with a cursor-up (``ESC[A``)."""
    with tqdm(
        total=batches, leave=False, dynamic_ncols=True, file=stream, mininterval=0, ascii=False
    ) as bar:
        for _ in range(batches):
            bar.update(1)


def _printed(logs: dict[str, float], strings: bool) -> str:
    """The dict as the Trainer prints it: 5.x formats each value as a string."""
    shown: dict[str, Any] = (
        {key: f"{value:.4g}" for key, value in logs.items()} if strings else logs
    )
    return str(shown)
