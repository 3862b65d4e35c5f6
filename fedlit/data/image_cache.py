"""The user's image files decoded once, in parallel, into a cache at ``data.image_size``.

Decoding (:func:`decode_files`) reads each image and fits it to the data set's size on its own,
in a DataLoader's worker processes (one a core, or ``FEDLIT_DECODE_WORKERS``; processes, not
threads: torchvision's decoder holds the GIL on small images), a chunk of images at a time, with
a progress bar, straight into one uint8 array per split: no image is held at its own size
longer than it takes to fit it.

The cache (:class:`ImageCache`) lives under ``data.root``, in ``<data.root>/fedlit-cache/``,
beside the data sets fedlit downloads there: the place a recipe already names for data fedlit
writes, shared by the runs that name it, and one folder to delete to clear it (the user's
data folder stays untouched). A data set's cache is a folder named by its kind, its path and a
digest of its files (their names, sizes and modification times: a changed, added or removed
file is a new cache) and of the image size, holding per split ``<split>.npy`` (uint8
images, N, C, S, S), ``<split>-labels.npy`` and ``meta.json``, which holds each file's CRC-32
(:func:`checksum`, taken as the cache is written and checked each time a file is read: a
file changed since, its header intact, is not trained on). It is written under a temporary
name of its own, while holding ``<cache>/.<name>.lock``, and renamed into place whole: a run
that finds it being written waits for it, a leftover temporary folder (a run killed while
writing) is never read and is removed by the next writer. A second run with the same files
and size reads the cache and decodes nothing; one it cannot read whole (a file missing,
cut short, or unlike its checksum, a ``meta.json`` unlike the data set's splits) is written
again, a line saying why. A cache written replaces those it makes stale:
the same data's at the same size (its files since changed) and those of data whose folder is
gone are removed, unless another run is writing them.

A split that fits its cap (:func:`stage_limit`: ``FEDLIT_STAGE_LIMIT_BYTES``, else half of
the memory free) is read into memory; a larger one is memory-mapped
(:class:`~fedlit.data.mapped.MappedImages`), its batches read from the file as they are drawn.
A split read from the cache is handed over to the draw rather than kept
(:class:`~fedlit.data.user_data.ReadImages`): the clients' shards and the server's sets drawn
from it are the only copy of its images a run holds (a later draw reads the cache again).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from filelock import FileLock, Timeout
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm  # text, also in notebooks (no widget: no ipywidgets needed)

from fedlit.data.datasets import DatasetSpec
from fedlit.data.mapped import MappedImages, Pixels
from fedlit.data.user_data import (
    CLIENTS,
    STATS_FILE,
    FolderListing,
    ReadImages,
    StatisticsCache,
    available_cores,
    available_memory,
    check_room,
    fingerprint,
    fit_size,
    not_square,
    read_image,
    sizes_differ,
    user_spec,
)
from fedlit.run_layout import created_mode

#: The cache's folder under ``data.root``.
CACHE_FOLDER = "fedlit-cache"
CACHE_VERSION = 2  # 2: meta.json holds each file's CRC-32
#: Bytes a split of the user's cached images may take in memory; a larger one is mapped.
STAGE_LIMIT_ENV = "FEDLIT_STAGE_LIMIT_BYTES"
#: The processes that decode images (default: one per core this process may use).
WORKERS_ENV = "FEDLIT_DECODE_WORKERS"
#: The bytes of fitted images a worker decodes at once (up to 1,024 images): larger chunks
#: spread a worker's fixed cost per chunk (its hand-over to this process) over more images.
CHUNK_BYTES = 8 * 2**20


def _positive_env(name: str) -> int | None:
    """The positive integer in environment variable ``name``, None where unset; ValueError
    naming it otherwise."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={text!r}: give a positive integer")
    return value


def decode_workers() -> int:
    """The processes decoding images: ``FEDLIT_DECODE_WORKERS``, else the cores this
    process may use (1: this process alone)."""
    given = _positive_env(WORKERS_ENV)
    return given if given is not None else available_cores()


def stage_limit() -> int | None:
    """Bytes a cached split may take in memory (``FEDLIT_STAGE_LIMIT_BYTES``, else half of
    the memory free now); None: no limit known."""
    given = _positive_env(STAGE_LIMIT_ENV)
    if given is not None:
        return given
    free = available_memory()
    return None if free is None else free // 2


