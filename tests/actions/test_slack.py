"""Chat payloads as apprise really sends them: Slack (Block Kit) and Mattermost.

Slack: apprise's Slack plugin always posts to ``https://hooks.slack.com``, and no
URL parameter changes that host, so these tests intercept at the HTTP layer: a
``requests`` transport adapter, mounted for ``https://hooks.slack.com/`` on the
sessions made during the send (``tests.helpers.slack.slack_routed_to``), sends
the plugin's real request to a real local HTTP server that answers as Slack's
webhook does. Mattermost's plugin takes a host and port, so its cases post
straight to a local ``WebhookReceiver`` with no interception.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apprise
import pytest

from sentinel.model.records import Severity
from sentinel.notify.notices import Envelope, NoticeKind
from sentinel.notify.notifier import send_envelope
from tests.helpers.notices import ACTIONS, JOB, KEY, divergence, envelope, notice
from tests.helpers.slack import SlackReceiver, slack_routed_to
from tests.helpers.webhook import WebhookReceiver

SLACK_URL = "slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7"


def post_to_slack(message: Envelope) -> dict[str, Any]:
    """The payload apprise's Slack plugin posted for ``message``."""
    with SlackReceiver() as slack, slack_routed_to(slack):
        send_envelope(SLACK_URL, message, 5.0)
        (post,) = slack.wait_for(1)
    assert post.path == "/services/T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7"
    payload: dict[str, Any] = post.payload
    return payload


def blocks_of(payload: dict[str, Any]) -> dict[str, Any]:
    """The attachment's blocks by type (one header, one section)."""
    (attachment,) = payload["attachments"]
    return {block["type"]: block for block in attachment["blocks"]}


@pytest.fixture(scope="module")
def grouped() -> dict[str, Any]:
    return post_to_slack(envelope(*divergence(), folded={"nan_inf": 30, "stall": 7}))


@pytest.fixture(scope="module")
def section(grouped: dict[str, Any]) -> str:
    text = blocks_of(grouped)["section"]["text"]
    assert text["type"] == "mrkdwn"
    return str(text["text"])


def test_header_block_names_severity_rule_job_and_step(grouped: dict[str, Any]) -> None:
    header = blocks_of(grouped)["header"]["text"]
    assert header == {
        "type": "plain_text",
        "text": "🔴 CRITICAL nan_inf · llama-ft · step 1342",
        "emoji": True,
    }


def test_layout_is_header_then_section_without_apprise_footer(grouped: dict[str, Any]) -> None:
    (attachment,) = grouped["attachments"]
    assert [block["type"] for block in attachment["blocks"]] == ["header", "section"]


@pytest.mark.parametrize(
    "expected",
    [
        pytest.param("*Job* llama-ft · *Host* gpu-node-7 · *Run* r-20231114-2213\n", id="job"),
        pytest.param(
            "*Rule* nan_inf (critical) · *Incident* llama-ft-1 · *Step* 1342 · *Value* loss = nan",
            id="rule-step-value",
        ),
        pytest.param("*Around onset* `grad_norm ▁▁▁▁▁▁▁▁▃▄█ nan`", id="sparkline"),
        pytest.param("*Diagnosis*\n• optimisation blow-up (grad-norm rose", id="diagnosis"),
        pytest.param(
            "*What sentinel did (UTC)*\n"
            + "\n".join(f"• 22:13:2{s} {text}" for s, text in zip("4677", ACTIONS, strict=True)),
            id="actions",
        ),
        pytest.param(f"<{JOB.dashboard_url}|Dashboard>", id="dashboard-link"),
        pytest.param("and 37 more alerts (nan_inf 30, stall 7) held back", id="folded"),
        pytest.param(f"sentinel · message key `{KEY}`", id="key"),
    ],
)
def test_section_says(section: str, expected: str) -> None:
    assert expected in section


@pytest.mark.parametrize(
    ("message", "notify_type"),
    [
        (envelope(notice(NoticeKind.OPENED)), apprise.NotifyType.FAILURE),
        (
            envelope(notice(NoticeKind.OPENED, severity=Severity.WARNING)),
            apprise.NotifyType.WARNING,
        ),
        (envelope(notice(NoticeKind.RESOLVED)), apprise.NotifyType.SUCCESS),
    ],
    ids=["critical-red", "warning-yellow", "resolved-green"],
)
@pytest.mark.slow
def test_colour_follows_severity(message: Envelope, notify_type: apprise.NotifyType) -> None:
    (attachment,) = post_to_slack(message)["attachments"]
    assert attachment["color"] == apprise.AppriseAsset().color(notify_type)


def test_angle_brackets_in_a_message_stay_text() -> None:
    spike = notice(NoticeKind.OPENED, alert={"message": "loss > 2x its mean <10 steps>"})
    text = blocks_of(post_to_slack(envelope(spike)))["section"]["text"]["text"]
    assert "loss &gt; 2x its mean &lt;10 steps&gt;" in text


def test_long_message_fits_slack_section_limit_and_keeps_its_key() -> None:
    reading = "look at the data loader & " * 12
    wordy = notice(NoticeKind.OPENED, diagnosis=tuple(f"{i}: {reading}" for i in range(20)))
    text = blocks_of(post_to_slack(envelope(wordy)))["section"]["text"]["text"]
    assert len(text) <= 3000
    assert "cut to fit" in text
    assert text.endswith(f"sentinel · message key `{KEY}`")


# Mattermost: apprise's plugin posts Slack's incoming-webhook payload ({"text": ...}).


@pytest.fixture(scope="module")
def mattermost() -> Iterator[dict[str, Any]]:
    with WebhookReceiver() as hook:
        send_envelope(f"mmost://127.0.0.1:{hook.port}/tok3n", envelope(*divergence()), 5.0)
        (request,) = hook.wait_for(1)
    assert request.path == "/hooks/tok3n"
    yield request.json


@pytest.mark.parametrize(
    "expected",
    [
        pytest.param("# 🔴 CRITICAL nan_inf · llama-ft · step 1342\n", id="title-heading"),
        pytest.param("**Job** llama-ft · **Host** gpu-node-7 · **Run** r-20231114-2213", id="job"),
        pytest.param("**Around onset** `grad_norm ▁▁▁▁▁▁▁▁▃▄█ nan`", id="sparkline"),
        pytest.param(f"• 22:13:24 {ACTIONS[0]}", id="actions"),
        pytest.param(f"[Dashboard]({JOB.dashboard_url})", id="dashboard-link"),
        pytest.param(f"sentinel · message key `{KEY}`", id="key"),
    ],
)
def test_mattermost_text_is_markdown(mattermost: dict[str, Any], expected: str) -> None:
    assert expected in mattermost["text"]
