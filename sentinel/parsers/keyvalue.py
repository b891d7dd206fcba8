"""Human-written metric lines: ``step 120 | loss 2.31 | tok/s 15321``, ``loss=2.3, lr=3e-4``.

Three pair forms are read: ``key=value`` and ``key: value`` accept any
identifier-like key (letters, digits, ``_``, ``/``, ``-``, ``.``); ``key value``
(space only) accepts only a known metric name or alias, so prose does not
become metrics. Values are numbers or nan/inf, signed, any case. A leading
``2024-05-01 12:00:01`` timestamp becomes the samples' time.
"""

from __future__ import annotations

import re

from sentinel.parsers.values import (
    ALIASES,
    STEP_KEYS,
    as_step,
    iso_to_epoch_seconds,
    normalise_name,
)
from sentinel.records import Sample

#: Names accepted in the space-separated ``key value`` form (lower-case).
KNOWN_KEYS: frozenset[str] = frozenset(ALIASES) | frozenset(ALIASES.values()) | frozenset(STEP_KEYS)
KNOWN_KEYS |= {"loss", "test_loss", "epoch", "ppl", "perplexity", "mfu", "accuracy", "acc"}

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?|nan|inf(?:inity)?)"
_PAIR = re.compile(
    r"(?<![\w/.\-])"
    r"(?P<key>(?:eval|val|valid|validation|test|train|training)\s+loss|[a-z_][\w/.\-]*)"
    r"(?P<sep>\s*=\s*|\s*:\s*|\s+)"
    rf"(?P<value>{_NUMBER})(?:/\d+)?"
    # Not part of something longer: 12:00:01, 10.0.0.1, 100%, 1.5s/it, 1,000.
    r"(?![\w%]|[.:]\w|,\d{3})",
    re.IGNORECASE,
)
_LEADING_TIMESTAMP = re.compile(
    r"\[?(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)"
)
_SPACES = re.compile(r"\s+")
_STEP_NAMES = frozenset(STEP_KEYS)


def find_pairs(text: str) -> tuple[list[tuple[str, float]], int | None]:
    """The metric (name, value) pairs in a line, names normalised, and its step if any."""
    pairs: list[tuple[str, float]] = []
    step: int | None = None
    for match in _PAIR.finditer(text):
        key, separator, value = match.group("key", "sep", "value")
        if " " in key or "\t" in key:
            key = _SPACES.sub("_", key)
        lowered = key.lower()
        # Prose guard: an unknown key needs "=" or ": " (so not "cuda:0", "batch 8").
        known_or_marked = lowered in KNOWN_KEYS or "=" in separator
        if not known_or_marked and (":" not in separator or separator[-1] == ":"):
            continue
        if lowered in _STEP_NAMES:
            if step is None:
                step = as_step(value)
            continue
        pairs.append((normalise_name(key), float(value)))
    return pairs, step


def parse_keyvalue(text: str) -> list[Sample] | None:
    """Samples of one human-written metric line; None when it has no metric (plain text)."""
    pairs, step = find_pairs(text)
    if not pairs:
        return None
    time = None
    stamp = _LEADING_TIMESTAMP.match(text.lstrip())
    if stamp is not None:
        time = iso_to_epoch_seconds(stamp.group(1))
    return [Sample(name, value, step, time) for name, value in pairs]
