"""The README's set-up, as a user meets it: ``.ci/install`` works where the system's Python is
externally managed (PEP 668), by installing into a virtual environment; it picks torch's build
by the presence of a GPU; CI runs the README's own test command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL = ROOT / ".ci" / "install"

#: A system Python the way Debian 12 ships it: pip refuses to install into it (PEP 668). The
#: wrapper logs every call, then runs the real interpreter for anything but pip.
EXTERNALLY_MANAGED = """#!/bin/sh
echo "$*" >> "{log}"
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  echo "error: externally-managed-environment" >&2
  exit 1
fi
exec "{python}" "$@"
"""


def _system_python(tmp_path: Path) -> tuple[Path, Path]:
    """(an externally managed ``python3``, the log of its calls)."""
    log = tmp_path / "system-python.log"
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.write_text(EXTERNALLY_MANAGED.format(log=log, python=sys.executable))
    python.chmod(0o755)
    return python, log


def _install(
    tmp_path: Path, *args: str, gpu: bool = False, dry_run: bool = True, venv_options: str = ""
) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        _system_python(tmp_path)
    if gpu:
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\nexit 0\n")
        smi.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:/usr/bin:/bin",  # no nvidia-smi unless the fake one
        "PYTHON": str(bin_dir / "python3"),
        "FEDLIT_VENV": str(tmp_path / "venv"),
        "FEDLIT_VENV_OPTIONS": venv_options,
        "FEDLIT_TORCH_CPU_INDEX": "https://download.pytorch.org/whl/cpu",
    }
    if dry_run:
        env["FEDLIT_INSTALL_DRY_RUN"] = "1"
    for key in ("VIRTUAL_ENV", "PYTHONPATH"):
        env.pop(key, None)
    return subprocess.run(
        ["bash", str(INSTALL), *args], env=env, capture_output=True, text=True, timeout=240
    )


def _pip_lines(out: str) -> list[str]:
    return [line.split("-m pip install ", 1)[1] for line in out.splitlines() if "dry run:" in line]


def test_install_uses_a_venv_and_the_cpu_torch_without_a_gpu(tmp_path: Path) -> None:
    done = _install(tmp_path, venv_options="--without-pip")
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "system-python.log").read_text().splitlines()
    assert not any(call.startswith("-m pip") for call in calls)  # never the system's pip
    assert any(call.startswith(f"-m venv --without-pip {tmp_path / 'venv'}") for call in calls)
    assert (tmp_path / "venv" / "pyvenv.cfg").is_file()
    venv_python = f"{tmp_path / 'venv'}/bin/python -m pip install"
    assert all(venv_python in line for line in done.stdout.splitlines() if "dry run:" in line)
    torch, fedlit = _pip_lines(done.stdout)
    assert torch == (
        "--timeout 30 --retries 1 --index-url https://download.pytorch.org/whl/cpu "
        "torch==2.14.1+cpu torchvision==0.29.1+cpu"
    )
    assert fedlit == "-e ."  # the quick-start's needs only: no test extras

    again = _install(tmp_path, "test")  # reuses the venv: no second `-m venv`
    assert again.returncode == 0, again.stderr
    calls = (tmp_path / "system-python.log").read_text().splitlines()
    assert sum(call.startswith("-m venv") for call in calls) == 1
    assert _pip_lines(again.stdout)[-1] == "-e .[test]"


def test_install_takes_the_default_cuda_torch_with_a_gpu(tmp_path: Path) -> None:
    done = _install(tmp_path, "notebook", gpu=True, venv_options="--without-pip")
    assert done.returncode == 0, done.stderr
    assert _pip_lines(done.stdout) == ["torch==2.14.1 torchvision==0.29.1", "-e .[notebook]"]


def test_install_refuses_an_unknown_extra_before_any_work(tmp_path: Path) -> None:
    done = _install(tmp_path, "tests")
    assert done.returncode == 2
    assert "unknown extra 'tests'" in done.stderr
    assert not (tmp_path / "venv").exists()
    assert not (tmp_path / "system-python.log").exists()


@pytest.mark.slow
def test_install_for_real_into_a_venv_beside_an_externally_managed_python(
    tmp_path: Path,
) -> None:
    """The real install (no dry run) into a venv that sees this machine's packages (torch is
    not downloaded again): fedlit's console script runs from the venv, on this tree."""
    done = _install(tmp_path, dry_run=False, venv_options="--system-site-packages")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    calls = (tmp_path / "system-python.log").read_text().splitlines()
    assert not any(call.startswith("-m pip") for call in calls)
    where = subprocess.run(
        [str(tmp_path / "venv" / "bin" / "python"), "-c", "import fedlit; print(fedlit.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert where.stdout.strip() == str(ROOT / "fedlit" / "__init__.py"), where.stderr
    assert (tmp_path / "venv" / "bin" / "fedlit").is_file()


def test_ci_runs_the_readme_commands() -> None:
    """The README's two set-up commands are what CI and the install script provide: CI's last
    command is the README's test command, exactly."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Set-up: two commands.*?```bash\n(.*?)```", readme, re.S)
    assert block is not None
    commands = [line for line in block.group(1).splitlines() if line and line[0] != "#"]
    assert len(commands) == 2
    quickstart, tests = commands
    assert quickstart.startswith("bash .ci/install && .venv/bin/fedlit fit --config ")
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci[-1] == tests
    assert " -q" not in tests  # progress per test file
