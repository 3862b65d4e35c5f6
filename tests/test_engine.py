"""The client engine: each worker's networks persist and are overwritten in place for every
client; a client's update does not depend on which clients its worker ran before it, or in which
order; shuffled loaders give one batch shape; a loader's split is staged once on a device."""

from __future__ import annotations

import pickle
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from ray_runs import federation

from fedlit.aggregation.payloads import MODEL
from fedlit.data.datasets import SPECS
from fedlit.data.loaders import ImageBatches, staged
from fedlit.federation import RaySettings
from fedlit.federation.client import ClientRunner
from fedlit.federation.seeding import derive_seed, rng_states, seed_all
from fedlit.methods import FedAvgFixMatch, FederatedMethod, FedSEAL, TSClientEMA
from fedlit.methods.client_side import BUILD_SEED, ClientUpdate
from fedlit.models import Architecture
from fedlit.objectives.base import KeptOptimizers


def _updates(runner: ClientRunner, payload: dict, order: list[int]) -> dict[int, ClientUpdate]:
    return {cid: runner(payload, cid, 1, None, 1) for cid in order}


@pytest.mark.parametrize("cls", [FedAvgFixMatch, TSClientEMA, FedSEAL])
def test_a_client_update_does_not_depend_on_the_clients_run_before_it(
    cls: type[FederatedMethod], fmnist_root: Path, tmp_path: Path
) -> None:
    """Clients 0, 1, 2 on one worker, the same in the reverse order on another, and client 1
    alone on a third: bit-identical uploads, states and metrics (a teacher's network, a
    persistent client state and the model's BatchNorm buffers all pass through the workers'
    persistent networks)."""
    fed = federation(str(fmnist_root), tmp_path / "run", cls, "local", RaySettings())
    fed.prepare()
    fed.method.on_round_start(1, 2)
    payload = fed.method.broadcast()
    workers = [replace(fed.runner, client=fed.method.client_side()) for _ in range(3)]
    forward = _updates(workers[0], payload, [0, 1, 2])
    backward = _updates(workers[1], payload, [2, 1, 0])
    alone = _updates(workers[2], payload, [1])
    for cid in (0, 1, 2):
        a, b = forward[cid], backward[cid]
        torch.testing.assert_close(a.upload, b.upload, rtol=0, atol=0)
        torch.testing.assert_close(a.state, b.state, rtol=0, atol=0)
        assert a.metrics == b.metrics
    torch.testing.assert_close(alone[1].upload, forward[1].upload, rtol=0, atol=0)
    sent = payload[MODEL]
    assert any(not torch.equal(forward[0].model[k], sent[k]) for k in sent)  # it trained


def test_seeding_a_unit_of_work_sets_every_global_generator_as_the_libraries_own_seeding() -> None:
    """seed_all skips torch's queued device seedings where there is no accelerator: the
    generators end where ``random.seed``, ``np.random.seed`` and ``torch.manual_seed`` put
    them."""
    seed = derive_seed(7, 3, 2)
    seed_all(seed)
    ours, our_draw = rng_states(), torch.rand(4)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    theirs, their_draw = rng_states(), torch.rand(4)
    assert ours["python"] == theirs["python"]
    (kind, keys, *rest), (their_kind, their_keys, *their_rest) = ours["numpy"], theirs["numpy"]
    assert (kind, rest) == (their_kind, their_rest)
    torch.testing.assert_close(keys, their_keys, rtol=0, atol=0)
    torch.testing.assert_close(ours["torch"], theirs["torch"], rtol=0, atol=0)
    torch.testing.assert_close(our_draw, their_draw, rtol=0, atol=0)
    seed_all(seed + 1)
    assert not torch.equal(torch.get_rng_state(), theirs["torch"])


