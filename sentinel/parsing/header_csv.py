"""A metrics CSV with a header row, whatever the file is called and however its cells
are padded (Keras ``CSVLogger``'s ``training.log``, Ultralytics' ``results.csv``).

A header names at least two columns, one a known metric or step; the rows under it that
hold as many cells are read, at the step (else the epoch) column's value (a cell of
words, a timestamp or a phase, is no value; a row needs a number in a known metric or
the step). A loss logged
only in parts (Ultralytics' ``train/box_loss``, ``train/cls_loss``..., and
``val/box_loss``...) is also read whole, as the trainer sums it: ``loss`` and
``eval_loss``, beside each part; ``metrics/mAP50(B)`` and the like stay metrics of their
own, ``lr/pg0`` is the learning rate. A ``LineFormat``: it keeps the last header's columns.
(Lightning's ``metrics.csv`` is read as a whole file: ``lightning_csv``.)

The same table separated by tabs is the HF Trainer's notebook table as text (a notebook's
output saved or pasted: ``Step\tTraining Loss\tValidation Loss`` over ``500\t0.2213\t7.6976``;
``Epoch\t...`` under ``eval_strategy="epoch"``), where a name may hold spaces (``Training
Loss`` is ``training_loss``, so ``loss``; ``completions / mean_length`` is
``completions/mean_length``) and a cell may read ``No log`` (no training loss logged yet by
that step): a cell with no value, the rest of its row read. And apart by spaces, as
fastai prints its table (``epoch     train_loss  valid_loss  accuracy  time`` over
``0         0.123456    0.234567    0.923456  00:10``): a header that starts with
``epoch`` or a step column, ``#na#`` (no validation set) and the epoch's time no values;
spaCy's ``spacy train`` table (``E    #       LOSS TOK2VEC  LOSS NER  ENTS_F  ...  SCORE``,
a rule of dashes, rows ``  0     200         21.97   2046.17   37.58 ...``) at its ``#``,
the optimizer step, each ``LOSS X`` as ``loss_x``: a component's loss summed since the
last evaluation (a NaN in it stops the job; as no training loss its shape is not judged).
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.fields import samples_completions
from sentinel.parsing.keyvalue import KNOWN_KEYS, as_evaluation
from sentinel.parsing.values import RECORD_STEP_KEYS, as_float, normalise_name

_HEADER_CELL = re.compile(r"[A-Za-z_][\w/.()\-:]*")
_STEP_COLUMNS = frozenset(RECORD_STEP_KEYS)
#: In a tab-separated header, ``completions / mean_length`` and ``Training Loss``.
_SLASH = re.compile(r"\s*/\s*")
_SPACES = re.compile(r"\s+")
#: The HF Trainer's notebook table before the first training loss is logged.
_NO_LOG = "No log"
#: The first column of a table whose cells are apart by spaces: fastai's ``epoch``.
_SPACED_FIRST = frozenset({"epoch", *RECORD_STEP_KEYS})
#: fastai's missing value (no validation set), and its epoch's time (``00:10``, ``1:02:03``).
_NA = "#na#"
_CLOCK = re.compile(r"(?:\d+:)?\d+:\d{2}")
#: spaCy's ``spacy train`` table: ``E    #       LOSS TOK2VEC  LOSS NER  ENTS_F ...``, its
#: names apart by two spaces or more (one inside a name), a rule of dashes under it.
_SPACY_HEAD = re.compile(r"E\s{2,}#\s{2,}")
_SPACY_NAMES = {"E": "epoch", "#": "step"}
_WIDE_GAP = re.compile(r"\s{2,}")
_RULE = re.compile(r"-+(?:\s+-+)*")
#: A column only an RL run's table has: its episodes' reward or return.
_RL_COLUMN = re.compile(r"ep_?rew|episode_?reward|rollout/|(?:^|_)return(?:$|_)")
#: A Markdown table's rule under its header: ``-- | --``, ``|---|:---:|``.
_PIPE_RULE = re.compile(r"\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?")
#: A number standing as a word in a cell (``step 120``): no header's.
_NUMBER_WORD = re.compile(r"(?:^|\s)[-+]?\d")


class HeaderCsv:
    """Reads a header row and the rows of numbers under it."""

    __slots__ = ("_columns", "_known", "_piped", "_spaced", "_step_column", "_totals")

    def __init__(self) -> None:
        self._columns: tuple[str, ...] | None = None  # the metric name of each column
        self._step_column: int | None = None  # the step (or epoch) column
        #: The columns of known metrics and the step's: a row needs a number in one.
        self._known: tuple[int, ...] = ()
        # A loss logged only in parts: its name and the columns it is the sum of.
        self._totals: tuple[tuple[str, tuple[int, ...]], ...] = ()
        #: The last header's cells were separated by spaces (fastai's table).
        self._spaced = False
        #: The last header's cells were separated by ``|`` (a notebook's table as Markdown).
        self._piped = False

    def parse(self, text: str) -> list[Sample] | None:
        """Samples of one stripped line; None for a line in another format."""
        separator = "," if "," in text else "\t" if "\t" in text else None
        if separator is None:
            if "|" in text:
                return self._piped_line(text)
            return self._spaced_line(text)
        if text[0].isalpha():
            cells = [cell.strip() for cell in text.split(separator)]
            # A name with spaces (``Training Loss`` in a notebook's table, ``total
            # timesteps`` in a PPO's CSV) as its words joined by ``_``.
            cells = [_SPACES.sub("_", _SLASH.sub("/", cell)) for cell in cells]
            found = self._header(cells)
            if found is not None:
                self._spaced = self._piped = False
            return found
        if self._spaced or self._piped:
            return None
        cells = [cell.strip() for cell in text.split(separator)]
        if separator == "\t":
            cells = ["" if cell == _NO_LOG else cell for cell in cells]
        return self._row(cells)

    def _piped_line(self, text: str) -> list[Sample] | None:
        """The HF Trainer's notebook table pasted as Markdown (an issue thread, a README):
        ``Step | Training Loss | reward | kl`` (or ``| Step | ... |``), a rule of dashes
        (``-- | --``, ``|---|---|``), rows ``1 | -0.283600 | 13.4375 | nan``; ``No Log`` is
        no value. A line of pairs apart by ``|`` (``step 120 | loss 2.3``) is no header:
        a header's cells hold no number."""
        cells = [cell.strip() for cell in text.strip().strip("|").split("|")]
        first = cells[0][:1]
        if first.isalpha():
            if len(cells) < 3 or any(_NUMBER_WORD.search(cell) for cell in cells):
                return None
            named = [_SPACES.sub("_", _SLASH.sub("/", cell)) for cell in cells]
            found = self._header(named)
            if found is not None:
                self._spaced, self._piped = False, True
            return found
        if not self._piped:
            return None
        if _PIPE_RULE.fullmatch(text.strip()):
            return []
        if not (first.isdigit() or first == "-"):
            return None
        return self._row(["" if cell.lower() == "no log" else cell for cell in cells])

    def _spaced_line(self, text: str) -> list[Sample] | None:
        """fastai's table: a header that starts with ``epoch`` (or a step column), cells
        apart by spaces, rows under it whose cells are numbers, ``#na#`` (no value) or the
        epoch's time (``00:10``)."""
        if text[0].isalpha():
            first, _, rest = text.partition(" ")
            if first == "E" and _SPACY_HEAD.match(text):
                cells = [_SPACY_NAMES.get(cell, cell) for cell in _WIDE_GAP.split(text)]
                cells = [_SPACES.sub("_", cell.lower()) for cell in cells]
            elif first.lower() in _SPACED_FIRST and not rest.lstrip()[:1].isdigit():
                cells = text.split()  # a header names; "step 120 | loss ..." is a record
            else:
                return None
            if len(cells) < 3:
                return None
            found = self._header(cells)
            if found is not None:
                self._spaced = True
            return found
        if not self._spaced:
            return None
        if text[0] == "-" and _RULE.fullmatch(text):
            return []  # spaCy's rule under its header
        if not text[0].isdigit():
            return None
        cells = ["" if cell == _NA or _CLOCK.fullmatch(cell) else cell for cell in text.split()]
        return self._row(cells)

    def _row(self, cells: list[str]) -> list[Sample] | None:
        """The samples of a row of cells (an empty cell: no value); None for another line."""
        columns = self._columns
        if columns is None:
            return None
        if len(cells) != len(columns):
            return None
        values = [as_float(cell) if cell else None for cell in cells]
        # A cell of words (a timestamp, a phase) is no value: the row is still one of the
        # table's while a known metric (or the step) of it is a number. Refused whole, a
        # CSV with a time column gave no sample at all, and its NaN no stop.
        words = any(value is None for value, cell in zip(values, cells, strict=True) if cell)
        if words and not any(values[index] is not None for index in self._known):
            return None
        step: int | None = None
        if self._step_column is not None:
            stamp = values[self._step_column]
            if stamp is not None and stamp.is_integer():
                step = int(stamp)
        samples = [
            Sample(name, value, step)
            for index, (name, value) in enumerate(zip(columns, values, strict=True))
            if value is not None and index != self._step_column
        ]
        for name, parts in self._totals:
            total = [values[index] for index in parts]
            if None not in total:
                samples.append(Sample(name, sum(total), step))  # type: ignore[arg-type]
        return samples

    def _header(self, cells: list[str]) -> list[Sample] | None:
        if len(cells) < 2 or not all(_HEADER_CELL.fullmatch(cell) for cell in cells):
            return None
        lowered = [cell.lower() for cell in cells]
        if not any(cell in KNOWN_KEYS or normalise_name(cell) in KNOWN_KEYS for cell in lowered):
            return None
        # An RL run's table (its episodes' reward beside the losses): its objective is no
        # supervised loss and keeps its name (``sb3``'s rule), a NaN of it still a loss's.
        # TRL's GRPO table too (``reward_std`` beside it): its loss is a policy objective.
        rl = any(_RL_COLUMN.search(cell) for cell in lowered) or samples_completions(lowered)
        self._columns = tuple(
            low if rl and "loss" in low else normalise_name(cell)
            for cell, low in zip(cells, lowered, strict=True)
        )
        steps = [index for index, cell in enumerate(lowered) if cell in _STEP_COLUMNS]
        epochs = [index for index, cell in enumerate(lowered) if cell == "epoch"]
        if "training_loss" in lowered and "validation_loss" in lowered:
            # The HF Trainer's table (a notebook's, a model card's): the evaluation's
            # metrics follow its loss (``| Validation Loss | Wer |``); ``wer`` was no
            # task metric ``eval_loss_rise`` knew.
            after = lowered.index("validation_loss") + 1
            kept = {*steps, *epochs}
            self._columns = tuple(
                as_evaluation(name) if index >= after and index not in kept else name
                for index, name in enumerate(self._columns)
            )
        found = steps or epochs
        self._step_column = found[0] if found else None
        self._known = tuple(
            index
            for index, cell in enumerate(lowered)
            if cell in KNOWN_KEYS or normalise_name(cell) in KNOWN_KEYS or index in found
        )
        self._totals = tuple(
            (total, parts)
            for total, prefix in (("loss", "train/"), ("eval_loss", "val/"))
            if total not in self._columns
            for parts in [_loss_parts(lowered, prefix)]
            if len(parts) > 1
        )
        return []


def _loss_parts(lowered: list[str], prefix: str) -> tuple[int, ...]:
    """The columns of a loss logged in parts under ``prefix``: ``train/box_loss``..."""
    return tuple(
        index
        for index, cell in enumerate(lowered)
        if cell.startswith(prefix) and cell.endswith("_loss")
    )
