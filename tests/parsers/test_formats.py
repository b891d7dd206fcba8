"""Frameworks' own console lines and header-row CSVs: read with no configuration.

The fixtures (``tests/fixtures/frameworks``, ``make_framework_lines.py``) print each
format with the expression its framework's source uses; the NaN must be read at the
step its own line names.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sentinel.config import load_settings
from sentinel.engine.replay import replay
from sentinel.model.records import PROGRESS, Sample, Severity
from sentinel.parsing import LineParser
from sentinel.parsing.registry import FILE_FORMATS, FRAMEWORK_LINES, LINE_FORMATS

FIXTURES = Path(__file__).parent.parent / "fixtures" / "frameworks"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


def _samples(name: str) -> list[Sample]:
    parser = LineParser()
    found: list[Sample] = []
    for line in (FIXTURES / name).read_bytes().decode("utf-8").split("\n"):
        found += parser.parse(line)
    return found


@pytest.mark.parametrize("name", [name for name in EXPECTED if name != "deepspeed.log"])
def test_nan_is_read_at_the_step_its_line_names(name: str) -> None:
    truth = EXPECTED[name]
    first = next(s for s in _samples(name) if s.name == truth["metric"] and math.isnan(s.value))
    assert first.step == truth["first_nan_step"]


def test_megatron_counters_are_metrics() -> None:
    by_name = {(s.name, s.step): s.value for s in _samples("megatron.log")}
    assert by_name[("nan_iterations", 500)] == 1.0
    assert by_name[("skipped_iterations", 500)] == 0.0
    assert by_name[("loss_scale", 100)] == 16384.0
    assert by_name[("lr", 100)] == pytest.approx(1.342e-4)


def test_deepspeed_loss_scale_collapse_is_a_loss_scale_series() -> None:
    found = _samples("deepspeed.log")
    scales = [s.value for s in found if s.name == "loss_scale"]
    assert scales[:3] == [65536.0, 32768.0, 16384.0]
    assert scales[-1] == 1.0
    assert [s.value for s in found if s.name == "loss_scale_at_minimum"] == [1.0]
    assert [(s.name, s.step) for s in found if s.name == "skipped_steps"] == [
        ("skipped_steps", 10),
        ("skipped_steps", 20),
    ]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            "[2024-05-01 12:00:01,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=100,"
            " skipped=0, lr=[0.0001], mom=[(0.9, 0.999)], loss=nan, grad_norm=1.5",
            [
                ("skipped_steps", 100, 0.0),
                ("lr", 100, 1e-4),
                ("loss", 100, math.nan),
                ("grad_norm", 100, 1.5),
            ],
            id="step-line-with-the-scripts-own-pairs",
        ),
        pytest.param(
            "[Rank 0] step=7, skipped=1, lr=[0.001, 0.001], mom=[[0.9, 0.999], [0.9, 0.999]]",
            [("skipped_steps", 7, 1.0), ("lr", 7, 1e-3)],
            id="step-line-of-two-groups",
        ),
        pytest.param(
            "[2024-05-01 12:00:01,000] [INFO] [timer.py:215:stop]"
            " epoch=0/micro_step=400/global_step=100, RunningAvgSamplesPerSec=12.3,"
            " CurrSamplesPerSec=12.5, MemAllocated=1.2GB, MaxMemAllocated=3.4GB",
            [("samples_per_sec", 100, 12.5)],
            id="throughput-timer-at-its-global-step",
        ),
    ],
)
def test_deepspeed_lines(line: str, expected: list[tuple[str, int, float]]) -> None:
    found = [(s.name, s.step, s.value) for s in LineParser().parse(line)]
    assert [(name, step) for name, step, _ in found] == [(n, s) for n, s, _ in expected]
    assert [v for *_, v in found] == pytest.approx([v for *_, v in expected], nan_ok=True)


def test_fairseq_overflow_sets_the_loss_scale() -> None:
    scales = [s.value for s in _samples("fairseq.log") if s.name == "loss_scale"]
    assert scales[-1] == 0.0625
    assert "to" not in {s.name for s in _samples("fairseq.log")}


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        pytest.param(
            ["epoch,loss", "0,0.5"], [[], [Sample("loss", 0.5, 0)]], id="csv-epoch-is-the-step"
        ),
        pytest.param(
            ["step, loss, lr", "  3,  nan,  0.1"],
            [[], [Sample("loss", math.nan, 3), Sample("lr", 0.1, 3)]],
            id="csv-padded-step-column",
        ),
        pytest.param(["name,city", "1,2"], [[], []], id="csv-without-a-metric-column-is-not-read"),
        pytest.param(
            ["epoch,loss", "0,0.5,7"],
            [[], []],
            id="csv-row-of-another-width-is-not-read",
        ),
        pytest.param(
            ["Iter(train) [  240/80000]  lr: 1.0000e-02  loss: nan"],
            [[Sample("lr", 0.01, 240), Sample("loss", math.nan, 240)]],
            id="mmengine-by-iteration",
        ),
        pytest.param(
            ["Epoch(val) [1][20/20]  accuracy/top1: 71.0000  loss: 0.5"],
            [[Sample("eval_accuracy/top1", 71.0), Sample("eval_loss", 0.5)]],
            id="mmengine-validation-is-eval",
        ),
    ],
)
def test_lines(lines: list[str], expected: list[list[Sample]]) -> None:
    parser = LineParser()
    assert repr([parser.parse(line) for line in lines]) == repr(expected)


CORPUS = Path(__file__).parent.parent / "corpus" / "healthy"
#: An Ultralytics 8.0 ``results.csv``: every cell padded to a width.
_PADDED = [
    "                  epoch,      train/box_loss,      train/cls_loss,      train/dfl_loss,"
    "   metrics/precision(B),      metrics/recall(B),       metrics/mAP50(B),"
    "    metrics/mAP50-95(B),        val/box_loss,        val/cls_loss,        val/dfl_loss,"
    "                 lr/pg0,                 lr/pg1,                 lr/pg2",
    "                      0,              1.25,              nan,              1.0,"
    "                0.5,                0.4,                0.3,                0.2,"
    "               1.5,               2.5,               1.0,              0.07,"
    "             0.003,             0.003",
]


def test_ultralytics_results_csv_reads_its_loss_whole_and_in_parts() -> None:
    """The corpus's real YOLO11-seg ``results.csv``: at each epoch, the train loss as the
    sum of its parts (``loss``), each part, the val loss likewise (``eval_loss``), the
    first group's learning rate (``lr``) and the mAPs as metrics of their own."""
    parser = LineParser()
    lines = (CORPUS / "yolo11-seg-gallstone" / "results.csv").read_text().splitlines()
    rows = [{sample.name: sample for sample in parser.parse(line)} for line in lines]
    assert rows[0] == {}
    first = rows[1]
    assert {sample.step for sample in first.values()} == {1}
    assert first["loss"].value == pytest.approx(1.49295 + 2.32854 + 2.62821 + 1.20624)
    assert first["box_loss"].value == 1.49295
    assert first["eval_loss"].value == pytest.approx(1.2426 + 1.63945 + 3.58494 + 1.13346)
    assert first["lr"].value == 0.000546249
    assert first["metrics/map50-95(b)"].value == 0.13895
    assert not {name for name in first if name.startswith("metrics/") and "loss" in name}
    assert [row["loss"].step for row in rows[1:]] == list(range(1, len(lines)))


