"""The client pool: every client's shard (and labeled examples), and what a client sees.

A data set's source gives the images the shards are taken from (:class:`PoolImages`), which
the partitioner (:mod:`fedlit.data.partition`) divides among the clients; labels-at-client, the
draw (:mod:`fedlit.data.draw`) deals the labeled set out (:func:`deal_labeled`).
:class:`ClientPool` holds the result and gives each client its
:class:`~fedlit.data.client.ClientData` for one visit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedlit.data.client import ClientData
from fedlit.data.datasets import DatasetSpec, ImageSplit
from fedlit.data.partition import Partitioner, class_counts, non_iid_metric


@dataclass(frozen=True)
class PoolImages:
    """The images the clients' shards are taken from: ``split``'s examples at ``index``.

    The partitioner divides them by ``labels`` (one per entry of ``index``; zeros where the
    images have none) into ``num_classes`` columns, unless ``shards`` has divided them already
    (each client's positions in ``index``); ``where`` names them in a message about their size.
    """

    split: ImageSplit
    index: np.ndarray
    labels: np.ndarray
    num_classes: int
    where: str = ""
    shards: list[np.ndarray] | None = None

    def divide(
        self,
        partitioner: Partitioner,
        num_clients: int,
        examples_per_client: int | None,
        rng: np.random.Generator,
    ) -> list[np.ndarray]:
        """Each client's positions in :attr:`index`: :attr:`shards`, or the partitioner's
        division; ValueError naming the keys when ``examples_per_client`` asks for more than
        the pool holds."""
        if self.shards is not None:
            return self.shards
        check_pool_size(len(self.index), num_clients, examples_per_client, self.where)
        return partitioner(self.labels, num_clients, self.num_classes, rng, examples_per_client)


def check_pool_size(
    size: int, num_clients: int, examples_per_client: int | None, where: str
) -> None:
    """ValueError naming the keys when ``examples_per_client`` for each of ``num_clients``
    asks for more than a pool of ``size`` examples (``where``: which pool) holds."""
    if examples_per_client is not None and num_clients * examples_per_client > size:
        raise ValueError(
            f"data.examples_per_client={examples_per_client} x data.num_clients="
            f"{num_clients} = {num_clients * examples_per_client} exceeds the {size} "
            f"unlabeled examples {where}; set data.examples_per_client=null to divide them "
            f"all (about {size // num_clients} a client)"
        )


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
