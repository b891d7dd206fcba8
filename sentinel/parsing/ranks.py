"""Rank prefixes: which distributed rank printed a line, and the line without its prefix.

Launchers label the lines of each rank when they share one stream:

- PyTorch's own ``[rank1]:`` (and DeepSpeed's ``[Rank 1]``), colon optional; the DDP
  tutorials' ``[GPU1]`` (the device's index, one process a GPU);
- torchrun's ``--log-line-prefix-template`` (and ``--tee``'s default): ``[default1]:``,
  ``[trainer1]:``, ``[1]:``: a role name, then the rank, then ``]:``; with the local rank
  after it (``[trainer0|0]:``, a template's ``${role_name}${rank}|${local_rank}``);
- ``srun --label``'s ``1: ``: a number, a colon and a space. A number at the start of a
  line is as often a step (``100: loss=2.3``), so this one is read as a rank only when the
  rest of the line names its own step (``1: step 5 | loss 2.3``);
- a script's own ``rank 1: `` or ``Rank 1 | ``; a bare ``rank 1 `` only when the rest names
  its own step;
- icefall's and k2's logging format, ``2022-10-23 14:53:29,352 INFO [train.py:907] (6/8)
  Epoch 3, batch 115350, ...``: the rank and the world's size after the logger's head (the
  line is read without them, its head and time kept).

``LineParser.parse`` hands a line that may carry one (``may_carry``) to ``parse_ranked``,
which strips it, parses the rest once and sets each sample's ``rank``. Two ranks' prints
glued on one line (``print`` writes its text and its newline apart, so another process's
text can come between: ``[GPU1] step 6 | loss 6.08[GPU0] step 6 | loss 1.84``) are read
as two lines, each at its rank.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sentinel.model.records import PROGRESS, Sample

#: What a line with a rank prefix starts with: cheap gate before the regex.
_FIRST = frozenset("[0123456789 rR")
#: ``[rank1]:``, ``[Rank 1]``, ``[GPU1]``, ``[default1]:``, ``[1]:``.
_BRACKETED = re.compile(
    r"\[(?:(rank|gpu) ?|[A-Za-z_][\w-]*?)?(\d{1,6})(?:\|\d{1,6})?\](:?) ?", re.IGNORECASE
)
#: A sure prefix inside a line: another rank's print glued on.
_GLUED = re.compile(
    r"\[(?:(?:rank|gpu) ?\d{1,6}\]:?|[A-Za-z_][\w-]*?\d{1,6}(?:\|\d{1,6})?\]:)", re.IGNORECASE
)
#: ``rank 1:``, ``Rank1 |``, ``RANK 1 `` (the last one not sure).
_NAMED = re.compile(r"rank ?(\d{1,6})(?: ?([:|]) ?| )", re.IGNORECASE)
#: srun --label: ``1: `` (right-aligned to the widest task id); not CatBoost's iteration
#: before its ``learn`` value (``61:     learn 0.1211``: ``boosting``'s).
_LABEL = re.compile(r" *(\d{1,5}): (?!\s*learn\b)")
#: icefall's (k2's) head: ``<date> <time> <LEVEL> [<file>:<line>] (<rank>/<world>) ``.
_ICEFALL = re.compile(r"[\d-]+ [\d:,.]+ [A-Z]+ \[[\w./-]+:\d+\] \((\d{1,6})/(\d{1,6})\) ")

_new_sample = tuple.__new__


def may_carry(text: str) -> bool:
    """Whether ``text`` may start with a rank prefix (one character looked at)."""
    return text[:1] in _FIRST


def split_rank(text: str) -> tuple[int, str, bool] | None:
    """``(rank, rest of the line, sure)`` for a line with a rank prefix, else None.

    ``sure`` is False for srun's bare ``N: `` label and a bare ``rank N ``, which are a
    rank only when the rest names a step."""
    bracketed = _BRACKETED.match(text)
    if bracketed is not None:
        named_rank, rank, colon = bracketed.groups()
        if named_rank or colon:  # a bare ``[1]`` is too common to be a rank
            return int(rank), text[bracketed.end() :], True
        return None
    named = _NAMED.match(text)
    if named is not None:
        return int(named.group(1)), text[named.end() :], named.group(2) is not None
    label = _LABEL.match(text)
    if label is not None:
        return int(label.group(1)), text[label.end() :], False
    if "] (" in text:
        icefall = _ICEFALL.match(text)
        if icefall is not None and int(icefall.group(1)) < int(icefall.group(2)):
            head = text[: icefall.start(1) - 1]
            return int(icefall.group(1)), head + text[icefall.end() :], True
    return None


def parse_ranked(parse: Callable[[str], list[Sample]], text: str) -> list[Sample] | None:
    """The samples of a line with a rank prefix, each with its ``rank``, read by ``parse``
    from the rest of the line; None when the line has no prefix (parse it whole).

    A bare srun label whose rest names no step is no rank: the rest's samples come back
    without one."""
    found = split_rank(text)
    if found is None:
        return None
    rank, rest, sure = found
    if sure and "[" in rest:
        glued = _GLUED.search(rest, 1)
        if glued is not None:  # another rank's print glued on: two lines
            theirs = parse_ranked(parse, rest[glued.start() :]) or []
            return [*_with_rank(parse(rest[: glued.start()]), rank), *theirs]
    samples = parse(rest)
    if not samples:
        return samples
    if not sure and not any(sample[2] is not None and sample[0] != PROGRESS for sample in samples):
        return samples
    return _with_rank(samples, rank)


def _with_rank(samples: list[Sample], rank: int) -> list[Sample]:
    return [_new_sample(Sample, (*sample[:4], rank)) for sample in samples]


__all__ = ["may_carry", "parse_ranked", "split_rank"]
