"""RSL-RL's console block (legged_gym, Isaac Lab, mjlab): one block per learning iteration.

Its runner prints, after each iteration (5.x; its padding right-aligns the names)::

    ################################################################################
                            Learning iteration 2/1500
                               Run name: pointmass
                            Total steps: 4608
                       Steps per second: 18115
                        Mean value loss: 563.5716
                    Mean surrogate loss: 0.0003
                      Mean entropy loss: 1.5326
                            Mean reward: -133.30
    --------------------------------------------------------------------------------
                         Iteration time: 0.08s
                                    ETA: 0:00:00

(earlier releases: ``Computation: 4466 steps/s (collection: ...)``, ``Value function loss:``,
``Mean value_function loss:``, ``Surrogate loss:``, ``Mean action noise std:``,
``Mean episode rew_action_rate:``, ``Total timesteps:``). The iteration line is bold (an
escape sequence around it). Each line of the block is read at the iteration it names: the
step RSL-RL names its checkpoints by (``model_2.pt``). The block ends at its ``ETA:`` line.

Names: ``Mean X loss`` is ``X_loss`` (``value_loss``, ``surrogate_loss``,
``entropy_loss``; the value function's is ``value_loss`` in every release), the rest its
words without ``Mean`` (``reward``, ``episode_length``, ``action_std``,
``steps_per_second``, ``total_steps``; an environment's own terms as written,
``episode_reward/track_lin_vel_xy_exp``). None of them is ``loss``: an RL objective moves
with the returns (a healthy run's value loss falls from hundreds to near 0 and jumps back
to hundreds as the policy finds new states: ``tests/fixtures/rsl_rl/healthy``), so the rules
that judge a training loss's shape leave it alone, while a non-finite value of any of
them stops the job (``nan_inf``: a loss by its name). Times (``Collection time``,
``Iteration time``, ``Time elapsed``, ``ETA``) and the run's name are no metrics. An
excerpt that starts inside a block reads its losses by these names too, at no step.
A ``LineFormat``: it keeps the iteration of the block being read.
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.values import as_float

_ITERATION = re.compile(r"Learning iteration (\d+)/\d+")
#: ``Name: value`` inside a block; the value's first word (``0.08s``, ``4466 steps/s ...``).
_PAIR = re.compile(r"([A-Za-z][\w /.\-]*?):\s+(\S+)")
#: RSL-RL's own names for its losses, read as such even outside a block.
_LOSS_OUTSIDE = re.compile(
    r"((?:Mean )?(?:value|value_function|value function|surrogate|entropy|rnd|symmetry)"
    r" loss):\s+(\S+)",
    re.IGNORECASE,
)
#: Lines of a block that carry no metric.
_NOT_METRICS = frozenset(
    {
        "run name",
        "collection time",
        "learning time",
        "iteration time",
        "time elapsed",
        "total time",
        "eta",
    }
)
#: The value function's loss, as each release names it.
_NAMES = {
    "value function loss": "value_loss",
    "mean value_function loss": "value_loss",
    "mean value loss": "value_loss",
    "computation": "steps_per_second",
    "total timesteps": "total_steps",
}


class RslRlBlock:
    """Reads RSL-RL's blocks, keeping the iteration of the one being read."""

    __slots__ = ("_iteration",)

    def __init__(self) -> None:
        #: The iteration of the block being read; None outside a block.
        self._iteration: int | None = None

    def parse(self, text: str) -> list[Sample] | None:
        """Samples of one stripped line; None for a line in another format."""
        if text[0] == "L" and text.startswith("Learning iteration "):
            found = _ITERATION.fullmatch(text)
            if found is None:
                return None
            self._iteration = int(found.group(1))
            return []
        iteration = self._iteration
        if iteration is None:
            # An excerpt that starts inside a block: its losses by their own names, at no
            # step, never as the training loss (a NaN among them still stops the job).
            found = _LOSS_OUTSIDE.fullmatch(text) if " loss:" in text else None
            if found is None:
                return None
            value = as_float(found.group(2))
            return [] if value is None else [Sample(_name(found.group(1).lower()), value)]
        found = _PAIR.fullmatch(text) or _PAIR.match(text)
        if found is None:
            return [] if text[0] in "-#" and len(set(text)) == 1 else None
        key = found.group(1).lower()
        if key == "eta":
            self._iteration = None  # the block's last line
        if key in _NOT_METRICS:
            return []
        value = as_float(found.group(2))
        if value is None:
            return None
        return [Sample(_name(key), value, iteration)]


def _name(key: str) -> str:
    """The metric name of a block line's name (see the module docstring)."""
    named = _NAMES.get(key)
    if named is not None:
        return named
    if key.startswith("mean "):
        key = key[len("mean ") :]
        if key.startswith("episode ") and "/" not in key and key != "episode length":
            key = "episode/" + key[len("episode ") :]  # legged_gym's reward terms
    return key.replace(" ", "_")
