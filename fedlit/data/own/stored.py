"""A split the image cache stored, read back: its images in memory, or memory-mapped where
larger than they may take, each file's bytes checked against the CRC-32 taken as it was
written (:func:`checksum`), so that a file changed since, its header intact, is not trained
on.

:class:`StoredSplit` is all that reading a split again needs (its file, its shape, its
checksum): the cache (:mod:`fedlit.data.own.cache`) hands it to the data set read
(:class:`~fedlit.data.own.read.ReadImages`), which reads a split handed over to the draw again
from it, without calling back into the cache.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from fedlit.data.mapped import MappedImages, Pixels
from fedlit.machine import available_memory, positive_env

#: Bytes a split of the user's cached images may take in memory; a larger one is mapped.
STAGE_LIMIT_ENV = "FEDLIT_STAGE_LIMIT_BYTES"


def stage_limit() -> int | None:
    """Bytes a cached split may take in memory (``FEDLIT_STAGE_LIMIT_BYTES``, else half of
    the memory free now); None: no limit known."""
    given = positive_env(STAGE_LIMIT_ENV)
    if given is not None:
        return given
    free = available_memory()
    return None if free is None else free // 2


def checksum(array: np.ndarray) -> int:
    """The CRC-32 of ``array``'s bytes in C order: the check of a cached file's content
    (a mapped file is read through its mapping, not copied)."""
    return zlib.crc32(np.ascontiguousarray(array).data)


def npy(path: Path, mmap_mode: Literal["r"] | None = None) -> np.ndarray:
    """The cache's file ``path`` (mapped with ``mmap_mode``); ValueError naming it where numpy
    cannot read it (EOFError: an empty file)."""
    try:
        return np.load(path, mmap_mode=mmap_mode)
    except (ValueError, EOFError) as err:
        raise ValueError(f"{path.name}: {err}") from err


def checked(path: Path, array: np.ndarray, written: int | None) -> np.ndarray:
    """``array``, read from the cache's file ``path``, if its :func:`checksum` is
    ``written``, the one taken as it was written; ValueError naming the file else (None: its
    meta.json holds none)."""
    if written is None:
        raise ValueError(f"{path.name} has no checksum in its meta.json")
    if checksum(array) != written:
        raise ValueError(f"{path.name}: its checksum is not the one written with it")
    return array


def written_sum(meta: dict[str, Any], name: str) -> int | None:
    """The checksum a cache's ``meta`` (its meta.json) holds for its file ``name``, or None."""
    sums = meta.get("crc32")
    return sums.get(name) if isinstance(sums, dict) else None


@dataclass(frozen=True)
class StoredSplit:
    """Split ``split``'s images as a cache stored them: ``folder/<split>.npy``, uint8 of
    ``shape`` (N, C, S, S), whose bytes have CRC-32 ``crc32`` (None: not recorded)."""

    folder: Path
    split: str
    shape: tuple[int, ...]
    crc32: int | None

    @classmethod
    def of(cls, folder: Path, split: str, meta: dict[str, Any]) -> StoredSplit:
        """Split ``split`` of the cache ``folder`` whose meta.json holds ``meta`` (KeyError or
        TypeError where it does not describe the split)."""
        side = meta["size"]
        shape = (int(meta["splits"][split]), int(meta["channels"]), int(side), int(side))
        return cls(folder, split, shape, written_sum(meta, f"{split}.npy"))

    @property
    def path(self) -> Path:
        return self.folder / f"{self.split}.npy"

    def load(self, limit: int | None) -> Pixels:
        """The images, of :attr:`shape` and matching :attr:`crc32`: read into memory, or
        mapped where over ``limit`` bytes; ValueError naming the file else."""
        mapped = MappedImages(self.path, array=npy(self.path, "r"))
        if tuple(mapped.shape) != self.shape:
            raise ValueError(
                f"{self.path.name} holds {tuple(mapped.shape)}, its meta.json {self.shape}"
            )
        if limit is not None and mapped.nbytes > limit:
            checked(self.path, mapped.array, self.crc32)
            return mapped
        return torch.from_numpy(checked(self.path, npy(self.path), self.crc32))

    def read_again(self) -> Pixels:
        """The images read again (:meth:`load` under :func:`stage_limit`); RuntimeError
        naming the cache where the file is no longer the one stored."""
        try:
            if not self.path.is_file():
                raise ValueError(f"{self.path.name} is gone")
            return self.load(stage_limit())
        except (OSError, ValueError) as err:
            why = str(err)
        raise RuntimeError(
            f"the image cache {self.folder} cannot be read again ({why}): it was removed or "
            "changed while the data module used it; make the data module again"
        )
