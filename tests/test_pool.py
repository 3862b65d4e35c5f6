"""The pool executor on a CPU, on the real Fashion-MNIST: two workers at one torch thread give
the in-process run's weights, test accuracies and client states at one thread, as does one
worker (scheduling cannot change results); a worker that dies has its client retried, a client
that raises is its round's fault; a client that kills its worker on every attempt is left out
alone, its round's healthy client kept as in a clean run (on the generated data); a pool run
resumes in-process; a SIGTERM stops the run and its workers, and a SIGTERM of ``fedlit fit``
exits within 3 s leaving no process, at the workers' start-up and while they run clients;
workers end with a driver that is killed; bad settings are refused naming the key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from conftest import refused, stop_in_round, tiny_data, tiny_overrides
from dying_methods import KILLER, MARKER, STARTED, KillsItsWorker, SignalsDriver, Unreliable
from lightning.pytorch.utilities.exceptions import SIGTERMException
from ray_runs import differences, federation

from fedlit.cli import main
from fedlit.federation import (
    Callback,
    Federation,
    FederationConfig,
    PoolSettings,
    ProcessPool,
    RaySettings,
    RunView,
    load_checkpoint,
)
from fedlit.federation.executors import EXECUTORS
from fedlit.methods import ClientUpdate, FedAvgFixMatch, FederatedMethod, FedSEAL
from fedlit.models import Architecture
from fedlit.objectives import Optimization

pytestmark = pytest.mark.slow
REPO = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Workers run one torch thread each: the in-process runs here do too."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run(root: Path, run_dir: Path, cls: type[FederatedMethod], workers: int | None) -> Federation:
    """The 2-round, 3-of-4-clients federation of tests/ray_runs.py, in this process (``workers``
    None) or on a pool of ``workers`` processes at one thread each."""
    fed = federation(str(root), run_dir, cls, "local", RaySettings())
    if workers is not None:
        fed.config = replace(fed.config, executor="pool", pool=PoolSettings(workers=workers))
    fed.run()
    return fed


@pytest.fixture(scope="module")
def runs(
    fmnist_root: Path, tmp_path_factory: pytest.TempPathFactory, one_thread: None
) -> dict[str, Federation]:
    out = tmp_path_factory.mktemp("pool")
    return {
        f"{cls.__name__}/{workers}": _run(
            fmnist_root, out / f"{cls.__name__}{workers}", cls, workers
        )
        for cls, workers in [
            (FedAvgFixMatch, None),
            (FedAvgFixMatch, 2),
            (FedAvgFixMatch, 1),
            (FedSEAL, None),
            (FedSEAL, 2),
        ]
    }


@pytest.mark.parametrize("method", ["FedAvgFixMatch", "FedSEAL"])
def test_two_workers_give_the_in_process_run(method: str, runs: dict[str, Federation]) -> None:
    """Final weights, every round's test accuracy and the client states are bit-identical (FedSEAL
    also covers persistent client states and the clients that only receive the broadcast)."""
    local, pool = runs[f"{method}/None"], runs[f"{method}/2"]
    assert differences(local, pool) == []
    assert [h["round"] for h in pool.history] == [1, 2]
    assert all(h["fault/clients"] == 0 for h in pool.history)
    if method == "FedSEAL":  # every client holds a state: 3 sampled + 1 that only received
        assert len(pool.store.client_ids()) == 4


def test_the_number_of_workers_does_not_change_results(runs: dict[str, Federation]) -> None:
    assert differences(runs["FedAvgFixMatch/1"], runs["FedAvgFixMatch/2"]) == []
    assert differences(runs["FedAvgFixMatch/1"], runs["FedAvgFixMatch/None"]) == []


def test_a_dead_worker_is_retried_and_a_raising_client_is_a_fault(
    fmnist_root: Path, tmp_path: Path, one_thread: None
) -> None:
    """Round 1: client 1's worker is killed (SIGKILL) once and client 1 run again on a fresh
    worker: the run equals the one without the kill. Round 2: client 3 raises and is left out,
    as in-process."""
    marker = tmp_path / "died"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MARKER, str(marker))
        marker.write_text("")  # present: the in-process run kills nothing
        local = _run(fmnist_root, tmp_path / "local", Unreliable, None)
        marker.unlink()
        pooled = federation(str(fmnist_root), tmp_path / "pool", Unreliable, "local", RaySettings())
        pooled.config = replace(pooled.config, executor="pool", pool=PoolSettings(workers=2))
        pooled.prepare()
        executor = pooled.executor
        assert isinstance(executor, ProcessPool)
        pooled.run()
    assert marker.read_text() not in ("", str(os.getpid()))  # a worker died, not the driver
    assert executor.restarts == 1
    assert [h["fault/clients"] for h in pooled.history] == [0.0, 1.0]
    assert pooled.history[1]["fault/client_3"] == 1.0  # raised
    assert differences(local, pooled) == []


class Updates(Callback):
    """Records every surviving client's update, by (round, client)."""

    def __init__(self) -> None:
        self.kept: dict[tuple[int, int], ClientUpdate] = {}

    def on_updates(
        self,
        run: RunView,
        round_idx: int,
        received: Any,
        updates: Any,
        metrics: dict[str, float],
    ) -> None:
        self.kept |= {(round_idx, u.client_id): u for u in updates}


