"""The server split, client shards, loaders and transforms on the real Fashion-MNIST."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import fed_dm

from fedlit.data import (
    Dirichlet,
    FederatedDataModule,
    ImageBatches,
    ImageSplit,
    RandomProportions,
    build_transform,
    dataset_spec,
)


def test_server_split_is_class_balanced_and_disjoint(fmnist_root: Path) -> None:
    dm = fed_dm(fmnist_root)
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
    a, b = fed_dm(fmnist_root), fed_dm(fmnist_root)
    assert torch.equal(a.server.images, b.server.images)
    assert all(torch.equal(x.images, y.images) for x, y in zip(a.clients, b.clients, strict=True))
    c = FederatedDataModule(root=str(fmnist_root), num_clients=5, examples_per_client=300)
    c.setup_federation(seed=8)
    assert not torch.equal(a.server.images, c.server.images)


def test_labeled_fraction(fmnist_root: Path) -> None:
    dm = fed_dm(fmnist_root, labeled_per_class=None, labeled_fraction=0.01, val_per_class=0)
    assert torch.bincount(dm.server.labels).tolist() == [60] * 10


def test_client_loaders_yield_images_only(fmnist_root: Path) -> None:
    dm = fed_dm(fmnist_root)
    batch = next(iter(dm.client_data(0).dataloader(("weak", "strong"))))
    assert isinstance(batch, (list, tuple)) and len(batch) == 2
    for view in batch:
        assert view.dtype == torch.float32 and view.shape[1:] == (1, 28, 28)
    loader = dm.client_data(1).dataloader(("weak",))
    assert isinstance(loader, ImageBatches) and loader.labels is None
    # 300 images, batches of 64: the last partial batch (44 images) is dropped
    assert len(loader) == 4 and loader.num_examples == 300
    assert all(len(batch) == 1 and len(batch[0]) == 64 for batch in loader)  # one view, no labels


def test_oracle_loader_has_true_labels(fmnist_root: Path) -> None:
    dm = fed_dm(fmnist_root)
    loader = dm.client_data(2).oracle_dataloader()
    labels = torch.cat([y for _, y in loader])
    assert len(labels) == 256  # 300 images in full batches of 64
    counts, kept = (
        torch.bincount(dm.clients[2].labels, minlength=10),
        torch.bincount(labels, minlength=10),
    )
    assert (kept <= counts).all()  # a sub-multiset of the shard's true labels


def test_non_iid_partition_is_logged(fmnist_root: Path) -> None:
    dm = fed_dm(
        fmnist_root, partitioner=Dirichlet(alpha=0.1), num_clients=10, examples_per_client=500
    )
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
        ({"stream_steps": 0}, "data.stream_steps"),
        ({"labels_at": "edge"}, "data.labels_at"),
    ],
)
def test_bad_settings_rejected_at_construction(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        FederatedDataModule(**kwargs)


def test_too_many_labels_rejected_at_setup(fmnist_root: Path) -> None:
    dm = FederatedDataModule(root=str(fmnist_root), labeled_per_class=7000)
    # the class by its number and its name
    with pytest.raises(
        ValueError, match=r"data\.labeled_per_class=7000.*class 0 \('T-shirt/top'\)"
    ):
        dm.setup_federation(0)
    dm = FederatedDataModule(root=str(fmnist_root), num_clients=100, examples_per_client=1000)
    with pytest.raises(ValueError, match=r"data\.examples_per_client"):
        dm.setup_federation(0)


def test_partition_class_counts_match_shards(fmnist_root: Path) -> None:
    dm = fed_dm(fmnist_root, partitioner=Dirichlet(alpha=0.5))
    for k, shard in enumerate(dm.clients):
        assert np.array_equal(np.bincount(shard.labels.numpy(), minlength=10), dm.class_counts[k])


def _keys(*splits: ImageSplit) -> list[bytes]:
    """The raw bytes of every image of ``splits``, for checking that splits are disjoint."""
    return [img.numpy().tobytes() for split in splits for img in split.images]


def _plain(images: torch.Tensor) -> torch.Tensor:
    return build_transform("plain", dataset_spec("fashion_mnist"))(images)


def test_stream_steps_cut_each_shard_into_consecutive_chunks(fmnist_root: Path) -> None:
    dm = fed_dm(fmnist_root, stream_steps=3)
    for k, shard in enumerate(dm.clients):
        chunks = [dm.client_shard(k, v) for v in (1, 2, 3)]
        assert [len(c) for c in chunks] == [100, 100, 100]
        keys = _keys(*chunks)
        assert len(set(keys)) == 300  # disjoint
        assert set(keys) == set(_keys(shard))  # together, the whole shard
        assert torch.equal(torch.cat([c.images for c in chunks]), shard.images)  # in order
        # after S visits the stream starts over
        for v in (4, 7):
            assert torch.equal(dm.client_shard(k, v).images, chunks[0].images)
        assert torch.equal(dm.client_shard(k, 5).labels, chunks[1].labels)
        assert len(dm.client_data(k, 2)) == 100
    assert dm.partition_summary()["data/stream_steps"] == 3
    with pytest.raises(ValueError, match="visit"):
        dm.client_shard(0, 0)


def test_without_streaming_every_visit_sees_the_whole_shard(fmnist_root: Path) -> None:
    dm = fed_dm(fmnist_root)
    assert dm.client_shard(2, 5) is dm.clients[2]
    assert len(dm.client_data(2)) == len(dm.client_data(2, 9)) == 300
    assert dm.partition_summary()["data/stream_steps"] == 0


def test_near_equal_chunks_and_too_many_steps(fmnist_root: Path) -> None:
    dm = fed_dm(fmnist_root, examples_per_client=302, stream_steps=3)
    assert [len(dm.client_shard(0, v)) for v in (1, 2, 3)] == [101, 101, 100]
    with pytest.raises(ValueError, match=r"data\.stream_steps=301"):
        fed_dm(fmnist_root, examples_per_client=300, stream_steps=301)


def test_streamed_loaders_yield_exactly_the_visible_chunk(fmnist_root: Path) -> None:
    dm = fed_dm(fmnist_root, stream_steps=3, eval_batch_size=32, client_batch_size=16)
    chunk = dm.clients[1].images[100:200]
    expected = _plain(chunk)

    batches = list(dm.client_data(1, visit=2).plain_dataloader())
    assert all(len(b) == 1 for b in batches)  # images only
    assert [len(b[0]) for b in batches] == [32, 32, 32, 4]
    plain = torch.cat([b[0] for b in batches])
    torch.testing.assert_close(plain, expected)  # in shard order, un-augmented
    assert not torch.allclose(plain, _plain(dm.clients[1].images[:100]))

    xs = torch.cat([x for (x,) in dm.client_data(1, visit=2).dataloader(("plain",))])
    assert xs.shape == (96, 1, 28, 28)  # 100 images in full batches of 16
    match = torch.cdist(xs.flatten(1), expected.flatten(1)).argmin(dim=1)
    assert len(set(match.tolist())) == 96  # chunk images only, none twice
    torch.testing.assert_close(xs, expected[match])

    labels = torch.cat([y for _, y in dm.client_data(1, visit=2).oracle_dataloader()])
    chunk_counts = torch.bincount(dm.clients[1].labels[100:200], minlength=10)
    assert len(labels) == 96 and (torch.bincount(labels, minlength=10) <= chunk_counts).all()


def test_with_index_covers_the_visible_shard_in_full_batches(fmnist_root: Path) -> None:
    """Every index of the visible shard at most once, all but the last partial batch's."""
    for kw, k, visit, n in (({}, 3, 1, 300), ({"stream_steps": 3}, 0, 3, 100)):
        dm = fed_dm(fmnist_root, **kw)
        shard = dm.client_shard(k, visit)
        idx, xs = [], []
        for batch in dm.client_data(k, visit).dataloader(("plain", "weak"), with_index=True):
            assert len(batch) == 3
            i, x, w = batch
            assert i.dtype == torch.int64 and i.shape == (len(x),)
            assert w.shape == x.shape
            idx.append(i)
            xs.append(x)
        index = torch.cat(idx)
        assert len(set(index.tolist())) == len(index) == n - n % 64
        assert set(index.tolist()) <= set(range(n))
        torch.testing.assert_close(torch.cat(xs), _plain(shard.images)[index])