def test_a_nan_in_one_part_of_a_padded_results_csv_is_a_nan_loss() -> None:
    parser = LineParser()
    assert parser.parse(_PADDED[0]) == []
    row = {sample.name: sample for sample in parser.parse(_PADDED[1])}
    assert math.isnan(row["loss"].value) and math.isnan(row["cls_loss"].value)
    assert (row["loss"].step, row["eval_loss"].value, row["lr"].value) == (0, 5.0, 0.07)


@pytest.mark.parametrize(
    ("header", "row", "text_cell"),
    [
        ("time,step,loss", "2024-01-01 10:00:02,3,nan", "2024-01-01 10:00:02"),
        ("step,phase,loss,lr", "3,train,nan,0.001", "train"),
    ],
)
def test_a_csv_with_a_column_of_words_reads_its_numbers(
    header: str, row: str, text_cell: str
) -> None:
    """A timestamp or a phase column: that cell is no value, the rest of the row is read.
    The row was refused whole, so such a file gave no sample, and a live run's NaN no stop.
    A row with no number in a known metric or the step is still not the table's."""
    parser = LineParser()
    assert parser.parse(header) == []
    samples = {sample.name: sample for sample in parser.parse(row)}
    assert math.isnan(samples["loss"].value) and samples["loss"].step == 3
    assert not [s for s in samples.values() if text_cell in s.name]
    assert not parser.parse(",".join(["x"] * len(header.split(","))))


def test_a_csv_with_its_own_loss_column_is_not_summed() -> None:
    parser = LineParser()
    parser.parse("epoch,train/loss,train/box_loss,train/cls_loss")
    assert [sample.name for sample in parser.parse("1,3.0,1.0,2.0")] == [
        "loss",
        "box_loss",
        "cls_loss",
    ]


@pytest.mark.parametrize("run", ["llamafactory-mistral-translator", "llamafactory-rm-pairwise"])
def test_llamafactory_trainer_log_lines_are_at_their_current_steps(run: str) -> None:
    """Each line of a real ``trainer_log.jsonl`` at its ``current_steps``; its bookkeeping
    (``total_steps``, ``percentage``, the times as text) is no metric."""
    parser = LineParser()
    lines = (CORPUS / run / "trainer_log.jsonl").read_text().splitlines()
    for line in lines:
        record = json.loads(line)
        samples = parser.parse(line)
        assert {sample.step for sample in samples} == {record["current_steps"]}
        assert {sample.name: sample.value for sample in samples}["loss"] == record["loss"]
        assert not {"total_steps", "percentage", "elapsed_time"} & {s.name for s in samples}


@pytest.mark.parametrize("name", list(FRAMEWORK_LINES))
def test_a_framework_line_format_is_one_module_and_one_registry_line(name: str) -> None:
    parse = FRAMEWORK_LINES[name]
    assert parse.__module__ == f"sentinel.parsing.{name}"
    assert parse("plain words, no metric in them") is None


@pytest.mark.parametrize("name", list(LINE_FORMATS))
def test_a_format_that_needs_an_earlier_line_is_one_module_and_one_registry_line(
    name: str,
) -> None:
    reader = LINE_FORMATS[name]()
    assert type(reader).__module__ == f"sentinel.parsing.{name}"
    assert reader.parse("plain words, no metric in them") is None


@pytest.mark.parametrize("name", list(FILE_FORMATS))
def test_a_whole_file_format_is_one_module_and_one_registry_line(name: str) -> None:
    kind = FILE_FORMATS[name]
    assert type(kind).__module__ == f"sentinel.parsing.{name}"
    assert kind.match(Path("logs/train.log")) is None


def test_the_hf_notebook_table_as_text_is_read_at_its_steps() -> None:
    """The HF Trainer's notebook table as a saved or pasted notebook output holds it: tabs
    between cells, names with spaces, ``nan`` where the loss was."""
    parser = LineParser()
    parser.parse(" [60/60 07:58, Epoch 0/1]")  # the bar above it
    assert parser.parse("Step\tTraining Loss\tValidation Loss") == []
    assert parser.parse("500\t0.221300\t7.697577") == [
        Sample("loss", 0.2213, 500),
        Sample("eval_loss", 7.697577, 500),
    ]
    (loss, eval_loss) = parser.parse("1000\tnan\t9.043961")
    assert (loss.name, loss.step, math.isnan(loss.value)) == ("loss", 1000, True)
    assert eval_loss == Sample("eval_loss", 9.043961, 1000)


def test_an_epoch_table_with_no_training_loss_yet_reads_the_rest_of_its_row() -> None:
    """``eval_strategy="epoch"``: the first rows say ``No log`` where the training loss was
    not logged yet."""
    parser = LineParser()
    parser.parse("Epoch\tTraining Loss\tValidation Loss\tAccuracy")
    # The evaluation's metrics follow its loss: its accuracy is the evaluation's.
    assert parser.parse("1\tNo log\t0.693147\t0.500000") == [
        Sample("eval_loss", 0.693147, 1),
        Sample("eval_accuracy", 0.5, 1),
    ]
    assert [s.name for s in parser.parse("2\t0.654300\t0.612000\t0.700000")] == [
        "loss",
        "eval_loss",
        "eval_accuracy",
    ]


def test_a_tab_table_names_with_slashes_keep_them() -> None:
    """TRL's GRPO columns: ``completions / mean_length`` is ``completions/mean_length`` (and
    its loss, a policy objective, keeps its name)."""
    parser = LineParser()
    parser.parse("Step\tTraining Loss\treward\tcompletions / mean_length")
    assert parser.parse("10\t0.0123\t0.5\t187.2") == [
        Sample("training_loss", 0.0123, 10),
        Sample("reward", 0.5, 10),
        Sample("completions/mean_length", 187.2, 10),
    ]