def _tiny(root: Path, run_dir: Path, pool: PoolSettings | None) -> tuple[Federation, Updates]:
    """One round of KillsItsWorker's FedAvg-FixMatch on 2 clients of 32 generated images, in
    this process (``pool`` None) or on a pool; the callback that records the updates."""
    data = tiny_data(
        root, dataset="synthetic", labeled_per_class=2, val_per_class=0, test_subset=50
    )
    method = KillsItsWorker(Architecture(10, 1), optim=Optimization(client_lr=0.03))
    cfg = FederationConfig(
        rounds=1,
        clients_per_round=2,
        executor="local" if pool is None else "pool",
        pool=pool or PoolSettings(),
    )
    updates = Updates()
    fed = Federation(
        method, data, cfg, run_dir=run_dir, seed=0, progress=False, extra_callbacks=[updates]
    )
    return fed, updates


def test_a_client_that_kills_its_worker_every_time_is_left_out_alone(
    tmp_path: Path,
    one_thread: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Client 1 kills its worker (SIGKILL of itself) on each of its 2 attempts (max_retries 1)
    while client 0 trains on the other worker: client 1 alone is left out, as a "died" fault
    (3) naming it; client 0's update is kept and equals a clean in-process run's, bit for bit;
    the round goes on (min_clients 1)."""
    clean, clean_updates = _tiny(tmp_path / "data", tmp_path / "clean", None)
    clean.run()  # KILLER unset: no client kills anything
    monkeypatch.setenv(KILLER, "1")
    fed, updates = _tiny(tmp_path / "data", tmp_path / "pool", PoolSettings(2, max_retries=1))
    fed.prepare()
    executor = fed.executor
    assert isinstance(executor, ProcessPool)
    capsys.readouterr()
    fed.run()
    err = capsys.readouterr().err
    assert (
        "round 1: client 1's worker process died on each of its 2 attempts (killed by SIGKILL); "
        "left out of the round"
    ) in err, err
    assert "client 0" not in err and "BrokenProcessPool" not in err, err
    assert executor.restarts == 2  # client 1's worker, twice; client 0's never
    assert fed.history[-1]["fault/clients"] == 1 and fed.history[-1]["fault/client_1"] == 3.0
    assert "fault/client_0" not in fed.history[-1]
    assert list(updates.kept) == [(1, 0)]
    got, want = updates.kept[(1, 0)], clean_updates.kept[(1, 0)]
    assert got.model.keys() == want.model.keys()
    for key, value in want.model.items():
        assert torch.equal(got.model[key], value), key
    assert got.num_examples == want.num_examples and got.metrics == want.metrics


def test_resume_moves_from_the_pool_to_local(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the CLI: a pool run stopped as round 2 starts, resumed in-process, ends as the
    2-round in-process run."""
    recipe, tiny = "--config=recipes/fedavg_fixmatch.yaml", tiny_overrides(fmnist_root, 2)
    whole, part = tmp_path / "whole", tmp_path / "part"
    main(["fit", recipe, *tiny, f"--trainer.default_root_dir={whole}"])
    undo = stop_in_round(monkeypatch, 2)
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        main(
            [
                "fit",
                recipe,
                *tiny,
                f"--trainer.default_root_dir={part}",
                "--federation.executor=pool",
                "--federation.pool.workers=2",
                f"--federation.pool.threads={torch.get_num_threads()}",
            ]
        )
    undo()
    ckpt = part / "checkpoints" / "last.ckpt"
    assert load_checkpoint(ckpt)["round"] == 1
    main(
        ["fit", recipe, *tiny, f"--trainer.default_root_dir={part}", f"--federation.resume={ckpt}"]
    )
    a = load_checkpoint(whole / "checkpoints" / "last.ckpt")
    b = load_checkpoint(ckpt)
    assert a["round"] == b["round"] == 2
    for key, value in a["method_state"].items():
        assert torch.equal(value, b["method_state"][key]), key
    assert [h.get("test/acc") for h in a["history"]] == [h.get("test/acc") for h in b["history"]]


def test_sigterm_stops_the_run_and_its_workers(
    fmnist_root: Path, tmp_path: Path, one_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM while the clients of round 2 run (they take a minute) stops the run at once,
    as a per-step Trainer does (SIGTERMException: exit status 143), with round 1's checkpoint;
    the workers are gone and the driver's SIGTERM handler is the one it had."""
    monkeypatch.setenv(MARKER, str(tmp_path / "signalled"))
    fed = federation(str(fmnist_root), tmp_path / "run", SignalsDriver, "local", RaySettings())
    fed.config = replace(fed.config, executor="pool", pool=PoolSettings(workers=2))
    fed.prepare()
    executor = fed.executor
    assert isinstance(executor, ProcessPool)
    handler = signal.getsignal(signal.SIGTERM)
    pids: list[int] = []
    original = executor.run

    def run(jobs: Any, round_idx: int) -> Any:
        if round_idx == 2:  # the workers round 1 started
            pids.extend(executor.pids())
        return original(jobs, round_idx)

    executor.run = run  # type: ignore[method-assign]
    with pytest.raises(SIGTERMException) as stop:
        fed.run()
    signalled = (tmp_path / "signalled").stat().st_mtime  # created just before the signal
    assert time.time() - signalled < 10  # not after the clients' minute
    assert stop.value.code == 143
    assert load_checkpoint(fed.checkpoint_path)["round"] == 1
    assert signal.getsignal(signal.SIGTERM) == handler
    assert len(pids) == 2
    for pid in pids:
        assert not _alive(pid), pid


def _fit_on_a_pool(run_dir: Path, started: Path) -> subprocess.Popen[bytes]:
    """``fedlit fit`` of :class:`~dying_methods.Slow` (clients that take a minute, each
    marking its start in ``started``) on the generated data, on a pool of 2 workers; its
    output into ``run_dir``'s sibling ``fit.log``."""
    args = [
        "fit",
        "--config=recipes/quickstart.yaml",
        "--model.class_path=dying_methods.Slow",
        "--data.dataset=synthetic",
        f"--data.root={run_dir.parent / 'data'}",
        "--data.num_clients=2",
        "--data.examples_per_client=32",
        "--data.client_batch_size=16",
        "--data.labeled_per_class=2",
        "--data.val_per_class=0",
        "--data.test_subset=50",
        "--federation.rounds=1",
        "--federation.clients_per_round=2",
        "--federation.executor=pool",
        "--federation.pool.workers=2",
        f"--trainer.default_root_dir={run_dir}",
    ]
    path = os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1") | {
        STARTED: str(started)
    }
    with open(run_dir.parent / "fit.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "fedlit", *args], cwd=REPO, env=env, stdout=log, stderr=log
        )


def _workers(driver: psutil.Process) -> list[psutil.Process]:
    try:
        return [p for p in driver.children() if "spawn_main" in " ".join(p.cmdline())]
    except psutil.Error:
        return []


def _wait_on_a_pool(
    fit: subprocess.Popen[bytes], driver: psutil.Process, started: Path, first_worker: bool
) -> None:
    """Waits (400 s at most) while ``fit`` runs, until its first worker process appears
    (``first_worker``) or both workers run a client (:func:`_fit_on_a_pool`)."""
    deadline = time.monotonic() + 400
    while fit.poll() is None and time.monotonic() < deadline:
        if (first_worker and _workers(driver)) or len(list(started.iterdir())) == 2:
            return
        time.sleep(0.01)


@pytest.mark.parametrize("moment", ["start-up", "clients"])
def test_sigterm_of_a_pool_fit_ends_every_process_within_3_s(moment: str, tmp_path: Path) -> None:
    """``fedlit fit`` on a pool of 2 workers, sent SIGTERM as its first worker process appears
    (start-up) or once both workers run a client: it exits with status 143 within 3 s, every
    process it started (the workers, multiprocessing's resource tracker) is gone within those
    3 s, and nothing (a traceback, an error) is printed."""
    started = tmp_path / "started"
    started.mkdir()
    fit = _fit_on_a_pool(tmp_path / "run", started)
    driver = psutil.Process(fit.pid)
    try:
        _wait_on_a_pool(fit, driver, started, moment == "start-up")
        assert fit.poll() is None, (tmp_path / "fit.log").read_text()
        children = driver.children(recursive=True)
        assert len(_workers(driver)) >= 1
        signalled = time.monotonic()
        fit.send_signal(signal.SIGTERM)
        code = fit.wait(timeout=60)
        exited = time.monotonic() - signalled
        _, alive = psutil.wait_procs(children, timeout=max(0.0, signalled + 3 - time.monotonic()))
    finally:
        if fit.poll() is None:
            fit.kill()
    log = (tmp_path / "fit.log").read_text()
    assert code == 143, log
    assert exited < 3, exited
    assert not alive, [" ".join(p.cmdline()) for p in alive]
    assert "Traceback" not in log and "Error" not in log, log
    assert moment == "start-up" or len(list(started.iterdir())) == 2


def _gone(process: psutil.Process) -> bool:
    """Ended: no such process, or one that ended and waits to be reaped (a zombie)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("moment", ["set-up", "clients"])
def test_a_sigkilled_drivers_workers_end_within_1_s(moment: str, tmp_path: Path) -> None:
    """``fedlit fit`` on a pool of 2 workers, killed with SIGKILL (no chance to stop its pool)
    half a second after its first worker process appears (the workers still import torch:
    seconds) or once both workers run a client: every worker is gone within a second."""
    started = tmp_path / "started"
    started.mkdir()
    fit = _fit_on_a_pool(tmp_path / "run", started)
    driver = psutil.Process(fit.pid)
    workers: list[psutil.Process] = []
    try:
        _wait_on_a_pool(fit, driver, started, moment == "set-up")
        if moment == "set-up":
            time.sleep(0.5)
        workers = _workers(driver)
        assert fit.poll() is None and workers, (tmp_path / "fit.log").read_text()
        assert moment == "clients" or not list(started.iterdir())  # still starting
        fit.kill()
        killed = time.monotonic()
        fit.wait()
        while not all(_gone(w) for w in workers) and time.monotonic() < killed + 10:
            time.sleep(0.01)
        ended = time.monotonic() - killed
    finally:
        if fit.poll() is None:
            fit.kill()
        for worker in workers:
            with suppress(psutil.NoSuchProcess):
                worker.kill()
    assert all(_gone(w) for w in workers)
    assert ended < 1, ended


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


DRIVER = """
import json, os, sys, time
from fedlit.federation.pool import PoolSettings, ProcessPool
if __name__ == "__main__":
    pool = ProcessPool(None, PoolSettings(workers=2), clients_per_round=2)
    pool._gather([(os.getpid, ())] * 8)
    print(json.dumps(pool.pids()), flush=True)
    time.sleep(600)
"""


def test_workers_end_with_a_killed_driver(tmp_path: Path) -> None:
    """A driver killed with SIGKILL (no chance to stop its pool) leaves no worker behind."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    driver = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert driver.stdout is not None
        pids = set(json.loads(driver.stdout.readline()))
    finally:
        driver.kill()
        driver.wait()
    assert 1 <= len(pids) <= 2 and driver.pid not in pids
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"workers": 0}, "federation.pool.workers"),
        ({"threads": 0}, "federation.pool.threads"),
        ({"max_retries": -1}, "federation.pool.max_retries"),
    ],
)
def test_bad_pool_settings_are_refused_naming_the_key(settings: dict[str, int], key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        PoolSettings(**settings)
    assert "pool" in EXECUTORS
    assert FederationConfig(executor="pool").pool == PoolSettings()


def test_bad_pool_setting_exits_2_before_any_work(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    args = ["fit", "--config=recipes/quickstart.yaml", f"--data.root={fmnist_root}"]
    args += [f"--trainer.default_root_dir={run_dir}", "--federation.executor=pool"]
    err = refused([*args, "--federation.pool.workers=0"], capsys)
    assert "federation.pool.workers" in err
    assert not run_dir.exists()
