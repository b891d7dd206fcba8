"""Secrets sentinel knows of, and the masking that keeps them out of every line it writes.

Notification URLs carry tokens. Whoever learns a secret registers it here;
``mask`` replaces each known secret in a text, and ``MaskingFilter`` does so
for log records (apprise's own, which log webhook URLs at DEBUG, and sentinel's).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

MASK = "****"

_lock = threading.Lock()
_known: list[str] = []


def register(secrets: Iterable[str]) -> None:
    """Remember ``secrets`` (fragments under 3 characters are ignored: they would mask words)."""
    global _known
    with _lock:
        found = set(_known).union(secret for secret in secrets if len(secret) >= 3)
        _known = sorted(found, key=len, reverse=True)  # longest first: no half-masked token


def mask(text: str) -> str:
    """``text`` with every known secret replaced by ``****``."""
    for secret in _known:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


class MaskingFilter(logging.Filter):
    """Masks known secrets in a record's message (its arguments are folded in first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _known:
            text = record.getMessage()
            masked = mask(text)
            if masked != text:
                record.msg, record.args = masked, None
        return True


logging.getLogger("apprise").addFilter(MaskingFilter())
