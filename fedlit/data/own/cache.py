"""The user's image files decoded once, in parallel, into a cache at ``data.image_size`` (a
folder data set is read through it by :func:`~fedlit.data.own.folders.read_folders`).

The cache (:class:`ImageCache`) lives under ``data.root``, in ``<data.root>/fedlit-cache/``, beside
the data sets fedlit downloads there: the place a recipe already names for data fedlit writes,
shared by the runs that name it, and one folder to delete to clear it (the user's data folder stays
untouched). A data set's cache is a folder named by its kind, its source (``data.path``: the folder,
or the file that lists the images, so that two listings in one folder keep a cache each) and a
digest of everything that decides its splits' content (:func:`content_key`): each split's files in
the listing's order (their names, sizes and modification times: a changed, added, removed or moved
file is a new cache), their labels (a relabel is a new cache, never stale labels), the image size
and what its writer adds (the clients' folders). So any source that lists files and labels may read
through it. It holds per split ``<split>.npy`` (uint8 images, N, C, S, S), ``<split>-labels.npy``
and ``meta.json``, which holds each file's CRC-32 (:func:`~fedlit.data.own.stored.checksum`, taken
as the cache is written and checked each time a file is read: a file changed since, its header
intact, is not trained on). It is written under a temporary name of its own, while holding
``<cache>/.<name>.lock``, and renamed into place whole: a run that finds it being written waits for
it, a leftover temporary folder (a run killed while writing) is never read and is removed by the
next writer. A second run with the same files, labels and size reads the cache and decodes nothing;
one it cannot read whole (a file missing, cut short, or unlike its checksum, a ``meta.json`` unlike
the data set's splits) is written again, a line saying why. A cache written replaces those it makes
stale: the same kind of data from the same source and size (its files or labels since changed), a
cache of an older version of the same data, and those of data whose source is gone are removed,
unless another run is writing them.

A split that fits its cap (:func:`~fedlit.data.own.stored.stage_limit`:
``FEDLIT_STAGE_LIMIT_BYTES``, else half of the memory free) is read into memory; a larger one
is memory-mapped (:class:`~fedlit.data.mapped.MappedImages`), its batches read from the file
as they are drawn. A split read from the cache is handed over to the draw rather than kept
(:class:`~fedlit.data.own.read.ReadImages`, handed each split's
:class:`~fedlit.data.own.stored.StoredSplit` to read it again): the clients' shards and the
server's sets drawn from it are the only copy of its images a run holds (a later draw reads
the cache again).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock, Timeout
from torch import Tensor
from tqdm import tqdm  # text, also in notebooks (no widget: no ipywidgets needed)

from fedlit.data.mapped import Pixels
from fedlit.data.own.decode import decode_files
from fedlit.data.own.stored import StoredSplit, checked, checksum, npy, stage_limit, written_sum
from fedlit.run_layout import created_mode

#: The cache's folder under ``data.root``.
CACHE_FOLDER = "fedlit-cache"
#: 2: meta.json holds each file's CRC-32; 3: the key holds the labels and the splits' order,
#: meta.json the kind (a cache of version 2 is decoded again once, and removed).
CACHE_VERSION = 3


def content_key(
    stamps: Mapping[str, Sequence[str]],
    labels: Mapping[str, Tensor],
    image_size: int | None,
    extra: Mapping[str, Any],
) -> str:
    """The digest of everything that decides a cache's content: each split of ``stamps``
    (its files' :func:`~fedlit.data.own.statistics.file_stamps`) in order, its size and each
    file's label in ``labels`` (a split may have none), ``image_size`` and ``extra`` (what
    the writer adds to the meta)."""
    digest = hashlib.sha256(f"size={image_size}\n".encode())
    digest.update(f"{json.dumps(extra, sort_keys=True)}\n".encode())
    for split, lines in stamps.items():
        y = labels.get(split)
        marks = ["-"] * len(lines) if y is None else [str(v) for v in y.tolist()]
        if len(marks) != len(lines):
            raise ValueError(f"split {split}: {len(marks)} labels for {len(lines)} files")
        digest.update(f"split {split} {len(lines)}\n".encode())
        for stamp, mark in zip(lines, marks, strict=True):
            digest.update(f"{stamp}\t{mark}\n".encode())
    return digest.hexdigest()


def cache_key(kind: str, path: Path, content: str) -> str:
    """The digest that names a data set's cache: the cache's version, the data set's kind,
    its resolved path and its :func:`content_key`."""
    text = f"fedlit image cache v{CACHE_VERSION}\n{kind}\n{path.resolve()}\n{content}\n"
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class CachedImages:
    """A data set read from its cache: per split, its images (in memory, or mapped where
    larger than :func:`~fedlit.data.own.stored.stage_limit`), labels (None: a split without
    them) and where it is stored (to read it again); the cache's ``meta`` (channels, size,
    the splits' sizes, and what its writer added)."""

    images: dict[str, Pixels]
    labels: dict[str, torch.Tensor | None]
    stored: dict[str, StoredSplit]
    meta: dict[str, Any]


