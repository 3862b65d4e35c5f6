"""The server's data: its labeled, validation and unlabeled sets, the test set, their loaders.

:func:`split_by_class` draws the server's sets out of the training split;
:class:`ServerData` holds them with the test set (:func:`load_test`) and serves their loaders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedlit.data.datasets import DatasetSpec, ImageSplit, load_split
from fedlit.data.loaders import ImageBatches

TEST_SUBSET_SEED = 0x7E57


def load_test(
    dataset: str | DatasetSpec,
    root: Path,
    download: bool,
    test_subset: int | None,
    num_classes: int,
) -> ImageSplit:
    """Data set ``dataset``'s (a name or a spec) test split, or ``test_subset`` of its images:
    a class-balanced draw, the same for every run (:data:`TEST_SUBSET_SEED`)."""
    test = load_split(dataset, root, train=False, download=download)
    if test_subset is None or test_subset >= len(test):
        return test
    rng = np.random.default_rng(TEST_SUBSET_SEED)  # the same subset for every run
    labels = test.labels.numpy()
    per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    quota = np.full(num_classes, test_subset // num_classes)
    quota[: test_subset % num_classes] += 1
    idx = np.sort(np.concatenate([p[:q] for p, q in zip(per_class, quota, strict=True)]))
    return ImageSplit(test.images[idx], test.labels[idx])


def split_by_class(
    labels: np.ndarray,
    rng: np.random.Generator,
    dataset: str,
    num_classes: int,
    *,
    labeled_per_class: int | None,
    labeled_fraction: float | None,
    val_per_class: int,
    server_unlabeled_fraction: float,
    class_names: Sequence[str] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The training split's indices, per class in a random order: labeled
    (``labeled_per_class``, or ``labeled_fraction`` of the class, or, both None, all that the
    validation and server-unlabeled images leave), validation, server-unlabeled
    (``server_unlabeled_fraction`` of the class), and the rest, the client pool; each sorted.

    Raises ValueError, naming the keys and the class (by its name in ``class_names``, a
    folder's for the user's data), when a class has too few examples.
    """
    labeled, val, unlabeled, pool = [], [], [], []
    for c in range(num_classes):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_unl = int(server_unlabeled_fraction * len(idx))
        if labeled_per_class is not None:
            n_lab = labeled_per_class
            key = f"data.labeled_per_class={labeled_per_class}"
        elif labeled_fraction is not None:
            n_lab = max(1, int(labeled_fraction * len(idx)))
            key = f"data.labeled_fraction={labeled_fraction}"
        else:  # all of it (clients as folders: the labeled folder)
            n_lab = max(1, len(idx) - val_per_class - n_unl)
            key = "data.labeled_per_class=None (the whole class)"
        if n_lab + val_per_class + n_unl > len(idx):
            raise ValueError(
                f"{key} (+ data.val_per_class={val_per_class}, + data.server_unlabeled_"
                f"fraction={server_unlabeled_fraction}) asks for more examples than "
                f"class {c}{f' ({class_names[c]!r})' if class_names else ''} of {dataset} "
                f"has ({len(idx)})"
            )
        cuts = np.cumsum([n_lab, val_per_class, n_unl])
        labeled.append(idx[: cuts[0]])
        val.append(idx[cuts[0] : cuts[1]])
        unlabeled.append(idx[cuts[1] : cuts[2]])
        pool.append(idx[cuts[2] :])
    parts = (labeled, val, unlabeled, pool)
    return tuple(np.sort(np.concatenate(part)) for part in parts)  # type: ignore[return-value]


@dataclass(frozen=True)
class ServerData:
    """What the server holds, and the loaders over it.

    Every loader is an :class:`ImageBatches`: index draws from the split's uint8 tensor, the
    views computed a whole batch at a time (on the training device inside a Trainer).

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