#: verl's console logger (``concat_dict_to_str``: ``step:N`` then `` - key:pformat(value)``),
#: as a PPO run prints it: numpy 2's scalars as their repr, Ray's prefix before it.
VERL = [
    "(TaskRunner pid=2231) step:3 - actor/pg_loss:np.float64(-0.0123) - actor/entropy:"
    "np.float32(0.456) - actor/grad_norm:np.float64(0.31) - critic/score/mean:0.5"
    " - timing_s/gen:12.5",
    "(TaskRunner pid=2231) step:4 - actor/pg_loss:np.float64(nan) - actor/entropy:nan"
    " - critic/score/mean:0.5",
]


def test_verl_lines_are_read_at_their_step_under_their_own_names() -> None:
    parser = LineParser()
    first = {s.name: s for s in parser.parse(VERL[0])}
    assert {s.step for s in first.values()} == {3}
    assert {name: s.value for name, s in first.items()} == {
        "actor/pg_loss": -0.0123,
        "actor/entropy": 0.456,
        "actor/grad_norm": 0.31,
        "critic/score/mean": 0.5,
        "timing_s/gen": 12.5,
    }
    second = {s.name: s for s in parser.parse(VERL[1])}
    assert math.isnan(second["actor/pg_loss"].value) and second["actor/pg_loss"].step == 4
    # The SFT trainer's loss is the training loss.
    assert parser.parse("step:10 - train/loss:2.31 - train/lr(1e-3):0.1")[0] == Sample(
        "loss", 2.31, 10
    )
    # A line that only starts like it is read as any other.
    assert [s.name for s in parser.parse("step:10 - epoch 1 done - loss: 2.31")] == [
        "epoch",
        "loss",
    ]
    # A line cut short after its pairs (Agent-R1's GRPO run, its NaN at step 83) is read.
    cut = "(main_task pid=63313) step:83 - actor/pg_loss:nan - actor/grad_norm:nan - prompt"
    assert [(s.name, s.step) for s in parser.parse(cut)] == [
        ("actor/pg_loss", 83),
        ("actor/grad_norm", 83),
    ]


#: NeMo's bars, as its docs and issues show them (the run's global step and
#: ``reduced_train_loss`` in the postfix; ``Epoch 0: :`` where the bar has no total).
NEMO = [
    (
        "Epoch 0: :  47%|████▋     | 7/15 [06:19<07:13, reduced_train_loss=11.50,"
        " global_step=5.000, consumed_samples=12288.0, train_step_timing in s=49.50]",
        5,
        11.5,
    ),
    (
        "Epoch 0:   5%|▏         | 3/62 [02:59<58:44,  0.02it/s, v_num=8-06,"
        " reduced_train_loss=6.930, lr=2.73e-5, global_step=1.000, consumed_samples=32.00]",
        1,
        6.93,
    ),
    (
        "Epoch 0: : 100%|██████████| 2000/2000 [43:24:54<00:00, reduced_train_loss=0.139,"
        " global_step=2e+3, consumed_samples=2.56e+5, train_step_timing in s=68.70,"
        " val_loss=0.212]",
        2000,
        0.139,
    ),
]


@pytest.mark.parametrize(("line", "step", "loss"), NEMO)
def test_a_nemo_bar_is_at_its_global_step_and_its_reduced_loss_is_the_loss(
    line: str, step: int, loss: float
) -> None:
    """The global step counts optimizer steps (``accumulate_grad_batches`` counted), as
    NeMo's checkpoints are named (``...-step=2175``); the bar's count does not."""
    samples = {s.name: s for s in LineParser().parse(line)}
    assert samples["loss"] == Sample("loss", loss, step)
    assert {s.step for s in samples.values()} == {step}


#: fastai's table as its ProgressCallback prints it to a terminal (cells padded with spaces,
#: the epoch's time last; lines as people paste them from their runs).
FASTAI = """\
epoch     train_loss  valid_loss  accuracy  time
0         4.346260    4.408598    0.370535  1:12:49
1         4.253693    #na#        0.372354  1:12:40
2         nan         4.288729    0.383211  00:03
"""


def test_fastais_table_is_read_at_its_epochs() -> None:
    parser = LineParser()
    rows = [parser.parse(line.strip()) for line in FASTAI.splitlines()]
    assert rows[0] == []
    assert rows[1] == [
        Sample("loss", 4.34626, 0),
        Sample("eval_loss", 4.408598, 0),
        Sample("accuracy", 0.370535, 0),
    ]
    assert [s.name for s in rows[2]] == ["loss", "accuracy"]  # #na#: no validation value
    assert rows[3][0].name == "loss" and math.isnan(rows[3][0].value) and rows[3][0].step == 2


@pytest.mark.parametrize(
    "line",
    ["Epoch 3 done in 12 s", "step loss", "epoch: 3 loss: 2.31", "step 100 loss 2.31 lr 0.1"],
)
def test_lines_that_start_like_a_spaced_header_are_not_one(line: str) -> None:
    parser = LineParser()
    parser.parse(line)
    assert parser.parse("0         4.346260    4.408598") == []


def test_spacys_table_is_read_at_its_steps() -> None:
    """A real ``spacy train`` run (tests/fixtures/make_spacy_console.py): each row at its
    ``#``, each ``LOSS X`` as ``loss_x``, its colours and the lines around it no metrics."""
    folder = FIXTURES.parent / "spacy_console" / "healthy"
    truth = json.loads((folder / "expected.json").read_text())
    parser = LineParser()
    rows: dict[int | None, dict[str, float]] = {}
    for line in (folder / "console.txt").read_text().splitlines():
        for sample in parser.parse(line):
            rows.setdefault(sample.step, {})[sample.name] = sample.value
    before = rows.pop(None)  # "ℹ Initial learn rate: 0.001", before the table
    assert not any("loss" in name for name in before)
    assert list(rows) == [row["step"] for row in truth["rows"]]
    for row in truth["rows"]:
        read = rows[row["step"]]
        assert read["epoch"] == row["epoch"]
        assert read["loss_ner"] == float(row["loss_ner"])
        assert read["loss_tok2vec"] == float(row["loss_tok2vec"])
        assert "loss" not in read  # a component's loss summed since the last evaluation


