"""HF Trainer output: printed log dicts (4.x bare floats, 5.x strings) and trainer_state.json."""

from __future__ import annotations

import json
import math

import pytest

from sentinel.model.records import PROGRESS, Sample
from sentinel.parsing import Garbled, LineParser, hf_trainer
from sentinel.parsing.hf_trainer import parse_hf_dict, read_trainer_state, trainer_state_info

# Each test runs with the stdlib and with orjson (tests/parsers/conftest.py).
pytestmark = pytest.mark.usefixtures("json_library")

NAN = math.nan
INF = math.inf


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            "{'loss': 2.3141, 'grad_norm': 1.25, 'learning_rate': 4.9e-05, 'epoch': 0.02}",
            [
                Sample("loss", 2.3141),
                Sample("grad_norm", 1.25),
                Sample("lr", 4.9e-05),
                Sample("epoch", 0.02),
            ],
            id="v4-train-line",
        ),
        pytest.param(
            "{'loss': 2.3141, 'grad_norm': nan, 'learning_rate': 4.9e-05, 'epoch': 0.02}",
            [
                Sample("loss", 2.3141),
                Sample("grad_norm", NAN),
                Sample("lr", 4.9e-05),
                Sample("epoch", 0.02),
            ],
            id="v4-bare-nan",
        ),
        pytest.param(
            "{'loss': inf, 'grad_norm': -inf}",
            [Sample("loss", INF), Sample("grad_norm", -INF)],
            id="v4-bare-inf",
        ),
        pytest.param(
            "{'loss': '2.3141', 'grad_norm': 'nan', 'learning_rate': '4.9e-05', 'epoch': '0.02'}",
            [
                Sample("loss", 2.3141),
                Sample("grad_norm", NAN),
                Sample("lr", 4.9e-05),
                Sample("epoch", 0.02),
            ],
            id="v5-strings",
        ),
        pytest.param(
            "{'eval_loss': 2.1, 'eval_runtime': 1.2, 'eval_samples_per_second': 80.1, "
            "'eval_steps_per_second': 10.0, 'epoch': 1.0}",
            [
                Sample("eval_loss", 2.1),
                Sample("eval_runtime", 1.2),
                Sample("eval_samples_per_second", 80.1),
                Sample("eval_steps_per_second", 10.0),
                Sample("epoch", 1.0),
            ],
            id="eval-line",
        ),
        pytest.param(
            "{'train_runtime': 12.3, 'train_samples_per_second': 40.5, "
            "'train_steps_per_second': 5.1, 'train_loss': 2.5, 'epoch': 3.0}",
            [
                Sample("train_runtime", 12.3),
                Sample("train_samples_per_second", 40.5),
                Sample("train_steps_per_second", 5.1),
                Sample("train_loss", 2.5),
                Sample("epoch", 3.0),
            ],
            id="summary-keeps-mean-train-loss-apart",
        ),
        pytest.param(
            "{'loss': tensor(2.5, device='cuda:0'), 'grad_norm': 0.5}",
            [Sample("loss", 2.5), Sample("grad_norm", 0.5)],
            id="tensor-value",
        ),
        pytest.param(
            "{'loss': 1.0, 'done': True, 'note': 'warmup', 'x': None, 'ids': [1, 2]}",
            [Sample("loss", 1.0)],
            id="ignores-bool-text-none-list",
        ),
        pytest.param("{'loss': 1.0, }", [Sample("loss", 1.0)], id="trailing-comma"),
        pytest.param("  {'loss': 1.0}  \r", [Sample("loss", 1.0)], id="spaces-and-cr"),
        pytest.param('{"loss": 1.0}', None, id="json-not-mine"),
        pytest.param("loss: 1.0", None, id="text-not-mine"),
    ],
)
def test_parse_hf_dict(line: str, expected: list[Sample] | None) -> None:
    assert repr(parse_hf_dict(line)) == repr(expected)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("{'loss': 2.3141, 'grad_norm': na", id="truncated-value"),
        pytest.param("{'loss': 2.3141, 'gra", id="truncated-key"),
        pytest.param("{'loss' 2.3}", id="missing-colon"),
        pytest.param("{'loss': 2.3}}", id="extra-brace"),
    ],
)
@pytest.mark.slow
def test_broken_hf_dict_is_garbled(line: str) -> None:
    with pytest.raises(Garbled):
        parse_hf_dict(line)


