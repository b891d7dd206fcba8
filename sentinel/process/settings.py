"""``[process]``: the settings of the job's process-tree source."""

from __future__ import annotations

from pydantic import Field

from sentinel.model.bounds import SettingsTable


class ProcessConfig(SettingsTable):
    """``[process]``: the job's process tree (psutil)."""

    enabled: bool = True
    #: Seconds between readings of the tree: CPU, RSS, states, I/O.
    interval_s: float = Field(default=5.0, gt=0)
