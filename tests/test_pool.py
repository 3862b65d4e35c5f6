"""The pool executor on a CPU, on the real Fashion-MNIST: two workers at one torch thread give
the in-process run's weights, test accuracies and client states at one thread, as does one
worker (scheduling cannot change results); a worker that dies has its clients retried, a client
that raises is its round's fault; a pool run resumes in-process; a SIGTERM stops the run and its
workers; workers end with a driver that is killed; bad settings are refused naming the key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import stop_in_round, tiny_overrides
from dying_methods import MARKER, SignalsDriver, Unreliable
from lightning.pytorch.utilities.exceptions import SIGTERMException
from ray_runs import differences, federation

from fedlit.cli import main
from fedlit.federation import (
    Federation,
    FederationConfig,
    PoolSettings,
    ProcessPool,
    RaySettings,
    load_checkpoint,
)
from fedlit.federation.executors import EXECUTORS
from fedlit.methods import FedAvgFixMatch, FederatedMethod, FedSEAL

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
    """Round 1: client 1's worker is killed (SIGKILL) once, the pool restarted and the round's
    unfinished clients run again: the run equals the one without the kill. Round 2: client 3
    raises and is left out, as in-process."""
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
    t0 = time.perf_counter()
    with pytest.raises(SIGTERMException) as stop:
        fed.run()
    assert time.perf_counter() - t0 < 50  # not after the clients' minute
    assert stop.value.code == 143
    assert load_checkpoint(fed.checkpoint_path)["round"] == 1
    assert signal.getsignal(signal.SIGTERM) == handler
    assert len(pids) == 2
    for pid in pids:
        assert not _alive(pid), pid


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
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "fit",
                "--config=recipes/quickstart.yaml",
                f"--data.root={fmnist_root}",
                f"--trainer.default_root_dir={run_dir}",
                "--federation.executor=pool",
                "--federation.pool.workers=0",
            ]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "federation.pool.workers" in err and "Traceback" not in err
    assert not run_dir.exists()
