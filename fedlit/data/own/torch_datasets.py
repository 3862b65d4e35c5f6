"""A data set given as two torch Datasets (``data.dataset`` and ``data.test_dataset``,
instances or ``class_path``/``init_args``): items ``(image, label)``, the image a PIL image or
a tensor (C, H, W) or (H, W), uint8 or float in [0, 1]; the classes are its ``classes`` if it
has them, else ``max(label) + 1``. A PIL image is grey in a grey mode, or in a palette mode
whose colours are all grey."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms.v2 import functional as F

from fedlit.data.datasets import DatasetSpec
from fedlit.data.own.decode import LooseImage, as_colour_image, uniform_images
from fedlit.data.own.read import ReadImages, check_labels, user_spec


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
    check_labels(labels, num_classes, where, classes is not None)
    splits = {split: (images[split], labels[split]) for split in ("train", "test")}
    read = ReadImages(splits, None, made_rgb=made_rgb)
    spec = user_spec(type(train).__name__, read, classes, channels, size, True, num_classes)
    return spec, read
