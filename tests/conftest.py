"""Shared fixtures: the local Fashion-MNIST and tiny federations on it."""

from __future__ import annotations

import json
import importlib.util
import os
import re
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from fedlit.data import FederatedDataModule
from fedlit.data.datasets import DEBIAN_FASHION_MNIST, stage_debian_fashion_mnist
from fedlit.machine import CPU_BF16_ENV, available_cores

# The tests run in fp32 on every CPU (the default is bf16 on a CPU that computes it natively):
# their numbers do not depend on the machine. Set in the environment, so that the `fedlit`
# subprocesses and the pool's and Ray's workers the tests start inherit it; set it to 1 before
# pytest to run the suite with the CPU's bf16.
os.environ.setdefault(CPU_BF16_ENV, "0")

# pytest-xdist's workers (setup.cfg: ``-n auto``, a worker per core) each take an equal share
# of the cores, they and the processes they start: processes that each take every core slow
# each other down many times over.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _threads = max(1, available_cores() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(_threads)
    torch.set_num_threads(_threads)


@pytest.fixture(scope="session")
def fmnist_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding Fashion-MNIST, staged from Debian's dataset-fashion-mnist package."""
    root = tmp_path_factory.mktemp("data")
    if not stage_debian_fashion_mnist(root):
        pytest.fail(
            f"Fashion-MNIST not found in {DEBIAN_FASHION_MNIST}: "
            "apt-get install dataset-fashion-mnist (.ci/run does this)"
        )
    return root


# The data of every tiny run: 2 clients of 32 images (batches of 16), 50 labels, 20 validation
# images, 100 test images (Fashion-MNIST's 10 classes).
TINY_DATA: dict[str, Any] = {
    "num_clients": 2,
    "examples_per_client": 32,
    "client_batch_size": 16,
    "labeled_per_class": 5,
    "val_per_class": 2,
    "test_subset": 100,
}


def tiny_overrides(root: Path, rounds: int = 1, test_subset: int = 100) -> list[str]:
    """Overrides that shrink a top-level recipe to a few seconds on the local Fashion-MNIST:
    :data:`TINY_DATA`, both clients sampled, 1 server epoch."""
    data = {"root": root} | TINY_DATA | {"test_subset": test_subset}
    return [f"--data.{key}={value}" for key, value in data.items()] + [
        f"--federation.rounds={rounds}",
        "--federation.clients_per_round=2",
        "--federation.server_epochs=1",
    ]


def tiny_fit(recipe: Path, root: Path, run_dir: Path, *extra: str, rounds: int = 1) -> list[str]:
    """``fedlit fit`` arguments for ``recipe`` shrunk by :func:`tiny_overrides` (``rounds``
    rounds), into ``run_dir``; ``extra``: more overrides."""
    return [
        "fit",
        f"--config={recipe}",
        *tiny_overrides(root, rounds=rounds),
        f"--trainer.default_root_dir={run_dir}",
        *extra,
    ]


def tiny_data(root: Path, **settings: Any) -> FederatedDataModule:
    """The data module of :data:`TINY_DATA` under ``root``; ``settings``: others, or other
    values."""
    return FederatedDataModule(**({"root": str(root)} | TINY_DATA | settings))


def stop_in_round(monkeypatch: pytest.MonkeyPatch, round_idx: int) -> Callable[[], None]:
    """Make every federation raise KeyboardInterrupt as round ``round_idx`` starts (a run
    stopped after round ``round_idx - 1``'s checkpoint); returns the undo."""
    from fedlit.federation import Federation

    original = Federation.run_round

    def stopping(self: Federation, index: int) -> dict[str, float]:
        if index == round_idx:
            raise KeyboardInterrupt
        return original(self, index)

    monkeypatch.setattr(Federation, "run_round", stopping)
    return lambda: monkeypatch.setattr(Federation, "run_round", original)


def refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``fedlit`` with ``args``, which must exit with status 2 and no traceback; returns
    stderr."""
    from fedlit.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err
    return err


def fed_dm(root: Path, **kw: object) -> FederatedDataModule:
    """A data module on the local Fashion-MNIST (5 clients of 300 images, 20 validation
    images a class; ``kw``: other settings), its federation set up with seed 7."""
    args = dict(root=str(root), num_clients=5, examples_per_client=300, val_per_class=20)
    args.update(kw)
    dm = FederatedDataModule(**args)  # type: ignore[arg-type]
    dm.setup_federation(seed=7)
    return dm


def load_script(path: Path) -> types.ModuleType:
    """The Python file ``path`` (a benchmark script) run as the module named by its stem,
    registered in ``sys.modules`` (its dataclasses need it)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def wandb_records(run_file: Path) -> list[dict[str, Any]]:
    """The records of an offline W&B run's transaction log, read by wandb's own inspector."""
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def recording_wandb_init(tmp_path: Path) -> tuple[list[dict[str, Any]], Callable[..., Any]]:
    """A stand-in for ``wandb.init`` that records each call's arguments (the list) and gives
    a run that logs nothing, its files under ``tmp_path``."""
    calls: list[dict[str, Any]] = []

    class Run:
        dir = str(tmp_path / "wandb" / "files")

        def log(self, media: Any) -> None:
            pass

        def finish(self) -> None:
            pass

    def init(**kwargs: Any) -> Run:
        calls.append(kwargs)
        return Run()

    return calls, init


@contextmanager
def lock_held_by_another_process(lock_file: Path) -> Iterator[None]:
    """``lock_file`` flock-ed by a second process (as a running fit holds its run's lock) until
    the block ends."""
    holder = (
        "import fcntl, sys, time\n"
        "f = open(sys.argv[1], 'a+')\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", holder, str(lock_file)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        yield
    finally:
        proc.kill()
        proc.wait()


@contextmanager
def docs_example(page: Path, section: str, name: str) -> Iterator[types.ModuleType]:
    """The one Python code block of ``page``'s section ``section`` (its heading's text), as
    printed there, run as the module ``name`` (so that a recipe can name what it defines)."""
    text = page.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(code, str(page), "exec"), module.__dict__)
        yield module
    finally:
        del sys.modules[name]
