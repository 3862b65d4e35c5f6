"""A client pool drawn from a data set's unlabeled split (STL-10's, ``data.client_pool``).

torchvision's STL10 is swapped for a small fake of the same shape (no download): every image
carries its split's code and its index in its first pixels, so the tests can tell where each
client's and the server's images came from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedlit.data import datasets
from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.datasets import ImageSplit, load_unlabeled_split
from fedlit.data.partition import IID, SSFL, ClassesPerClient, Dirichlet
from fedlit.methods import FedAvgSL
from fedlit.models import Architecture

CODES = {"train": 1, "test": 2, "unlabeled": 3}
SIZES = {"train": 100, "test": 50, "unlabeled": 400}  # STL-10: 5,000, 8,000, 100,000


class FakeSTL10:
    """Shaped like torchvision's ``STL10(root, split, download=...)``: ``data`` (N, 3, 96, 96)
    uint8 and ``labels`` (N,), -1 for the unlabeled split as torchvision gives."""

    calls: list[tuple[str, bool]] = []

    def __init__(self, root: Any, split: str = "train", download: bool = False, **_: Any) -> None:
        FakeSTL10.calls.append((split, download))
        n = SIZES[split]
        self.data = np.zeros((n, 3, 96, 96), dtype=np.uint8)
        self.data[:, 0, 0, 0] = CODES[split]
        self.data[:, 0, 0, 1], self.data[:, 0, 0, 2] = np.divmod(np.arange(n), 256)
        self.labels = np.full(n, -1) if split == "unlabeled" else np.arange(n) % 10


@pytest.fixture(autouse=True)
def fake_stl10(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeSTL10.calls = []
    monkeypatch.setattr(datasets.tvd, "STL10", FakeSTL10)


def codes(split: ImageSplit) -> set[int]:
    return set(split.images[:, 0, 0, 0].tolist())


def index(split: ImageSplit) -> list[int]:
    return (split.images[:, 0, 0, 1].long() * 256 + split.images[:, 0, 0, 2].long()).tolist()


def stl10(tmp_path: Path, **kwargs: Any) -> FederatedDataModule:
    args: dict[str, Any] = dict(
        dataset="stl10",
        root=str(tmp_path),
        num_clients=4,
        examples_per_client=50,
        labeled_per_class=5,
        val_per_class=2,
        download=False,
    )
    return FederatedDataModule(**(args | kwargs))


def test_clients_draw_from_the_unlabeled_split_the_server_from_train(tmp_path: Path) -> None:
    data = stl10(tmp_path)
    assert data.client_pool == "unlabeled"  # STL-10's default
    data.setup_federation(0)
    assert ("unlabeled", False) in FakeSTL10.calls  # data.download is passed through
    assert [len(c) for c in data.clients] == [50] * 4
    seen = [i for c in data.clients for i in index(c)]
    assert len(set(seen)) == len(seen) == 200  # disjoint shards
    for client in data.clients:
        assert codes(client) == {CODES["unlabeled"]}
        assert not client.has_labels
    assert codes(data.server) == codes(data.val) == {CODES["train"]}
    assert len(data.server) == 50 and len(data.val) == 20
    assert torch.bincount(data.server.labels, minlength=10).tolist() == [5] * 10
    assert codes(data.test) == {CODES["test"]} and len(data.test) == SIZES["test"]
    summary = data.partition_summary()
    assert np.isnan(summary["partition/R"])  # no labels, no non-IID level
    assert summary["partition/min_client_size"] == summary["partition/max_client_size"] == 50
    assert data.class_counts.tolist() == [[50]] * 4  # one column: the shard sizes


def test_whole_unlabeled_split_and_streaming(tmp_path: Path) -> None:
    data = stl10(tmp_path, examples_per_client=None, stream_steps=2)
    data.setup_federation(0)
    assert [len(c) for c in data.clients] == [100] * 4  # 400 unlabeled images, all used
    chunk = data.client_shard(0, visit=2)
    assert index(chunk) == index(data.clients[0])[50:] and not chunk.has_labels
    batch = next(iter(data.client_data(0).dataloader(("weak",))))
    assert len(batch) == 1 and batch[0].shape[1:] == (3, 96, 96)  # images only


def test_same_seed_same_split_other_seed_differs(tmp_path: Path) -> None:
    def draw(seed: int) -> tuple[list[list[int]], list[int]]:
        data = stl10(tmp_path)
        data.setup_federation(seed)
        return [index(c) for c in data.clients], index(data.server)

    assert draw(3) == draw(3)
    assert draw(3)[0] != draw(4)[0]


def test_train_pool_keeps_the_labeled_split(tmp_path: Path) -> None:
    data = stl10(tmp_path, client_pool="train", examples_per_client=5)
    data.setup_federation(0)
    assert ("unlabeled", False) not in FakeSTL10.calls
    for client in data.clients:
        assert codes(client) == {CODES["train"]} and client.has_labels
    assert not set(index(data.server)) & {i for c in data.clients for i in index(c)}


def test_the_oracle_and_hidden_labels_are_refused_naming_the_key(tmp_path: Path) -> None:
    data = stl10(tmp_path)
    data.setup_federation(0)
    client = data.client_data(0)
    with pytest.raises(ValueError, match="data.client_pool='unlabeled'.*no labels"):
        FedAvgSL(Architecture(10, 3)).client_side().loader(client)
    with pytest.raises(ValueError, match="data.client_pool='unlabeled': FedAvgSL is an oracle"):
        FedAvgSL(Architecture(10, 3)).validate_data(data)  # before any work
    with pytest.raises(ValueError, match="data.client_pool"):
        client.oracle_dataloader()
    with pytest.raises(ValueError, match="data.client_pool"):
        client.hidden_labels  # noqa: B018


@pytest.mark.parametrize(
    "partitioner",
    [Dirichlet(alpha=0.5), ClassesPerClient(n=2), SSFL(r=0.4)],
    ids=lambda p: type(p).__name__,
)
def test_label_based_partitioners_are_refused_at_construction(
    tmp_path: Path, partitioner: Any
) -> None:
    with pytest.raises(ValueError, match=r"data\.partitioner=.*data\.client_pool='unlabeled'"):
        stl10(tmp_path, partitioner=partitioner)
    assert FakeSTL10.calls == []  # before any loading
    stl10(tmp_path, partitioner=partitioner, client_pool="train")  # labeled pool: fine
    stl10(tmp_path, partitioner=IID())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dataset": "fashion_mnist", "client_pool": "unlabeled"}, "data.client_pool='unlabeled'"),
        ({"client_pool": "test"}, "data.client_pool must be one of"),
    ],
)
def test_bad_client_pool_rejected(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        stl10(tmp_path, **kwargs)


def test_too_many_examples_per_client_names_the_keys(tmp_path: Path) -> None:
    data = stl10(tmp_path, examples_per_client=101)
    with pytest.raises(ValueError, match="data.examples_per_client=101.*'unlabeled' split"):
        data.setup_federation(0)


def test_load_unlabeled_split(tmp_path: Path) -> None:
    split = load_unlabeled_split("stl10", tmp_path, download=True)
    assert FakeSTL10.calls == [("unlabeled", True)]  # torchvision's real download path
    assert split.images.shape == (400, 3, 96, 96) and split.images.dtype == torch.uint8
    assert not split.has_labels
    with pytest.raises(ValueError, match="no labels"):
        split.labels  # noqa: B018
    with pytest.raises(ValueError, match="data.dataset"):
        load_unlabeled_split("cifar10", tmp_path)


def test_paper_recipe_runs_on_the_unlabeled_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Paper 000's STL-10 recipe, its own data set (the fake) at a tiny scale: past setup."""
    from fedlit.cli import main

    run_dir = tmp_path / "run"
    recipe = Path(__file__).parents[1] / "recipes" / "papers" / "fedavg_fixmatch_stl10.yaml"
    main(
        [
            "fit",
            f"--config={recipe}",
            f"--data.root={tmp_path}",
            "--data.download=false",
            "--data.num_clients=2",
            "--data.examples_per_client=16",
            "--data.batch_size=8",
            "--data.client_batch_size=8",
            "--data.labeled_per_class=2",
            "--data.test_subset=20",
            "--federation.rounds=1",
            "--federation.clients_per_round=2",
            "--federation.local_epochs=1",
            "--federation.final_eval=[]",
            "--model.init_args.network.backbone=small_cnn",
            f"--trainer.default_root_dir={run_dir}",
        ]
    )
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert final["fault/clients"] == 0.0 and 0.0 <= final["test/acc"] <= 1.0
    assert [split for split, _ in FakeSTL10.calls] == ["train", "test", "unlabeled"]
