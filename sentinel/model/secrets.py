"""Secrets sentinel knows of, and the masking that keeps them out of every line it writes.

Notification URLs carry tokens. Whoever learns a secret registers it here
(``load_settings`` registers every URL of the settings and its fragments);
``mask`` replaces each known secret in a text, ``MaskingFilter`` does so for log
records (apprise's own, which log webhook URLs at DEBUG, urllib3's, which log
request paths, and sentinel's), and ``install_excepthooks`` for tracebacks that
nothing caught.

A URL's secrets are found here too: ``url_secrets`` and ``mask_url`` for apprise
notification URLs (apprise's own privacy form tells the tokens apart),
``heartbeat_secrets`` and ``mask_heartbeat_url`` for plain http(s) pings. apprise
(~17 MiB) is imported only when a URL has to be read, so settings without
notification targets never load it.

Masking runs on every log record, so it stays cheap: nothing at all while no
secret is known, and one substring search per secret otherwise.

The job's own output holds secrets sentinel was never told of: a crash line that quotes
an ``hf_...`` token, a ``WANDB_API_KEY=...``, an AWS key. ``mask_tokens`` masks the
common shapes of such credentials (keeping the prefix that names the kind) wherever
sentinel renders the job's text for people: every notification and the reports.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import traceback
from collections.abc import Iterable
from types import TracebackType
from typing import Any, TextIO
from urllib.parse import parse_qsl, quote, urlsplit

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


#: Credential shapes a job may print; group ``keep`` (the prefix that names the kind, or
#: the ``NAME=`` before a value) stays, the rest becomes ``****``.
_TOKEN_SHAPES = tuple(
    re.compile(pattern)
    for pattern in (
        r"(?P<keep>\bhf_)[A-Za-z0-9]{20,}",  # Hugging Face
        r"(?P<keep>\bxox[abeoprs]-)[A-Za-z0-9-]{10,}",  # Slack bot, user, app-level...
        r"(?P<keep>\bxapp-)[A-Za-z0-9-]{10,}",  # Slack app-level
        r"(?P<keep>\bgh[pousr]_)[A-Za-z0-9]{20,}",  # GitHub
        r"(?P<keep>\bgithub_pat_)[A-Za-z0-9_]{20,}",  # GitHub fine-grained
        r"(?P<keep>\bglpat-)[A-Za-z0-9_-]{16,}",  # GitLab
        r"(?P<keep>\bsk-)[A-Za-z0-9_-]{16,}",  # OpenAI, Anthropic (sk-ant-...), sk-proj-...
        r"(?P<keep>\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA))[A-Z0-9]{16}\b",
        r"(?P<keep>\bAIza)[A-Za-z0-9_-]{30,}",  # Google API key
        r"(?P<keep>\beyJ)[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JWT
        r"(?P<keep>(?i:\bbearer)\s+)[A-Za-z0-9._~+/=-]{12,}",
        # The repeats are bounded: unbounded, a long run of name characters (a job's line of
        # 12,000 "a1-") was tried from each of its starts to its end, seconds a line.
        r"(?P<keep>[a-z][a-z0-9+.-]{0,31}://[^\s/:@]+:)[^\s/@]+(?=@)",  # user:password@ in a URL
        # NAME=value where NAME ends in a word for a secret (HF_TOKEN=, WANDB_API_KEY=,
        # password:), not in a longer word (tokens_per_sec=, max_token_len=).
        r"(?P<keep>(?i:\b(?:[a-z0-9]+[_-]){0,8}(?:token|secret|password|passwd|pwd|api[_-]?key"
        r"|access[_-]?key|private[_-]?key|credentials?|auth)\b)\s*[=:]\s*[\"']?)"
        r"[^\s\"',;]{4,}",
    )
)


def mask_tokens(text: str) -> str:
    """``text`` with known secrets and credential-shaped words masked (``hf_****``,
    ``WANDB_API_KEY=****``): for the job's words on their way to people."""
    text = mask(text)
    for shape in _TOKEN_SHAPES:
        text = shape.sub(lambda match: match.group("keep") + MASK, text)
    return text


