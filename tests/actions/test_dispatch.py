"""Who hears of what, and when: routing, repeats, flapping, resolves and storms.

The dispatcher's cases use a simulated ``now`` and read the real outbox (SQLite)
it wrote to. The ``Watch`` cases feed real alerts through the whole path, and
the storm delivers to a real webhook.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sentinel.config import NotifyConfig, load_settings
from sentinel.model.records import Alert, Severity
from sentinel.notify.dispatch import Dispatcher, Policy, Route, routes
from sentinel.notify.notices import JobInfo, Notice, NoticeKind
from sentinel.notify.notifier import Notifier
from sentinel.notify.outbox import Outbox
from sentinel.service.watch import Watch
from sentinel.store.state import StateStore
from tests.helpers.webhook import WebhookReceiver

T0 = 1_700_000_000.0
JOB = JobInfo("llama-ft", "gpu-node-7", "run-1")
SLACK = "json://127.0.0.1:1/slack"
PAGER = "json://127.0.0.1:1/pager"
ROUTES = [
    Route(SLACK, "slack", Severity.WARNING),
    Route(PAGER, "pager", Severity.CRITICAL),
]
AT_ONCE = Policy(group_wait_s=0.0)


def notice(
    kind: NoticeKind = NoticeKind.OPENED,
    incident: str = "run-1-1",
    rule: str = "nan_inf",
    severity: Severity = Severity.CRITICAL,
) -> Notice:
    alert = {"rule": rule, "severity": str(severity), "message": f"{rule} {kind}"}
    return Notice(kind, incident, rule, severity, alert, T0)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    state = StateStore(tmp_path / "state")
    yield state
    state.close()


def dispatcher(
    store: StateStore, policy: Policy = AT_ONCE, route: list[Route] = ROUTES
) -> Dispatcher:
    return Dispatcher(Outbox(store), route, policy, JOB)


def sent(outbox: Outbox, url: str = SLACK) -> list[str]:
    """Every notice stored for ``url``, as ``kind:incident``, message by message."""
    return [f"{n.kind}:{n.incident_id}" for m in outbox.messages(url) for n in m.envelope.notices]


# -- routing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("severity", "targets"),
    [(Severity.CRITICAL, ["slack", "pager"]), (Severity.WARNING, ["slack"]), (Severity.INFO, [])],
    ids=["critical-to-both", "warning-to-slack-only", "info-to-none"],
)
def test_route_by_severity(store: StateStore, severity: Severity, targets: list[str]) -> None:
    d = dispatcher(store)
    assert d.dispatch(notice(severity=severity), ["nan_inf"], T0) == targets
    assert len(d.outbox.messages(PAGER)) == ("pager" in targets)


@pytest.mark.parametrize(
    ("rules", "reached"),
    [(["nan_inf"], True), (["stall"], False), (["grad_norm_run", "nan_inf"], True)],
    ids=["rule-listed", "rule-not-listed", "one-of-its-rules-listed"],
)
def test_route_by_rule(store: StateStore, rules: list[str], reached: bool) -> None:
    only_nan = [Route(PAGER, "pager", Severity.WARNING, frozenset({"nan_inf"}))]
    d = dispatcher(store, route=only_nan)
    assert d.dispatch(notice(rule=rules[-1]), rules, T0) == (["pager"] if reached else [])


@pytest.mark.parametrize("kind", [NoticeKind.ACTIONS, NoticeKind.RESOLVED], ids=str)
def test_actions_and_resolves_go_only_where_the_incident_was_announced(
    store: StateStore, kind: NoticeKind
) -> None:
    d = dispatcher(store)
    d.dispatch(notice(severity=Severity.WARNING), ["nan_inf"], T0)  # slack only
    later = notice(kind, severity=Severity.CRITICAL)
    assert d.dispatch(later, ["nan_inf"], T0 + 1) == ["slack"]
    assert d.dispatch(notice(kind, incident="never-announced"), ["nan_inf"], T0 + 2) == []


def test_forced_actions_go_by_route(store: StateStore) -> None:
    d = dispatcher(store)
    actions = notice(NoticeKind.ACTIONS, incident="never-announced")
    assert d.dispatch(actions, ["nan_inf"], T0, force=True) == ["slack", "pager"]


def test_no_resolve_message_when_send_resolved_is_off(store: StateStore) -> None:
    d = dispatcher(store, Policy(group_wait_s=0.0, send_resolved=False))
    d.dispatch(notice(), ["nan_inf"], T0)
    assert d.dispatch(notice(NoticeKind.RESOLVED), ["nan_inf"], T0 + 1) == []


@pytest.mark.slow
def test_routes_from_config_name_each_target() -> None:
    secret = "json://user:s3cr3t-T0KEN@127.0.0.1:1/all"
    config = NotifyConfig.model_validate(
        {
            "urls": [secret],
            "min_severity": "warning",
            "targets": [
                {"url": PAGER, "name": "pagerduty", "min_severity": "critical"},
                {"url": SLACK, "rules": ["nan_inf", "stall"]},
            ],
        }
    )
    assert [(r.name, r.min_severity, sorted(r.rules)) for r in routes(config)] == [
        ("json://user:****@127.0.0.1:1/all", Severity.WARNING, []),
        ("pagerduty", Severity.CRITICAL, []),
        (SLACK, Severity.WARNING, ["nan_inf", "stall"]),
    ]


# -- repeats, flapping, a reopen ------------------------------------------------------------


def test_open_critical_repeats_every_interval(store: StateStore) -> None:
    d = dispatcher(store, Policy(group_wait_s=0.0, repeat_interval_s=600.0))
    d.dispatch(notice(), ["nan_inf"], T0)
    assert not d.repeat_due("run-1-1", T0 + 599)
    assert d.repeat_due("run-1-1", T0 + 600)
    d.dispatch(notice(NoticeKind.REPEAT), ["nan_inf"], T0 + 600)
    assert not d.repeat_due("run-1-1", T0 + 1199)
    assert d.repeat_due("run-1-1", T0 + 1200)
    d.dispatch(notice(NoticeKind.RESOLVED), ["nan_inf"], T0 + 1201)
    assert not d.repeat_due("run-1-1", T0 + 9999)
    assert sent(d.outbox) == ["opened:run-1-1", "repeat:run-1-1", "resolved:run-1-1"]


def test_unannounced_incident_never_repeats(store: StateStore) -> None:
    d = dispatcher(store)
    assert not d.repeat_due("run-1-1", T0 + 10 * 86400)


def flap(d: Dispatcher, incident: str, at: float) -> None:
    """One episode of ``stall``: opened, resolved a second later."""
    d.dispatch(notice(NoticeKind.OPENED, incident, "stall", Severity.WARNING), ["stall"], at)
    d.dispatch(notice(NoticeKind.RESOLVED, incident, "stall", Severity.WARNING), ["stall"], at + 1)


def test_flapping_rule_sends_one_flapping_notice_then_holds_opens_and_resolves(
    store: StateStore,
) -> None:
    d = dispatcher(store, Policy(group_wait_s=0.0, flap_threshold=3, flap_window_s=600.0))
    for n in range(6):
        flap(d, f"i-{n}", T0 + 60 * n)
    assert sent(d.outbox) == [
        "opened:i-0",
        "resolved:i-0",
        "opened:i-1",
        "resolved:i-1",
        "flapping:i-2",
    ]
    (flapping,) = [n for m in d.outbox.messages(SLACK) for n in m.envelope.notices][-1:]
    assert "3 incidents within 10 min" in flapping.note


def test_flapping_rule_is_heard_again_once_quiet_for_the_window(store: StateStore) -> None:
    d = dispatcher(store, Policy(group_wait_s=0.0, flap_threshold=3, flap_window_s=600.0))
    for n in range(4):
        flap(d, f"i-{n}", T0 + 60 * n)  # the last opening at T0 + 180 is held
    flap(d, "i-4", T0 + 180 + 600)
    assert sent(d.outbox)[-3:] == ["flapping:i-2", "opened:i-4", "resolved:i-4"]


def test_opens_spread_wider_than_the_window_are_not_flapping(store: StateStore) -> None:
    d = dispatcher(store, Policy(group_wait_s=0.0, flap_threshold=3, flap_window_s=600.0))
    for n in range(4):
        flap(d, f"i-{n}", T0 + 300 * n)
    assert [s.split(":")[0] for s in sent(d.outbox)] == ["opened", "resolved"] * 4


def test_reopen_within_group_wait_cancels_the_resolve_and_keeps_the_target_told(
    store: StateStore,
) -> None:
    d = dispatcher(store, Policy(group_wait_s=30.0))
    stall = ["stall"]
    d.dispatch(notice(NoticeKind.OPENED, "i-1", "stall", Severity.WARNING), stall, T0)
    d.dispatch(notice(NoticeKind.RESOLVED, "i-1", "stall", Severity.WARNING), stall, T0 + 5)
    d.dispatch(notice(NoticeKind.OPENED, "i-2", "stall", Severity.WARNING), stall, T0 + 10)
    assert sent(d.outbox) == ["opened:i-1"]
    d.dispatch(notice(NoticeKind.RESOLVED, "i-2", "stall", Severity.WARNING), stall, T0 + 60)
    assert sent(d.outbox) == ["opened:i-1", "resolved:i-2"]


# -- through Watch ----------------------------------------------------------------------------


def make_watch(tmp_path: Path, url: str, **notify: Any) -> Watch:
    """A Watch on a config file whose [notify] has ``url`` and ``notify``'s keys."""
    lines = [f'state_dir = "{tmp_path / "state"}"', "[notify]", f"urls = [{json.dumps(url)}]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in notify.items()]
    config = tmp_path / "sentinel.toml"
    config.write_text("\n".join(lines) + "\n")
    settings = load_settings(config, environ={})
    store = StateStore(settings.state_dir)
    notifier = Notifier(Outbox(store), tries=1, retry_initial_s=0.05, retry_max_s=0.2)
    return Watch(settings, store=store, notifier=notifier, job_name="llama-ft")


@pytest.fixture
def watches() -> Iterator[list[Watch]]:
    made: list[Watch] = []
    yield made
    for watch in made:
        watch.notifier.stop(drain_s=0.5)
        watch.close()


def alert(rule: str, severity: Severity, at: float, *, resolves: bool = False) -> Alert:
    return Alert(rule, severity, f"{rule} at {at}", at, "train.log", step=int(at) % 1000,
                 resolves=resolves)  # fmt: skip


@pytest.mark.parametrize(
    ("send_resolved", "expected"),
    [(True, ["opened", "resolved"]), (False, ["opened"])],
    ids=["send-resolved", "no-resolved"],
)
def test_watch_sends_a_resolve_message(
    tmp_path: Path, watches: list[Watch], send_resolved: bool, expected: list[str]
) -> None:
    watch = make_watch(tmp_path, SLACK, group_wait_s=0, send_resolved=send_resolved)
    watches.append(watch)
    watch.handle([alert("stall", Severity.WARNING, T0)])
    watch.handle([alert("stall", Severity.INFO, T0 + 5, resolves=True)])
    outbox = watch.notifier.outbox
    assert [n.kind for m in outbox.messages(SLACK) for n in m.envelope.notices] == expected


def test_watch_repeats_an_open_critical_incident_on_tick(
    tmp_path: Path, watches: list[Watch]
) -> None:
    watch = make_watch(tmp_path, SLACK, group_wait_s=0, repeat_interval_s=600)
    watches.append(watch)
    (incident,) = watch.handle(
        [alert("nan_inf", Severity.CRITICAL, T0), alert("stall", Severity.WARNING, T0)]
    )
    assert watch.notifier.outbox.messages(SLACK) == []  # held until the caller acted
    watch.update(incident)
    opened_at = watch.notifier.outbox.messages(SLACK)[0].created_at
    watch.tick(opened_at + 599)
    watch.tick(opened_at + 600)
    watch.tick(opened_at + 601)
    kinds = [
        (n.kind, n.rule) for m in watch.notifier.outbox.messages(SLACK) for n in m.envelope.notices
    ]
    assert kinds == [
        (NoticeKind.OPENED, "nan_inf"),
        (NoticeKind.OPENED, "stall"),
        (NoticeKind.REPEAT, "nan_inf"),
    ]


@pytest.mark.slow
def test_watch_groups_what_sentinel_did_with_the_opening(
    tmp_path: Path, watches: list[Watch]
) -> None:
    watch = make_watch(tmp_path, SLACK, group_wait_s=30)
    watches.append(watch)
    (incident,) = watch.handle([alert("nan_inf", Severity.CRITICAL, T0)])
    incident.record(T0 + 1, "rolled back to step_10")
    watch.update(incident, final=True)
    (message,) = watch.notifier.outbox.messages(SLACK)
    opened, actions = message.envelope.notices
    assert (opened.kind, actions.kind) == (NoticeKind.OPENED, NoticeKind.ACTIONS)
    assert any("rolled back to step_10" in line for line in actions.actions)


STORM_RULES = ["nan_inf", "stall", "loss_spike", "throughput_drop", "gpu_idle", "job_crash"]


@pytest.mark.slow
def test_storm_of_1000_alerts_is_rate_limited_into_a_digest_and_fully_journaled(
    tmp_path: Path, watches: list[Watch]
) -> None:
    """500 episodes opened and resolved: 1,000 alerts, 1,000 notices (flapping off)."""
    with WebhookReceiver() as hook:
        watch = make_watch(tmp_path, hook.url, group_wait_s=0, rate_limit=5, flap_threshold=10_000)
        watches.append(watch)
        watch.notifier.start()
        alerts = []
        for n in range(500):
            rule = STORM_RULES[n % len(STORM_RULES)]
            alerts.append(alert(rule, Severity.WARNING, T0 + n))
            alerts.append(alert(rule, Severity.INFO, T0 + n + 0.5, resolves=True))
        watch.handle(alerts)
        hook.wait_for(5)
        watch.notifier.stop(drain_s=1.0)
        assert len(hook.requests) == 5

    messages = watch.notifier.outbox.messages(hook.url)
    *first, digest = messages
    assert len(first) == 5 and all(m.delivered_at is not None for m in first)
    assert digest.digest and digest.delivered_at is None
    assert len(digest.envelope.notices) <= 3
    counted = {rule: 0 for rule in STORM_RULES}
    for message in messages:
        for n in message.envelope.notices:
            counted[n.rule] += 1
        for rule, count in message.envelope.folded.items():
            counted[rule] += count
    assert counted == {rule: 2 * sum(1 for n in range(500) if n % 6 == i)
                       for i, rule in enumerate(STORM_RULES)}  # fmt: skip
    journal = (tmp_path / "state" / "alerts.jsonl").read_text().splitlines()
    assert len(journal) == 1000
    assert [json.loads(line)["message"] for line in journal] == [a.message for a in alerts]
