"""A loop that is behind reads, of each late batch, what may matter and the newest lines."""

from __future__ import annotations

import pytest

from sentinel.service.metrics import Metrics
from sentinel.supervisor.events import JobExited, OutputLines
from sentinel.supervisor.shedding import (
    KEEP_NEWEST,
    LAG_S,
    LINE_OVERHEAD,
    MAX_SUSPECTS,
    Shedder,
    suspects,
    suspects_first,
)


def _batch(count: int, suspect_at: int | None = None, text: str = '{"loss": NaN}') -> list[str]:
    lines = [f'{{"step": {i}, "loss": 2.5}}' for i in range(count)]
    if suspect_at is not None:
        lines[suspect_at] = text
    return lines


def test_a_batch_on_time_is_read_whole() -> None:
    lines = _batch(1000)
    assert Shedder().keep(lines, lag_s=LAG_S / 2) == lines


@pytest.mark.parametrize(
    "text",
    ['{"step": 9, "loss": NaN}', "{'loss': nan, 'step': 9}", '{"loss": -Infinity}',
     "Traceback (most recent call last):", "RuntimeError: CUDA error: an illegal memory access"],
    ids=["json-nan", "hf-nan", "json-inf", "traceback", "error"],
)  # fmt: skip
def test_a_late_batch_keeps_every_suspect_line_and_the_newest(text: str) -> None:
    shedder = Shedder()
    lines = _batch(10_000, suspect_at=9, text=text)
    kept = shedder.keep(lines, lag_s=LAG_S * 4)
    assert kept == [text, *lines[-KEEP_NEWEST:]]
    assert shedder.skipped == 10_000 - KEEP_NEWEST - 1


def test_a_late_batch_with_nothing_suspect_keeps_only_the_newest() -> None:
    shedder = Shedder()
    lines = _batch(5000)
    assert shedder.keep(lines, lag_s=LAG_S * 2) == lines[-KEEP_NEWEST:]
    assert shedder.skipped == 5000 - KEEP_NEWEST
    # "info" and "inference" are not "inf"
    assert (
        shedder.keep(["INFO inference step"] * 200, lag_s=LAG_S * 2)
        == ["INFO inference step"] * KEEP_NEWEST
    )


@pytest.mark.parametrize(
    ("text", "suspect"),
    [("loss=nan", True), ("tensor(NaN, device='cuda:0')", True), ("grad_norm: -inf", True),
     ("x: Infinity", True), ("  File \"train.py\", line 3", False), ("INFO inference", False),
     ("financial nanoseconds", False), ("Traceback (most recent call last):", True),
     ("torch.OutOfMemoryError: CUDA out of memory", True)],
    ids=["nan", "tensor-nan", "minus-inf", "json-infinity", "frame", "info", "words",
         "traceback", "oom"],
)  # fmt: skip
def test_the_search_finds_non_finite_values_and_errors_but_not_words(
    text: str, suspect: bool
) -> None:
    lines = _batch(100)
    lines[40] = text
    assert suspects(lines) == ([text] if suspect else [])


def test_at_most_the_newest_suspects_of_a_batch_are_kept() -> None:
    lines = [f"step {i} error: 0.5" for i in range(1000)]
    assert suspects(lines) == lines[-MAX_SUSPECTS:]


def test_the_inbox_bound_shrinks_an_output_event_to_its_suspects_and_counts_the_rest() -> None:
    shedder = Shedder()
    lines = _batch(1000, suspect_at=500)
    event = OutputLines("stdout", lines, 12.5)
    assert shedder.weight(event) == sum(map(len, lines)) + LINE_OVERHEAD * 1000
    assert shedder.weight(JobExited(1, 0)) == 0
    assert shedder.shrink(event) == OutputLines("stdout", ['{"loss": NaN}'], 12.5)
    assert shedder.skipped == 999


def test_a_batch_is_read_in_part_when_parsing_it_whole_would_pass_the_lag() -> None:
    shedder = Shedder()
    shedder.parsed(1000, 0.1)  # 100 us a line: 2000 lines fit in 0.2 s
    lines = _batch(10_000, suspect_at=10)
    kept = shedder.keep(lines, lag_s=LAG_S - 0.2)
    assert kept == [lines[10], *lines[-2000:]]
    assert shedder.skipped == 10_000 - 2000 - 1
    assert shedder.keep(lines[:1500], lag_s=LAG_S - 0.2) == lines[:1500]  # it fits: whole


