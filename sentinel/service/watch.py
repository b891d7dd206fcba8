"""What every live mode shares: engine, incidents, journal, reports, notifications.

``Watch`` turns alerts into incidents and their records and notices, and
tells its owner which incidents call for action. It decides nothing about
the job itself: that is the supervisor's part. Who hears of a notice, and
when, is the dispatcher's (``sentinel.notify.dispatch``).
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sentinel.config import Settings
from sentinel.engine.core import Engine, build_detectors
from sentinel.evidence.capture import incident_dir
from sentinel.evidence.chart import ChartDrawer, picture
from sentinel.evidence.diagnosis import DIAGNOSIS_SAMPLES, explain
from sentinel.evidence.report import Journal, incident_files, write_report
from sentinel.model.cost import incident_cost
from sentinel.model.facts import Resumed
from sentinel.model.incidents import (
    ECHO_S,
    Incident,
    IncidentEvent,
    IncidentTracker,
    alert_rank,
    said_key,
)
from sentinel.model.records import SENTINEL_SOURCE, Alert, Sample, Severity
from sentinel.notify.dispatch import Dispatcher, Policy, routes
from sentinel.notify.notices import JobInfo, NoticeKind, format_dashboard_url, incident_notice
from sentinel.notify.notifier import Notifier
from sentinel.parsing import LineParser
from sentinel.rules import DETECTORS, STORIES
from sentinel.service.memory import RunMemory
from sentinel.store.run_verdict import resolve_run_id
from sentinel.store.state import StateStore

log = logging.getLogger(__name__)

#: What was said lately, at most this many before the old are dropped.
_SAID_KEPT = 256


@dataclass
class _Said:
    """An alert's rule and severity as first said: when, by which ranks, and whether "also"
    was said."""

    at: float
    ranks: set[int]
    echoed: bool = False


#: How long sentinel waits, when it ends, for the incident charts still being drawn.
CHART_FLUSH_S = 20.0
#: The incident of a state dir that refuses writes (sentinel's own; it only notifies).
STATE_DIR_RULE = "state_dir"


def new_run_id() -> str:
    """A sortable id, unique across restarts of sentinel (idempotency keys build on it)."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"


