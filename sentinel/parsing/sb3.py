"""Stable-Baselines3's console table (``verbose=1``; SB3-Contrib and RL Zoo print the same).

One table a dump, between two lines of dashes, a row a value, under section rows::

    -----------------------------------------
    | rollout/                |             |
    |    ep_rew_mean          | 27          |
    | time/                   |             |
    |    total_timesteps      | 512         |
    | train/                  |             |
    |    loss                 | 39.3        |
    |    value_loss           | 87.7        |
    -----------------------------------------

Its rows are read whole, as the logger dumped them, at its ``time/total_timesteps``: the
environment steps, which SB3's ``CheckpointCallback`` names its checkpoints by
(``rl_model_512_steps.zip``). The rows come back at the closing dashes, which the logger
writes with them. A table cut at the start (an excerpt that begins inside one) gives the
rows it holds under a section it shows, at the step it names, if any. A ``LineFormat``: it
keeps the rows of the table being read.

Each value keeps its name as SB3 writes it, under its section (``rollout/ep_rew_mean``,
``train/loss``, ``train/value_loss``), but the learning rate, which is ``lr``. An RL
objective is no supervised loss: PPO's and A2C's ``train/loss`` is mostly the value loss,
whose targets are the returns, and it moves with them: in a healthy PPO run
(``tests/fixtures/sb3/ppo_healthy``, its return climbing 22 -> 225) it jumps to 4-83x its
recent median four times. Read as ``loss`` it would feed the rules that judge a training
loss's shape (a spike, a shift that stays), and raised four ``loss_spike`` warnings there;
under its own name a non-finite value of it still stops the job (``nan_inf``: a loss by
its name), as does the objective's values turning non-finite together.
``train/explained_variance`` is NaN by design where a rollout's returns are all alike
(SB3's ``explained_variance`` returns NaN for targets with no variance: A2C's 5-step
rollouts on CartPole, every reward 1 and the value they bootstrap from settled, log it ten
times in a healthy run, ``tests/fixtures/sb3/a2c_healthy``), so a non-finite one is left
out. Rows under a section row that an excerpt cut off are read under ``sb3/``
(``sb3/loss``): their section is not known, and ``loss`` alone would be read as a training
loss; a NaN among them still stops the job.
"""

from __future__ import annotations

import math

from sentinel.model.records import Sample
from sentinel.parsing.values import as_float, as_step

#: The step the table is at: the environment steps taken so far.
_STEP_KEY = "time/total_timesteps"
#: The section of rows whose section row an excerpt cut off.
_UNKNOWN_SECTION = "sb3/"
#: Rows read under another name.
_NAMES = {"train/learning_rate": "lr"}
#: Rows that are NaN by design at times (see the module docstring): left out when not finite.
_NAN_BY_DESIGN = frozenset({"train/explained_variance"})
#: The least run of dashes that frames a table (SB3's are as wide as its widest row).
_MIN_DASHES = 10
#: Rows gathered with no dashes to close them (not SB3's: a log of other tables): dropped.
_MAX_ROWS = 256


class Sb3Table:
    """Reads SB3's tables: rows are gathered until the dashes that close them."""

    __slots__ = ("_rows", "_section")

    def __init__(self) -> None:
        #: The rows of the table being read: (key under its section, value as written).
        self._rows: list[tuple[str, str]] = []
        self._section = ""

    def parse(self, text: str) -> list[Sample] | None:
        """Samples of one stripped line; None for a line in another format."""
        first = text[0]
        if first == "|":
            return self._row(text)
        if first == "-" and len(text) >= _MIN_DASHES and text.count("-") == len(text):
            return self._close()
        return None

    def _row(self, text: str) -> list[Sample] | None:
        cells = text.split("|")
        if len(cells) != 4 or cells[0] or cells[3]:
            return None
        key, value = cells[1].strip(), cells[2].strip()
        if not key or not (key[0].isalpha() or key[0] == "_"):
            return None
        indent = cells[1][:3] == "   "  # "|    ep_rew_mean": under its section
        if not value:
            if not key.endswith("/"):
                return None
            self._section = key  # a section row: ``| rollout/ |  |``
            return []
        section = self._section if indent else ""
        if indent and not section:
            # Under a section row an excerpt cut off: the step is known by its name, any
            # other value read under ``sb3/`` (a NaN still seen, never the training loss).
            section = "time/" if key == _STEP_KEY.partition("/")[2] else _UNKNOWN_SECTION
        if len(self._rows) >= _MAX_ROWS:
            self._rows.clear()
        self._rows.append((section + key, value))
        return []

    def _close(self) -> list[Sample]:
        """The dashes before or after a table: the rows gathered, if any, as samples."""
        rows, self._rows, self._section = self._rows, [], ""
        if not rows:
            return []
        step = next((as_step(value) for key, value in rows if key == _STEP_KEY), None)
        samples = []
        for key, value in rows:
            number = as_float(value)
            if number is None or key == _STEP_KEY:
                continue
            if key in _NAN_BY_DESIGN and not math.isfinite(number):
                continue
            samples.append(Sample(_NAMES.get(key, key), number, step))
        return samples
