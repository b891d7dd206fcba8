"""Every rank its own series: rank prefixes, unlabelled ranks, restarts, copies (issue 20.5, 20.7).

The lines are those a 2-rank job prints (``tests/e2e/ranks_job.py`` under torchrun, whose
real run is ``tests/e2e/test_ranks_live.py``): rank 1's loss about ten times rank 0's.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from sentinel.config import Settings
from sentinel.engine.core import Engine, build_detectors
from sentinel.engine.ranks import SLOTS_MAX, RunSeries
from sentinel.engine.replay import replay
from sentinel.model.incidents import IncidentTracker
from sentinel.model.records import PROGRESS, Alert, Line, Sample
from sentinel.parsing import LineParser
from sentinel.parsing.ranks import split_rank
from sentinel.rules import STORIES

T0 = 1_700_000_000.0
RANKS = Path(__file__).parent / "fixtures" / "ranks"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("[rank1]: step 5 | loss 2.3", (1, "step 5 | loss 2.3", True), id="pytorch"),
        pytest.param("[rank1] step 5 | loss 2.3", (1, "step 5 | loss 2.3", True), id="no-colon"),
        pytest.param("[Rank 1] step=5, skipped=0", (1, "step=5, skipped=0", True), id="deepspeed"),
        pytest.param("[default1]:step 5 loss 2.3", (1, "step 5 loss 2.3", True), id="torchrun-tee"),
        pytest.param(
            "[trainer0|0]:1|54|Loss: 1.096:  54%",
            (0, "1|54|Loss: 1.096:  54%", True),
            id="torchrun-template-with-the-local-rank",
        ),
        pytest.param("[1]: step 5 loss 2.3", (1, "step 5 loss 2.3", True), id="torchrun-template"),
        pytest.param("1: step 5 | loss 2.3", (1, "step 5 | loss 2.3", False), id="srun-label"),
        pytest.param(" 3: step 5 | loss 2.3", (3, "step 5 | loss 2.3", False), id="srun-padded"),
        pytest.param(
            "2022-10-23 14:53:29,354 INFO [train.py:907] (6/8) Epoch 3, batch 115350, loss 2.3",
            (
                6,
                "2022-10-23 14:53:29,354 INFO [train.py:907] Epoch 3, batch 115350, loss 2.3",
                True,
            ),
            id="icefall-after-its-loggers-head",
        ),
        pytest.param(
            "2022-10-23 14:53:29,354 INFO [train.py:907] (9/8) loss 2.3",
            None,
            id="no-rank-past-the-world",
        ),
        pytest.param("[1] loss 2.3", None, id="bare-brackets-are-no-rank"),
        pytest.param("[INFO] step 5 loss 2.3", None, id="log-level"),
        pytest.param("step 5 | loss 2.3", None, id="plain"),
    ],
)
def test_a_rank_prefix_is_read_and_stripped(
    text: str, expected: tuple[int, str, bool] | None
) -> None:
    assert split_rank(text) == expected


@pytest.mark.parametrize(
    ("text", "rank", "step"),
    [
        pytest.param(
            "[default1]:[rank1] step 7 | loss 2.5", 1, 7, id="torchrun-tee-of-a-ranked-line"
        ),
        pytest.param("1: step 7 | loss 2.5", 1, 7, id="srun-label-with-a-step"),
        pytest.param("100: loss=2.5", None, None, id="a-number-before-a-stepless-line-is-no-rank"),
        pytest.param('[0]: {"step": 7, "loss": 2.5}', 0, 7, id="json-behind-a-prefix"),
    ],
)
def test_a_parsed_line_carries_its_rank(text: str, rank: int | None, step: int | None) -> None:
    (sample,) = LineParser().parse(text)
    assert (sample.name, sample.value, sample.step, sample.rank) == ("loss", 2.5, step, rank)


def engine() -> Engine:
    return Engine(build_detectors(Settings()), LineParser())


def losses(steps: int, rank: int, *, nan_at: int = 0, seed: int = 0) -> list[float]:
    """A loss that settles near 1 (rank 0) or 10 (rank 1), with noise."""
    rng = random.Random(seed * 10 + rank)
    level = 10.0 if rank == 1 else 1.0
    out = [level * (1.0 + 4.0 / step) * rng.uniform(0.85, 1.15) for step in range(1, steps + 1)]
    if nan_at:
        out[nan_at - 1] = math.nan
    return out


def two_ranks(steps: int, *, label: bool, nan_at: int = 0, seed: int = 0) -> list[str]:
    """Both ranks' lines in one stream, in the order they reach the pipe (either first)."""
    rng = random.Random(seed)
    by_rank = [losses(steps, rank, nan_at=nan_at if rank == 1 else 0, seed=seed) for rank in (0, 1)]
    lines = []
    for step in range(1, steps + 1):
        order = [0, 1] if rng.random() < 0.5 else [1, 0]
        for rank in order:
            prefix = f"[rank{rank}] " if label else ""
            lines.append(f"{prefix}step {step} | loss {by_rank[rank][step - 1]:.4f}")
    return lines


