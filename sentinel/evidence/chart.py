"""A picture of the incident: loss, grad-norm, learning rate and throughput around the onset.

The onset, the last clean checkpoint and what sentinel did are marked on the steps;
a non-finite value is a red cross at the top of its panel. Saved as ``chart.png`` and
``chart.svg`` in the incident's folder beside its report (``evidence.incident_dir``).

matplotlib is an optional extra (``sentinel-watchdog[evidence]``): without it there is
no chart and the report keeps its text sparklines. Drawing takes most of a second of
CPU, so ``ChartDrawer`` has the latest picture of each incident drawn by a child process
(``python -m sentinel.evidence.chart FOLDER``, the picture as JSON on its stdin), waited
for on a thread of its own, never on the loop that decides the stop. matplotlib never
loads into sentinel itself (its memory stays flat), and a chart still being drawn when
sentinel exits is finished by its child, not torn down mid-draw.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sentinel.model.records import Sample
from sentinel.store.state import open_private, private_dir

log = logging.getLogger(__name__)

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float]) -> str:
    """``▁▂▄█ nan``: finite values scaled to bars, non-finite ones spelled out."""
    finite = [value for value in values if math.isfinite(value)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 0.0)
    span = (high - low) or 1.0
    marks = []
    for value in values:
        if math.isfinite(value):
            marks.append(_BARS[min(len(_BARS) - 1, int((value - low) / span * len(_BARS)))])
        else:
            marks.append(f" {value} ")
    return "".join(marks).strip()


CHART_PNG = "chart.png"
CHART_SVG = "chart.svg"
#: Whether a chart can be drawn here at all.
AVAILABLE = importlib.util.find_spec("matplotlib") is not None
#: The panels, each the first metric present of its names.
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loss", ("loss", "eval_loss")),
    ("grad-norm", ("grad_norm",)),
    ("learning rate", ("lr",)),
    ("throughput", ("tokens_per_sec", "samples_per_second", "train_samples_per_second")),
)
#: How long a chart waits for its incident's report to settle before it is drawn.
SETTLE_S = 1.0
_CLEAN = re.compile(r"rolled back to (\S+)")
_STEP = re.compile(r"(\d+)(?!.*\d)")


@dataclass(frozen=True)
class Picture:
    """What a chart shows, copied off the loop: series by metric, the marks."""

    title: str
    series: Mapping[str, Sequence[Sample]]
    onset_step: int | None
    #: What sentinel did: (epoch seconds, text).
    actions: Sequence[tuple[float, str]]


def to_json(shown: Picture) -> str:
    """The picture for the drawing child's stdin (non-finite values as JSON's NaN)."""
    return json.dumps(
        {
            "title": shown.title,
            "series": {name: [list(s) for s in samples] for name, samples in shown.series.items()},
            "onset_step": shown.onset_step,
            "actions": [list(action) for action in shown.actions],
        }
    )


def from_json(text: str) -> Picture:
    data = json.loads(text)
    series = {name: [Sample(*s) for s in samples] for name, samples in data["series"].items()}
    actions = [(float(at), str(what)) for at, what in data["actions"]]
    return Picture(str(data["title"]), series, data["onset_step"], actions)


def draw_in_child(shown: Picture, folder: Path) -> None:
    """Draw ``shown`` in ``folder`` in a child process; OSError or RuntimeError if it failed."""
    done = subprocess.run(
        [sys.executable, "-m", "sentinel.evidence.chart", str(folder)],
        input=to_json(shown), capture_output=True, text=True, check=False,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )  # fmt: skip
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no word"])[-1]
        if done.returncode == CHILD_DISK_ERROR:
            raise OSError(last)
        raise RuntimeError(f"the chart's child exited {done.returncode}: {last}")


#: The drawing child's exit status when it could not write the files (full, read-only).
CHILD_DISK_ERROR = 3


def picture(
    title: str,
    history: Mapping[str, Sequence[Sample]],
    onset_step: int | None,
    actions: Sequence[tuple[float, str]],
) -> Picture:
    """A copy of what the chart needs, safe to hand to another thread."""
    wanted = {name for _, names in PANELS for name in names}
    series = {name: list(samples) for name, samples in history.items() if name in wanted}
    return Picture(title, series, onset_step, list(actions))


def clean_step(actions: Sequence[tuple[float, str]]) -> int | None:
    """The last clean checkpoint's step, from the rollback's record (its name's number)."""
    for _, text in reversed(actions):
        if (match := _CLEAN.search(text)) and (step := _STEP.search(match[1])):
            return int(step[1])
    return None


def draw(shown: Picture, folder: Path) -> list[Path]:
    """Save the chart as PNG and SVG in ``folder``; [] when there is nothing to draw."""
    # Here, not at the top: an optional extra, and a second of start-up for every sentinel.
    from matplotlib.figure import Figure

    panels = []
    for label, names in PANELS:
        stepped = (n for n in names if any(s.step is not None for s in shown.series.get(n, ())))
        if (name := next(stepped, None)) is not None:
            panels.append((label, name, shown.series[name]))
    if not panels:
        return []
    figure = Figure(figsize=(8, 1.9 * len(panels) + 0.6), layout="constrained")
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    clean = clean_step(shown.actions)
    for ax, (label, name, samples) in zip(axes, panels, strict=True):
        points = [(s.step, s.value) for s in samples if s.step is not None]
        finite = [(step, value) for step, value in points if math.isfinite(value)]
        ax.plot([p[0] for p in finite], [p[1] for p in finite], marker=".", linewidth=1.2)
        bad = [step for step, value in points if not math.isfinite(value)]
        if bad:
            ax.plot(bad, [1.0] * len(bad), "rx", transform=ax.get_xaxis_transform(),
                    markersize=9, label="non-finite")  # fmt: skip
        ax.set_ylabel(f"{label}\n({name})", fontsize=8)
        if shown.onset_step is not None:
            ax.axvline(shown.onset_step, color="red", linewidth=1.5, label="onset")
        if clean is not None:
            ax.axvline(clean, color="green", linestyle="--", label="last clean checkpoint")
        for index, (step, text) in enumerate(action_steps(shown)):
            what = "what sentinel did" if index == 0 else None
            ax.axvline(step, color="grey", linestyle=":", linewidth=1, label=what)
            if ax is axes[0]:
                ax.annotate(
                    text, (step, 1.0), xycoords=("data", "axes fraction"),
                    rotation=90, fontsize=6, va="top", ha="right", color="dimgrey",
                )  # fmt: skip
    axes[-1].set_xlabel("step")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        axes[0].legend(handles, labels, fontsize=7, loc="upper left")
    axes[0].set_title(shown.title, fontsize=9)
    private_dir(folder)
    written = []
    for name in (CHART_PNG, CHART_SVG):
        path = folder / name
        tmp = path.with_name(f".{name}.tmp")
        # Private like every file in the state dir (0600, whatever the umask).
        try:
            with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as out:
                figure.savefig(out, format=name.rsplit(".", 1)[1], dpi=110)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # no half-written chart left behind on a full disk
            raise
        written.append(path)
    return written


def action_steps(shown: Picture) -> list[tuple[int, str]]:
    """Each of sentinel's actions at the last step logged by its time (the first words);
    at the last step shown where the lines carry no time (sentinel acts on the newest)."""
    stepped = [s for samples in shown.series.values() for s in samples if s.step is not None]
    timed = sorted((s.time, s.step) for s in stepped if s.time is not None)
    last = max((s.step for s in stepped if s.step is not None), default=None)
    marks: dict[int, str] = {}
    for at, text in shown.actions:
        steps = [step for time, step in timed if time <= at] if timed else [last]
        if steps and steps[-1] is not None:
            word = " ".join(text.split()[:3])
            marks.setdefault(steps[-1], word)
    return sorted(marks.items())


class ChartDrawer:
    """Draws each incident's latest picture on a thread of its own, once its requests
    settle (``settle_s``): a stop rewrites a report several times within a second."""

    def __init__(self, settle_s: float = SETTLE_S, *, enabled: bool = True) -> None:
        self.settle_s = settle_s
        #: Off (``[evidence] chart = false``) or without matplotlib: nothing is drawn.
        self.enabled = enabled and AVAILABLE
        #: Per incident: the latest picture, its folder, and when it may be drawn.
        self._pending: dict[str, tuple[Picture, Path, float]] = {}
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False
        self._hurry = False
        self._failed = False

    def request(self, key: str, shown: Picture, folder: Path) -> None:
        """Draw ``shown`` in ``folder`` soon; a newer request for ``key`` replaces it."""
        if not self.enabled:
            return
        with self._lock:
            self._pending[key] = (shown, folder, time.monotonic() + self.settle_s)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="charts", daemon=True)
                self._thread.start()
            self._lock.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Draw what is pending now, waiting at most ``timeout_s``; True when all is drawn."""
        with self._lock:
            self._hurry = True
            self._lock.notify_all()
            done = self._lock.wait_for(lambda: not self._pending and not self._busy, timeout_s)
            self._hurry = False
            return done

    def _next(self) -> tuple[Picture, Path]:
        with self._lock:
            while True:
                if self._pending:
                    key, (_, _, due) = min(self._pending.items(), key=lambda item: item[1][2])
                    wait_s = due - time.monotonic()
                    if self._hurry or wait_s <= 0:
                        shown, folder, _ = self._pending.pop(key)
                        self._busy = True
                        return shown, folder
                    self._lock.wait(wait_s)
                else:
                    self._lock.wait()

    def _run(self) -> None:
        while True:
            shown, folder = self._next()
            try:
                draw_in_child(shown, folder)
            except OSError as error:  # a full or read-only state dir: one line, no traceback
                if not self._failed:
                    log.error("the incident chart could not be written in %s: %s", folder, error)
                self._failed = True
            except Exception as error:  # a chart is a bonus: said once, never fatal
                if not self._failed:
                    log.error("the incident chart could not be drawn: %s", error)
                self._failed = True
            finally:
                with self._lock:
                    self._busy = False
                    self._lock.notify_all()


def main(argv: Sequence[str]) -> int:
    """The drawing child: the picture on stdin, the folder as the one argument."""
    try:
        draw(from_json(sys.stdin.read()), Path(argv[0]))
    except OSError as error:
        print(f"cannot write the chart in {argv[0]}: {error}", file=sys.stderr)
        return CHILD_DISK_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
