"""Email end to end: ``send_envelope`` through apprise to a real SMTP server (aiosmtpd).

Each case reads the message as the server received it: its subject, and the
summary, diagnosis, actions, incident report and idempotency key in its body.
"""

from __future__ import annotations

from collections.abc import Iterator
from email.message import EmailMessage

import pytest

from sentinel.notify.notices import NoticeKind
from sentinel.notify.notifier import send_envelope
from tests.helpers.notices import ACTIONS, JOB, KEY, T0, divergence, envelope, notice
from tests.helpers.smtp import SmtpServer


@pytest.fixture(scope="module")
def smtp() -> Iterator[SmtpServer]:
    with SmtpServer() as server:
        yield server


def deliver(smtp: SmtpServer, *notices_: object, **options: object) -> EmailMessage:
    """Send one envelope to ``smtp`` and return the message it received."""
    before = len(smtp.messages)
    send_envelope(smtp.url(), envelope(*notices_, **options), 10.0)  # type: ignore[arg-type]
    return smtp.wait_for(before + 1, timeout=10)[before]


def text_of(message: EmailMessage) -> str:
    part = message.get_body(("plain",))
    assert part is not None, message
    # SMTP carries lines ended by CRLF.
    return str(part.get_content()).replace("\r\n", "\n")


@pytest.fixture(scope="module")
def grouped(smtp: SmtpServer) -> EmailMessage:
    """A grad-norm run, the NaN it led to, and the rollback: one email."""
    return deliver(smtp, *divergence(), folded={"nan_inf": 30, "stall": 7})


def test_subject_sorts_in_a_mailbox(grouped: EmailMessage) -> None:
    assert grouped["Subject"] == "[sentinel] CRITICAL nan_inf job=llama-ft step=1342"


def test_goes_to_the_configured_recipient(grouped: EmailMessage, smtp: SmtpServer) -> None:
    assert (grouped["To"], smtp.logins[0]) == ("oncall@example.com", (b"user", b"pass"))


@pytest.mark.parametrize(
    "expected",
    [
        pytest.param(
            "Incident llama-ft-1 escalated to critical at 22:13:23 UTC\nloss is NaN at step 1342\n",
            id="summary-on-top",
        ),
        pytest.param(
            f"Job:      {JOB.name}\nHost:     {JOB.host}\nRun:      {JOB.run_id}", id="job"
        ),
        pytest.param("Step:     1342\nValue:    loss = nan", id="step-and-value"),
        pytest.param("Around onset: grad_norm ▁▁▁▁▁▁▁▁▃▄█ nan", id="sparkline"),
        pytest.param(
            "Diagnosis:\n  optimisation blow-up (grad-norm rose before the NaN); the grad-norm"
            " rose to 96, 73.8x its median 1.3: lower the learning rate, add or lengthen"
            " warmup, clip gradients at 1.0, use bf16 rather than fp16\n  inspect step 1338\n",
            id="diagnosis",
        ),
        pytest.param(
            "What sentinel did (UTC):\n"
            + "".join(f"  22:13:2{s} {text}\n" for s, text in zip("4677", ACTIONS, strict=True)),
            id="actions",
        ),
        pytest.param(f"Dashboard: {JOB.dashboard_url}\n", id="dashboard"),
        pytest.param("and 37 more alerts (nan_inf 30, stall 7) held back", id="folded"),
        pytest.param("\n# CRITICAL nan_inf — incident llama-ft-1\n", id="report"),
        pytest.param("\n## Timeline\n", id="report-timeline"),
        pytest.param(f"\n-- \nsentinel · message key {KEY}", id="key-in-footer"),
    ],
)
def test_body_says(grouped: EmailMessage, expected: str) -> None:
    assert expected in text_of(grouped)


def test_summary_comes_before_the_report(grouped: EmailMessage) -> None:
    body = text_of(grouped)
    assert body.index("What sentinel did") < body.index("# CRITICAL nan_inf — incident")


def test_resolution_has_its_own_subject(smtp: SmtpServer) -> None:
    resolved = notice(
        NoticeKind.RESOLVED,
        time=T0 + 1680,
        alert={"step": 1400, "message": "loss finite for 50 steps"},
        report="# CRITICAL nan_inf — incident llama-ft-1\n\n- closed: 22:41:20.000 UTC\n",
    )
    message = deliver(smtp, resolved)
    assert message["Subject"] == "[sentinel] RESOLVED nan_inf job=llama-ft step=1400"
    assert "resolved at 22:41:20 UTC after 28 min" in text_of(message)
