"""Where a federation's images come from: one :class:`Source` for each kind of data set.

``data.dataset`` (with ``data.path``, ``data.image_size`` and ``data.test_dataset``) names a
source (:func:`make_source`): a data set of :data:`~fedlit.data.datasets.SPECS`
(:class:`BuiltIn`), an image folder (:class:`Folder`), clients as folders
(:class:`ClientFolders`), an array file (:class:`Arrays`) or two torch Datasets
(:class:`TorchDatasets`); the user's files are read by :mod:`fedlit.data.own`. A source
knows its data set's spec (classes, channels, size, class names, statistics, and the loader of
its train and test splits), whether it is the user's own, which settings it refuses, and which
client pools (``data.client_pool``) it offers and the images each is drawn from. The data module
draws the server's sets and the clients' shards from every source alike: a new kind of data set
is one class here (a kind of the user's files: with its entry in :data:`FILES`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import Dataset

from fedlit.data.datasets import (
    SPECS,
    DatasetSpec,
    ImageSplit,
    dataset_spec,
    load_split,
    load_unlabeled_split,
)
from fedlit.data.own.arrays import read_arrays
from fedlit.data.own.cache import CACHE_FOLDER
from fedlit.data.own.folders import FolderListing, list_folders, read_folders
from fedlit.data.own.read import CLIENTS, ReadImages
from fedlit.data.own.torch_datasets import read_torch_datasets
from fedlit.data.partition import IID, Partitioner
from fedlit.data.pool_images import PoolImages

#: Every ``data.client_pool`` there is; each source offers some of them.
CLIENT_POOLS = ("train", "unlabeled", "folders")
#: ``data.num_clients`` left unset, where the data set does not decide it.
DEFAULT_CLIENTS = 10


@dataclass(frozen=True)
class Clients:
    """The clients a data set is divided into: ``data.num_clients`` and
    ``data.examples_per_client`` as the run uses them, and ``note``, a line saying which given
    values the data set decides instead (None: it took them as given)."""

    count: int
    examples_per_client: int | None
    note: str | None = None


class Source(ABC):
    """One kind of data set: its facts, the settings it refuses, the client pools it offers.

    The default client pools are ``train`` (the training split left after the server's sets,
    divided by the partitioner) and, for a data set with an unlabeled split
    (:attr:`DatasetSpec.unlabeled_split`, STL-10's 100,000 ``unlabeled`` images), ``unlabeled``,
    then the default: the training split gives the server's sets only (what is left of it is
    unused) and the partitioner, which must be :class:`~fedlit.data.partition.IID`, deals the
    unlabeled split out at random. Those images have no labels: reading them (the FedAvg-SL
    oracle, ``hidden_labels`` diagnostics) raises ValueError naming ``data.client_pool``; the
    class counts have a single column, the shard sizes, and R is NaN.
    """

    #: Whether the data set is the user's own (not one of :data:`SPECS`).
    users_own: ClassVar[bool] = True
    #: Whether the server may take all of the labeled split (``data.labeled_per_class`` and
    #: ``data.labeled_fraction`` both None), less the validation and server-unlabeled images.
    whole_labeled_split: ClassVar[bool] = False

    @property
    @abstractmethod
    def spec(self) -> DatasetSpec:
        """The data set's spec: its facts and the loader of its train and test splits."""

    @property
    def name(self) -> str:
        """The data set's name (its spec's)."""
        return self.spec.name

    @property
    def unlabeled_split(self) -> str | None:
        """The data set's unlabeled split, if it has one (its spec's)."""
        return self.spec.unlabeled_split

    @property
    def user_data(self) -> ReadImages:
        """The user's data set, as read (RuntimeError for a built-in data set)."""
        raise RuntimeError(f"{self.spec.name} is not a data set of the user's own")

    def save_statistics(self) -> None:
        """Cache the user's data set's statistics beside its files, where it has such a cache."""
        if self.users_own:
            self.user_data.save_statistics()

    def clients(self, num_clients: int | None, examples_per_client: int | None) -> Clients:
        """The clients of ``data.num_clients`` (None: :data:`DEFAULT_CLIENTS`) and
        ``data.examples_per_client`` (called before the user's images are read)."""
        return Clients(DEFAULT_CLIENTS if num_clients is None else num_clients, examples_per_client)

    def refuse(self, labels_at: str, partitioner: Partitioner | None) -> None:  # noqa: B027
        """Raise ValueError, naming the key, for a setting this data set cannot serve (called
        before the user's images are read: what it checks needs no pixels). Most sources
        refuse neither."""

    def listed_labels(self) -> tuple[np.ndarray, tuple[str, ...]] | None:
        """The training split's labels and class names, where a listing of the data set's
        files gives them before any image is read (the user's folders); else None."""
        return None

    def client_pool(self, asked: str | None, partitioner: Partitioner | None) -> str:
        """``data.client_pool`` resolved (``asked``, one of :data:`CLIENT_POOLS` or None: the
        unlabeled split if there is one, else ``train``); ValueError naming the key if this
        data set or the partitioner cannot serve it."""
        if asked == "folders":
            raise ValueError(
                "data.client_pool='folders' is the clients' own folders of "
                f"data.dataset='client_folders', not of {self.name!r}"
            )
        split = self.unlabeled_split
        if asked == "unlabeled" and split is None:
            having = sorted(s.name for s in SPECS.values() if s.unlabeled_split is not None)
            raise ValueError(
                f"data.client_pool='unlabeled': data.dataset={self.name!r} has no "
                f"unlabeled split (data sets with one: {having})"
            )
        pool = asked or ("train" if split is None else "unlabeled")
        if pool == "unlabeled" and partitioner is not None and type(partitioner) is not IID:
            raise ValueError(
                f"data.partitioner={partitioner!r} divides the client pool by its labels, but "
                f"data.client_pool='unlabeled' draws it from {self.name}'s {split!r} split, "
                "which has none: use fedlit.data.partition.IID (a random split there) or "
                "data.client_pool='train'"
            )
        return pool

    def prepare(self, root: Path, download: bool, pool: str) -> None:
        """Load (download, for a built-in data set) the splits that ``pool`` needs."""
        load_split(self.spec, root, train=True, download=download)
        load_split(self.spec, root, train=False, download=download)
        if pool == "unlabeled":
            load_unlabeled_split(self.spec, root, download=download)

    def pool_images(
        self, pool: str, train: ImageSplit, rest: np.ndarray, root: Path, download: bool
    ) -> PoolImages:
        """The images of client pool ``pool``; ``rest``: the indices of ``train`` that the
        server's sets leave."""
        if pool == "train":
            labels = train.labels.numpy()[rest]
            where = "left after the server's split"
            return PoolImages(train, rest, labels, self.spec.num_classes, where)
        images = load_unlabeled_split(self.spec, root, download=download).images
        why = (
            f"data.client_pool='unlabeled': the clients' images come from {self.spec.name}'s "
            f"{self.spec.unlabeled_split!r} split, which has no labels, so there are none for "
            "the FedAvg-SL oracle or label-based diagnostics (hidden_labels); set "
            "data.client_pool='train' to draw the clients' images from the labeled training split"
        )
        where = f"of {self.spec.name}'s {self.spec.unlabeled_split!r} split (data.client_pool)"
        return _unlabeled(ImageSplit(images, None, why), where)

    def clients_without_labels(self, pool: str) -> tuple[str, str] | None:
        """Where the clients' images have no labels: (the setting that makes it so, why and
        what to do instead); None where they have labels."""
        if pool == "unlabeled":
            return (
                "data.client_pool='unlabeled'",
                f"{self.spec.name}'s unlabeled split has none; use data.client_pool='train'",
            )
        return None

    def unmeasured_title(self, pool: str) -> str | None:
        """One line naming the data set and its partition where the clients' images have no
        labels to measure R with, saying so; None where they have (the partitioner names it)."""
        if pool == "unlabeled":
            return f"{self.spec.name}, IID over its unlabeled split (no labels: R not measured)"
        return None

    def client_names(self, num_clients: int) -> list[str]:
        """Each client's name, ``client <k>``."""
        return [f"client {k}" for k in range(num_clients)]


