"""The federated data module: the recipe's ``data`` settings, the server's data and the client pool.

:class:`FederatedDataModule` checks the settings, reads the data set's source
(:mod:`fedlit.data.sources`) and draws from it, with the run's seed (:mod:`fedlit.data.draw`),
the server's sets (:class:`~fedlit.data.server.ServerData`) and the clients' shards
(:class:`~fedlit.data.pool.ClientPool`), then serves the loaders of both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from torch.utils.data import Dataset

from fedlit.data.datasets import DatasetSpec, ImageSplit
from fedlit.data.draw import DataSettings, check_sizes, draw
from fedlit.data.loaders import ImageBatches
from fedlit.data.own.read import ReadImages
from fedlit.data.partition import IID, Partitioner
from fedlit.data.pool import ClientData, ClientPool
from fedlit.data.server import ServerData
from fedlit.data.sources import Source, make_source


class FederatedDataModule(L.LightningDataModule):
    """A labeled set (and validation set) plus unlabeled client shards of one data set.

    It holds the settings (its arguments are the recipe's ``data`` group), the data set's
    :class:`~fedlit.data.sources.Source` (``dataset``, ``path``, ``image_size``,
    ``test_dataset``: a built-in data set or one of the user's own, read when the data module
    is made so that its classes and channels are known) and, once :meth:`setup_federation` has
    drawn them, the server's data (:attr:`server_data`) and the client pool (:attr:`pool`),
    whose loaders it serves. The training split is divided, by seed, into a class-balanced
    labeled set (``labeled_per_class`` per class, or ``labeled_fraction`` of each class), an
    optional class-balanced validation set (``val_per_class``, always at the server), and the
    rest; the source's client pool (by default that rest) is divided by ``partitioner`` among
    ``num_clients`` clients (``examples_per_client`` each, or the whole pool). Client loaders
    yield images only; the pool's labels are kept aside for diagnostics and for the FedAvg-SL
    oracle, which is marked as such.

    Args:
        dataset: a name from :data:`fedlit.data.datasets.SPECS`, one of
            :data:`~fedlit.data.sources.FILES` (read from ``path``), or a torch
            Dataset of the training split (``class_path``/``init_args`` in a recipe).
        root: where data sets are stored (and downloaded to), and the user's images cached
            decoded (``<root>/fedlit-cache``, :mod:`fedlit.data.own.cache`).
        num_clients: K, the number of clients (None: the data set's own, the number of client
            folders for ``client_folders``; 10 for the others).
        examples_per_client: unlabeled examples per client; None divides the whole pool.
            ``client_folders`` decides both: each client holds its whole folder, and values
            given otherwise (a recipe written for a built-in data set) are not used, which
            the run says in a line at its start.
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
        stream_steps: S, the number of chunks each client's shard is streamed in, one a visit
            (:class:`~fedlit.data.pool.ClientPool`; None: every visit sees the whole shard).
        labels_at: ``"server"`` (the labeled set stays at the server) or ``"client"``
            (labels-at-client: the labeled set is dealt out to the clients, class by class;
            :attr:`server` is then empty and ``pool.labeled[k]`` is client k's).
        server_unlabeled_fraction: the fraction of each class the server also holds without
            labels, in [0, 1) (0: none; paper 001 section IV-E's beta): set aside after the
            validation set, before the client pool, as :attr:`server_unlabeled`, read only
            by a method that asks for them (FedCon) through
            :meth:`server_unlabeled_dataloader`.
        client_pool: where the clients' images come from: ``"train"`` (the training split,
            after the server's sets) or ``"unlabeled"`` (the data set's unlabeled split, see
            :attr:`DatasetSpec.unlabeled_split`); None: ``"unlabeled"`` if the data set has
            one (STL-10), else ``"train"``; ``"folders"``: each client's own folder
            (``client_folders``, its only choice).
        path: the folder (``folder``, ``client_folders``) or the array file (``arrays``) of
            a data set of the user's files.
        image_size: S, the side the user's images are resized and centre-cropped to (None:
            they must all be one square size already).
        test_dataset: the test split, a torch Dataset, when ``dataset`` is one.
        hflip: whether horizontal flips keep the label, so that the weak view flips (None:
            the data set's own choice; True for the user's data sets).
    """

    def __init__(
        self,
        dataset: str | Dataset = "fashion_mnist",
        root: str = "data",
        num_clients: int | None = None,
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
        path: str | None = None,
        image_size: int | None = None,
        test_dataset: Dataset | None = None,
        hflip: bool | None = None,
    ) -> None:
        super().__init__()
        source = make_source(dataset, path, image_size, test_dataset, Path(root))
        clients = source.clients(num_clients, examples_per_client)
        #: Lines the run says at its start about settings the data set decides.
        self.notes: tuple[str, ...] = () if clients.note is None else (clients.note,)
        #: The settings, built once and checked (a key out of its range, or one the data set
        #: cannot serve, is refused here); the data module's attributes of the same names
        #: read them.
        self.settings = DataSettings(
            source=source,
            asked_pool=client_pool,
            root=Path(root),
            download=download,
            test_subset=test_subset,
            path=path,
            image_size=image_size,
            hflip=hflip,
            num_clients=clients.count,
            examples_per_client=clients.examples_per_client,
            labeled_per_class=labeled_per_class,
            labeled_fraction=labeled_fraction,
            val_per_class=val_per_class,
            partitioner=partitioner if partitioner is not None else IID(),
            stream_steps=stream_steps,
            labels_at=labels_at,
            server_unlabeled_fraction=server_unlabeled_fraction,
            batch_size=batch_size,
            client_batch_size=client_batch_size,
            eval_batch_size=eval_batch_size,
        )
        listed = source.listed_labels()
        if listed is not None:  # the sizes the labels decide, before any image is read
            check_sizes(self.settings, source.name, *listed)
        self.spec: DatasetSpec = self.source.spec  # the user's files are read now
        if self.source.users_own and self.user_data.colour_note is not None:
            self.notes += (self.user_data.colour_note,)
        if hflip is not None:
            self.spec = replace(self.spec, hflip=hflip)
        self.dataset = self.spec.name
        self.seed: int | None = None
        self._server_data: ServerData | None = None
        self._pool: ClientPool | None = None

    def __getattr__(self, name: str) -> Any:
        """A setting (:class:`~fedlit.data.draw.DataSettings`) by its name: the recipe's
        ``data`` key, ``data.num_clients`` say; called only for names the module lacks."""
        settings = self.__dict__.get("settings")  # none yet while unpickling
        if name.startswith("_") or not hasattr(settings, name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(settings, name)

    # --- static facts (known before any data is loaded) ---------------------------------
    @property
    def is_users_own(self) -> bool:
        """Whether the data set is the user's own (a folder, client folders, arrays, a
        Dataset), not one of the registry's."""
        return self.source.users_own

    @property
    def num_classes(self) -> int:
        return self.spec.num_classes

    @property
    def class_names(self) -> tuple[str, ...] | None:
        """The names of the columns of :attr:`class_counts`: the data set's classes (None
        where it has no names, or for an unlabeled pool's single column)."""
        if self._pool is not None and self._pool.class_counts.shape[1] != self.num_classes:
            return None
        return self.spec.classes

    @property
    def in_channels(self) -> int:
        return self.spec.channels

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the images the networks take (the model's ``image_size`` is H)."""
        return (self.spec.channels, self.spec.size, self.spec.size)

    @property
    def user_data(self) -> ReadImages:
        """The user's data set, as read (RuntimeError for a built-in data set)."""
        return self.source.user_data

    @property
    def clients_without_labels(self) -> tuple[str, str] | None:
        """Where the clients' images have no labels: (the setting that makes it so, why and
        what to do instead); None where they have labels."""
        return self.source.clients_without_labels(self.client_pool)

    def save_statistics(self) -> None:
        """Cache a user's data set's statistics beside its files (where it has such a
        cache); the driver calls it once a run's checks have passed."""
        self.source.save_statistics()

    # --- loading and splitting ------------------------------------------------------------
    def prepare_data(self) -> None:
        self.source.prepare(self.root, self.download, self.client_pool)

    def setup_federation(self, seed: int) -> None:
        """Load the data and draw the server's sets and the client pool from ``seed``
        (:func:`~fedlit.data.draw.draw`); ValueError, naming the key, when they cannot be
        drawn."""
        self._server_data, self._pool = draw(self.settings, self.spec, seed)
        self.seed = seed

    # --- the two halves, once drawn --------------------------------------------------------
    @property
    def server_data(self) -> ServerData:
        """The server's labeled, validation, unlabeled and test sets and their loaders."""
        if self._server_data is None:
            raise RuntimeError("the server's data is drawn by setup_federation(seed) first")
        return self._server_data

    @property
    def pool(self) -> ClientPool:
        """The clients' shards (and labeled examples) and what each client sees."""
        if self._pool is None:
            raise RuntimeError("the client pool is drawn by setup_federation(seed) first")
        return self._pool

    @property
    def server(self) -> ImageSplit:
        """The server's labeled set (empty when the labels are at the clients)."""
        return self.server_data.labeled

    @property
    def val(self) -> ImageSplit:
        return self.server_data.val

    @property
    def server_unlabeled(self) -> ImageSplit:
        return self.server_data.unlabeled

    @property
    def test(self) -> ImageSplit:
        return self.server_data.test

    @property
    def clients(self) -> list[ImageSplit]:
        """Every client's whole unlabeled shard."""
        return self.pool.shards

    @property
    def class_counts(self) -> np.ndarray:
        return self.pool.class_counts

    @property
    def non_iid_R(self) -> float:
        return self.pool.non_iid_R

    # --- loaders (see ServerData and ClientPool) ---------------------------------------------
    def server_dataloader(self, views: Sequence[str] = ("weak",)) -> ImageBatches:
        """:meth:`ServerData.labeled_dataloader`."""
        return self.server_data.labeled_dataloader(views)

    def server_unlabeled_dataloader(self, views: Sequence[str] = ("weak",)) -> ImageBatches:
        """:meth:`ServerData.unlabeled_dataloader`."""
        return self.server_data.unlabeled_dataloader(views)

    def server_plain_dataloader(self) -> ImageBatches:
        """:meth:`ServerData.plain_dataloader`."""
        return self.server_data.plain_dataloader()

    def val_dataloader(self) -> ImageBatches:
        """The server's validation set: un-augmented batches (x, y) in order."""
        return self.server_data.val_dataloader()

    def test_dataloader(self) -> ImageBatches:
        """The test set: un-augmented batches (x, y) in order."""
        return self.server_data.test_dataloader()

    def client_shard(self, client_id: int, visit: int = 1) -> ImageSplit:
        """:meth:`ClientPool.client_shard`."""
        return self.pool.client_shard(client_id, visit)

    def client_data(self, client_id: int, visit: int = 1) -> ClientData:
        """:meth:`ClientPool.client_data`: what a method's client hooks get."""
        return self.pool.client_data(client_id, visit)

    def partition_title(self) -> str:
        """One line naming the data set and its partition (the partitioner with its
        parameters), with its R where the clients' images have labels to measure it with, and
        saying so where they have none."""
        unmeasured = self.source.unmeasured_title(self.client_pool)
        return unmeasured or f"{self.dataset}, {self.partitioner!r}: R = {self.non_iid_R:.3f}"

    def client_names(self) -> list[str]:
        """Each client's name: its folder's for clients as folders, else ``client <k>``."""
        return self.source.client_names(self.num_clients)

    def named_clients(self) -> list[str] | None:
        """The clients' own names (their folders'), to label a partition plot's rows with;
        None where the data set only numbers them (``client <k>``)."""
        names = self.client_names()
        return None if names == Source.client_names(self.source, self.num_clients) else names

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
            "data/client_labeled": float(sum(len(c) for c in self.pool.labeled)),
            "data/stream_steps": float(self.stream_steps or 0),
        }
