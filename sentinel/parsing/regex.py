"""User regular expressions: named groups become samples.

``r"it (?P<step>\\d+) L=(?P<loss>\\S+)"`` gives ``loss`` at the step. Each named
group other than ``step`` and ``time`` is a metric (its name normalised); a
pattern needs at least one named group. Patterns are validated once, when
compiled, so a bad one fails at start, not on the first line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from sentinel.model.records import PROGRESS, Sample
from sentinel.parsing.values import ParseFn, as_epoch_seconds, as_float, as_step, normalise_name


@dataclass(frozen=True, slots=True)
class UserRegex:
    """A validated user pattern and, for each metric group, the sample name it gives."""

    pattern: str
    compiled: re.Pattern[str]
    metrics: tuple[tuple[str, str], ...]
    has_step: bool
    has_time: bool


def compile_regex(pattern: str) -> UserRegex:
    """Compile and check one user pattern; ``ValueError`` naming it when it is unusable."""
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise ValueError(f"invalid regex {pattern!r}: {error}") from error
    groups = compiled.groupindex
    if not groups:
        raise ValueError(
            f"regex {pattern!r} has no named group; name each value, e.g. (?P<loss>[-+.\\w]+)"
        )
    metrics = tuple(
        (group, normalise_name(group)) for group in groups if group not in ("step", "time")
    )
    return UserRegex(pattern, compiled, metrics, "step" in groups, "time" in groups)


def compile_regexes(patterns: Iterable[str]) -> tuple[UserRegex, ...]:
    """Compile and check user patterns, in order; ``ValueError`` naming the first bad one."""
    if isinstance(patterns, str):
        raise ValueError(f"regexes must be a list of patterns, not the string {patterns!r}")
    return tuple(compile_regex(pattern) for pattern in patterns)


def parse_with_regex(regex: UserRegex, text: str) -> list[Sample] | None:
    """Samples from one user pattern; None when it does not match the line.

    A match with a step and no readable metric gives one ``PROGRESS`` sample.
    """
    match = regex.compiled.search(text)
    if match is None:
        return None
    step = as_step(match.group("step")) if regex.has_step else None
    time = as_epoch_seconds(match.group("time")) if regex.has_time else None
    samples: list[Sample] = []
    for group, name in regex.metrics:
        value = as_float(match.group(group))
        if value is not None:
            samples.append(Sample(name, value, step, time))
    if not samples and step is not None:
        samples.append(Sample(PROGRESS, float(step), step, time))
    return samples


def parse_with_regexes(regexes: Iterable[UserRegex], text: str) -> list[Sample] | None:
    """Samples from the first pattern that yields any; None when none matched at all."""
    result: list[Sample] | None = None
    for regex in regexes:
        found = parse_with_regex(regex, text)
        if found:
            return found
        if found is not None:
            result = found
    return result


def make_regex_parser(patterns: Iterable[str]) -> ParseFn:
    """A ``ParseFn`` over user patterns, validated now; ``ValueError`` naming a bad one."""
    regexes = compile_regexes(patterns)

    def parse_regex(text: str) -> list[Sample] | None:
        return parse_with_regexes(regexes, text.strip())

    return parse_regex
