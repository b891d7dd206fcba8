"""Run facts: batch size and total steps from the HF Trainer's banner, trainer_state, config."""

from __future__ import annotations

from pathlib import Path

from sentinel.config import Settings, TrainingConfig
from sentinel.model.facts import RunFacts
from sentinel.parsing.hf_trainer import trainer_state_info

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hf"

BANNER = """***** Running training *****
  Num examples = 1,024
  Instantaneous batch size per device = 8
  Total train batch size (w. parallel, distributed & accumulation) = 1,024
  Gradient Accumulation steps = 4
  Total optimization steps = 2,000"""


def test_banner_lines_state_the_batch_and_steps_and_beat_the_config() -> None:
    facts = Settings(training=TrainingConfig(batch_size=2, max_steps=10)).run_facts()
    assert (facts.samples_per_step, facts.max_steps) == (2, 10)
    for line in BANNER.splitlines():
        facts.observe_line(line)
    assert (facts.samples_per_step, facts.max_steps) == (1024, 2000)


def test_config_multiplies_batch_accumulation_and_ranks() -> None:
    training = TrainingConfig(batch_size=8, gradient_accumulation_steps=4, world_size=2)
    assert Settings(training=training).run_facts().samples_per_step == 64
    assert Settings().run_facts().samples_per_step is None


def test_trainer_state_gives_max_steps_and_the_per_device_batch() -> None:
    info = trainer_state_info((FIXTURES / "nan" / "trainer_state.json").read_text())
    facts = RunFacts()
    facts.observe_trainer_state(info, accumulation_steps=2)
    assert (facts.samples_per_step, facts.max_steps) == (4 * 2, 40)
