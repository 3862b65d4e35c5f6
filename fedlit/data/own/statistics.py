"""The normalisation statistics of the user's images, measured once and cached beside them.

The statistics (per-channel mean and standard deviation of the training images, pixel values
in [0, 1]; a folder of clients: the labeled and the clients' images) are computed once and
cached beside the data, in a small JSON file (:data:`STATS_FILE` in the folder,
``<file>.fedlit-stats.json`` beside an array file), under a fingerprint of the files (their
names, sizes and modification times) and the image size, so that a changed folder is
recomputed. It is the only file fedlit writes there
(:meth:`~fedlit.data.own.read.ReadImages.save_statistics`, once a run's checks have passed);
a folder that cannot be written is read all the same.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fedlit.data.mapped import Pixels, as_tensor
from fedlit.run_layout import created_mode

#: The statistics cache's name inside a folder data set.
STATS_FILE = "fedlit-stats.json"


def stats_file(source: Path) -> Path:
    """Where the statistics of the data at ``source`` are cached: :data:`STATS_FILE` in a
    folder, ``<file>.fedlit-stats.json`` beside a file."""
    if source.is_dir():
        return source / STATS_FILE
    return source.with_name(f"{source.name}.fedlit-stats.json")


STATS_VERSION = 1


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
def file_stamps(files: Iterable[Path], base: Path) -> list[str]:
    """Each of ``files`` as one line: its path relative to ``base``, its size and its
    modification time, tab-separated (what :func:`fingerprint` and the image cache's key
    digest: a line changes when its file is renamed or rewritten)."""
    prefix = os.path.join(str(base), "")
    stamps = []
    for path in files:
        name = str(path)
        stat = os.stat(name)
        relative = name[len(prefix) :] if name.startswith(prefix) else path.relative_to(base)
        stamps.append(f"{relative}\t{stat.st_size}\t{stat.st_mtime_ns}")
    return stamps


def fingerprint(
    files: Iterable[Path], base: Path, image_size: int | None, stamps: Sequence[str] = ()
) -> str:
    """A digest of ``files`` (their :func:`file_stamps` relative to ``base``, or ``stamps``
    where given) and ``image_size``: it changes when a file is added, removed, renamed or
    rewritten."""
    digest = hashlib.sha256(f"v{STATS_VERSION} size={image_size}\n".encode())
    for stamp in stamps or file_stamps(files, base):
        digest.update(f"{stamp}\n".encode())
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
