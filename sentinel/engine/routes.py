"""Which rules the engine shows what: a line by its samples' names, a block by what it
brings, the output and tick hooks to the rules that implement them.

Routes are worked out once per kind of line or block and kept (a log repeats a few);
taking a rule out (``remove``) drops them all, to be worked out again without it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sentinel.model.records import PROGRESS, Block
from sentinel.parsing.hf_trainer import SUMMARY_NAMES
from sentinel.rules import BaseDetector

#: Routes kept, of lines (one per tuple of sample names) and of blocks (one per kind of
#: block): a log repeats a few.
ROUTES_MAX = 4096

#: Hooks whose detectors also include those that override the faster variant.
_ALSO_HOOKED = {"output": ("output_text",)}


def overrides(detector: BaseDetector, hook: str) -> bool:
    """Whether ``detector.hook`` is its own, not BaseDetector's do-nothing method."""
    method = getattr(detector, hook)
    return getattr(method, "__func__", None) is not getattr(BaseDetector, hook)


class Routes:
    """The enabled rules, in registry order, and the routes to them."""

    __slots__ = ("_blocks", "detectors", "hooks", "lines")

    def __init__(self, detectors: Sequence[BaseDetector]) -> None:
        self.detectors = list(detectors)
        #: Per tuple of a line's sample names: the detectors shown that line, each with
        #: whether its ``observe`` is called sample by sample (see ``line``).
        self.lines: dict[tuple[str, ...], list[tuple[BaseDetector, bool]]] = {}
        # Per (metric names, output seen, clock ticking, progress shown): the detectors a
        # block concerns.
        self._blocks: dict[tuple[tuple[str, ...], bool, bool, bool], list[BaseDetector]] = {}
        #: Per hook name (output, tick): the detectors that implement it (see ``hooked``).
        self.hooks: dict[str, list[BaseDetector]] = {}

    def line(self, names: tuple[str, ...]) -> list[tuple[BaseDetector, bool]]:
        """The detectors shown a line whose samples have these names, in registry order,
        each with whether the engine calls its ``observe`` sample by sample (a rule
        without its own ``observe_samples``). See ``BaseDetector.watches`` and
        ``sees_progress``. A summary record (``SUMMARY_NAMES``: the run's means, not a
        step, as the Trainer prints it at the end) is shown to none."""
        route = self.lines.get(names)
        if route is not None:
            return route
        if len(self.lines) >= ROUTES_MAX:
            self.lines.clear()
        if not SUMMARY_NAMES.isdisjoint(names):
            route = self.lines[names] = []  # a summary, not a step
            return route
        route = self.lines[names] = [
            (detector, not overrides(detector, "observe_samples"))
            for detector in self.detectors
            if any(
                detector.sees_progress
                if name == PROGRESS
                else detector.watches is None or name in detector.watches
                for name in names
            )
        ]
        return route

    def hooked(self, hook: str) -> list[BaseDetector]:
        """The detectors whose ``hook`` does something (BaseDetector's own hooks do nothing).

        ``output`` and ``tick`` run once a line in a replay, and most rules have neither.
        A rule with its own ``output_text`` watches output as well.
        """
        detectors = self.hooks.get(hook)
        if detectors is None:
            also = _ALSO_HOOKED.get(hook, ())
            detectors = self.hooks[hook] = [
                detector
                for detector in self.detectors
                if overrides(detector, hook) or any(overrides(detector, h) for h in also)
            ]
        return detectors

    def block(self, block: Block) -> list[BaseDetector]:
        """The rules a block concerns, in registry order: those its metrics are routed to,
        and those that watch output or ticks when the block brings them."""
        ticking = block.ticks and block.clock[-1] > (block.start_clock or 0.0)
        key = (block.names, block.output, ticking, bool(block.progress))
        concerned = self._blocks.get(key)
        if concerned is None:
            wanted = {id(detector) for detector, _ in self.line(block.names)}
            if block.output:
                wanted.update(map(id, self.hooked("output")))
            if ticking:
                wanted.update(map(id, self.hooked("tick")))
            if block.progress:
                wanted.update(id(detector) for detector in self.detectors if detector.sees_progress)
            concerned = [detector for detector in self.detectors if id(detector) in wanted]
            if len(self._blocks) >= ROUTES_MAX:
                self._blocks.clear()
            self._blocks[key] = concerned
        return concerned

    def remove(self, detector: BaseDetector) -> None:
        """Take a rule out. A loop over a route handed out before finishes safely: routes
        are new lists, worked out again without it."""
        self.detectors.remove(detector)
        self.lines.clear()
        self._blocks.clear()
        self.hooks.clear()