#: Marian's lines as its runs print them (``scheduler.h``; older and newer releases).
MARIAN = [
    (
        "[2021-05-26 23:22:42] Ep. 1 : Up. 500 : Sen. 15,203 : Cost 6.01253986 * 414,436"
        " after 414,436 : Time 609.91s : 679.50 words/s",
        [Sample("loss", 6.01253986, 500), Sample("tokens_per_sec", 679.5, 500)],
    ),
    (
        "[2019-03-25 14:51:54] Ep. 1 : Up. 1000 : Sen. 1,269,755 : Cost 7.95987511 :"
        " Time 785.53s : 17289.59 words/s : L.r. 1.2500e-05",
        [
            Sample("loss", 7.95987511, 1000),
            Sample("tokens_per_sec", 17289.59, 1000),
            Sample("lr", 1.25e-05, 1000),
        ],
    ),
    (
        "[2019-03-25 16:37:33] [valid] Ep. 1 : Up. 5000 : ce-mean-words : 5.21277 : new best",
        [Sample("eval_loss", 5.21277, 5000)],
    ),
    (
        "[2019-04-10 13:18:39] [valid] Ep. 9 : Up. 775000 : perplexity : 4.24812 : stalled 4"
        " times (last best: 4.24112)",
        [Sample("eval_ppl", 4.24812, 775000)],
    ),
]


@pytest.mark.parametrize(("line", "expected"), MARIAN)
def test_marian_lines_are_read_at_their_update(line: str, expected: list[Sample]) -> None:
    assert LineParser().parse(line) == expected


def test_a_marian_nan_cost_is_a_nan_loss_at_its_update() -> None:
    line = (
        "[2022-01-01 00:00:00] Ep. 2 : Up. 7000 : Sen. 9,000 : Cost -nan * 1,000 @ 900 after"
        " 9,000,000 : Time 10.00s : 5000.00 words/s : gNorm nan : L.r. 3.0000e-04"
    )
    samples = {s.name: s for s in LineParser().parse(line)}
    assert math.isnan(samples["loss"].value) and samples["loss"].step == 7000
    assert math.isnan(samples["grad_norm"].value)


def test_gpt_neox_lines_read_their_loss_and_validation() -> None:
    """GPT-NeoX's line is Megatron's with its names joined (``lm_loss``), its evaluation
    ``validation results at iteration N``."""
    parser = LineParser()
    train = parser.parse(
        " samples/sec: 51.234 | iteration       10/      50 | elapsed time per iteration (ms):"
        " 9876.5 | learning rate: 1.234E-04 | approx flops per GPU: 150.3TFLOPS | lm_loss:"
        " 7.123456E+00 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    assert Sample("loss", 7.123456, 10) in train
    assert parser.parse(
        " validation results at iteration 100 | lm_loss value: 6.9E+00 | lm_loss_ppl value: 990 |"
    ) == [Sample("eval_loss", 6.9, 100), Sample("eval_ppl", 990.0, 100)]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "Step... (500 | Loss: 2.31, Learning Rate: 0.0001)",
            [Sample("loss", 2.31, 500), Sample("lr", 0.0001, 500)],
        ),
        (
            "Step... (500/2000 | Training Loss: 2.31, Learning Rate: 0.0001)",
            [Sample("loss", 2.31, 500), Sample("lr", 0.0001, 500)],
        ),
        ("Step... (1000 | Eval Loss: 1.9)", [Sample("eval_loss", 1.9, 1000)]),
    ],
)
def test_the_hf_flax_examples_line_is_read_at_its_step(line: str, expected: list[Sample]) -> None:
    """``run_clm_flax.py`` and its siblings: ``epochs.write(f"Step... ({cur_step} | Loss:
    ...")``."""
    assert LineParser().parse(line) == expected


#: ESPnet2's train.log (lines as its docs and users' logs show them; ``trainer.py``).
ESPNET = [
    "[host] 2020-04-05 16:34:54,278 (trainer:192) INFO: 1/40epoch started. Estimated time to"
    " finish: 7 minutes and 58.63 seconds",
    "[host] 2020-04-05 16:34:56,315 (trainer:453) INFO: 1epoch:train:1-10batch: iter_time=0.006,"
    " forward_time=0.076, loss=50.873, loss_att=35.801, loss_ctc=65.945, acc=0.471,"
    " backward_time=0.072, optim_step_time=0.006, lr_0=1.000, train_time=0.203",
    "[host] 2020-04-05 16:34:58,046 (trainer:453) INFO: 1epoch:train:11-20batch:"
    " iter_time=4.280e-05, forward_time=0.068, loss=45.1, acc=0.5, optim0_lr0=0.9,"
    " train_time=0.2",
    "[host] 2020-04-05 16:35:26,464 (trainer:243) INFO: 1epoch results: [train]"
    " iter_time=0.164, loss=480.386, acc=1.022e-04, time=1 minute and 5.2 seconds,"
    " total_count=500, gpu_max_cached_mem_GB=10.1, [valid] loss=55.6, acc=0.3, cer=0.5,"
    " time=10.1 seconds, total_count=50, [att_plot] time=1.2, total_count=0",
    "[host] 2020-04-05 16:35:28,315 (trainer:453) INFO: 2epoch:train:1-10batch:"
    " iter_time=0.006, loss=nan, acc=0.471",
]


def test_espnet_lines_are_read_at_the_batches_since_the_start() -> None:
    parser = LineParser()
    read = [{s.name: s for s in parser.parse(line)} for line in ESPNET]
    assert read[0] == {}
    assert (read[1]["loss"].step, read[1]["lr"].value, read[1]["epoch"].value) == (10, 1.0, 0)
    assert read[2]["loss"] == Sample("loss", 45.1, 20)
    # The epoch's end: its [valid] values are evaluations; its [train] means are not re-read.
    assert {name: s.value for name, s in read[3].items()} == {
        "eval_loss": 55.6,
        "eval_acc": 0.3,
        "eval_cer": 0.5,
        "epoch": 1.0,
    }
    assert {s.step for s in read[3].values()} == {20}
    # The second epoch counts on from the first's 20 batches.
    assert read[4]["loss"].step == 30 and math.isnan(read[4]["loss"].value)
    assert read[4]["epoch"].value == 1.0


def test_an_espnet_log_that_starts_late_names_no_step_and_funasr_names_its_updates() -> None:
    parser = LineParser()
    late = parser.parse(ESPNET[4])
    assert {s.step for s in late} == {None}
    funasr = parser.parse(
        "[bach] 2023-04-23 18:59:48,924 (trainer:777) INFO: 2epoch:train:1-50batch:"
        "50num_updates: iter_time=0.008, loss_att=0.186, acc=0.942, loss=0.192,"
        " optim0_lr0=7.484e-06"
    )
    assert {s.step for s in funasr} == {50}


