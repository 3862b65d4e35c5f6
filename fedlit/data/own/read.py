"""A data set of the user's own, read: :class:`ReadImages`, the loader of its spec, and the
spec itself (:func:`user_spec`, its statistics measured or read from their cache)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from fedlit.data.datasets import DatasetSpec, Images
from fedlit.data.mapped import Pixels
from fedlit.data.own.statistics import Statistics, StatisticsCache, channel_statistics
from fedlit.data.own.stored import StoredSplit

#: The split of the clients' images (and, in a ``client_folders`` data set, the folder of the
#: clients' folders).
CLIENTS = "clients"


class ReadImages:
    """A user's data set, read: the :attr:`DatasetSpec.loader` of its spec, which hands back
    its ``train`` and ``test`` splits (and, clients as folders, :attr:`clients`).

    The images live in the process that read them: a pickled copy (what a pool or Ray worker
    receives with the data module, whose clients' shards are already drawn) holds none, so the
    data are not shipped twice; calling it there raises RuntimeError.

    A data set that can be read again (from the image cache: ``stored`` holds, by split,
    ``train``, ``test`` and :data:`CLIENTS`, where the cache stored
    it, :class:`~fedlit.data.own.stored.StoredSplit`) is handed over rather than kept:
    the first call for a split (the draw's) gets the images read and this object drops them,
    so that the clients' shards and the server's sets drawn from them are the only copy a run
    holds; a later call reads them again (the same pixels).
    """

    def __init__(
        self,
        splits: Mapping[str, Images],
        clients: Pixels | None = None,
        client_names: Sequence[str] = (),
        client_sizes: Sequence[int] = (),
        cache: StatisticsCache | None = None,
        statistics: Statistics | None = None,
        made_rgb: int = 0,
        stored: Mapping[str, StoredSplit] | None = None,
    ) -> None:
        self._splits: dict[str, Images] | None = dict(splits)
        self._labels = {name: labels for name, (_, labels) in splits.items()}
        self._clients = clients
        self._stored = dict(stored) if stored is not None else None
        self.client_names, self.client_sizes = tuple(client_names), tuple(client_sizes)
        self.cache, self.statistics = cache, statistics
        #: How many grey images were made RGB (the data set is RGB: other images are colour).
        self.made_rgb = made_rgb

    @property
    def colour_note(self) -> str | None:
        """The line a run says where grey images were made RGB, or None."""
        if not self.made_rgb:
            return None
        return (
            f"{self.made_rgb} of your data set's images are grey and the others in colour: "
            "the data set is RGB, so those were made RGB (their grey repeated to three channels)"
        )

    def __call__(self, root: Path, split: str, download: bool) -> Images:
        if self._splits is None:
            raise RuntimeError(
                "a copy of a user's data set holds no images: it was read in "
                "the process that made the data module"
            )
        if self._stored is None:
            return self._splits[split]
        labels = self._labels[split]
        held = self._splits.pop(split, None)  # handed over (see the class)
        return held if held is not None else (self._stored[split].read_again(), labels)

    def images(self, split: str) -> Pixels:
        """Split ``split``'s images, kept rather than handed over (the statistics read them
        before the draw does)."""
        if self._splits is not None and split in self._splits:
            return self._splits[split][0]
        return self(Path(), split, False)[0]

    @property
    def client_images(self) -> Pixels:
        """Every client's images, one client after the other (:attr:`client_sizes` each),
        in the order of their folders' names (kept: see :meth:`hand_over_clients`)."""
        if self._clients is not None:
            return self._clients
        if self._stored is not None and self.client_names:
            return self._stored[CLIENTS].read_again()
        raise RuntimeError("this data set has no clients' folders")

    def hand_over_clients(self) -> Pixels:
        """:attr:`client_images`, handed over where they can be read again (see the class):
        the clients' shards drawn from them are then their only copy."""
        images = self.client_images
        if self._stored is not None:
            self._clients = None
        return images

    @property
    def clients(self) -> list[Pixels]:
        """Each client's images (N_k, C, H, W), in the order of their folders' names."""
        bounds, images = np.cumsum([0, *self.client_sizes]), self.client_images
        return [images[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def save_statistics(self) -> None:
        """Write the statistics to the cache beside the data, where there is one."""
        if self.cache is not None and self.statistics is not None:
            self.cache.write(*self.statistics)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_splits"] = state["_clients"] = state["_stored"] = None
        state["_labels"] = {}
        return state


def user_spec(
    name: str,
    read: ReadImages,
    classes: Sequence[str] | None,
    channels: int,
    size: int,
    hflip: bool,
    num_classes: int | None = None,
) -> DatasetSpec:
    """The spec of a data set read, its statistics from the cache or from its training
    images (a folder of clients: the labeled and the clients' images)."""
    statistics = read.cache.read() if read.cache is not None else None
    if statistics is None or len(statistics[0]) != channels:
        train = read.images("train")
        clients = [read.client_images] if read.client_names else []
        statistics = channel_statistics(train, *clients)
    read.statistics = statistics
    mean, std = statistics
    return DatasetSpec(
        name=name,
        num_classes=num_classes if num_classes is not None else len(classes or ()),
        channels=channels,
        size=size,
        mean=mean,
        # a channel spread over less than one grey level is constant: divided by 1, so that
        # its views (RandAugment moves its pixels) stay within [-1, 1]
        std=tuple(s if s >= 1 / 255 else 1.0 for s in std),
        hflip=hflip,
        loader=read,
        classes=tuple(classes) if classes is not None else None,
    )


def check_labels(
    labels: dict[str, Tensor], num_classes: int, where: dict[str, str], named: bool
) -> None:
    """Refuse labels outside [0, ``num_classes``), naming ``where`` they are."""
    for split, y in labels.items():
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
            bad = int(y.min()) if int(y.min()) < 0 else int(y.max())
            basis = "the classes named" if named else "max(y_train) + 1"
            raise ValueError(
                f"{where[split]}: label {bad} is outside the class range [0, {num_classes}) "
                f"({basis})"
            )