def test_labels_at_client_are_dealt_class_by_class(fmnist_root: Path) -> None:
    kw = {"num_clients": 10, "examples_per_client": 200}
    dm = fed_dm(fmnist_root, labels_at="client", **kw)
    ref = fed_dm(fmnist_root, **kw)  # labels at the server, same seed
    assert len(dm.pool.labeled) == 10
    for split in dm.pool.labeled:
        assert torch.bincount(split.labels, minlength=10).tolist() == [5] * 10
    labeled = _keys(*dm.pool.labeled)
    assert len(set(labeled)) == 500  # clients' labeled sets are disjoint
    assert set(labeled).isdisjoint(_keys(dm.val, *dm.clients))
    # the same labeled set as at the server, and the same client pool and validation set
    assert set(labeled) == set(_keys(ref.server))
    for a, b in zip(dm.clients, ref.clients, strict=True):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert torch.equal(dm.val.images, ref.val.images)
    assert len(dm.server) == 0
    assert dm.server.images.shape[1:] == (1, 28, 28) and dm.server.images.dtype == torch.uint8
    summary = dm.partition_summary()
    assert summary["data/client_labeled"] == 500 and summary["data/server_labeled"] == 0
    assert ref.partition_summary()["data/client_labeled"] == 0
    assert ref.pool.labeled == []


