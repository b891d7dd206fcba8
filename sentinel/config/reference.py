"""``[reference] path``: a finished run of the same recipe, read once into its curve.

The path is what ``replay`` reads: a ``trainer_state.json``, a metrics file (JSON lines,
a Lightning ``metrics.csv``, MLflow or TensorBoard files), a log, or a run folder (its
``trainer_state.json`` when it has one, else its metric files). Each metric's values
with a step are kept, in step order (a step logged twice keeps its last value); values
with no step cannot be aligned with a live run and are left out.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

from sentinel.model.facts import ReferenceCurve
from sentinel.model.records import Sample
from sentinel.parsing import Garbled, LineParser
from sentinel.parsing.files import iter_replay_batches, replay_plan
from sentinel.parsing.hf_trainer import read_trainer_state

STATE = "trainer_state.json"


class ReferenceError(ValueError):
    """The reference cannot be read, or holds no value at a step: the message says why."""


def load_reference(path: Path) -> ReferenceCurve:
    """The curve of the run at ``path``; ``ReferenceError`` when there is none."""
    resolved = path.expanduser()
    try:
        stamp = resolved.stat().st_mtime_ns
    except OSError as error:
        raise ReferenceError(f"{path}: {error.strerror or error}") from None
    return _load(resolved, stamp)


@functools.lru_cache(maxsize=4)
def _load(path: Path, stamp: int) -> ReferenceCurve:
    del stamp  # part of the cache key: a file written since is read again
    state = path / STATE if path.is_dir() else path
    try:
        if state.name == STATE and state.is_file():
            samples = read_trainer_state(state.read_text(encoding="utf-8"))
        else:
            samples = _read_logs(path)
    except (OSError, UnicodeDecodeError, Garbled) as error:
        raise ReferenceError(f"{path}: {error}") from None
    series: dict[str, dict[int, float]] = {}
    for sample in samples:
        if sample.step is not None and math.isfinite(sample.value):
            series.setdefault(sample.name, {})[sample.step] = sample.value
    if not any(series.values()):
        raise ReferenceError(f"{path}: no metric logged at a step: nothing to align a run with")
    return ReferenceCurve(
        str(path), {name: tuple(sorted(values.items())) for name, values in series.items()}
    )


def _read_logs(path: Path) -> list[Sample]:
    """Every sample of the logs or metric files at ``path``, as ``replay`` reads them (a
    garbled line is counted and skipped by the parser)."""
    parser = LineParser()
    plan = replay_plan([path])
    readers = {file.source: file.new_reader() for group in plan for file in group}
    samples: list[Sample] = []
    for source, texts in iter_replay_batches(plan):
        reader = readers.get(source)
        for text in texts:
            samples += parser.parse_with(reader, text) if reader else parser.parse(text)
    return samples
