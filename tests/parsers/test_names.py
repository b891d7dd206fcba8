"""Metric name normalisation: aliases to one canonical name."""

from __future__ import annotations

import pytest

from sentinel.parsing import ALIASES, normalise_name

CASES = {
    "loss": [
        "loss",
        "Loss",
        "train_loss",
        "train/loss",
        "training_loss",
        "loss/train",
        "train-loss",
    ],
    # MXNet's metric names: the split, a hyphen, the metric.
    "perplexity": ["Train-Perplexity"],
    "eval_perplexity": ["Validation-Perplexity"],
    "grad_norm": [
        "grad_norm",
        "grad-norm",
        "gradnorm",
        "grad_norm/total",
        "train/grad_norm",
        "gnorm",
    ],
    "lr": ["lr", "LR", "learning_rate", "train/learning_rate", "train/lr", "train_lr"],
    "tokens_per_sec": [
        "tokens_per_sec",
        "tok/s",
        "tokens/s",
        "tokens_per_second",
        "train/tokens_per_second",
        "throughput",
    ],
    "eval_loss": [
        "eval_loss",
        "val_loss",
        "eval/loss",
        "validation_loss",
        "val/loss",
        "valid_loss",
        "validation-loss",
    ],
    "epoch": ["epoch", "train/epoch"],
    "mfu": ["MFU", "train/mfu"],
    "eval_runtime": ["eval_runtime"],
    "train/": ["train/"],
}


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        pytest.param(raw, canonical, id=f"{raw}->{canonical}")
        for canonical, raws in CASES.items()
        for raw in raws
    ],
)
def test_normalise_name(raw: str, canonical: str) -> None:
    assert normalise_name(raw) == canonical


def test_alias_table_is_lower_case_and_closed() -> None:
    assert all(key == key.lower() for key in ALIASES)
    assert all(ALIASES.get(value, value) == value for value in ALIASES.values())
