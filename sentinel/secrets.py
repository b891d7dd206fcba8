"""Secrets sentinel knows of, and the masking that keeps them out of every line it writes.

Notification URLs carry tokens. Whoever learns a secret registers it here
(``load_settings`` registers every URL of the settings and its fragments);
``mask`` replaces each known secret in a text, ``MaskingFilter`` does so for log
records (apprise's own, which log webhook URLs at DEBUG, urllib3's, which log
request paths, and sentinel's), and ``install_excepthooks`` for tracebacks that
nothing caught.

Masking runs on every log record, so it stays cheap: nothing at all while no
secret is known, and one substring search per secret otherwise.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from collections.abc import Iterable
from types import TracebackType
from typing import Any, TextIO

MASK = "****"

_lock = threading.Lock()
# Replaced, never mutated, so readers need no lock.
_known: tuple[str, ...] = ()


#: A URL path segment this long, or holding a digit, is taken for a token (webhook and
#: heartbeat ids, UUIDs, ping keys); words such as "api", "hooks" or "ping" are not.
TOKEN_MIN_CHARS = 16


def looks_like_token(segment: str) -> bool:
    """Whether a URL path segment is likely a credential rather than a word."""
    return len(segment) >= TOKEN_MIN_CHARS or any(char.isdigit() for char in segment)


def register(secrets: Iterable[str]) -> None:
    """Remember ``secrets`` (fragments under 3 characters are ignored: they would mask words)."""
    global _known
    with _lock:
        found = set(_known).union(secret for secret in secrets if len(secret) >= 3)
        # Longest first, so a token that contains a shorter secret is masked whole.
        _known = tuple(sorted(found, key=len, reverse=True))


def known() -> bool:
    """Whether any secret is registered."""
    return bool(_known)


def mask(text: str) -> str:
    """``text`` with every known secret replaced by ``****``."""
    for secret in _known:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def mask_data(value: Any) -> Any:
    """A copy of JSON-like ``value`` with every string in it masked (keys included)."""
    if not _known:
        return value
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, dict):
        return {mask_data(key): mask_data(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [mask_data(item) for item in value]
    return value


class MaskingFilter(logging.Filter):
    """Masks known secrets in a record's message, traceback and stack (never drops a record).

    On a handler it applies to the records of every logger that reaches the handler.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not _known:
            return True
        try:
            text = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler's own error path
            return True
        masked = mask(text)
        if masked != text:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            formatted = logging.Formatter().formatException(record.exc_info)
            masked = mask(formatted)
            if masked != formatted:
                # Set here, so the handler's formatter uses the masked text as its cache.
                record.exc_text = masked
        elif record.exc_text:  # formatted by a handler that came first
            record.exc_text = mask(record.exc_text)
        if record.stack_info:
            record.stack_info = mask(record.stack_info)
        return True


def install(target: logging.Handler | logging.Logger) -> None:
    """Put one ``MaskingFilter`` on ``target`` (a handler covers every logger it serves)."""
    if not any(isinstance(existing, MaskingFilter) for existing in target.filters):
        target.addFilter(MaskingFilter())


def masked_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as Python prints it, with known secrets masked."""
    return mask("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def print_exception(exc: BaseException, file: TextIO | None = None) -> None:
    """Print ``exc``'s traceback masked to ``file`` (default stderr)."""
    print(masked_traceback(exc), end="", file=file if file is not None else sys.stderr)


def _excepthook(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    print(mask(text), end="", file=sys.stderr)


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:  # as threading's own hook: a thread's exit is no error
        return
    name = args.thread.name if args.thread is not None else threading.get_ident()
    text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
    print(mask(f"Exception in thread {name}:\n{text}"), end="", file=sys.stderr)


def install_excepthooks() -> None:
    """Print tracebacks that nothing caught (main thread or any other) with secrets masked."""
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook


logging.getLogger("apprise").addFilter(MaskingFilter())
