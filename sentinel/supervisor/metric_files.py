"""Which files hold a job's metrics, and how each is split into lines: decided here, once.

The sources follow files and know nothing of formats; the parsers turn text into
samples and know nothing of files being followed. This module sits above both
and joins them, for the one who builds the sources (``sentinel.supervisor.workers``):

- ``is_metric_file`` and ``unreadable``: what the finder of metric files
  (``sentinel.follow.discover.MetricFileFinder``) reports;
- ``splitting``: how a follower of a path (``sentinel.follow.logfile.FileFollower``,
  run by the tailer) splits its bytes, the path's format decided once
  (``sentinel.parsing.files.classify``) and its splitter made afresh for each file there.

``replay`` decides each path's format the same way (``sentinel.parsing.files.replay_plan``)
and hands the engine each file's reader.
"""

from __future__ import annotations

import os
from pathlib import PurePath

from sentinel.follow.discover import WHOLE_FILES, json_lines
from sentinel.follow.logfile import NewSplitter
from sentinel.parsing.files import classify


def is_metric_file(path: str | PurePath) -> bool:
    """Whether a framework's metric file is named so (``classify`` knows its format, or a
    JSON-lines name); not whether it holds metrics yet."""
    name = os.path.basename(path)
    if name in WHOLE_FILES or json_lines(name):
        return True
    return classify(path).format is not None


def unreadable(path: str | PurePath) -> str | None:
    """Why the metric file at ``path`` cannot be read here (its format's extra is missing);
    None when it can."""
    return classify(path).unreadable()


def splitting(path: str | PurePath) -> NewSplitter:
    """What makes a splitter for the bytes of each file at ``path``: its format's own, the
    format decided here once (a plain log's ``LineSplitter`` when it has none)."""
    return classify(path).new_splitter
