"""Weak and strong augmentations of one uint8 image, with each data set's own statistics.

This is the per-image definition of the views, kept as the reference that the batched views of
:mod:`fedlit.data.augment` (what the loaders use) are tested against.

Weak, alpha(x): random crop with padding + horizontal flip (the flip only where it keeps the
label). Strong, A(x): weak + RandAugment + Cutout (RandomErasing of one square patch), as in
FixMatch. Sizes and statistics come from the :class:`DatasetSpec`, so a 1-channel 28x28 image
stays a 1-channel 28x28 image.
"""

from __future__ import annotations

import torch
from torchvision.transforms import v2

from fedlit.data.datasets import DatasetSpec

VIEWS = ("plain", "weak", "strong")


def _normalize(spec: DatasetSpec) -> list[v2.Transform]:
    return [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(spec.mean), list(spec.std))]


def _weak_geometry(spec: DatasetSpec) -> list[v2.Transform]:
    ops: list[v2.Transform] = [
        v2.RandomCrop(spec.size, padding=spec.size // 8, padding_mode="reflect")
    ]
    if spec.hflip:
        ops.append(v2.RandomHorizontalFlip())
    return ops


def build_transform(view: str, spec: DatasetSpec) -> v2.Transform:
    """The transform of ``view`` (one of :data:`VIEWS`) for data set ``spec``.

    Input: a uint8 tensor (C, H, W). Output: a normalised float32 tensor of the same shape.
    """
    if view == "plain":
        ops = _normalize(spec)
    elif view == "weak":
        ops = _weak_geometry(spec) + _normalize(spec)
    elif view == "strong":
        ops = [
            *_weak_geometry(spec),
            v2.RandAugment(num_ops=2, magnitude=10),
            *_normalize(spec),
            # Cutout: one patch, filled with the (normalised) mean.
            v2.RandomErasing(p=1.0, scale=(0.02, 0.25), ratio=(1.0, 1.0), value=0.0),
        ]
    else:
        raise ValueError(f"unknown view {view!r}; choose one of {VIEWS}")
    return v2.Compose(ops)