def mask_tokens_data(value: Any) -> Any:
    """A copy of JSON-like ``value`` with ``mask_tokens`` applied to every string in it."""
    if isinstance(value, str):
        return mask_tokens(value)
    if isinstance(value, dict):
        return {mask_tokens_data(key): mask_tokens_data(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [mask_tokens_data(item) for item in value]
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


# Query parameters that name routing, not credentials, and may be shown as given.
_PLAIN_QUERY_KEYS = frozenset({"from", "to", "cc", "bcc", "smtp", "mode", "method", "format"})
#: Webhooks to any URL: a token in their path is shown by apprise's privacy form.
_GENERIC_SCHEMES = frozenset({"json", "jsons", "form", "forms", "xml", "xmls"})


def url_scheme(url: str) -> str:
    """The scheme of ``url`` in lower case, or "unknown" when it has none that is valid."""
    scheme = url.partition("://")[0].lower()
    return scheme if re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme) else "unknown"


def apprise_plugin(url: str, **options: Any) -> Any:
    """apprise's plugin for ``url`` (None when apprise knows no such URL).

    apprise's own log of the URL is dropped, since its secrets may not be known
    yet (this is how they are found). apprise is imported here, on first use.
    """
    import apprise

    thread = threading.get_ident()

    def other_threads(record: logging.LogRecord) -> bool:
        return record.thread != thread

    apprise_log = logging.getLogger("apprise")
    apprise_log.addFilter(other_threads)
    try:
        return apprise.Apprise.instantiate(url, **options)
    finally:
        apprise_log.removeFilter(other_threads)


def _tokens(url: str) -> set[str]:
    return {token for token in re.split(r"[/:@?&=#]+", url) if token}


def url_secrets(url: str) -> list[str]:
    """The fragments of apprise URL ``url`` that must never be shown, longest first."""
    parts = urlsplit(url)
    found = {value for key, value in parse_qsl(parts.query) if key not in _PLAIN_QUERY_KEYS}
    if parts.password:
        found.add(parts.password)
    plugin = apprise_plugin(url)
    if plugin is not None:
        found |= _tokens(plugin.url(privacy=False)) - _tokens(plugin.url(privacy=True))
        found |= _path_tokens(url)
    else:  # nothing tells which part of an unknown URL is a token
        found |= _tokens(parts.path) | {parts.username or ""}
    found = {secret for secret in found if len(secret) >= 3}
    found |= {quote(secret, safe="") for secret in found}
    return sorted(found, key=len, reverse=True)


def _path_tokens(url: str) -> set[str]:
    """Token-like path segments of a generic webhook URL, which apprise shows as they are."""
    if url_scheme(url) not in _GENERIC_SCHEMES:
        return set()
    return {part for part in urlsplit(url).path.split("/") if looks_like_token(part)}


def mask_url(url: str) -> str:
    """Apprise URL ``url`` with its credentials and tokens masked, readable otherwise.

    Host and path come from apprise's own privacy form; query values are kept
    only for routing keys (``from``, ``to``, ``smtp``, ...). A URL apprise does
    not know is reduced to its scheme, since nothing tells which part is secret.
    """
    plugin = apprise_plugin(url)
    if plugin is None:
        return f"{url_scheme(url)}://{MASK}"
    masked = str(plugin.url(privacy=True)).partition("?")[0]
    for token in sorted(_path_tokens(url), key=len, reverse=True):
        masked = masked.replace(f"/{token}", f"/{MASK}")
    query = [
        f"{key}={value if key in _PLAIN_QUERY_KEYS else MASK}"
        for key, value in parse_qsl(urlsplit(url).query)
    ]
    return f"{masked}?{'&'.join(query)}" if query else masked


def scrub(text: str, url: str) -> str:
    """``text`` with apprise URL ``url`` and each of its secrets replaced by masked forms."""
    text = text.replace(url, mask_url(url))
    for secret in url_secrets(url):
        text = text.replace(secret, MASK)
    return text


def validate_url(url: str) -> str | None:
    """None if apprise accepts ``url``, else why not (secrets masked)."""
    try:
        plugin = apprise_plugin(url, suppress_exceptions=False)
    except Exception as exc:  # apprise raises TypeError and friends for bad arguments
        return scrub(f"invalid notification URL {mask_url(url)}: {exc}", url)
    if plugin is None:
        return f"unsupported or malformed notification URL {mask_url(url)}"
    try:
        urlsplit(url).port  # noqa: B018 (raises for a port past 65535, which apprise keeps)
    except ValueError as exc:
        return f"invalid notification URL {mask_url(url)}: {exc}"
    return None


def heartbeat_secrets(url: str) -> list[str]:
    """The fragments of an http(s) heartbeat ``url`` that must never be shown, longest first."""
    parts = urlsplit(url)
    found = {value for _key, value in parse_qsl(parts.query)}
    found |= {parts.username or "", parts.password or ""}
    found |= {segment for segment in parts.path.split("/") if looks_like_token(segment)}
    found = {secret for secret in found if len(secret) >= 3}
    found |= {quote(secret, safe="") for secret in found}
    return sorted(found, key=len, reverse=True)


def mask_heartbeat_url(url: str) -> str:
    """``url`` with credentials, query values and token-like path segments masked."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    segments = parts.path.split("/")
    path = "/".join(MASK if looks_like_token(s) else s for s in segments)
    query = "&".join(f"{key}={MASK}" for key, _value in parse_qsl(parts.query))
    return f"{parts.scheme}://{host}{path}" + (f"?{query}" if query else "")


logging.getLogger("apprise").addFilter(MaskingFilter())