@pytest.mark.parametrize(
    "lines",
    [
        [
            "Epoch 1, Batch 100, Loss: 0.5",
            "Epoch 1, Batch 200, Loss: 0.4",
            "Epoch 2, Batch 100, Loss: 0.3",
        ],
        ["epoch 0 batch 100 loss 0.5", "epoch 0 batch 200 loss 0.4", "epoch 1 batch 100 loss 0.3"],
        # PyTorch's CIFAR-10 tutorial: print(f'[{epoch + 1}, {i + 1:5d}] loss: ...')
        ["[1,   100] loss: 0.500", "[1,   200] loss: 0.400", "[2,   100] loss: 0.300"],
        # MXNet's Speedometer (apache/mxnet issue #2805), its metric Train-<name>
        [
            "04:38:54 INFO:Epoch[0] Batch [100]\tSpeed: 31.41 samples/sec\tTrain-loss=0.500",
            "04:39:46 INFO:Epoch[0] Batch [200]\tSpeed: 30.42 samples/sec\tTrain-loss=0.400",
            "04:40:39 INFO:Epoch[1] Batch [100]\tSpeed: 30.15 samples/sec\tTrain-loss=0.300",
        ],
    ],
    ids=["named", "lower-from-0", "cifar-tutorial", "mxnet-speedometer"],
)
def test_an_epoch_and_its_batch_count_on_across_epochs(lines: list[str]) -> None:
    """The batch restarts each epoch: the step is the batches before it plus the batch."""
    parser = LineParser()
    losses = [s for line in lines for s in parser.parse(line) if s.name == "loss"]
    assert [(s.step, s.value) for s in losses] == [(100, 0.5), (200, 0.4), (300, 0.3)]


@pytest.mark.parametrize(
    ("lines", "steps"),
    [
        (["Epoch 1 Batch 1/500 Loss 0.5", "Epoch 2 Batch 1/500 Loss 0.4"], [1, 501]),
        (
            [
                "Train epoch: 0, batch: 790/34799, loss: 2.1",
                "Train epoch: 1, batch: 10/34799, loss: 2",
            ],
            [790, 34809],
        ),
        (["Epoch 5, Batch 10/100, step 510, loss 1"], [510]),
    ],
    ids=["epochs-from-1", "epochs-from-0", "its-own-step-first"],
)
def test_an_epoch_and_its_batch_of_all_count_epochs_from_the_first_one_named(
    lines: list[str], steps: list[int]
) -> None:
    """A Python ``logging`` loop's ``Epoch 1 Batch 1/500`` counts epochs from 1 (it was read
    at 501); PPASR's ``Train epoch: 0, batch: 790/34799`` from 0."""
    parser = LineParser()
    read = [next(s for s in parser.parse(line) if s.name == "loss") for line in lines]
    assert [s.step for s in read] == steps


def test_an_epoch_and_batch_log_that_starts_late_counts_from_the_first_epoch_it_shows() -> None:
    """An excerpt from epoch 5 on cannot tell the epochs before: its lines are read at the
    batches since epoch 5 began, each at its own step (read at the epoch, each epoch's
    lines shared one step)."""
    parser = LineParser()
    lines = [f"Epoch {e}, Batch {b}, Loss: 0.5" for e in (5, 6) for b in (100, 200)]
    steps = [parser.parse(line)[0].step for line in lines]
    assert steps == [100, 200, 300, 400]


def test_an_excerpt_of_an_epoch_and_batch_log_keeps_every_value_and_its_nan_step(
    tmp_path: Path,
) -> None:
    """Replayed, an excerpt that starts in epoch 5 keeps each line's values (at one step
    an epoch, 28 of its 160 samples were left) and names the NaN's own step."""

    def loss(epoch: int, batch: int) -> str:
        return "nan" if (epoch, batch) >= (6, 300) else f"{0.5 + batch / 1e4:.4f}"

    lines = [
        f"Epoch {e}, Batch {b}, Loss: {loss(e, b)}" for e in (5, 6) for b in range(10, 410, 10)
    ]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = replay([log], load_settings(None, environ={}))
    assert result.samples == 2 * len(lines)
    nan = [a for a in result.alerts if a.rule == "nan_inf"]
    assert nan and nan[0].step == 400 + 300


def test_pytorchs_mnist_example_is_read_at_the_samples_seen_and_its_test_set_is_evaluation() -> (
    None
):
    parser = LineParser()
    first = parser.parse("Train Epoch: 2 [6400/60000 (11%)]\tLoss: 0.500000")
    assert Sample("loss", 0.5, 66400) in first
    test = parser.parse("Test set: Average loss: 0.0500, Accuracy: 9850/10000 (98%)")
    assert [s.name for s in test] == ["eval_loss", "eval_accuracy"]


#: WeNet's lines as a real 4-GPU run logged them (wenet-e2e/wenet issue 941): the epoch, the
#: batch within it, the rank; a CV line at the epoch's end (its batch counts CV batches).
WENET = [
    "2023-01-30 18:47:07,107 DEBUG TRAIN Batch 4/203700 loss 12.646465 loss_att 10.921429"
    " loss_ctc 16.671551 lr 0.00032621 rank 0",
    "2023-01-30 18:47:16,614 DEBUG TRAIN Batch 4/203700 loss 16.885244 loss_att 13.554604"
    " loss_ctc 24.656742 lr 0.00032621 rank 1",
    "2023-01-30 18:48:22,438 DEBUG TRAIN Batch 4/203800 loss inf loss_att 20.509174"
    " loss_ctc inf lr 0.00032621 rank 0",
    "2023-01-30 18:49:55,773 DEBUG CV Batch 4/0 loss 28.517015 loss_att 24.142754"
    " loss_ctc 38.723625 history loss 27.957858 rank 2",
]


def test_wenet_lines_are_read_at_their_batch_and_rank_and_its_cv_is_evaluation() -> None:
    parser = LineParser()
    read = [{s.name: s for s in parser.parse(line)} for line in WENET]
    assert (read[0]["loss"].step, read[0]["loss"].rank, read[0]["lr"].value) == (
        203700,
        0,
        0.00032621,
    )
    assert (read[1]["loss"].value, read[1]["loss"].rank) == (16.885244, 1)
    assert read[2]["loss"].step == 203800 and math.isinf(read[2]["loss"].value)
    # The CV line: its running mean is the evaluation, at the step training reached; its
    # losses are no training loss (read so, they were 1.5x it: a divergence warning).
    assert {name: (s.value, s.step, s.rank) for name, s in read[3].items()} == {
        "eval_loss": (27.957858, 203800, 2)
    }