@dataclass(frozen=True)
class ImageCache:
    """The cache of one version of a data set: ``root``/``name``, named by its kind, the
    data's path and :func:`cache_key`; ``source``, the data's path resolved."""

    root: Path
    name: str
    key: str
    source: Path
    kind: str

    @classmethod
    def of(cls, root: Path, kind: str, path: Path, content: str) -> ImageCache:
        """The cache under ``root`` (``<data.root>/fedlit-cache``) of the data set of ``kind``
        at ``path`` whose splits have :func:`content_key` ``content``."""
        key = cache_key(kind, path, content)
        source = path.resolve()
        where = hashlib.sha256(str(source).encode()).hexdigest()[:10]
        return cls(root, f"{kind}-{path.name}-{where}-{key[:16]}", key, source, kind)

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
        stored: dict[str, StoredSplit] = {}
        try:
            for split in counts:
                stored[split] = StoredSplit.of(self.folder, split, meta)
                images[split] = stored[split].load(limit)
                at = self.folder / f"{split}-labels.npy"
                labels[split] = (
                    torch.from_numpy(checked(at, npy(at), written_sum(meta, at.name))).long()
                    if at.is_file()
                    else None
                )
        except (OSError, ValueError, KeyError, TypeError) as err:
            return None, (str(err).strip().splitlines() or [type(err).__name__])[0]
        return CachedImages(images, labels, stored, meta), ""

    def write(
        self,
        splits: Mapping[str, Sequence[Path]],
        labels: Mapping[str, torch.Tensor],
        image_size: int | None,
        extra: dict[str, Any],
    ) -> CachedImages | None:
        """Decode ``splits``' files (:func:`~fedlit.data.own.decode.decode_files`) into the
        cache, with their ``labels`` (a split may have none) and ``extra`` in its meta, and
        read it; a cache another run finished meanwhile is read as it is; one that cannot be
        read whole is written again, a line saying why. None where the cache folder cannot be
        written (the caller decodes into memory)."""
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
        """Remove the caches this one replaces: of the same kind of data from the same source
        and ``image_size`` (its files or labels since changed), of an older version of the same
        data, and of data whose source is gone; another kind's cache of the same files (a
        source that labels them otherwise) stays. A cache another run is writing (its lock
        taken) is left."""
        for folder in self.root.iterdir():
            if folder.name.startswith(".") or folder == self.folder or not folder.is_dir():
                continue
            try:
                meta = json.loads((folder / "meta.json").read_text())
                source = Path(meta["source"])
                same = (
                    source == self.source
                    and meta.get("image_size") == image_size
                    and (meta.get("kind") == self.kind or meta.get("version") != CACHE_VERSION)
                )
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
                "kind": self.kind,
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