def _unlabeled(split: ImageSplit, where: str, shards: list[np.ndarray] | None = None) -> PoolImages:
    """``split``, a pool without labels, as one class: an IID partition is a random split."""
    return PoolImages(
        split, np.arange(len(split)), np.zeros(len(split), dtype=np.int64), 1, where, shards
    )


class BuiltIn(Source):
    """A data set of :data:`SPECS` by name, loaded (and downloaded) under ``data.root``; the
    settings only the user's data sets read (``own_only``: their values by key) are refused."""

    users_own = False

    def __init__(self, name: str, **own_only: object) -> None:
        self._spec = dataset_spec(name)
        for key, value in own_only.items():
            if value is not None:
                raise ValueError(
                    f"data.{key}={value!r} is read only for a data set of your own (data.dataset "
                    f"one of {tuple(FILES)} or a torch Dataset), not for a built-in data set"
                )

    @property
    def spec(self) -> DatasetSpec:
        return self._spec


class UsersOwn(Source):
    """A data set of the user's own, read once, when its spec is first asked for (the data
    module asks when it is made: the data set's classes and channels are the model's)."""

    @abstractmethod
    def read(self) -> tuple[DatasetSpec, ReadImages]:
        """Read the data set: its spec and its splits. ValueError naming the key or the file."""

    @cached_property
    def _read(self) -> tuple[DatasetSpec, ReadImages]:
        return self.read()

    @property
    def spec(self) -> DatasetSpec:
        return self._read[0]

    @property
    def user_data(self) -> ReadImages:
        return self._read[1]


