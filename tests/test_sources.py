"""Data sets as sources (:mod:`fedlit.data.sources`): a new kind of data set is one class, and
every kind the library has keeps the one interface's contract.

A kind of data set the library lacks (sites, each a client keeping its labels) is written here
as a single :class:`~fedlit.data.sources.Files` and registered under a ``data.dataset`` name:
the data module, unchanged, checks its settings, draws its federation and names its clients.
Then every built-in kind, on tiny data, holds what the data module relies on.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset
from torchvision.io import write_png

from fedlit.data import Dirichlet, FederatedDataModule, ImageSplit, sources
from fedlit.data.datasets import DatasetSpec, Images, synthetic_images
from fedlit.data.own.read import ReadImages
from fedlit.data.partition import IID, Partitioner
from fedlit.data.pool_images import PoolImages

SITES = ("north", "east", "south")


def write_sites(folder: Path, per_site: int = 40, test: int = 30) -> Path:
    """``<site>.npz`` (x: (N, 28, 28) uint8, y) for each of :data:`SITES` and ``test.npz``:
    ``synthetic`` images whose pixel (0, 0) is the site's number plus one (0 in the test set),
    site k's classes skewed towards k."""
    folder.mkdir()
    for k, site in enumerate(SITES):
        x, y = synthetic_images(per_site, 10 + k, 10, 1, 28)
        y = torch.where(torch.arange(per_site) % 2 == 0, torch.full_like(y, k), y)
        x[:, 0, 0, 0] = k + 1
        np.savez(folder / f"{site}.npz", x=x[:, 0].numpy(), y=y.numpy())
    x, y = synthetic_images(test, 1, 10, 1, 28)
    x[:, 0, 0, 0] = 0
    np.savez(folder / "test.npz", x=x[:, 0].numpy(), y=y.numpy())
    return folder


def as_images(arrays: Mapping[str, np.ndarray]) -> Images:
    """``x`` (N, H, W) and ``y`` (N,) as a split's images (N, 1, H, W) and int64 labels."""
    return torch.from_numpy(arrays["x"])[:, None], torch.from_numpy(arrays["y"]).long()


class Sites(sources.Files):
    """Each client a site of its own (``<site>.npz`` under ``data.path``, :data:`SITES`), its
    images keeping their labels; the server's sets are drawn from every site's, the rest of a
    site's images are its client's shard (no partitioner), and ``test.npz`` is the test split."""

    kind = "sites"

    def read_files(self, path: Path) -> tuple[DatasetSpec, ReadImages]:
        sites = [np.load(path / f"{site}.npz") for site in SITES]
        self.site_of = np.concatenate([np.full(len(a["y"]), k) for k, a in enumerate(sites)])
        train = {key: np.concatenate([a[key] for a in sites]) for key in ("x", "y")}
        test = np.load(path / "test.npz")
        read = ReadImages({"train": as_images(train), "test": as_images(test)}, None)
        return DatasetSpec("sites", 10, 1, 28, (0.5,), (0.25,), False, read), read

    def clients(self, num_clients: int | None, examples_per_client: int | None) -> sources.Clients:
        if num_clients not in (None, len(SITES)):
            raise ValueError(f"data.num_clients={num_clients}: there are {len(SITES)} sites")
        return sources.Clients(len(SITES), None)

    def refuse(self, labels_at: str, partitioner: Partitioner | None) -> None:
        if partitioner is not None and type(partitioner) is not IID:
            raise ValueError(f"data.partitioner={partitioner!r}: the sites are the clients")

    def client_pool(self, asked: str | None, partitioner: Partitioner | None) -> str:
        return "train"

    def pool_images(
        self, pool: str, train: ImageSplit, rest: np.ndarray, root: Path, download: bool
    ) -> PoolImages:
        shards = [np.flatnonzero(self.site_of[rest] == k) for k in range(len(SITES))]
        labels = train.labels.numpy()[rest]
        return PoolImages(train, rest, labels, self.spec.num_classes, "of the sites", shards)

    def client_names(self, num_clients: int) -> list[str]:
        return list(SITES)


