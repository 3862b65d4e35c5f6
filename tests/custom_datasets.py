"""A user's torch Datasets that fail (tests/test_hostile_inputs.py): by class path, as a user
names theirs in a recipe."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class RaisesOnItem(Dataset):
    """Ten grey 8x8 images; item 3 raises, as a user's broken ``__getitem__`` would."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, n: int) -> tuple[torch.Tensor, int]:
        if n == 3:
            raise KeyError("missing_file_0003.png")
        return torch.zeros(1, 8, 8, dtype=torch.uint8), n % 2


class RaisesOnLen(RaisesOnItem):
    def __len__(self) -> int:
        raise RuntimeError("the index file could not be read")


class NanPixel(RaisesOnItem):
    """Float images in [0, 1] with one NaN pixel in item 5."""

    def __getitem__(self, n: int) -> tuple[torch.Tensor, int]:
        image = torch.full((1, 8, 8), 0.5)
        if n == 5:
            image[0, 2, 2] = float("nan")
        return image, n % 2


class RaisesOnInit(RaisesOnItem):
    """A user's Dataset whose constructor raises (its files are missing, say)."""

    def __init__(self, root: str = "nowhere") -> None:
        raise FileNotFoundError(f"{root}/index.csv")
