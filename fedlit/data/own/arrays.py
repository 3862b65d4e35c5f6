"""An ``arrays`` data set: one ``.npz`` file, or a ``.pt`` file loaded with
``torch.load(weights_only=True)`` holding a dict, with ``x_train``, ``y_train``, ``x_test``,
``y_test``: uint8 images (N, H, W) or (N, H, W, C), C 1 or 3, and integer labels; an optional
``classes`` names the classes (else there are ``max(y_train) + 1``). Its statistics are
cached beside the file, in ``<file>.fedlit-stats.json``."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedlit.data.datasets import DatasetSpec
from fedlit.data.own.decode import LooseImage, uniform_images
from fedlit.data.own.read import ReadImages, check_labels, user_spec
from fedlit.data.own.statistics import StatisticsCache, fingerprint, stats_file

ARRAY_KEYS = ("x_train", "y_train", "x_test", "y_test")


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
    check_labels(
        labels, num_classes, {s: f"data.path: {path}: y_{s}" for s in labels}, classes is not None
    )
    images, channels, size, made_rgb = uniform_images(loose, image_size)
    splits = {split: (images[split], labels[split]) for split in ("train", "test")}
    stats = StatisticsCache(stats_file(path), fingerprint([path], path.parent, image_size))
    read = ReadImages(splits, cache=stats, made_rgb=made_rgb)
    spec = user_spec("arrays", read, classes, channels, size, hflip=True, num_classes=num_classes)
    return spec, read
