"""Text sentinel did not write (the job's output, a file's name), made safe where it is shown.

The job's own words reach people through sentinel: a crash line quoted in an alert, a
checkpoint folder's name in a listing or a log line. Whoever wrote them could have put
anything there: escape sequences that redraw a terminal, a newline that forges the next
log line. ``printable`` shows such characters as escapes (``\\x1b``, ``\\n``) instead of
sending them raw. The records that keep the text as it was (``alerts.jsonl``, JSON
webhooks, the job's passthrough) never come here.
"""

from __future__ import annotations

import re

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