#: Coqui's trainer (Coqui TTS, VITS), as a real run's console printed it: the step header,
#: then a value a line beside its running mean.
COQUI = [
    "   --> STEP: 49/377 -- GLOBAL_STEP: 370050",
    "     | > loss_disc: 2.40120  (2.51074)",
    "     | > amp_scaler: 128.00000  (1477.33333)",
    "     | > current_lr_0: 0.00018 ",
    "   --> TIME: 2023-03-01 10:00:00 -- STEP: 50/377 -- GLOBAL_STEP: 370051",
    "     | > loss_1: nan  (30.49375)",
]


def test_coquis_step_header_is_progress_and_its_values_are_read_at_it(tmp_path: Path) -> None:
    parser = LineParser()
    header = parser.parse(COQUI[0])
    assert [(s.name, s.step) for s in header] == [(PROGRESS, 370050)]
    assert [(s.name, s.value) for s in parser.parse(COQUI[2])] == [("loss_scale", 128.0)]
    assert [(s.name, s.value) for s in parser.parse(COQUI[3])] == [("lr", 0.00018)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(COQUI) + "\n", encoding="utf-8")
    result = replay([log], load_settings(None, environ={}))
    (nan,) = [a for a in result.alerts if a.rule == "nan_inf"]
    assert (nan.step, nan.metric) == (370051, "loss_1")


def test_detectron2s_floating_point_error_is_the_loss_at_its_iteration(tmp_path: Path) -> None:
    """As a real RegionCLIP run printed it: its last metrics at iteration 4299, then the
    trainer's own check failing at 4311 (read at 4299 before: the step of the line above)."""
    lines = [
        "[07/12 01:10:03 d2.utils.events]:  eta: 1:41:36  iter: 4299  total_loss: 0.1065"
        "  loss_cls: 0.02696  loss_box_reg: 0.07967  time: 1.2804  data_time: 0.0020"
        "  lr: 0.002  max_mem: 15826M",
        "FloatingPointError: Loss became infinite or NaN at iteration=4311!",
        "loss_dict = {'loss_cls': nan, 'loss_box_reg': nan}",
    ]
    assert [(s.name, s.step) for s in LineParser().parse(lines[1])] == [("loss", 4311)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = replay([log], load_settings(None, environ={}))
    nan = [a for a in result.alerts if a.rule == "nan_inf"]
    assert [(a.severity, a.step) for a in nan][:1] == [(Severity.CRITICAL, 4311)]


def test_yolact_lines_are_read_at_their_iteration_with_their_total_as_the_loss() -> None:
    """dbolya/yolact issue #359: ``[  1]    1510 || B: 5.515 | ... | T: 16.955 || ETA: ...``."""
    parser = LineParser()
    line = (
        "[  1]    1510 || B: 5.515 | C: 3.088 | M: 7.223 | S: 1.129 | T: nan ||"
        " ETA: 196 days, 13:00:18 || timer: 0.310"
    )
    samples = parser.parse(line)
    assert {s.step for s in samples} == {1510}
    assert [s.name for s in samples] == [
        "loss_box",
        "loss_class",
        "loss_mask",
        "loss_semantic",
        "loss",
        "epoch",
    ]
    assert math.isnan(next(s.value for s in samples if s.name == "loss"))


#: Megatron-DeepSpeed PR 434: a bf16 run whose loss turned NaN at iteration 9; Megatron
#: prints a loss only ``if avg > 0.0``, and counts NaN iterations only when skipped.
MEGATRON_NAN_LEFT_OUT = (
    " iteration        9/      10 | consumed samples:          108 | consumed tokens:"
    "       442368 | elapsed time per iteration (ms): 1979.2 | learning rate: 4.219E-07 |"
    " global batch size:    12 | loss scale: 1.0 | actual seqlen:  4096 | number of skipped"
    " iterations:   0 | number of nan iterations:   0 | samples per second: 6.063 | tokens"
    " per gpu per second (tgs): 2069.506 | TFLOPs: 127.00 |"
)
#: Megatron-LM BERT in fp16 (NVIDIA/nccl issue 743): every iteration of the first interval
#: skipped while the loss scale settles, so no loss is shown, rightly.
MEGATRON_ALL_SKIPPED = (
    " iteration       10/ 1000000 | consumed samples:           40 | elapsed time per"
    " iteration (ms): 356.2 | learning rate: 0.000E+00 | global batch size:     4 | loss"
    " scale: 8388608.0 | number of skipped iterations:  10 | number of nan iterations:   0 |"
)


def test_a_megatron_line_that_left_its_loss_out_unskipped_is_a_nan_loss() -> None:
    found = [(s.name, s.step) for s in LineParser().parse(MEGATRON_NAN_LEFT_OUT)]
    assert ("loss", 9) in found
    loss = next(s for s in LineParser().parse(MEGATRON_NAN_LEFT_OUT) if s.name == "loss")
    assert math.isnan(loss.value)


@pytest.mark.parametrize(
    "line",
    [
        MEGATRON_ALL_SKIPPED,
        # the same NaN line cut before its skipped count: nothing says none was skipped
        MEGATRON_NAN_LEFT_OUT.split("| number of skipped")[0],
        # a line with its loss, and one with another loss of the model's (BERT's sop loss)
        MEGATRON_NAN_LEFT_OUT.replace("loss scale", "lm loss: 2.5E+00 | loss scale"),
        MEGATRON_NAN_LEFT_OUT.replace("loss scale", "sop loss: 6.9E-01 | loss scale"),
    ],
)
def test_a_megatron_line_is_read_as_nan_only_where_its_loss_was_left_out(line: str) -> None:
    losses = [s.value for s in LineParser().parse(line) if s.name == "loss"]
    assert not any(math.isnan(value) for value in losses)


def test_a_megatron_run_whose_loss_line_goes_silent_is_stopped_at_that_iteration(
    tmp_path: Path,
) -> None:
    lines = [
        MEGATRON_NAN_LEFT_OUT.replace("iteration        9/", f"iteration        {step}/").replace(
            "loss scale", f"lm loss: {loss} | loss scale"
        )
        for step, loss in ((6, "2.9E+00"), (7, "2.8E+00"), (8, "2.8E+00"))
    ] + [MEGATRON_NAN_LEFT_OUT]
    log = tmp_path / "megatron.log"
    log.write_text("\n".join(lines) + "\n")
    result = replay([log], load_settings(None, environ={}))
    criticals = [a for a in result.alerts if a.severity == Severity.CRITICAL]
    assert [(a.rule, a.step) for a in criticals] == [("nan_inf", 9)]


#: A NaN, for comparing samples (NaN is equal to nothing).
NAN_TEXT = "nan"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            "[44]\ttrain-logloss:-nan\ttrain-auc:0.874943\tvalid-logloss:0.332257\tvalid-auc:0.873648",
            [("loss", NAN_TEXT, 44), ("auc", 0.874943, 44), ("eval_loss", 0.332257, 44),
             ("eval_auc", 0.873648, 44)],
            id="xgboost-train-and-valid",
        ),
        pytest.param(
            "[180]   cv-test-logloss:0.045664+0.000217       cv-train-logloss:nan+nan",
            [("eval_loss", 0.045664, 180), ("loss", NAN_TEXT, 180)],
            id="xgboost-cv-mean-and-deviation",
        ),
        pytest.param(
            "[1]\tvalidation-mlogloss:15.24863",
            [("eval_loss", 15.24863, 1)],
            id="xgboost-validation-set-only",
        ),
        pytest.param(
            "[2]\ttraining's binary_logloss: 0.732192\tvalid_1's binary_logloss: 0.731889",
            [("loss", 0.732192, 2), ("eval_loss", 0.731889, 2)],
            id="lightgbm-training-and-valid",
        ),
        pytest.param(
            "[1]\tvalid_0's l1: inf\tvalid_0's l2: inf",
            [("eval_loss", math.inf, 1)],
            id="lightgbm-first-loss-metric-of-a-set",
        ),
        pytest.param(
            "100:\tlearn: 0.1697219\ttest: 0.1530068\tbest: 0.1530068 (100)\ttotal: 3.7s"
            "\tremaining: 33s",
            [("loss", 0.1697219, 100), ("eval_loss", 0.1530068, 100)],
            id="catboost-learn-and-test",
        ),
        pytest.param(
            "65:     learn nanpassed: 17.5 sec      total: 21m 50s  remaining: 11m 45s",
            [("loss", NAN_TEXT, 65)],
            id="catboost-older-value-glued-to-passed",
        ),
    ],
)  # fmt: skip
def test_boosting_libraries_lines_are_read_at_their_round(
    line: str, expected: list[tuple[str, float | str, int]]
) -> None:
    found = [
        (s.name, NAN_TEXT if math.isnan(s.value) else s.value, s.step)
        for s in LineParser().parse(line)
    ]
    assert found == expected


