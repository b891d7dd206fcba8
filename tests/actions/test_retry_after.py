"""How sentinel reads apprise's HTTP answers without changing ``requests`` for other code.

Against real local HTTP servers: apprise's own json plugin sends to one, test code
sends to another with plain ``requests``, from this thread and from others.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import apprise
import apprise.plugins.custom_json
import pytest
import requests

from sentinel.notify.retry_after import Observer, observe_responses
from tests.helpers.webhook import WebhookReceiver

ASKS_AN_HOUR = {"Retry-After": "3600"}


def plugin_for(receiver: WebhookReceiver) -> Any:
    plugin = apprise.Apprise.instantiate(receiver.url)
    assert plugin is not None
    return plugin


def deliver(plugin: Any) -> bool:
    """One ``Apprise.notify`` through ``plugin``, as sentinel's ``_notify`` makes it."""
    sender = apprise.Apprise()
    sender.add(plugin)
    return bool(sender.notify(title="t", body="b"))


@pytest.mark.slow  # a fresh interpreter importing the whole package
def test_importing_sentinel_changes_nothing_in_requests_or_apprise() -> None:
    """In a fresh interpreter: every sentinel module imported, and ``requests`` is as it was."""
    script = textwrap.dedent(
        """
        import importlib, pkgutil, sys, types
        import requests, requests.api, requests.sessions
        import apprise

        def snapshot():
            return {
                "session": dict(vars(requests.sessions.Session)),
                "api": dict(vars(requests.api)),
                "package": {k: v for k, v in vars(requests).items() if k != "__warningregistry__"},
                "default_hooks": requests.sessions.default_hooks,
            }

        before = snapshot()
        import sentinel
        names = [
            m.name for m in pkgutil.walk_packages(sentinel.__path__, "sentinel.")
            if not m.name.endswith("__main__")  # that one runs the CLI
        ]
        for name in names:
            importlib.import_module(name)
        assert "sentinel.notify.notifier" in sys.modules, names
        after = snapshot()
        changed = [k for k in before if before[k] != after[k]]
        assert not changed, changed
        assert requests.Session().hooks == {"response": []}
        patched = [
            name for name, module in list(sys.modules.items())
            if name.startswith("apprise") and isinstance(module, types.ModuleType)
            and "requests" in vars(module) and vars(module)["requests"] is not requests
        ]
        assert not patched, patched
        print(len(names))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 30  # every module of the package was imported


def test_other_code_requests_are_not_seen_even_inside_an_observation() -> None:
    with WebhookReceiver() as target, WebhookReceiver() as other:
        other.respond(429, times=2, headers=ASKS_AN_HOUR)
        with observe_responses(plugin_for(target)) as answers:
            session = requests.Session()
            assert session.hooks == {"response": []}
            assert session.get(other.http_url(), timeout=5).status_code == 429
            assert requests.get(other.http_url(), timeout=5).status_code == 429
        assert answers.retry_at is None


def test_retry_after_from_apprise_is_seen_and_apprise_is_given_back_its_requests() -> None:
    with WebhookReceiver() as target:
        target.respond(429, headers={"Retry-After": "30"})
        plugin = plugin_for(target)
        with observe_responses(plugin) as answers:
            assert not deliver(plugin)
        after = time.time()
    assert answers.retry_at is not None
    assert after + 25 < answers.retry_at <= after + 30
    assert apprise.plugins.custom_json.requests is requests


def test_an_answer_outside_any_observation_is_not_seen() -> None:
    with WebhookReceiver() as target:
        target.respond(429, headers=ASKS_AN_HOUR)
        plugin = plugin_for(target)
        with observe_responses(plugin) as answers:
            pass
        assert not deliver(plugin)
    assert answers.retry_at is None
    assert apprise.plugins.custom_json.requests is requests


def test_other_threads_requests_during_a_delivery_are_not_captured() -> None:
    """While sentinel's delivery is held open on its own thread, another thread sends
    with plain ``requests`` and through apprise's same json plugin to a target asking
    for an hour: only the delivery's own answer (5 s) reaches its observer."""
    with WebhookReceiver() as target, WebhookReceiver() as other:
        target.respond(429, headers={"Retry-After": "5"})
        target.delay_s = 10.0  # held until release()
        other.respond(429, times=3, headers=ASKS_AN_HOUR)
        observed: list[Observer] = []

        def sentinel_delivery() -> None:
            plugin = plugin_for(target)
            with observe_responses(plugin) as answers:
                deliver(plugin)
            observed.append(answers)

        delivering = threading.Thread(target=sentinel_delivery)
        delivering.start()
        try:
            target.wait_for(1, accepted_only=False)  # the delivery is in flight now
            assert requests.post(other.http_url(), timeout=5).status_code == 429
            assert requests.Session().get(other.http_url(), timeout=5).status_code == 429
            assert not deliver(plugin_for(other))
            assert [r.status for r in other.requests] == [429, 429, 429]
        finally:
            target.release()
            delivering.join(timeout=10)
        after = time.time()
    (answers,) = observed
    assert answers.retry_at is not None
    assert answers.retry_at <= after + 5
    assert apprise.plugins.custom_json.requests is requests


def test_overlapping_deliveries_keep_the_hook_until_the_last_ends() -> None:
    with WebhookReceiver() as first, WebhookReceiver() as second:
        second.respond(503, headers={"Retry-After": "20"})
        second_plugin = plugin_for(second)
        with observe_responses(second_plugin) as second_answers:
            with observe_responses(plugin_for(first)) as first_answers:
                pass
            # The first delivery ended; the second still reads its answers.
            assert not deliver(second_plugin)
        after = time.time()
    assert first_answers.retry_at is None
    assert second_answers.retry_at is not None
    assert after + 15 < second_answers.retry_at <= after + 20
    assert apprise.plugins.custom_json.requests is requests
