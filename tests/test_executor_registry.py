"""Executors are chosen from one registry, ``EXECUTORS`` (name -> factory): the config's check
and ``make_executor`` both read it, so registering a name is all it takes to use it."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny_overrides

from fedlit.cli import main
from fedlit.federation import FederationConfig
from fedlit.federation import executors as executors_module
from fedlit.federation.client import ClientJob
from fedlit.federation.executors import EXECUTORS, InProcess, RaySettings, make_executor
from fedlit.federation.pool import PoolSettings, ProcessPool
from fedlit.methods import ClientUpdate

RUNNER: Any = "the run's client runner"  # what the factories pass on; never called here


class Recorded:
    """An executor factory's product: the arguments it was started with."""

    def __init__(self, *args: Any) -> None:
        self.args = args


def test_a_registered_executor_is_accepted_by_the_config_and_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(EXECUTORS, "fake", Recorded)
    assert FederationConfig(executor="fake").executor == "fake"
    ray, pool = RaySettings(cpus=2.0), PoolSettings(workers=3)
    built = make_executor("fake", RUNNER, ray, 4, pool)
    assert isinstance(built, Recorded)
    assert built.args == (RUNNER, ray, pool, 4)
    default = make_executor("fake", RUNNER, ray, 4)
    assert isinstance(default, Recorded)
    assert default.args == (RUNNER, ray, PoolSettings(), 4)


def test_an_unknown_executor_is_refused_naming_the_key() -> None:
    message = r"federation\.executor must be one of \('local', 'pool', 'ray'\), got 'fake'"
    with pytest.raises(ValueError, match=message):
        FederationConfig(executor="fake")
    with pytest.raises(ValueError, match=message):
        make_executor("fake", RUNNER, RaySettings(), 4)


def test_the_built_in_names_start_their_executors(monkeypatch: pytest.MonkeyPatch) -> None:
    local = make_executor("local", RUNNER, RaySettings(), 4)
    assert isinstance(local, InProcess) and local.runner == RUNNER
    pool = make_executor("pool", RUNNER, RaySettings(), 4, PoolSettings(workers=3, threads=2))
    assert isinstance(pool, ProcessPool)
    assert (pool.workers, pool.settings) == (3, PoolSettings(workers=3, threads=2))
    pool.close()
    monkeypatch.setattr(executors_module, "RayPool", Recorded)  # starts no Ray
    ray = RaySettings(workers=2)
    started = make_executor("ray", RUNNER, ray, 4)
    assert isinstance(started, Recorded) and started.args == (RUNNER, ray, 4)


class CountingExecutor(InProcess):
    """The in-process executor, counting the client jobs it is given."""

    jobs = 0

    def run(self, jobs: Sequence[ClientJob], round_idx: int) -> list[ClientUpdate | Exception]:
        CountingExecutor.jobs += len(jobs)
        return super().run(jobs, round_idx)


def test_a_registered_executor_runs_a_recipe_from_the_cli(
    monkeypatch: pytest.MonkeyPatch, fmnist_root: Path, tmp_path: Path
) -> None:
    monkeypatch.setitem(EXECUTORS, "counting", lambda runner, *_: CountingExecutor(runner))
    monkeypatch.setattr(CountingExecutor, "jobs", 0)
    run_dir = tmp_path / "run"
    main(
        [
            "fit",
            "--config=recipes/fedavg_fixmatch.yaml",
            *tiny_overrides(fmnist_root, rounds=2),
            "--federation.executor=counting",
            f"--trainer.default_root_dir={run_dir}",
        ]
    )
    assert CountingExecutor.jobs == 4  # two rounds of both clients
    with open(run_dir / "metrics.csv") as f:
        assert [float(row["round"]) for row in csv.DictReader(f)] == [0, 1, 2]