#: icefall's zipformer recipe (k2-fsa/icefall issue 1628): a batch line, with the batch's
#: own loss and the running average beside it, and a validation line.
ICEFALL_BATCH = (
    "2024-05-17 01:48:24,230 INFO [train.py:1034] (0/8) Epoch 1, batch 50, loss[loss=1.621,"
    " simple_loss=1.207, pruned_loss=1.377, ctc_loss=1.301, over 49372.00 frames. ],"
    " tot_loss[loss=3.721, simple_loss=3.037, pruned_loss=2.626, ctc_loss=2.074, over"
    " 2196903.96 frames. ], batch size: 138, lr: 2.48e-02, grad_scale: 0.125"
)
ICEFALL_VALIDATION = (
    "2024-05-17 01:46:36,929 INFO [train.py:1066] (0/8) Epoch 1, validation: loss=8.6,"
    " simple_loss=6.902, pruned_loss=6.767, ctc_loss=5.098, over 944034.00 frames. "
)


def test_icefalls_batch_line_is_the_batchs_loss_not_its_running_average() -> None:
    parser = LineParser()
    found = {s.name: s.value for s in parser.parse(ICEFALL_BATCH)}
    assert found["loss"] == 1.621 and found["simple_loss"] == 1.207
    assert "loss#2" not in found and 3.721 not in found.values()


def test_icefalls_validation_is_the_evaluations_loss() -> None:
    parser = LineParser()
    parser.parse(ICEFALL_BATCH)
    found = {s.name: s.value for s in parser.parse(ICEFALL_VALIDATION)}
    assert found["eval_loss"] == 8.6 and found["eval_ctc_loss"] == 5.098
    assert "loss" not in found


def test_a_notebook_table_pasted_as_markdown_is_read_at_its_steps() -> None:
    """TRL's GRPO notebook table, pasted into an issue: ``-- | --`` under its header, ``No
    Log`` for a value not logged yet; and the ``| Step | ... |`` form with outer pipes."""
    trl = [
        "Step | Training Loss | reward | reward_std | kl | entropy",
        "-- | -- | -- | -- | -- | --",
        "1 | -0.283600 | 13.437500 | 21.810942 | nan | 0",
        "2 | -0.149100 | 6.931818 | 14.526671 | nan | No Log",
    ]
    parser = LineParser()
    found = [(s.name, s.step) for line in trl for s in parser.parse(line)]
    # A GRPO run's (``reward_std``): its loss is a policy objective and keeps its name.
    assert found[:5] == [
        ("training_loss", 1),
        ("reward", 1),
        ("reward_std", 1),
        ("kl", 1),
        ("entropy", 1),
    ]
    assert ("entropy", 2) not in found and ("kl", 2) in found
    outer = ["| Step | Training Loss | Validation Loss |", "|---|---|---|", "| 1000 | nan | 7.6 |"]
    parser = LineParser()
    read = [s for line in outer for s in parser.parse(line)]
    assert [(s.name, s.step) for s in read] == [("loss", 1000), ("eval_loss", 1000)]
    assert math.isnan(read[0].value)
    card = [
        "| Training Loss | Epoch | Step | Validation Loss | Wer    |",
        "|:-------------:|:-----:|:----:|:---------------:|:------:|",
        "| 0.522         | 1.0   | 400  | 1.2550          | 0.5649 |",
    ]
    parser = LineParser()
    read = [s for line in card for s in parser.parse(line)]
    # A model card's: the evaluation's metrics follow its loss, eval_loss_rise's task metric.
    assert [(s.name, s.step) for s in read] == [
        ("loss", 400),
        ("epoch", 400),
        ("eval_loss", 400),
        ("eval_wer", 400),
    ]


def test_pairs_apart_by_pipes_are_no_table_header() -> None:
    parser = LineParser()
    read = parser.parse("step 120 | loss 2.3141 | tok/s 15321")
    assert [(s.name, s.step) for s in read] == [("loss", 120), ("tokens_per_sec", 120)]
    assert [(s.name, s.step) for s in parser.parse("step 130 | loss 2.2 | tok/s 15300")] == [
        ("loss", 130),
        ("tokens_per_sec", 130),
    ]


#: Dreamer (TF2, mixed precision) blowing up (danijar/dreamer's issue thread): its
#: ``logger.write`` line every 1,000 environment steps.
DREAMER = [
    "[5000] expl_amount 0.0 / model_grad_norm nan / value_grad_norm 40.3 / image_loss 11650.7"
    " / div 77.2 / model_loss 5864.5 / value_loss 6.4 / actor_loss -6.9 / action_ent -23.6",
    "[6000] expl_amount 0.3 / model_grad_norm 4468751873343488.0 / image_loss 304112.1 / div"
    " 234.1 / model_loss 152175.0 / value_loss 6.3 / actor_loss -14.7 / fps 1.0",
    "[7000] expl_amount 0.3 / model_grad_norm nan / image_loss"
    " 8496855334057326588896827408384.0 / div inf / model_loss inf / value_loss 5.0 / fps 9.3",
]


