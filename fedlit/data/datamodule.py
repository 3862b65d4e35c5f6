"""The federated data module: labeled/validation sets, client shards and the test set."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import lightning as L
import numpy as np

from fedlit.data.client import ClientData
from fedlit.data.datasets import (
    SPECS,
    DatasetSpec,
    ImageSplit,
    dataset_spec,
    load_split,
    load_unlabeled_split,
)
from fedlit.data.loaders import ImageBatches
from fedlit.data.partition import IID, Partitioner, class_counts, non_iid_metric

SPLIT_TAG = 0x5EED  # keeps the split's random stream apart from the partition's
TEST_SUBSET_SEED = 0x7E57


LABELS_AT = ("server", "client")
CLIENT_POOLS = ("train", "unlabeled")


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")


class FederatedDataModule(L.LightningDataModule):
    """A labeled set (and validation set) plus unlabeled client shards of one data set.

    The training split is divided, by seed, into a class-balanced labeled set
    (``labeled_per_class`` per class, or ``labeled_fraction`` of each class), an optional
    class-balanced validation set (``val_per_class``, always at the server), and a client pool
    that ``partitioner`` divides among ``num_clients`` clients (``examples_per_client`` each,
    or the whole pool). Client loaders yield images only; the pool's labels are kept aside for
    diagnostics and for the FedAvg-SL oracle, which is marked as such.

    The labeled set is the server's (``labels_at="server"``) or, labels-at-client, is dealt
    out to the clients class by class (``labels_at="client"``): ``server`` is then empty and
    ``client_labeled[k]`` holds client k's labeled examples, on top of its unlabeled shard.

    Server-held unlabeled images (``server_unlabeled_fraction``, paper 001 section IV-E's beta):
    that fraction of each class is set aside, after the validation set and before the client
    pool, as ``server_unlabeled``; only a method that asks for them reads them (FedCon's
    ``server_unlabeled``), through :meth:`server_unlabeled_dataloader`.

    Client pool from an unlabeled split (``client_pool="unlabeled"``, the default for a data
    set that has one: STL-10's 100,000 ``unlabeled`` images): the training split gives the
    server's sets only (what is left of it is unused) and ``partitioner``, which must be
    :class:`~fedlit.data.partition.IID`, deals the unlabeled split out at random. Those images
    have no labels: reading the shards' labels (the FedAvg-SL oracle, ``hidden_labels``
    diagnostics) raises ValueError naming ``data.client_pool``; ``class_counts`` has a single
    column, the shard sizes, and ``non_iid_R`` is NaN.

    Streaming non-IID (``stream_steps=S``): each unlabeled shard is cut, in shard order, into
    S near-equal consecutive chunks; on its n-th selection (``visit=n``) a client sees only
    chunk (n - 1) mod S, the newly streamed-in data. After S selections the stream starts
    over from the first chunk.

    Args:
        dataset: a name from :data:`fedlit.data.datasets.SPECS`.
        root: where data sets are stored (and downloaded to).
        num_clients: K, the number of clients.
        examples_per_client: unlabeled examples per client; None divides the whole pool.
        labeled_per_class: labeled server examples per class.
        labeled_fraction: alternatively, the fraction of each class that is labeled.
        val_per_class: server validation examples per class (0: none).
        partitioner: how the pool is divided (default IID).
        batch_size: server (labeled) batch size.
        client_batch_size: client (unlabeled) batch size.
        eval_batch_size: the batch size of every inference pass: validation, test, the
            BatchNorm re-estimation of the scored model (one batch holds the common
            protocol's 500 server images: a full pass's statistics) and the clients'
            un-augmented prediction passes (FedSEAL's). No gradients are kept, so it is large.
        test_subset: evaluate on this many test images (a fixed, class-balanced draw) instead
            of the whole test split; for quick experiments and tests.
        download: download data sets that are not under ``root``.
        stream_steps: S, the number of chunks each client's shard is streamed in (None: every
            visit sees the whole shard).
        labels_at: ``"server"`` (the labeled set stays at the server) or ``"client"``
            (labels-at-client: the labeled set is split among the clients, class by class).
        server_unlabeled_fraction: the fraction of each class the server also holds without
            labels, in [0, 1) (0: none).
        client_pool: where the clients' images come from: ``"train"`` (the training split,
            after the server's sets) or ``"unlabeled"`` (the data set's unlabeled split, see
            :attr:`DatasetSpec.unlabeled_split`); None: ``"unlabeled"`` if the data set has
            one (STL-10), else ``"train"``.
    """

    def __init__(
        self,
        dataset: str = "fashion_mnist",
        root: str = "data",
        num_clients: int = 10,
        examples_per_client: int | None = None,
        labeled_per_class: int | None = 50,
        labeled_fraction: float | None = None,
        val_per_class: int = 0,
        partitioner: Partitioner | None = None,
        batch_size: int = 64,
        client_batch_size: int = 64,
        eval_batch_size: int = 1000,
        test_subset: int | None = None,
        download: bool = True,
        stream_steps: int | None = None,
        labels_at: str = "server",
        server_unlabeled_fraction: float = 0.0,
        client_pool: str | None = None,
    ) -> None:
        super().__init__()
        self.spec: DatasetSpec = dataset_spec(dataset)
        _positive("data.num_clients", num_clients)
        _positive("data.examples_per_client", examples_per_client)
        _positive("data.batch_size", batch_size)
        _positive("data.client_batch_size", client_batch_size)
        _positive("data.eval_batch_size", eval_batch_size)
        _positive("data.test_subset", test_subset)
        if (labeled_per_class is None) == (labeled_fraction is None):
            raise ValueError(
                "set exactly one of data.labeled_per_class and data.labeled_fraction "
                f"(got {labeled_per_class} and {labeled_fraction})"
            )
        _positive("data.labeled_per_class", labeled_per_class)
        if labeled_fraction is not None and not 0 < labeled_fraction < 1:
            raise ValueError(f"data.labeled_fraction must be in (0, 1), got {labeled_fraction}")
        if val_per_class < 0:
            raise ValueError(f"data.val_per_class must be >= 0, got {val_per_class}")
        _positive("data.stream_steps", stream_steps)
        if labels_at not in LABELS_AT:
            raise ValueError(f"data.labels_at must be one of {LABELS_AT}, got {labels_at!r}")
        if not 0 <= server_unlabeled_fraction < 1:  # False for NaN too
            raise ValueError(
                f"data.server_unlabeled_fraction must be in [0, 1), got {server_unlabeled_fraction}"
            )
        self.client_pool = self._check_client_pool(client_pool, partitioner)
        self.dataset = dataset
        self.root = Path(root)
        self.num_clients = num_clients
        self.examples_per_client = examples_per_client
        self.labeled_per_class = labeled_per_class
        self.labeled_fraction = labeled_fraction
        self.val_per_class = val_per_class
        self.partitioner = partitioner if partitioner is not None else IID()
        self.batch_size = batch_size
        self.client_batch_size = client_batch_size
        self.eval_batch_size = eval_batch_size
        self.test_subset = test_subset
        self.download = download
        self.stream_steps = stream_steps
        self.labels_at = labels_at
        self.server_unlabeled_fraction = server_unlabeled_fraction
        self.seed: int | None = None
        self.client_labeled: list[ImageSplit] = []
        self._chunks: list[list[tuple[int, int]]] = []

    # --- static facts (known before any data is loaded) ---------------------------------
    @property
    def num_classes(self) -> int:
        return self.spec.num_classes

    @property
    def class_names(self) -> tuple[str, ...] | None:
        """The names of the columns of :attr:`class_counts`: the data set's classes (None
        where it has no names, or for an unlabeled pool's single column)."""
        counts = getattr(self, "class_counts", None)
        if counts is not None and counts.shape[1] != self.num_classes:
            return None
        return self.spec.classes

    @property
    def in_channels(self) -> int:
        return self.spec.channels

    def _check_client_pool(self, client_pool: str | None, partitioner: Partitioner | None) -> str:
        """``client_pool`` resolved (None: the data set's unlabeled split if it has one);
        ValueError naming the key if the data set or the partitioner cannot serve it."""
        if client_pool is not None and client_pool not in CLIENT_POOLS:
            raise ValueError(
                f"data.client_pool must be one of {CLIENT_POOLS} or null, got {client_pool!r}"
            )
        split = self.spec.unlabeled_split
        if client_pool == "unlabeled" and split is None:
            having = sorted(s.name for s in SPECS.values() if s.unlabeled_split is not None)
            raise ValueError(
                f"data.client_pool='unlabeled': data.dataset={self.spec.name!r} has no "
                f"unlabeled split (data sets with one: {having})"
            )
        pool = client_pool or ("train" if split is None else "unlabeled")
        if pool == "unlabeled" and partitioner is not None and type(partitioner) is not IID:
            raise ValueError(
                f"data.partitioner={partitioner!r} divides the client pool by its labels, but "
                f"data.client_pool='unlabeled' draws it from {self.spec.name}'s {split!r} split, "
                "which has none: use fedlit.data.partition.IID (a random split there) or "
                "data.client_pool='train'"
            )
        return pool

    def _load_unlabeled_pool(self) -> ImageSplit:
        """The data set's unlabeled split, whose labels raise naming ``data.client_pool``."""
        pool = load_unlabeled_split(self.dataset, self.root, download=self.download)
        why = (
            f"data.client_pool='unlabeled': the clients' images come from {self.dataset}'s "
            f"{self.spec.unlabeled_split!r} split, which has no labels, so there are none for "
            "the FedAvg-SL oracle or label-based diagnostics (hidden_labels); set "
            "data.client_pool='train' to draw the clients' images from the labeled training split"
        )
        return ImageSplit(pool.images, None, why)

    # --- loading and splitting ------------------------------------------------------------
    def prepare_data(self) -> None:
        load_split(self.dataset, self.root, train=True, download=self.download)
        load_split(self.dataset, self.root, train=False, download=self.download)
        if self.client_pool == "unlabeled":
            load_unlabeled_split(self.dataset, self.root, download=self.download)

    def setup_test(self) -> None:
        """Load only the test split (for evaluating a saved model)."""
        self.test = self._load_test()

    def _load_test(self) -> ImageSplit:
        test = load_split(self.dataset, self.root, train=False, download=self.download)
        if self.test_subset is None or self.test_subset >= len(test):
            return test
        rng = np.random.default_rng(TEST_SUBSET_SEED)  # the same subset for every run
        labels = test.labels.numpy()
        per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in range(self.num_classes)]
        quota = np.full(self.num_classes, self.test_subset // self.num_classes)
        quota[: self.test_subset % self.num_classes] += 1
        idx = np.sort(np.concatenate([p[:q] for p, q in zip(per_class, quota, strict=True)]))
        return ImageSplit(test.images[idx], test.labels[idx])

    def setup_federation(self, seed: int) -> None:
        """Load the data and draw the server split and the client partition from ``seed``.

        Raises ValueError, naming the key, when the split or partition cannot be made.
        """
        train = load_split(self.dataset, self.root, train=True, download=self.download)
        self.test = self._load_test()
        labels = train.labels.numpy()
        rng = np.random.default_rng([seed, SPLIT_TAG])
        labeled_idx, val_idx, unlabeled_idx, pool_idx = self._split_server(labels, rng)
        self.val = ImageSplit(train.images[val_idx], train.labels[val_idx])
        self.server_unlabeled = ImageSplit(train.images[unlabeled_idx], train.labels[unlabeled_idx])
        pool, pool_labels, pool_classes = train, labels[pool_idx], self.num_classes
        where = "left after the server's split"
        if self.client_pool == "unlabeled":  # no labels: IID over one class, a random split
            pool = self._load_unlabeled_pool()
            pool_idx = np.arange(len(pool))
            pool_labels, pool_classes = np.zeros(len(pool), dtype=np.int64), 1
            where = f"of {self.dataset}'s {self.spec.unlabeled_split!r} split (data.client_pool)"
        if self.examples_per_client is not None:
            need = self.num_clients * self.examples_per_client
            if need > len(pool_idx):
                raise ValueError(
                    f"data.examples_per_client={self.examples_per_client} x data.num_clients="
                    f"{self.num_clients} = {need} exceeds the {len(pool_idx)} unlabeled examples "
                    f"{where}"
                )
        parts = self.partitioner(
            pool_labels, self.num_clients, pool_classes, rng, self.examples_per_client
        )
        self.clients = [pool.take(pool_idx[p]) for p in parts]
        empty = [k for k, c in enumerate(self.clients) if len(c) == 0]
        if empty:
            raise ValueError(f"data.partitioner left clients {empty} without data")
        self._chunks = self._stream_chunks()
        # Dealt after the partition, so the client pool does not depend on labels_at.
        if self.labels_at == "client":
            self.client_labeled = [
                ImageSplit(train.images[i], train.labels[i])
                for i in self._deal_labeled(labeled_idx, labels, rng)
            ]
            self.server = ImageSplit(train.images[:0], train.labels[:0])
        else:
            self.client_labeled = []
            self.server = ImageSplit(train.images[labeled_idx], train.labels[labeled_idx])
        # an unlabeled pool: one column, the shard sizes (the classes are unknown), and no R
        self.class_counts = class_counts(pool_labels, parts, pool_classes)
        self.non_iid_R = (
            non_iid_metric(pool_labels, parts, pool_classes) if pool.has_labels else float("nan")
        )
        self.seed = seed

    def _stream_chunks(self) -> list[list[tuple[int, int]]]:
        """Per client, the [start, stop) ranges of its shard that the visits of one stream
        cycle see: ``np.array_split`` of the shard's order into ``stream_steps`` chunks."""
        steps = self.stream_steps if self.stream_steps is not None else 1
        short = [k for k, c in enumerate(self.clients) if len(c) < steps]
        if short:
            raise ValueError(
                f"data.stream_steps={self.stream_steps} exceeds the shard size of clients "
                f"{short} (smallest: {min(len(self.clients[k]) for k in short)} examples)"
            )
        return [
            [(int(p[0]), int(p[-1]) + 1) for p in np.array_split(np.arange(len(c)), steps)]
            for c in self.clients
        ]

    def _deal_labeled(
        self, labeled_idx: np.ndarray, labels: np.ndarray, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Split the labeled indices among the clients, each class near-evenly (client k gets
        part k of a random split of every class): labels-at-client."""
        per_client: list[list[np.ndarray]] = [[] for _ in range(self.num_clients)]
        for c in range(self.num_classes):
            idx = rng.permutation(labeled_idx[labels[labeled_idx] == c])
            for k, part in enumerate(np.array_split(idx, self.num_clients)):
                per_client[k].append(part)
        dealt = [np.sort(np.concatenate(parts)) for parts in per_client]
        empty = [k for k, i in enumerate(dealt) if len(i) == 0]
        if empty:
            key = (
                f"data.labeled_per_class={self.labeled_per_class}"
                if self.labeled_per_class is not None
                else f"data.labeled_fraction={self.labeled_fraction}"
            )
            raise ValueError(
                f"{key} is too few labeled examples to give every one of data.num_clients="
                f"{self.num_clients} clients one with data.labels_at='client' "
                f"(clients {empty} get none)"
            )
        return dealt

    def _split_server(
        self, labels: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per class, in a random order: labeled, validation, server-unlabeled, client pool."""
        labeled, val, unlabeled, pool = [], [], [], []
        for c in range(self.num_classes):
            idx = rng.permutation(np.flatnonzero(labels == c))
            if self.labeled_per_class is not None:
                n_lab = self.labeled_per_class
                key = f"data.labeled_per_class={self.labeled_per_class}"
            else:
                n_lab = max(1, int(self.labeled_fraction * len(idx)))  # type: ignore[operator]
                key = f"data.labeled_fraction={self.labeled_fraction}"
            n_unl = int(self.server_unlabeled_fraction * len(idx))
            if n_lab + self.val_per_class + n_unl > len(idx):
                raise ValueError(
                    f"{key} (+ data.val_per_class={self.val_per_class}, + data.server_unlabeled_"
                    f"fraction={self.server_unlabeled_fraction}) asks for more examples than "
                    f"class {c} of {self.dataset} has ({len(idx)})"
                )
            cuts = np.cumsum([n_lab, self.val_per_class, n_unl])
            labeled.append(idx[: cuts[0]])
            val.append(idx[cuts[0] : cuts[1]])
            unlabeled.append(idx[cuts[1] : cuts[2]])
            pool.append(idx[cuts[2] :])
        parts = (labeled, val, unlabeled, pool)
        return tuple(np.sort(np.concatenate(part)) for part in parts)  # type: ignore[return-value]

    # --- loaders --------------------------------------------------------------------------
    # Every loader is an :class:`ImageBatches`: index draws from the split's uint8 tensor, the
    # views computed a whole batch at a time (on the training device inside a Trainer).
    def _batches(
        self,
        split: ImageSplit,
        views: Sequence[str],
        batch_size: int,
        shuffle: bool,
        labels: bool = False,
        with_index: bool = False,
    ) -> ImageBatches:
        return ImageBatches(
            split.images,
            self.spec,
            views,
            batch_size,
            shuffle,
            labels=split.labels if labels else None,
            with_index=with_index,
        )

    def server_dataloader(self, views: Sequence[str] = ("weak",)) -> ImageBatches:
        """The server's labeled set: batches (x_1, ..., x_n, y), one x (B, C, H, W) per view.

        Raises ValueError when the labels are at the clients (``labels_at="client"``).
        """
        if self.labels_at != "server":
            raise ValueError(
                f"data.labels_at={self.labels_at!r}: the server holds no labeled set "
                "(use client_labeled_dataloader)"
            )
        return self._batches(self.server, views, self.batch_size, shuffle=True, labels=True)

    def server_unlabeled_dataloader(self, views: Sequence[str] = ("weak",)) -> ImageBatches:
        """The server's unlabeled images (``server_unlabeled_fraction``): shuffled batches
        ``(x_1, ..., x_n)`` of ``client_batch_size``, the unlabeled batch size, no labels."""
        split = self.server_unlabeled
        return self._batches(split, views, self.client_batch_size, shuffle=True)

    def server_plain_dataloader(self) -> ImageBatches:
        """The server's labeled images, un-augmented, in order, without labels: batches
        ``(x,)`` of ``eval_batch_size`` (for re-estimating BatchNorm statistics)."""
        return self._batches(self.server, ("plain",), self.eval_batch_size, shuffle=False)

    def client_labeled_dataloader(
        self, client_id: int, views: Sequence[str] = ("weak",)
    ) -> ImageBatches:
        """Client ``client_id``'s own labeled examples (labels-at-client): shuffled batches
        (x_1, ..., x_n, y) of ``batch_size``, one x (B, C, H, W) per view.

        Raises ValueError when the labels are at the server (``labels_at="server"``).
        """
        if self.labels_at != "client":
            raise ValueError(
                f"data.labels_at={self.labels_at!r}: clients hold no labeled examples "
                "(use server_dataloader)"
            )
        self._check_client(client_id)
        split = self.client_labeled[client_id]
        return self._batches(split, views, self.batch_size, shuffle=True, labels=True)

    def _check_client(self, client_id: int) -> None:
        if not 0 <= client_id < self.num_clients:
            raise ValueError(
                f"client_id must be in [0, data.num_clients={self.num_clients}), got {client_id}"
            )

    def client_shard(self, client_id: int, visit: int = 1) -> ImageSplit:
        """The part of client ``client_id``'s shard it sees on its ``visit``-th selection.

        The whole shard unless streaming; with ``stream_steps=S``, chunk (visit - 1) mod S.
        Its labels are for diagnostics and the oracle only: client loaders never yield them.
        """
        self._check_client(client_id)
        if isinstance(visit, bool) or not isinstance(visit, (int, np.integer)) or visit < 1:
            raise ValueError(f"visit must be an integer >= 1, got {visit!r}")
        shard = self.clients[client_id]
        if self.stream_steps is None:
            return shard
        lo, hi = self._chunks[client_id][(visit - 1) % self.stream_steps]
        return shard.take(slice(lo, hi))

    def client_dataloader(
        self, client_id: int, views: Sequence[str], visit: int = 1, with_index: bool = False
    ) -> ImageBatches:
        """Client ``client_id``'s visible unlabeled shard (see :meth:`client_shard`): shuffled
        batches of one image tensor per view, ``(x_1, ..., x_n)``.

        With ``with_index`` batches are ``(index, x_1, ..., x_n)``, index (B,) int64 being each
        example's position in the visible shard.
        """
        shard = self.client_shard(client_id, visit)
        return self._batches(
            shard, views, self.client_batch_size, shuffle=True, with_index=with_index
        )

    def client_oracle_dataloader(
        self, client_id: int, view: str = "weak", visit: int = 1
    ) -> ImageBatches:
        """Client shard WITH its true labels: only for the FedAvg-SL oracle (upper bound)."""
        shard = self.client_shard(client_id, visit)
        return self._batches(shard, (view,), self.client_batch_size, shuffle=True, labels=True)

    def client_plain_dataloader(self, client_id: int, visit: int = 1) -> ImageBatches:
        """Client ``client_id``'s visible shard, un-augmented and normalised, in shard order:
        unshuffled batches ``(x,)`` of ``eval_batch_size`` images, no labels."""
        shard = self.client_shard(client_id, visit)
        return self._batches(shard, ("plain",), self.eval_batch_size, shuffle=False)

    def client_data(self, client_id: int, visit: int = 1) -> ClientData:
        """What client ``client_id`` holds on its ``visit``-th selection, and nothing else: its
        visible shard, its own labeled examples (labels at the clients), the loaders' sizes.
        A method's client hooks get this, never the data module."""
        shard = self.client_shard(client_id, visit)
        return ClientData(
            client_id=client_id,
            visit=visit,
            shard=shard,
            labeled=self.client_labeled[client_id] if self.labels_at == "client" else None,
            spec=self.spec,
            batch_size=self.batch_size,
            client_batch_size=self.client_batch_size,
            eval_batch_size=self.eval_batch_size,
        )

    def client_size(self, client_id: int, visit: int = 1) -> int:
        """The number of examples client ``client_id`` sees on its ``visit``-th selection."""
        return len(self.client_shard(client_id, visit))

    def val_dataloader(self) -> ImageBatches:
        """The server's validation set: un-augmented batches (x, y) in order."""
        return self._batches(self.val, ("plain",), self.eval_batch_size, False, labels=True)

    def test_dataloader(self) -> ImageBatches:
        """The test set: un-augmented batches (x, y) in order."""
        return self._batches(self.test, ("plain",), self.eval_batch_size, False, labels=True)

    def partition_summary(self) -> dict[str, float]:
        """Numbers that describe the partition, for logging once per run."""
        sizes = self.class_counts.sum(axis=1)
        return {
            "partition/R": float(self.non_iid_R),
            "partition/min_client_size": float(sizes.min()),
            "partition/max_client_size": float(sizes.max()),
            "data/server_labeled": float(len(self.server)),
            "data/server_val": float(len(self.val)),
            "data/server_unlabeled": float(len(self.server_unlabeled)),
            "data/client_labeled": float(sum(len(c) for c in self.client_labeled)),
            "data/stream_steps": float(self.stream_steps or 0),
        }