def test_small_batches_do_not_teach_the_cost_of_a_line() -> None:
    shedder = Shedder()
    shedder.parsed(10, 1.0)  # a batch that small is mostly the batch's own cost
    lines = _batch(5000)
    assert shedder.keep(lines, lag_s=0.0) == lines


def test_skipped_lines_are_a_metric() -> None:
    metrics = Metrics()
    metrics.lines_skipped(1200)
    assert b"sentinel_log_lines_skipped_total 1200.0" in metrics.exposition()


def test_a_job_being_stopped_is_only_skimmed_whatever_its_lag() -> None:
    shedder = Shedder()
    lines = _batch(1000, suspect_at=3)
    assert shedder.skim(lines) == [lines[3], *lines[-KEEP_NEWEST:]]
    assert shedder.skipped == 1000 - KEEP_NEWEST - 1


@pytest.mark.parametrize("through_pty", [True, False], ids=["pty", "pipes"])
def test_falling_behind_a_job_on_a_terminal_names_no_pty_once(
    through_pty: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A job that floods its output runs slower through the terminal ``run`` gives it: the
    first time the loop falls behind, the way out is said, once, and only when it applies."""
    shedder = Shedder(through_pty=through_pty)
    caplog.set_level("INFO", logger="sentinel.supervisor.shedding")
    for _ in range(3):
        shedder.keep(_batch(5000), lag_s=LAG_S * 2)  # behind
        shedder.keep(_batch(10), lag_s=0.0)  # caught up
    hints = [r.getMessage() for r in caplog.records if "--no-pty" in r.getMessage()]
    assert len(hints) == (1 if through_pty else 0)
    if through_pty:
        assert "([job] pty = false) gives it pipes" in hints[0]


def _output(source: str, *lines: str) -> OutputLines:
    return OutputLines(source, list(lines), 0.0)


def test_of_many_files_read_together_the_one_with_a_nan_is_read_first() -> None:
    """64 rank files in one look: rank 7's NaN is read before the other 63, not after
    ranks 0-6; the others keep their order."""
    ranks = [_output(f"rank-{r}.log", f'{{"step": 9, "loss": {2 + r / 100}}}') for r in range(64)]
    ranks[7] = _output("rank-7.log", '{"step": 9, "loss": 2.1}', '{"step": 10, "loss": NaN}')
    ordered = suspects_first(ranks)
    assert ordered[0] is ranks[7]
    assert ordered[1:] == [output for output in ranks if output is not ranks[7]]


@pytest.mark.parametrize(
    "text",
    ['{"loss": Infinity}', "step 10 | loss nan", "loss=-inf", "loss: INF"],
    ids=["json-infinity", "nan-word", "minus-inf", "upper-case"],
)
def test_every_spelling_of_a_non_finite_value_is_a_suspect(text: str) -> None:
    events = [_output("a.log", "step 10 loss 2.0"), _output("b.log", text)]
    assert [event.source for event in suspects_first(events)] == ["b.log", "a.log"]


def test_words_holding_nan_or_inf_are_not_suspects() -> None:
    events = [
        _output("a.log", "INFO step 10 loss 2.0"),
        _output("b.log", "inference on finance data: 3 docs, step 10"),
    ]
    assert suspects_first(events) == events


def test_a_sources_output_keeps_its_order_and_other_events_their_place() -> None:
    """A source twice in one run of output is left as it is (its later lines must not come
    first); output never moves past an event of another kind."""
    twice = [_output("a.log", "step 1 loss 2"), _output("b.log", "x"), _output("a.log", "nan")]
    assert suspects_first(twice) == twice
    exited = JobExited(1, 0)
    events = [
        _output("a.log", "step 1 loss 2"),
        exited,
        _output("b.log", "x"),
        _output("c.log", "nan"),
    ]
    assert suspects_first(events) == [events[0], exited, events[3], events[2]]
