"""The server split, client shards, loaders and transforms on the real Fashion-MNIST."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedlit.data import Dirichlet, FederatedDataModule, build_transform, dataset_spec
from fedlit.data.datamodule import UnlabeledImages


def _dm(root: Path, **kw: object) -> FederatedDataModule:
    args = dict(root=str(root), num_clients=5, examples_per_client=300, val_per_class=20)
    args.update(kw)
    dm = FederatedDataModule(**args)  # type: ignore[arg-type]
    dm.setup_federation(seed=7)
    return dm


def test_server_split_is_class_balanced_and_disjoint(fmnist_root: Path) -> None:
    dm = _dm(fmnist_root)
    assert torch.bincount(dm.server.labels, minlength=10).tolist() == [50] * 10
    assert torch.bincount(dm.val.labels, minlength=10).tolist() == [20] * 10
    assert [len(c) for c in dm.clients] == [300] * 5
    # IID shards: 30 per class each
    assert (dm.class_counts == 30).all()
    assert dm.non_iid_R == pytest.approx(0.0)
    # no image is in two places: compare raw bytes of every image
    seen: set[bytes] = set()
    for split in (dm.server, dm.val, *dm.clients):
        for img in split.images:
            key = img.numpy().tobytes()
            assert key not in seen
            seen.add(key)


def test_same_seed_same_split_other_seed_differs(fmnist_root: Path) -> None:
    a, b = _dm(fmnist_root), _dm(fmnist_root)
    assert torch.equal(a.server.images, b.server.images)
    assert all(torch.equal(x.images, y.images) for x, y in zip(a.clients, b.clients, strict=True))
    c = FederatedDataModule(root=str(fmnist_root), num_clients=5, examples_per_client=300)
    c.setup_federation(seed=8)
    assert not torch.equal(a.server.images, c.server.images)


def test_labeled_fraction(fmnist_root: Path) -> None:
    dm = _dm(fmnist_root, labeled_per_class=None, labeled_fraction=0.01, val_per_class=0)
    assert torch.bincount(dm.server.labels).tolist() == [60] * 10


def test_client_loaders_yield_images_only(fmnist_root: Path) -> None:
    dm = _dm(fmnist_root)
    batch = next(iter(dm.client_dataloader(0, ("weak", "strong"))))
    assert isinstance(batch, (list, tuple)) and len(batch) == 2
    for view in batch:
        assert view.dtype == torch.float32 and view.shape[1:] == (1, 28, 28)
    ds = dm.client_dataloader(1, ("weak",)).dataset
    assert isinstance(ds, UnlabeledImages)
    assert not any(torch.is_tensor(v) and v.dtype == torch.long for v in vars(ds).values())


def test_oracle_loader_has_true_labels(fmnist_root: Path) -> None:
    dm = _dm(fmnist_root)
    loader = dm.client_oracle_dataloader(2)
    labels = torch.cat([y for _, y in loader])
    assert torch.equal(labels.sort().values, dm.clients[2].labels.sort().values)


def test_non_iid_partition_is_logged(fmnist_root: Path) -> None:
    dm = _dm(fmnist_root, partitioner=Dirichlet(alpha=0.1), num_clients=10, examples_per_client=500)
    assert dm.partition_summary()["partition/R"] > 0.5


def test_transforms_keep_channels_and_statistics() -> None:
    spec = dataset_spec("fashion_mnist")
    x = torch.randint(0, 256, (1, 28, 28), dtype=torch.uint8)
    for view in ("plain", "weak", "strong"):
        out = build_transform(view, spec)(x)
        assert out.shape == (1, 28, 28) and out.dtype == torch.float32
    plain = build_transform("plain", spec)(x)
    ref = (x.float() / 255 - 0.2860) / 0.3530
    torch.testing.assert_close(plain, ref)
    rgb = build_transform("strong", dataset_spec("cifar10"))(
        torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
    )
    assert rgb.shape == (3, 32, 32)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"dataset": "imagenet22k"}, "data.dataset"),
        ({"num_clients": 0}, "data.num_clients"),
        ({"num_clients": -3}, "data.num_clients"),
        ({"labeled_per_class": 50, "labeled_fraction": 0.1}, "data.labeled_per_class"),
        ({"labeled_fraction": 1.5, "labeled_per_class": None}, "data.labeled_fraction"),
    ],
)
def test_bad_settings_rejected_at_construction(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        FederatedDataModule(**kwargs)


def test_too_many_labels_rejected_at_setup(fmnist_root: Path) -> None:
    dm = FederatedDataModule(root=str(fmnist_root), labeled_per_class=7000)
    with pytest.raises(ValueError, match=r"data\.labeled_per_class=7000"):
        dm.setup_federation(0)
    dm = FederatedDataModule(root=str(fmnist_root), num_clients=100, examples_per_client=1000)
    with pytest.raises(ValueError, match=r"data\.examples_per_client"):
        dm.setup_federation(0)


def test_partition_class_counts_match_shards(fmnist_root: Path) -> None:
    dm = _dm(fmnist_root, partitioner=Dirichlet(alpha=0.5))
    for k, shard in enumerate(dm.clients):
        assert np.array_equal(np.bincount(shard.labels.numpy(), minlength=10), dm.class_counts[k])