def test_dreamers_lines_are_read_at_their_step_with_every_pair() -> None:
    parser = LineParser()
    read = [parser.parse(line) for line in DREAMER]
    assert {s.step for line in read for s in line} == {5000, 6000, 7000}
    second = {s.name: s.value for s in read[1]}
    assert second["model_grad_norm"] == 4468751873343488.0 and second["model_loss"] == 152175.0
    assert math.isinf(next(s.value for s in read[2] if s.name == "model_loss"))
    # Pairs apart by " / " that are no Dreamer line: a step of all, a ratio in prose.
    assert parser.parse("[100/900] level=0 loss=0.8160")[0].step == 100


def test_dreamers_inf_loss_is_critical_at_its_step_and_counts_the_values_before(
    tmp_path: Path,
) -> None:
    log = tmp_path / "train.log"
    log.write_text("\n".join(DREAMER) + "\n")
    result = replay([log], load_settings(None, environ={}))
    (critical,) = [a for a in result.alerts if a.severity == Severity.CRITICAL]
    assert (critical.rule, critical.step, critical.metric) == ("nan_inf", 7000, "model_loss")
    cause = critical.details["diagnosis"]["cause"]
    assert "2 finite values before it" in cause and "nothing before it" not in cause


def test_nanotrons_line_reads_its_scaled_values_and_no_ranks_as_metrics() -> None:
    """nanotron (its PR 23's log): ``[INFO|DP=0|PP=0|TP=0|host]:`` names the ranks, and
    ``human_format`` writes ``14.2K``; the throughput went unread, the ranks were metrics."""
    line = (
        "01/17/2024 13:47:27 [INFO|DP=0|PP=0|TP=0|ip-26-0-160-225]: iteration: 991 / 1000 |"
        " consumed_tokens: 634K | elapsed_time_per_iteration_ms: 45 | tokens_per_sec: 14.2K |"
        " tokens_per_sec_per_gpu: 1.78K | global_batch_size: 20 | lm_loss: 10.6 | lr: 1e-05 |"
        " grad_norm: 0.515 | cuda_memory_allocated: 75.2M |"
    )
    read = {s.name: (s.value, s.step) for s in LineParser().parse(line)}
    assert read["tokens_per_sec"] == (pytest.approx(14_200.0), 991)
    assert read["loss"] == (10.6, 991) and read["grad_norm"] == (0.515, 991)
    assert read["cuda_memory_allocated"][0] == pytest.approx(75.2e6)
    assert not {"dp", "pp", "tp"} & set(read)


def test_llm_cs_log_file_is_read_at_its_steps() -> None:
    """llm.c's ``main.log`` (modded-nanogpt's record of it): a training step's loss,
    learning rate and grad-norm, the validation loss, HellaSwag's accuracy."""
    parser = LineParser()
    read = [
        (s.name, s.value, s.step)
        for line in ["s:0 tel:11.0092", "s:3 trl:10.7157 lr:0.000003 norm:13.12", "s:250 eval:0.29"]
        for s in parser.parse(line)
    ]
    assert read == [
        ("eval_loss", 11.0092, 0),
        ("loss", 10.7157, 3),
        ("lr", 0.000003, 3),
        ("grad_norm", 13.12, 3),
        ("eval_acc", 0.29, 250),
    ]
    assert parser.parse("s:3 a note: of no metric") == []


def test_an_rl_runs_csv_with_spaced_names_keeps_its_objective_apart() -> None:
    """A PPO run's progress CSV (its ``total timesteps`` column spelt with a space): read at
    its environment steps, its ``total_loss`` under its own name (an RL objective moves
    with its rewards: as ``loss`` it raised a critical divergence while the reward climbed)."""
    lines = [
        "num_episodes,ep_rew_mean,total timesteps,total_time,total_loss,value_loss",
        "547,11.42926302,8192,2.69327712059021,,",
        "1050,9.8131856,16384,12.688928365707397,1.1647271305515068,1.1696610785555095",
    ]
    parser = LineParser()
    read = [(s.name, s.step) for line in lines for s in parser.parse(line)]
    assert ("total_loss", 16384) in read and ("ep_rew_mean", 8192) in read
    assert not any(name == "loss" for name, _ in read)
    # The same columns in a supervised run's CSV: its total loss is the loss.
    parser = LineParser()
    supervised = ["epoch,total loss,val_loss", "1,0.91,0.95"]
    assert [s.name for line in supervised for s in parser.parse(line)] == ["loss", "eval_loss"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            "I1002 21:38:13.425730 139917864867392 logging_writer.py:35] [400]"
            " steps_per_second=1.583725, train_learning_rate=0.358, train_loss=3.2198",
            [("steps_per_second", 400), ("lr", 400), ("loss", 400)],
            id="clu-metric-writer-behind-absl-head",
        ),
        pytest.param(
            "I0324 07:55:20.597360 140348344015936 controller.py:479] train | step:      1 |"
            " steps/sec:    xxxxx | output: {'train_accuracy': 0.0, 'train_loss': 12.634554}",
            [("train_accuracy", 1), ("loss", 1)],
            id="tf-model-garden-output-dict-at-its-step",
        ),
        pytest.param(
            "2021-05-14 11:36:51,758-INFO: epoch: 0, iter: 2, lr: 0.000001, 'loss': nan,"
            " 'acc': 0.0, time: 2.346",
            [("epoch", 2), ("lr", 2), ("loss", 2), ("acc", 2), ("time", 2)],
            id="paddleocr-quoted-names-bare-values",
        ),
    ],
)
def test_jax_and_tf_heads_and_quoted_names(line: str, expected: list[tuple[str, int]]) -> None:
    assert [(s.name, s.step) for s in LineParser().parse(line)] == expected


def test_flaxs_eval_epoch_line_is_the_evaluations() -> None:
    parser = LineParser()
    parser.parse("I1002 21:42:00.000000 139917864867392 logging_writer.py:35] [900] train_loss=3.0")
    line = (
        "I1002 21:43:14.804613 140411760846848 train.py:415] eval epoch: 2, loss: 6.6112,"
        " accuracy: 0.59"
    )
    assert [s.name for s in parser.parse(line)] == ["epoch", "eval_loss", "eval_accuracy"]
