"""Steps and epochs from the names people give checkpoints."""

from __future__ import annotations

import pytest

from sentinel.checkpoints.names import NamePosition, is_in_progress, position_of

STEP = {
    "hf": ("checkpoint-500", 500),
    "hf-zero": ("checkpoint-0", 0),
    "deepspeed": ("global_step1200", 1200),
    "step-underscore-dir": ("step_30", 30),
    "step-dash-dir": ("step-30", 30),
    "step-underscore-file": ("step_30.pt", 30),
    "step-glued": ("step40.pth", 40),
    "model-step": ("model_step40.pt", 40),
    "ckpt-underscore": ("ckpt_40.pt", 40),
    "ckpt-dash": ("ckpt-40.pt", 40),
    "megatron-iter": ("iter_0000040", 40),
    "iteration": ("iteration_40.pt", 40),
    "pth-tar": ("checkpoint_40.pth.tar", 40),
    "last-number": ("model-1200.pt", 1200),
    "last-number-pth": ("weights-77.pth", 77),
    "last-number-safetensors": ("model-300.safetensors", 300),
    "last-number-words": ("run-a-99.ckpt", 99),
    "bare-number": ("000040.pt", 40),
    "version-suffix-dropped": ("model_40-v1.pt", 40),
    "date-then-step": ("model_2024-05-01_40.pt", 40),
    "keyword-beats-last-number": ("step_40_seed_7.pt", 40),
    "seed-is-not-a-step": ("seed_42_40.pt", 40),
    "steps-after-number": ("model_1000_steps.pt", 1000),
    "step-after-number-glued": ("1000steps.pth", 1000),
}


@pytest.mark.parametrize(("name", "step"), list(STEP.values()), ids=list(STEP))
def test_step_from_name(name: str, step: int) -> None:
    position = position_of(name)
    assert position.step == step
    assert position.epoch is None


EPOCH = {
    "epoch-underscore": ("epoch_3.pt", NamePosition(epoch=3, keyed=True)),
    "epoch-glued": ("epoch3.pt", NamePosition(epoch=3, keyed=True)),
    "epoch-in-words": ("model_epoch_12.pth", NamePosition(epoch=12, keyed=True)),
    "lightning-epoch-only": ("epoch=3.ckpt", NamePosition(epoch=3, keyed=True)),
    "lightning": ("epoch=2-step=4500.ckpt", NamePosition(step=4500, epoch=2, keyed=True)),
    "lightning-version": ("epoch=0-step=10-v1.ckpt", NamePosition(step=10, epoch=0, keyed=True)),
    "epoch-and-step": ("checkpoint_epoch3_step400.pth", NamePosition(400, 3, keyed=True)),
    "espnet-epoch-after-number": ("3epoch.pth", NamePosition(epoch=3, keyed=True)),
    "epoch-after-number": ("model_12_epochs.pt", NamePosition(epoch=12, keyed=True)),
}


@pytest.mark.parametrize(("name", "position"), list(EPOCH.values()), ids=list(EPOCH))
def test_epoch_from_name_is_never_a_step(name: str, position: NamePosition) -> None:
    assert position_of(name) == position


NOTHING = {
    "nanogpt": "ckpt.pt",
    "last": "last.pt",
    "lightning-last": "last.ckpt",
    "model": "model.pt",
    "hf-weights": "model.safetensors",
    "shard": "model-00001-of-00003.safetensors",
    "shard-bin": "pytorch_model-00002-of-00002.bin",
    "model-name-number": "resnet50.pth",
    "model-name-digit": "gpt2.pt",
    "date-compact": "ckpt_20240501.pt",
    "date-and-time": "run_20240501_123000.pt",
    "rank": "ckpt_rank1.pt",
    "deepspeed-rank-file": "mp_rank_00_model_states.pt",
    "pointer": "latest",
    "tensorboard": "runs",
    "quarantine": "quarantine",
    "json": "trainer_state.json",
    "text-with-number": "model-12.txt",
    "hf-tmp": "tmp-checkpoint-500",
    "partial": "model_step40.pt.partial",
    "keyword-without-number": "checkpoint-",
    "deepspeed-without-number": "global_step",
}


@pytest.mark.parametrize("name", list(NOTHING.values()), ids=list(NOTHING))
def test_names_that_carry_no_position(name: str) -> None:
    assert position_of(name) == NamePosition()


@pytest.mark.parametrize(
    ("name", "in_progress"),
    [
        pytest.param("tmp-checkpoint-500", True, id="hf-tmp"),
        pytest.param("ckpt.pt.tmp", True, id="dot-tmp"),
        pytest.param("checkpoint-500", False, id="hf"),
        pytest.param("template_40.pt", False, id="tmp-inside-a-word"),
    ],
)
def test_in_progress_names(name: str, in_progress: bool) -> None:
    assert is_in_progress(name) is in_progress


def test_a_number_without_keyword_is_marked_as_a_guess() -> None:
    assert position_of("model-1200.pt").keyed is False
    assert position_of("model_step1200.pt").keyed is True