class Files(UsersOwn):
    """A data set of the user's files at ``data.path`` (``data.dataset`` its :attr:`kind`),
    its images fitted to ``data.image_size``; image files are decoded once into the cache
    under ``cache_root`` (``<data.root>/fedlit-cache``, see :mod:`fedlit.data.own.cache`;
    None: into memory, every time)."""

    kind: ClassVar[str]

    def __init__(
        self,
        path: str | None,
        image_size: int | None,
        test_dataset: object,
        cache_root: Path | None = None,
    ) -> None:
        self.path, self.image_size, self.cache_root = path, image_size, cache_root
        self.test_dataset_given = test_dataset is not None

    def folder(self) -> Path:
        """``data.path``, expanded; ValueError naming the key where it is unset, or where a
        test Dataset is given beside it."""
        if self.path is None:
            raise ValueError(
                f"data.path: data.dataset={self.kind!r} reads its images from data.path; set it"
            )
        if self.test_dataset_given:
            raise ValueError(
                f"data.test_dataset is for a torch Dataset in data.dataset, not "
                f"data.dataset={self.kind!r}"
            )
        return Path(self.path).expanduser()

    def read(self) -> tuple[DatasetSpec, ReadImages]:
        return self.read_files(self.folder())

    @property
    def name(self) -> str:
        return self.kind

    @property
    def unlabeled_split(self) -> str | None:
        return None

    @abstractmethod
    def read_files(self, path: Path) -> tuple[DatasetSpec, ReadImages]:
        """Read the data set at ``path``: its spec and its splits."""


class Folder(Files):
    """``folder``: ``train/<class>/*`` and ``test/<class>/*`` (see
    :mod:`fedlit.data.own.folders`)."""

    kind = "folder"

    @cached_property
    def listing(self) -> FolderListing:
        """The data set's files, listed (no image is read)."""
        return list_folders(self.kind, self.folder())

    def listed_labels(self) -> tuple[np.ndarray, tuple[str, ...]] | None:
        return self.listing.train_labels, self.listing.classes

    def read_files(self, path: Path) -> tuple[DatasetSpec, ReadImages]:
        return read_folders(self.listing, self.image_size, self.cache_root)

    def __getstate__(self) -> dict[str, Any]:
        """The source without its listing (a worker's copy holds the images read)."""
        return {key: value for key, value in self.__dict__.items() if key != "listing"}


