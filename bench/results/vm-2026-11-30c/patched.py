"""``sentinel`` with parts turned into no-ops, for ``touched.py``: ``PATCH=tick,feed,commit,proc
python patched.py watch ...`` (the clock tick, the rules' turn on lines, the tailer's offset
save, the process tree's reading)."""

import os
import sys

patches = set(filter(None, os.environ.get("PATCH", "").split(",")))
if "tick" in patches:
    from sentinel.supervisor.core import Supervisor

    Supervisor.on_tick = lambda self: None  # type: ignore[method-assign]
if "feed" in patches:
    from sentinel.engine.core import Engine

    Engine.feed_texts = lambda self, *args, **kwargs: []  # type: ignore[method-assign]
if "commit" in patches:
    from sentinel.follow.logfile import FileFollower

    FileFollower.commit = lambda self: None  # type: ignore[method-assign]
if "proc" in patches:
    from sentinel.process.proctree import ProcessMonitor

    ProcessMonitor.read_once = lambda self, now: []  # type: ignore[method-assign]
sys.argv = ["sentinel", *sys.argv[1:]]
from sentinel.cli.main import main  # noqa: E402

sys.exit(main())
