"""The images a data set's source gives for the clients' shards (:class:`PoolImages`), and
their division among the clients by the partitioner (:mod:`fedlit.data.partition`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedlit.data.datasets import ImageSplit
from fedlit.data.partition import Partitioner


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
