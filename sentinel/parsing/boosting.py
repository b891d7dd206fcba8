"""Gradient-boosting libraries' evaluation lines, read at their boosting round.

- XGBoost: ``[44]\\ttrain-logloss:0.3316\\ttrain-auc:0.8747\\tvalid-logloss:0.3325``, one
  ``data-metric:value`` per evaluation set (``-nan`` as the C library prints it), and
  ``xgb.cv``'s ``[180]\\tcv-test-logloss:0.0457+0.0002`` (the mean, then the deviation).
- LightGBM: ``[100]\\ttraining's binary_logloss: 0.2\\tvalid_1's binary_logloss: 0.3``.
- CatBoost: ``100:\\tlearn: 0.1697\\ttest: 0.1530\\tbest: 0.1530 (100)\\ttotal: 3.7s`` (the
  objective on the learning and the test set), and older builds' ``61:     learn
  0.1211191019passed: 17.7 sec`` (the value glued to the next word).

The training set's loss metric (``logloss``, ``rmse``, ``l2``...: the objective it boosts) is
``loss``, an evaluation set's ``eval_loss``; other metrics keep their names, an evaluation
set's as ``eval_<name>`` (``train-auc`` is ``auc``, ``valid-auc`` ``eval_auc``). Read as
plain pairs, these lines named no round and no loss, and XGBoost's none at all: a NaN went
by unread. Stateless, one line each (``ParseFn``).
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.values import as_float

_NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf)"
#: ``[44]\t`` or ``[180]   ``: XGBoost's and LightGBM's round, opening the line.
_ROUND = re.compile(r"\[(\d+)\]\s+")
#: XGBoost's ``train-logloss:0.33``, ``xgb.cv``'s ``cv-test-logloss:0.04+0.0002`` (its set
#: ``cv-test``).
_XGBOOST_PAIR = re.compile(
    rf"(?<!\S)((?:cv-)?[A-Za-z][\w.]*)-([A-Za-z][\w@.\-]*):({_NUMBER})(?:\+{_NUMBER})?(?=\s|$)",
    re.I,
)
#: LightGBM's ``training's binary_logloss: 0.2``, ``valid_0's l1: inf``.
_LIGHTGBM_PAIR = re.compile(rf"([A-Za-z][\w.\-]*)'s\s+([A-Za-z][\w@.\-]*):\s*({_NUMBER})", re.I)
#: CatBoost's ``100:\tlearn: 0.1697\ttest: 0.1530``, or ``61:     learn 0.1211191019passed:``.
_CATBOOST = re.compile(
    rf"(\d+):\s+learn:?\s*({_NUMBER})(?:\s+test:\s*({_NUMBER}))?(?=\s|passed|$)", re.I
)
#: The metrics a booster minimises: the training set's is its loss.
LOSS_METRICS = frozenset(
    {
        "logloss",
        "mlogloss",
        "binary_logloss",
        "multi_logloss",
        "cross_entropy",
        "rmse",
        "rmsle",
        "mae",
        "mse",
        "l1",
        "l2",
        "huber",
        "mphe",
        "poisson",
        "poisson-nloglik",
        "gamma-nloglik",
        "cox-nloglik",
        "tweedie-nloglik",
        "aft-nloglik",
        "multiclass",
        "multiclassova",
    }
)
#: The names an evaluation set goes by when the user gave none.
_TRAINING_SETS = frozenset({"train", "training", "learn", "cv-train"})


def _name(data: str, metric: str) -> str:
    """``loss``/``eval_loss`` for a loss metric of the training/an evaluation set; else the
    metric's name, ``eval_`` before an evaluation set's."""
    lowered = metric.lower()
    training = data.lower() in _TRAINING_SETS
    if lowered in LOSS_METRICS:
        return "loss" if training else "eval_loss"
    return lowered if training else f"eval_{lowered}"


def parse_boosting(text: str) -> list[Sample] | None:
    """Samples of an XGBoost, LightGBM or CatBoost evaluation line; None for another line."""
    first = text[:1]
    if first == "[":
        found = _ROUND.match(text)
        if found is None:
            return None
        step = int(found.group(1))
        rest = text[found.end() :]
        if "'s " in rest:
            pairs = [(m[1], m[2], m[3]) for m in _LIGHTGBM_PAIR.finditer(rest)]
        else:
            pairs = [(m[1], m[2], m[3]) for m in _XGBOOST_PAIR.finditer(rest)]
        if not pairs:
            return None
        samples: list[Sample] = []
        seen: set[str] = set()
        for data, metric, value in pairs:
            number = as_float(value)
            name = _name(data, metric)
            if number is None or name in seen:
                continue  # a second evaluation set's same metric: the first one's is read
            seen.add(name)
            samples.append(Sample(name, number, step))
        return samples
    if not first.isdigit() or "learn" not in text:
        return None
    found = _CATBOOST.match(text)
    if found is None:
        return None
    step = int(found.group(1))
    samples = []
    learn = as_float(found.group(2))
    if learn is not None:
        samples.append(Sample("loss", learn, step))
    test = as_float(found.group(3)) if found.group(3) is not None else None
    if test is not None:
        samples.append(Sample("eval_loss", test, step))
    return samples
