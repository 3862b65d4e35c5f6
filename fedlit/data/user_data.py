"""Data sets from the user's own files: image folders, clients as folders, arrays, torch Datasets.

Each is read once, by its source (:mod:`fedlit.data.sources`) when the data module is made (so
that its classes and channels are known before the model is built), into what every data set
is: uint8 images (N, C, H, W) and int64 labels (N,), described by a
:class:`~fedlit.data.datasets.DatasetSpec` whose ``loader`` hands back the splits read
(:class:`ReadImages`). So every partitioner, labels-at-client, streaming and every executor
work on them as on the built-in data sets.

- ``folder`` (``data.path``): ``train/<class>/*`` and ``test/<class>/*``, torchvision's
  ``ImageFolder`` layout: the classes are ``train``'s folder names, sorted (``test`` may lack
  some, never have others); the images are every file under a class folder (sub-folders
  included) whose name ends in one of :data:`IMAGE_EXTENSIONS`, in sorted order.
- ``client_folders`` (``data.path``): ``labeled/<class>/*`` (the server's labeled images),
  ``clients/<client>/*`` (each client's unlabeled images, any number of clients, any sizes,
  clients in sorted order) and ``test/<class>/*``.
- ``arrays`` (``data.path``): one ``.npz`` file, or a ``.pt`` file loaded with
  ``torch.load(weights_only=True)`` holding a dict, with ``x_train``, ``y_train``, ``x_test``,
  ``y_test``: uint8 images (N, H, W) or (N, H, W, C), C 1 or 3, and integer labels; an optional
  ``classes`` names the classes (else there are ``max(y_train) + 1``).
- a torch ``Dataset`` (``data.dataset`` and ``data.test_dataset``, instances or
  ``class_path``/``init_args``): items ``(image, label)``, the image a PIL image or a tensor
  (C, H, W) or (H, W), uint8 or float in [0, 1]; the classes are its ``classes`` if it has
  them, else ``max(label) + 1``.

Image files are decoded once into a cache under ``data.root`` and read from it after
(:mod:`fedlit.data.image_cache`), by torchvision (:func:`torchvision.io.decode_image`: PNG,
JPEG, GIF, WebP).
Grey or RGB is detected: the data set is RGB (3 channels) if any image is in colour, its grey
images then repeated to three channels (the run says how many in a line at its start:
:attr:`ReadImages.colour_note`); else grey (1 channel). A PIL image is grey in a grey mode, or
in a palette mode whose colours are all grey. An alpha channel is dropped,
16-bit images are scaled to 8 bits. With ``data.image_size=S`` every image is resized so that
its shorter side is S (antialiased), then centre-cropped to S x S; without it, all images must
be one square size.

The normalisation statistics (per-channel mean and standard deviation of the training images,
pixel values in [0, 1]; a folder of clients: the labeled and the clients' images) are computed
once and cached beside the data, in a small JSON file (:data:`STATS_FILE` in the folder,
``<file>.fedlit-stats.json`` beside an array file), under a fingerprint of the files (their
names, sizes and modification times) and the image size, so that a changed folder is
recomputed. It is the only file fedlit writes there (:meth:`ReadImages.save_statistics`, once
a run's checks have passed); a folder that cannot be written is read all the same.

Anything wrong is a ValueError naming the file or the key, raised before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional as F
from tqdm import tqdm  # text, also in notebooks (no widget: no ipywidgets needed)

from fedlit.data.datasets import DatasetSpec, Images
from fedlit.data.mapped import Pixels, as_tensor
from fedlit.machine import available_cores, available_memory  # noqa: F401 (imported from here)
from fedlit.run_layout import created_mode

#: The file endings read as images (others, and hidden files, are left alone).
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".webp")
#: The statistics cache's name inside a folder data set.
STATS_FILE = "fedlit-stats.json"
STATS_VERSION = 1
ARRAY_KEYS = ("x_train", "y_train", "x_test", "y_test")
#: The splits of a folder data set, by data set: (the labeled training split, the test split).
FOLDER_SPLITS = {"folder": ("train", "test"), "client_folders": ("labeled", "test")}
#: The folder of the clients' folders in a ``client_folders`` data set.
CLIENTS = "clients"


@dataclass(frozen=True)
class LooseImage:
    """One image still at its own size: (C, H, W) uint8, C 1 or 3, and where it came from."""

    image: Tensor
    source: str


# --- images ---------------------------------------------------------------------------------
def image_files(folder: Path, seen: dict[str, str] | None = None) -> list[Path]:
    """The images under ``folder`` (sub-folders included, symbolic links followed), sorted by
    path: files ending in :data:`IMAGE_EXTENSIONS`, hidden files and folders left out. A
    ValueError naming both paths where a folder is reached twice (a link back to a folder
    above it, or two links to one folder): its images would be read twice, or without end.
    ``seen``: the folders already read (real path: path), shared by the calls that list one
    data set, so that a folder is read once across its classes, splits and clients."""
    found = []
    seen = {} if seen is None else seen
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            raise ValueError(
                f"data.path: {dirpath} is {seen[real]} again (both are {real}, through a "
                "symbolic link): its images would be read twice; remove the link"
            )
        seen[real] = dirpath
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        found += [
            os.path.join(dirpath, f)
            for f in filenames
            if not f.startswith(".") and f.lower().endswith(IMAGE_EXTENSIONS)
        ]
    # sorted as paths are, part by part: as strings whose separator sorts before any other
    # character (no name holds a NUL), faster to sort than Path objects
    return [Path(f) for f in sorted(found, key=lambda f: f.replace(os.sep, "\0"))]


def sub_folders(folder: Path) -> list[Path]:
    """``folder``'s visible sub-folders, sorted by name."""
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def as_colour_image(image: Tensor) -> Tensor:
    """A decoded image (C, H, W) as uint8 with 1 (grey) or 3 (RGB) channels: an alpha channel
    dropped, 16-bit values scaled to 8 bits."""
    if image.dtype != torch.uint8:
        image = F.to_dtype(image, torch.uint8, scale=True)
    return image[:1] if image.shape[0] in (1, 2) else image[:3]