class ClientFolders(Folder):
    """``client_folders``: ``labeled/<class>/*``, ``clients/<client>/*`` and ``test/<class>/*``.

    The server's sets come from ``labeled/`` (``data.labeled_per_class`` and
    ``data.labeled_fraction`` both None: all of it, less the validation and server-unlabeled
    images); each client's shard is its own folder under ``clients/`` (client pool ``folders``,
    its only one; no partitioner, ``data.num_clients`` the number of folders) and has no labels,
    as an unlabeled split's.
    """

    kind = "client_folders"
    whole_labeled_split = True

    def clients(self, num_clients: int | None, examples_per_client: int | None) -> Clients:
        """The clients are the folders of ``data.path/clients``, each holding its whole folder
        (from a listing: no image is read): ``data.num_clients`` and
        ``data.examples_per_client`` given otherwise (a recipe written for a built-in data set
        sets both) give way, and the note says so."""
        folders = len(self.listing.clients)
        given = []
        if num_clients is not None and num_clients != folders:
            given.append(f"data.num_clients={num_clients}")
        if examples_per_client is not None:
            given.append(f"data.examples_per_client={examples_per_client}")
        note = (
            f"{' and '.join(given)} not used: with data.dataset='client_folders' the clients "
            f"are the {folders} client folders of {self.listing.root / CLIENTS}, each holding "
            "its whole folder"
            if given
            else None
        )
        return Clients(folders, None, note)

    def refuse(self, labels_at: str, partitioner: Partitioner | None) -> None:
        """The shards are the folders (no partitioner but the default IID, which is not used)
        and have no labels (no labels-at-client)."""
        if labels_at == "client":
            raise ValueError(
                "data.labels_at='client': data.dataset='client_folders' holds its labels at the "
                "server (data.path/labeled) and none at the clients; use data.labels_at='server'"
            )
        if partitioner is not None and type(partitioner) is not IID:  # IID: the default, unused
            raise ValueError(
                f"data.partitioner={partitioner!r}: with data.dataset='client_folders' the "
                "clients' shards are their folders (data.path/clients); leave data.partitioner "
                "unset"
            )

    def client_pool(self, asked: str | None, partitioner: Partitioner | None) -> str:
        if asked not in (None, "folders"):
            raise ValueError(
                f"data.client_pool={asked!r}: data.dataset='client_folders' takes "
                "the clients' images from their folders (data.path/clients); leave "
                "data.client_pool unset"
            )
        return "folders"

    def pool_images(
        self, pool: str, train: ImageSplit, rest: np.ndarray, root: Path, download: bool
    ) -> PoolImages:
        """The clients' folders' images as one pool without labels, divided by folder."""
        read = self.user_data
        why = (
            "data.dataset='client_folders': the clients' images (data.path/clients/<client>) "
            "have no labels, so there are none for the FedAvg-SL oracle or label-based "
            "diagnostics (hidden_labels)"
        )
        bounds = np.cumsum([0, *read.client_sizes])
        parts = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        return _unlabeled(ImageSplit(read.hand_over_clients(), None, why), "", parts)

    def clients_without_labels(self, pool: str) -> tuple[str, str] | None:
        return (
            "data.dataset='client_folders'",
            "the clients' folders (data.path/clients) hold images without labels; use "
            "data.dataset='folder', whose clients' images keep their labels",
        )

    def unmeasured_title(self, pool: str) -> str | None:
        return f"{self.spec.name}: the clients' own folders (no labels: R not measured)"

    def client_names(self, num_clients: int) -> list[str]:
        """Each client's name: its folder's."""
        return list(self.user_data.client_names)


class Arrays(Files):
    """``arrays``: one ``.npz`` or ``.pt`` file (see :mod:`fedlit.data.own.arrays`)."""

    kind = "arrays"

    def read_files(self, path: Path) -> tuple[DatasetSpec, ReadImages]:
        return read_arrays(path, self.image_size)


class TorchDatasets(UsersOwn):
    """Two torch Datasets: ``data.dataset``, the training split, and ``data.test_dataset``.

    A copy of it (what a pool or Ray worker receives with the data module) holds the images
    read, not the user's Datasets.
    """

    def __init__(
        self, train: Dataset, test: Dataset | None, path: str | None, image_size: int | None
    ) -> None:
        self.train, self.test, self.path, self.image_size = train, test, path, image_size

    def read(self) -> tuple[DatasetSpec, ReadImages]:
        if self.path is not None:
            raise ValueError(
                f"data.path={self.path!r}: a torch Dataset in data.dataset reads no path"
            )
        return read_torch_datasets(self.train, self.test, self.image_size)

    def __getstate__(self) -> dict[str, Any]:
        """The source without the user's Datasets (their images are read)."""
        return {**self.__dict__, "train": None, "test": None}


#: The kinds of the user's files, by their ``data.dataset`` names (read from ``data.path``).
FILES: dict[str, type[Files]] = {kind.kind: kind for kind in (Folder, ClientFolders, Arrays)}


def make_source(
    dataset: str | Dataset,
    path: str | None,
    image_size: int | None,
    test_dataset: Dataset | None,
    root: Path | None = None,
) -> Source:
    """The source ``data.dataset`` names: one of :data:`FILES` (its images cached under
    ``<root>/fedlit-cache``, ``root`` being ``data.root``), a torch Dataset (``test_dataset``
    its test split) or a name from :data:`SPECS` (ValueError naming the key for another name,
    or for a setting only the user's data sets read). Nothing is read yet."""
    if not isinstance(dataset, str):
        return TorchDatasets(dataset, test_dataset, path, image_size)
    if dataset in FILES:
        cache_root = None if root is None else root / CACHE_FOLDER
        return FILES[dataset](path, image_size, test_dataset, cache_root)
    return BuiltIn(dataset, path=path, image_size=image_size, test_dataset=test_dataset)