@dataclass(frozen=True)
class Decoded:
    """Images decoded and fitted: per split, a uint8 array (N, C, S, S); C and S; how many
    grey images were made RGB (C 3: the other images are in colour)."""

    arrays: dict[str, np.ndarray]
    channels: int
    size: int
    made_rgb: int = 0


def _first_size(path: Path) -> int:
    """The side of the square image ``path``: the size every image must have without
    ``data.image_size`` (ValueError naming the key when it is not square)."""
    image = read_image(path)
    h, w = image.shape[-2:]
    if h != w:
        raise ValueError(not_square((h, w), path))
    return int(h)


def decode_files(
    splits: Mapping[str, Sequence[Path]], image_size: int | None, folder: Path | None = None
) -> Decoded:
    """Every split's image files decoded and fitted to ``image_size`` (None: the size they
    all share, square), each on its own, in :func:`decode_workers` worker processes (a
    DataLoader's: :class:`_Decoder`), into ``folder``
    (``<split>.npy`` files) or memory. RGB if any image is in colour, else grey. ValueError
    naming the file (or ``data.image_size``) for an unreadable image or, without
    ``image_size``, one of another size."""
    every = [(name, n, p) for name, files in splits.items() for n, p in enumerate(files)]
    first = every[0][2]
    size = image_size if image_size is not None else _first_size(first)
    if folder is None:
        check_room(len(every), 3, size, available_memory())
    else:
        free = shutil.disk_usage(folder).free
        check_room(len(every), 3, size, free, f"free on disk at {folder.parent}")
    wide: dict[str, np.ndarray] = {}
    for name, files in splits.items():
        shape = (len(files), 3, size, size)
        wide[name] = (
            np.lib.format.open_memmap(
                folder / f".{name}-rgb.npy", mode="w+", dtype=np.uint8, shape=shape
            )
            if folder is not None
            else np.empty(shape, dtype=np.uint8)
        )

    workers = decode_workers()
    even = -(-len(every) // (8 * workers))  # at least 8 chunks a worker, to share them evenly
    per_chunk = max(1, min(1024, even, CHUNK_BYTES // (3 * size * size)))
    chunks = [every[k : k + per_chunk] for k in range(0, len(every), per_chunk)]
    workers = min(workers, len(chunks))
    targets = None if folder is None else {name: folder / f".{name}-rgb.npy" for name in wide}
    decoder = _Decoder(chunks, size, image_size, targets)
    loader = DataLoader(
        decoder,
        batch_size=None,
        num_workers=workers if workers > 1 else 0,
        worker_init_fn=_one_thread,
    )
    grey = 0
    with tqdm(total=len(every), desc="decoding images", unit="img", disable=None) as bar:
        for chunk, (error, chunk_grey, images) in zip(chunks, loader, strict=True):
            if error:
                raise ValueError(error)
            if targets is None:  # handed back: into memory here
                for (name, n, _), image in zip(chunk, images.numpy(), strict=True):
                    wide[name][n] = image
            grey += chunk_grey
            bar.update(len(chunk))
    decoder.close()
    channels = 1 if grey == len(every) else 3
    arrays = {name: _narrowed(array, channels, folder, name) for name, array in wide.items()}
    return Decoded(arrays, channels, size, grey if channels == 3 else 0)


class _Decoder(Dataset):
    """Chunks of image files, ``(split, n, path)`` each, item k the k-th decoded and fitted to
    ``size``: (an error's message or "", how many are grey, their images (n, 3, S, S) uint8,
    grey ones repeated), the images written into ``targets``, each split's (N, 3, S, S) ``.npy``
    file, where given (none handed back: nothing crosses between the processes but counts)
    and else handed back. Read by a DataLoader whose worker processes decode on every core:
    torchvision's decoder holds the GIL on small images, so threads would not (a 28x28 PNG
    decoded on two threads took longer than on one). ``image_size`` None: every image must
    be ``size`` already."""

    def __init__(
        self,
        chunks: list[list[tuple[str, int, Path]]],
        size: int,
        image_size: int | None,
        targets: dict[str, Path] | None,
    ) -> None:
        self.chunks, self.size, self.image_size, self.targets = chunks, size, image_size, targets
        self._mapped: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.chunks)

    def close(self) -> None:
        """Let go of the split files this process mapped (decoding in this process)."""
        self._mapped.clear()

    def _target(self, split: str) -> np.ndarray:
        assert self.targets is not None
        if split not in self._mapped:  # once a worker
            self._mapped[split] = np.load(self.targets[split], mmap_mode="r+")
        return self._mapped[split]

    def __getitem__(self, k: int) -> tuple[str, int, Tensor]:
        chunk = self.chunks[k]
        out = np.empty(
            (len(chunk) if self.targets is None else 0, 3, self.size, self.size), np.uint8
        )
        grey = 0
        for i, (split, n, path) in enumerate(chunk):
            try:
                image = read_image(path)
            except ValueError as err:  # a message for the main process to raise
                return str(err), 0, torch.empty(0)
            if self.image_size is None and tuple(image.shape[-2:]) != (self.size, self.size):
                first = self.chunks[0][0][2]
                return sizes_differ(first, self.size, path, image.shape[-2:]), 0, torch.empty(0)
            image = fit_size(image, self.size)
            grey += image.shape[0] == 1
            pixels = image.numpy()  # a grey image broadcast to three channels
            if self.targets is None:
                out[i] = pixels
            else:
                self._target(split)[n] = pixels
        for mapped in self._mapped.values():
            mapped.flush()  # type: ignore[attr-defined]
        return "", grey, torch.from_numpy(out)


def _one_thread(worker: int) -> None:
    """A decoding worker's torch runs on one thread (the workers share the cores)."""
    torch.set_num_threads(1)


def _narrowed(wide: np.ndarray, channels: int, folder: Path | None, name: str) -> np.ndarray:
    """``wide`` (N, 3, S, S) as ``channels`` channels (grey: the first), written to
    ``folder/<name>.npy`` where given: RGB, the wide file renamed; grey, its first channel
    copied a chunk at a time and the wide file removed."""
    if folder is None:
        return wide if channels == 3 else np.ascontiguousarray(wide[:, :1])
    if isinstance(wide, np.memmap):
        wide.flush()
    if channels == 3:  # the wide file is the split's file already
        os.rename(folder / f".{name}-rgb.npy", folder / f"{name}.npy")
        return wide
    shape = (len(wide), channels, *wide.shape[2:])
    out = np.lib.format.open_memmap(folder / f"{name}.npy", mode="w+", dtype=np.uint8, shape=shape)
    for start in range(0, len(wide), 4096):
        out[start : start + 4096] = wide[start : start + 4096, :channels]
    out.flush()
    del wide
    (folder / f".{name}-rgb.npy").unlink()
    return out


def checksum(array: np.ndarray) -> int:
    """The CRC-32 of ``array``'s bytes in C order: the check of a cached file's content
    (several GB a second; a mapped file is read through its mapping, not copied)."""
    return zlib.crc32(np.ascontiguousarray(array).data)


def cache_key(kind: str, path: Path, fingerprint: str) -> str:
    """The digest that names a data set's cache: its kind, its resolved path and its files'
    :func:`~fedlit.data.user_data.fingerprint` (the image size in it)."""
    text = f"fedlit image cache v{CACHE_VERSION}\n{kind}\n{path.resolve()}\n{fingerprint}\n"
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class CachedImages:
    """A data set read from its cache: per split, its images (in memory, or mapped where
    larger than :func:`stage_limit`) and labels (None: a split without them); the cache's
    ``meta`` (channels, size, the splits' sizes, and what its writer added)."""

    images: dict[str, Pixels]
    labels: dict[str, torch.Tensor | None]
    meta: dict[str, Any]


@dataclass(frozen=True)
class ImageCache:
    """The cache of one version of a data set: ``root``/``name``, named by its kind, the
    data's path and :func:`cache_key`; ``source``, the data's path resolved."""

    root: Path
    name: str
    key: str
    source: Path

    @classmethod
    def of(cls, root: Path, kind: str, path: Path, fingerprint: str) -> ImageCache:
        """The cache under ``root`` (``<data.root>/fedlit-cache``) of the data set of ``kind``
        at ``path`` whose files have ``fingerprint``."""
        key = cache_key(kind, path, fingerprint)
        source = path.resolve()
        where = hashlib.sha256(str(source).encode()).hexdigest()[:10]
        return cls(root, f"{kind}-{path.name}-{where}-{key[:16]}", key, source)

    @property
    def folder(self) -> Path:
        return self.root / self.name

    def _meta(self) -> dict[str, Any] | None:
        try:
            meta = json.loads((self.folder / "meta.json").read_text())
        except (OSError, ValueError):
            return None
        ok = isinstance(meta, dict) and meta.get("key") == self.key
        return meta if ok and meta.get("version") == CACHE_VERSION else None

    def read(self, counts: Mapping[str, int]) -> CachedImages | None:
        """The cached data set of the splits ``counts`` names, as many images each, or None
        where there is none whole (or it cannot be read)."""
        return self._load(counts)[0]

    def _load(self, counts: Mapping[str, int]) -> tuple[CachedImages | None, str]:
        """:meth:`read`'s data set and "", or None and why the cache cannot be read ("":
        there is none)."""
        if not self.folder.is_dir():
            return None, ""
        meta = self._meta()
        if meta is None:
            return None, "its meta.json is missing or unreadable"
        if meta.get("splits") != dict(counts):
            return None, f"its splits are {meta.get('splits')}, the data set's {dict(counts)}"
        limit = stage_limit()
        images: dict[str, Pixels] = {}
        labels: dict[str, torch.Tensor | None] = {}
        try:
            for split in counts:
                images[split] = self._images(split, limit, meta)
                at = self.folder / f"{split}-labels.npy"
                labels[split] = (
                    torch.from_numpy(_checked(at, _npy(at), meta)).long() if at.is_file() else None
                )
        except (OSError, ValueError, KeyError, TypeError) as err:
            return None, (str(err).strip().splitlines() or [type(err).__name__])[0]
        return CachedImages(images, labels, meta), ""

    def _images(self, split: str, limit: int | None, meta: dict[str, Any]) -> Pixels:
        """Split ``split``'s images, of the shape ``meta`` gives and matching their checksum:
        read into memory, or mapped where over ``limit``; ValueError naming the file else."""
        path = self.folder / f"{split}.npy"
        mapped = MappedImages(path, array=_npy(path, "r"))
        side = meta["size"]
        shape = (meta["splits"][split], meta["channels"], side, side)
        if tuple(mapped.shape) != shape:
            raise ValueError(f"{path.name} holds {tuple(mapped.shape)}, its meta.json {shape}")
        if limit is not None and mapped.nbytes > limit:
            _checked(path, mapped.array, meta)
            return mapped
        return torch.from_numpy(_checked(path, _npy(path), meta))

    def read_again(self, split: str) -> Pixels:
        """Split ``split``'s images read again (a data set read from the cache hands its
        splits over to the draw, :class:`~fedlit.data.user_data.ReadImages`); RuntimeError
        naming the cache where it is no longer whole."""
        why = "it is gone or another version"
        meta = self._meta()
        if meta is not None:
            try:
                return self._images(split, stage_limit(), meta)
            except (OSError, ValueError, KeyError, TypeError) as err:
                why = str(err)
        raise RuntimeError(
            f"the image cache {self.folder} cannot be read again ({why}): it was removed or "
            "changed while the data module used it; make the data module again"
        )

    def write(
        self,
        splits: Mapping[str, Sequence[Path]],
        labels: Mapping[str, torch.Tensor],
        image_size: int | None,
        extra: dict[str, Any],
    ) -> CachedImages | None:
        """Decode ``splits``' files (:func:`decode_files`) into the cache, with their
        ``labels`` (a split may have none) and ``extra`` in its meta, and read it; a cache
        another run finished meanwhile is read as it is; one that cannot be read whole is
        written again, a line saying why. None where the cache folder cannot be written (the
        caller decodes into memory)."""
        counts = {split: len(files) for split, files in splits.items()}
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            lock = FileLock(self.root / f".{self.name}.lock")
            lock.acquire()
        except OSError:
            return None
        try:
            found, why = self._load(counts)
            if found is not None:
                return found
            if why:
                tqdm.write(
                    f"note: the image cache {self.folder} cannot be read ({why}): decoding "
                    "the images again",
                    file=sys.stderr,
                )
            self._build(splits, labels, image_size, extra)
            self._prune(image_size)
        except OSError:
            return None
        finally:
            lock.release()
        return self.read(counts)

    def _prune(self, image_size: int | None) -> None:
        """Remove the caches this one replaces: of the same data at the same ``image_size``
        (its files since changed, added or removed), and of data whose folder is gone. A
        cache another run is writing (its lock taken) is left."""
        for folder in self.root.iterdir():
            if folder.name.startswith(".") or folder == self.folder or not folder.is_dir():
                continue
            try:
                meta = json.loads((folder / "meta.json").read_text())
                source = Path(meta["source"])
                same = source == self.source and meta.get("image_size") == image_size
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not a cache this version wrote: left as it is
            if not (same or not source.exists()):
                continue
            lock = FileLock(self.root / f".{folder.name}.lock")
            try:
                lock.acquire(timeout=0)
            except (Timeout, OSError):
                continue
            try:
                shutil.rmtree(folder, ignore_errors=True)
            finally:
                lock.release()
            Path(lock.lock_file).unlink(missing_ok=True)

    def _build(
        self,
        splits: Mapping[str, Sequence[Path]],
        labels: Mapping[str, torch.Tensor],
        image_size: int | None,
        extra: dict[str, Any],
    ) -> None:
        """Write the cache under a temporary name and rename it into place (the lock held)."""
        for stale in self.root.glob(f".{self.name}.tmp-*"):  # a writer that was killed
            shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(self.folder, ignore_errors=True)  # a damaged one
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.name}.tmp-", dir=self.root))
        try:
            decoded = decode_files(splits, image_size, tmp)
            sums = {f"{split}.npy": checksum(array) for split, array in decoded.arrays.items()}
            for split, y in labels.items():
                ys = y.numpy().astype(np.int64)
                np.save(tmp / f"{split}-labels.npy", ys)
                sums[f"{split}-labels.npy"] = checksum(ys)
            meta = {
                "version": CACHE_VERSION,
                "key": self.key,
                "channels": decoded.channels,
                "size": decoded.size,
                "made_rgb": decoded.made_rgb,
                "source": str(self.source),
                "image_size": image_size,
                "splits": {split: len(files) for split, files in splits.items()},
                "crc32": sums,
                **extra,
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
            mode = created_mode()
            for file in tmp.iterdir():
                os.chmod(file, mode)
            os.chmod(tmp, mode | (mode & 0o444) >> 2)  # a folder: searchable where readable
            os.rename(tmp, self.folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _npy(path: Path, mmap_mode: Literal["r"] | None = None) -> np.ndarray:
    """The cache's file ``path`` (mapped with ``mmap_mode``); ValueError naming it where numpy
    cannot read it (EOFError: an empty file)."""
    try:
        return np.load(path, mmap_mode=mmap_mode)
    except (ValueError, EOFError) as err:
        raise ValueError(f"{path.name}: {err}") from err


def _checked(path: Path, array: np.ndarray, meta: dict[str, Any]) -> np.ndarray:
    """``array``, read from the cache's file ``path``, if its :func:`checksum` is the one
    ``meta`` holds for it; ValueError naming the file else (changed since it was written)."""
    sums = meta.get("crc32")
    written = sums.get(path.name) if isinstance(sums, dict) else None
    if written is None:
        raise ValueError(f"{path.name} has no checksum in its meta.json")
    if checksum(array) != written:
        raise ValueError(f"{path.name}: its checksum is not the one written with it")
    return array


def _labels_of(folders: list[tuple[int, list[Path]]]) -> Tensor:
    return torch.tensor([label for label, files in folders for _ in files], dtype=torch.int64)


def read_folders(
    listing: FolderListing, image_size: int | None, cache_root: Path | None = None
) -> tuple[DatasetSpec, ReadImages]:
    """A ``folder`` or ``client_folders`` data set, as ``listing`` lists its files, its
    images decoded once into the cache under ``cache_root``
    (:class:`~fedlit.data.image_cache.ImageCache`, read from it after) or, None (or a cache
    that cannot be written), into memory."""
    kind, root, clients = listing.kind, listing.root, listing.clients
    files = {
        "train": [p for _, files in listing.train for p in files],
        "test": [p for _, files in listing.test for p in files],
        **({CLIENTS: [p for _, files in clients for p in files]} if clients else {}),
    }
    labels = {"train": _labels_of(listing.train), "test": _labels_of(listing.test)}
    every_file = [p for split in files.values() for p in split]
    key = fingerprint(every_file, root, image_size)
    cached, reread = None, None
    if cache_root is not None:
        cache = ImageCache.of(cache_root, kind, root, key)
        extra = {"clients": [[name, len(files)] for name, files in clients]}
        counts = {split: len(names) for split, names in files.items()}
        cached = cache.read(counts) or cache.write(files, labels, image_size, extra)
        if cached is not None:  # read again where handed over (see ReadImages)
            reread = cache.read_again
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
        StatisticsCache(root / STATS_FILE, key),
        made_rgb=made_rgb,
        reread=reread,
    )
    spec = user_spec(kind, read, listing.classes, channels, size, hflip=True)
    return spec, read