def test_a_new_kind_of_data_set_is_one_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sites, registered by name, serve a federation through the data module as it is: its
    refusals name their keys, each client's shard is its site's images less the server's,
    with their labels (R measured, far from IID), the clients are named after the sites, and
    a worker's copy holds the same shards."""
    monkeypatch.setitem(sources.FILES, "sites", Sites)
    path = str(write_sites(tmp_path / "sites"))
    with pytest.raises(ValueError, match=r"data\.partitioner=Dirichlet.*the sites"):
        FederatedDataModule("sites", path=path, num_clients=3, partitioner=Dirichlet(alpha=1.0))
    with pytest.raises(ValueError, match=r"data\.num_clients=4"):
        FederatedDataModule("sites", path=path, num_clients=4)
    data = FederatedDataModule("sites", path=path, labeled_per_class=1)  # 3 clients
    assert data.is_users_own and (data.dataset, data.image_shape) == ("sites", (1, 28, 28))
    data.setup_federation(0)
    assert len(data.server) == 10 and data.client_names() == data.named_clients() == list(SITES)
    for k, shard in enumerate(data.clients):
        assert shard.images[:, 0, 0, 0].eq(k + 1).all()  # only its own site's images
        assert len(shard) + int(data.server.images[:, 0, 0, 0].eq(k + 1).sum()) == 40
    assert data.clients_without_labels is None and data.clients[1].has_labels
    assert data.class_counts.shape == (3, 10) and data.non_iid_R > 0.3
    assert data.partition_title().startswith("sites, IID(): R = ")
    copy = pickle.loads(pickle.dumps(data))  # what a worker receives
    for k, shard in enumerate(data.clients):
        assert torch.equal(copy.client_data(k).shard.images, shard.images)


def write_classes(split_dir: Path, images: torch.Tensor, labels: torch.Tensor) -> None:
    """``images`` (N, C, H, W) uint8 as ``split_dir/c<label>/<n>.png``."""
    for n, (image, label) in enumerate(zip(images, labels, strict=True)):
        (split_dir / f"c{int(label)}").mkdir(parents=True, exist_ok=True)
        write_png(image, str(split_dir / f"c{int(label)}" / f"{n:03d}.png"))


def tiny(kind: str, folder: Path) -> FederatedDataModule:
    """A data module of 3 clients on a tiny data set of ``kind`` (written under ``folder``)."""
    (x, y), test = synthetic_images(60, 0, 10, 1, 28), synthetic_images(20, 1, 10, 1, 28)
    dataset: object = kind
    settings: dict[str, object] = {"num_clients": 3, "labeled_per_class": 1}
    if kind == "built-in":
        dataset = "synthetic"
    elif kind == "torch Dataset":
        dataset, settings["test_dataset"] = TensorDataset(x, y), TensorDataset(*test)
    elif kind == "arrays":
        arrays = {"x_train": x[:, 0], "y_train": y, "x_test": test[0][:, 0], "y_test": test[1]}
        np.savez(folder / "a.npz", **{key: value.numpy() for key, value in arrays.items()})
        settings["path"] = str(folder / "a.npz")
    else:
        write_classes(folder / "test", *test)
        settings["path"] = str(folder)
    if kind == "folder":
        write_classes(folder / "train", x, y)
    if kind == "client_folders":
        write_classes(folder / "labeled", *synthetic_images(30, 2, 10, 1, 28))
        for k, name in enumerate(("a", "b", "c")):
            (folder / "clients" / name).mkdir(parents=True)
            for n, image in enumerate(x[10 * k : 10 * k + 8 + k]):
                write_png(image, str(folder / "clients" / name / f"{n}.png"))
        settings["labeled_per_class"] = None
    return FederatedDataModule(dataset, **settings)  # type: ignore[arg-type]


KINDS = {
    "built-in": sources.BuiltIn,
    "folder": sources.Folder,
    "client_folders": sources.ClientFolders,
    "arrays": sources.Arrays,
    "torch Dataset": sources.TorchDatasets,
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_keeps_the_contract(kind: str, tmp_path: Path) -> None:
    """Each kind of data set is its own source; whether the clients' images have labels is
    said alike by the pool drawn, by ``clients_without_labels`` and by the partition's title;
    there are as many names as clients and as many class-count columns as the labels allow;
    only the user's own has ``user_data``; a worker's copy holds the shards, not the user's
    Datasets, and draws the same."""
    data = tiny(kind, tmp_path)
    assert type(data.source) is KINDS[kind]
    assert data.is_users_own == (kind != "built-in")
    if not data.is_users_own:
        with pytest.raises(RuntimeError, match="not a data set of the user's own"):
            _ = data.user_data
    data.setup_federation(3)
    labeled = all(c.has_labels for c in data.clients)
    assert labeled == (kind != "client_folders")
    assert (data.clients_without_labels is None) == labeled
    assert ("R = " in data.partition_title()) == labeled
    assert len(data.client_names()) == len(data.clients) == data.num_clients == 3
    assert data.class_counts.shape == (3, 10 if labeled else 1)
    assert data.class_counts.sum() == sum(len(c) for c in data.clients) > 0
    copy = pickle.loads(pickle.dumps(data))  # what a worker receives
    if kind == "torch Dataset":
        assert copy.source.train is None and copy.source.test is None
    for k, shard in enumerate(data.clients):
        assert torch.equal(copy.client_data(k).shard.images, shard.images)
