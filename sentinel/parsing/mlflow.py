"""MLflow's file store: one file per metric, ``<timestamp_ms> <value> <step>`` lines.

A run's metrics live in ``mlruns/<experiment_id>/<run_id>/metrics/<key>``; a
key with ``/`` in it (``train/loss``) is a nested folder. The metric name is
the key through ``normalise_name``; the time is the millisecond timestamp in
epoch seconds; the step is None in files from MLflow before 1.0, whose lines
have no step field (MLflow itself reads that as step 0).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePath

from sentinel.model.records import Sample
from sentinel.parsing.file_format import FileFormat
from sentinel.parsing.values import Garbled, normalise_name

#: The folder MLflow's file store is named after by default (``./mlruns``).
ROOT_FOLDER = "mlruns"
METRICS_FOLDER = "metrics"
# metrics sits this many folders below mlruns: mlruns/<experiment>/<run>/metrics.
_METRICS_DEPTH = 3


def metric_key(path: str | PurePath) -> str | None:
    """The metric key of an MLflow metric file, or None when ``path`` is not one.

    A path is one when, below a folder named ``mlruns``, the third folder is
    ``metrics`` and at least one more name follows:
    ``.../mlruns/<experiment_id>/<run_id>/metrics/<key...>``. Folders whose name
    starts with ``.`` (``.trash``) are not experiments or runs.
    """
    parts = PurePath(path).parts
    for index in range(len(parts) - _METRICS_DEPTH - 2, -1, -1):
        if parts[index] != ROOT_FOLDER or parts[index + _METRICS_DEPTH] != METRICS_FOLDER:
            continue
        experiment, run = parts[index + 1], parts[index + 2]
        if experiment.startswith(".") or run.startswith("."):
            return None
        return "/".join(parts[index + _METRICS_DEPTH + 1 :])
    return None


def run_folder(path: str | PurePath, key: str) -> PurePath:
    """The run folder (``mlruns/<experiment_id>/<run_id>``) of the metric file at ``path``,
    whose key (``metric_key``) is ``key``."""
    return PurePath(path).parents[key.count("/") + 1]


def is_run_folder(folder: str | PurePath) -> bool:
    """Whether ``folder`` is an MLflow run folder (``mlruns/<experiment_id>/<run_id>``)."""
    return metric_key(PurePath(folder, METRICS_FOLDER, "key")) is not None


def parse_metric_line(text: str) -> tuple[float, float, int | None] | None:
    """``(time_s, value, step)`` of one metric line; None for a blank line.

    Raises ``Garbled`` for a line of another shape, as MLflow's own reader
    refuses it.
    """
    fields = text.split()
    if not fields:
        return None
    if len(fields) not in (2, 3):
        raise Garbled(f"MLflow metric line with {len(fields)} fields: {text[:80]!r}")
    try:
        timestamp_ms = int(fields[0])
        value = float(fields[1])
        step = int(fields[2]) if len(fields) == 3 else None
    except ValueError as error:
        raise Garbled(f"not an MLflow metric line: {text[:80]!r}") from error
    return timestamp_ms / 1000.0, value, step


class MlflowMetricReader:
    """Reads one MLflow metric file; the metric's name comes from the file's path."""

    def __init__(self, key: str) -> None:
        self.name = normalise_name(key)

    def parse(self, text: str) -> list[Sample] | None:
        fields = parse_metric_line(text)
        if fields is None:
            return None
        time, value, step = fields
        return [Sample(self.name, value, step, time)]


def merged_lines(metric_files: Sequence[Path]) -> Iterator[tuple[str, str]]:
    """``(source, line)`` of one run's metric files, interleaved in (step, time) order.

    Each file keeps its own order (a resumed run logs earlier steps again);
    the files are merged by the (step, timestamp) of their lines, a missing
    step counting as 0 as in MLflow. A garbled line travels with the line
    before it. Ties go to the file first in ``metric_files``. The files are
    read whole: a run's metric files are small.
    """
    streams = []
    for rank, path in enumerate(metric_files):
        source = str(path)
        keyed: list[tuple[tuple[int, float], int, str, str]] = []
        order: tuple[int, float] = (-1, float("-inf"))
        text = path.read_bytes().decode("utf-8", errors="replace")
        for line in text.splitlines():
            try:
                fields = parse_metric_line(line)
            except Garbled:
                fields = None
            if fields is not None:
                time, _, step = fields
                order = (0 if step is None else step, time)
            keyed.append((order, rank, source, line))
        streams.append(keyed)
    for _, _, source, line in heapq.merge(*streams):
        if line.strip():
            yield source, line


class MlflowFiles(FileFormat):
    """``.../mlruns/<experiment_id>/<run_id>/metrics/<key...>`` (``metric_key``): the
    ``metrics`` folder exactly three below a folder named ``mlruns`` (MLflow's default
    ``./mlruns``; a file store under another name is not recognised). A run's metric
    files are read together, in step order."""

    def match(self, path: PurePath) -> str | None:
        return metric_key(path)

    def new_reader(self, key: str) -> MlflowMetricReader:
        return MlflowMetricReader(key)

    def group(self, path: PurePath, key: str) -> PurePath:
        return run_folder(path, key)

    def merged_lines(self, paths: Sequence[Path]) -> Iterator[tuple[str, str]]:
        return merged_lines(paths)

    def skips_folder(self, root: Path, name: str) -> bool:
        # A run's artifacts may hold copies of metric files (a logged metrics.csv).
        return name == "artifacts" and is_run_folder(root)


FORMAT = MlflowFiles()
