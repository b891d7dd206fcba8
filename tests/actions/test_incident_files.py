"""The incident's chart and evidence files: drawn, linked from the report, attached to email
(a real SMTP server), named in Slack's message."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path

import pytest

from sentinel.evidence import chart
from sentinel.evidence.report import files_section, incident_files
from sentinel.model.records import Sample
from sentinel.notify.apprise_message import apprise_call
from sentinel.notify.messages import render
from sentinel.notify.notices import NoticeKind
from sentinel.notify.notifier import send_envelope
from tests.helpers.notices import envelope, notice
from tests.helpers.smtp import SmtpServer

needs_matplotlib = pytest.mark.skipif(
    not chart.AVAILABLE, reason="matplotlib is not installed (the evidence extra)"
)
T0 = 1_700_000_000.0


def _history() -> dict[str, list[Sample]]:
    steps = range(1, 31)
    return {
        "loss": [Sample("loss", 2 - s / 50 if s < 30 else float("nan"), s, T0 + s) for s in steps],
        "grad_norm": [Sample("grad_norm", 1.0 + (s > 26) * s, s, T0 + s) for s in steps],
        "lr": [Sample("lr", 1e-4, s, T0 + s) for s in steps],
        "tokens_per_sec": [Sample("tokens_per_sec", 5e3, s, T0 + s) for s in steps],
        "proc_cpu_percent": [Sample("proc_cpu_percent", 1.0, s, T0 + s) for s in steps],
    }


ACTIONS = [
    (T0 + 30.1, "SIGTERM to the job's process tree (pid 7)"),
    (T0 + 31, "rolled back to checkpoint-20; quarantined checkpoint-30 (after_onset)"),
]


def test_the_last_clean_checkpoint_is_read_from_the_rollback() -> None:
    assert chart.clean_step(ACTIONS) == 20
    assert chart.clean_step(ACTIONS[:1]) is None


@needs_matplotlib
@pytest.mark.slow
def test_the_chart_is_drawn_as_png_and_svg(tmp_path: Path) -> None:
    shown = chart.picture("nan_inf · incident x", _history(), 29, ACTIONS)
    assert set(shown.series) == {"loss", "grad_norm", "lr", "tokens_per_sec"}
    drawer = chart.ChartDrawer(settle_s=60)
    drawer.request("x", shown, tmp_path / "x")
    assert drawer.flush(60)  # drawn now, not after the settling time
    png, svg = tmp_path / "x" / chart.CHART_PNG, tmp_path / "x" / chart.CHART_SVG
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    root = ElementTree.parse(svg).getroot()
    assert root.tag.endswith("svg")
    # Four panels: four sets of axes in the SVG.
    assert len([e for e in root.iter() if e.get("id", "").startswith("axes_")]) == 4
    section = files_section(tmp_path, "x")
    assert "- [chart.png](x/chart.png)" in section and "![" in section


def test_chart_off_draws_nothing_and_links_nothing(tmp_path: Path) -> None:
    """``[evidence] chart = false``: no child is started, the report and the messages name
    no chart (a chart drawn earlier, by a sentinel with it on, is still named)."""
    drawer = chart.ChartDrawer(settle_s=0, enabled=False)
    drawer.request("z", chart.picture("x", _history(), 29, ACTIONS), tmp_path / "reports" / "z")
    assert drawer.flush(1)
    assert not (tmp_path / "reports" / "z").exists()
    assert files_section(tmp_path, "z", charted=False) == ""
    assert incident_files(tmp_path, "z", charted=False) == []
    (tmp_path / "reports" / "z").mkdir(parents=True)
    (tmp_path / "reports" / "z" / chart.CHART_PNG).write_bytes(b"png")
    assert "- [chart.png](z/chart.png)" in files_section(tmp_path, "z", charted=False)
    assert incident_files(tmp_path, "z", charted=False)[0].endswith("z/chart.png")


def test_the_report_links_only_what_there_is(tmp_path: Path) -> None:
    section = files_section(tmp_path, "y")
    assert "evidence.txt" not in section  # none was taken
    assert ("chart.png" in section) is chart.AVAILABLE
    (tmp_path / "reports" / "y").mkdir(parents=True)
    (tmp_path / "reports" / "y" / "evidence.txt").write_text("summary: -\n")
    assert "- [evidence.txt](y/evidence.txt)" in files_section(tmp_path, "y")


@pytest.fixture(scope="module")
def smtp() -> Iterator[SmtpServer]:
    with SmtpServer() as server:
        yield server


@pytest.mark.slow
def test_email_carries_the_files_that_exist(tmp_path: Path, smtp: SmtpServer) -> None:
    evidence = tmp_path / "evidence.txt"
    evidence.write_text("summary: stuck in wait_for_checkpoint_writer (train.py:7)\n")
    missing = tmp_path / "chart.png"  # not drawn (no matplotlib): left out, not an error
    sent = envelope(notice(NoticeKind.ACTIONS, attachments=(str(evidence), str(missing))))
    _, arguments = apprise_call(smtp.url(), sent)
    assert arguments["attach"] == [str(evidence)]
    before = len(smtp.messages)
    send_envelope(smtp.url(), sent, 10.0)
    message = smtp.wait_for(before + 1, timeout=10)[before]
    files = [part.get_filename() for part in message.iter_attachments()]
    assert files == ["evidence.txt"]


def test_slack_names_the_files_and_other_targets_attach_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "evidence.txt")
    sent = envelope(notice(NoticeKind.ACTIONS, attachments=(path,)))
    body = render(sent, "slack").body
    assert f"**Evidence and chart**\n• `{path}`" in body
    _, arguments = apprise_call("slack://T000/B000/XXX", sent)
    assert "attach" not in arguments


def test_actions_are_marked_at_the_step_of_their_time_or_the_last_step() -> None:
    timed = chart.picture("x", _history(), 29, ACTIONS)
    assert chart.action_steps(timed) == [(30, "SIGTERM to the")]
    # Live lines without a timestamp: sentinel acted on the newest step it had.
    untimed = {name: [s._replace(time=None) for s in series] for name, series in _history().items()}
    assert chart.action_steps(chart.picture("x", untimed, 29, ACTIONS)) == [(30, "SIGTERM to the")]
