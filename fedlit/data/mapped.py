"""Images read from a memory-mapped array on demand: a split larger than the memory it may take.

A split of the user's cached images (:mod:`fedlit.data.own.cache`) that does not fit its
cap is a :class:`MappedImages` instead of a tensor: indexing it (a shard, a server's set, a
stream's chunk) gives another view of the same file, and only a batch's rows are read
(:meth:`MappedImages.read`), by :class:`~fedlit.data.loaders.ImageBatches`. A copy of it (what
a pool or Ray worker receives) opens the file again rather than carrying its pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor


class MappedImages:
    """uint8 images (N, C, H, W): the rows ``index`` (None: all, in order) of the ``.npy``
    file ``path``, memory-mapped and read a batch at a time."""

    dtype = torch.uint8
    ndim = 4
    device = torch.device("cpu")

    def __init__(
        self, path: Path, index: np.ndarray | None = None, array: np.ndarray | None = None
    ) -> None:
        """``array``: the file already mapped (a view of it shares the mapping)."""
        self.path, self.index = Path(path), index
        self.array = np.load(self.path, mmap_mode="r") if array is None else array
        if self.array.dtype != np.uint8 or self.array.ndim != 4:
            raise ValueError(f"{path}: not uint8 images (N, C, H, W)")

    @property
    def shape(self) -> torch.Size:
        rows = len(self.array) if self.index is None else len(self.index)
        return torch.Size((rows, *self.array.shape[1:]))

    @property
    def nbytes(self) -> int:
        """The bytes the images take once read."""
        return int(np.prod(self.shape))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> MappedImages:
        """The images at ``index`` (a slice, an index or mask array or tensor), still mapped."""
        if isinstance(index, Tensor):
            index = index.cpu().numpy()
        rows = np.arange(len(self.array)) if self.index is None else self.index
        picked = np.asarray(rows[index], dtype=np.int64).reshape(-1)
        return MappedImages(self.path, picked, self.array)  # every batch: no new mapping

    def read(self) -> Tensor:
        """The images as a tensor (read from the file, or the page cache, now)."""
        rows = self.array if self.index is None else self.array[self.index]
        return torch.from_numpy(np.array(rows, dtype=np.uint8, copy=True))

    def __getstate__(self) -> dict[str, Any]:
        """The file and the rows, not the pixels: a copy maps the file again."""
        return {"path": self.path, "index": self.index}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["index"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"MappedImages({str(self.path)!r}, shape={tuple(self.shape)})"


#: A split's images: a tensor, or rows of a memory-mapped file.
Pixels = Tensor | MappedImages


def as_tensor(images: Pixels) -> Tensor:
    """``images`` as a tensor (a mapped set read whole)."""
    return images.read() if isinstance(images, MappedImages) else images


def joined(parts: Sequence[Pixels]) -> Pixels:
    """``parts`` one after the other: rows of one mapped file stay mapped, else a tensor."""
    if parts and all(isinstance(p, MappedImages) for p in parts):
        mapped = [p for p in parts if isinstance(p, MappedImages)]
        if len({p.path for p in mapped}) == 1:
            every = [np.arange(len(p.array)) if p.index is None else p.index for p in mapped]
            return MappedImages(mapped[0].path, np.concatenate(every))
    return torch.cat([as_tensor(p) for p in parts])
