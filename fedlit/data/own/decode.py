"""The user's images decoded and fitted to one size and one colour.

Image files are decoded by torchvision (:func:`torchvision.io.decode_image`: PNG, JPEG, GIF,
WebP). Grey or RGB is detected: the data set is RGB (3 channels) if any image is in colour,
its grey images then repeated to three channels; else grey (1 channel). An alpha channel is
dropped, 16-bit images are scaled to 8 bits. With ``data.image_size=S`` every image is resized
so that its shorter side is S (antialiased), then centre-cropped to S x S; without it, all
images must be one square size.

Images already in memory (an array file's, a torch Dataset's) are fitted one at a time
(:func:`uniform_images`); image files are decoded in parallel (:func:`decode_files`), in a
DataLoader's worker processes (one a core, or ``FEDLIT_DECODE_WORKERS``; processes, not
threads: torchvision's decoder holds the GIL on small images), a chunk of images at a time,
with a progress bar, straight into one uint8 array per split (in memory, or the image cache's
files): no image is held at its own size longer than it takes to fit it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional as F
from tqdm import tqdm  # text, also in notebooks (no widget: no ipywidgets needed)

from fedlit.machine import available_cores, available_memory, positive_env

#: The processes that decode images (default: one per core this process may use).
WORKERS_ENV = "FEDLIT_DECODE_WORKERS"
#: The bytes of fitted images a worker decodes at once (up to 1,024 images): larger chunks
#: spread a worker's fixed cost per chunk (its hand-over to this process) over more images.
CHUNK_BYTES = 8 * 2**20


@dataclass(frozen=True)
class LooseImage:
    """One image still at its own size: (C, H, W) uint8, C 1 or 3, and where it came from."""

    image: Tensor
    source: str


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


# --- image files, decoded in parallel -----------------------------------------------------------
def decode_workers() -> int:
    """The processes decoding images: ``FEDLIT_DECODE_WORKERS``, else the cores this
    process may use (1: this process alone)."""
    given = positive_env(WORKERS_ENV)
    return given if given is not None else available_cores()


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
