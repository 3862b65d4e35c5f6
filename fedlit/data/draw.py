"""The draw: the server's sets and the client pool, from a data set's source and a seed.

A :class:`DataSettings` (the data module's, built once) refuses, naming the key, a recipe's
``data`` settings that no draw can follow; :func:`check_sizes` refuses the sizes a data set's
labels decide; :func:`draw` makes a draw from the settings, the data set's spec and a seed:
the server's sets split by class out of the training split (:func:`split_by_class`), the test
set (:func:`load_test`) and the client pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field, replace
from pathlib import Path

import numpy as np

from fedlit.data.datasets import DatasetSpec, ImageSplit, load_split
from fedlit.data.partition import Partitioner
from fedlit.data.pool import ClientPool, deal_labeled
from fedlit.data.pool_images import check_pool_size
from fedlit.data.server import ServerData
from fedlit.data.sources import CLIENT_POOLS, Source

SPLIT_TAG = 0x5EED  # keeps the split's random stream apart from the partition's
LABELS_AT = ("server", "client")
TEST_SUBSET_SEED = 0x7E57  # the test subset's draw, the same for every run


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


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")


@dataclass(frozen=True)
class DataSettings:
    """The settings a draw follows, built once by the data module from the recipe's ``data``
    keys of the same names: the data set's source, the client pool resolved (from
    ``asked_pool``, ``data.client_pool`` as given) and the rest as given.

    It refuses, naming the key, a setting out of its range, then one the source cannot serve
    (:meth:`~fedlit.data.sources.Source.refuse`, :meth:`~fedlit.data.sources.Source.client_pool`),
    before any image is read (the source's spec aside: it is read after them)."""

    source: Source
    asked_pool: InitVar[str | None]
    root: Path
    download: bool
    test_subset: int | None
    path: str | None
    image_size: int | None
    hflip: bool | None
    num_clients: int
    examples_per_client: int | None
    labeled_per_class: int | None
    labeled_fraction: float | None
    val_per_class: int
    partitioner: Partitioner
    stream_steps: int | None
    labels_at: str
    server_unlabeled_fraction: float
    batch_size: int
    client_batch_size: int
    eval_batch_size: int
    #: ``data.client_pool`` resolved: where the clients' images come from.
    client_pool: str = field(init=False)

    def __post_init__(self, asked_pool: str | None) -> None:
        self._check_ranges()
        self.source.refuse(self.labels_at, self.partitioner)
        if asked_pool is not None and asked_pool not in CLIENT_POOLS:
            raise ValueError(
                f"data.client_pool must be one of {CLIENT_POOLS} or null, got {asked_pool!r}"
            )
        pool = self.source.client_pool(asked_pool, self.partitioner)
        object.__setattr__(self, "client_pool", pool)

    def _check_ranges(self) -> None:
        """ValueError, naming the key, for a setting out of its range."""
        _positive("data.num_clients", self.num_clients)
        _positive("data.examples_per_client", self.examples_per_client)
        _positive("data.batch_size", self.batch_size)
        _positive("data.client_batch_size", self.client_batch_size)
        _positive("data.eval_batch_size", self.eval_batch_size)
        _positive("data.test_subset", self.test_subset)
        _positive("data.image_size", self.image_size)
        per_class, fraction = self.labeled_per_class, self.labeled_fraction
        if (per_class is None) == (fraction is None) and not (
            self.source.whole_labeled_split and per_class is None
        ):
            raise ValueError(
                "set exactly one of data.labeled_per_class and data.labeled_fraction "
                f"(got {per_class} and {fraction})"
            )
        _positive("data.labeled_per_class", per_class)
        if fraction is not None and not 0 < fraction < 1:
            raise ValueError(f"data.labeled_fraction must be in (0, 1), got {fraction}")
        if self.val_per_class < 0:
            raise ValueError(f"data.val_per_class must be >= 0, got {self.val_per_class}")
        _positive("data.stream_steps", self.stream_steps)
        if self.labels_at not in LABELS_AT:
            raise ValueError(f"data.labels_at must be one of {LABELS_AT}, got {self.labels_at!r}")
        if not 0 <= self.server_unlabeled_fraction < 1:  # False for NaN too
            raise ValueError(
                "data.server_unlabeled_fraction must be in [0, 1), got "
                f"{self.server_unlabeled_fraction}"
            )

    def split(
        self,
        labels: np.ndarray,
        rng: np.random.Generator,
        name: str,
        num_classes: int,
        classes: Sequence[str] | None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:func:`split_by_class` of ``labels`` (data set ``name``) by
        these settings: the labeled, validation, server-unlabeled and client-pool indices."""
        return split_by_class(
            labels,
            rng,
            name,
            num_classes,
            labeled_per_class=self.labeled_per_class,
            labeled_fraction=self.labeled_fraction,
            val_per_class=self.val_per_class,
            server_unlabeled_fraction=self.server_unlabeled_fraction,
            class_names=classes,
        )


def check_sizes(data: DataSettings, name: str, labels: np.ndarray, classes: Sequence[str]) -> None:
    """The draw's refusals that a data set's labels decide, made from ``labels`` (the
    training split's, ``classes`` their names) before any image is read: a class too small
    for the server's sets, and a client pool (``data.client_pool`` ``train``, what the
    server's sets leave) smaller than ``data.examples_per_client`` for every client. Both
    are named in one refusal (a recipe moved onto a smaller data set is refused once, with
    every setting to change). The split's sizes depend on the class counts alone, not on
    the seed."""
    problems: list[str] = []
    rest_size = 0
    try:
        *_, rest = data.split(labels, np.random.default_rng(0), name, len(classes), classes)
        rest_size = len(rest)
    except ValueError as err:
        problems.append(str(err))
    if data.client_pool == "train":
        where = "left after the server's split"
        try:
            check_pool_size(rest_size, data.num_clients, data.examples_per_client, where)
        except ValueError as err:
            problems.append(str(err))
    if problems:
        raise ValueError("; and ".join(problems))


def draw(data: DataSettings, spec: DatasetSpec, seed: int) -> tuple[ServerData, ClientPool]:
    """Load the data set of ``spec`` and draw, by ``data``, from ``seed``, the server's sets
    and the client pool.

    One random stream, in this order: the server's split, the partition of the source's
    client pool, then (labels-at-client) the dealing of the labeled set, so that the client
    pool does not depend on ``labels_at``. Raises ValueError, naming the key, when the split
    or partition cannot be made.
    """
    train = load_split(spec, data.root, train=True, download=data.download)
    test = load_test(spec, data.root, data.download, data.test_subset, spec.num_classes)
    labels = train.labels.numpy()
    rng = np.random.default_rng([seed, SPLIT_TAG])
    labeled, val, unlabeled, rest = data.split(
        labels, rng, spec.name, spec.num_classes, spec.classes
    )
    images = data.source.pool_images(data.client_pool, train, rest, data.root, data.download)
    parts = images.divide(data.partitioner, data.num_clients, data.examples_per_client, rng)
    pool = ClientPool.draw(
        images,
        parts,
        data.stream_steps,
        spec,
        data.batch_size,
        data.client_batch_size,
        data.eval_batch_size,
    )
    if data.labels_at == "client":
        key = (
            f"data.labeled_per_class={data.labeled_per_class}"
            if data.labeled_per_class is not None
            else f"data.labeled_fraction={data.labeled_fraction}"
        )
        dealt = deal_labeled(labeled, labels, rng, spec.num_classes, data.num_clients, key)
        pool = replace(pool, labeled=[train.take(i) for i in dealt])
        server_labeled = train.take(slice(0))
    else:
        server_labeled = train.take(labeled)
    server = ServerData(
        labeled=server_labeled,
        val=train.take(val),
        unlabeled=train.take(unlabeled),
        test=test,
        spec=spec,
        labels_at=data.labels_at,
        batch_size=data.batch_size,
        client_batch_size=data.client_batch_size,
        eval_batch_size=data.eval_batch_size,
    )
    return server, pool
