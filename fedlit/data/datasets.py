"""Image classification data sets by name, loaded as uint8 tensors.

Every data set is one entry of :data:`SPECS`: its :class:`DatasetSpec`, whose ``loader`` loads a
split. Every data set is held in memory as ``images`` (N, C, H, W) uint8 and ``labels`` (N,)
int64, so that splits, partitions and augmentations index plain tensors. A data set's unlabeled
split (STL-10's ``unlabeled``, :func:`load_unlabeled_split`) holds images only: its ``labels``
raise. The real data sets load through torchvision (with its real download path); Fashion-MNIST
is also read offline from Debian's ``dataset-fashion-mnist`` package when it is installed.
``synthetic`` and ``synthetic_rgb`` are generated (:func:`synthetic_images`): small data sets
with learnable structure that need no download.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock
from torch import Tensor
from torchvision import datasets as tvd

from fedlit.data.mapped import Pixels
from fedlit.run_layout import created_mode

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


Images = tuple[Pixels, Tensor]
Loader = Callable[[Path, str, bool], Images]


@dataclass(frozen=True)
class DatasetSpec:
    """A data set's entry: the static facts that the model and the transforms need before
    loading, and the function that loads a split."""

    name: str
    num_classes: int
    channels: int
    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    hflip: bool  # horizontal flips keep the label (not for digits or letters)
    #: ``loader(root, split, download)``: the split's uint8 images (N, C, H, W) and int64
    #: labels (N,); ``split`` is ``"train"``, ``"test"`` or :attr:`unlabeled_split`.
    loader: Loader = field(compare=False, repr=False)
    #: torchvision's name of a split of images without labels (STL-10's ``unlabeled``), which
    #: ``data.client_pool: unlabeled`` makes the client pool; None: the data set has none.
    unlabeled_split: str | None = None
    #: The classes' names, in label order (None: the label numbers name them).
    classes: tuple[str, ...] | None = None


DIGITS = tuple(str(d) for d in range(10))


@dataclass(frozen=True, init=False)
class ImageSplit:
    """One split of a data set: ``images`` (N, C, H, W) uint8 (a tensor, or a split of the
    user's cached images too large for its cap: :class:`~fedlit.data.mapped.MappedImages`) and
    ``labels`` (N,) int64.

    A split without labels (``labels=None``: STL-10's unlabeled split, where torchvision gives
    -1) keeps ``no_labels``, a message saying why; reading its :attr:`labels` raises ValueError
    with it, so that no oracle, diagnostic or partitioner works from labels that do not exist.
    """

    images: Pixels
    _labels: Tensor | None
    no_labels: str = field(default="", compare=False)

    def __init__(self, images: Pixels, labels: Tensor | None, no_labels: str = "") -> None:
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


def _torchvision(
    root: Path, name: str, download: bool, make: Callable[[], object]
) -> tuple[Tensor, Tensor]:
    """``make()``'s torchvision data set (built under ``name``'s first-use lock, as it may
    download) as uint8 images (N, C, H, W) and int64 labels."""
    with _first_use(root, name, download):
        ds = make()
    return _to_tensors(ds)


def _load_mnist(root: Path, split: str, download: bool) -> Images:
    train = split == "train"
    return _torchvision(
        root, "mnist", download, lambda: tvd.MNIST(root, train=train, download=download)
    )


def _load_fashion_mnist(root: Path, split: str, download: bool) -> Images:
    def make() -> object:
        stage_debian_fashion_mnist(root)  # Debian's files, offline, when they are installed
        fetch = download and not _has_raw_fashion(root)
        return tvd.FashionMNIST(root, train=split == "train", download=fetch)

    return _torchvision(root, "fashion_mnist", download, make)


def _load_emnist_balanced(root: Path, split: str, download: bool) -> Images:
    images, labels = _torchvision(
        root,
        "emnist_balanced",
        download,
        lambda: tvd.EMNIST(root, split="balanced", train=split == "train", download=download),
    )
    return images.transpose(2, 3).contiguous(), labels  # EMNIST is stored transposed


def _load_cifar10(root: Path, split: str, download: bool) -> Images:
    train = split == "train"
    return _torchvision(
        root, "cifar10", download, lambda: tvd.CIFAR10(root, train=train, download=download)
    )


def _load_cifar100(root: Path, split: str, download: bool) -> Images:
    train = split == "train"
    return _torchvision(
        root, "cifar100", download, lambda: tvd.CIFAR100(root, train=train, download=download)
    )


def _load_svhn(root: Path, split: str, download: bool) -> Images:
    return _torchvision(
        root, "svhn", download, lambda: tvd.SVHN(root, split=split, download=download)
    )


def _load_stl10(root: Path, split: str, download: bool) -> Images:
    """STL-10's ``train``, ``test`` or ``unlabeled`` split (whose labels are torchvision's -1s)."""
    return _torchvision(
        root, "stl10", download, lambda: tvd.STL10(root, split=split, download=download)
    )


SYNTHETIC_SEED = 0x5F17
SYNTHETIC_SIZES = {"train": 6000, "test": 1000}
SYNTHETIC_SPLITS = {"train": 0, "test": 1}  # each split's own random stream
SYNTHETIC_SHIFT = 2  # the largest shift, in pixels, of an image's pattern from its class's


def synthetic_images(n: int, split_seed: int, num_classes: int, channels: int, size: int) -> Images:
    """``n`` generated images of ``num_classes`` classes, deterministic from ``split_seed``.

    Every class has a pattern of its own, drawn from :data:`SYNTHETIC_SEED` (the same for every
    split): three Gaussian blobs per channel at random places, of random widths and signs.
    An image is its class's pattern shifted by up to :data:`SYNTHETIC_SHIFT` pixels each way,
    scaled by a random contrast in [0.6, 1], on a grey background, plus Gaussian noise
    (sd 0.1 of the range), as uint8. The labels are balanced (``n // num_classes`` each, the
    rest to the first classes) in a random order.
    """
    patterns = np.random.default_rng(SYNTHETIC_SEED)
    pad = SYNTHETIC_SHIFT
    grid = np.arange(size + 2 * pad, dtype=np.float64) - pad
    blobs = (num_classes, channels, 3)
    cy, cx = patterns.uniform(4, size - 4, blobs), patterns.uniform(4, size - 4, blobs)
    width, sign = patterns.uniform(2, 5, blobs), patterns.choice([-1.0, 1.0], blobs)
    dy = (grid - cy[..., None]) ** 2  # (K, C, 3, S + 2 pad)
    dx = (grid - cx[..., None]) ** 2
    bumps = np.exp(-(dy[..., :, None] + dx[..., None, :]) / (2 * width[..., None, None] ** 2))
    templates = (sign[..., None, None] * bumps).sum(axis=2)  # (K, C, S + 2 pad, S + 2 pad)
    templates /= np.abs(templates).max(axis=(1, 2, 3), keepdims=True)
    templates = templates.astype(np.float32)

    rng = np.random.default_rng([SYNTHETIC_SEED, split_seed])
    labels = rng.permutation(np.arange(n) % num_classes)
    shifts = rng.integers(0, 2 * pad + 1, (n, 2))
    contrast = rng.uniform(0.6, 1.0, (n, 1, 1, 1)).astype(np.float32)
    noise = rng.standard_normal((n, channels, size, size), dtype=np.float32)
    images = np.empty((n, channels, size, size), dtype=np.float32)
    for y in range(2 * pad + 1):
        for x in range(2 * pad + 1):
            at = (shifts[:, 0] == y) & (shifts[:, 1] == x)
            images[at] = templates[labels[at], :, y : y + size, x : x + size]
    images = 0.5 + 0.4 * contrast * images + 0.1 * noise
    pixels = np.clip(np.rint(images * 255), 0, 255).astype(np.uint8)
    return torch.from_numpy(pixels), torch.from_numpy(labels).long()


def _load_synthetic(root: Path, split: str, download: bool) -> Images:
    """The generated grey data set's ``split`` (nothing is read or written)."""
    return synthetic_images(SYNTHETIC_SIZES[split], SYNTHETIC_SPLITS[split], 10, 1, 28)