TRAINER_STATE = """{
  "best_metric": null,
  "epoch": 1.0,
  "global_step": 20,
  "logging_steps": 10,
  "max_steps": 40,
  "num_train_epochs": 2,
  "train_batch_size": 8,
  "is_hyper_param_search": false,
  "log_history": [
    {"epoch": 0.5, "grad_norm": 1.5, "learning_rate": 4e-05, "loss": 2.5, "step": 10},
    {"epoch": 1.0, "grad_norm": NaN, "learning_rate": 3e-05, "loss": Infinity, "step": 20},
    {"epoch": 1.0, "eval_loss": 2.4, "eval_runtime": 0.5, "step": 20}
  ]
}"""


def test_read_trainer_state_gives_each_entry_at_its_step() -> None:
    assert repr(read_trainer_state(TRAINER_STATE)) == repr(
        [
            Sample("epoch", 0.5, 10),
            Sample("grad_norm", 1.5, 10),
            Sample("lr", 4e-05, 10),
            Sample("loss", 2.5, 10),
            Sample("epoch", 1.0, 20),
            Sample("grad_norm", NAN, 20),
            Sample("lr", 3e-05, 20),
            Sample("loss", INF, 20),
            Sample("epoch", 1.0, 20),
            Sample("eval_loss", 2.4, 20),
            Sample("eval_runtime", 0.5, 20),
        ]
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param('{"log_history": []}', [], id="empty-history"),
        pytest.param("{}", [], id="no-history"),
        pytest.param(
            '{"log_history": [{"step": 5}, 3, {"loss": 1.0, "step": 6}]}',
            [Sample(PROGRESS, 5.0, 5), Sample("loss", 1.0, 6)],
            id="skips-non-objects",
        ),
    ],
)
def test_read_trainer_state_edges(text: str, expected: list[Sample]) -> None:
    assert read_trainer_state(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"log_history": [', id="truncated"),
        pytest.param("[]", id="not-an-object"),
        pytest.param('{"log_history": {}}', id="history-not-a-list"),
    ],
)
def test_broken_trainer_state_is_garbled(text: str) -> None:
    with pytest.raises(Garbled):
        read_trainer_state(text)


def test_trainer_state_info() -> None:
    assert trainer_state_info(TRAINER_STATE) == {
        "max_steps": 40,
        "logging_steps": 10,
        "train_batch_size": 8,
        "global_step": 20,
        "num_train_epochs": 2,
    }


def test_trainer_state_info_skips_missing_and_non_integers() -> None:
    text = json.dumps({"max_steps": 10, "logging_steps": True, "train_batch_size": "big"})
    assert trainer_state_info(text) == {"max_steps": 10}


DICT_LINES = [
    "{'loss': '4.704', 'grad_norm': '1.061', 'learning_rate': '0.0005', 'epoch': '0.01562'}",
    "{'loss': 2.3141, 'grad_norm': 1.25, 'learning_rate': 4.9e-05, 'epoch': 0.02}",
    "{'loss': 2.3141, 'grad_norm': nan, 'learning_rate': 4.9e-05, 'epoch': 0.02}",
    "{'loss': 'nan', 'grad_norm': 'inf', 'x': '-Infinity', 'y': ' 2.5 ', 'z': 'abc'}",
    "{'loss': NaN, 'grad_norm': Infinity, 'lr': -Infinity}",
    "{'loss': 1e999, 'grad_norm': -1e999, 'lr': 1e-999}",
    "{'loss': 1" + "0" * 400 + ", 'lr': 5}",
    "{'step': 5, 'loss': 1.0}",
    "{'step': 5.0, 'loss': 1.0}",
    "{'step': '5', 'loss': '1.0'}",
    "{'loss': 1.0, 'loss': 2.0, 'lr': 0.5}",
    "{'train_runtime': '8.28', 'train_loss': '4.709', 'loss': '1.0', 'epoch': '0.625'}",
    "{'loss': 1.0, 'done': True, 'note': 'warmup', 'x': None, 'ids': [1, 2]}",
    "{'loss': 1.0, 'nested': {'a': 1}}",
    "{'loss': 1.0, 'ids': [[1], 2]}",
    "{'loss': tensor(2.5, device='cuda:0'), 'grad_norm': 0.5}",
    "{'name': \"it's\", 'loss': 1.0}",
    "{'loss': 1.0, }",
    "{ 'loss' :\t1.0 }",
    "{'loss': +1.0, 'lr': .5, 'x': 1.}",
    "{'lo\\'ss': 1.0}",
    "{'loss': '1,5', 'lr': 'a,b'}",
    "{'loss': 2.3141, 'gra",
    "{'loss': 2.3}}",
    "{'loss' 2.3}",
]


