"""HF Trainer output read many lines at once (``parsers.hf_blocks``) gives what line by line gives.

Every bar and every dict a piece reads is checked against ``LineParser`` itself, on
output drawn by a real tqdm the way the Trainer's ``ProgressCallback`` draws it; each
refusal case is a line a block must leave to line by line, with what line by line makes
of it.
"""

from __future__ import annotations

import io
import math
import random
import re
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest
from tqdm import tqdm

from sentinel.model.records import PROGRESS, Sample
from sentinel.parsing import LineParser
from sentinel.parsing.hf_blocks import BAR, BLANK, DICT, HfPiece, read_hf
from sentinel.parsing.lines import LineSplitter

Printed = tuple[str, tuple[str, ...]]  # a printed dict line and its keys
Reading = Callable[[list[Sample], bool], bool]  # line by line's samples, and garbled or not


def _split(output: str) -> list[str]:
    """The output as replay reads it: ``\\r`` and ``\\n`` each end a line."""
    splitter = LineSplitter()
    return splitter.feed(output.encode()) + splitter.flush()


def _trainer_output(
    steps: int,
    logs: dict[int, list[str]] | None = None,
    *,
    stride: int = 1,
    initial: int = 0,
    elapsed_s: float = 0.0,
    postfix: str = "",
    **options: Any,
) -> str:
    """What the Trainer's ``ProgressCallback`` writes: a bar over the steps, redrawn at
    every one, and after a step the lines ``logs`` holds for it, printed through the bar
    (tqdm blanks the bar, prints, redraws)."""
    stream = io.StringIO()
    bar = tqdm(total=steps, initial=initial, file=stream, mininterval=0, miniters=1, **options)
    # A run that has gone on for hours: tqdm's clock shows them, its rate is s/it.
    bar.start_t -= elapsed_s
    bar.last_print_t -= elapsed_s
    if postfix:
        bar.set_postfix_str(postfix)
    for step in range(initial + stride, steps + 1, stride):
        bar.update(stride)
        for text in (logs or {}).get(step, []):
            bar.write(text, file=stream)
    bar.close()
    return stream.getvalue()


def _printed(log: dict[str, float], *, strings: bool) -> str:
    """A log dict as the Trainer prints it: 5.x makes every value a string, 4.x prints floats."""
    return str({key: f"{value:.4g}" for key, value in log.items()} if strings else log)


def _train_log(step: int, steps: int, grad_norm: float | None = None) -> dict[str, float]:
    return {
        "loss": 4.0 / (1 + step / 10) + (step % 7) / 100,
        "grad_norm": 1.0 + (step % 5) / 3 if grad_norm is None else grad_norm,
        "learning_rate": 5e-05 * (1 - step / steps),
        "epoch": 3 * step / steps,
    }


def _eval_log(step: int, steps: int) -> dict[str, float]:
    return {
        "eval_loss": 3.0 - step / steps,
        "eval_runtime": 1.25,
        "eval_samples_per_second": 80.1,
        "eval_steps_per_second": 10.02,
        "epoch": 3 * step / steps,
    }


def _logged_run(
    steps: int,
    *,
    logging_steps: int = 5,
    eval_steps: int = 0,
    reorder_at: int = 0,
    strings: bool = True,
    grad_norms: dict[int, float] | None = None,
) -> tuple[list[str], list[Printed]]:
    """A Trainer run's lines, and the dicts it printed in order with their keys."""
    logs: dict[int, list[str]] = {}
    printed: list[Printed] = []
    for step in range(1, steps + 1):
        made = []
        if step % logging_steps == 0:
            made.append(_train_log(step, steps, (grad_norms or {}).get(step)))
            if step == reorder_at:
                made[-1] = dict(reversed(made[-1].items()))
        if eval_steps and step % eval_steps == 0:
            made.append(_eval_log(step, steps))
        for log in made:
            printed.append((_printed(log, strings=strings), tuple(log)))
            logs.setdefault(step, []).append(printed[-1][0])
    return _split(_trainer_output(steps, logs)), printed


def _exact(value: float) -> str:
    """A float's exact value, every NaN the same."""
    return "nan" if math.isnan(value) else value.hex()