def _load_synthetic_rgb(root: Path, split: str, download: bool) -> Images:
    """The generated RGB data set's ``split`` (nothing is read or written)."""
    return synthetic_images(SYNTHETIC_SIZES[split], SYNTHETIC_SPLITS[split], 10, 3, 32)


CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip
STL10_CLASSES = (
    "airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck",
)  # fmt: skip

#: Every data set by name: its spec, loader included. Adding a data set is one entry here.
SPECS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec("mnist", 10, 1, 28, (0.1307,), (0.3081,), False, _load_mnist, classes=DIGITS),
        DatasetSpec(
            "fashion_mnist",
            10,
            1,
            28,
            (0.2860,),
            (0.3530,),
            True,
            _load_fashion_mnist,
            classes=tuple(tvd.FashionMNIST.classes),
        ),
        DatasetSpec(
            "emnist_balanced", 47, 1, 28, (0.1751,), (0.3332,), False, _load_emnist_balanced
        ),
        DatasetSpec(
            "cifar10",
            10,
            3,
            32,
            (0.4914, 0.4822, 0.4465),
            (0.2470, 0.2435, 0.2616),
            True,
            _load_cifar10,
            classes=CIFAR10_CLASSES,  # the names of the data set's batches.meta, in label order
        ),
        DatasetSpec(
            "cifar100",
            100,
            3,
            32,
            (0.5071, 0.4865, 0.4409),
            (0.2673, 0.2564, 0.2762),
            True,
            _load_cifar100,
        ),
        DatasetSpec(
            "svhn",
            10,
            3,
            32,
            (0.4377, 0.4438, 0.4728),
            (0.1980, 0.2010, 0.1970),
            False,
            _load_svhn,
            classes=DIGITS,  # torchvision maps the digit 0's label 10 to 0
        ),
        DatasetSpec(
            "stl10",
            10,
            3,
            96,
            (0.4467, 0.4398, 0.4066),
            (0.2603, 0.2566, 0.2713),
            True,
            _load_stl10,
            unlabeled_split="unlabeled",
            classes=STL10_CLASSES,  # class_names.txt of the data set, in label order
        ),
        # generated: the statistics are those of the training split
        DatasetSpec("synthetic", 10, 1, 28, (0.4988,), (0.1437,), False, _load_synthetic),
        DatasetSpec(
            "synthetic_rgb",
            10,
            3,
            32,
            (0.5155, 0.5069, 0.5169),
            (0.1272, 0.1384, 0.1288),
            False,
            _load_synthetic_rgb,
        ),
    )
}


