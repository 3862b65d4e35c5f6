"""The client pool: every client's shard (and labeled examples), and what a client sees.

A data set's source gives the images the shards are taken from
(:class:`~fedlit.data.pool_images.PoolImages`), which the partitioner
(:mod:`fedlit.data.partition`) divides among the clients; labels-at-client, the draw
(:mod:`fedlit.data.draw`) deals the labeled set out (:func:`deal_labeled`). :class:`ClientPool`
holds the result and gives each client its :class:`ClientData` for one visit.

What one client holds in one round, and nothing else, is its :class:`ClientData`: its own
shard's loaders. A method's client side (:class:`~fedlit.methods.client_side.ClientSide`:
``loader``, ``objective``, ``receive``) receives one built from that client's own tensors, not
the data module: no other client's images, the server's labeled set or the test set are
reachable from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from fedlit.data.datasets import DatasetSpec, ImageSplit
from fedlit.data.loaders import ImageBatches
from fedlit.data.partition import class_counts, non_iid_metric
from fedlit.data.pool_images import PoolImages


@dataclass(frozen=True)
class ClientData:
    """Client ``client_id``'s data on its ``visit``-th selection.

    Attributes:
        client_id, visit: who and which selection (streaming data shows a new chunk each).
        shard: the unlabeled images the client sees this visit, with the labels the simulation
            keeps aside: only the FedAvg-SL oracle trains on them, and diagnostics
            (``hidden_labels``) compare pseudo-labels with them after the fact.
        labeled: the client's own labeled examples (labels at the clients), else None.
        spec: the data set's sizes and statistics, for the views.
        batch_size: the batch size of labeled loaders; ``client_batch_size`` of unlabeled ones.
        eval_batch_size: the batch size of un-augmented passes.
    """

    client_id: int
    visit: int
    shard: ImageSplit
    labeled: ImageSplit | None
    spec: DatasetSpec
    batch_size: int
    client_batch_size: int
    eval_batch_size: int

    def __len__(self) -> int:
        """n_k: the examples the client sees this visit (its FedAvg weight)."""
        return len(self.shard)

    def dataloader(self, views: Sequence[str], with_index: bool = False) -> ImageBatches:
        """Shuffled batches of ``views`` of the unlabeled images, ``(index?, x_1, ..., x_n)``;
        no labels."""
        return ImageBatches(
            self.shard.images,
            self.spec,
            views,
            self.client_batch_size,
            shuffle=True,
            with_index=with_index,
        )

    def plain_dataloader(self) -> ImageBatches:
        """The unlabeled images un-augmented, in order: batches ``(x,)``."""
        return ImageBatches(self.shard.images, self.spec, ("plain",), self.eval_batch_size, False)

    def oracle_dataloader(self, view: str = "weak") -> ImageBatches:
        """The shard WITH its true labels, ``(x, y)``: only for the FedAvg-SL oracle."""
        return ImageBatches(
            self.shard.images,
            self.spec,
            (view,),
            self.client_batch_size,
            shuffle=True,
            labels=self.shard.labels,
        )

    def labeled_dataloader(self, views: Sequence[str] = ("weak",)) -> ImageBatches:
        """The client's own labeled examples (labels at the clients), ``(x_1, ..., x_n, y)``.

        Raises ValueError when the labels are at the server."""
        if self.labeled is None:
            raise ValueError("data.labels_at='server': clients hold no labeled examples")
        return ImageBatches(
            self.labeled.images,
            self.spec,
            views,
            self.batch_size,
            shuffle=True,
            labels=self.labeled.labels,
        )

    @property
    def hidden_labels(self) -> Tensor:
        """The shard's true labels, for diagnostics only (never a loss's input)."""
        return self.shard.labels


def stream_chunks(
    shards: list[ImageSplit], stream_steps: int | None
) -> list[list[tuple[int, int]]]:
    """Per client, the [start, stop) ranges of its shard that the visits of one stream cycle
    see: ``np.array_split`` of the shard's order into ``stream_steps`` chunks (one without
    streaming). Raises ValueError naming ``data.stream_steps`` when a shard is too small."""
    steps = stream_steps if stream_steps is not None else 1
    short = [k for k, c in enumerate(shards) if len(c) < steps]
    if short:
        raise ValueError(
            f"data.stream_steps={stream_steps} exceeds the shard size of clients "
            f"{short} (smallest: {min(len(shards[k]) for k in short)} examples)"
        )
    return [
        [(int(p[0]), int(p[-1]) + 1) for p in np.array_split(np.arange(len(c)), steps)]
        for c in shards
    ]


def deal_labeled(
    labeled_idx: np.ndarray,
    labels: np.ndarray,
    rng: np.random.Generator,
    num_classes: int,
    num_clients: int,
    labeled_key: str,
) -> list[np.ndarray]:
    """Split the labeled indices among the clients, each class near-evenly (client k gets
    part k of a random split of every class): labels-at-client. Raises ValueError naming
    ``labeled_key`` (the setting that sized the labeled set) if a client would get none."""
    per_client: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        idx = rng.permutation(labeled_idx[labels[labeled_idx] == c])
        for k, part in enumerate(np.array_split(idx, num_clients)):
            per_client[k].append(part)
    dealt = [np.sort(np.concatenate(parts)) for parts in per_client]
    empty = [k for k, i in enumerate(dealt) if len(i) == 0]
    if empty:
        raise ValueError(
            f"{labeled_key} is too few labeled examples to give every one of data.num_clients="
            f"{num_clients} clients one with data.labels_at='client' "
            f"(clients {empty} get none)"
        )
    return dealt


@dataclass
class ClientPool:
    """Every client's data: its unlabeled shard and, labels-at-client, its labeled examples.

    Streaming (``stream_steps=S``): each shard is cut, in shard order, into S near-equal
    consecutive chunks (``chunks``, from :func:`stream_chunks`); on its n-th selection a
    client sees only chunk (n - 1) mod S.

    Attributes:
        shards: client k's unlabeled images, with the labels the simulation keeps aside.
        labeled: client k's labeled examples (labels at the clients), else empty.
        chunks: per client, the [start, stop) range of each stream step in its shard.
        stream_steps: S, or None (every visit sees the whole shard).
        class_counts: (K, classes) examples per client and class (an unlabeled pool: one
            column, the shard sizes).
        non_iid_R: the partition's non-IID level R (NaN for an unlabeled pool).
        spec: the data set's sizes and statistics, for the views.
        batch_size, client_batch_size, eval_batch_size: the loaders' batch sizes (labeled,
            unlabeled, un-augmented).
    """

    shards: list[ImageSplit]
    labeled: list[ImageSplit]
    chunks: list[list[tuple[int, int]]]
    stream_steps: int | None
    class_counts: np.ndarray
    non_iid_R: float
    spec: DatasetSpec
    batch_size: int
    client_batch_size: int
    eval_batch_size: int

    @classmethod
    def draw(
        cls,
        images: PoolImages,
        parts: list[np.ndarray],
        stream_steps: int | None,
        spec: DatasetSpec,
        batch_size: int,
        client_batch_size: int,
        eval_batch_size: int,
    ) -> ClientPool:
        """The pool whose shard k is ``images`` at ``parts[k]``, without labeled examples;
        ValueError naming the key when a shard is empty or too small to stream."""
        shards = [images.split.take(images.index[p]) for p in parts]
        empty = [k for k, c in enumerate(shards) if len(c) == 0]
        if empty:
            raise ValueError(f"data.partitioner left clients {empty} without data")
        chunks = stream_chunks(shards, stream_steps)
        return cls(
            shards=shards,
            labeled=[],
            chunks=chunks,
            stream_steps=stream_steps,
            # an unlabeled pool: one column, the shard sizes (the classes are unknown), no R
            class_counts=class_counts(images.labels, parts, images.num_classes),
            non_iid_R=(
                non_iid_metric(images.labels, parts, images.num_classes)
                if images.split.has_labels
                else float("nan")
            ),
            spec=spec,
            batch_size=batch_size,
            client_batch_size=client_batch_size,
            eval_batch_size=eval_batch_size,
        )

    def __len__(self) -> int:
        """K, the number of clients."""
        return len(self.shards)

    def _check_client(self, client_id: int) -> None:
        if not 0 <= client_id < len(self.shards):
            raise ValueError(
                f"client_id must be in [0, data.num_clients={len(self.shards)}), got {client_id}"
            )

    def client_shard(self, client_id: int, visit: int = 1) -> ImageSplit:
        """The part of client ``client_id``'s shard it sees on its ``visit``-th selection.

        The whole shard unless streaming; with ``stream_steps=S``, chunk (visit - 1) mod S.
        Its labels are for diagnostics and the oracle only: client loaders never yield them.
        """
        self._check_client(client_id)
        if isinstance(visit, bool) or not isinstance(visit, (int, np.integer)) or visit < 1:
            raise ValueError(f"visit must be an integer >= 1, got {visit!r}")
        shard = self.shards[client_id]
        if self.stream_steps is None:
            return shard
        lo, hi = self.chunks[client_id][(visit - 1) % self.stream_steps]
        return shard.take(slice(lo, hi))

    def client_data(self, client_id: int, visit: int = 1) -> ClientData:
        """What client ``client_id`` holds on its ``visit``-th selection, and nothing else: its
        visible shard, its own labeled examples (labels at the clients), the loaders' sizes.
        A method's client hooks get this, never the data module."""
        shard = self.client_shard(client_id, visit)
        return ClientData(
            client_id=client_id,
            visit=visit,
            shard=shard,
            labeled=self.labeled[client_id] if self.labeled else None,
            spec=self.spec,
            batch_size=self.batch_size,
            client_batch_size=self.client_batch_size,
            eval_batch_size=self.eval_batch_size,
        )
