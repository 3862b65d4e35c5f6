"""What one client holds in one round, and nothing else: its own shard's loaders.

A method's client side (:class:`~fedlit.methods.client_side.ClientSide`: ``loader``,
``objective``, ``receive``) receives a :class:`ClientData` built from that client's own
tensors, not the data module: no other client's images, the server's labeled set or the test
set are reachable from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from fedlit.data.datasets import DatasetSpec, ImageSplit
from fedlit.data.loaders import ImageBatches


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
