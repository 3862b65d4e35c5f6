"""Ray settings the cluster cannot meet and addresses that do not answer are refused before
anything is written, and the Ray a run starts stops with it. The runs that start Ray happen in
processes of their own (Ray replaces a process's signal handlers), as in test_executors.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import tiny_overrides

from fedlit.federation import RaySettings
from fedlit.federation.executors import check_reachable, connect_ray, fitting_workers

RECIPE = Path(__file__).parents[1] / "recipes" / "fedavg_fixmatch.yaml"
TWO_NODES = [{"CPU": 4.0, "GPU": 1.0}, {"CPU": 2.0}]
OFFER = "the Ray cluster offers 6 CPUs and 1 GPUs on 2 node(s), at most 4 CPUs and 1 GPUs"


def test_no_address_starts_a_new_ray_never_a_cluster_found_on_the_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``address: None`` asks Ray for a new local instance (its ``"local"``): a bare
    ``ray.init()`` joins a cluster another process started on this machine (two tests at once
    did so); an address given is passed as it is."""
    calls: list[object] = []

    class StandIn:
        @staticmethod
        def is_initialized() -> bool:
            return False

        @staticmethod
        def init(address: object = None, **settings: object) -> None:
            calls.append(address)

    monkeypatch.setitem(sys.modules, "ray", StandIn)
    assert connect_ray(None, 1.0) is True
    assert connect_ray("auto", 1.0) is True  # "auto" is left to Ray, not checked here
    assert calls == ["local", "auto"]


def test_workers_are_what_fits_on_the_nodes_at_most_clients_per_round() -> None:
    assert fitting_workers(RaySettings(cpus=1), 10, TWO_NODES) == 6  # 4 + 2
    assert fitting_workers(RaySettings(cpus=1), 3, TWO_NODES) == 3
    assert fitting_workers(RaySettings(cpus=3), 10, TWO_NODES) == 1  # only the first node
    assert fitting_workers(RaySettings(cpus=1, gpus=0.25), 10, TWO_NODES) == 4  # 1 GPU / 0.25
    assert fitting_workers(RaySettings(cpus=2, workers=3), 1, TWO_NODES) == 3  # 2 + 1


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        (RaySettings(cpus=64), "federation.ray.cpus=64: no node has 64 CPUs"),
        (RaySettings(cpus=5), "federation.ray.cpus=5: no node has 5 CPUs"),
        (RaySettings(gpus=2), "federation.ray.gpus=2: no node has 2 GPU(s)"),
        (RaySettings(cpus=2, workers=4), "federation.ray.workers=4: only 3 worker(s)"),
    ],
    ids=["cpus", "cpus-per-node", "gpus", "workers"],
)
def test_settings_the_cluster_cannot_meet_are_refused_naming_its_resources(
    settings: RaySettings, key: str
) -> None:
    with pytest.raises(ValueError) as exc:
        fitting_workers(settings, 10, TWO_NODES)
    assert key in str(exc.value) and OFFER in str(exc.value), exc.value


def test_no_gpu_at_all_is_refused_for_gpus() -> None:
    with pytest.raises(ValueError, match=r"ray.gpus=1: .* offers 2 CPUs and 0 GPUs on 1 node"):
        fitting_workers(RaySettings(gpus=1), 2, [{"CPU": 2.0}])


def _closed_port() -> int:
    with socket.socket() as s:  # a port nothing listens on (bound, then released)
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_addresses_that_do_not_answer_are_refused_in_one_line() -> None:
    port = _closed_port()
    cases = {
        "no-such-host.invalid:6379": "the host 'no-such-host.invalid' does not resolve",
        f"127.0.0.1:{port}": f"nothing answers at 127.0.0.1:{port} within 2 s",
        f"ray://127.0.0.1:{port}": f"nothing answers at 127.0.0.1:{port} within 2 s",
        "head-node": "give host:port, ray://host:port or auto",
    }
    for address, want in cases.items():
        start = time.monotonic()
        with pytest.raises(ValueError) as exc:
            check_reachable(address, timeout=2)
        assert f"federation.ray.address={address!r}" in str(exc.value), exc.value
        assert want in str(exc.value) and "\n" not in str(exc.value), exc.value
        assert time.monotonic() - start < 10
    with socket.socket() as server:  # a port that answers passes
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}", timeout=2)


def _marked(mark: str) -> list[int]:
    """The pids of live processes whose environment holds ``mark`` (a run's, and every Ray
    process it started: they inherit its environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark.encode() in (entry / "environ").read_bytes():
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _fit(root: Path, run_dir: Path, *extra: str) -> tuple[list[str], dict[str, str], str]:
    mark = f"FEDLIT_TEST_RUN={uuid.uuid4().hex}"
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", mark.split("=")[0]: mark}
    args = [
        sys.executable,
        "-m",
        "fedlit.cli",
        "fit",
        f"--config={RECIPE}",
        *tiny_overrides(root, rounds=50),
        "--federation.final_eval=[]",
        "--federation.executor=ray",
        f"--trainer.default_root_dir={run_dir}",
        *extra,
    ]
    return args, env, mark


def _gone(mark: str, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    return _marked(mark)


@pytest.mark.slow  # about 30 s: a local Ray instance starts, is checked, and stops
def test_more_cpus_than_the_machine_has_is_refused_before_any_file_and_ray_stops(
    fmnist_root: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args, env, mark = _fit(fmnist_root, run_dir, "--federation.ray.cpus=64")
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "federation.ray.cpus=64: no node has 64 CPUs" in done.stderr
    assert "the Ray cluster offers" in done.stderr and "Traceback" not in done.stderr
    assert not run_dir.exists()  # no .lock, config.yaml, hparams.yaml, run.json
    assert _gone(mark, 30) == []


@pytest.mark.slow  # about 40 s: a Ray run stopped in its second round
def test_sigterm_stops_a_ray_run_and_the_ray_it_started(fmnist_root: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args, env, mark = _fit(fmnist_root, run_dir)
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "checkpoints/last.ckpt").is_file() and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert len(_marked(mark)) > 1  # the driver and Ray's processes
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert _gone(mark, 60) == []