class Watch:
    """Alerts in; journal lines, reports, messages and actionable incidents out."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: StateStore,
        notifier: Notifier,
        job_name: str,
        on_incident: Callable[[str, str], None] | None = None,
        remember: bool = False,
        run_wide: bool = True,
    ) -> None:
        """``on_incident(rule, severity)``: an incident opened or escalated (for metrics).

        With ``remember``, what the last sentinel knew of the run is taken back when the
        first attempt starts: when it is the same job still (``watch`` beside it, or ``run``
        adopting the job a killed sentinel left), its open incidents, who was told of them
        and when they were last announced; with ``run_wide`` (``watch``: the state dir is
        the run's), also the spend and the flapping clocks when the job is a new attempt.
        """
        self.settings = settings
        self._memory = RunMemory(store, remember=remember, run_wide=run_wide)
        self._on_incident = on_incident
        self.notifier = notifier
        self.job_name = job_name
        self.host = socket.gethostname()
        self.run_id = new_run_id()
        store.put("last_run_id", self.run_id)
        self.engine = self._engine(settings)
        #: A SIGHUP changed the rules: they take over at the next attempt.
        self._rules_reloaded = False
        self.tracker = IncidentTracker(self.run_id, STORIES)
        for detector in self.engine.detectors:
            for note in detector.start_notes():
                log.warning("%s", note)
        self.journal = Journal(settings.state_dir)
        #: Each incident's chart, drawn off the loop.
        self.charts = ChartDrawer(enabled=settings.evidence.chart)
        #: What could not be written to the state dir lately, and why (for STATUS, metrics).
        self.state_problems: dict[str, str] = {}
        self.state_dir: Path = settings.state_dir
        dashboard_url = format_dashboard_url(
            settings.job.dashboard_url,
            job=job_name,
            host=self.host,
            run_id=self.run_id,
            environ=os.environ,
        )
        shared_run_id = resolve_run_id(settings.run_id, os.environ) or ""
        self.job = JobInfo(job_name, self.host, self.run_id, dashboard_url, shared_run_id)
        #: Incidents another node decided for the run (and paged for): not announced here.
        self._quiet: set[str] = set()
        #: What the alerts said lately (``said_key``), to say a rank's echo once.
        self._said: dict[tuple[str, str], _Said] = {}
        #: The notices of a ``handle`` that returned incidents to act on, said at the next
        #: ``update``: after the caller's action (the stop's signal), which cannot wait.
        self._held: list[tuple[IncidentEvent, Incident, Alert]] = []
        #: Incidents of a stop a dead sentinel left (``taken_up``): what was done is told to
        #: every target, as whether any was told of the incident died with that sentinel.
        self._taken_up: set[str] = set()
        #: How many of each incident's actions a message has told (``update``).
        self._actions_told: dict[str, int] = {}
        #: The incident of a stop taken up and its job: kept open when that very job is
        #: found again (``job_started``).
        self._stop_going_on: tuple[str, tuple[int, float]] | None = None
        self.dispatcher = Dispatcher(
            notifier.outbox, routes(settings.notify), Policy.from_config(settings.notify), self.job
        )
        if not self.dispatcher.routes:
            log.warning(
                "no notification target: nobody will be told of an incident (give --notify URL,"
                " [notify] urls or [[notify.targets]]); alerts.jsonl and the reports in %s"
                " still record them",
                settings.state_dir,
            )

    def handle(self, alerts: list[Alert]) -> list[Incident]:
        """Record and announce alerts; the critical incidents that just opened or escalated.

        A critical incident that alerts joined without changing it (another rank's NaN
        after the first) has its report written again, once a call, so that its timeline
        names them too: the caller writes the report only when it acts.

        When incidents are returned, the call's notices wait for the caller's ``update``
        (after it acted: rendering a notice and queueing it in the outbox took about 2 ms
        before the stop's signal); otherwise they are queued here."""
        actionable = []
        notices: list[tuple[IncidentEvent, Incident, Alert]] = []
        joined: dict[str, Incident] = {}
        for alert in alerts:
            change = self.tracker.observe(alert)
            if not alert.resolves and alert.rule in self.tracker.open:
                explain(
                    self.tracker.open[alert.rule],
                    alert,
                    self.engine.recent_for(alert, DIAGNOSIS_SAMPLES),
                    samples_per_step=self.engine.facts.samples_per_step,
                    written_after=self.engine.written_after,
                )
            self.safely("the alert journal", self.journal.append, alert)
            level = _LEVELS[alert.severity]
            said = alert.severity.upper()
            # The line's level says the severity, but for a critical (logged as ERROR): never
            # "WARNING WARNING".
            named = "" if logging.getLevelName(level) == said else f"{said} "
            self._say(alert, level, named)
            if change is None:
                # An alert may ask for an action of its own on an incident already critical
                # (cost_overrun's kill_fraction: stop the job).
                if alert.details.get("on_critical") and alert.rule in self.tracker.open:
                    actionable.append(self.tracker.open[alert.rule])
                elif not alert.resolves and alert.rule in self.tracker.open:
                    joined_to = self.tracker.open[alert.rule]
                    if joined_to.severity is Severity.CRITICAL:
                        joined[joined_to.id] = joined_to
                continue
            event, incident = change
            if self._on_incident is not None and event is not IncidentEvent.RESOLVED:
                self._on_incident(incident.rule, str(incident.severity))
            notices.append((event, incident, alert))
            if event is not IncidentEvent.RESOLVED and incident.severity is Severity.CRITICAL:
                actionable.append(incident)  # the caller acts, then writes the report (update)
        if actionable:
            self._held += notices
        else:
            for notice in notices:
                self._announce(*notice)
        acting = {id(incident) for incident in actionable}
        for incident in joined.values():
            if id(incident) not in acting:  # the caller writes those once it acted
                self._report(incident, time.time())
        return actionable

    def _say(self, alert: Alert, level: int, named: str) -> None:
        """Log an alert; another rank's alert of the same rule and severity soon after is
        said once more, "also on rank N", and no more (64 ranks' NaN: two lines, not 64)."""
        key, rank, now = said_key(alert), alert_rank(alert), alert.time
        said = self._said.get(key)
        if said is not None and now - said.at > ECHO_S:
            said = None  # said too long ago: said again
        if alert.resolves or said is None or rank in said.ranks:
            if said is None and not alert.resolves:
                if len(self._said) >= _SAID_KEPT:
                    self._said = {k: v for k, v in self._said.items() if now - v.at <= ECHO_S}
                self._said[key] = _Said(now, {rank})
            log.log(level, "%s%s step=%s: %s", named, alert.rule, alert.step, alert.message)
            return
        said.ranks.add(rank)
        if said.echoed:
            log.debug("%s%s step=%s: %s", named, alert.rule, alert.step, alert.message)
            return
        said.echoed = True
        log.log(
            level,
            "%s%s step=%s: also on rank %d (%s; alerts.jsonl has each rank's, the timeline"
            " and the report list the ranks)",
            named,
            alert.rule,
            alert.step,
            rank,
            alert.message.removeprefix(f"rank {rank}: "),
        )

    def update(
        self, incident: Incident, *, final: bool = False, force_notify: bool = False
    ) -> None:
        """Rewrite the incident's report, then queue the notices ``handle`` held; when
        ``final``, tell people what sentinel did.

        What was done goes to the targets told of the incident; with ``force_notify``
        to every target its route picks (sentinel gave up: someone must hear).
        """
        now = time.time()
        self._report(incident, now)
        held, self._held = self._held, []
        for notice in held:
            self._announce(*notice)
        told = self._actions_told.get(incident.id, 0)
        if final and len(incident.actions) > told:
            # Once for what was done: a give-up's escalation told everyone, and the run's
            # end that follows told them the same again (two messages, two keys).
            self._actions_told[incident.id] = len(incident.actions)
            # The notice's alert says what was done, in the alert schema, for machines.
            summary = replace(
                incident.first,
                message="; ".join(text for _, text in incident.actions),
                time=incident.actions[-1][0],
                source=SENTINEL_SOURCE,
            )
            force = force_notify or incident.id in self._taken_up
            self._notify(NoticeKind.ACTIONS, incident, summary, now, force=force)

    def taken_up(self, incident: Incident, job: tuple[int, float] | None = None) -> None:
        """``incident``'s stop was decided by a sentinel that died during it: its notices
        may never have been queued (they wait for the signal), so what this one does about
        it goes to every target its route picks, told before or not."""
        self._taken_up.add(incident.id)
        # Kept open when the stopped job (``job``: pid, start time) is found again; a job
        # found that is another (a relaunch) is the next attempt, and its NaN a new
        # incident (joined to the stop's, it stopped nothing: a relaunch from a poisoned
        # save trained on NaN to its end).
        self._stop_going_on = (incident.id, job) if job is not None else None
        # Open here too: the rule's alerts from now on join it, and the summary and the
        # report tell the whole stop (it went on a copy of its own, missing from both).
        self.tracker.adopt(incident)

    def tick(self, now: float) -> None:
        """Announce again each open critical incident whose ``repeat_interval_s`` has passed
        (one taken back from before a restart only once its rule raises it again); save
        what sentinel knows of the run when it changed (``RunMemory.due``)."""
        for incident in {id(i): i for i in self.tracker.open.values()}.values():
            if (
                incident.severity is Severity.CRITICAL
                and not incident.restored
                and self.dispatcher.repeat_due(incident.id, now)
            ):
                self._notify(NoticeKind.REPEAT, incident, incident.worst, now)
        if self._memory.due(now, self.tracker):
            self.save_memory(now)

    def warned_since(self) -> tuple[int | None, float] | None:
        """The onset (step, time) of the earliest open warning or critical incident; None
        when none is open. The keeper keeps a checkpoint from before it."""
        warned = [i for i in self.tracker.open.values() if i.severity >= Severity.WARNING]
        if not warned:
            return None
        steps = [i.onset_step for i in warned if i.onset_step is not None]
        return (min(steps) if steps else None), min(i.onset_time for i in warned)

    def save_memory(self, now: float) -> None:
        """Write what must outlive sentinel to the state dir, if it changed since last time."""
        self._memory.save(now, self.engine, self.tracker, self.dispatcher, self.safely)

    def job_started(
        self,
        now: float,
        start_step: int = 0,
        identity: tuple[int, float] | None = None,
        resumed: Resumed | None = None,
    ) -> None:
        """A new attempt (resuming at ``start_step``): the previous attempt's episodes are over.

        ``identity`` (pid, start time) names the attempt's process, where known: a
        sentinel that restarts beside the same job takes back its open incidents.
        ``resumed``: where the attempt resumed after a rollback (the ``recovery`` rule)."""
        # A stop taken up is not over when its job is found again (the same attempt).
        going_on, self._stop_going_on = self._stop_going_on, None
        same = going_on is not None and identity is not None and going_on[1] == identity
        keep = frozenset({going_on[0]}) if same and going_on is not None else frozenset()
        for incident in self.tracker.close_all(now, keep=keep):
            self.dispatcher.forget(incident.id)
            if incident.severity is Severity.CRITICAL:
                self._report(incident, now)
        if self._rules_reloaded:
            # New rules start with the attempt, as every rule's state does.
            self._rules_reloaded = False
            self.engine = self._engine(self.settings)
            log.info("the reloaded rules are in force from this attempt on")
        self.engine.job_started(now, start_step, resumed)
        self._memory.job_started(identity, self.engine, self.tracker, self.dispatcher)

    def policy(self, incident: Incident) -> str:
        """What a critical ``incident`` calls for: "notify", "stop" or "restart".

        The rule's ``on_critical``, unless one of its alerts asks for more (cost_overrun's
        ``kill_fraction``: stop); a rule sentinel does not know only notifies.
        """
        known = incident.rule in DETECTORS
        policy = self.settings.rule(incident.rule).on_critical if known else "notify"
        for alert in reversed(incident.alerts):
            requested = alert.details.get("on_critical")
            if requested in ("notify", "stop", "restart"):
                return str(requested)
        return policy

    @staticmethod
    def _engine(settings: Settings) -> Engine:
        engine = Engine(
            build_detectors(settings),
            LineParser(
                regexes=settings.parsers.regexes, logging_steps=settings.parsers.logging_steps
            ),
            logging_steps=settings.parsers.logging_steps,
            read_window_s=settings.tail.batch_s + settings.tail.look_s,
        )
        engine.facts = settings.run_facts()
        return engine

    def reload(self, settings: Settings) -> None:
        """A new config (SIGHUP): its notification routes at once, its rules from the next
        attempt (a rule's state is the attempt's; swapping it mid-run would lose it)."""
        rules_changed = settings.model_dump()["rules"] != self.settings.model_dump()["rules"]
        self.settings = settings
        self.dispatcher.set_routes(routes(settings.notify))
        self.dispatcher.policy = Policy.from_config(settings.notify)
        if rules_changed:
            self._rules_reloaded = True
            log.info("SIGHUP: rule changes take effect when the next attempt starts")

    def quiet(self, incident: Incident) -> None:
        """Another node's sentinel decided the run first and paged: no more messages about
        ``incident`` from here (its journal lines and report are kept)."""
        self._quiet.add(incident.id)

    def incidents(self) -> list[Incident]:
        """Every incident of the run so far, closed and open, each once (a joined one is
        open under each of its rules)."""
        tracker = self.tracker
        return list({id(i): i for i in [*tracker.closed, *tracker.open.values()]}.values())

    def close(self) -> None:
        stats = self.engine.parser.stats
        log.info(
            "parsed %d lines: %d with metrics, %d garbled (skipped), %d plain text",
            stats.lines,
            stats.parsed,
            stats.garbled,
            stats.unparsed,
        )
        self.save_memory(time.time())
        self.safely("the alert journal", self.journal.close)
        # Bounded like the rest of the shutdown: by --drain-timeout when it is shorter.
        wait_s = min(CHART_FLUSH_S, self.settings.drain_timeout_s)
        if not self.charts.flush(wait_s):
            log.warning("an incident chart was not drawn within %g s", wait_s)

    def _report(self, incident: Incident, now: float) -> None:
        cost = incident_cost(incident, self.engine.facts, now)
        self.safely(
            "the incident report",
            write_report,
            incident,
            self._recent(incident),
            self.state_dir,
            cost=cost,
            charted=self.charts.enabled,
        )
        shown = picture(
            f"{incident.rule} · incident {incident.id} · {self.job_name}",
            self.engine.history,
            incident.onset_step,
            incident.actions,
        )
        self.charts.request(incident.id, shown, incident_dir(self.state_dir, incident.id))

    def safely(self, what: str, write: Callable[..., object], *args: Any, **kwargs: Any) -> None:
        """A write to the state dir that may fail (a full or read-only disk) without costing
        detection or the stop: said once per kind at ERROR, then again when it works."""
        try:
            write(*args, **kwargs)
        except (OSError, sqlite3.Error) as error:
            first = not self.state_problems
            if what not in self.state_problems:
                log.error(
                    "cannot write %s in %s: %s (detection goes on)", what, self.state_dir, error
                )
            self.state_problems[what] = str(error)
            if first:  # its own incident, so that a person hears of it (from memory if need be)
                self.handle([self._state_alert(f"cannot write {what}: {error}")])
            return
        if self.state_problems.pop(what, None) is not None:
            log.info("writing %s works again", what)
            if not self.state_problems:
                self.handle([self._state_alert("the state dir takes writes again", resolves=True)])

    def _state_alert(self, problem: str, *, resolves: bool = False) -> Alert:
        message = (
            problem
            if resolves
            else f"state dir {self.state_dir}: {problem}; detection and the stop go on,"
            " notices are sent from memory, and what sentinel knows may not survive its restart"
        )
        return Alert(
            rule=STATE_DIR_RULE,
            severity=Severity.WARNING,
            message=message,
            time=time.time(),
            source=SENTINEL_SOURCE,
            step=self.engine.position.current_step,
            resolves=resolves,
        )

    def _recent(self, incident: Incident) -> dict[str, list[Sample]]:
        return dict(self.engine.recent(incident.onset_step))

    def _announce(self, event: IncidentEvent, incident: Incident, alert: Alert) -> None:
        self._notify(_KINDS[event], incident, alert, time.time())

    def _notify(
        self,
        kind: NoticeKind,
        incident: Incident,
        alert: Alert,
        now: float,
        *,
        force: bool = False,
    ) -> None:
        if not self.dispatcher.routes or incident.id in self._quiet:
            return  # no target (spare the report each notice carries), or another node spoke
        notice = incident_notice(
            kind,
            incident,
            alert,
            recent=self._recent(incident),
            cost=incident_cost(incident, self.engine.facts, now),
            # A repeat is news of now; any other notice is as of its alert.
            now=now if kind is NoticeKind.REPEAT else None,
            attachments=incident_files(self.state_dir, incident.id, charted=self.charts.enabled),
        )
        self.safely(
            "the outbox", self.dispatcher.dispatch, notice, incident.rules, now, force=force
        )


_KINDS = {
    IncidentEvent.OPENED: NoticeKind.OPENED,
    IncidentEvent.ESCALATED: NoticeKind.ESCALATED,
    IncidentEvent.RESOLVED: NoticeKind.RESOLVED,
}
_LEVELS = {
    Severity.INFO: logging.INFO,
    Severity.WARNING: logging.WARNING,
    Severity.CRITICAL: logging.ERROR,
}
