"""Bad values refused before anything is written, and resumes that cannot lose a run: the real
CLI on tiny Server-SL runs (one to three rounds of a few batches on the local Fashion-MNIST)."""

from __future__ import annotations

import csv
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import lock_held_by_another_process, refused, stop_in_round, tiny_overrides

from fedlit.cli import main
from fedlit.federation import load_checkpoint
from fedlit.federation.resume import Checkpointer
from fedlit.federation.rundir import LOCK_FILE, RunLock

RECIPES = Path(__file__).parents[1] / "recipes"
SERVER_SL = RECIPES / "server_sl.yaml"


def _fit(root: Path, run_dir: Path, *extra: str, recipe: Path = SERVER_SL) -> list[str]:
    """``fedlit fit`` arguments for a tiny run of ``recipe`` (rounds: 1 unless overridden)."""
    return [
        "fit",
        f"--config={recipe}",
        *tiny_overrides(root),
        "--federation.final_eval=[]",
        f"--trainer.default_root_dir={run_dir}",
        *extra,
    ]


def _resume(run_dir: Path) -> str:
    return f"--federation.resume={run_dir / 'checkpoints' / 'last.ckpt'}"


def _files(run_dir: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _rounds(run_dir: Path) -> list[float]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [float(row["round"]) for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def finished(fmnist_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-round run (only read, or copied, by the tests that use it)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    main(_fit(fmnist_root, run_dir))
    return run_dir


# --- every bad value refused before anything is written -----------------------------------
BAD_VALUES = [
    (["--model.init_args.optim.momentum=-1"], "optim.momentum", "-1"),
    (["--model.init_args.optim.momentum=1.5"], "optim.momentum", "1.5"),
    (["--model.init_args.optim.weight_decay=-1"], "optim.weight_decay", "-1"),
    (["--model.init_args.optim.optimizer=rmsprop"], "optimizer", "rmsprop"),
    (["--model.init_args.optim.server_lr=.nan"], "model.init_args.optim.server_lr", "nan"),
    (["--model.init_args.optim.server_lr=.inf"], "model.init_args.optim.server_lr", "inf"),
    (["--model.init_args.loss.tau=1.5"], "loss.tau", "1.5"),
    (["--federation.eval_lr=.inf"], "federation.eval_lr", "inf"),
    (["--trainer.gradient_clip_val=.nan"], "trainer.gradient_clip_val", "nan"),
]


@pytest.mark.parametrize(("args", "key", "value"), BAD_VALUES, ids=[b[2] for b in BAD_VALUES])
def test_bad_value_is_refused_naming_key_and_value(
    args: list[str],
    key: str,
    value: str,
    fmnist_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_dir = tmp_path / "run"
    err = refused(_fit(fmnist_root, run_dir, *args), capsys)
    assert key in err and value in err, err
    assert not run_dir.exists()


def test_nan_in_a_yaml_file_is_refused(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    override = tmp_path / "nan.yaml"
    override.write_text("model:\n  init_args:\n    optim:\n      client_lr: .nan\n")
    run_dir = tmp_path / "run"
    args = _fit(fmnist_root, run_dir, f"--config={override}", recipe=RECIPES / "fedavg_sl.yaml")
    err = refused(args, capsys)
    assert "model.init_args.optim.client_lr" in err and "nan" in err, err
    assert not run_dir.exists()


def test_uncreatable_run_directory_is_named(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    err = refused(_fit(fmnist_root, blocker / "run"), capsys)
    assert "trainer.default_root_dir" in err and str(blocker) in err, err


def test_missing_data_without_download_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, run_dir = tmp_path / "empty_root", tmp_path / "run"
    args = _fit(root, run_dir, "--data.dataset=mnist", "--data.download=false")
    err = refused(args, capsys)
    assert "data.root" in err and "'mnist'" in err and str(root) in err, err
    assert not run_dir.exists()


def test_test_subcommand_refuses_a_file_that_is_not_a_checkpoint(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(random.Random(0).randbytes(4096))
    args = ["test", f"--config={SERVER_SL}", f"--data.root={fmnist_root}", f"--ckpt_path={junk}"]
    err = refused(args, capsys)
    assert "ckpt_path" in err and str(junk) in err and "not a fedlit federation checkpoint" in err


@pytest.mark.parametrize("command", ["fit", "compare"])
def test_yaml_syntax_error_names_the_file_and_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  class_path: fedlit.methods.ServerSL\n  init_args: [\n")
    err = refused([command, f"--config={bad}"], capsys)
    assert str(bad) in err and "line 4" in err, err


@pytest.mark.parametrize("command", ["fit", "compare"])
def test_empty_yaml_file_is_named(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing but a comment\n")
    err = refused([command, f"--config={empty}"], capsys)
    assert str(empty) in err and "empty" in err and "Unexpected config" not in err, err


# --- resume that cannot lose a run ------------------------------------------------------------
def test_resume_into_a_directory_holding_another_run_is_refused(
    finished: Path, fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    main(_fit(fmnist_root, other, "--seed_everything=1"))
    before = _files(other)
    args = _fit(fmnist_root, other, "--federation.rounds=2", _resume(finished))
    err = refused(args, capsys)
    assert str(finished) in err and str(other) in err, err
    assert _files(other) == before


def test_resume_twice_from_one_checkpoint(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume stopped before its first new checkpoint leaves config.resume2.yaml; the next
    resume from the same checkpoint saves its config beside it."""
    run_dir = tmp_path / "run"
    main(_fit(fmnist_root, run_dir))
    undo = stop_in_round(monkeypatch, 2)  # the resume's first round
    with pytest.raises(SystemExit, match="130"):  # Ctrl-C's status
        main(_fit(fmnist_root, run_dir, "--federation.rounds=2", _resume(run_dir)))
    undo()
    main(_fit(fmnist_root, run_dir, "--federation.rounds=2", _resume(run_dir)))
    assert (run_dir / "config.resume2.yaml").is_file()
    assert (run_dir / "config.resume2.2.yaml").is_file()
    assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["round"] == 2
    assert _rounds(run_dir) == [0, 1, 2]


def test_run_stopped_before_its_first_checkpoint_starts_again_in_place(
    fmnist_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Killed after round 1's metrics row, before its checkpoint: config.yaml and metrics.csv
    but nothing to resume from."""
    run_dir = tmp_path / "run"
    original = Checkpointer.save

    def killed(self: Checkpointer, round_idx: int, *state: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Checkpointer, "save", killed)
    with pytest.raises(SystemExit, match="130"):  # Ctrl-C's status
        main(_fit(fmnist_root, run_dir))
    monkeypatch.setattr(Checkpointer, "save", original)
    assert (run_dir / "config.yaml").is_file() and _rounds(run_dir) == [0, 1]
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()
    (run_dir / "notes.txt").write_text("mine")
    capsys.readouterr()
    main(_fit(fmnist_root, run_dir))
    err = capsys.readouterr().err
    assert "stopped before its first checkpoint" in err and str(run_dir) in err, err
    assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["round"] == 1
    assert _rounds(run_dir) == [0, 1]
    assert (run_dir / "notes.txt").read_text() == "mine"  # only the dead run's files go


def test_resume_after_a_kill_between_metrics_and_checkpoint_logs_each_round_once(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 2's row is written, then the process dies before round 2's checkpoint: the
    resume runs round 2 again and metrics.csv holds it once."""
    run_dir = tmp_path / "run"
    original = Checkpointer.save

    def killed_before_checkpoint(self: Checkpointer, round_idx: int, *state: Any) -> None:
        if round_idx == 2:
            raise KeyboardInterrupt
        original(self, round_idx, *state)

    monkeypatch.setattr(Checkpointer, "save", killed_before_checkpoint)
    with pytest.raises(SystemExit, match="130"):  # Ctrl-C's status
        main(_fit(fmnist_root, run_dir, "--federation.rounds=3"))
    monkeypatch.setattr(Checkpointer, "save", original)
    assert _rounds(run_dir) == [0, 1, 2]
    assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["round"] == 1
    main(_fit(fmnist_root, run_dir, "--federation.rounds=3", _resume(run_dir)))
    assert _rounds(run_dir) == [0, 1, 2, 3]


@pytest.fixture
def locked_by_another_process(tmp_path: Path) -> Iterator[Path]:
    """A run directory whose lock a second process holds (as a running fit would)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with lock_held_by_another_process(run_dir / LOCK_FILE):
        yield run_dir


def test_a_second_writer_of_a_locked_run_directory_is_refused(
    locked_by_another_process: Path, fmnist_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = locked_by_another_process
    err = refused(_fit(fmnist_root, run_dir), capsys)
    assert str(run_dir) in err and "another process" in err, err
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]  # nothing written


def test_resume_while_the_run_is_being_written_is_refused(
    finished: Path, fmnist_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _files(finished)
    lock = RunLock(finished)  # the lock of a run still writing (a separate open: a 2nd writer)
    lock.acquire()
    try:
        err = refused(
            _fit(fmnist_root, finished, "--federation.rounds=2", _resume(finished)), capsys
        )
    finally:
        lock.release()
    assert str(finished) in err and "another process" in err, err
    assert {p: b for p, b in _files(finished).items() if p.name != LOCK_FILE} == {
        p: b for p, b in before.items() if p.name != LOCK_FILE
    }


CHANGED = [
    ("--model.init_args.optim.server_lr=0.1", "model.init_args.optim.server_lr"),
    ("--model.init_args.optim.momentum=0.5", "model.init_args.optim.momentum"),
    ("--data.examples_per_client=16", "data.examples_per_client"),
    ("--data.partitioner=Dirichlet --data.partitioner.alpha=0.5", "data.partitioner.class_path"),
    ("--federation.server_epochs=2", "federation.server_epochs"),
    ("--model.init_args.network.backbone=fedcon_mnist_cnn", "model.init_args.network.backbone"),
]


@pytest.mark.parametrize(("arg", "key"), CHANGED, ids=[c[1] for c in CHANGED])
def test_resume_with_a_changed_setting_is_refused_naming_it(
    arg: str, key: str, finished: Path, fmnist_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _files(finished)
    args = _fit(fmnist_root, finished, "--federation.rounds=2", *arg.split(), _resume(finished))
    err = refused(args, capsys)
    assert key in err and "federation.resume_may_change" in err, err
    assert _files(finished) == before


def test_resume_may_change_allows_a_named_setting(
    finished: Path, fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    def args(fork: Path, may_change: str) -> list[str]:
        changed = [
            "--model.init_args.optim.server_lr=0.1",
            f"--federation.resume_may_change=[{may_change}]",
        ]
        return _fit(fmnist_root, fork, "--federation.rounds=2", *changed, _resume(finished))

    err = refused(args(tmp_path / "typo", "model.init_args.nope"), capsys)
    assert "model.init_args.nope" in err, err
    fork = tmp_path / "fork"  # resumed into a new directory: the finished run stays as it is
    main(args(fork, "model.init_args.optim.server_lr"))
    assert load_checkpoint(fork / "checkpoints" / "last.ckpt")["round"] == 2
    assert load_checkpoint(finished / "checkpoints" / "last.ckpt")["round"] == 1


def test_resume_from_another_backbone_names_the_mismatch(
    finished: Path, fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _fit(
        fmnist_root,
        tmp_path / "fork",
        "--federation.rounds=2",
        "--model.init_args.network.backbone=fedcon_mnist_cnn",
        "--federation.resume_may_change=[model.init_args.network.backbone]",
        _resume(finished),
    )
    err = refused(args, capsys)
    assert "does not fit this model" in err and "fedcon_mnist_cnn" in err, err


# --- the Trainer's settings as Lightning defines them (issue 73) ---------------------------
@pytest.mark.parametrize(
    ("given", "limit"), [("1", 1), ("3", 3), ("0.5", 0.5), ("1.0", 1.0)], ids=str
)
def test_limit_train_batches_integer_is_a_number_of_batches(
    given: str, limit: float, fmnist_root: Path
) -> None:
    """An integer is a number of batches (1: one batch), a float a fraction, as Lightning has
    it: the parser once made ``1`` the float 1.0, every batch."""
    from fedlit.resolver import resolve

    limit_arg = f"--trainer.limit_train_batches={given}"
    cli = resolve([f"--config={SERVER_SL}", *tiny_overrides(fmnist_root), limit_arg])
    got = cli.trainer.limit_train_batches
    assert got == limit and type(got) is type(limit)
    from fedlit.federation.fit.loop import limited

    assert limited(10, got) == (1 if given == "1" else 3 if given == "3" else int(10 * limit))


def test_gradient_clip_algorithm_is_read_in_either_case() -> None:
    """``VALUE`` clips by value, as Lightning's either case; it once clipped by norm."""
    import torch

    from fedlit.federation.fit.loop import clip

    for algorithm in ("value", "VALUE", "Value"):
        weight = torch.nn.Parameter(torch.zeros(2))
        weight.grad = torch.tensor([3.0, 4.0])
        clip(torch.optim.SGD([weight], lr=0.1), 1.0, algorithm)
        assert weight.grad.tolist() == [1.0, 1.0], algorithm  # by norm: [0.6, 0.8]


def test_precision_16_is_lightnings_alias_of_16_mixed(fmnist_root: Path) -> None:
    from fedlit.resolver import resolve
    from fedlit.federation.checks import check_trainer
    from fedlit.federation.fit import TrainerTemplate

    cli = resolve([f"--config={SERVER_SL}", *tiny_overrides(fmnist_root), "--trainer.precision=16"])
    assert cli.trainer.precision == 16
    check_trainer(TrainerTemplate(accelerator="cpu", precision=16))
    # on a CPU, 16-mixed (and its alias) is bf16-mixed, as Lightning has it
    assert TrainerTemplate(accelerator="cpu", precision=16).decided_precision() == "bf16-mixed"
