"""Client executors: on a CPU, Ray gives the in-process run's weights and client states (at the
same thread count), survives a worker process that dies, and runs on a simulated two-node
cluster. The runs happen in a process of their own (tests/ray_runs.py): Ray replaces a
process's signal handlers, which the SIGTERM tests of this suite rely on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.slow
TESTS = Path(__file__).parent


def _ray_runs(mode: str, root: Path, out: Path) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", FEDLIT_TEST_DIE_ONCE=str(out / "died"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(TESTS / "ray_runs.py"), mode, str(root), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULTS ") :])


@pytest.fixture(scope="module")
def local_runs(fmnist_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _ray_runs("local", fmnist_root, tmp_path_factory.mktemp("ray"))


@pytest.mark.parametrize("method", ["FedAvgFixMatch", "FedSEAL", "SemiFL"])
def test_ray_gives_the_in_process_weights(method: str, local_runs: dict[str, Any]) -> None:
    """FedSEAL also covers persistent client states and the clients that only receive;
    SemiFL a server state of its own (the velocity) and labels made before the first step."""
    result = local_runs[method]
    assert result["workers"] == 2
    assert result["different"] == []


def test_a_worker_that_dies_has_its_client_retried(local_runs: dict[str, Any]) -> None:
    result = local_runs["DiesOnce"]
    assert local_runs["died"]  # a worker process was killed mid-round ...
    assert result["faults"] == 0  # ... its client retried, not left out
    assert result["different"] == []  # and the run is the one without the kill


def test_two_node_cluster(fmnist_root: Path, tmp_path: Path) -> None:
    """The workers spread over both nodes; the results are the in-process run's."""
    result = _ray_runs("cluster", fmnist_root, tmp_path)["cluster"]
    assert result["workers"] == 2 and result["nodes"] == 2
    assert result["different"] == []
