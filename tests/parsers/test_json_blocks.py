"""JSON objects written over several lines (``json.dump(..., indent=4)``): Chainer's
``LogReport`` file, read whole at each closing brace, each record once."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from sentinel.config import load_settings
from sentinel.engine.replay import replay
from sentinel.follow.logfile import FileFollower
from sentinel.model.records import Sample, Severity
from sentinel.parsing import LineParser
from sentinel.store.state import StateStore

CORPUS = Path(__file__).parent.parent / "corpus"
CHAINER_LOG = CORPUS / "healthy" / "chainer-dcgan-logreport" / "log"


def parsed(lines: list[str], parser: LineParser | None = None) -> list[Sample]:
    parser = parser or LineParser()
    return [sample for line in lines for sample in parser.parse(line)]


def report(records: list[dict[str, float]]) -> str:
    """What Chainer's ``LogReport`` writes: the whole log so far, indented."""
    return json.dumps(records, indent=4)


def test_chainers_logreport_file_is_read_at_its_iterations() -> None:
    parser = LineParser()
    found = parsed(CHAINER_LOG.read_text().splitlines(), parser)
    losses = [(s.step, s.value) for s in found if s.name == "gen/loss"]
    assert len(losses) == 200
    assert losses[0] == (100, 1.4593017101287842)
    assert [step for step, _ in losses] == list(range(100, 20_001, 100))
    assert parser.stats.garbled == 0


def test_chainers_own_names_are_the_loss_and_the_evaluations() -> None:
    records = [
        {"main/loss": 0.19, "validation/main/loss": 0.094, "main/accuracy": 0.94,
         "epoch": 1, "iteration": 600, "elapsed_time": 4.9},
    ]  # fmt: skip
    by_name = {s.name: (s.value, s.step) for s in parsed(report(records).splitlines())}
    assert by_name["loss"] == (0.19, 600)
    assert by_name["eval_loss"] == (0.094, 600)
    assert by_name["accuracy"] == (0.94, 600)


def test_a_logreport_replaced_whole_gives_each_record_once_and_its_nan(tmp_path: Path) -> None:
    """Chainer writes the log to a temporary file and moves it over ``log`` at each
    report: the follower reads the new file from its start, every record again."""
    path = tmp_path / "log"
    store = StateStore(tmp_path / "state")
    follower = FileFollower(path, offsets=store, max_line_bytes=1 << 20)
    parser = LineParser()
    records = [{"main/loss": 2.0 - 0.1 * n, "iteration": 100 * n, "epoch": 0} for n in range(1, 4)]
    found: list[Sample] = []
    try:
        for more in ([], [{"main/loss": 1.6, "iteration": 400, "epoch": 0}],
                     [{"main/loss": math.nan, "iteration": 500, "epoch": 0}]):  # fmt: skip
            records += more
            temporary = tmp_path / "tmp_log"
            temporary.write_text(report(records))
            os.replace(temporary, path)
            while True:
                found += parsed(follower.read(), parser)
                follower.commit()
                if not follower.has_backlog:
                    break
    finally:
        follower.close()
        store.close()
    losses = [(s.step, s.value) for s in found if s.name == "loss"]
    assert [step for step, _ in losses] == [100, 200, 300, 400, 500]
    assert math.isnan(losses[-1][1])


def test_a_nan_in_a_logreport_stops_the_job_at_its_iteration(tmp_path: Path) -> None:
    records = [{"main/loss": 2.0 / n, "iteration": 100 * n, "epoch": 0} for n in range(1, 9)]
    records.append({"main/loss": math.nan, "iteration": 900, "epoch": 1})
    log = tmp_path / "log"
    log.write_text(report(records))
    result = replay([log], load_settings(None, environ={}))
    assert [(a.rule, a.step) for a in result.alerts if a.severity == Severity.CRITICAL] == [
        ("nan_inf", 900)
    ]


def test_a_config_dumped_indented_is_no_record() -> None:
    config = {"learning_rate": 0.001, "batch_size": 32, "epochs": 10, "model": {"depth": 12}}
    parser = LineParser()
    assert parsed(json.dumps(config, indent=2).splitlines(), parser) == []
    assert parser.stats.garbled == 0


def test_a_line_that_cannot_go_on_with_an_object_is_read_on_its_own() -> None:
    lines = ["{", '    "iteration": 100,', "step 120 | loss 2.3141"]
    parser = LineParser()
    assert [(s.name, s.step) for s in parsed(lines, parser)] == [("loss", 120)]
    assert parser.stats.garbled == 1  # the object cut short
