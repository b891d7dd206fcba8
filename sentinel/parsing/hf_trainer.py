"""Hugging Face Trainer output: its printed log dicts and its ``trainer_state.json``.

transformers 4.x prints ``{'loss': 2.3141, 'grad_norm': nan, 'epoch': 0.02}``
(bare ``nan``/``inf``, which ``ast.literal_eval`` rejects); 5.x prints every
value as a string, ``{'loss': '2.3141', 'grad_norm': 'nan'}``. Both are read
with one regex over the ``'key': value`` pairs. The lines carry no step: the
engine takes it from the progress bar.
"""

from __future__ import annotations

import json
import re

from sentinel.model.records import Sample
from sentinel.parsing import fields
from sentinel.parsing.fields import samples_from_mapping
from sentinel.parsing.values import Garbled, as_step

# One value: a quoted string (5.x), a call such as tensor(2.3, device='cuda:0'),
# a list, or a bare token (2.3, nan, -inf, True, None).
_VALUE = (
    r"""(?:'(?P<single>[^'\\]*)'|"(?P<double>[^"\\]*)"|(?P<call>[\w.]*\([^()]*\))"""
    r"""|\[[^\[\]]*\]|(?P<bare>[^,{}\[\]()'"]+))"""
)
_PAIR = re.compile(r"""'(?P<key>[^'\\]*)'\s*:\s*""" + _VALUE)
# The same pair without group names, to check a whole line's shape in one match.
_PAIR_SHAPE = re.sub(r"\?P<\w+>", "", _PAIR.pattern)
_DICT_LINE = re.compile(r"\{\s*(?:" + _PAIR_SHAPE + r"\s*(?:,\s*" + _PAIR_SHAPE + r"\s*)*,?)?\s*\}")
_CALL_FIRST_ARG = re.compile(r"\(\s*([^,()]*)")

#: Names that only an end-of-run summary carries (the HF Trainer's, TRL's: ``train_runtime``
#: and its rates, ``total_flos``; ``test_``/``predict_`` for evaluate and predict). A record
#: with one of them is a summary, not a step: its ``train_loss`` is the mean over the run and
#: its rates are the run's averages.
SUMMARY_NAMES = frozenset(
    {
        "train_runtime",
        "train_samples_per_second",
        "train_steps_per_second",
        "total_flos",
        "test_runtime",
        "predict_runtime",
    }
)

#: Fields of ``trainer_state.json`` that ``trainer_state_info`` reports when present.
STATE_INFO_KEYS: tuple[str, ...] = (
    "max_steps",
    "logging_steps",
    "train_batch_size",
    "global_step",
    "save_steps",
    "eval_steps",
    "num_train_epochs",
)


def _value_of(match: re.Match[str]) -> str | None:
    """The text of one pair's value, for ``samples_from_mapping`` to read as a number."""
    single, double, call, bare = match.group("single", "double", "call", "bare")
    if single is not None:
        return single
    if double is not None:
        return double
    if bare is not None:
        return bare.strip()
    if call is not None and call.startswith(("tensor(", "torch.tensor(")):
        first = _CALL_FIRST_ARG.search(call)
        return first.group(1) if first else None
    return None


def parse_hf_dict(text: str) -> list[Sample] | None:
    """Samples of one printed HF Trainer log dict, with step None.

    None when the line is not a single-quoted dict; ``Garbled`` when it starts
    like one but is cut off or malformed. In the end-of-training summary
    (it has ``train_runtime``) ``train_loss`` is the run's mean loss, so it
    keeps its own name rather than becoming ``loss``.
    """
    stripped = text.strip()
    if stripped[:1] != "{" or stripped[1:].lstrip()[:1] != "'":
        return None
    fields = _fields_as_json(stripped)
    if fields is None:
        if _DICT_LINE.fullmatch(stripped) is None:
            raise Garbled(f"not a valid HF log dict: {stripped[:80]!r}")
        fields = {match.group("key"): _value_of(match) for match in _PAIR.finditer(stripped)}
    samples = samples_from_mapping(fields)
    if "train_runtime" in fields:
        samples = [
            sample._replace(name="train_loss") if sample.name == "loss" else sample
            for sample in samples
        ]
    return samples


def _fields_as_json(stripped: str) -> dict[str, object] | None:
    """The common dict read as JSON with its quotes swapped; None where the regexes must decide.

    A fast path: decoding is several times cheaper than the regexes. It is taken only
    where it reads exactly what they read: no double quote or backslash in the line
    (so every quote is a single-quoted key or string), and every value a string (5.x)
    or a float (4.x). Anything else (bare ``nan``, ``True``, ints, lists, ``tensor(...)``,
    nesting, a cut-off line) goes to the regexes, which also tell garbled lines apart.
    """
    if '"' in stripped or "\\" in stripped:
        return None
    try:
        decoded = fields.loads(stripped.replace("'", '"'))
    except (ValueError, RecursionError):
        return None
    if type(decoded) is not dict:
        return None
    for value in decoded.values():
        if type(value) is not str and type(value) is not float:
            return None
    return decoded


def _load_state(text: str) -> dict[str, object]:
    """The decoded ``trainer_state.json``; ``Garbled`` if it is not a JSON object."""
    try:
        state = json.loads(text)  # the stdlib accepts the bare NaN/Infinity HF writes
    except (ValueError, RecursionError) as error:
        raise Garbled(f"trainer_state.json is not valid JSON: {error}") from error
    if not isinstance(state, dict):
        raise Garbled("trainer_state.json is not a JSON object")
    return state


def read_trainer_state_entries(text: str) -> list[list[Sample]]:
    """The samples of each entry of a ``trainer_state.json``'s ``log_history``, one list an
    entry (what the Trainer logged at once: a step's training values, an evaluation), at
    its step, in order. The end-of-run summary (an entry with one of ``SUMMARY_NAMES``) is
    no step and is left out: its ``train_loss`` is the run's mean.

    Raises ``Garbled`` when the text is not a JSON object or ``log_history``
    is not a list.
    """
    history = _load_state(text).get("log_history", [])
    if not isinstance(history, list):
        raise Garbled("trainer_state.json: log_history is not a list")
    return [
        samples_from_mapping(entry)
        for entry in history
        if isinstance(entry, dict) and SUMMARY_NAMES.isdisjoint(entry)
    ]


def read_trainer_state(text: str) -> list[Sample]:
    """The samples of a ``trainer_state.json``'s ``log_history`` (``read_trainer_state_entries``,
    one after another), each at its entry's step."""
    return [sample for entry in read_trainer_state_entries(text) for sample in entry]


def trainer_state_info(text: str) -> dict[str, int]:
    """The run's shape from a ``trainer_state.json``: ``max_steps``, ``logging_steps``,
    ``train_batch_size`` (and ``global_step``, ``save_steps``, ``eval_steps``,
    ``num_train_epochs``) where present as whole numbers.

    Raises ``Garbled`` when the text is not a JSON object.
    """
    state = _load_state(text)
    info: dict[str, int] = {}
    for key in STATE_INFO_KEYS:
        value = as_step(state.get(key)) if type(state.get(key)) is not bool else None
        if value is not None:
            info[key] = value
    return info
