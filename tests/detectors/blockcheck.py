"""The check every rule's block path must pass: the same alerts and state as line by line.

``troubled_jsonl`` writes a JSON-lines log through every kind of trouble and every
kind of line a block must refuse; ``compare`` feeds it to two engines, one taking
blocks (``Engine.feed_texts``) and one line by line (``blocks=False``), and returns
both runs' alerts and end states for the test to compare.
"""

from __future__ import annotations

import copy
import json
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from sentinel.engine.core import Engine
from sentinel.model.facts import RunFacts
from sentinel.model.records import Alert
from sentinel.parsing import LineParser
from sentinel.rules import BaseDetector

T0 = 1_700_000_000.0
SOURCE = "train.jsonl"

#: Attributes that are configuration or shared, not a rule's own state.
_NOT_STATE = frozenset({"facts", "config", "settings"})


def troubled_jsonl(seed: int, lines: int = 4000, *, timestamps: bool = True) -> list[str]:
    """A log of ``lines`` JSON lines: long calm stretches of one schema, and trouble.

    Trouble: LR warmup, loss spikes, grad-norm runs, NaN/Inf, slow stretches, silences
    past the stall timeouts, a plateau, creeping memory, eval lines (another schema),
    garbled, blank and plain-text lines, integer and string values, nulls, a changed
    key order, a step going back (a resume) and timestamps going back a little.
    """
    rng = random.Random(seed)
    out: list[str] = []
    now, step, loss, memory = T0, 0, 4.0, 1000.0
    eval_loss = 3.0
    mode, left = "calm", 200
    for index in range(lines):
        if left <= 0:
            mode = rng.choice(
                ["calm"] * 6
                + ["spike", "grad", "nan", "slow", "flat", "creep", "odd", "resume", "silence"]
            )
            left = rng.randint(5, 60) if mode != "calm" else rng.randint(100, 600)
        left -= 1
        step += 1
        now += 0.5 if mode != "slow" else 3.0
        if mode == "silence" and left == 0:
            now += rng.choice([90.0, 700.0, 2500.0])
        if mode == "resume" and left == 0:
            step = max(1, step - rng.randint(10, 200))
        if mode != "flat":
            loss = max(0.5, loss * 0.9995)
        value = loss * (1 + 0.02 * rng.gauss(0, 1))
        if mode == "spike" and rng.random() < 0.3:
            value *= rng.choice([3, 6])
        grad = 1 + 0.1 * rng.gauss(0, 1)
        if mode == "grad":
            grad *= rng.choice([1, 8, 20])
        lr = min(1e-5 * (index + 1), 5e-4) if index < 60 else 5e-4 * (1 - index / (2 * lines))
        tokens = 15000.0 / (4 if mode == "slow" else 1) * (1 + 0.01 * rng.gauss(0, 1))
        record: dict[str, Any] = {
            "step": step,
            "loss": value,
            "grad_norm": grad,
            "lr": lr,
            "tokens_per_sec": tokens,
        }
        if mode == "creep":
            memory *= 1.02
            record["gpu_memory_mb"] = memory
        if mode == "nan" and rng.random() < 0.2:
            record[rng.choice(["loss", "grad_norm"])] = rng.choice([math.nan, math.inf])
        stamp = now
        if mode == "odd" and rng.random() < 0.05:
            stamp -= 0.7  # a clock that steps back a little
        if timestamps:
            record["time"] = stamp
        out.append(_odd(rng, record) if mode == "odd" else json.dumps(record))
        if step % 50 == 0:
            eval_loss *= 1.05 if mode in ("flat", "creep") else 0.97
            evaluation: dict[str, Any] = {"step": step, "eval_loss": eval_loss}
            if timestamps:
                evaluation["time"] = stamp
            out.append(json.dumps(evaluation))
    return out