def _assert_line_by_line_agrees(texts: list[str], pieces: list[HfPiece]) -> None:
    """The pieces cover the lines once, in order; every blank, every bar and every dict of
    a run with names gives, through ``LineParser``, what the piece says it gives."""
    bounds = [0]
    for piece in pieces:
        assert piece.start == bounds[-1] < piece.stop
        bounds.append(piece.stop)
    assert bounds[-1] == len(texts)
    for piece in pieces:
        lines = texts[piece.start : piece.stop]
        assert len(piece.kinds) == len(lines)
        assert piece.dict_texts == [
            text for text, kind in zip(lines, piece.kinds, strict=True) if kind == DICT
        ]
        assert len(piece.bar_steps) == piece.kinds.count(BAR)
        if piece.dict_texts:
            assert piece.kinds[-1] == DICT  # a piece ends right after its last dict
        else:
            assert piece is pieces[-1]
            assert (piece.names, piece.columns) == ((), {})
        if piece.names is not None:
            assert list(piece.columns) == list(piece.names)
            assert {len(column) for column in piece.columns.values()} <= {len(piece.dict_texts)}
        steps = iter(piece.bar_steps)
        row = 0
        for text, kind in zip(lines, piece.kinds, strict=True):
            parser = LineParser()
            samples = parser.parse(text)
            if kind == BLANK:
                assert (samples, parser.stats.unparsed) == ([], 1), repr(text)
            elif kind == BAR:
                step = next(steps)
                assert samples == [Sample(PROGRESS, float(step), step, None)], repr(text)
            else:
                if piece.names is not None:
                    assert [sample.name for sample in samples] == list(piece.names), text
                    assert [_exact(sample.value) for sample in samples] == [
                        _exact(piece.columns[name][row]) for name in piece.names
                    ], text
                    assert {(sample.step, sample.time) for sample in samples} == {(None, None)}
                row += 1


@pytest.mark.parametrize(
    ("options", "shows"),
    [
        pytest.param({"steps": 20}, r"\| 0/20 .*\| 1/20 .*\| 10/20 .*\| 20/20 ", id="every-step"),
        pytest.param({"steps": 20, "ascii": True}, r"\|##########\| 20/20", id="ascii"),
        pytest.param({"steps": 20, "ascii": False}, r"\|██████████\| 20/20", id="unicode"),
        pytest.param(
            {"steps": 12, "elapsed_s": 5 * 3600.0},
            r"\[5:00:\d\d<\d:\d\d:\d\d, +\d+\.\d+s/it\]",
            id="hours-and-seconds-per-step",
        ),
        pytest.param(
            {"steps": 10**6, "stride": 50_000}, r"\| 1000000/1000000 ", id="a-million-steps"
        ),
        pytest.param({"steps": 30, "initial": 20}, r"\| 20/30 .*\| 21/30 ", id="resumed"),
        pytest.param({"steps": 8, "leave": False}, r"\r +\r$", id="cleared-on-close"),
        pytest.param({"steps": 8, "postfix": "warmup"}, r"it/s, warmup\]", id="postfix-no-pairs"),
        pytest.param({"steps": 8, "dynamic_ncols": True}, r"\| 8/8 ", id="dynamic-ncols"),
    ],
)
def test_every_training_bar_is_progress_at_its_count(options: dict[str, Any], shows: str) -> None:
    output = _trainer_output(**options)
    assert re.search(shows, output, re.DOTALL), output[-300:]
    texts = _split(output)
    pieces = read_hf(texts)
    assert pieces is not None
    assert len(pieces) == 1
    stride, initial = options.get("stride", 1), options.get("initial", 0)
    assert set(pieces[0].bar_steps) == set(range(initial, options["steps"] + 1, stride))
    _assert_line_by_line_agrees(texts, pieces)


