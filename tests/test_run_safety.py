"""A run directory no second process can damage, a full disk, and the final line's JSON: the
real CLI on tiny runs (one or two rounds of a few batches on the local Fashion-MNIST)."""

from __future__ import annotations

import csv
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import refused, tiny_overrides

from fedlit.cli import json_line, main
from fedlit.federation import ClientStateStore, load_checkpoint
from fedlit.federation.checkpoint import WriteFailed
from fedlit.federation.loggers import RoundCSVLogger
from fedlit.run_layout import LOCK_FILE

RECIPES = Path(__file__).parents[1] / "recipes"


def _fit(root: Path, run_dir: Path, *extra: str, recipe: str = "server_sl") -> list[str]:
    return [
        "fit",
        f"--config={RECIPES / f'{recipe}.yaml'}",
        *tiny_overrides(root),
        "--federation.final_eval=[]",
        f"--trainer.default_root_dir={run_dir}",
        *extra,
    ]


def _strict(line: str) -> dict[str, object]:
    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    out = json.loads(line, parse_constant=refuse)
    assert isinstance(out, dict)
    return out


def _files(run_dir: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def two_runs(fmnist_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two finished one-round Server-SL runs (seeds 0 and 1)."""
    base = tmp_path_factory.mktemp("runs")
    for seed in (0, 1):
        main(_fit(fmnist_root, base / f"seed{seed}", f"--seed_everything={seed}"))
    return base / "seed0", base / "seed1"


def test_json_line_writes_non_finite_numbers_as_null() -> None:
    line = json_line({"a": float("nan"), "b": [1.5, float("inf")], "c": {"d": -float("inf")}})
    assert _strict(line) == {"a": None, "b": [1.5, None], "c": {"d": None}}


def test_fedmatch_final_line_is_json_with_its_nan_diversity_as_null(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    main(_fit(fmnist_root, tmp_path / "run", recipe="fedmatch"))
    final = _strict(capsys.readouterr().out.strip().splitlines()[-1])
    assert "diag/weight_diversity" in final and final["diag/weight_diversity"] is None
    assert isinstance(final["test/acc"], float)


def test_a_refused_resume_into_another_runs_directory_leaves_its_lock_file(
    two_runs: tuple[Path, Path], fmnist_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = two_runs
    before = _files(second)
    assert (second / LOCK_FILE).read_text().strip().isdigit()
    resume = f"--federation.resume={first / 'checkpoints' / 'last.ckpt'}"
    err = refused(_fit(fmnist_root, second, "--federation.rounds=2", resume), capsys)
    assert str(second) in err and "federation.resume" in err, err
    assert _files(second) == before  # its .lock too: the last writer's pid stays


def _enospc(*_: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def _torch_save_to_a_full_disk(monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]) -> None:
    """Make ``torch.save`` to a file named in ``names`` fail as on a full disk: a partial
    file, then torch's own error from writing into ``/dev/full``."""
    real = torch.save

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(f, (str, Path)) and Path(f).name in names:
            Path(f).write_bytes(b"PK partial")
            real(obj, "/dev/full")
        real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def test_a_full_disk_at_a_checkpoint_ends_the_run_in_one_line_keeping_the_last_one(
    fmnist_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_dir = tmp_path / "run"
    main(_fit(fmnist_root, run_dir))
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    good = ckpt.read_bytes()
    _torch_save_to_a_full_disk(monkeypatch, ("last.ckpt.tmp",))
    resume = f"--federation.resume={ckpt}"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(_fit(fmnist_root, run_dir, "--federation.rounds=2", resume))
    err = capsys.readouterr().err
    assert exc.value.code == 1
    assert "Traceback" not in err
    line = next(x for x in err.splitlines() if x.startswith("fedlit fit: error:"))
    assert f"could not write {ckpt}" in line and "torch.save failed" in line, line
    assert "MiB free" in line, line
    assert not list(run_dir.rglob("*.tmp"))
    assert ckpt.read_bytes() == good and load_checkpoint(ckpt)["round"] == 1
    monkeypatch.undo()  # space freed: the resume goes on from round 1
    main(_fit(fmnist_root, run_dir, "--federation.rounds=2", resume))
    assert load_checkpoint(ckpt)["round"] == 2


def test_a_full_disk_at_a_client_state_raises_naming_it_and_leaves_no_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ClientStateStore(tmp_path / "clients")
    store.begin_round(1)
    store.put(0, {"w": torch.ones(3)})
    store.checkpointed()
    _torch_save_to_a_full_disk(monkeypatch, ("1.r2.pt.tmp",))
    store.begin_round(2)
    store.put(1, {"w": torch.zeros(3)})  # kept in memory: written with the checkpoint
    with pytest.raises(WriteFailed) as exc:
        store.state_dict()  # what the checkpoint records, its files written first
    assert f"could not write {tmp_path / 'clients' / '1.r2.pt'}" in str(exc.value)
    assert "MiB free" in str(exc.value)
    assert sorted(p.name for p in (tmp_path / "clients").iterdir()) == ["0.r1.pt"]
    assert torch.equal(store.get(0)["w"], torch.ones(3)) and store.manifest == {0: 1}


def _partial_then_enospc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the next ``csv.DictWriter.writerows`` write half a row, then fail as on a full
    disk."""

    def writerows(self: csv.DictWriter[str], rows: Any) -> None:
        self.writer.writerow(["0.5", "cut"])
        _enospc()

    monkeypatch.setattr(csv.DictWriter, "writerows", writerows)


@pytest.mark.parametrize("new_column", [False, True], ids=["append", "new-column"])
def test_a_failed_metrics_write_keeps_every_earlier_row(
    new_column: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logger = RoundCSVLogger(tmp_path)
    logger.log_metrics({"round": 0, "test/acc": 0.1}, step=0)
    logger.save()
    logger.log_metrics({"round": 1, "test/acc": 0.5}, step=1)
    logger.save()
    path = tmp_path / "metrics.csv"
    before = path.read_bytes()
    row: dict[str, Any] = {"round": 2, "test/acc": 0.7}
    if new_column:
        row["fault/clients"] = 1.0
    with monkeypatch.context() as m:
        _partial_then_enospc(m)
        logger.log_metrics(row, step=2)
        with pytest.raises(WriteFailed) as exc:
            logger.save()
    assert f"could not write {path}" in str(exc.value) and "no space left" in str(exc.value)
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("*.tmp"))
    logger.save()  # space freed: the row is written, its new column too
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["round"] for r in rows] == ["0", "1", "2"]
    assert [r["test/acc"] for r in rows] == ["0.1", "0.5", "0.7"]
    assert ("fault/clients" in rows[0]) == new_column


#: A tiny 3-round Server-SL fit that says "checkpointed <round>" after each checkpoint and
#: then waits (outside any Trainer step) for a line on stdin before going on.
PAUSING_FIT = """
import sys
sys.path.insert(0, sys.argv[1])
from conftest import tiny_overrides
from fedlit.cli import main
from fedlit.federation.resume import Checkpointer
real = Checkpointer.save
def checkpoint(self, round_idx, *state):
    real(self, round_idx, *state)
    print("checkpointed", round_idx, flush=True)
    sys.stdin.readline()
Checkpointer.save = checkpoint
main(["fit", f"--config={sys.argv[2]}", *tiny_overrides(sys.argv[3], rounds=3),
      "--federation.final_eval=[]", f"--trainer.default_root_dir={sys.argv[4]}"])
"""


def test_sigterm_between_steps_stops_the_run_cleanly_with_status_143(
    fmnist_root: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    tests = Path(__file__).parent
    args = [str(tests), str(RECIPES / "server_sl.yaml"), str(fmnist_root), str(run_dir)]
    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSING_FIT, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().split() == ["checkpointed", "1"]
        proc.send_signal(signal.SIGTERM)  # waiting on stdin: no Trainer step runs
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err  # not -15: the handler ran, not the default action
    assert "Traceback" not in err, err
    assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["round"] == 1
    assert not list(run_dir.rglob("*.tmp"))


def _round(ckpt: Path) -> int:
    try:
        return int(load_checkpoint(ckpt)["round"])
    except ValueError:  # not there yet
        return 0


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch at one thread in this process, as in the stopped runs (``OMP_NUM_THREADS=1``):
    a CPU's float sums follow the thread count, and the runs are compared bit for bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow  # about 50 s on a shared 2-core CPU: a reference run, two stopped, a resume
def test_sigterm_at_random_moments_exits_143_and_resumes_to_the_same_weights(
    fmnist_root: Path, tmp_path: Path, one_thread: None
) -> None:
    """SIGTERMs at random moments of rounds 2 to 4 (in a step or between steps): each stopped
    run exits with status 143 (never killed by the signal), and the resumes end with the
    uninterrupted run's weights, each round logged once."""
    rounds = ["--federation.rounds=4"]
    reference = tmp_path / "reference"
    main(_fit(fmnist_root, reference, *rounds, recipe="fedavg_fixmatch"))
    with open(reference / "metrics.csv", newline="") as f:
        reference_rows = list(csv.DictReader(f))
    round_s = sum(float(r["time/round_s"]) for r in reference_rows[1:]) / 4
    run_dir, rng = tmp_path / "run", random.Random(24)
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    statuses = []
    for _ in range(2):
        if _round(ckpt) >= 4:
            break
        resume = [f"--federation.resume={ckpt}"] if ckpt.is_file() else []
        args = _fit(fmnist_root, run_dir, *rounds, *resume, recipe="fedavg_fixmatch")
        configs = len(list(run_dir.glob("config*.yaml")))
        proc = subprocess.Popen(
            [sys.executable, "-m", "fedlit", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        k = rng.randint(min(_round(ckpt) + 1, 3), 3)  # then a fraction of a round
        while proc.poll() is None and (  # past Python's start-up: its config is saved
            len(list(run_dir.glob("config*.yaml"))) == configs or _round(ckpt) < k
        ):
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.9) * round_s)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        statuses.append(proc.returncode)
        assert proc.returncode in (0, 143), err[-3000:]  # 0: it had finished
        assert "Traceback" not in err, err[-3000:]
    assert 143 in statuses
    if _round(ckpt) < 4:
        main(
            _fit(
                fmnist_root,
                run_dir,
                *rounds,
                f"--federation.resume={ckpt}",
                recipe="fedavg_fixmatch",
            )
        )
    want, got = load_checkpoint(reference / "checkpoints" / "last.ckpt"), load_checkpoint(ckpt)
    assert got["round"] == want["round"] == 4
    for key, value in want["method_state"].items():
        assert torch.equal(got["method_state"][key], value), key
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["round"]) for r in rows] == [0, 1, 2, 3, 4]
    assert [r["test/acc"] for r in rows] == [r["test/acc"] for r in reference_rows]
