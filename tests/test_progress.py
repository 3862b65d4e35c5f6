"""What a running federation tells its user: the stage within each round, the time left, and
on Ctrl-C what was kept and the command that continues the run."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import stop_in_round, tiny_data, tiny_overrides

from fedlit.cli import INTERRUPTED, main
from fedlit.federation import Callback, Federation, FederationConfig, RunView
from fedlit.methods import FedAvgFixMatch, FederatedMethod
from fedlit.models import Architecture


class Stages(Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[int, str]] = []

    def on_stage(self, run: RunView, round_idx: int, stage: str) -> None:
        self.seen.append((round_idx, stage))


def _tiny(
    root: Path,
    run_dir: Path,
    method: Callable[[Architecture], FederatedMethod] = FedAvgFixMatch,
    **kw: object,
) -> Federation:
    """Two rounds of ``method`` (of ``Architecture(10, 1)``) on 2 of 3 clients of 32 images, with
    the progress bar and :class:`Stages`; ``kw``: the federation's other settings."""
    data = tiny_data(root, num_clients=3, labeled_per_class=2, val_per_class=1, test_subset=50)
    return Federation(
        method(Architecture(10, 1)),
        data,
        FederationConfig(rounds=2, clients_per_round=2, **kw),  # type: ignore[arg-type]
        run_dir=run_dir,
        progress=True,
        extra_callbacks=[Stages()],
    )


def test_the_bar_shows_each_stage_and_the_time_left(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fed = _tiny(fmnist_root, tmp_path / "fm", eval_every=2)
    fed.run()
    stages = fed.callbacks.items[-1]
    assert isinstance(stages, Stages)
    # FedAvg-FixMatch: server step, clients, the aggregate fine-tuned; evaluated every 2nd round
    round_stages = ["server step", "client 1/2", "client 2/2", "fine-tune"]
    assert stages.seen == [(0, "loading the data (fashion_mnist) and partitioning it")] + [
        *[(1, s) for s in round_stages],
        *[(2, s) for s in round_stages],
        (2, "evaluation"),
    ]
    err = capsys.readouterr().err
    assert "round 1/2: client 2/2" in err and "round 2/2: evaluation" in err
    # after the first round the bar has a rate, so an estimate of the time left
    assert re.search(r"1/2 \[\d\d:\d\d<\d\d:\d\d", err), err


def test_lines_without_a_terminal_give_the_time_left(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fed = _tiny(fmnist_root, tmp_path / "fm")
    fed.progress = None  # stderr is not a terminal here: a line per round
    fed.run()
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"round 1/2  acc \d\.\d{4}  [\d.]+ s  about \d+ s left", lines[0])
    assert re.fullmatch(r"round 2/2  acc \d\.\d{4}  [\d.]+ s", lines[1])  # nothing left


def test_ctrl_c_says_what_was_kept_and_how_to_continue(
    fmnist_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run"
    args = [
        "fit",
        "--config=recipes/quickstart.yaml",
        *tiny_overrides(fmnist_root, rounds=3),
        f"--trainer.default_root_dir={run}",
    ]
    undo = stop_in_round(monkeypatch, 1)
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == INTERRUPTED == 130
    err = capsys.readouterr().err
    assert "interrupted in round 1 of 3, before the run's first checkpoint" in err
    assert err.rstrip().endswith(shlex.join(["fedlit", "fit", "--config", f"{run}/config.yaml"]))

    undo()
    stop_in_round(monkeypatch, 3)
    with pytest.raises(SystemExit) as stop:  # the same command starts it afresh
        main(shlex.split(err.rstrip().splitlines()[-1])[1:])
    assert stop.value.code == 130
    err = capsys.readouterr().err
    ckpt = run / "checkpoints" / "last.ckpt"
    assert f"interrupted in round 3 of 3. Kept: round 2's checkpoint, {ckpt}" in err
    command = err.rstrip().splitlines()[-1].strip()
    assert command == shlex.join(
        ["fedlit", "fit", "--config", f"{run}/config.yaml", "--federation.resume", str(ckpt)]
    )

    undo()
    main(shlex.split(command)[1:])  # continues to the end
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert final["round"] == 3.0