@pytest.mark.parametrize("line", DICT_LINES, ids=[f"dict{i}" for i in range(len(DICT_LINES))])
def test_json_fast_path_reads_what_the_regexes_read(
    line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def outcome() -> object:
        try:
            samples = parse_hf_dict(line)
        except Garbled:
            return "garbled"
        assert samples is not None
        return [(s.name, repr(s.value), s.step, s.time) for s in samples]

    fast = outcome()
    monkeypatch.setattr(hf_trainer, "_fields_as_json", lambda stripped: None)
    assert fast == outcome()


@pytest.mark.parametrize(
    ("line", "fast"),
    [
        pytest.param(DICT_LINES[0], True, id="v5-strings"),
        pytest.param(DICT_LINES[1], True, id="v4-floats"),
        pytest.param(DICT_LINES[2], False, id="bare-nan"),
        pytest.param(DICT_LINES[7], False, id="int"),
        pytest.param(DICT_LINES[12], False, id="true-none-list"),
        pytest.param(DICT_LINES[13], False, id="nested"),
        pytest.param(DICT_LINES[16], False, id="double-quote"),
        pytest.param(DICT_LINES[20], False, id="backslash"),
    ],
)
def test_json_fast_path_takes_only_plain_dicts(line: str, fast: bool) -> None:
    assert (hf_trainer._fields_as_json(line) is not None) is fast


def test_a_dict_whose_quotes_an_editor_curled_is_read() -> None:
    """huggingface/transformers issue #33336 pasted its dicts as ``{‘loss’: 1.453, ...}``."""
    line = "{\u2018loss\u2019: 1.453, \u2018grad_norm\u2019: 2.4744, \u2018epoch\u2019: 0.19}"
    samples = LineParser().parse(line)
    assert [(s.name, s.value) for s in samples] == [
        ("loss", 1.453),
        ("grad_norm", 2.4744),
        ("epoch", 0.19),
    ]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            "{'loss': 1.51,  'grad_norm': 11140.00}    <-- spike #2 (step 9): ~1500x",
            [("loss", 1.51), ("grad_norm", 11140.0)],
            id="a-note-pasted-after-an-hf-dict",
        ),
        pytest.param(
            '{"step": 5, "loss": 2.0} (resumed here)',
            [("loss", 2.0)],
            id="text-after-a-json-object",
        ),
    ],
)
def test_a_dict_with_text_after_it_is_read(line: str, expected: list[tuple[str, float]]) -> None:
    parser = LineParser()
    assert [(s.name, s.value) for s in parser.parse(line)] == expected
    assert parser.stats.garbled == 0


def test_a_grpo_records_loss_is_its_policy_objective_not_a_loss_to_judge_by_ratio() -> None:
    """TRL's GRPOTrainer (a real Kaggle run's dicts): its loss is near 0 and either sign by
    design; read as ``loss``, 0.005 -> 0.019 -> 0.033 was a shift up. A DPO record (its
    ``rewards/`` and no sampled completions) keeps its loss."""
    grpo = (
        "{'loss': '0.005131', 'grad_norm': '0.7478', 'learning_rate': '5e-06',"
        " 'completions/mean_length': '369.6', 'reward': '0.1476', 'reward_std': '0.7427',"
        " 'kl': '1.05e-05', 'epoch': '0.01'}"
    )
    names = [sample.name for sample in parse_hf_dict(grpo) or []]
    assert "policy_loss" in names and "loss" not in names
    dpo = "{'loss': 0.6931, 'rewards/chosen': 0.0, 'rewards/margins': 0.0, 'epoch': 0.01}"
    assert "loss" in [sample.name for sample in parse_hf_dict(dpo) or []]
