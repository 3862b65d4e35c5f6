"""What ``fedlit --help`` and a command's ``--help`` show a new user."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedlit.cli import COMMANDS, LIGHTNING_ONLY, TRAINER_KEYS, main

REPO = Path(__file__).parents[1]


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


def test_fit_help_shows_fedlits_settings_and_no_other_trainer_ones() -> None:
    short = subprocess.run(
        [sys.executable, "-m", "fedlit.cli", "fit", "--help"], capture_output=True, text=True
    )
    assert short.returncode == 0, short.stderr
    # at once: the recipe's groups, and how to see every setting
    assert "Train a federation" in short.stdout
    assert "fedlit fit --config recipes/quickstart.yaml --help" in short.stdout
    done = subprocess.run(
        [sys.executable, "-m", "fedlit.cli", "fit", "--config=recipes/quickstart.yaml", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for key in ("--federation.rounds", "--data.partitioner"):
        assert key in out
    listed = set(re.findall(r"--trainer\.(\w+)", out))
    assert (
        listed
        == set(TRAINER_KEYS)
        == {
            *("accelerator", "devices", "precision", "strategy", "gradient_clip_val"),
            *("gradient_clip_algorithm", "accumulate_grad_batches", "deterministic", "benchmark"),
            *("limit_train_batches", "detect_anomaly", "default_root_dir", "logger"),
        }
    )
    assert {"max_epochs", "callbacks", "fast_dev_run"} <= LIGHTNING_ONLY.keys()
    assert "--ckpt_path" not in out  # fit continues from --federation.resume
    assert "Train a federation" in out


@pytest.mark.parametrize("command", ["partition", "compare"])
def test_partition_and_compare_help_list_their_flags(command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fedlit.cli", command, "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert f"usage: fedlit {command}" in done.stdout
    flags = {"partition": ("--out", "--config", "--data.partitioner", "--seed_everything")}
    for flag in flags.get(command, ("--config", "--recipes", "--seeds", "--settings", "--out")):
        assert f"{flag} " in done.stdout, flag
    if command == "compare":  # the docstrings' reST markup left out
        for markup in ("``", ":func:", ":class:", ":mod:", ":data:", ":meth:"):
            assert markup not in done.stdout, markup
        assert "the fedlit compare config" in done.stdout


def test_plain_help_drops_rest_roles_and_literals() -> None:
    from fedlit.cli.compare import plain

    text = "see :func:`~fedlit.reporting.summary`, :mod:`fedlit.comparison` and ``--out``"
    assert plain(text) == "see summary, fedlit.comparison and --out"


def test_compare_help_imports_neither_torch_nor_lightning() -> None:
    """``fedlit compare --help`` reads the spec's settings only: it printed after 8-12 s of
    importing torch and Lightning before."""
    code = (
        "import sys\n"
        "from fedlit.cli import main\n"
        "try:\n"
        "    main(['compare', '--help'])\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0, done.code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning'))\n"
        "print('HEAVY', heavy[:3])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "usage: fedlit compare" in done.stdout
    assert "HEAVY []" in done.stdout