@pytest.mark.parametrize(
    "run",
    [
        pytest.param({}, id="5.x-strings"),
        pytest.param({"strings": False}, id="4.x-floats"),
        pytest.param({"grad_norms": {10: math.nan, 15: -math.inf}}, id="5.x-nan-and-inf"),
        pytest.param({"eval_steps": 10}, id="5.x-with-evals"),
        pytest.param({"strings": False, "eval_steps": 10}, id="4.x-with-evals"),
        pytest.param({"logging_steps": 1}, id="a-dict-every-step"),
    ],
)
def test_every_log_dict_gives_its_columns_line_by_line(run: dict[str, Any]) -> None:
    texts, printed = _logged_run(30, **run)
    pieces = read_hf(texts)
    assert pieces is not None
    read = [text for piece in pieces if piece.names for text in piece.dict_texts]
    assert read == [text for text, _ in printed]  # every dict read as columns
    if "grad_norms" in run:
        column = [value for piece in pieces if piece.names for value in piece.columns["grad_norm"]]
        assert sum(map(math.isnan, column)) == 1 and -math.inf in column
    _assert_line_by_line_agrees(texts, pieces)


@pytest.mark.parametrize(
    ("run", "cut_after_last_dict"),
    [
        pytest.param({}, False, id="train-dicts-then-bars"),
        pytest.param({"eval_steps": 10}, False, id="evals-between"),
        pytest.param({"eval_steps": 10, "logging_steps": 10}, False, id="eval-after-each-train"),
        pytest.param({"reorder_at": 15}, False, id="reordered-keys"),
        pytest.param({"eval_steps": 10}, True, id="ends-on-a-dict"),
    ],
)
def test_pieces_end_after_each_run_of_one_schema(
    run: dict[str, Any], cut_after_last_dict: bool
) -> None:
    texts, printed = _logged_run(30, **run)
    printed_texts = [text for text, _ in printed]
    dict_lines = [index for index, text in enumerate(texts) if text in set(printed_texts)]
    assert [texts[index] for index in dict_lines] == printed_texts
    if cut_after_last_dict:
        texts = texts[: dict_lines[-1] + 1]
    keys = [shape for _, shape in printed]
    # Where each run of one schema (keys in one order) ends, then the trailing bars.
    stops = [
        line + 1
        for index, line in enumerate(dict_lines)
        if index + 1 == len(keys) or keys[index + 1] != keys[index]
    ]
    stops += [len(texts)] if stops[-1] < len(texts) else []
    pieces = read_hf(texts)
    assert pieces is not None
    assert [(piece.start, piece.stop) for piece in pieces] == list(pairwise([0, *stops]))
    assert all(piece.names for piece in pieces if piece.dict_texts)
    assert (pieces[-1].names == ()) is not cut_after_last_dict
    _assert_line_by_line_agrees(texts, pieces)


def _nothing(samples: list[Sample], garbled: bool) -> bool:
    return samples == [] and not garbled


def _garbled(samples: list[Sample], garbled: bool) -> bool:
    return samples == [] and garbled


def _names(*names: str) -> Reading:
    return lambda samples, garbled: [sample.name for sample in samples] == list(names)


def _progress(*steps: int) -> Reading:
    return lambda samples, _: [s.step for s in samples if s.name == PROGRESS] == list(steps)


def _at_step(step: int) -> Reading:
    return lambda samples, _: {sample.step for sample in samples} == {step}


def _timed(samples: list[Sample], garbled: bool) -> bool:
    return bool(samples) and None not in {sample.time for sample in samples}