def read_image(path: Path) -> Tensor:
    """The image file ``path``, decoded by torchvision, as uint8 (C, H, W), C 1 or 3 (of an
    animated image, its first frame); a ValueError naming the file if it cannot be decoded."""
    try:
        image = decode_image(str(path), mode=ImageReadMode.UNCHANGED)
    except (RuntimeError, OSError, ValueError) as err:
        first = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise ValueError(f"data.path: {path} is not a readable image ({first})") from err
    if image.ndim == 4:  # an animated GIF's frames (N, C, H, W): its first, as PIL shows it
        image = image[0]
    return as_colour_image(image)


def fit_size(image: Tensor, size: int) -> Tensor:
    """``image`` (C, H, W) resized so that its shorter side is ``size`` (antialiased), then
    centre-cropped to ``size`` x ``size``; an image of that size already is left as it is."""
    if tuple(image.shape[-2:]) == (size, size):
        return image
    return F.center_crop(F.resize(image, size, antialias=True), [size, size])


class SizedImages(Protocol):
    """Images at their own sizes, as many as its length, read as they are iterated."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[LooseImage]: ...


def check_room(
    count: int, channels: int, size: int, free: int | None, room: str = "of memory free here"
) -> None:
    """ValueError naming ``data.image_size`` where ``count`` images of ``channels`` x
    ``size`` x ``size`` uint8 take more than ``free`` bytes (None: unknown), ``room`` saying
    where."""
    needed = count * channels * size * size
    if free is not None and needed > free:
        raise ValueError(
            f"data.image_size={size}: the {count} images at {size}x{size} take "
            f"{needed / 2**30:.1f} GiB as uint8, more than the {free / 2**30:.1f} GiB "
            f"{room}; set a smaller data.image_size"
        )


def not_square(shape: Sequence[int], source: object) -> str:
    """The refusal of an image of ``shape`` (H, W), not square, without ``data.image_size``."""
    return (
        f"data.image_size is needed: the images are {shape[0]}x{shape[1]}, not square "
        f"({source}); set data.image_size to resize and centre-crop them"
    )


def sizes_differ(first: object, size: int, other: object, shape: Sequence[int]) -> str:
    """The refusal of image ``other`` of ``shape`` (H, W) where ``first``, the first image,
    is ``size`` x ``size``, without ``data.image_size``."""
    return (
        f"data.image_size is needed: the images' sizes differ ({first} is {size}x{size}, "
        f"{other} is {shape[0]}x{shape[1]}); set data.image_size"
    )


def uniform_images(
    splits: Mapping[str, SizedImages], image_size: int | None
) -> tuple[dict[str, Tensor], int, int, int]:
    """Every split's images as one uint8 tensor (N, C, H, W): all of one size (``image_size``,
    or the size they all share) and one colour (RGB if any image is, else grey). Each image is
    fitted as it is read (no other is held at its own size), with a progress bar. Returns the
    tensors, the channels, the size and how many grey images were made RGB; a ValueError
    naming ``data.image_size`` (and two images) when the images' sizes differ, or are not
    square, and no ``image_size`` is set, or when they would not fit in memory."""
    total = sum(len(split) for split in splits.values())
    size, first = image_size, ""
    out: dict[str, Tensor] = {}
    channels, grey = 1, 0
    with tqdm(total=total, desc="reading images", unit="img", disable=None) as bar:
        for name, split in splits.items():
            for n, item in enumerate(split):
                shape = tuple(item.image.shape[-2:])
                if size is None:
                    if shape[0] != shape[1]:
                        raise ValueError(not_square(shape, item.source))
                    size, first = shape[0], item.source
                elif image_size is None and shape != (size, size):
                    raise ValueError(sizes_differ(first, size, item.source, shape))
                if not out:
                    check_room(total, channels, size, available_memory())
                if name not in out:
                    out[name] = torch.empty(len(split), channels, size, size, dtype=torch.uint8)
                if item.image.shape[0] == 3 and channels == 1:  # the first in colour: RGB
                    check_room(total, 3, size, available_memory())
                    channels = 3
                    out = {key: images.expand(-1, 3, -1, -1).clone() for key, images in out.items()}
                grey += item.image.shape[0] == 1
                out[name][n] = fit_size(item.image, size).expand(channels, -1, -1)
                bar.update(1)
    if size is None:
        raise ValueError("the data set holds no images")
    for name in splits:
        out.setdefault(name, torch.empty(0, channels, size, size, dtype=torch.uint8))
    return out, channels, size, grey if channels == 3 else 0


Statistics = tuple[tuple[float, ...], tuple[float, ...]]  # (mean, std), one float a channel


def channel_statistics(images: Pixels, *more: Pixels, chunk: int = 4096) -> Statistics:
    """The per-channel mean and standard deviation (sample, as torch's ``std``) of uint8
    ``images`` (N, C, H, W) (and of ``more`` of the same size, taken with them) as pixel
    values in [0, 1]: ``(mean, std)``, each C floats; read a chunk at a time, into one float64
    copy of it (scaled and squared in place, dropped before the next one is made)."""
    total = torch.zeros(images.shape[1], dtype=torch.float64)
    squares = torch.zeros_like(total)
    for part in (images, *more):
        for start in range(0, len(part), chunk):
            x = as_tensor(part[start : start + chunk]).to(torch.float64, copy=True).div_(255)
            total += x.sum(dim=(0, 2, 3))
            squares += x.mul_(x).sum(dim=(0, 2, 3))
            del x  # before the next chunk's copy is made
    n = sum(len(part) for part in (images, *more)) * images.shape[2] * images.shape[3]
    mean = total / n
    var = (squares - n * mean * mean) / max(n - 1, 1)
    std = var.clamp_min(0).sqrt()
    return tuple(mean.tolist()), tuple(std.tolist())


# --- the statistics cache -----------------------------------------------------------------------
def fingerprint(files: Iterable[Path], base: Path, image_size: int | None) -> str:
    """A digest of ``files`` (their paths relative to ``base``, sizes and modification times)
    and ``image_size``: it changes when a file is added, removed, renamed or rewritten."""
    digest = hashlib.sha256(f"v{STATS_VERSION} size={image_size}\n".encode())
    prefix = os.path.join(str(base), "")
    for path in files:
        name = str(path)
        stat = os.stat(name)
        relative = name[len(prefix) :] if name.startswith(prefix) else path.relative_to(base)
        digest.update(f"{relative}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class StatisticsCache:
    """The statistics of one version of the user's files: ``path``, the JSON file, holds them
    under ``key`` (:func:`fingerprint`)."""

    path: Path
    key: str

    def read(self) -> Statistics | None:
        """The cached ``(mean, std)`` if the file holds them for this ``key``, else None."""
        try:
            saved = json.loads(self.path.read_text())
            if saved.get("fingerprint") != self.key:
                return None
            mean, std = tuple(map(float, saved["mean"])), tuple(map(float, saved["std"]))
            if not all(math.isfinite(v) for v in mean + std) or min(std, default=0.0) < 0:
                return None  # a damaged file: measured again, and written right
            return mean, std
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def write(self, mean: Sequence[float], std: Sequence[float]) -> None:
        """Write ``(mean, std)`` under this key (a temporary file renamed into place); a
        folder that cannot be written is left as it is."""
        if self.read() == (tuple(mean), tuple(std)):
            return
        text = json.dumps({"fingerprint": self.key, "mean": list(mean), "std": list(std)})
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        except OSError:
            return
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text + "\n")
            os.chmod(tmp, created_mode())  # the user's umask, not mkstemp's 0o600
            os.replace(tmp, self.path)
        except OSError:
            Path(tmp).unlink(missing_ok=True)


# --- what the data module holds ---------------------------------------------------------------
class ReadImages:
    """A user's data set, read: the :attr:`DatasetSpec.loader` of its spec, which hands back
    its ``train`` and ``test`` splits (and, clients as folders, :attr:`clients`).

    The images live in the process that read them: a pickled copy (what a pool or Ray worker
    receives with the data module, whose clients' shards are already drawn) holds none, so the
    data are not shipped twice; calling it there raises RuntimeError.

    A data set that can be read again (from the image cache: ``reread`` reads a split's
    images, ``train``, ``test`` or :data:`CLIENTS`, from it) is handed over rather than kept:
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
        reread: Callable[[str], Pixels] | None = None,
    ) -> None:
        self._splits: dict[str, Images] | None = dict(splits)
        self._labels = {name: labels for name, (_, labels) in splits.items()}
        self._clients = clients
        self._reread = reread
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
        if self._reread is None:
            return self._splits[split]
        labels = self._labels[split]
        held = self._splits.pop(split, None)  # handed over (see the class)
        return held if held is not None else (self._reread(split), labels)

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
        if self._reread is not None and self.client_names:
            return self._reread(CLIENTS)
        raise RuntimeError("this data set has no clients' folders")

    def hand_over_clients(self) -> Pixels:
        """:attr:`client_images`, handed over where they can be read again (see the class):
        the clients' shards drawn from them are then their only copy."""
        images = self.client_images
        if self._reread is not None:
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
        state["_splits"] = state["_clients"] = state["_reread"] = None
        state["_labels"] = {}
        return state


# --- the four kinds of source -------------------------------------------------------------------
def class_folders(
    split_dir: Path, classes: Sequence[str] | None, seen: dict[str, str] | None = None
) -> list[tuple[int, list[Path]]]:
    """``split_dir``'s class folders as (label, image files); ``classes``: the training
    split's names (None: this is the training split, its folders define them); ``seen``: the
    folders read already (:func:`image_files`). ValueError naming the folder when it is
    missing, holds no class folder, has a class folder without images or one that the
    training split lacks."""
    if not split_dir.is_dir():
        raise ValueError(f"data.path: {split_dir} is missing (a split folder of class folders)")
    folders = sub_folders(split_dir)
    if not folders:
        raise ValueError(f"data.path: {split_dir} holds no class folders")
    if classes is None and len(folders) == 1:
        raise ValueError(
            f"data.path: {split_dir} holds one class folder ({folders[0].name!r}); a classifier "
            "needs at least two classes, a folder each"
        )
    out: list[tuple[int, list[Path]]] = []
    for folder in folders:
        if classes is not None and folder.name not in classes:
            raise ValueError(
                f"data.path: {folder}: class {folder.name!r} is not one of the training "
                f"split's classes {list(classes)}"
            )
        files = image_files(folder, seen)
        if not files:
            raise ValueError(
                f"data.path: {folder} is an empty class folder (no {'/'.join(IMAGE_EXTENSIONS)} "
                "files)"
            )
        label = len(out) if classes is None else list(classes).index(folder.name)
        out.append((label, files))
    return out


def client_folders(
    clients_dir: Path, seen: dict[str, str] | None = None
) -> list[tuple[str, list[Path]]]:
    """The clients' folders under ``clients_dir`` as (name, image files), sorted by name
    (``seen``: the folders read already, :func:`image_files`); ValueError naming the folder
    when it is missing, holds none, or a client's is empty."""
    if not clients_dir.is_dir():
        raise ValueError(f"data.path: {clients_dir} is missing (a folder per client)")
    clients = [(c.name, image_files(c, seen)) for c in sub_folders(clients_dir)]
    if not clients:
        raise ValueError(f"data.path: {clients_dir} holds no client folders")
    for name, files in clients:
        if not files:
            raise ValueError(f"data.path: {clients_dir / name} is an empty client folder")
    return clients


@dataclass(frozen=True)
class FolderListing:
    """A ``folder`` or ``client_folders`` data set's files, listed (no image is read): what
    the checks that need no pixels read (the classes and their sizes, the clients' folders)
    and what is decoded after.

    Attributes:
        kind: ``folder`` or ``client_folders``.
        root: the data set's folder (``data.path``).
        train: the labeled training split's class folders, (label, image files).
        classes: the class names, the training split's folder names, sorted.
        test: the test split's class folders, (label, image files).
        clients: the clients' folders (``client_folders``), (name, image files).
    """

    kind: str
    root: Path
    train: list[tuple[int, list[Path]]]
    classes: tuple[str, ...]
    test: list[tuple[int, list[Path]]]
    clients: list[tuple[str, list[Path]]]

    @property
    def train_labels(self) -> np.ndarray:
        """The training split's labels (N,), int64, in the order its images are read."""
        return np.array([label for label, files in self.train for _ in files], dtype=np.int64)


def list_folders(kind: str, root: Path) -> FolderListing:
    """The files of the ``kind`` data set at ``root`` (see the module's layouts), listed;
    ValueError naming the folder when one is missing or empty, or naming both paths where a
    folder is reached twice (two classes, two clients, the training and the test split, or a
    class and a client being one folder through a symbolic link)."""
    if not root.is_dir():
        raise ValueError(f"data.path: {root} is not a folder (data.dataset={kind!r})")
    train_name, test_name = FOLDER_SPLITS[kind]
    seen: dict[str, str] = {}  # every folder read, across the splits: each is read once
    train = class_folders(root / train_name, None, seen)
    classes = tuple(folder.name for folder in sub_folders(root / train_name))
    test = class_folders(root / test_name, classes, seen)
    clients = client_folders(root / CLIENTS, seen) if kind == "client_folders" else []
    return FolderListing(kind, root, train, classes, test, clients)


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


def _check_labels(
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


def _array_images(value: Any, where: str) -> list[LooseImage]:
    """uint8 images (N, H, W) or (N, H, W, C), C 1 or 3, as :class:`LooseImage` (C, H, W)."""
    x = torch.as_tensor(np.asarray(value)) if not isinstance(value, Tensor) else value
    if x.dtype != torch.uint8:
        raise ValueError(f"{where}: images must be uint8, got {x.dtype}")
    if x.ndim == 3:
        x = x.unsqueeze(-1)
    if x.ndim != 4 or x.shape[-1] not in (1, 3):
        raise ValueError(
            f"{where}: images must be (N, H, W) or (N, H, W, C) with C 1 or 3, got "
            f"shape {tuple(x.shape)}"
        )
    x = x.permute(0, 3, 1, 2)
    return [LooseImage(image, f"{where}[{n}]") for n, image in enumerate(x)]


def _array_labels(value: Any, where: str, count: int) -> Tensor:
    if not isinstance(value, Tensor):
        value = np.asarray(value)
        if value.dtype.kind not in "iub":  # strings, objects: no tensor of them
            raise ValueError(
                f"{where}: labels must be integers of shape (N,), got {value.dtype} of shape "
                f"{tuple(value.shape)} (class names belong in 'classes', labels index them)"
            )
    y = value if isinstance(value, Tensor) else torch.as_tensor(value)
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool or y.ndim != 1:
        raise ValueError(
            f"{where}: labels must be integers of shape (N,), got {y.dtype} "
            f"of shape {tuple(y.shape)}"
        )
    if len(y) != count:
        raise ValueError(f"{where}: {len(y)} labels for {count} images")
    return y.to(torch.int64)


def load_array_file(path: Path) -> dict[str, Any]:
    """The arrays of a ``.npz`` file (no pickled objects) or the dict of a ``.pt`` file
    (``torch.load(weights_only=True)``); ValueError naming the file otherwise."""
    if not path.is_file():
        raise ValueError(f"data.path: {path} is not a file (data.dataset='arrays')")
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as arrays:
                return {key: arrays[key] for key in arrays.files}
        if path.suffix in (".pt", ".pth"):
            loaded = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(loaded, dict):
                raise ValueError(f"holds a {type(loaded).__name__}, not a dict of arrays")
            return loaded
    except MemoryError as err:  # a header that claims more than the machine holds
        raise ValueError(
            f"data.path: {path}: an array it holds is larger than this machine's memory ({err})"
        ) from err
    except (OSError, ValueError, RuntimeError, EOFError, KeyError, pickle.UnpicklingError) as err:
        # pickle: a .pt file holding objects other than tensors (code is never run)
        why = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(f"data.path: {path} cannot be read as arrays ({why})") from err
    raise ValueError(f"data.path: {path}: an array file is a .npz or a .pt file")


def read_arrays(path: Path, image_size: int | None) -> tuple[DatasetSpec, ReadImages]:
    """An ``arrays`` data set: the file ``path`` (see the module's description)."""
    arrays = load_array_file(path)
    missing = [key for key in ARRAY_KEYS if key not in arrays]
    if missing:
        raise ValueError(
            f"data.path: {path} has no {', '.join(missing)} (it holds {sorted(arrays)}; "
            f"an array file holds {', '.join(ARRAY_KEYS)})"
        )
    where = {
        split: f"data.path: {path}: {key}"
        for split, key in (("train", "x_train"), ("test", "x_test"))
    }
    loose = {
        split: _array_images(arrays[f"x_{split}"], where[split]) for split in ("train", "test")
    }
    labels = {
        split: _array_labels(
            arrays[f"y_{split}"], f"data.path: {path}: y_{split}", len(loose[split])
        )
        for split in ("train", "test")
    }
    for split in ("train", "test"):  # an empty test split would score every model 0
        if not loose[split]:
            raise ValueError(f"data.path: {path}: x_{split} holds no images")
    classes = (
        [str(c) for c in np.asarray(arrays["classes"]).tolist()] if "classes" in arrays else None
    )
    num_classes = len(classes) if classes is not None else int(labels["train"].max()) + 1
    _check_labels(
        labels, num_classes, {s: f"data.path: {path}: y_{s}" for s in labels}, classes is not None
    )
    images, channels, size, made_rgb = uniform_images(loose, image_size)
    splits = {split: (images[split], labels[split]) for split in ("train", "test")}
    cache_file = path.with_name(f"{path.name}.fedlit-stats.json")
    stats = StatisticsCache(cache_file, fingerprint([path], path.parent, image_size))
    read = ReadImages(splits, cache=stats, made_rgb=made_rgb)
    spec = user_spec("arrays", read, classes, channels, size, hflip=True, num_classes=num_classes)
    return spec, read


def dataset_image(item: Any, where: str) -> Tensor:
    """A Dataset's image as uint8 (C, H, W), C 1 or 3: a PIL image (grey modes as grey, a
    palette image whose colours are all grey as grey, the others as RGB) or a tensor (C, H, W)
    or (H, W), uint8 or float in [0, 1]."""
    from PIL import Image

    if isinstance(item, Image.Image):
        grey = item.mode in ("1", "L", "LA", "I", "I;16", "F")
        palette = item.mode in ("P", "PA")
        item = F.pil_to_tensor(item.convert("L" if grey else "RGB"))
        if palette and bool((item == item[:1]).all()):
            item = item[:1]  # a palette of greys: grey
    if not isinstance(item, Tensor):
        raise ValueError(
            f"{where}: the image is a {type(item).__name__}, not a tensor or a PIL image"
        )
    if item.ndim == 2:
        item = item.unsqueeze(0)
    if item.ndim != 3 or item.shape[0] not in (1, 2, 3, 4):
        raise ValueError(
            f"{where}: an image tensor is (C, H, W) or (H, W), got {tuple(item.shape)}"
        )
    if item.dtype.is_floating_point:
        if item.numel() and not bool(torch.isfinite(item).all()):
            raise ValueError(f"{where}: a float image holds NaN or an infinite pixel")
        if item.numel() and (float(item.min()) < 0 or float(item.max()) > 1):
            raise ValueError(
                f"{where}: a float image must lie in [0, 1] (not normalised: fedlit normalises "
                f"with the data set's own statistics), got [{float(item.min()):.3g}, "
                f"{float(item.max()):.3g}]"
            )
        item = (item * 255).round().to(torch.uint8)
    elif item.dtype != torch.uint8:
        raise ValueError(f"{where}: an image tensor is uint8 or float in [0, 1], got {item.dtype}")
    return as_colour_image(item)


class UserCodeFailed(Exception):
    """A user's own code (a torch Dataset's ``__len__`` or ``__getitem__``) raised: the
    message names the setting and the item; the user's exception is the ``__cause__``, whose
    traceback the CLI prints after the message."""


class DatasetItems:
    """A torch Dataset's ``(image, label)`` items, read in index order as they are iterated:
    each image once, as a :class:`LooseImage` (none kept here), its label gathered into
    :attr:`labels`. ValueError naming ``key`` (and the item) when it is not a Dataset with a
    length, is empty, or an item is not an image with a label; :class:`UserCodeFailed` when
    its own code raises."""

    def __init__(self, dataset: Any, key: str) -> None:
        if not isinstance(dataset, Dataset) or not hasattr(dataset, "__len__"):
            raise ValueError(
                f"{key}: {type(dataset).__name__} is not a torch Dataset with a length"
            )
        self.dataset, self.key, self.name = dataset, key, type(dataset).__name__
        try:
            self.count = len(dataset)
        except Exception as err:
            raise UserCodeFailed(f"{key}: {self.name}.__len__ raised {type(err).__name__}") from err
        if self.count == 0:
            raise ValueError(f"{key}: the data set is empty")
        self._labels: list[int] = []

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[LooseImage]:
        self._labels = []
        for n in range(self.count):
            where = f"{self.key}[{n}]"
            try:
                item = self.dataset[n]
            except Exception as err:
                raise UserCodeFailed(
                    f"{where}: {self.name}.__getitem__({n}) raised {type(err).__name__}"
                ) from err
            if not isinstance(item, (tuple, list)) or len(item) < 2:
                raise ValueError(f"{where}: an item is (image, label), got {type(item).__name__}")
            label = item[1]
            if isinstance(label, Tensor):
                label = label.item() if label.numel() == 1 else None
            if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
                raise ValueError(f"{where}: the label must be an integer, got {item[1]!r}")
            self._labels.append(int(label))
            yield LooseImage(dataset_image(item[0], where), where)

    @property
    def labels(self) -> Tensor:
        """The labels of the items read (all of them, once iterated), int64 (N,)."""
        return torch.tensor(self._labels, dtype=torch.int64)


def read_torch_datasets(
    train: Any, test: Any, image_size: int | None
) -> tuple[DatasetSpec, ReadImages]:
    """A data set given as two torch Datasets (``data.dataset``, ``data.test_dataset``)."""
    if test is None:
        raise ValueError(
            f"data.test_dataset: data.dataset is a {type(train).__name__}; give its test split "
            "as data.test_dataset (a torch Dataset as well)"
        )
    items = {
        "train": DatasetItems(train, "data.dataset"),
        "test": DatasetItems(test, "data.test_dataset"),
    }
    images, channels, size, made_rgb = uniform_images(items, image_size)
    labels = {split: items[split].labels for split in ("train", "test")}
    names = getattr(train, "classes", None)
    classes = [str(c) for c in names] if isinstance(names, (list, tuple)) and names else None
    num_classes = len(classes) if classes is not None else int(labels["train"].max()) + 1
    where = {"train": "data.dataset", "test": "data.test_dataset"}
    _check_labels(labels, num_classes, where, classes is not None)
    splits = {split: (images[split], labels[split]) for split in ("train", "test")}
    read = ReadImages(splits, None, made_rgb=made_rgb)
    spec = user_spec(type(train).__name__, read, classes, channels, size, True, num_classes)
    return spec, read
