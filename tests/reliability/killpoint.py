"""``sentinel`` with a kill point: it SIGKILLs itself at one step of a stop and rollback.

The point is injected from outside the product, by wrapping the ``os`` functions the step
goes through (``KILLPOINT_AT``), then ``sentinel``'s own entry point runs with this
script's arguments:

- ``after-first-move``: right after the first checkpoint was renamed into the quarantine;
- ``before-pointer``: when the new ``latest`` is made under its temp name, before it is
  renamed over the old one (the moves are done, the pointer not);
- ``none``: no kill point (the test kills from outside, or not at all).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

POINT = os.environ.get("KILLPOINT_AT", "none")
_rename, _replace = os.rename, os.replace


def _die(where: str) -> None:
    print(f"killpoint {POINT}: SIGKILL at {where}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _killing_rename(src, dst, *args, **kwargs):  # type: ignore[no-untyped-def]
    result = _rename(src, dst, *args, **kwargs)
    if POINT == "after-first-move" and "quarantine" in Path(os.fspath(dst)).parts:
        _die(f"the move of {src}")
    return result


def _killing_replace(src, dst, *args, **kwargs):  # type: ignore[no-untyped-def]
    if POINT == "before-pointer" and Path(os.fspath(dst)).name == "latest":
        _die(f"the rewrite of {dst} (its new text is in {src})")
    return _replace(src, dst, *args, **kwargs)


os.rename = _killing_rename
os.replace = _killing_replace

if __name__ == "__main__":
    from sentinel.cli.main import main

    sys.argv = ["sentinel", *sys.argv[1:]]
    sys.exit(main())