def test_a_worker_keeps_one_network_per_role_overwritten_in_place() -> None:
    method = FedAvgFixMatch(Architecture(10, 1))
    side = method.client_side()
    weights = method.broadcast()[MODEL]
    generator = torch.get_rng_state()
    network = side.network(weights)
    assert torch.equal(torch.get_rng_state(), generator)  # the build drew from its own seed
    with torch.no_grad():
        for p in network.parameters():
            p.add_(1.0)  # a client trains it
    some = dict(list(weights.items())[:2])  # a payload carrying two keys only
    again = side.network(some)
    assert again is network  # the same network, overwritten
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(BUILD_SEED)
        built = method.architecture().build().state_dict()
    for key, value in again.state_dict().items():
        torch.testing.assert_close(value, some.get(key, built[key]), rtol=0, atol=0)
    assert side.network(weights, "teacher") is not network  # another role, another network
    assert side.network(weights, None) is not side.network(weights, None)  # None: new ones
    with pytest.raises(ValueError, match="'nope'"):
        side.network({"nope": torch.zeros(1)})
    shipped = pickle.loads(pickle.dumps(side))  # an executor ships the side without them
    assert shipped._networks == {} and len(side._networks) == 2


def _batches(n: int, batch: int, shuffle: bool) -> list[int]:
    images = torch.randint(0, 255, (n, 1, 28, 28), dtype=torch.uint8)
    loader = ImageBatches(images, SPECS["fashion_mnist"], ("plain",), batch, shuffle)
    sizes = [len(x) for (x,) in loader]
    assert len(sizes) == len(loader)
    return sizes


def test_shuffled_batches_have_one_shape_and_evaluation_sees_every_image() -> None:
    assert _batches(10, 4, shuffle=True) == [4, 4]  # the last partial batch is dropped
    assert _batches(12, 4, shuffle=True) == [4, 4, 4]
    assert _batches(3, 4, shuffle=True) == [3]  # smaller than a batch: one batch of all
    assert _batches(1, 4, shuffle=True) == []  # BatchNorm cannot train on one image
    assert _batches(10, 4, shuffle=False) == [4, 4, 2]  # in order: every image


def test_a_split_is_staged_once_per_device_and_drawn_there() -> None:
    images = torch.randint(0, 255, (6, 1, 28, 28), dtype=torch.uint8)
    labels = torch.arange(6)
    assert staged(images, torch.device("cpu")) is images  # already there
    meta = torch.device("meta")
    first = staged(images, meta)
    assert first.device == meta and staged(images, meta) is first  # copied once, kept
    loader = ImageBatches(images, SPECS["fashion_mnist"], ("plain",), 2, True, labels=labels)
    on = loader.on_device(meta)
    assert on.images is first and on.labels is not None and on.labels.device == meta
    assert loader.images is images  # the loader itself is left as it was
    cpu = next(iter(loader.on_device(torch.device("cpu"))))
    assert cpu.images.device.type == "cpu" and len(cpu) == 2


def _two_steps(net: torch.nn.Linear, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    for x in (torch.ones(2, 3), torch.arange(6.0).view(2, 3)):
        optimizer.zero_grad()
        net(x).square().sum().backward()
        optimizer.step()
    return net.weight.detach().clone()


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_a_kept_optimizer_trains_as_a_new_one(kind: str) -> None:
    settings = {"lr": 0.1, "weight_decay": 0.01} | ({"momentum": 0.9} if kind == "sgd" else {})
    torch.manual_seed(0)
    net, fresh = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    fresh.load_state_dict(net.state_dict())
    start = {k: v.clone() for k, v in net.state_dict().items()}
    kept = KeptOptimizers()
    first = kept.get(kind, list(net.parameters()), settings)
    _two_steps(net, first)  # a first client moves its state
    net.load_state_dict(start)  # the next client's weights
    again = kept.get(kind, list(net.parameters()), settings)
    assert again is first
    assert all(not v.any() for s in again.state.values() for v in s.values() if v is not None)
    new = KeptOptimizers().get(kind, list(fresh.parameters()), settings)
    assert torch.equal(_two_steps(net, again), _two_steps(fresh, new))  # bit for bit
    other = kept.get(kind, list(fresh.parameters()), settings)  # other parameters: a new one
    assert other is not first
