"""``parsers.logging_steps`` counts on from an HF dict that got its exact step.

With the run's logging cadence set, the engine gives each step-less training line the
next step on it (``RunPosition.count_step``); a dict whose epoch gave it its step
(``trainer_state.json``'s steps per epoch) is on that cadence too, so the next
step-less line is one interval past it, not past the last line counted before.
"""

from __future__ import annotations

import json

from sentinel.engine.core import Engine
from sentinel.parsing import LineParser

STATE = json.dumps({"log_history": [{"step": 100, "epoch": 1.0, "loss": 2.0}]})


def _engine() -> Engine:
    parser = LineParser(logging_steps=10)
    engine = Engine([], parser, data_clock=True, logging_steps=10)
    assert parser.learn_trainer_state(STATE)  # 100 steps per epoch
    return engine


def test_a_dict_without_epoch_after_exact_steps_is_one_interval_past_them() -> None:
    engine = _engine()
    for epoch in ("0.1", "0.2", "0.3"):
        engine.feed_text("train.log", f"{{'loss': '2.0', 'epoch': '{epoch}'}}", 0.0)
    assert engine.current_step == 30
    engine.feed_text("train.log", "{'loss': '1.9'}", 0.0)  # no epoch: counted
    assert engine.history["loss"][-1].step == 40  # was 10: behind the dicts before it
    assert engine.position.logged == 4


def test_an_evaluation_at_its_own_step_does_not_move_the_count() -> None:
    engine = _engine()
    engine.feed_text("train.log", "{'loss': '2.0', 'epoch': '0.2'}", 0.0)
    engine.feed_text("train.log", "{'eval_loss': '2.1', 'epoch': '0.5'}", 0.0)
    engine.feed_text("train.log", "{'loss': '1.9'}", 0.0)
    assert engine.history["loss"][-1].step == 30
