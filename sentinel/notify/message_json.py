"""A message for a JSON webhook: the lead notice's alert in the public schema, plus what the
message is about (its key, incident, job, diagnosis, actions and every notice).

The text is as the job wrote it (a machine reads it: no markup, no escapes), except for
the credentials in it (``sentinel.model.secrets.mask_tokens``)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from sentinel.model.records import json_number
from sentinel.model.secrets import mask_tokens_data
from sentinel.notify.message_story import Story
from sentinel.notify.notices import Envelope

_SCHEMA_KEYS = ("rule", "severity", "step", "metric", "value", "message", "time", "source")


def _strict(value: Any) -> Any:
    """``value`` with NaN and infinities spelled as strings, as strict JSON wants."""
    if isinstance(value, float) and not math.isfinite(value):
        return json_number(value)
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(item) for item in value]
    return value


def json_body(envelope: Envelope, stories: Sequence[Story]) -> str:
    """The lead notice's alert in the public schema, plus what the message is about."""
    lead = stories[0].lead if stories else None
    alert = dict(lead.alert) if lead is not None else {"severity": str(envelope.severity)}
    body: dict[str, Any] = {key: alert.get(key) for key in _SCHEMA_KEYS}
    body.update({key: value for key, value in alert.items() if key not in body})
    body.update(
        key=envelope.key,
        incident=lead.incident_id if lead is not None else None,
        kind=str(lead.kind) if lead is not None else None,
        job=envelope.job.to_json(),
        diagnosis=list(stories[0].diagnosis) if stories else [],
        sparkline=stories[0].sparkline if stories else "",
        actions=list(stories[0].actions) if stories else [],
        notices=[
            {
                "kind": str(notice.kind),
                "incident": notice.incident_id,
                "rule": notice.rule,
                "severity": str(notice.severity),
                "alert": notice.alert,
            }
            for notice in envelope.notices
        ],
        folded={rule: count for rule, count in sorted(envelope.folded.items()) if count > 0},
    )
    # The job's text stays as it was (a machine reads it), but for the credentials in it.
    return json.dumps(_strict(mask_tokens_data(body)), ensure_ascii=False)
