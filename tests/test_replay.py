"""``sentinel replay``: the live detectors over finished logs, through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import sentinel_here
from tests.helpers.env import without_settings

# ``replay`` starts nothing: its cases run ``main`` in this process (``tests.helpers.cli``),
# but the one that must not import what this process has (tensorboard).
pytestmark = pytest.mark.slow

T0 = 1_700_000_000


def sentinel(
    *args: str | Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``sentinel ARGS`` in ``cwd``, with only the ``SENTINEL_*`` variables given here."""
    return sentinel_here(*args, cwd=cwd, env=without_settings() | (env or {}))


def write_jsonl(path: Path, records: list[dict[str, Any]], extra: Sequence[str] = ()) -> Path:
    lines = [json.dumps(record) for record in records] + list(extra)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def alerts_of(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


@pytest.fixture
def nan_log(tmp_path: Path) -> Path:
    records = [{"step": s, "loss": 2.5 - s / 20, "grad_norm": 0.8} for s in range(1, 16)]
    records[6]["loss"] = float("nan")  # step 7
    return write_jsonl(tmp_path / "metrics.jsonl", records)


@pytest.fixture
def healthy_log(tmp_path: Path) -> Path:
    records = [{"step": s, "loss": 2.5 - s / 20, "grad_norm": 0.8} for s in range(1, 16)]
    return write_jsonl(tmp_path / "healthy.jsonl", records)


def test_json_output_first_nan_inf_at_step_7(nan_log: Path, tmp_path: Path) -> None:
    result = sentinel("replay", "--json", nan_log, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    alerts = alerts_of(result.stdout)
    nan_alerts = [a for a in alerts if a["rule"] == "nan_inf"]
    assert nan_alerts, result.stdout
    assert nan_alerts[0]["step"] == 7
    assert nan_alerts[0]["severity"] == "critical"
    assert nan_alerts[0]["value"] == "nan"
    assert nan_alerts[0]["metric"] == "loss"


def test_fail_on_critical_exits_1_on_nan_log(nan_log: Path, tmp_path: Path) -> None:
    result = sentinel("replay", "--fail-on", "critical", nan_log, cwd=tmp_path)
    assert result.returncode == 1, result.stderr


def test_fail_on_critical_exits_0_on_healthy_log(healthy_log: Path, tmp_path: Path) -> None:
    result = sentinel("replay", "--json", "--fail-on", "critical", healthy_log, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert alerts_of(result.stdout) == []


def test_table_names_the_rule_and_first_step(nan_log: Path, tmp_path: Path) -> None:
    result = sentinel("replay", nan_log, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("nan_inf ")]
    assert row.split()[:4] == ["nan_inf", "yes", "critical", "7"]
    assert "1 incident(s)" in result.stdout


def test_garbled_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    records = [{"step": s, "loss": 2.0} for s in range(1, 6)]
    records.append({"step": 6, "loss": float("inf")})
    log = write_jsonl(
        tmp_path / "torn.jsonl", records, extra=['{"step": 7, "loss": 1.', '{"step": 8, "lo']
    )
    result = sentinel("replay", log, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "2 garbled lines skipped" in result.stdout
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("nan_inf ")]
    assert row.split()[:4] == ["nan_inf", "yes", "critical", "6"]


def test_trainer_state_with_bare_nan(tmp_path: Path) -> None:
    history = (
        "["
        + ", ".join(
            f'{{"step": {s}, "loss": {"NaN" if s == 30 else 2.0}, "grad_norm": 1.0, "epoch": 0.1}}'
            for s in range(10, 60, 10)
        )
        + "]"
    )
    state = tmp_path / "trainer_state.json"
    state.write_text(f'{{"global_step": 50, "log_history": {history}}}', encoding="utf-8")
    assert "NaN" in state.read_text(encoding="utf-8")
    result = sentinel("replay", "--json", state, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    nan_alerts = [a for a in alerts_of(result.stdout) if a["rule"] == "nan_inf"]
    assert [(a["step"], a["metric"]) for a in nan_alerts] == [(30, "loss")]


def test_stall_from_the_datas_own_clock(tmp_path: Path) -> None:
    records = [{"step": s, "loss": 2.0, "time": T0 + 10 * s} for s in range(1, 6)]
    records += [{"step": s, "loss": 2.0, "time": T0 + 7200 + 10 * s} for s in range(6, 9)]
    log = write_jsonl(tmp_path / "gap.jsonl", records)
    result = sentinel(
        "replay",
        "--json",
        log,
        cwd=tmp_path,
        env={"SENTINEL_RULES__STALL__SOFT_TIMEOUT_S": "600"},
    )
    assert result.returncode == 0, result.stderr
    stall = [a for a in alerts_of(result.stdout) if a["rule"] == "stall"]
    # Two hours without a step after step 5: past both the 10-minute and 30-minute timeouts.
    assert stall, f"no stall alert for a 2-hour gap in the data:\n{result.stdout}"
    assert stall[0]["step"] == 5
    assert {a["severity"] for a in stall} >= {"critical"}


def test_missing_file_exits_2(tmp_path: Path) -> None:
    result = sentinel("replay", tmp_path / "nope.jsonl", cwd=tmp_path)
    assert result.returncode == 2
    assert "nope.jsonl" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("every", [1, 100], ids=lambda n: f"every-{n}-steps")
@pytest.mark.parametrize("before", [2, 20], ids=lambda n: f"{n}-values-before")
@pytest.mark.parametrize(
    ("finite", "broken"),
    [
        pytest.param(
            "Epoch [1/1], Step [{step}/99999], avg_rd: {v:.4f} | cur_rd: 0.5 | avg_mse: 0.02",
            "Epoch [1/1], Step [{step}/99999], avg_rd: nan | cur_rd: nan | avg_mse: nan",
            id="objective-without-a-loss",
        ),
        pytest.param(
            "Score at iteration {step} is {v:.4f}",
            "Score at iteration {step} is NaN",
            id="dl4j-score",
        ),
        pytest.param(
            "INFO  DistriOptimizer$:295 - [Epoch 1 0/99][Iteration {step}] Throughput is 408.4"
            " records/second. Loss is {v:.4f}. Current learning rate is 0.0463.",
            "INFO  DistriOptimizer$:295 - [Epoch 1 0/99][Iteration {step}] Throughput is 447.2"
            " records/second. Loss is Infinity. Current learning rate is 0.0463.",
            id="bigdl-loss-is",
        ),
        pytest.param(
            "Epoch  1, {step}/999999; acc:   4.48; ppl: 35173.75; xent:  {v:.2f}; 3599 src tok/s;",
            "Epoch  1, {step}/999999; acc:   1.89; ppl: inf; xent:  nan; 3599 src tok/s;",
            id="opennmt-legacy-xent",
        ),
        pytest.param(
            "| epoch 001:   {step} / 99999 loss={v:.4f}, nll_loss=1.2",
            "| epoch 001:   {step} / 99999 loss=inf, nll_loss=inf",
            id="fairseq-older",
        ),
    ],
)
def test_a_failure_in_these_line_forms_is_critical_at_its_step(
    tmp_path: Path, every: int, before: int, finite: str, broken: str
) -> None:
    """Each line form read at its own step, at any cadence and however short the history."""
    lines = [finite.format(step=every * i, v=2.0 - i / 1000) for i in range(1, before + 1)]
    bad = every * (before + 1)
    lines.append(broken.format(step=bad))
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    result = sentinel("replay", "--json", "--fail-on", "critical", str(log), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    criticals = [a for a in alerts_of(result.stdout) if a["severity"] == "critical"]
    assert [(a["rule"], a["step"]) for a in criticals] == [("nan_inf", bad)]


def test_event_files_are_read_with_neither_tensorboard_nor_protobuf(tmp_path: Path) -> None:
    """The base install reads TensorBoard event files: sentinel decodes them itself."""
    events = Path(__file__).resolve().parent / "fixtures" / "tb" / "diverge"
    blocked = (  # an import of either raises ImportError
        "import sys; sys.modules.update(dict.fromkeys(['tensorboard', 'google.protobuf']))\n"
        "from sentinel.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )
    without = subprocess.run(
        [sys.executable, "-c", blocked, "replay", "--json", str(events)],
        cwd=Path(__file__).resolve().parents[1],
        env=without_settings(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert without.returncode == 0, without.stderr
    alerts = alerts_of(without.stdout)
    assert ("nan_inf", 126) in [(alert["rule"], alert["step"]) for alert in alerts]
    assert without.stdout == sentinel("replay", "--json", events, cwd=tmp_path).stdout
