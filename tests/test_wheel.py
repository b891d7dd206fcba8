"""The package as it ships: the sdist and the wheel build, pass ``twine check``, and the wheel,
installed in a venv of its own, runs ``sentinel demo`` (its bundled toy job included).

Until a release is published this is how sentinel is installed outside a clone (README,
"Install"). The venv takes its dependencies from the suite's site-packages (a ``.pth`` line
after its own site-packages, where the wheel goes: ``--no-deps``, the wheel's own files are
what is checked, not the registry's).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.helpers.env import clean_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_and_sdist_build_check_and_the_wheel_runs_the_demo(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    for kind in ("--sdist", "--wheel"):
        subprocess.run(
            [sys.executable, "-c", "from setuptools import build_meta as b; import sys;"
             f" (b.build_sdist if sys.argv[1] == '--sdist' else b.build_wheel)({str(dist)!r})",
             kind],
            cwd=ROOT, check=True, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    wheel = next(dist.glob("sentinel_watchdog-*.whl"))
    sdist = next(dist.glob("sentinel_watchdog-*.tar.gz"))
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    names = zipfile.ZipFile(wheel).namelist()
    assert "sentinel/demo/toy_job.py" in names and "sentinel/process/relay.py" in names
    assert not [name for name in names if name.startswith("tests/")]

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(own) / "suite-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-deps", "--force-reinstall", str(wheel)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    # Run from a folder that is not the clone, with no PYTHONPATH: the wheel's sentinel.
    env = {k: v for k, v in clean_env().items() if k != "PYTHONPATH"}
    demo = subprocess.run(
        [str(env_dir / "bin" / "sentinel"), "demo"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "Result: the job finished with exit status 0 after 1 restart(s)" in demo.stdout
    where = subprocess.run(
        [str(python), "-c", "import sentinel; print(sentinel.__file__)"], cwd=tmp_path, env=env,
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert str(env_dir) in where.stdout, where.stdout
