"""JSON lines: one JSON object per line, its numeric fields become samples.

``{"step": 120, "loss": 2.31, "lr": 3e-4}`` gives ``loss`` and ``lr`` at step
120. Numbers and numeric strings ("nan", "2.5") are metrics; booleans, nested
objects and other strings are ignored. ``step``/``global_step``/``iteration``/
``iter`` give the step, ``time``/``timestamp``/``ts``/``wall_time`` the time.
"""

from __future__ import annotations

from sentinel.model.records import Sample
from sentinel.parsing import fields, hf_trainer
from sentinel.parsing.fields import samples_from_mapping
from sentinel.parsing.values import Garbled


def _looks_like_json_object(stripped: str) -> bool:
    """Whether a line starting with ``{`` was meant to be a JSON object (so broken = garbled)."""
    rest = stripped[1:].lstrip()
    return not rest or rest[0] in "\"'}"


def parse_jsonl(text: str) -> list[Sample] | None:
    """Samples of one JSON-object line; an HF dict line is handed to ``hf_trainer``.

    None for JSON arrays and scalars and for lines that do not start with
    ``{``; ``Garbled`` for a line that starts like a JSON object but does not
    decode (a truncated write).
    """
    stripped = text.strip()
    if stripped[:1] != "{":
        return None
    if stripped[1:].lstrip()[:1] == "'":
        return _parse_hf_or_garbled(stripped)
    try:
        decoded = fields.loads(stripped)
    except ValueError:  # JSONDecodeError, and RecursionError's cousins are not expected
        decoded = None
    except RecursionError as error:
        raise Garbled(f"JSON nested too deeply: {stripped[:80]!r}") from error
    if isinstance(decoded, dict):
        return samples_from_mapping(decoded)
    if decoded is not None:
        return None
    return _parse_hf_or_garbled(stripped)


def _parse_hf_or_garbled(stripped: str) -> list[Sample] | None:
    """A ``{`` line that is not JSON: an HF log dict, garbled JSON, or not ours."""
    found = hf_trainer.parse_hf_dict(stripped)
    if found is not None:
        return found
    if _looks_like_json_object(stripped):
        raise Garbled(f"not a valid JSON object: {stripped[:80]!r}")
    return None
