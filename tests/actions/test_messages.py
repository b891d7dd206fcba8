"""What messages say: titles, bodies and JSON for each notice kind, grouping, folding, links.

Rendering is pure, so most cases call ``render`` and read the text; the notices
come from a real ``IncidentTracker``, ``diagnose`` and ``incident_notice``
(``tests.helpers.notices``). The JSON webhook case posts to a real local HTTP
receiver through apprise.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import apprise
import pytest

from sentinel.model.records import Severity
from sentinel.notify.apprise_message import apprise_call, style_for
from sentinel.notify.messages import Style, folded_line, render
from sentinel.notify.notices import Envelope, NoticeKind, format_dashboard_url
from sentinel.notify.notifier import send_envelope
from tests.helpers.notices import ACTIONS, JOB, KEY, T0, divergence, envelope, notice
from tests.helpers.webhook import WebhookReceiver

STYLES: list[Style] = ["text", "markdown", "slack", "json"]
SCHEMA = {"rule", "severity", "step", "metric", "value", "message", "time", "source"}
EXTRAS = {"key", "incident", "kind", "job", "diagnosis", "sparkline", "actions", "notices"}

KINDS = [
    pytest.param(
        envelope(notice(NoticeKind.OPENED)),
        "[sentinel] CRITICAL nan_inf job=llama-ft step=1342",
        "New incident llama-ft-1, opened 22:13:20 UTC",
        id="opened",
    ),
    pytest.param(
        envelope(notice(NoticeKind.ESCALATED, time=T0 + 3)),
        "[sentinel] CRITICAL nan_inf job=llama-ft step=1342",
        "Incident llama-ft-1 escalated to critical at 22:13:23 UTC",
        id="escalated",
    ),
    pytest.param(
        envelope(notice(NoticeKind.REPEAT, time=T0 + 4 * 3600)),
        "[sentinel] CRITICAL nan_inf job=llama-ft step=1342 (still open)",
        "Incident llama-ft-1 still open since 22:13:20 UTC (4 h 0 min)",
        id="repeat",
    ),
    pytest.param(
        envelope(notice(NoticeKind.ACTIONS, actions=("22:13:24 SIGTERM to the job",))),
        "[sentinel] CRITICAL nan_inf job=llama-ft step=1342 (sentinel acted)",
        "What sentinel did about incident llama-ft-1",
        id="actions",
    ),
    pytest.param(
        envelope(
            notice(
                NoticeKind.RESOLVED,
                time=T0 + 1680,
                alert={"step": 1400, "value": 1.9, "message": "loss finite for 50 steps"},
            )
        ),
        "[sentinel] RESOLVED nan_inf job=llama-ft step=1400",
        "Incident llama-ft-1 resolved at 22:41:20 UTC after 28 min",
        id="resolved",
    ),
    pytest.param(
        envelope(
            notice(
                NoticeKind.FLAPPING,
                rule="loss_spike",
                severity=Severity.WARNING,
                note="loss_spike opened and resolved 6 times in 10 min; held until it settles",
            )
        ),
        "[sentinel] WARNING loss_spike job=llama-ft step=1342 (flapping)",
        "loss_spike opened and resolved 6 times in 10 min; held until it settles",
        id="flapping",
    ),
    pytest.param(
        envelope(
            notice(
                NoticeKind.TEST,
                rule="notify_test",
                severity=Severity.INFO,
                alert={"step": None, "metric": None, "value": None, "message": "test"},
            )
        ),
        "[sentinel] TEST notify_test job=llama-ft",
        "Test message from sentinel: if you can read this, this target works",
        id="test",
    ),
]


@pytest.mark.parametrize(("message", "subject", "status"), KINDS)
def test_mail_subject_sorts_by_label_rule_job_step(
    message: Envelope, subject: str, status: str
) -> None:
    assert render(message, "text").title == subject


@pytest.mark.parametrize(("message", "subject", "status"), KINDS)
@pytest.mark.parametrize("style", ["text", "markdown", "slack"])
def test_body_opens_with_what_the_notice_is(
    message: Envelope, subject: str, status: str, style: Style
) -> None:
    first = render(message, style).body.splitlines()[0]
    assert first.strip("*") == status


@pytest.mark.parametrize(
    ("kind", "title"),
    [
        (NoticeKind.OPENED, "🔴 CRITICAL nan_inf · llama-ft · step 1342"),
        (NoticeKind.RESOLVED, "✅ RESOLVED nan_inf · llama-ft · step 1342"),
        (NoticeKind.REPEAT, "🔴 CRITICAL nan_inf · llama-ft · step 1342 (still open)"),
    ],
    ids=["opened", "resolved", "repeat"],
)
def test_chat_title_is_for_people(kind: NoticeKind, title: str) -> None:
    assert render(envelope(notice(kind)), "slack").title == title


@pytest.mark.parametrize(
    ("style", "shown"),
    [
        (
            "text",
            [
                "Job:      llama-ft",
                "Host:     gpu-node-7",
                "Run:      r-20231114-2213",
                "Step:     1342",
                "Value:    loss = nan",
            ],
        ),
        (
            "markdown",
            [
                "**Job** llama-ft · **Host** gpu-node-7 · **Run** r-20231114-2213",
                "**Rule** nan_inf (critical) · **Incident** llama-ft-1 · **Step** 1342"
                " · **Value** loss = nan",
            ],
        ),
        ("slack", ["**Job** llama-ft · **Host** gpu-node-7 · **Run** r-20231114-2213"]),
    ],
    ids=["text", "markdown", "slack"],
)
def test_body_names_job_host_run_step_and_value(style: Style, shown: list[str]) -> None:
    body = render(envelope(notice(NoticeKind.OPENED)), style).body
    assert all(line in body.splitlines() for line in shown), body


@pytest.mark.parametrize("style", ["text", "markdown", "slack"])
def test_body_links_the_dashboard(style: Style) -> None:
    assert JOB.dashboard_url in render(envelope(*divergence()), style).body


@pytest.mark.parametrize("style", STYLES)
def test_every_body_carries_the_idempotency_key(style: Style) -> None:
    assert KEY in render(envelope(*divergence()), style).body


def test_resolved_body_skips_the_diagnosis_but_keeps_what_sentinel_did() -> None:
    *_, acted = divergence()
    resolved = notice(
        NoticeKind.RESOLVED,
        time=T0 + 1680,
        diagnosis=acted.diagnosis,
        actions=acted.actions,
        alert={"step": 1400, "message": "loss finite for 50 steps"},
    )
    body = render(envelope(resolved), "text").body
    assert "Diagnosis:" not in body
    assert all(line in body for line in ACTIONS)


def test_actions_notice_lists_each_action_once() -> None:
    *_, acted = divergence()
    joined = notice(
        NoticeKind.ACTIONS, alert={"message": "; ".join(ACTIONS)}, actions=acted.actions
    )
    body = render(envelope(joined), "text").body
    assert all(body.count(text) == 1 for text in ACTIONS)


# A NaN after a grad-norm run, and what sentinel did: one message, one story.


def test_grouped_message_is_titled_by_its_worst_notice() -> None:
    rendered = render(envelope(*divergence()), "text")
    assert rendered.title == "[sentinel] CRITICAL nan_inf job=llama-ft step=1342"


def test_grouped_message_leads_with_the_escalation() -> None:
    body = render(envelope(*divergence()), "text").body
    assert body.startswith("Incident llama-ft-1 escalated to critical at 22:13:23 UTC\n")


def test_grouped_timeline_lists_opening_then_escalation() -> None:
    lines = render(envelope(*divergence()), "text").body.splitlines()
    start = lines.index("Timeline (UTC):")
    assert [line.strip() for line in lines[start + 1 : start + 3]] == [
        "22:13:20 WARNING grad_norm_run opened at step 1340:"
        " grad_norm above 10 for 3 logged steps (48.2)",
        "22:13:23 CRITICAL nan_inf escalated at step 1342: loss is NaN at step 1342",
    ]


def test_grouped_diagnosis_is_the_latest_reading() -> None:
    summary = render(envelope(*divergence()), "slack").body
    assert summary.count("**Diagnosis**") == 1
    assert "optimisation blow-up (grad-norm rose before the NaN)" in summary
    assert "the usual smoke before a NaN" not in summary


def test_grouped_actions_appear_once_each_in_order() -> None:
    body = render(envelope(*divergence()), "markdown").body
    positions = [
        body.index(f"- 22:13:2{second} {text}")
        for second, text in zip("4677", ACTIONS, strict=True)
    ]
    assert positions == sorted(positions)
    assert all(body.count(text) == 1 for text in ACTIONS)


def test_grouped_sparkline_is_a_code_span() -> None:
    body = render(envelope(*divergence()), "slack").body
    assert "**Around onset** `grad_norm ▁▁▁▁▁▁▁▁▃▄█ nan`" in body


def test_other_incidents_are_listed_briefly_after_the_lead() -> None:
    drop = notice(
        NoticeKind.OPENED,
        rule="throughput_drop",
        severity=Severity.WARNING,
        incident_id="llama-ft-2",
        alert={"step": 1350, "metric": "tokens_per_s", "message": "tokens/s at 41% of baseline"},
    )
    rendered = render(envelope(drop, *divergence()), "text")
    assert rendered.title.endswith("step=1342 (+1 more)")
    lines = rendered.body.splitlines()
    also = lines[lines.index("Also in this message:") + 1].strip()
    assert also.startswith("22:13:20 WARNING throughput_drop opened at step 1350")


def test_resolution_does_not_lead_over_a_new_warning() -> None:
    resolved = notice(NoticeKind.RESOLVED, incident_id="llama-ft-1")
    warning = notice(NoticeKind.OPENED, rule="stall", severity=Severity.WARNING, incident_id="x-2")
    assert render(envelope(resolved, warning), "text").title.startswith("[sentinel] WARNING stall")


@pytest.mark.parametrize(
    ("folded", "line"),
    [
        (
            {"stall": 7, "nan_inf": 30},
            "and 37 more alerts (nan_inf 30, stall 7) held back by the rate limit;"
            " all are in alerts.jsonl",
        ),
        (
            {"stall": 1},
            "and 1 more alert (stall 1) held back by the rate limit; all are in alerts.jsonl",
        ),
        ({}, ""),
    ],
    ids=["several-rules", "one-alert", "none"],
)
def test_folded_line(folded: dict[str, int], line: str) -> None:
    assert folded_line(folded) == line


@pytest.mark.parametrize("style", ["text", "markdown", "slack"])
def test_folded_alerts_are_said_in_one_line(style: Style) -> None:
    body = render(envelope(*divergence(), folded={"nan_inf": 30, "stall": 7}), style).body
    assert sum("held back by the rate limit" in line for line in body.splitlines()) == 1


def test_message_of_folded_alerts_alone_still_renders() -> None:
    rendered = render(envelope(folded={"stall": 3}), "text")
    assert rendered.title == "[sentinel] INFO held back job=llama-ft"
    assert "and 3 more alerts (stall 3)" in rendered.body


def test_long_action_lists_keep_the_latest() -> None:
    many = tuple(f"22:14:{index:02d} restarting ({index} of 40)" for index in range(40))
    body = render(envelope(notice(NoticeKind.ACTIONS, actions=many)), "markdown").body
    assert "- ... 29 earlier actions" in body
    assert many[-1] in body and many[28] not in body


# JSON webhooks: the public alert schema of the lead notice, plus what the message is about.


def json_body(message: Envelope) -> dict[str, Any]:
    def reject(constant: str) -> None:
        raise AssertionError(f"non-strict JSON constant {constant}")

    parsed: dict[str, Any] = json.loads(render(message, "json").body, parse_constant=reject)
    return parsed


def test_json_body_keeps_the_alert_schema_keys() -> None:
    assert set(json_body(envelope(*divergence()))) == SCHEMA | EXTRAS | {"folded"}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("rule", "nan_inf"),
        ("severity", "critical"),
        ("step", 1342),
        ("value", "nan"),
        ("key", KEY),
        ("incident", "llama-ft-1"),
        ("kind", "escalated"),
        ("job", JOB.to_json()),
        ("folded", {"stall": 2}),
    ],
    ids=lambda value: str(value) if isinstance(value, str) else None,
)
def test_json_body_values(key: str, value: Any) -> None:
    assert json_body(envelope(*divergence(), folded={"stall": 2}))[key] == value


def test_json_body_lists_every_notice() -> None:
    notices = json_body(envelope(*divergence()))["notices"]
    assert [(n["kind"], n["rule"], n["severity"]) for n in notices] == [
        ("opened", "grad_norm_run", "warning"),
        ("escalated", "nan_inf", "critical"),
        ("actions", "nan_inf", "critical"),
    ]


def test_json_body_spells_non_finite_numbers() -> None:
    infinite = notice(NoticeKind.OPENED, alert={"value": float("-inf")})
    assert json_body(envelope(infinite))["value"] == "-inf"


@pytest.fixture
def hook() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as receiver:
        yield receiver


def test_json_webhook_receives_one_alert_object(hook: WebhookReceiver) -> None:
    send_envelope(f"json://127.0.0.1:{hook.port}/", envelope(*divergence()), 5.0)
    (request,) = hook.wait_for(1)
    assert request.json["title"] == "[sentinel] CRITICAL nan_inf job=llama-ft step=1342"
    assert request.json["type"] == "failure"
    assert request.headers["Idempotency-Key"] == KEY
    body = json.loads(request.json["message"])
    assert set(body) >= SCHEMA and body["key"] == KEY


# Targets, URLs and the apprise call.


@pytest.mark.parametrize(
    ("url", "style"),
    [
        ("mailto://u:p@example.com", "text"),
        ("slack://T1/B1/C1", "slack"),
        ("https://hooks.slack.com/services/T1/B1/C1", "slack"),
        ("mmosts://chat.example.com/token", "slack"),
        ("json://127.0.0.1:8080/", "json"),
        ("discord://webhook_id/token", "markdown"),
        ("https://example.com/hook", "markdown"),
    ],
    ids=["mailto", "slack", "slack-native", "mattermost", "json", "discord", "other-https"],
)
def test_style_for(url: str, style: Style) -> None:
    assert style_for(url) == style


@pytest.mark.parametrize(
    ("target", "url"),
    [
        ("slack://T1/B1/C1", "slack://T1/B1/C1?blocks=yes&footer=no"),
        ("slack://T1/B1/C1/#ops?blocks=no", "slack://T1/B1/C1/#ops?blocks=no&footer=no"),
        (
            "https://hooks.slack.com/services/T1/B1/C1",
            "https://hooks.slack.com/services/T1/B1/C1?blocks=yes&footer=no",
        ),
        ("mmost://chat:8065/token", "mmost://chat:8065/token?format=markdown"),
        ("mmost://chat/token?format=text", "mmost://chat/token?format=text"),
        ("json://127.0.0.1:9/", f"json://127.0.0.1:9/?+Idempotency-Key={quote(KEY, safe='')}"),
        ("json://h/?+idempotency-key=mine", "json://h/?+idempotency-key=mine"),
        ("discord://webhook_id/token", "discord://webhook_id/token"),
    ],
    ids=[
        "slack",
        "slack-user-blocks",
        "slack-native",
        "mattermost",
        "mattermost-user",
        "json",
        "json-user-header",
        "other",
    ],
)
def test_apprise_call_adds_layout_parameters_the_user_did_not_set(target: str, url: str) -> None:
    assert apprise_call(target, envelope(notice(NoticeKind.OPENED), key=KEY))[0] == url


def test_slack_url_keeps_its_channel_and_gets_block_kit() -> None:
    url, _ = apprise_call("slack://T1AB/B1AB/C1AB/#ops", envelope(notice(NoticeKind.OPENED)))
    plugin: Any = apprise.Apprise.instantiate(url)
    assert (plugin.channels, plugin.use_blocks, plugin.include_footer) == (["#ops"], True, False)


@pytest.mark.parametrize(
    ("notices", "notify_type"),
    [
        ((notice(NoticeKind.OPENED),), apprise.NotifyType.FAILURE),
        ((notice(NoticeKind.OPENED, severity=Severity.WARNING),), apprise.NotifyType.WARNING),
        ((notice(NoticeKind.RESOLVED),), apprise.NotifyType.SUCCESS),
    ],
    ids=["critical", "warning", "resolved"],
)
def test_notify_type_follows_severity(notices: tuple[Any, ...], notify_type: Any) -> None:
    _, arguments = apprise_call("slack://T1/B1/C1", envelope(*notices))
    assert arguments["notify_type"] == notify_type


# incident_notice and the notice as stored in the outbox.


def test_incident_notice_writes_actions_with_their_wall_clock_second() -> None:
    *_, acted = divergence()
    assert acted.actions[:2] == (f"22:13:24 {ACTIONS[0]}", f"22:13:26 {ACTIONS[1]}")


def test_incident_notice_knows_when_the_incident_opened() -> None:
    *_, acted = divergence()
    assert (acted.opened_at, acted.time) == (T0, T0 + 7)


def test_notice_survives_the_outbox_round_trip() -> None:
    *_, acted = divergence()
    assert type(acted).from_json(json.loads(json.dumps(acted.to_json()))) == acted


# The dashboard link.

ENVIRON = {"WANDB_RUN_ID": "abc123", "WANDB_ENTITY": "acme"}


@pytest.mark.parametrize(
    ("template", "url"),
    [
        ("https://wandb.ai/{env[WANDB_ENTITY]}/llm/runs/{env[WANDB_RUN_ID]}", "https://wandb.ai/acme/llm/runs/abc123"),
        ("https://grafana/d/x?var-job={job}&var-host={host}", "https://grafana/d/x?var-job=llama-ft&var-host=gpu-7"),
        ("https://runs.example.com/{run_id}", "https://runs.example.com/r-1"),
        ("", ""),
    ],
    ids=["env", "job-host", "run-id", "none"],
)  # fmt: skip
def test_dashboard_url_fills_its_fields(template: str, url: str) -> None:
    filled = format_dashboard_url(
        template, job="llama-ft", host="gpu-7", run_id="r-1", environ=ENVIRON
    )
    assert filled == url  # fmt: skip


AWKWARD = {
    "space": "llama ft 7b",
    "slash": "team/llama",
    "hash": "run#2",
    "question": "why?",
    "ampersand": "a&b=c",
    "percent": "50%25off",
    "non-ascii": "лама-微调-é",
}


@pytest.mark.parametrize("value", AWKWARD.values(), ids=AWKWARD.keys())
def test_dashboard_url_encodes_what_it_fills_in(value: str) -> None:
    filled = format_dashboard_url(
        "https://dash.example.com/runs/{job}/{env[RUN]}?host={host}&id={run_id}#top",
        job=value,
        host=value,
        run_id=value,
        environ={"RUN": value},
    )
    # Only characters a URL may hold as they are (no space, nothing beyond ASCII).
    assert filled == quote(filled, safe=":/?#[]@!$&'()*+,;=%")
    parts = urlsplit(filled)
    assert (parts.scheme, parts.netloc, parts.fragment) == ("https", "dash.example.com", "top")
    assert [unquote(segment) for segment in parts.path.split("/")] == ["", "runs", value, value]
    query = [pair.split("=") for pair in parts.query.split("&")]
    assert [(name, unquote(encoded)) for name, encoded in query] == [("host", value), ("id", value)]


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("https://wandb.ai/runs/{env[MISSING]}", "environment variable MISSING is not set"),
        ("https://x/{project}", "unknown field {project}"),
        ("https://x/{job.__class__}", "unknown field {job.__class__}"),
        ("https://x/{0}", "unknown field {0}"),
        ("https://x/{job", "expected '}'"),
    ],
    ids=["missing-env", "unknown-field", "attribute", "positional", "unbalanced"],
)
def test_dashboard_url_that_cannot_be_filled_is_dropped_with_a_warning(
    template: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="sentinel.notify.messages"):
        filled = format_dashboard_url(template, job="j", host="h", run_id="r", environ=ENVIRON)
    assert filled == ""
    assert reason in caplog.text