REFUSED, BY_LINE = "read_hf is None", "its piece has names None"
BAR_45 = " 45%|████▌     | 45/100 [00:01<00:02, 25.3it/s"
BAR_46 = BAR_45.replace("45/", "46/")
SUMMARY = "{'train_runtime': '12.5', 'train_loss': '2.4', 'epoch': '1.0'}"
TRAIN = "{'loss': '2.5', 'grad_norm': '1.0', 'learning_rate': '5e-05', 'epoch'"
CASES: list[tuple[str, str, str, Reading]] = [
    ("described-map", "Map: 100%|█| 10/10 [00:00<00:00, 9000.00 examples/s]", REFUSED, _nothing),
    ("described-shards", "Loading checkpoint shards: " + BAR_45 + "]", REFUSED, _nothing),
    ("described-training", "Training:" + BAR_45 + "]", REFUSED, _progress(45)),
    ("postfix-pair", BAR_45 + ", loss=2.3]", REFUSED, _names("loss", PROGRESS)),
    ("no-total", "10it [00:01,  9.81it/s]", REFUSED, _progress(10)),
    ("eval-bar-cursor-up", "  0%|          | 0/8 [00:00<?, ?it/s]\x1b[A", REFUSED, _nothing),
    ("bar-and-dict-glued", BAR_45 + "]{'loss': '2.5'}", REFUSED, _names(PROGRESS, "loss")),
    ("two-bars-cr", BAR_45 + "]\r" + BAR_46 + "]", REFUSED, _progress(45, 46)),
    ("two-bars-newline", BAR_45 + "]\n" + BAR_45 + "]", REFUSED, _nothing),
    ("banner", "***** Running training *****", REFUSED, _nothing),
    ("warning", "/x/loader.py:558: UserWarning: This DataLoader will hang", REFUSED, _nothing),
    ("int-value", TRAIN + ": 1}", BY_LINE, _names("loss", "grad_norm", "lr", "epoch")),
    ("4.x-bare-nan", "{'loss': 2.5, 'grad_norm': nan}", REFUSED, _names("loss", "grad_norm")),
    ("boolean", "{'loss': '2.5', 'flag': True}", REFUSED, _names("loss")),
    ("double-quoted", "{'loss': \"2.5\", 'epoch': '0.5'}", REFUSED, _names("loss", "epoch")),
    ("backslash", "{'loss': '2.5', 'dir': 'C:\\\\runs'}", REFUSED, _garbled),
    ("summary", SUMMARY, BY_LINE, _names("train_runtime", "train_loss", "epoch")),
    ("step-key", "{'loss': '2.5', 'step': '10'}", BY_LINE, _at_step(10)),
    ("time-key", "{'loss': '2.5', 'time': '1700000000.5'}", BY_LINE, _timed),
    ("metric-named-step", "{'loss': '2.5', 'train/step': '3'}", BY_LINE, _names("loss", PROGRESS)),
    ("one-name-twice", "{'loss': '2.5', 'train_loss': '3'}", BY_LINE, _names("loss", "loss")),
    ("non-numeric-string", "{'loss': '2.5', 'note': 'warmup'}", BY_LINE, _names("loss")),
    ("cut-off", TRAIN[:-3], REFUSED, _garbled),
    ("two-dicts", "{'loss': '2.5'}{'loss': '2.4'}", REFUSED, _names("loss", "loss")),
    ("two-dicts-comma", "{'loss': '2.5'}, {'loss': '2.4'}", REFUSED, _names("loss", "loss")),
    ("dict-cr-dict", "{'loss': '2.5'}\r{'loss': '9.5'}", REFUSED, _names("loss", "loss")),
    ("dict-newline-dict", "{'loss': '2.5'}\n{'loss': '9.5'}", REFUSED, _names("loss", "loss")),
    ("indented-dict", " {'loss': '2.5'}", REFUSED, _names("loss")),
    ("empty-dict", "{}", REFUSED, _nothing),
]