def feed(eng: Engine, texts: list[str], source: str = "stdout") -> list[Alert]:
    alerts: list[Alert] = []
    for index, text in enumerate(texts):
        alerts += eng.feed_line(Line(source, text, T0 + index))
    return alerts


@pytest.mark.slow
@pytest.mark.parametrize("label", [True, False], ids=["labelled", "unlabelled"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_ranks_an_order_of_magnitude_apart_raise_nothing(label: bool, seed: int) -> None:
    assert feed(engine(), two_ranks(200, label=label, seed=seed)) == []


def test_today_one_series_of_both_ranks_would_spike() -> None:
    """The same numbers as one series, as they were read before: loss_spike fires, so the
    test above proves something."""
    rng = random.Random(0)
    texts = []
    for step in range(1, 201):
        # Each rank's own step numbers let them apart; number them as one series instead.
        texts.append(f"step {2 * step} | loss {rng.uniform(0.9, 1.1):.4f}")
        texts.append(f"step {2 * step + 1} | loss {rng.uniform(9.0, 11.0):.4f}")
    assert {alert.rule for alert in feed(engine(), texts)} & {"loss_spike", "divergence"}


def test_a_nan_on_rank_1_alone_is_raised_naming_rank_1_at_its_step() -> None:
    alerts = feed(engine(), two_ranks(120, label=True, nan_at=80))
    raised = [alert for alert in alerts if not alert.resolves]
    assert [(alert.rule, alert.step, alert.details.get("rank")) for alert in raised] == [
        ("nan_inf", 80, 1)
    ]
    assert raised[0].message.startswith("rank 1: ")
    tracker = IncidentTracker("t", STORIES)
    for alert in alerts:
        tracker.observe(alert)
    (incident,) = list(tracker.open.values()) + tracker.closed
    assert incident.rank == 1
    assert incident.to_json()["rank"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_an_unlabelled_nan_keeps_both_series_apart(seed: int) -> None:
    """A NaN could be either rank's: raised at its step, and the series stay whole after it."""
    alerts = feed(engine(), two_ranks(150, label=False, nan_at=80, seed=seed))
    raised = [alert for alert in alerts if not alert.resolves]
    assert [(alert.rule, alert.step) for alert in raised] == [("nan_inf", 80)]


def test_steps_logged_again_after_a_restart_are_the_new_attempt_not_a_rank() -> None:
    """The job goes back 60 steps (resumed from a checkpoint) in the same stream: one series
    still, so a NaN after it names no rank."""
    values = losses(200, 0)
    texts = [f"step {step} | loss {values[step - 1]:.4f}" for step in range(1, 151)]
    texts += [f"step {step} | loss {values[step - 1] * 1.01:.4f}" for step in range(91, 201)]
    texts.append("step 201 | loss nan")
    alerts = feed(engine(), texts)
    assert [(alert.rule, alert.step, alert.message) for alert in alerts] == [
        ("nan_inf", 201, "loss is nan at step 201")
    ]


def test_a_new_attempt_starts_the_series_again() -> None:
    eng = engine()
    values = losses(100, 0)
    assert feed(eng, [f"step {s} | loss {values[s - 1]:.4f}" for s in range(1, 101)]) == []
    eng.job_started(T0 + 500, start_step=50)
    again = [f"step {s} | loss {values[s - 1]:.4f}" for s in range(51, 101)] + [
        "step 101 | loss nan"
    ]
    alerts = feed(eng, again)
    assert [(alert.rule, alert.step, alert.details.get("rank")) for alert in alerts] == [
        ("nan_inf", 101, None)
    ]


def test_a_line_printed_twice_is_one_observation() -> None:
    """Two ranks printing the same all-reduced loss: the second copy is dropped."""
    texts = []
    for step in range(1, 60):
        texts += [f"step {step} | loss {losses(60, 0)[step - 1]:.4f}"] * 2
    texts += ["step 60 | loss nan"] * 2
    alerts = feed(engine(), texts)
    assert [(alert.rule, alert.step, alert.details.get("rank")) for alert in alerts] == [
        ("nan_inf", 60, None)
    ]


def test_a_metric_seen_at_its_step_in_another_source_is_one_observation() -> None:
    """stdout and a metrics file of one run: each NaN once, and the file's late copies of
    steps already seen never reach the rules (no spike from a series read twice)."""
    values = losses(100, 0)
    eng = engine()
    stdout = [f"step {s} | loss {values[s - 1]:.4f}" for s in range(1, 101)] + [
        "step 101 | loss nan"
    ]
    alerts = feed(eng, stdout, "stdout")
    jsonl = [f'{{"step": {s}, "loss": {values[s - 1]}}}' for s in range(1, 101)]
    jsonl.append('{"step": 101, "loss": NaN}')
    alerts += feed(eng, jsonl, "metrics.jsonl")
    assert [(alert.rule, alert.step) for alert in alerts] == [("nan_inf", 101)]


def test_a_ranked_line_without_a_step_is_read_at_the_runs_step() -> None:
    """An HF Trainer dict printed by rank 1: at the step the progress bar reached."""
    alerts = feed(
        engine(),
        [
            "  5%|▌   | 10/200 [00:01<00:19,  9.81it/s]",
            "[rank1]: {'loss': nan, 'grad_norm': 1.0, 'learning_rate': 5e-05, 'epoch': 0.01}",
        ],
    )
    assert [(alert.rule, alert.step, alert.details.get("rank")) for alert in alerts] == [
        ("nan_inf", 10, 1)
    ]


@pytest.mark.parametrize("log", ["torchrun_tee.log", "plain.log"])
def test_a_real_two_rank_log_raises_only_rank_1s_nan(log: str) -> None:
    """Real torchrun output (``fixtures/ranks``): labelled by torchrun, or not at all."""
    result = replay([RANKS / log], Settings())
    raised = [alert for alert in result.alerts if not alert.resolves and alert.severity != "info"]
    assert [(alert.rule, alert.step) for alert in raised] == [("nan_inf", 60)]
    if log == "torchrun_tee.log":
        assert raised[0].details["rank"] == 1


@pytest.mark.parametrize(
    "names",
    [
        ["metrics_rank0.jsonl", "metrics_rank1.jsonl"],
        ["metrics_rank1.jsonl", "metrics_rank0.jsonl"],
    ],
    ids=["rank0-first", "rank1-first"],
)
def test_each_ranks_own_file_is_its_own_series(names: list[str]) -> None:
    """Each rank's ``metrics_rank<r>.jsonl`` of the same real run: the same steps with other
    values are another rank, not a copy; only rank 1's NaN is raised, naming rank 1."""
    result = replay([RANKS / name for name in names], Settings())
    raised = [alert for alert in result.alerts if not alert.resolves]
    assert [(alert.rule, alert.step, alert.details.get("rank")) for alert in raised] == [
        ("nan_inf", 60, 1)
    ]


def test_a_ranks_file_read_late_is_still_its_own_series() -> None:
    """Live, a rank's file may be read long after the other's (its writer flushed late):
    its values at steps already seen differ, so it is a rank, not a late copy."""
    eng = engine()
    alerts = feed(eng, (RANKS / "metrics_rank0.jsonl").read_text().splitlines(), "rank0.jsonl")
    alerts += feed(eng, (RANKS / "metrics_rank1.jsonl").read_text().splitlines(), "rank1.jsonl")
    raised = [alert for alert in alerts if not alert.resolves]
    assert [(alert.rule, alert.step, alert.details.get("rank")) for alert in raised] == [
        ("nan_inf", 60, 1)
    ]


def test_a_ranks_file_read_after_the_runs_went_whole_is_still_its_own_series() -> None:
    """The run's file read in one go, most of it taken whole by the rules (a block), then a
    rank's: each of the rank's lines is its own observation, none a late copy, as when
    both are read line by line."""
    eng = engine()
    alerts = eng.feed_texts("/run/rank-0.jsonl", rank_lines(0), T0)
    assert eng.lines_absorbed >= 100
    alerts += eng.feed_texts("/run/rank-1.jsonl", rank_lines(1, nan_at=390), T0 + 1)
    raised = [alert for alert in alerts if not alert.resolves and alert.rule == "nan_inf"]
    assert [(alert.step, alert.details.get("rank")) for alert in raised] == [(390, 1)]
    assert eng._ranked[1].samples_seen == 400


def rank_lines(rank: int, *, nan_at: int = 0) -> list[str]:
    """A rank's own metrics file of 400 steps (``losses``)."""
    values = losses(400, rank, nan_at=nan_at)
    return [json.dumps({"step": s, "loss": values[s - 1]}) for s in range(1, 401)]


def test_ranked_stdout_and_each_ranks_file_read_late_are_one_view() -> None:
    """Live: the ranks print ``[rank<r>] step ... | loss ...`` and each also writes its own
    ``metrics_rank<r>.jsonl``, read 20 steps at a time as its writer flushes. Each rank's
    series holds each step once; only rank 1's NaN is raised, once."""
    eng = engine()
    files = {
        rank: (RANKS / f"metrics_rank{rank}.jsonl").read_text().splitlines() for rank in (0, 1)
    }
    alerts: list[Alert] = []
    for index in range(80):
        for rank in (0, 1):
            record = json.loads(files[rank][index])
            text = f"[rank{rank}] step {record['step']} | loss {record['loss']:.4f}"
            alerts += eng.feed_line(Line("stdout", text, T0 + index))
        if index % 20 == 19:
            for rank in (0, 1):
                flushed = files[rank][index - 19 : index + 1]
                alerts += feed(eng, flushed, f"/run/metrics_rank{rank}.jsonl")
    raised = [alert for alert in alerts if not alert.resolves]
    assert [(alert.rule, alert.step, alert.details.get("rank")) for alert in raised] == [
        ("nan_inf", 60, 1)
    ]
    assert eng.samples_seen == 80  # rank 0's series: stdout's, its file's copies dropped


BARS = Path(__file__).parent / "fixtures" / "lightning_bars"


@pytest.mark.parametrize("name", ["tqdm.txt", "rich_120.txt", "rich_80.txt"])
def test_lightnings_bar_as_the_terminal_got_it_is_one_series_stopped_at_its_nan(
    name: str,
) -> None:
    """A real run's bars as the terminal received them (``fixtures/lightning_bars``, what
    ``run`` keeps in output.log): escapes read out as ``run`` reads them live, and a bar
    redrawn at the count it just moved to, its postfix caught up, is one series, not a
    second rank (Lightning's tqdm bar moves, then shows the step's loss)."""
    expected = json.loads((BARS / "expected.json").read_text())
    result = replay([BARS / name], Settings())
    nans = [alert for alert in result.alerts if alert.rule == "nan_inf"]
    assert nans, [alert.message for alert in result.alerts]
    nan_from = expected["nan_from_step"]
    assert nans[0].step is not None and nan_from <= nans[0].step < nan_from + 10, nans[0]
    assert [alert.message for alert in result.alerts if "rank" in alert.details] == []


def test_a_bar_moving_before_its_postfix_is_one_series_and_lockstep_ranks_two() -> None:
    series = RunSeries()

    def ranks(lines: list[tuple[int, float]]) -> list[int | None]:
        return [
            series.admit([Sample(PROGRESS, step, step), Sample("loss", loss, step)], "out")[1]
            for step, loss in lines
        ]

    # Lightning: each count drawn first with the last step's loss, then with its own.
    moving = [(1, 2.0), (2, 2.0), (2, 1.9), (3, 1.9), (3, 1.8), (4, 1.8), (4, 1.7)]
    assert ranks(moving) == [None] * len(moving)
    series.restart()
    # Two ranks in lockstep, their losses apart: each step twice, the second another rank.
    lockstep = [(5, 2.0), (5, 3.0), (6, 1.9), (6, 2.9), (7, 1.8), (7, 2.8), (8, 1.7), (8, 2.7)]
    assert 1 in ranks(lockstep)


def batch_lines(epochs: int, per_epoch: int, *, nan_at: tuple[int, int] | None = None) -> list[str]:
    """``Epoch E - Batch loss: x``, a batch's loss a line, its epoch the only counter (a real
    T5 fine-tune's log: 388 lines an epoch)."""
    rng = random.Random(4)
    lines = []
    for epoch in range(1, epochs + 1):
        for batch in range(per_epoch):
            loss = 2.0 / epoch * rng.uniform(0.5, 1.5)
            if nan_at == (epoch, batch):
                loss = math.nan
            lines.append(f"Epoch {epoch} - Batch loss: {loss:.4f}")
    return lines


def test_more_lines_at_one_step_than_ranks_print_are_one_series() -> None:
    """Read at its epoch, each batch's line repeats the step: up to ``SLOTS_MAX`` lines at
    one step are ranks, more are one series that names its step many times. Each batch
    had been a rank of its own (388 of them in the real log), each one value an epoch, and
    a rank's series of unrelated batches raised divergence warnings."""
    alerts = feed(engine(), batch_lines(6, SLOTS_MAX + 40))
    assert [alert for alert in alerts if alert.details.get("rank")] == []
    alerts = feed(engine(), batch_lines(6, SLOTS_MAX + 40, nan_at=(4, 90)))
    raised = [(a.rule, a.step, a.details.get("rank")) for a in alerts if a.rule == "nan_inf"]
    assert raised[:1] == [("nan_inf", 4, None)]


def test_the_ddp_tutorials_gpu_label_and_two_prints_glued_on_one_line() -> None:
    assert split_rank("[GPU1] step 5 | loss 2.3") == (1, "step 5 | loss 2.3", True)
    read = LineParser().parse("[GPU1] step 6 | loss 6.0841[GPU0] step 6 | loss 1.8388")
    assert [(s.name, s.value, s.step, s.rank) for s in read] == [
        ("loss", 6.0841, 6, 1),
        ("loss", 1.8388, 6, 0),
    ]


@pytest.mark.parametrize("log", ["gpu_prefix_healthy.log", "gpu_prefix_inf.log"])
def test_a_real_ddp_log_labelled_gpu_raises_only_its_nan(log: str) -> None:
    """Real DDP output (``fixtures/ranks``, ``gpu_prefix_job.py``): ``[GPU<r>]`` labels, a
    fifth of the lines two ranks' prints glued together. Healthy, it raised criticals (its
    ranks' values swapped between series); with rank 1's inf at step 400, that alone."""
    result = replay([RANKS / log], Settings())
    critical = [a for a in result.alerts if a.severity == "critical" and not a.resolves]
    if log == "gpu_prefix_healthy.log":
        assert critical == []
    else:
        assert [(a.rule, a.step, a.details.get("rank")) for a in critical][:1] == [
            ("nan_inf", 400, 1)
        ]


@pytest.mark.parametrize("csv_first", [False, True], ids=["output-first", "csv-first"])
def test_a_one_process_jobs_csv_that_differs_from_its_bar_is_no_rank(
    tmp_path: Path, csv_first: bool
) -> None:
    """Lightning writes its CSV (and TensorBoard files) from rank 0; the job's progress bar
    draws a step's values a redraw late, so the two differ at the same steps. That is no
    second rank: a one-process job's NaN was raised as "rank 1" and "rank 2", one a file."""
    out = tmp_path / "out.log"
    out.write_text(
        "".join(
            f"step {s} | loss {'nan' if s >= 55 else f'{2.0 - s / 100 + 0.003:.4f}'}\n"
            for s in range(1, 61)
        )
    )
    csv = tmp_path / "logs" / "csv" / "version_0" / "metrics.csv"
    csv.parent.mkdir(parents=True)
    csv.write_text(
        "epoch,step,train_loss\n"
        + "".join(f"0,{s},{'nan' if s >= 55 else 2.0 - s / 100}\n" for s in range(9, 60, 10))
    )
    result = replay([csv, out] if csv_first else [out, csv], Settings())
    nan = [a for a in result.alerts if a.rule == "nan_inf" and not a.resolves]
    assert nan, result.alerts
    assert {a.details.get("rank") for a in nan} == {None}


GRAD_ACCUM = Path(__file__).parent / "fixtures" / "grad_accum" / "train.log"


def test_micro_batch_lines_are_no_ranks_and_their_nan_is_the_steps(tmp_path: Path) -> None:
    """A real run with gradient accumulation printing each micro-batch's loss
    (``step 315 micro 0..3 loss ...``) before the step's own line (``make_grad_accum.py``):
    the micro-batches are not four ranks (their noise's order was a critical ``divergence``
    of "rank 1" while the step's loss was flat), and a micro-batch's NaN is still critical,
    at its step, with no rank."""
    healthy = replay([GRAD_ACCUM], Settings())
    assert [a for a in healthy.alerts if not a.resolves] == []
    lines = GRAD_ACCUM.read_text().splitlines()
    poisoned = tmp_path / "train.log"
    poisoned.write_text(
        "\n".join(
            "step 200 micro 2 loss nan scaled nan" if line.startswith("step 200 micro 2 ") else line
            for line in lines
        )
        + "\n"
    )
    (nan,) = [a for a in replay([poisoned], Settings()).alerts if not a.resolves]
    assert (nan.rule, nan.severity, nan.step) == ("nan_inf", "critical", 200)
    assert nan.message == "micro_loss is nan at step 200"


#: A one-process BMN run (its issue thread): the epoch is the only counter its lines name.
BMN = [
    "BMN training loss(epoch 0): tem_loss: 1.184, pem class_loss: 0.458, pem reg_loss: 0.024,"
    " total_loss: 1.883",
    "BMN training loss(epoch 0): tem_loss: 1.184, pem class_loss: 0.458, pem reg_loss: 0.024,"
    " total_loss: 1.884",
    "BMN training loss(epoch 0): tem_loss: 1.184, pem class_loss: nan, pem reg_loss: 0.024,"
    " total_loss: nan",
    "BMN training loss(epoch 0): tem_loss: nan, pem class_loss: nan, pem reg_loss: 0.024,"
    " total_loss: nan",
]


def test_lines_at_their_own_epoch_are_one_series_not_ranks() -> None:
    """Each line of the epoch repeats its step; read as ranks, one process's NaN was raised
    as "rank 1" and "rank 2", the second's diagnosis drawn from the first's metric."""
    alerts = [a for a in feed(engine(), BMN) if not a.resolves]
    assert [(a.rule, a.step, a.details.get("rank"), a.metric) for a in alerts] == [
        ("nan_inf", 0, None, "class_loss")
    ]
    assert "rank" not in alerts[0].message


def test_lines_at_one_step_of_different_epochs_are_one_series_not_ranks() -> None:
    """MindSpore's ``LossMonitor`` printing once an epoch: ``epoch: N step: 1875, loss is
    x``, its step the count within the epoch. Read as ranks, 4 of 20 values were read and a
    NaN at epoch 7 was "rank 5, the first loss the log shows"."""
    lines = [f"epoch: {epoch} step: 1875, loss is {2.0 / epoch:.4f}" for epoch in range(1, 7)]
    lines.append("epoch: 7 step: 1875, loss is nan")
    alerts = [a for a in feed(engine(), lines) if not a.resolves]
    assert [(a.rule, a.details.get("rank")) for a in alerts] == [("nan_inf", None)]
    assert "rank" not in alerts[0].message
