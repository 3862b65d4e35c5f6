"""The user's image folders listed, no image read: what the checks that need no pixels read
(the classes and their sizes, the clients' folders) and what is decoded after; a listing's
images read through the image cache (:func:`read_folders`).

- ``folder`` (``data.path``): ``train/<class>/*`` and ``test/<class>/*``, torchvision's
  ``ImageFolder`` layout: the classes are ``train``'s folder names, sorted (``test`` may lack
  some, never have others); the images are every file under a class folder (sub-folders
  included) whose name ends in one of :data:`IMAGE_EXTENSIONS`, in sorted order.
- ``client_folders`` (``data.path``): ``labeled/<class>/*`` (the server's labeled images),
  ``clients/<client>/*`` (each client's unlabeled images, any number of clients, any sizes,
  clients in sorted order) and ``test/<class>/*``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedlit.data.datasets import DatasetSpec
from fedlit.data.own.cache import ImageCache, content_key
from fedlit.data.own.decode import decode_files
from fedlit.data.own.read import CLIENTS, ReadImages, user_spec
from fedlit.data.own.statistics import StatisticsCache, file_stamps, fingerprint, stats_file

#: The file endings read as images (others, and hidden files, are left alone).
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".webp")
#: The splits of a folder data set, by data set: (the labeled training split, the test split).
FOLDER_SPLITS = {"folder": ("train", "test"), "client_folders": ("labeled", "test")}


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
        source: what ``data.path`` names, where it is not ``root``: the file that lists the
            images (a CSV, say). The image cache and the statistics are named by it, so two
            listings in one folder keep their own.
    """

    kind: str
    root: Path
    train: list[tuple[int, list[Path]]]
    classes: tuple[str, ...]
    test: list[tuple[int, list[Path]]]
    clients: list[tuple[str, list[Path]]]
    source: Path | None = None

    @property
    def path(self) -> Path:
        """The data set's source: :attr:`source`, else :attr:`root`."""
        return self.root if self.source is None else self.source

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


def _labels_of(folders: list[tuple[int, list[Path]]]) -> Tensor:
    return torch.tensor([label for label, files in folders for _ in files], dtype=torch.int64)


def folder_splits(
    listing: FolderListing,
) -> tuple[dict[str, list[Path]], dict[str, Tensor], dict[str, Any]]:
    """What ``listing`` caches: each split's files in order (``train``, ``test`` and the
    clients' images one client after the other), the labels of those that have them, and
    the meta's ``extra`` (the clients' folders and their sizes)."""
    clients = listing.clients
    files = {
        "train": [p for _, files in listing.train for p in files],
        "test": [p for _, files in listing.test for p in files],
        **({CLIENTS: [p for _, files in clients for p in files]} if clients else {}),
    }
    labels = {"train": _labels_of(listing.train), "test": _labels_of(listing.test)}
    return files, labels, {"clients": [[name, len(files)] for name, files in clients]}


def read_folders(
    listing: FolderListing, image_size: int | None, cache_root: Path | None = None
) -> tuple[DatasetSpec, ReadImages]:
    """A data set of image files, as ``listing`` lists them (a ``folder`` or
    ``client_folders`` data set, or any listing of files and labels), its images decoded
    once into the cache under ``cache_root`` (:class:`~fedlit.data.own.cache.ImageCache`,
    named by the listing's source and keyed by the files, their labels and order: read from it
    after) or, None (or a cache that cannot be written), into memory."""
    kind, root, clients, source = listing.kind, listing.root, listing.clients, listing.path
    files, labels, extra = folder_splits(listing)
    stamps = {split: file_stamps(names, root) for split, names in files.items()}
    key = fingerprint((), root, image_size, [s for split in stamps.values() for s in split])
    cached = None
    if cache_root is not None:
        cache = ImageCache.of(
            cache_root, kind, source, content_key(stamps, labels, image_size, extra)
        )
        counts = {split: len(names) for split, names in files.items()}
        cached = cache.read(counts) or cache.write(files, labels, image_size, extra)
    if cached is not None:
        images = cached.images
        channels, size = int(cached.meta["channels"]), int(cached.meta["size"])
        made_rgb = int(cached.meta.get("made_rgb", 0))
    else:
        decoded = decode_files(files, image_size)
        images = {split: torch.from_numpy(array) for split, array in decoded.arrays.items()}
        channels, size, made_rgb = decoded.channels, decoded.size, decoded.made_rgb
    splits = {"train": (images["train"], labels["train"]), "test": (images["test"], labels["test"])}
    read = ReadImages(
        splits,
        images.get(CLIENTS),
        [name for name, _ in clients],
        [len(files) for _, files in clients],
        StatisticsCache(stats_file(source), key),
        made_rgb=made_rgb,
        stored=None if cached is None else cached.stored,  # read again where handed over
    )
    spec = user_spec(kind, read, listing.classes, channels, size, hflip=True)
    return spec, read
