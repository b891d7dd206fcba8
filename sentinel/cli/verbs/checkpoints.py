"""``sentinel checkpoints DIR``: the checkpoints, their status and the resume pointers.

In Lightning's ``lightning_logs`` they are those of every ``version_N/checkpoints/``, each
shown by its path in DIR.

With ``--restore INCIDENT``, it undoes a rollback: the quarantine goes back where it came from.
Names are shown with their control characters escaped (a folder named with a newline or an
escape sequence stays one row); ``--json`` gives them as they are.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sentinel.cli.options import add_shared
from sentinel.cli.verbs.common import usage_error
from sentinel.model.untrusted import printable

if TYPE_CHECKING:
    from sentinel.checkpoints.keep import KeptVersion
    from sentinel.checkpoints.pointer_find import Pointer
    from sentinel.checkpoints.scan import Onset

VERB = "checkpoints"


def add_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    checkpoints = verbs.add_parser(
        VERB, help="list checkpoints and their status, and the resume pointers"
    )
    add_shared(
        checkpoints,
        takes=["--json", "--state-dir"],
        why="checkpoints only reads DIR: it uses no settings and moves nothing",
        because={"--verbose": "checkpoints logs nothing: it prints what it finds"},
    )
    checkpoints.add_argument("directory", type=Path, metavar="DIR", help="the directory to list")
    checkpoints.add_argument(
        "--restore",
        metavar="INCIDENT",
        help="undo a rollback: move the quarantine INCIDENT (its folder's name, or a unique"
        " prefix) back where each item came from, and the resume pointers it rewrote as they"
        " were; refuses if any of those places is taken",
    )


def handle(args: argparse.Namespace) -> int:
    from sentinel.checkpoints.pointer_find import find_pointers
    from sentinel.checkpoints.scan import last_clean, scan

    if args.restore is not None:
        return _restore(args)
    if not args.directory.is_dir():
        return usage_error("sentinel checkpoints", f"not a directory: {args.directory}")
    from sentinel.config import setting_default

    default = setting_default(("state_dir",))  # run's and watch's, unless told
    onset, said = _last_onset(Path(args.state_dir or default))
    found = scan(args.directory, onset=onset)
    clean = last_clean(found, onset)
    pointers = find_pointers(args.directory)
    kept = _kept(args.directory, onset)
    if args.json:
        print(
            json.dumps(
                {
                    "directory": str(args.directory.resolve()),
                    "last_clean": str(clean.path) if clean else None,
                    "onset": None if onset is None else {"step": onset.step, "time": onset.time},
                    "checkpoints": [
                        {
                            "path": str(c.path),
                            "step": c.step,
                            "epoch": c.epoch,
                            "status": str(c.status),
                            "reason": c.reason,
                            "layout": c.layout,
                            "placed_by": c.placed_by,
                        }
                        for c in found
                    ],
                    "pointers": [p.to_json() for p in pointers],
                    "kept": [
                        {**version.to_json(), "intact": intact, "after_onset": after}
                        for version, intact, after in kept
                    ],
                },
                indent=2,
            )
        )
        return 0
    if said:
        print(printable(said))
    if not found:
        print(f"no checkpoints in {printable(str(args.directory))}")
        _print_kept(kept, args.directory)
        _print_pointers(pointers, args.directory)
        return 0
    root = os.path.abspath(args.directory)
    # A checkpoint by its name, or in lightning_logs by its path there (version_1/...).
    names = {c.path: printable(os.path.relpath(c.path, root)) for c in found}
    width = max(32, *map(len, names.values()))
    print(f"{'step':>8}  {'status':<11} {'checkpoint':<{width}} {'layout':<11} reason")
    for c in found:
        place = "-" if c.epoch is None else f"epoch={c.epoch}"
        place = place if c.step is None else str(c.step)
        notes = [printable(c.reason)] if c.reason else []
        if c.placed_by != "name":
            notes.append(f"placed by {c.placed_by}")
        if clean is not None and c.path == clean.path:
            notes.append("<- last clean: a rollback resumes here")
        name = names[c.path]  # escaped: a folder's name may hold a newline or an escape
        print(f"{place:>8}  {c.status!s:<11} {name:<{width}} {c.layout:<11} {'; '.join(notes)}")
    if clean is None and not any(intact and not after for _, intact, after in kept):
        print("no clean checkpoint: a rollback would have nothing to resume from")
    elif clean is None:
        print("no clean checkpoint in place: a rollback would put a kept copy back (below)")
    _print_kept(kept, args.directory)
    _print_pointers(pointers, args.directory)
    return 0


def _kept(directory: Path, onset: Onset | None) -> list[tuple[KeptVersion, bool, bool]]:
    """The versions sentinel kept of the job's checkpoints (``checkpoints.keep``), each with
    whether it is still the version kept and whether it was written at or after ``onset``."""
    from sentinel.checkpoints.keep import kept_versions
    from sentinel.checkpoints.scan import checkpoint_folders

    listed = []
    # A Lightning pool's copies are kept in each version's folder (``FolderKeepers``).
    kept = [
        version for folder in checkpoint_folders(directory) for version in kept_versions(folder)
    ]
    for version in kept:
        after = onset is not None and (
            (onset.step is not None and version.step is not None and version.step >= onset.step)
            or (onset.step is None and onset.time is not None and version.mtime >= onset.time)
        )
        listed.append((version, version.intact(), after))
    return listed


def _print_kept(kept: Sequence[tuple[KeptVersion, bool, bool]], directory: Path) -> None:
    """What a person resuming by hand can take when the job deleted or rewrote its own."""
    if not kept:
        return
    root = os.path.abspath(directory)
    print(
        "kept by sentinel (the job overwrites or deletes these; a rollback puts the newest"
        " clean one back where the job wrote it):"
    )
    for version, intact, after in kept:
        place = "-" if version.step is None else str(version.step)
        notes = [] if version.original.exists() else ["the job's own is gone"]
        if not intact:
            notes.append("changed since it was kept: not used")
        if after:
            notes.append("written at or after the last stop's onset: not clean")
        name = printable(version.original.name)
        copy = printable(os.path.relpath(version.path, root))
        print(f"{place:>8}  {name:<24} {copy}  {'; '.join(notes)}".rstrip())


def _last_onset(state_dir: Path) -> tuple[Onset | None, str]:
    """The onset of the last stop whose poisoned checkpoints may still be in place (the
    state dir's verdict record: an unfinished stop, a give-up), and a line that says so; a
    checkpoint written at or after it is never called clean."""
    from sentinel.checkpoints.scan import Onset
    from sentinel.store.stop_intent import DRY_RUN_NAME, dry_run_stop, unresolved

    intent = unresolved(state_dir)
    dry = dry_run_stop(state_dir)
    signalled = None if intent is None else intent.signalled_at
    if dry is not None and (signalled is None or dry.time > signalled):
        # A dry run acted on nothing: the saves it would have set aside are still there.
        onset = Onset(step=dry.onset_step, time=dry.onset_time)
        where = f"step {onset.step}" if onset.step is not None else "its time"
        said = (
            f"a dry run would have stopped the job ({dry.rule}, {state_dir / DRY_RUN_NAME})"
            f" and set nothing aside: checkpoints from its onset ({where}) on are after_onset"
        )
        return onset, said
    if intent is None:
        return None, ""
    incident = intent.incident
    onset = Onset(step=incident.get("onset_step"), time=incident.get("onset_time"))
    where = f"step {onset.step}" if onset.step is not None else "its time"
    said = (
        f"the last stop ({intent.rule}, {state_dir / 'verdict.json'}) was not rolled back and"
        f" resumed: checkpoints from its onset ({where}) on are after_onset"
    )
    return onset, said


def _print_pointers(pointers: Sequence[Pointer], directory: Path) -> None:
    """Each framework's resume pointer and what it names (a job restarted by others reads it)."""
    for pointer in pointers:
        print(f"{'pointer':>8}  {printable(pointer.describe(directory))}")


def _restore(args: argparse.Namespace) -> int:
    """``sentinel checkpoints --restore INCIDENT DIR``: put a rollback's quarantine back."""
    from sentinel.checkpoints.restore import RestoreRefused, restore_quarantine

    if not args.directory.is_dir():
        return usage_error("sentinel checkpoints", f"not a directory: {args.directory}")
    try:
        moves = restore_quarantine(args.directory, args.restore)
    except RestoreRefused as error:
        return usage_error("sentinel checkpoints --restore", error)
    if args.json:
        restored = [{"from": str(m.source), "to": str(m.destination)} for m in moves]
        print(json.dumps({"restored": restored}, indent=2))
        return 0
    for move in moves:
        source = printable(str(move.source.parent))
        print(f"restored {printable(str(move.destination))} (from {source})")
    print(f"{len(moves)} item(s) back from the quarantine")
    return 0
