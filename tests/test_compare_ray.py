"""``fedlit compare`` with ``executor: ray``: on a two-node Ray cluster the test starts (a head
and a worker node, tests/ray_runs.py), a tuned comparison gives the trials and the table of
``executor: local``; its driver stopped mid-run and the command run again resumes, nothing run
twice; a Ray worker killed mid-run has its run retried by Ray; and without Ray the executor
is refused by name before anything is written."""

from __future__ import annotations

import csv
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import lock_held_by_another_process, refused, tiny_overrides

from fedlit.cli import main
from fedlit.comparison import Comparison
from fedlit.comparison.cluster import RayTasks, continued
from fedlit.federation.rundir import holding
from fedlit.run_layout import CHECKPOINT, LOCK_FILE

REPO = Path(__file__).parents[1]
TESTS = Path(__file__).parent


def _spec(tmp_path: Path, root: Path, out: str, **more: Any) -> Path:
    """A tuned Server-SL comparison: 2 random trials (no pruner) on 1 tuning seed, then its
    run on seed 0; 2 runs at a time, 2 rounds each."""
    spec = {
        "name": "cluster",
        "out": str(tmp_path / out),
        "recipes": [str(REPO / "recipes/server_sl.yaml")],
        "seeds": [0],
        "overrides": [*tiny_overrides(root, rounds=2), "--federation.final_eval=[]"],
        "jobs": 2,
        "tune": {"trials": 2, "seeds": [100], "sampler_seed": 7, "startup_trials": 2},
        **more,
    }
    spec["tune"]["pruner"] = "none"
    path = tmp_path / f"{out}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _untimed(path: Path) -> list[dict[str, str]]:
    """A CSV's rows without their timing columns (each run's seconds differ)."""
    return [{k: v for k, v in row.items() if "time" not in k} for row in _rows(path)]


