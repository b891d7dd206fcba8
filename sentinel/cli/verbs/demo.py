"""``sentinel demo``: watch a bundled toy job diverge, roll back and finish."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sentinel.cli.options import add_shared

VERB = "demo"


def add_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = verbs.add_parser(VERB, help="watch a bundled toy job diverge, roll back and finish")
    add_shared(
        demo,
        takes=["--verbose"],
        why="demo runs its bundled job with settings of its own",
        because={"--json": "demo tells its story for people to read"},
    )
    demo.add_argument("--keep", type=Path, metavar="DIR", help="work in DIR and keep it")


def handle(args: argparse.Namespace) -> int:
    from sentinel.demo import run_demo

    return run_demo(args.keep, out=sys.stdout)
