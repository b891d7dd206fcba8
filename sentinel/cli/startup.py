"""What a ``sentinel`` process does before it imports its settings: pydantic looks for no
plugins while sentinel's models are built.

Each pydantic model asks for the plugins of the ``pydantic`` entry-point group as it is
built, and the first ask lists the entry points of every distribution installed: beside a
training stack (torch, transformers, lightning) that was about a fifth of a ``sentinel``
start (0.77 -> 0.62 s of CPU for ``sentinel --help`` on the development VM), paid by each
of the few hundred sentinels the test suite starts and by every short command (``status``,
``verdict``) a script runs. sentinel's models use no plugin. ``PYDANTIC_DISABLE_PLUGINS``,
pydantic's own switch, is set while the command's modules are imported and taken away
once they are (``sentinel/cli/__init__.py``), so the job sentinel launches, and a program
that imports ``sentinel.cli``, keep the environment as it was; one the user set is left
alone.
"""

from __future__ import annotations

import os

_SWITCH = "PYDANTIC_DISABLE_PLUGINS"
_set_here = False


def hold() -> None:
    """Turn pydantic's plugins off for the imports to come, unless the user chose."""
    global _set_here
    if _SWITCH not in os.environ:
        os.environ[_SWITCH] = "__all__"
        _set_here = True


def release() -> None:
    """Give the environment back as it was before ``hold``."""
    global _set_here
    if _set_here:
        os.environ.pop(_SWITCH, None)
        _set_here = False
