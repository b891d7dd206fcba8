"""Text sentinel did not write (the job's output, a file's name), made safe where it is shown.

The job's own words reach people through sentinel: a crash line quoted in an alert, a
checkpoint folder's name in a listing or a log line. Whoever wrote them could have put
anything there: escape sequences that redraw a terminal, a newline that forges the next
log line. ``printable`` shows such characters as escapes (``\\x1b``, ``\\n``) instead of
sending them raw.

Where the text is rendered as markup it could also speak the markup: ``[Click to
re-auth](http://evil.example/phish)`` is a live link in Markdown, ``@channel`` pings a
whole Mattermost or Slack channel. ``defang_urls`` shows a URL without making it one
(``hxxp://evil[.]example/phish``: no renderer or mail client links it, a person still
reads it), ``markdown_literal`` escapes what makes links, images and HTML, and
``no_mentions`` breaks ``@channel``, ``@alice`` and Slack's ``<!here>`` with an invisible
zero-width space, so they read the same and notify nobody.

The records that keep the text as it was (``alerts.jsonl``, JSON webhooks, the job's
passthrough) never come here.
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any

#: Named escapes for the controls people know by name; the others are ``\xNN`` or ``\uNNNN``.
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


#: Controls (C0, DEL, C1) and the invisible format characters that reorder or hide text
#: (bidi embeddings, overrides and isolates, zero-width marks, line and paragraph
#: separators, the byte-order mark, tag characters): what must not reach a terminal raw.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064"
    "\u2066-\u206f\ufeff\ufff9-\ufffb\U000e0001\U000e0020-\U000e007f]"
)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with its control and invisible format characters shown as escapes
    (ESC as ``\\x1b``, a newline as ``\\n``): one line, nothing a terminal acts on."""
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


class PrintableFilter(logging.Filter):
    """Escapes control characters in a record's message (never drops a record): a log line
    that names a path or quotes the job stays one line, with no escape sequence in it.

    sentinel's own messages are one line each; a traceback (``exc_text``) keeps its lines.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler's own error path
            return True
        if _UNSAFE.search(text):
            record.msg, record.args = printable(text), None
        return True


#: A URL that renderers and mail clients would make a link of: a web or ftp scheme, or a
#: host that starts with ``www.``; the host (what the defanging changes) is group ``host``.
_LINKABLE = re.compile(
    r"(?P<scheme>\b(?:https?|ftps?)://)(?P<host>[^\s/?#\\<>\[\]()\"'`]+)"
    r"|(?<![\w.@/-])(?P<www>www\.[^\s/?#\\<>\[\]()\"'`]+)",
    re.IGNORECASE,
)


def _defang(match: re.Match[str]) -> str:
    if match.group("www") is not None:
        return match.group("www").replace(".", "[.]")
    scheme = match.group("scheme")
    if scheme[:4].lower() == "http":
        scheme = scheme[0] + "xx" + scheme[3:]  # http -> hxxp, as security notices write it
    else:
        scheme = scheme[0] + "x" + scheme[2:]  # ftp -> fxp
    return scheme + match.group("host").replace(".", "[.]")


def defang_urls(text: str) -> str:
    """``text`` with each URL shown but not linkable: ``http://evil.example/phish`` becomes
    ``hxxp://evil[.]example/phish``, ``www.evil.example`` becomes ``www[.]evil[.]example``."""
    return _LINKABLE.sub(_defang, text) if "://" in text or "www." in text.lower() else text


#: What makes Markdown a link, an image or HTML: brackets and angle brackets, and a
#: backslash that would escape the next character (one before ASCII punctuation, or last:
#: CommonMark reads a backslash before anything else as itself, so ``\\x1b`` stays).
_MARKDOWN_ACTIVE = re.compile(r"[\[\]<>]|\\(?=[!-/:-@\[-`{-~]|$)")


def markdown_literal(text: str) -> str:
    """``text`` as Markdown that renders as the text itself as far as links go: no link,
    image, autolink or HTML (``[``, ``]``, ``<``, ``>`` and an escaping ``\\`` escaped),
    no heading."""
    text = _MARKDOWN_ACTIVE.sub(lambda match: "\\" + match.group(), text)
    return "\\" + text if text.startswith("#") else text


#: ``@word`` (Mattermost's and Slack's mentions: @channel, @all, @here, @alice) and Slack's
#: ``<!channel>``, ``<@U123>``, ``<#C123>``.
_MENTION = re.compile(r"(?<![\w@])@(?=[\w.-])|(?<=<)(?=[!@#])")
ZERO_WIDTH_SPACE = "\u200b"


def no_mentions(text: str) -> str:
    """``text`` with every mention broken by a zero-width space after its ``@`` (or its
    ``<``): it reads the same and notifies nobody."""
    if "@" not in text and "<" not in text:
        return text
    return _MENTION.sub(lambda match: match.group() + ZERO_WIDTH_SPACE, text)


def clipped(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters for a message that quotes it, the word the cut
    goes through left out whole (then "..."). A token that straddled a plain cut lost the
    length its shape needs to be masked where the message is shown, and went out in the
    clear to every target (``ghp_A1b2C3d4E5f``)."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    if not text[limit].isspace():
        words = cut.split()
        cut = cut[: len(cut) - len(words[-1])] if words else ""
    return cut.rstrip() + "..."


def json_value(text: str | bytes) -> Any:
    """``json.loads`` of a file sentinel did not write, or that may have been edited by hand:
    JSON nested deeper than the interpreter's recursion limit is a ``ValueError`` like any
    other JSON that does not parse, not a ``RecursionError`` past every reader's ``except``."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deep (past the recursion limit)") from None


def finite_number(value: Any) -> float | None:
    """A number a record read back holds, as a float; None where it holds something else (a
    time that is text, a bool) or a number no time or count is (NaN, infinity: no JSON)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
