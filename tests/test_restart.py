"""The restart after a kill cannot fail: the resume command's template, and no restart from nothing.

Real jobs under ``sentinel run``, really stopped and restarted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sentinel.config import ConfigError, load_settings, resume
from sentinel.supervisor.restarts import EXIT_GIVE_UP, preflight
from tests.test_run import _alerts, _records, sentinel

# --- the template, at load -------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "checkpoint", "expected"),
    [
        pytest.param(
            "python t.py --resume {checkpoint}",
            "/data/my run/checkpoint-35",
            ["python", "t.py", "--resume", "/data/my run/checkpoint-35"],
            id="space-in-path-stays-one-argument",
        ),
        pytest.param(
            "env RESUME_FROM={checkpoint}/model.pt torchrun t.py",
            "/ck/a b",
            ["env", "RESUME_FROM=/ck/a b/model.pt", "torchrun", "t.py"],
            id="inside-an-argument",
        ),
        pytest.param(
            """python t.py --cfg '{"lr": 1}' --from {checkpoint}""",
            "/ck/{step}",
            ["python", "t.py", "--cfg", '{"lr": 1}', "--from", "/ck/{step}"],
            id="literal-json-and-a-value-holding-a-placeholder",
        ),
    ],
)
def test_template_fills_each_argument_literally(
    template: str, checkpoint: str, expected: list[str]
) -> None:
    argv = resume.parse_template(template)
    assert resume.fill(argv, {"checkpoint": checkpoint, "step": "35"}) == expected


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        pytest.param("python t.py {chekpoint}", "unknown placeholder {chekpoint}", id="typo"),
        pytest.param("python 't.py", "cannot be split", id="unbalanced-quote"),
        pytest.param("   ", "is empty", id="empty"),
    ],
)
def test_a_bad_template_is_refused_at_load_naming_the_key_and_flag(
    template: str, problem: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(cli={"resume_command": template, "checkpoints": str(tmp_path)}, environ={})
    assert caught.value.problems == [
        f"job.resume_command (from --resume-command): {caught.value.problems[0].split(': ', 1)[1]}"
    ]
    assert problem in caught.value.problems[0]


def test_a_template_naming_checkpoint_without_a_checkpoint_dir_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[job]\nresume_command = "python t.py --resume {checkpoint}"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(config, environ={})
    assert str(config) in caught.value.problems[0]
    assert "no checkpoint dir is set" in caught.value.problems[0]


def test_preflight_refuses_a_resume_program_that_does_not_exist(tmp_path: Path) -> None:
    settings = load_settings(
        cli={"resume_command": "no-such-trainer --from {checkpoint}", "checkpoints": str(tmp_path)},
        environ={},
    )
    with pytest.raises(ConfigError) as caught:
        preflight(settings, [sys.executable, "-c", "pass"])
    assert caught.value.problems == [
        "job.resume_command: no-such-trainer is not an executable on PATH"
    ]
    preflight(load_settings(environ={}), [sys.executable, "-c", "pass"])  # a good one passes


@pytest.mark.slow
def test_bad_config_exits_2_before_the_job_starts(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    result = sentinel(
        "--state-dir", str(tmp_path / "state"), "--checkpoints", str(tmp_path / "ck"),
        "--resume-command", "python t.py --at {stepp}",
        "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')",
    )  # fmt: skip
    assert result.returncode == 2
    assert "job.resume_command (from --resume-command): unknown placeholder {stepp}" in (
        result.stderr
    )
    assert not marker.exists()


# --- real restarts ---------------------------------------------------------------------

# A job that saves ``step_<N>`` every 5 steps, goes NaN at step 7 on its first attempt only,
# and on a restart records the argv and environment it was given.
JOB = """
import json, os, sys, time
from pathlib import Path
ckpt, record = Path(os.environ["CKPT"]), Path(os.environ["RECORD"])
restart = int(os.environ.get("SENTINEL_RESTART") or 0)
with record.open("a") as f:
    f.write(json.dumps({"restart": restart, "argv": sys.argv[1:],
                        "resume_from": os.environ.get("SENTINEL_RESUME_FROM")}) + "\\n")