@pytest.mark.parametrize(
    ("line", "outcome", "reading"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_a_line_a_block_must_not_read_goes_line_by_line(
    line: str, outcome: str, reading: Reading
) -> None:
    parser = LineParser()
    samples = parser.parse(line)
    # Why it must go line by line: what line by line makes of it.
    assert reading(samples, parser.stats.garbled == 1), samples
    texts, _ = _logged_run(20)
    middle = len(texts) // 2
    batch = [*texts[:middle], line, *texts[middle:]]
    pieces = read_hf(batch)
    if outcome == REFUSED:
        assert pieces is None
    else:
        assert pieces is not None
        [holder] = [piece for piece in pieces if piece.start <= middle < piece.stop]
        assert holder.names is None
        _assert_line_by_line_agrees(batch, pieces)


@pytest.mark.parametrize(
    "texts",
    [
        pytest.param(["{'loss': '", "{'}, {'grad_norm': '1.5'}"], id="a-string-across-lines"),
        pytest.param(
            ["{'loss': '2.5', 'n': [{'x': '1'}", "{'y': '2'}]}, {'grad_norm': '1.5'}"],
            id="a-list-across-lines",
        ),
    ],
)
def test_dicts_that_decode_only_together_are_not_read(texts: list[str]) -> None:
    # Each line alone is garbled (no sample); joined by commas into one JSON array they
    # decode as two records, the second a clean dict that a block must not read.
    parser = LineParser()
    assert [parser.parse(text) for text in texts] == [[], []]
    assert parser.stats.garbled == 2
    pieces = read_hf(texts)
    if pieces is not None:
        _assert_line_by_line_agrees(texts, pieces)


@pytest.mark.parametrize(
    "texts",
    [
        pytest.param(["", "   ", "\t", "\u3000", " \r \r"], id="blank-forms"),
        pytest.param(["{'loss': '2.5'} \t", "{'loss': '2.4'}"], id="dict-with-trailing-blanks"),
        pytest.param(["{'loss': '1e400', 'lr': '-0'}"], id="overflow-and-negative-zero"),
        pytest.param(["{'loss': ' 2.5 ', 'lr': '1_000'}"], id="strings-float-reads"),
        pytest.param(["\t 5%|▌ | 5/100 [00:01<00:19, 4.99it/s]\t"], id="bar-in-tabs"),
        pytest.param(["100%|█| 000007/7 [0:00:02<0:00:00, 3.50it/s]"], id="bar-padded-count"),
    ],
)
def test_edge_forms_read_as_line_by_line(texts: list[str]) -> None:
    pieces = read_hf(texts)
    assert pieces is not None
    _assert_line_by_line_agrees(texts, pieces)


ODD_LINES = [line for _, line, _, _ in CASES if "\r" not in line and "\n" not in line]


def _random_lines(rng: random.Random) -> list[tuple[str, bool]]:
    """A random Trainer run's lines, each with whether it holds an odd line."""
    steps, every, strings = rng.randint(15, 50), rng.randint(1, 4), rng.random() < 0.6
    logs: dict[int, list[str]] = {}
    odd: set[str] = set()
    odd_step = rng.randint(1, steps) if rng.random() < 0.5 else 0
    for step in range(1, steps + 1):
        printed = logs.setdefault(step, [])
        if step % every == 0:
            grad_norm = rng.choice([None] * 30 + [math.nan, math.inf])
            printed.append(_printed(_train_log(step, steps, grad_norm), strings=strings))
        if rng.random() < 0.05:
            printed.append(_printed(_eval_log(step, steps), strings=strings))
        if step == odd_step:
            printed.append(rng.choice(ODD_LINES))
            odd.add(printed[-1])
        if rng.random() < 0.03:
            printed.append(rng.choice(["   ", "\t", ""]))
    output = _trainer_output(
        steps,
        logs,
        ascii=rng.random() < 0.5,
        leave=rng.random() < 0.7,
        elapsed_s=rng.choice([0.0, 4000.0]),
    )
    return [(text, any(line in text for line in odd)) for text in _split(output)]


@pytest.mark.parametrize(
    "seed",
    [
        pytest.param(seed, id=f"seed-{seed}", marks=pytest.mark.slow if seed >= 2 else ())
        for seed in range(6)
    ],
)
@pytest.mark.slow
def test_random_batches_read_as_line_by_line(seed: int) -> None:
    rng = random.Random(seed)
    batches, accepted, rows, odd_batches = 30, 0, 0, 0
    for _ in range(batches):
        lines = _random_lines(rng)
        start = rng.choice([0, rng.randrange(len(lines))])
        batch = lines[start : rng.randint(start + 1, len(lines))]
        texts = [text for text, _ in batch]
        pieces = read_hf(texts)
        odd_batches += any(odd for _, odd in batch)
        if pieces is None:
            continue
        _assert_line_by_line_agrees(texts, pieces)
        for piece in pieces:
            if any(odd for _, odd in batch[piece.start : piece.stop]):
                assert piece.names is None, texts[piece.start : piece.stop]
        accepted += 1
        rows += sum(len(piece.dict_texts) for piece in pieces if piece.names)
    # Not vacuous: most batches, and many dicts as columns, were checked; odd lines were met.
    assert accepted >= batches // 2
    assert rows >= batches
    assert odd_batches > 0