def _odd(rng: random.Random, record: dict[str, Any]) -> str:
    """One line a block must refuse or read exactly as line by line would."""
    kind = rng.choice(
        ["garbled", "blank", "text", "int", "string", "null", "order", "progress", "plain"]
    )
    if kind == "garbled":
        return json.dumps(record)[:-7]
    if kind == "blank":
        return ""
    if kind == "text":
        return f"Saving model checkpoint to out/checkpoint-{record['step']}"
    if kind == "int":
        record["tokens_per_sec"] = int(record["tokens_per_sec"])
    elif kind == "string":
        record["loss"] = str(record["loss"])
    elif kind == "null":
        record["grad_norm"] = None
    elif kind == "order":
        record = dict(reversed(list(record.items())))
    elif kind == "progress":
        record = {"step": record["step"]}
    return json.dumps(record)


@dataclass
class Run:
    """What one engine made of a log: its alerts, and its state and its rules' at the end."""

    alerts: list[tuple[Any, ...]]
    state: dict[str, Any]
    lines_absorbed: int
    #: The state after each batch, when asked for (``states=True``).
    states: list[dict[str, Any]] = field(default_factory=list)


def run(
    make_detectors: Callable[[], Sequence[BaseDetector]],
    texts: list[str],
    *,
    blocks: bool,
    data_clock: bool = True,
    batch_sizes: Sequence[int] = (4096, 37, 1000),
    facts: RunFacts | None = None,
    logging_steps: int | None = None,
    states: bool = False,
) -> Run:
    """Feed ``texts`` in batches of the sizes given in turn; live (``data_clock=False``)
    each batch is read at its own ``now``, with a tick every other batch. ``facts``: what
    the run is known to be (GPUs, price, steps), for the rules that need it; ``states``:
    keep the state after every batch, not only at the end."""
    parser = LineParser(logging_steps=logging_steps)  # as replay and watch build it
    engine = Engine(
        make_detectors(),
        parser,
        data_clock=data_clock,
        blocks=blocks,
        logging_steps=logging_steps,
    )
    if facts is not None:
        engine.facts = copy.deepcopy(facts)
    alerts: list[Alert] = []
    kept: list[dict[str, Any]] = []
    start, turn = 0, 0
    while start < len(texts):
        size = batch_sizes[turn % len(batch_sizes)]
        batch = texts[start : start + size]
        now = T0 + start * 0.5
        if not data_clock and turn % 2:
            alerts += engine.tick(now)
        alerts += engine.feed_texts(SOURCE, batch, now)
        start += size
        turn += 1
        if states:
            kept.append(engine_state(engine))
    keys = [alert_key(alert) for alert in alerts]
    return Run(keys, engine_state(engine), engine.lines_absorbed, kept)


def engine_state(engine: Engine) -> dict[str, Any]:
    """The engine's state and its rules', as plain data."""
    return {
        "engine": snapshot(
            {
                "current_step": engine.current_step,
                "logged": engine.position.logged,
                "data_time": engine.data_time,
                "samples_seen": engine.samples_seen,
                "history": engine.history,
                "stats": engine.parser.stats,
                # What the HF steps learned from the bars and dicts (hf_steps).
                "hf_steps": engine.parser.hf_state(),
            }
        ),
        "rules": {detector.rule: snapshot(detector) for detector in engine.detectors},
    }


def alert_key(alert: Alert) -> tuple[Any, ...]:
    """Everything an alert says, NaN-safe, for comparing two runs."""
    return (
        alert.rule,
        str(alert.severity),
        alert.message,
        snapshot(alert.time),
        alert.source,
        alert.step,
        alert.metric,
        snapshot(alert.value),
        alert.onset_step,
        alert.resolves,
        snapshot(alert.details),
    )


def snapshot(value: Any) -> Any:
    """Plain data for a rule's state: floats as their exact hex, containers as lists."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else value.hex()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, dict):
        return {str(key): snapshot(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, deque)):
        return [snapshot(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted(repr(snapshot(item)) for item in value)
    fields: dict[str, Any] = {}
    for cls in type(value).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(value, name) and name not in _NOT_STATE:
                fields[name] = snapshot(getattr(value, name))
    for name, item in getattr(value, "__dict__", {}).items():
        if name not in _NOT_STATE and not callable(item):
            fields[name] = snapshot(item)
    return {"type": type(value).__name__, **fields}