for step in range(1, 11):
    if step % 5 == 0 and restart == 0:
        (ckpt / f"step_{step}").mkdir(parents=True, exist_ok=True)
        (ckpt / f"step_{step}" / "state.json").write_text(json.dumps({"step": step}))
    loss = float("nan") if restart == 0 and step == 7 else 2.0 - step / 100
    print(json.dumps({"step": step, "loss": loss}), flush=True)
    if restart == 0 and step == 7:
        time.sleep(60)
    time.sleep(0.01)
"""


@pytest.fixture
def job(tmp_path: Path) -> Path:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return script


@pytest.mark.slow
def test_checkpoint_path_with_a_space_and_a_brace_restarts_as_one_argument(
    job: Path, tmp_path: Path
) -> None:
    ckpt = tmp_path / "my run {v1}" / "ckpt"
    record = tmp_path / "record.jsonl"
    template = f"""{sys.executable} {job} --cfg '{{"a": 1}}' --from {{checkpoint}} --at={{step}}"""
    result = sentinel(
        "--checkpoints", str(ckpt), "--state-dir", str(tmp_path / "state"),
        "--resume-command", template, "--", sys.executable, str(job),
        env={"CKPT": str(ckpt), "RECORD": str(record)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    _first, restarted = _records(record)
    clean = str((ckpt / "step_5").resolve())
    assert restarted["argv"] == ["--cfg", '{"a": 1}', "--from", clean, "--at=5"]
    assert restarted["resume_from"] == clean


@pytest.mark.slow
def test_no_clean_checkpoint_gives_up_with_90_and_says_why(job: Path, tmp_path: Path) -> None:
    ckpt, state, record = tmp_path / "ckpt", tmp_path / "state", tmp_path / "record.jsonl"
    ckpt.mkdir()
    env = {"CKPT": str(tmp_path / "elsewhere"), "RECORD": str(record)}  # saves nothing in ckpt
    result = sentinel(
        "--checkpoints", str(ckpt), "--state-dir", str(state),
        "--resume-command", f"{sys.executable} {job} --from {{checkpoint}}",
        "--", sys.executable, str(job), env=env,
    )  # fmt: skip
    assert result.returncode == EXIT_GIVE_UP, result.stderr
    assert len(_records(record)) == 1, "never restarted"
    said = [a["message"] for a in _alerts(state) if a["severity"] == "critical"]
    assert any("no clean checkpoint before step 7" in text and "giving up" in text for text in said)
    report = next((state / "reports").glob("*.md")).read_text()
    assert "no clean checkpoint before step 7" in report
    # The job saved beside it: the give-up says where.
    where = f"{ckpt}: that folder holds no checkpoint at all (checkpoints are in {tmp_path}/"
    assert any(f"{where}elsewhere" in text for text in said), said


@pytest.mark.slow
def test_a_checkpoint_folder_that_never_existed_is_named_at_the_give_up(
    job: Path, tmp_path: Path
) -> None:
    """A typo in --checkpoints is accepted at start (a Trainer makes its folder at its first
    save); at the NaN, the give-up says the folder never existed and where the real one is."""
    typo, real = tmp_path / "ckpts", tmp_path / "ckpt"
    state, record = tmp_path / "state", tmp_path / "record.jsonl"
    result = sentinel(
        "--checkpoints", str(typo), "--state-dir", str(state), "--",
        sys.executable, str(job), env={"CKPT": str(real), "RECORD": str(record)},
    )  # fmt: skip
    assert result.returncode == EXIT_GIVE_UP, result.stderr
    assert (real / "step_5").is_dir() and not typo.exists()
    line = next(line for line in result.stderr.splitlines() if "giving up" in line)
    assert f"no clean checkpoint before step 7 in {typo}: that folder never existed" in line
    assert f"(checkpoints are in {real}: --checkpoints names it?)" in line


@pytest.mark.slow
def test_scratch_restarts_the_original_command_never_an_empty_checkpoint(
    job: Path, tmp_path: Path
) -> None:
    ckpt, state, record = tmp_path / "ckpt", tmp_path / "state", tmp_path / "record.jsonl"
    ckpt.mkdir()
    env = {
        "CKPT": str(tmp_path / "elsewhere"),
        "RECORD": str(record),
        "SENTINEL_JOB__RESTART_WITHOUT_CHECKPOINT": "scratch",
    }
    result = sentinel(
        "--checkpoints", str(ckpt), "--state-dir", str(state),
        "--resume-command", f"{sys.executable} {job} --from {{checkpoint}}",
        "--", sys.executable, str(job), "original", env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    _first, restarted = _records(record)
    assert restarted["argv"] == ["original"], "the original command, not the resume template"
    assert restarted["resume_from"] == ""
    assert restarted["restart"] == 1


@pytest.mark.slow
def test_a_rollback_that_cannot_quarantine_gives_up_instead_of_resuming_poison(
    job: Path, tmp_path: Path
) -> None:
    ckpt, state, record = tmp_path / "ckpt", tmp_path / "state", tmp_path / "record.jsonl"
    ckpt.mkdir()
    (ckpt / "quarantine").write_text("a file where the quarantine folder must go")
    (ckpt / "step_9").mkdir()  # written after the onset: must be set aside
    (ckpt / "step_9" / "state.json").write_text("{}")
    result = sentinel(
        "--checkpoints", str(ckpt), "--state-dir", str(state),
        "--", sys.executable, str(job), env={"CKPT": str(ckpt), "RECORD": str(record)},
    )  # fmt: skip
    assert result.returncode == EXIT_GIVE_UP, result.stderr
    assert len(_records(record)) == 1, "not restarted over checkpoints it could not set aside"
    assert any("rollback failed" in a["message"] for a in _alerts(state))


def test_a_checkpoint_path_that_is_a_file_is_refused_before_the_job_starts(
    tmp_path: Path,
) -> None:
    not_a_dir = tmp_path / "ckpt"
    not_a_dir.write_text("")
    settings = load_settings(cli={"checkpoints": str(not_a_dir)}, environ={})
    with pytest.raises(ConfigError) as caught:
        preflight(settings, [sys.executable, "-c", "pass"])
    assert caught.value.problems == [f"checkpoints: {not_a_dir} is not a directory"]


def test_a_verdict_file_that_is_a_directory_is_refused_before_the_job_starts(
    tmp_path: Path,
) -> None:
    """Found when the verdict was to be written, at the end: the verdict was lost."""
    settings = load_settings(cli={"verdict_file": str(tmp_path)}, environ={})
    with pytest.raises(ConfigError) as caught:
        preflight(settings, [sys.executable, "-c", "pass"])
    assert caught.value.problems == [
        f"verdict_file: {tmp_path} is a directory, not a file to write"
    ]


@pytest.mark.slow
def test_max_restarts_0_leaves_a_final_verdict_90_for_whoever_waits(
    job: Path, tmp_path: Path
) -> None:
    ckpt, state, record = tmp_path / "ckpt", tmp_path / "state", tmp_path / "record.jsonl"
    result = sentinel(
        "--checkpoints", str(ckpt), "--state-dir", str(state), "--max-restarts", "0",
        "--", sys.executable, str(job), env={"CKPT": str(ckpt), "RECORD": str(record)},
    )  # fmt: skip
    assert result.returncode == 128 + 15, "run exits with the job's status: nothing restarted"
    final = json.loads((state / "verdict.json").read_text())
    assert (final["state"], final["code"]) == ("final", EXIT_GIVE_UP)
    waited = subprocess.run(
        [sys.executable, "-m", "sentinel", "verdict", "--state-dir", str(state), "--wait",
         "--timeout", "5", "--job-status", "143"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert waited.returncode == EXIT_GIVE_UP