def dataset_spec(name: str) -> DatasetSpec:
    """The spec of data set ``name``; a ValueError naming ``data.dataset`` if it is unknown."""
    if name not in SPECS:
        raise ValueError(
            f"data.dataset: unknown data set {name!r}; choose one of {sorted(SPECS)}, a data "
            "set of your files (folder, client_folders, arrays, with data.path) or a torch "
            "Dataset ({class_path: ..., init_args: ...})"
        )
    return SPECS[name]


def load_split(
    name: str | DatasetSpec, root: str | Path, train: bool, download: bool = True
) -> ImageSplit:
    """Load the train or test split of data set ``name`` (or of the data set of a spec, such
    as a user's data set's) under ``root`` as uint8 tensors."""
    spec = name if isinstance(name, DatasetSpec) else dataset_spec(name)
    images, labels = spec.loader(Path(root), "train" if train else "test", download)
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


def load_unlabeled_split(
    name: str | DatasetSpec, root: str | Path, download: bool = True
) -> ImageSplit:
    """Load data set ``name``'s (or a spec's) split of unlabeled images (its spec's
    ``unlabeled_split``, STL-10's 100,000 ``unlabeled`` images) under ``root``: an
    :class:`ImageSplit` without labels (torchvision's -1s are dropped). ValueError if the data
    set has no such split."""
    spec = name if isinstance(name, DatasetSpec) else dataset_spec(name)
    if spec.unlabeled_split is None:
        raise ValueError(f"data.dataset: {spec.name!r} has no unlabeled split")
    images, _ = spec.loader(Path(root), spec.unlabeled_split, download)
    _check_shape(spec, images)
    return ImageSplit(images, None, f"{spec.name}'s {spec.unlabeled_split!r} split has no labels")


def _check_shape(spec: DatasetSpec, images: Pixels) -> None:
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
                os.chmod(tmp, created_mode())  # the user's umask, not mkstemp's 0o600
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
    return _has_raw_fashion(root, source)