def test_labeled_loaders_follow_labels_at(fmnist_root: Path) -> None:
    dm = fed_dm(fmnist_root, labels_at="client")
    batches = list(dm.client_data(3).labeled_dataloader(("weak", "strong")))
    assert all(len(b) == 3 for b in batches)
    labels = torch.cat([b[-1] for b in batches])
    own = dm.pool.labeled[3].labels  # 100 labeled examples: one full batch of 64
    assert (
        len(labels) == 64
        and (torch.bincount(labels, minlength=10) <= torch.bincount(own, minlength=10)).all()
    )
    assert batches[0][0].shape[1:] == (1, 28, 28)
    with pytest.raises(ValueError, match=r"data\.labels_at"):
        dm.server_dataloader()
    server = fed_dm(fmnist_root)
    with pytest.raises(ValueError, match=r"data\.labels_at"):
        server.client_data(0).labeled_dataloader()


def test_too_few_labels_for_every_client_rejected(fmnist_root: Path) -> None:
    with pytest.raises(ValueError, match=r"data\.labeled_per_class=4"):
        fed_dm(fmnist_root, labels_at="client", labeled_per_class=4)
    with pytest.raises(ValueError, match=r"data\.labeled_fraction"):
        fed_dm(fmnist_root, labels_at="client", labeled_per_class=None, labeled_fraction=1e-4)


def test_random_proportions_partition_is_logged(fmnist_root: Path) -> None:
    """Paper 002's non-IID split through the data module: equal shards, its R logged."""
    dm = fed_dm(
        fmnist_root, partitioner=RandomProportions(), num_clients=10, examples_per_client=500
    )
    summary = dm.partition_summary()
    assert summary["partition/min_client_size"] == summary["partition/max_client_size"] == 500
    assert summary["partition/R"] == dm.non_iid_R
    assert 0.1 < summary["partition/R"] < 0.6


def test_in_order_batches_are_views_of_the_split_with_its_rows_and_labels() -> None:
    """An evaluation loader (in order) gives each batch the split's rows k*b.. (k+1)*b, its
    labels and positions, the last batch partial, as views of the split (no copy of its
    images); a shuffled loader's batches are copies of the rows it drew."""
    torch.manual_seed(0)
    images = torch.randint(0, 256, (10, 1, 4, 4), dtype=torch.uint8)
    labels = torch.arange(10) % 3
    spec = dataset_spec("fashion_mnist")
    loader = ImageBatches(images, spec, ("plain",), 4, False, labels, with_index=True).on_device()
    batches = list(loader)
    assert [len(b) for b in batches] == [4, 4, 2]
    for k, batch in enumerate(batches):
        rows = slice(4 * k, 4 * k + len(batch))
        assert torch.equal(batch.images, images[rows]) and torch.equal(batch.labels, labels[rows])
        assert torch.equal(batch.index, torch.arange(10)[rows])
        assert batch.images.untyped_storage().data_ptr() == images.untyped_storage().data_ptr()
    shuffled = ImageBatches(images, spec, ("plain",), 4, True, labels, with_index=True)
    for batch in shuffled.on_device():
        assert torch.equal(batch.images, images[batch.index])
        assert torch.equal(batch.labels, labels[batch.index])
        assert batch.images.untyped_storage().data_ptr() != images.untyped_storage().data_ptr()
