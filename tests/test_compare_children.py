"""``fedlit compare`` owns its fits: they stop when it stops (SIGTERM, SIGKILL), and a run
directory a live process holds is never set aside or cleared."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import lock_held_by_another_process, tiny_overrides

from fedlit.cli import main
from fedlit.federation.children import Children
from fedlit.federation.rundir import remove_dead_run, set_aside_dead_run
from fedlit.run_layout import LOCK_FILE

REPO = Path(__file__).parents[1]


def _children(pid: int) -> list[int]:
    """The pids of the processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its status is left


def _wait_until(condition: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


def _spec(tmp_path: Path, root: Path) -> Path:
    """Two long Server-SL runs (seeds 0, 1) at once: they are still training when killed."""
    spec = {
        "name": "long",
        "out": str(tmp_path / "out"),
        "recipes": [str(REPO / "recipes/server_sl.yaml")],
        "seeds": [0, 1],
        "overrides": [*tiny_overrides(root, rounds=500), "--federation.final_eval=[]"],
        "jobs": 2,
    }
    path = tmp_path / "comparison.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow  # about 20 s on a shared 2-core CPU: two fits start, then are stopped
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_no_fit_outlives_a_killed_compare(
    sig: signal.Signals, fmnist_root: Path, tmp_path: Path
) -> None:
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    compare = subprocess.Popen(
        [sys.executable, "-m", "fedlit.cli", "compare", f"--config={_spec(tmp_path, fmnist_root)}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs = [tmp_path / "out/default/server_sl" / f"seed{k}" for k in (0, 1)]
    try:
        # both fits write their runs (past their first checkpoint: well inside the training)
        assert _wait_until(
            lambda: all((r / "checkpoints/last.ckpt").is_file() for r in runs), 150
        ), compare.stderr.read() if compare.poll() is not None and compare.stderr else ""
        fits = _children(compare.pid)
        assert len(fits) == 2 and all(_alive(p) for p in fits)
        compare.send_signal(sig)
        compare.wait(timeout=120)  # a SIGTERM: waits for its fits to stop
        assert _wait_until(lambda: not any(_alive(p) for p in fits), 60), fits
    finally:
        compare.kill()
        compare.wait()
    assert compare.stderr is not None
    err = compare.stderr.read()
    if sig == signal.SIGTERM:
        assert compare.returncode == 143, err
        assert "stopped by SIGTERM" in err and "Traceback" not in err, err
    else:
        assert compare.returncode == -signal.SIGKILL
    for run in runs:  # each fit stopped cleanly enough to leave a whole checkpoint
        assert not list(run.rglob("*.tmp"))


@pytest.fixture
def dead_run_held_by_a_live_process(tmp_path: Path) -> Iterator[Path]:
    """A run directory in its first round (config.yaml, no checkpoint) whose ``.lock`` another
    process holds, as a fit still in round 1 does."""
    run_dir = tmp_path / "out/default/server_sl/seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("seed_everything: 0\n")
    with lock_held_by_another_process(run_dir / LOCK_FILE):
        yield run_dir


def _files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_dead_run_clean_up_is_refused_while_a_live_process_holds_the_lock(
    dead_run_held_by_a_live_process: Path,
) -> None:
    run_dir = dead_run_held_by_a_live_process
    before = _files(run_dir.parent)
    with pytest.raises(ValueError, match="another process"):
        set_aside_dead_run(run_dir)
    with pytest.raises(ValueError, match="another process"):
        remove_dead_run(run_dir)
    assert _files(run_dir.parent) == before  # not moved, not removed, .lock as it was


def test_compare_refuses_a_run_directory_a_live_fit_holds(
    dead_run_held_by_a_live_process: Path,
    fmnist_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_dir = dead_run_held_by_a_live_process
    spec = _spec(tmp_path, fmnist_root)
    spec.write_text(spec.read_text().replace("- 1\n", "").replace("jobs: 2", "jobs: 1"))
    before = _files(tmp_path / "out")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["compare", f"--config={spec}"])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert str(run_dir) in err and "another process" in err, err
    assert _files(tmp_path / "out") == before


def test_a_dead_run_without_a_live_holder_is_set_aside(tmp_path: Path) -> None:
    run_dir = tmp_path / "seed0"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("seed_everything: 0\n")
    (run_dir / LOCK_FILE).write_text("12345\n")  # a writer that died: the kernel dropped its lock
    aside = set_aside_dead_run(run_dir)
    assert aside == tmp_path / "seed0.incomplete1" and not run_dir.exists()
    assert (aside / "config.yaml").read_text() == "seed_everything: 0\n"


def test_a_stopped_comparison_exits_with_the_signal_over_its_stopped_fits_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A study's trials end the block with the error of a fit the signal stopped (a child's
    status 143, a cancelled Ray task): the comparison still exits with 128 + the signal,
    saying how to go on, not with that error's traceback."""
    children = Children()
    with pytest.raises(SystemExit) as exc, children.forwarding_signals():
        children.forward(signal.SIGTERM)  # as the handler does on SIGTERM
        raise RuntimeError("a trial's fit exited with 143")
    assert exc.value.code == 143
    assert "stopped by SIGTERM" in capsys.readouterr().err
