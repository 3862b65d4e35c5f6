"""Client code cannot read server state: a method's client side, which executors receive and
pickle, holds no reference to the method and no tensor of its state, for every method a recipe
names; a client's update is the same whatever the server's state is once the client side is
built, in-process and on the pool executor; a receive job gives the same states on both."""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from ray_runs import federation

import fedlit.methods
from fedlit.federation import PoolSettings, ProcessPool, RaySettings
from fedlit.federation.client import ClientJob, ClientRunner, ReceiveJob
from fedlit.federation.executors import InProcess
from fedlit.methods import FederatedMethod, FedSEAL, FedSup, TSServerEMA
from fedlit.methods.client_side import ClientUpdate
from fedlit.models import Architecture

REPO = Path(__file__).parents[1]


def _recipe_methods() -> list[str]:
    """The method class of every recipe (recipes/**/*.yaml), by name."""
    names = set()
    for recipe in REPO.glob("recipes/**/*.yaml"):
        names |= set(re.findall(r"class_path: fedlit\.methods\.(\w+)", recipe.read_text()))
    return sorted(names)


class _ServerStateFinder(pickle.Pickler):
    """Pickles an object graph as an executor does and records what of ``method`` it meets:
    the method itself, one of its modules, or a tensor sharing memory with its state."""

    def __init__(self, method: FederatedMethod) -> None:
        super().__init__(io.BytesIO(), pickle.HIGHEST_PROTOCOL)
        self.method_ids = {id(method)} | {id(m) for m in method.modules()}
        self.pointers = {t.untyped_storage().data_ptr() for t in _tensors(method.state_dict())}
        self.found: list[str] = []

    def persistent_id(self, obj: Any) -> None:
        if id(obj) in self.method_ids:
            self.found.append(type(obj).__name__)
        elif isinstance(obj, torch.Tensor) and obj.untyped_storage().data_ptr() in self.pointers:
            self.found.append(f"tensor {tuple(obj.shape)}")
        return None

    def server_state_in(self, obj: Any) -> list[str]:
        self.dump(obj)
        return self.found


def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a state dict, those of a module's extra state included."""
    if isinstance(value, torch.Tensor):
        return [value] if value.numel() else []
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def test_recipes_name_every_method_family() -> None:
    assert len(_recipe_methods()) == 19, _recipe_methods()  # 17 + 2 centralized references


@pytest.mark.parametrize("name", _recipe_methods())
def test_the_client_side_holds_nothing_of_the_server(name: str) -> None:
    method = getattr(fedlit.methods, name)(Architecture(10, 1))
    method.initialize()
    side = method.client_side()
    assert _ServerStateFinder(method).server_state_in(side) == []
    # the check finds server state where there is some
    found = _ServerStateFinder(method).server_state_in({"side": side, "net": method.network})
    assert "Classifier" in found


def _runner(fed: Any) -> ClientRunner:
    fed.prepare()
    return fed.runner


def _poison(method: FederatedMethod) -> None:
    """Every floating tensor of the method's state set to NaN, its settings left alone."""
    with torch.no_grad():
        for tensor in _tensors(method.state_dict()):
            if tensor.is_floating_point():
                tensor.fill_(float("nan"))


def _same(a: ClientUpdate, b: ClientUpdate) -> None:
    torch.testing.assert_close(a.upload, b.upload, rtol=0, atol=0)
    torch.testing.assert_close(a.state, b.state, rtol=0, atol=0)
    assert a.metrics == b.metrics


@pytest.mark.parametrize("cls", [TSServerEMA, FedSup, FedSEAL])
def test_changing_the_server_state_leaves_a_client_update_unchanged(
    cls: type[FederatedMethod], fmnist_root: Path, tmp_path: Path
) -> None:
    """A teacher, a server network and thresholds: server state each method sends, and that
    client code could have read directly; on NaN it would have shown."""
    fed = federation(str(fmnist_root), tmp_path / "run", cls, "local", RaySettings())
    runner = _runner(fed)
    fed.method.on_round_start(1, 2)
    job = ClientJob(0, fed.method.broadcast(), None, 1)
    executor = InProcess(runner)
    (before,) = executor.run([job], 1)
    _poison(fed.method)
    (after,) = executor.run([job], 1)
    assert isinstance(before, ClientUpdate) and isinstance(after, ClientUpdate)
    _same(before, after)


def test_the_pool_gives_the_in_process_update_and_states_from_a_poisoned_server(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """FedSEAL on a pool of two workers: the update of a sampled client and the states of
    three clients that only receive (a receive job split over both workers) are those of the
    in-process executor, with the method's state set to NaN before the pool starts."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' thread count
    try:
        fed = federation(str(fmnist_root), tmp_path / "run", FedSEAL, "local", RaySettings())
        runner = _runner(fed)
        fed.method.on_round_start(1, 2)
        payload = fed.method.broadcast()
        job = ClientJob(0, payload, None, 1)
        receive = ReceiveJob(payload, [1, 2, 3], [None, None, None], [1, 1, 1])
        local = InProcess(runner)
        (want,) = local.run([job], 1)
        want_states = local.receive(receive)
        _poison(fed.method)
        pool = ProcessPool(runner, PoolSettings(workers=2), clients_per_round=3)
        try:
            (got,) = pool.run([job], 1)
            got_states = pool.receive(receive)
        finally:
            pool.close()
    finally:
        torch.set_num_threads(threads)
    assert isinstance(want, ClientUpdate) and isinstance(got, ClientUpdate)
    _same(want, got)
    assert len(got_states) == 3 and all(s["count"] == 1 for s in got_states)
    torch.testing.assert_close(got_states, want_states, rtol=0, atol=0)


def test_a_receive_job_splits_over_workers_without_its_payload() -> None:
    payload = {"model": {"w": torch.ones(2)}}
    job = ReceiveJob(payload, [5, 6, 7], ["a", "b", "c"], [1, 2, 3])
    assert job.chunks(2) == [slice(0, 3, 2), slice(1, 3, 2)]
    assert job.chunks(5) == [slice(i, 3, 5) for i in range(3)]  # no empty chunk
    part = job.part(job.chunks(2)[0])
    assert part == ReceiveJob({}, [5, 7], ["a", "c"], [1, 3])
    assert len(part) == 2 and len(job) == 3
