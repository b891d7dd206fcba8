"""``LineParser``: finds each line's format (user regexes first), counts what it cannot read."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from sentinel.model.records import Sample
from sentinel.parsing import fields, formats, hf_steps, hf_trainer, jsonl, ranks, tqdm
from sentinel.parsing.files import FileReader
from sentinel.parsing.hf_blocks import HfPiece
from sentinel.parsing.keyvalue import find_pairs
from sentinel.parsing.regex import UserRegex, compile_regexes, parse_with_regexes
from sentinel.parsing.registry import PARSERS
from sentinel.parsing.values import RECORD_STEP_KEYS, Garbled, ParseFn

logger = logging.getLogger(__name__)

#: What a human-written metric line cannot lack: a digit, or a non-finite value spelled out
#: (``loss: nan``, ``Loss is Infinity``, ``avg_rd: nan | cur_rd: nan``).
_NUMERIC = re.compile(r"\d|nan|inf", re.IGNORECASE)
#: Typographic single quotes, as straight ones.
_STRAIGHT_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'"})
#: A JSON object's ``"epoch"`` that is a JSON integer (not ``0.25``, not ``1.0``).
_JSON_EPOCH = re.compile(r'"epoch"\s*:\s*(\d{1,18})\s*[,}]')


@dataclass(slots=True)
class ParseStats:
    """Counts of lines by outcome; ``lines == parsed + garbled + unparsed``.

    ``errors`` counts lines on which a parser raised something other than
    ``Garbled`` (a bug, logged with its traceback); they are also in ``garbled``.
    """

    lines: int = 0
    parsed: int = 0
    garbled: int = 0
    unparsed: int = 0
    errors: int = 0


class LineParser:
    """Auto-detects each line's format and turns it into samples; counts what it could not read."""

    def __init__(
        self,
        *,
        regexes: Sequence[str] = (),
        enabled: Sequence[str] | None = None,
        logging_steps: int | None = None,
    ) -> None:
        """``logging_steps``: the run's ``[parsers] logging_steps``; where it is set, the
        engine counts the steps of HF dicts and the bars teach none (``hf_steps``)."""
        names = list(PARSERS) if enabled is None else list(enabled)
        unknown = [name for name in names if name not in PARSERS]
        if unknown:
            raise ValueError(
                f"unknown parser(s) {', '.join(map(repr, unknown))}; known: {', '.join(PARSERS)}"
            )
        self.stats = ParseStats()
        self._regexes: tuple[UserRegex, ...] = compile_regexes(regexes)
        # "{" lines go to JSON (which falls back to the HF dict form) or to HF alone.
        self._brace: ParseFn | None = None
        if "jsonl" in names:
            self._brace = jsonl.parse_jsonl
        elif "hf_trainer" in names:
            self._brace = hf_trainer.parse_hf_dict
        self._human: tuple[ParseFn, ...] = tuple(
            PARSERS[name] for name in ("rich_bar", "tqdm", "keyvalue") if name in names
        )
        # User regexes come first, so with any the fast path is off.
        self._brace_fast = self._brace is not None and not self._regexes
        self._fast_loads = fields.fast_loads if self._brace is jsonl.parse_jsonl else None
        #: Whether JSON lines may be read many at once (``parsers.columns``): only when
        #: they read as JSON, with no user regex in front.
        self.reads_json_blocks = self._brace is jsonl.parse_jsonl and not self._regexes
        self._hf_blocks = (
            self._brace is not None and not self._regexes and tqdm.parse_tqdm in self._human
        )
        #: Whether a bar with text glued after it is read as the two lines it was.
        self._splits_glued = tqdm.parse_tqdm in self._human
        self._hf = hf_steps.HfSteps(bars_teach=logging_steps is None)
        self._formats = formats.Formats() if "keyvalue" in names else None
        #: The lines so far of a dict ``pprint`` spread over several (``_printed_dict``).
        self._dict_lines: list[str] | None = None
        #: The lines so far of a JSON object indented over several (``_json_block``), and
        #: how deep in it the last one left off.
        self._json_lines: list[str] | None = None
        self._json_depth = 0
        #: The hashes of the indented records read: a file rewritten whole (Chainer's
        #: ``LogReport`` replaces its ``log`` at each report) gives each once.
        self._json_seen: set[int] = set()
        self._no_step_yet = True
        #: Whether a line's leading integer ``epoch`` is its step (a loop that counts its
        #: iterations as epochs: ``epoch: 3451 loss: nan``): None until a line decides it;
        #: False for good once any line names a step (then the epoch is no step unit).
        self._epoch_steps: bool | None = None

    @property
    def reads_hf_blocks(self) -> bool:
        """Whether HF Trainer output may be read many lines at once (``parsers.hf_blocks``):
        its dicts by the brace parser and its bars by tqdm's, with no user regex in front,
        and while no steps per epoch are known from ``trainer_state.json`` (the block path
        takes a dict's step from the bars or the logging cadence, not from its epoch; what
        the bars taught gives exact steps to the lines read one by one, live above all)."""
        return self._hf_blocks and (self._hf.steps_per_epoch is None or self._hf.taught)

    def read_hf_block(
        self, piece: HfPiece, epochs: list[float] | None, training: bool
    ) -> list[int | None]:
        """The steps ``parse`` would give a piece's dicts (None: none of its own), what it
        learns from them and from the bars learned (``HfSteps.read_block``); the block
        path ``restore_hf``s what it knew before where the rules refuse the block."""
        return self._hf.read_block(piece, epochs, training)

    def hf_state(self) -> tuple[object, ...]:
        """What the HF steps know, for ``restore_hf``."""
        return self._hf.state()

    def restore_hf(self, state: tuple[object, ...]) -> None:
        self._hf.restore(state)

    def learn_trainer_state(self, text: str) -> bool:
        """Read steps per epoch from a ``trainer_state.json`` found beside the checkpoints,
        so that HF Trainer dicts get their exact step; whether it held them."""
        return self._hf.learn_trainer_state(text)

    def parse(self, text: str) -> list[Sample]:
        """The samples in one line; an empty list for plain text or a garbled line.

        An HF Trainer dict gets the step its epoch implies where that is known
        (``parsers.hf_steps``); the first metrics with no step while none was seen are
        logged once, as a notice that the log names no step.
        """
        if text[:2] == "{\u2018":
            # An HF dict pasted through an editor that curls its quotes: ``{‘loss’: 1.45}``.
            text = text.translate(_STRAIGHT_QUOTES)
        samples = self._parse_line(text)
        if "{'" in text or "%|" in text:
            samples = self._hf.process(text, samples)
        if samples and self._epoch_steps is not False:
            samples = self._epoch_as_step(samples, text)
        if self._no_step_yet and samples:
            self._check_step(samples, text)
        return samples

    def _epoch_as_step(self, samples: list[Sample], text: str) -> list[Sample]:
        """A line that names no step is read at its epoch, as long as no line of the log
        named a step: there the epoch is the loop's only counter. A human-written line that
        leads with an integer ``epoch`` (``epoch: 3451 loss: nan``); a JSON object whose
        ``epoch`` is a JSON integer and that names no batch (the ``log.txt`` of DINO, DeiT
        and MAE: ``{"train_loss": 10.38, "train_lr": 0.0, "epoch": 0}``). An HF Trainer
        dict's epoch is a fraction (``'epoch': 0.25``), and its step comes from its bars."""
        if any(sample.step is not None for sample in samples):
            self._epoch_steps = False
            return samples
        lead = text.lstrip()[:1]
        if lead == "{":
            found = _JSON_EPOCH.search(text) if '"batch' not in text else None
            if found is None:
                return samples
            step = int(found.group(1))
        else:
            first = samples[0]
            if first.name != "epoch" or not first.value.is_integer() or lead == "[":
                return samples
            step = int(first.value)
        self._epoch_steps = True
        return [sample._replace(step=step) for sample in samples]

    def _check_step(self, samples: list[Sample], text: str) -> None:
        """Log, once, metrics that arrive while no line has named a step."""
        for sample in samples:
            if sample.step is not None:
                self._no_step_yet = False
                return
        self._no_step_yet = False
        logger.warning(
            "metrics on a line that names no step (%r): they are read at the last step"
            " a progress bar showed, or at no step; a [parsers] regexes pattern with a"
            " (?P<step>...) group, or a step field in the log, gives them theirs",
            text[:120],
        )

    def _parse_line(self, text: str) -> list[Sample]:
        """``parse`` but for the step of HF dicts and the notice.

        A line with a rank prefix (``[rank1]:``, ``[default1]:``, ``1: ``) is read without
        it, its samples carrying the rank (``parsers.ranks``)."""
        if ranks.may_carry(text):
            ranked = ranks.parse_ranked(self._parse_line, text)
            if ranked is not None:
                return ranked
        stats = self.stats
        stats.lines += 1
        if self._json_lines is not None or text[-1:] == "{":
            found = self._json_block(text)
            if found is not None:
                return found
        # (Not a dict's first line of several, which ends with its first entry's comma.)
        if self._brace_fast and text[:1] == "{" and text[-1:] != ",":
            fast_loads = self._fast_loads
            if fast_loads is not None and text[1:2] != "'":
                # _parse_brace's orjson case inlined (a metrics file is all such lines):
                # a whole line that orjson decodes to an object.
                try:
                    decoded = fast_loads(text)
                except ValueError:
                    decoded = None
                if type(decoded) is dict:
                    read = fields.samples_from_mapping(decoded)
                    if read:
                        stats.parsed += 1
                    else:
                        stats.unparsed += 1
                    return read
            found = self._parse_brace(text)
            if found is not None:
                return found
        if "\r" not in text:
            glued = self._glued(text)
            if glued is None:
                return self._counted(self._parse_segment, text) or []
            segments = glued
        else:
            segments = [
                piece
                for segment in text.split("\r")
                for piece in self._glued(segment) or (segment,)
            ]
        samples: list[Sample] = []
        garbled = False
        for segment in segments:
            try:
                samples.extend(self._parse_segment(segment))
            except Garbled:
                garbled = True
            except Exception:
                self._bug(segment)
                return []
        if garbled:
            stats.garbled += 1
        elif samples:
            stats.parsed += 1
        else:
            stats.unparsed += 1
        return samples

    def _glued(self, text: str) -> list[str] | None:
        """A progress bar and the text glued after it, as two lines (``tqdm.split_glued``):
        read whole, the line is one of the two, or neither; None for any other line."""
        if not self._splits_glued or ("it/s" not in text and "s/it" not in text):
            return None
        return tqdm.split_glued(text)

    def _counted(self, parse: ParseFn, text: str) -> list[Sample] | None:
        """``parse(text)``, counted in the stats: a garbled line or a parser's bug gives
        an empty list; None (the parser declines the line) is passed on uncounted."""
        stats = self.stats
        try:
            found = parse(text)
        except Garbled:
            stats.garbled += 1
            return []
        except Exception:
            self._bug(text)
            return []
        if found:
            stats.parsed += 1
        elif found is not None:
            stats.unparsed += 1
        return found

    def _parse_brace(self, text: str) -> list[Sample] | None:
        """Fast path for a line that starts with ``{``: a JSON object or an HF dict, the
        lines of a metrics file. Counted; None sends the line down the full path.

        The full path would reach the same parser after stripping and splitting the
        line and trying other forms; here a JSON line is decoded in place, and other
        ``{`` lines go straight to the brace parser.
        """
        stats = self.stats
        if text[1:2] != "'" and self._brace is jsonl.parse_jsonl:
            try:
                decoded, end = fields.decode_prefix(text)
            except Exception:
                decoded, end = None, 0
            if type(decoded) is dict and (end == len(text) or text[end:].isspace()):
                samples = fields.samples_from_mapping(decoded)
                if samples:
                    stats.parsed += 1
                else:
                    stats.unparsed += 1
                return samples
        if "\r" in text:
            return None  # a progress bar's redraws may hide in it: split it first
        # An HF dict is what parse_jsonl would hand on to parse_hf_dict anyway.
        parse = hf_trainer.parse_hf_dict if text[1:2] == "'" else self._brace
        assert parse is not None
        return self._counted(partial(self._brace_or_dict_then_text, parse), text)

    def _brace_or_dict_then_text(self, parse: ParseFn, text: str) -> list[Sample] | None:
        """``parse(text)``, or a dict with text after it (``_dict_then_text``) where that is
        garbled."""
        try:
            return parse(text)
        except Garbled:
            found = self._dict_then_text(text.strip())
            if found is None:
                raise
            return found

    def parse_with(self, reader: FileReader, text: str) -> list[Sample]:
        """One line of a structured file, read by its file's own reader; counted like ``parse``."""
        self.stats.lines += 1
        return self._counted(reader.parse, text) or []

    def _parse_segment(self, text: str) -> list[Sample]:
        """One ``\\r``-free piece of a line; raises ``Garbled``."""
        stripped = text.strip()
        if not stripped:
            return []
        if self._regexes:
            found = parse_with_regexes(self._regexes, stripped)
            if found:
                return found
        if (self._dict_lines is not None or stripped[-1] == ",") and self._brace is not None:
            printed = self._printed_dict(stripped)
            if printed is not None:
                return printed
        if stripped[0] == "{" and self._brace is not None:
            try:
                found = self._brace(stripped)
            except Garbled:
                found = self._dict_then_text(stripped)
                if found is None:
                    raise
            if found is not None:
                return found
        if stripped[-1] == "}" and self._brace is not None:
            # A dict glued to the end of a progress bar: with stdout buffered, the HF
            # Trainer's first dict after a flush lands right after tqdm's bar text.
            brace = stripped.find("{")
            found = self._brace(stripped[brace:]) if brace > 0 else None
            if found is not None:
                before = self._parse_segment(stripped[:brace])
                if not before and found and found[0].step is None:
                    # TF Model Garden's ``train | step: 1 | ... | output: {'train_loss':
                    # 12.63}``: the text before the dict names its step.
                    step = find_pairs(stripped[:brace])[1]
                    if step is not None:
                        found = [sample._replace(step=step) for sample in found]
                return before + found
        formats = self._formats
        if formats is not None:
            # Frameworks' own lines, and those whose step or names an earlier line gave.
            found = formats.parse(stripped)
            if found is not None:
                return found
        if not _has_number(stripped):
            return []
        for parse in self._human:
            found = parse(stripped)
            if found is not None:
                return found
        return []

    def _dict_then_text(self, stripped: str) -> list[Sample] | None:
        """A dict with text after it on its line: ``{'loss': 1.51, 'grad_norm': 11140.0}
        <-- spike #2`` (a note pasted after it), a bar or a message glued on. The dict is
        read, then the rest as a line of its own; None where the line holds no whole dict
        before other text."""
        assert self._brace is not None
        if stripped[1:2] == '"':
            try:
                _, end = fields.decode_prefix(stripped)
            except ValueError:
                return None
        else:
            end = stripped.find("}") + 1  # an HF dict holds no braces within
        if end <= 1 or end >= len(stripped) or stripped[end:].lstrip(", ")[:1] in "]}":
            return None  # (a piece of a bigger structure: ``{'y': 2}]}, ...``)
        try:
            found = self._brace(stripped[:end])
        except Garbled:
            return None
        if not found:
            return None
        try:
            rest = self._parse_segment(stripped[end:])
        except Garbled:
            rest = []
        return found + rest

    def _printed_dict(self, stripped: str) -> list[Sample] | None:
        """A dict of metrics that ``pprint`` spread over lines, one entry each (the TF Object
        Detection API's ``{'Loss/total_loss': nan,`` ... ``'learning_rate': 0.079}``, any
        loop that pprints its metrics past 80 columns): its lines are held and read as one
        dict at its closing line (the held ones read as nothing). None for a line that is
        no part of one; a line that does not go on with a held dict reads the held lines
        as far as they went first."""
        held = self._dict_lines
        if held is not None:
            if stripped[0] == "'" and len(held) < _DICT_LINES:
                held.append(stripped)
                if stripped[-1] != "}":
                    return []
                self._dict_lines = None
                return self._read_dict(" ".join(held))
            self._dict_lines = None
            found = self._read_dict(" ".join(held).rstrip(",") + "}")
            return found + self._parse_segment(stripped) if found else None
        start = stripped.find("{'")
        if start < 0 or "}" in stripped:
            return None
        self._dict_lines = [stripped[start:]]
        return []

    def _json_block(self, text: str) -> list[Sample] | None:
        """A JSON object written over several lines (``json.dump(..., indent=4)``: Chainer's
        ``LogReport`` file, an array of ``{`` ... ``"iteration": 100,`` ... ``},``
        records): its lines are held and read as one object at its closing line, counted
        (the held ones read as nothing). Read only when it names its step (``iteration``,
        ``step``, ``epoch``...): a config dumped so holds no metrics. None for a line that
        is no part of one; a line that cannot go on with a held object drops it (garbled)
        and is read on its own."""
        stripped = text.strip()
        held = self._json_lines
        if held is None:
            if stripped != "{":
                return None
            self._json_lines, self._json_depth = [stripped], 1
            self.stats.unparsed += 1
            return []
        if not stripped or stripped[0] not in _JSON_STARTS or len(held) >= _JSON_LINES:
            self._json_lines = None
            self.stats.unparsed -= 1  # its opening line, counted as held: garbled after all
            self.stats.garbled += 1
            return None
        held.append(stripped)
        bare = _JSON_STRING.sub('""', stripped)
        self._json_depth += bare.count("{") + bare.count("[") - bare.count("}") - bare.count("]")
        if self._json_depth > 0:
            self.stats.unparsed += 1
            return []
        self._json_lines = None
        joined = " ".join(held).rstrip(",")
        try:
            record = fields.loads(joined)
        except (ValueError, RecursionError):
            record = None
        if not isinstance(record, dict):
            self.stats.garbled += 1
            return []
        seen = hash(joined)
        if seen in self._json_seen or _JSON_PLACES.isdisjoint(record):
            self.stats.unparsed += 1
            return []
        if len(self._json_seen) >= _JSON_SEEN:
            self._json_seen.clear()  # a file that long is not rewritten whole each time
        self._json_seen.add(seen)
        samples = fields.samples_from_mapping(record)
        self.stats.parsed += 1
        return samples

    def _read_dict(self, text: str) -> list[Sample]:
        assert self._brace is not None
        return self._brace(text) or []

    def _bug(self, text: str) -> None:
        """Count a parser's unexpected exception; log the first one's traceback."""
        self.stats.garbled += 1
        self.stats.errors += 1
        if self.stats.errors == 1:
            logger.exception("a parser failed on line %r (a bug; line skipped)", text[:200])


#: The most lines of a printed dict held before it is given up (a dict of metrics is short).
_DICT_LINES = 64
#: The most lines of an indented JSON object held before it is given up.
_JSON_LINES = 512
#: How a line inside an indented JSON object starts: a key, a closing or opening bracket,
#: a value of an array.
_JSON_STARTS = frozenset('"{}[]-0123456789tfnNI')
#: A JSON string, its brackets no structure.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
#: The most indented records remembered, to read each once.
_JSON_SEEN = 100_000
#: The keys that place a record (its step or epoch): a JSON object without one is no record.
_JSON_PLACES = frozenset({*RECORD_STEP_KEYS, "epoch"})


def _has_number(text: str) -> bool:
    """Whether the text holds a digit or a nan/inf; cheap gate before the human-line regexes."""
    return _NUMERIC.search(text) is not None
