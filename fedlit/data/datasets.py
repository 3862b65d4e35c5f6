"""Image classification data sets by name, loaded as uint8 tensors.

Every data set is held in memory as ``images`` (N, C, H, W) uint8 and ``labels`` (N,) int64, so
that splits, partitions and augmentations index plain tensors. A data set's unlabeled split
(STL-10's ``unlabeled``, :func:`load_unlabeled_split`) holds images only: its ``labels`` raise.
Loading goes through torchvision (with its real download path); Fashion-MNIST is also read
offline from Debian's ``dataset-fashion-mnist`` package when it is installed.

Several processes may load a data set into one fresh ``data.root`` at once (runs started side
by side): the first-use step that writes into it runs under a file lock (a download under
``<root>/.fedlit-<data set>.lock``, the staging of Debian's files under
``<root>/FashionMNIST/.staging.lock``), so one process writes and the others wait and then
read what it wrote. Staged files are written under a name of their own
and renamed into place, and a staged file is accepted only when its size is the one its IDX
header and its source give (a truncated or zeroed file is staged again).
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock
from torch import Tensor
from torchvision import datasets as tvd

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


@dataclass(frozen=True)
class DatasetSpec:
    """Static facts about a data set: what the model and the transforms need before loading."""

    name: str
    num_classes: int
    channels: int
    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    hflip: bool  # horizontal flips keep the label (not for digits or letters)
    #: torchvision's name of a split of images without labels (STL-10's ``unlabeled``), which
    #: ``data.client_pool: unlabeled`` makes the client pool; None: the data set has none.
    unlabeled_split: str | None = None
    #: The classes' names, in label order (None: the label numbers name them).
    classes: tuple[str, ...] | None = None


DIGITS = tuple(str(d) for d in range(10))


@dataclass(frozen=True, init=False)
class ImageSplit:
    """One split of a data set: ``images`` (N, C, H, W) uint8 and ``labels`` (N,) int64.

    A split without labels (``labels=None``: STL-10's unlabeled split, where torchvision gives
    -1) keeps ``no_labels``, a message saying why; reading its :attr:`labels` raises ValueError
    with it, so that no oracle, diagnostic or partitioner works from labels that do not exist.
    """

    images: Tensor
    _labels: Tensor | None
    no_labels: str = field(default="", compare=False)

    def __init__(self, images: Tensor, labels: Tensor | None, no_labels: str = "") -> None:
        if labels is not None and len(labels) != len(images):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        object.__setattr__(self, "images", images)
        object.__setattr__(self, "_labels", labels)
        object.__setattr__(self, "no_labels", no_labels or "these images have no labels")

    def __len__(self) -> int:
        return len(self.images)

    @property
    def has_labels(self) -> bool:
        """Whether the images have labels (False for an unlabeled split)."""
        return self._labels is not None

    @property
    def labels(self) -> Tensor:
        """(N,) int64 class ids; ValueError (``no_labels``) for a split without labels."""
        if self._labels is None:
            raise ValueError(self.no_labels)
        return self._labels

    def take(self, index: Tensor | np.ndarray | slice) -> ImageSplit:
        """The examples at ``index``, with their labels if the split has any."""
        labels = None if self._labels is None else self._labels[index]
        return ImageSplit(self.images[index], labels, self.no_labels)


SPECS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec("mnist", 10, 1, 28, (0.1307,), (0.3081,), hflip=False, classes=DIGITS),
        DatasetSpec(
            "fashion_mnist",
            10,
            1,
            28,
            (0.2860,),
            (0.3530,),
            hflip=True,
            classes=tuple(tvd.FashionMNIST.classes),
        ),
        DatasetSpec("emnist_balanced", 47, 1, 28, (0.1751,), (0.3332,), hflip=False),
        DatasetSpec(
            "cifar10",
            10,
            3,
            32,
            (0.4914, 0.4822, 0.4465),
            (0.2470, 0.2435, 0.2616),
            True,
            # the names of the data set's batches.meta, in label order
            classes=(
                "airplane",
                "automobile",
                "bird",
                "cat",
                "deer",
                "dog",
                "frog",
                "horse",
                "ship",
                "truck",
            ),  # fmt: skip
        ),
        DatasetSpec(
            "cifar100", 100, 3, 32, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), True
        ),
        DatasetSpec(
            "svhn",
            10,
            3,
            32,
            (0.4377, 0.4438, 0.4728),
            (0.1980, 0.2010, 0.1970),
            False,
            classes=DIGITS,  # torchvision maps the digit 0's label 10 to 0
        ),
        DatasetSpec(
            "stl10",
            10,
            3,
            96,
            (0.4467, 0.4398, 0.4066),
            (0.2603, 0.2566, 0.2713),
            hflip=True,
            unlabeled_split="unlabeled",
            # class_names.txt of the data set, in label order
            classes=(
                "airplane",
                "bird",
                "car",
                "cat",
                "deer",
                "dog",
                "horse",
                "monkey",
                "ship",
                "truck",
            ),  # fmt: skip
        ),
    )
}


def dataset_spec(name: str) -> DatasetSpec:
    """The spec of data set ``name``; a ValueError naming ``data.dataset`` if it is unknown."""
    if name not in SPECS:
        raise ValueError(f"data.dataset: unknown data set {name!r}; choose one of {sorted(SPECS)}")
    return SPECS[name]


def load_split(name: str, root: str | Path, train: bool, download: bool = True) -> ImageSplit:
    """Load the train or test split of data set ``name`` under ``root`` as uint8 tensors."""
    spec = dataset_spec(name)
    root = Path(root)
    with _first_use(root, name, download):
        ds = _torchvision_split(name, root, train, download)
    images, labels = _to_tensors(ds)
    if name == "emnist_balanced":  # EMNIST is stored transposed
        images = images.transpose(2, 3).contiguous()
    _check_shape(spec, images)
    return ImageSplit(images, labels)


@contextmanager
def _first_use(root: Path, name: str, writes: bool) -> Iterator[None]:
    """Hold ``<root>/.fedlit-<name>.lock`` while the data set's files may be written (a
    download): processes loading into one root take turns. A root this process cannot write
    (a read-only copy of the data) is read without a lock. (Fashion-MNIST's staging takes a
    lock of its own, :func:`stage_debian_fashion_mnist`.)"""
    try:
        if writes:
            root.mkdir(parents=True, exist_ok=True)
        lock: FileLock | None = FileLock(root / f".fedlit-{name}.lock") if writes else None
        if lock is not None:
            lock.acquire()
    except OSError:  # not writable: nothing will be written here either
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def _torchvision_split(name: str, root: Path, train: bool, download: bool) -> object:
    if name == "fashion_mnist":
        stage_debian_fashion_mnist(root)
    split = "train" if train else "test"
    if name == "mnist":
        ds = tvd.MNIST(root, train=train, download=download)
    elif name == "fashion_mnist":
        ds = tvd.FashionMNIST(root, train=train, download=download and not _has_raw_fashion(root))
    elif name == "emnist_balanced":
        ds = tvd.EMNIST(root, split="balanced", train=train, download=download)
    elif name == "cifar10":
        ds = tvd.CIFAR10(root, train=train, download=download)
    elif name == "cifar100":
        ds = tvd.CIFAR100(root, train=train, download=download)
    elif name == "svhn":
        ds = tvd.SVHN(root, split=split, download=download)
    else:  # stl10: the labeled train/test splits (the unlabeled one: load_unlabeled_split)
        ds = tvd.STL10(root, split=split, download=download)
    return ds


def load_unlabeled_split(name: str, root: str | Path, download: bool = True) -> ImageSplit:
    """Load data set ``name``'s split of unlabeled images (its spec's ``unlabeled_split``,
    STL-10's 100,000 ``unlabeled`` images) under ``root``: an :class:`ImageSplit` without
    labels (torchvision's -1s are dropped). ValueError if the data set has no such split."""
    spec = dataset_spec(name)
    if spec.unlabeled_split is None:
        raise ValueError(f"data.dataset: {name!r} has no unlabeled split")
    with _first_use(Path(root), name, download):
        ds = tvd.STL10(Path(root), split=spec.unlabeled_split, download=download)  # only STL-10
    images, _ = _to_tensors(ds)
    _check_shape(spec, images)
    return ImageSplit(images, None, f"{name}'s {spec.unlabeled_split!r} split has no labels")


def _check_shape(spec: DatasetSpec, images: Tensor) -> None:
    if images.shape[1:] != (spec.channels, spec.size, spec.size):
        raise RuntimeError(f"{spec.name}: unexpected image shape {tuple(images.shape[1:])}")


def _to_tensors(ds: object) -> tuple[Tensor, Tensor]:
    data = ds.data  # type: ignore[attr-defined]
    targets = getattr(ds, "targets", None)
    if targets is None:
        targets = ds.labels  # type: ignore[attr-defined]  # SVHN, STL10
    images = torch.as_tensor(np.asarray(data))
    if images.ndim == 3:  # (N, H, W) gray
        images = images.unsqueeze(1)
    elif images.shape[-1] == 3:  # (N, H, W, 3) CIFAR
        images = images.permute(0, 3, 1, 2)
    return images.to(torch.uint8).contiguous(), torch.as_tensor(np.asarray(targets)).long()


FASHION_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def _fashion_raw(root: Path) -> Path:
    return root / "FashionMNIST" / "raw"


def idx_size(path: Path) -> int | None:
    """The size in bytes an IDX file of unsigned bytes must have, from its header (magic
    ``00 00 08 <ndim>``, then ``ndim`` big-endian dimensions); None if the header is not one
    (a zeroed or truncated file)."""
    with open(path, "rb") as f:
        head = f.read(4)
        if len(head) < 4 or head[:3] != b"\x00\x00\x08" or not 1 <= head[3] <= 4:
            return None
        dims = f.read(4 * head[3])
    if len(dims) < 4 * head[3]:
        return None
    size = 1
    for k in range(head[3]):
        size *= int.from_bytes(dims[4 * k : 4 * k + 4], "big")
    return 4 + 4 * head[3] + size


def _gzip_size(gz: Path) -> int:
    """A gzip file's decompressed size (mod 2**32), from its trailer."""
    with open(gz, "rb") as f:
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little")


def _staged_ok(path: Path, source: Path | None = None) -> bool:
    """Whether ``path`` is a whole IDX file: its size is what its header says (and what the
    gzip ``source`` it was decompressed from holds, when given)."""
    if not path.is_file():
        return False
    size = path.stat().st_size
    if idx_size(path) != size:
        return False
    return source is None or not source.is_file() or _gzip_size(source) == size % 2**32


def _has_raw_fashion(root: Path, source: Path | None = None) -> bool:
    """Whether the four Fashion-MNIST IDX files under ``root`` are whole (see
    :func:`_staged_ok`; with ``source``, Debian's folder, also of their archives' size)."""
    raw = _fashion_raw(root)
    return all(
        _staged_ok(raw / n, None if source is None else source / f"{n}.gz") for n in FASHION_FILES
    )


def stage_debian_fashion_mnist(root: str | Path, source: Path = DEBIAN_FASHION_MNIST) -> bool:
    """Decompress Debian's Fashion-MNIST IDX files into ``<root>/FashionMNIST/raw`` once.

    torchvision reads the uncompressed files offline; its download checksums differ from
    Debian's archives, so ``download=True`` would reject them. Safe when several processes
    stage into one root at once: the staging runs under ``<root>/FashionMNIST/.staging.lock``,
    each file is decompressed to a temporary name of its own and renamed into place, and a
    file already there counts only if it is whole (its IDX header's size and its archive's);
    a truncated or zeroed one is staged again. Returns whether the raw files are in place
    afterwards.
    """
    root = Path(root)
    if _has_raw_fashion(root, source):
        return True
    if not source.is_dir():
        return False
    raw = _fashion_raw(root)
    raw.mkdir(parents=True, exist_ok=True)
    with FileLock(raw.parent / ".staging.lock"):
        for name in FASHION_FILES:
            gz, target = source / f"{name}.gz", raw / name
            if not gz.is_file() or _staged_ok(target, gz):
                continue
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=raw)
            try:
                with gzip.open(gz, "rb") as src, os.fdopen(fd, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                    dst.flush()
                    os.fsync(dst.fileno())
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
    return _has_raw_fashion(root, source)