def _fits(out: Path) -> list[tuple[int, int, Path]]:
    """The live ``fedlit fit`` processes writing into ``out``: pid, parent pid, run dir."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        text = [a.decode() for a in args]
        if stat[0] == "Z" or "fedlit.cli" not in text or "fit" not in text:
            continue
        root = [a.split("=", 1)[1] for a in text if a.startswith("--trainer.default_root_dir=")]
        if root and root[0].startswith(str(out)):
            found.append((int(entry.name), int(stat[1]), Path(root[0])))
    return found


def _wait(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"waited {timeout:g} s for {what}")


def _free(out: Path) -> bool:
    """No live process holds a run directory's lock under ``out``."""
    for lock in out.rglob(".lock"):
        try:
            with holding(lock.parent, None):
                pass
        except ValueError:
            return False
    return True


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """The address of a two-node Ray cluster on this machine (one CPU per node), started in
    a process of its own (tests/ray_runs.py serve) and stopped after."""
    pytest.importorskip("ray")
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    serve = subprocess.Popen(
        [sys.executable, str(TESTS / "ray_runs.py"), "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert serve.stdin is not None and serve.stdout is not None
    line = serve.stdout.readline()
    try:
        assert line.startswith("ADDRESS "), line
        yield line.split()[1]
    finally:
        serve.stdin.close()
        serve.wait(timeout=60)


def _compare(spec: Path) -> subprocess.Popen[str]:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "fedlit.cli", "compare", f"--config={spec}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow  # a two-node cluster, 4 fits on it (twice started), 4 fits here
def test_a_tuned_comparison_on_a_ray_cluster_survives_kills_and_gives_the_local_table(
    cluster: str, fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the local comparison's fits at one torch thread each, as each run's on the cluster
    monkeypatch.setattr("fedlit.comparison.runner.available_cores", lambda: 2)
    main(["compare", f"--config={_spec(tmp_path, fmnist_root, 'local')}"])
    out = tmp_path / "ray"
    spec = _spec(tmp_path, fmnist_root, "ray", executor="ray", ray={"address": cluster})
    # the driver stopped (SIGTERM) once a run has a checkpoint: it cancels its Ray tasks, their
    # workers end and their fits stop with them
    first = _compare(spec)
    try:
        _wait(lambda: list(out.rglob(CHECKPOINT.name)), 120, "a checkpoint")
        first.send_signal(signal.SIGTERM)
        stopped, _ = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 143 and "stopped by SIGTERM" in stopped, stopped[-3000:]
    _wait(lambda: not _fits(out) and _free(out), 60, "the stopped driver's fits to stop")
    # what the killed runs kept: their rows up to their last checkpoint
    kept = {c.parents[1]: _untimed(c.parents[1] / "metrics.csv") for c in out.rglob("last.ckpt")}
    # run again: a Ray worker killed under its fit, mid-run, has its run retried
    again = _compare(spec)
    try:
        pid, worker, run_dir = _wait(lambda: _fits(out), 120, "a fit")[0]
        os.kill(worker, signal.SIGKILL)
        output, _ = again.communicate(timeout=240)
    finally:
        again.kill()
    assert again.returncode == 0, output[-3000:]
    assert "ray: 2 node(s) hold 2 run(s) of 1 CPUs" in output
    # the same trials and the same table as local
    assert _untimed(out / "cluster.csv") == _untimed(tmp_path / "local/cluster.csv")
    for name in ("trial0", "trial1"):
        rel = Path("tune/default/server_sl") / name / "seed100/metrics.csv"
        assert _untimed(out / rel) == _untimed(tmp_path / "local" / rel)
    assert not (out / "tune/default/server_sl/trial2").exists()  # no trial drawn twice
    # nothing run twice: each round once in each run
    runs = [*out.glob("default/server_sl/seed*"), *out.glob("tune/default/server_sl/*/seed*")]
    for metrics in (run / "metrics.csv" for run in runs if "." not in run.name):  # not set aside
        rounds = [float(row["round"]) for row in _rows(metrics)]
        assert rounds == sorted(set(rounds)) and rounds[-1] == 2, metrics
    for run, rows in kept.items():  # each run the kill stopped went on from its rows
        assert _untimed(run / "metrics.csv")[: len(rows)] == rows, run
    # the killed worker's run was started again by Ray, on a node of the two
    log = out / "logs" / f"{run_dir.as_posix().replace('/', '_')}.log"
    starts = [line for line in log.read_text().splitlines() if "ray node" in line]
    killed = [i for i, line in enumerate(starts) if line.endswith(f"process {worker}")]
    assert killed and killed[-1] < len(starts) - 1, starts
    nodes = {
        line.split("ray node ")[1].split(",")[0]
        for path in (out / "logs").glob("*.log")
        for line in path.read_text().splitlines()
        if "ray node" in line
    }
    assert len(nodes) == 2  # the runs went to both nodes


def test_ray_absent_is_refused_by_name_before_anything_is_written(
    fmnist_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    spec = _spec(tmp_path, fmnist_root, "out", executor="ray")
    message = refused(["compare", f"--config={spec}"], capsys)
    assert "executor='ray': Ray is not installed here" in message
    assert "pip install 'fedlit[ray]'" in message
    assert not (tmp_path / "out").exists()


def test_an_unknown_executor_and_bad_ray_settings_are_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = str(REPO / "recipes/server_sl.yaml")
    with pytest.raises(ValueError, match=r"one of \('local', 'ray'\), got 'slurm'"):
        Comparison(name="c", recipes=[recipe], executor="slurm")
    args = ["compare", "--name=c", f"--recipes=[{recipe}]", f"--out={tmp_path / 'out'}"]
    assert "ray.cpus must be a number > 0, got 0" in refused([*args, "--ray.cpus=0"], capsys)
    assert "ray.max_retries must be an integer >= 0" in refused(
        [*args, "--ray.max_retries=-1"], capsys
    )
    assert not (tmp_path / "out").exists()


def _checkpoint(run_dir: Path, done: int, rounds: int) -> Path:
    """A federation checkpoint of round ``done`` of a run of ``rounds`` rounds."""
    path = run_dir / CHECKPOINT
    path.parent.mkdir(parents=True)
    hparams = {"federation.rounds": rounds}
    torch.save({"format": "fedlit-federation/1", "round": done, "hparams": hparams}, path)
    return path


def test_a_retried_run_goes_on_from_what_its_directory_holds(tmp_path: Path) -> None:
    """What a run Ray starts again (its worker died) runs: afresh where nothing is written,
    from its checkpoint, nothing where its checkpoint has its last round, afresh with the
    files of a run stopped in its first round set aside; never while a live process holds
    its directory."""
    args = ["fit", "--config=r.yaml", f"--trainer.default_root_dir={tmp_path / 'new'}"]
    assert continued(args) == args
    resumable = tmp_path / "resumable"
    ckpt = _checkpoint(resumable, done=1, rounds=2)
    args = ["fit", f"--trainer.default_root_dir={resumable}"]
    assert continued(args) == [*args, f"--federation.resume={ckpt}"]
    resumed = [*args, f"--federation.resume={ckpt}"]
    assert continued(resumed) == resumed  # resumed already: as given
    finished = tmp_path / "finished"
    _checkpoint(finished, done=2, rounds=2)
    assert continued(["fit", f"--trainer.default_root_dir={finished}"]) is None
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.yaml").write_text("seed_everything: 0\n")
    args = ["fit", f"--trainer.default_root_dir={broken}"]
    assert continued(args) == args
    assert not broken.exists() and (tmp_path / "broken.incomplete1/config.yaml").is_file()
    held = tmp_path / "held"
    _checkpoint(held, done=1, rounds=2)
    with lock_held_by_another_process(held / LOCK_FILE), pytest.raises(ValueError, match="another"):
        continued(["fit", f"--trainer.default_root_dir={held}"], wait_s=0.5)


def test_a_signal_to_the_comparison_cancels_its_ray_tasks_and_starts_no_more() -> None:
    """A SIGTERM of ``fedlit compare`` (passed on by ``forwarding_signals``) cancels the runs'
    tasks in flight, their workers ended (Ray's ``force``); no task is started after."""

    class FakeRay:
        cancelled: list[tuple[str, bool]] = []

        def cancel(self, ref: str, force: bool = False) -> None:
            self.cancelled.append((ref, force))

    class FakeTask:
        started: list[str] = []

        def remote(self, name: str) -> str:
            self.started.append(name)
            return f"ref {name}"

    ray, task = FakeRay(), FakeTask()
    tasks = RayTasks(ray)
    one, two = tasks.submit(task, "one"), tasks.submit(task, "two")
    tasks.done(one)  # ended already: not cancelled
    tasks.forward(signal.SIGTERM)
    assert ray.cancelled == [(two, True)] and tasks.stopped_by == signal.SIGTERM
    assert tasks.submit(task, "three") is None and task.started == ["one", "two"]
