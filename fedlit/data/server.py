"""The server's data: its labeled, validation and unlabeled sets, the test set, their loaders.

:class:`ServerData` holds the sets the draw made (:mod:`fedlit.data.draw`: the server's sets
split by class, the test set) and serves their loaders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fedlit.data.datasets import DatasetSpec, ImageSplit
from fedlit.data.loaders import ImageBatches


@dataclass(frozen=True)
class ServerData:
    """What the server holds, and the loaders over it.

    Every loader is an :class:`ImageBatches`: index draws from the split's uint8 tensor, the
    views computed a whole batch at a time (on the training device inside fedlit's fit loop).

    Attributes:
        labeled: the labeled set (empty when the labels are at the clients).
        val: the validation set (``data.val_per_class``; may be empty).
        unlabeled: the server's unlabeled images (``data.server_unlabeled_fraction``).
        test: the test set (or its ``data.test_subset``).
        spec: the data set's sizes and statistics, for the views.
        labels_at: ``"server"`` or ``"client"``: where the labeled set is.
        batch_size: the labeled batch size; ``client_batch_size`` the unlabeled one.
        eval_batch_size: the batch size of un-augmented passes.
    """

    labeled: ImageSplit
    val: ImageSplit
    unlabeled: ImageSplit
    test: ImageSplit
    spec: DatasetSpec
    labels_at: str
    batch_size: int
    client_batch_size: int
    eval_batch_size: int

    def _batches(
        self, split: ImageSplit, views: Sequence[str], batch_size: int, shuffle: bool, labels: bool
    ) -> ImageBatches:
        labeled = split.labels if labels else None
        return ImageBatches(split.images, self.spec, views, batch_size, shuffle, labels=labeled)

    def labeled_dataloader(self, views: Sequence[str] = ("weak",)) -> ImageBatches:
        """The labeled set: shuffled batches (x_1, ..., x_n, y), one x (B, C, H, W) per view.

        Raises ValueError when the labels are at the clients (``labels_at="client"``).
        """
        if self.labels_at != "server":
            raise ValueError(
                f"data.labels_at={self.labels_at!r}: the server holds no labeled set "
                "(the clients hold it: ClientData.labeled_dataloader)"
            )
        return self._batches(self.labeled, views, self.batch_size, True, labels=True)

    def unlabeled_dataloader(self, views: Sequence[str] = ("weak",)) -> ImageBatches:
        """The unlabeled images: shuffled batches ``(x_1, ..., x_n)`` of ``client_batch_size``,
        the unlabeled batch size, no labels."""
        return self._batches(self.unlabeled, views, self.client_batch_size, True, labels=False)

    def plain_dataloader(self) -> ImageBatches:
        """The labeled images, un-augmented, in order, without labels: batches ``(x,)`` of
        ``eval_batch_size`` (for re-estimating BatchNorm statistics)."""
        return self._batches(self.labeled, ("plain",), self.eval_batch_size, False, labels=False)

    def val_dataloader(self) -> ImageBatches:
        """The validation set: un-augmented batches (x, y) in order."""
        return self._batches(self.val, ("plain",), self.eval_batch_size, False, labels=True)

    def test_dataloader(self) -> ImageBatches:
        """The test set: un-augmented batches (x, y) in order."""
        return self._batches(self.test, ("plain",), self.eval_batch_size, False, labels=True)
