"""What ``fedlit --help`` and a command's ``--help`` show a new user."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from fedlit.cli import COMMANDS, REFUSED_KEYS, main


def test_fedlit_help_lists_the_five_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    listed = re.findall(r"^  (\w+) {2,}\S", out, re.M)
    assert listed == ["fit", "test", *COMMANDS] == ["fit", "test", "compare", "report", "partition"]
    assert "Lightning Trainer" not in out

    with pytest.raises(SystemExit) as done:  # no command: the same list, on stderr, status 2
        main([])
    assert done.value.code == 2
    assert capsys.readouterr().err.count("fedlit partition --config") == 1


def test_fit_help_shows_fedlits_settings_not_the_refused_trainer_ones() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fedlit.cli", "fit", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for key in ("--federation.rounds", "--data.partitioner", "--trainer.accelerator"):
        assert key in out
    for key in REFUSED_KEYS:
        assert f"--trainer.{key} " not in out and f"--trainer.{key}.help" not in out, key
    assert "--ckpt_path" not in out  # fit continues from --federation.resume
    assert "Train a federation" in out
