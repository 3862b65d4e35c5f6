"""Batched weak and strong views: a whole uint8 batch at once, each image with its own draw.

These are the views of :mod:`fedlit.data.transforms` (the per-image definition, kept as the
reference) computed on a batch (B, C, H, W) on whatever device the batch is on, with
independent random parameters per image and no per-image Python:

- weak, alpha(x): random crop with ``size // 8`` reflect padding, then a horizontal flip with
  probability 1/2 where it keeps the label, each image with its own offset and coin;
- strong, A(x): weak, then torchvision's ``RandAugment(num_ops=2, magnitude=10)`` drawn per image
  (:class:`BatchRandAugment`), then normalisation and Cutout: one square patch of 2-25% of the
  image set to 0 (the normalised mean), drawn per image;
- plain: normalisation only.

Every random parameter is drawn from torch's global CPU generator, so the same seed gives the
same views on a CPU and on a GPU.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from functools import cache

import torch
from torch import Tensor
from torchvision.transforms import v2
from torchvision.transforms.v2.functional._geometry import (
    _affine_grid,
    _apply_grid_transform,
    _get_inverse_affine_matrix,
)

from fedlit.data.datasets import DatasetSpec

VIEWS = ("plain", "weak", "strong")
RANDAUGMENT_OPS = 2  # FixMatch: two ops per image
RANDAUGMENT_MAGNITUDE = 10  # of torchvision's 31 bins (0..30), the same for every op
CUTOUT_SCALE = (0.02, 0.25)  # Cutout's area, as a fraction of the image


class BatchRandAugment:
    """torchvision's ``RandAugment(num_ops, magnitude)`` on a uint8 batch, drawn per image.

    For each of ``num_ops`` slots every image draws one of torchvision's 14 ops uniformly and,
    for the signed ops, a sign. The magnitude is fixed, so the images that drew the same
    (op, sign) share every parameter: the geometric ops (shears, translations, rotation) of a
    slot run as one ``grid_sample`` with each image's own torchvision grid, and each other
    (op, sign) runs torchvision's own op once on its images. The result equals applying
    torchvision's op per image with the same draws (tested), with at most 13 op calls per
    slot whatever the batch size.

    Args:
        num_ops: ops applied one after another to each image.
        magnitude: the magnitude bin, out of ``num_magnitude_bins``.
        num_magnitude_bins: as in torchvision.
    """

    GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")

    def __init__(
        self,
        num_ops: int = RANDAUGMENT_OPS,
        magnitude: int = RANDAUGMENT_MAGNITUDE,
        num_magnitude_bins: int = 31,
    ) -> None:
        self.reference = v2.RandAugment(num_ops, magnitude, num_magnitude_bins)
        self.names = list(self.reference._AUGMENTATION_SPACE)
        self._grids: dict[tuple[int, int, str], Tensor] = {}
        signed = [self.reference._AUGMENTATION_SPACE[name][1] for name in self.names]
        # per code: its group (unsigned ops drop the sign bit) and whether it is geometric
        self._codes = (
            torch.tensor(
                [2 * k + (s if signed[k] else 0) for k in range(len(signed)) for s in (0, 1)]
            ),
            torch.tensor([name in self.GEOMETRIC for name in self.names for _ in (0, 1)]),
        )

    @functools.lru_cache(maxsize=8)  # noqa: B019 (one instance per view, kept for the run)
    def magnitudes(self, height: int, width: int) -> list[tuple[str, float, bool]]:
        """(op name, magnitude, signed) of every op for images of this size."""
        ref, out = self.reference, []
        for name in self.names:
            space, signed = ref._AUGMENTATION_SPACE[name]
            values = space(ref.num_magnitude_bins, height, width)
            magnitude = float(values[ref.magnitude]) if values is not None and values.ndim else 0.0
            out.append((name, magnitude, signed))
        return out

    def apply_op(self, images: Tensor, name: str, magnitude: float) -> Tensor:
        """torchvision's op ``name`` at ``magnitude`` on uint8 images (..., C, H, W): the
        per-image reference."""
        ref = self.reference
        return ref._apply_image_or_video_transform(
            images, name, magnitude, interpolation=ref.interpolation, fill=ref._fill
        )

    def draw(self, batch_size: int) -> Tensor:
        """Per image and slot, the drawn code 2 * op + (sign < 0): (B, num_ops) int64.

        Unsigned ops ignore the sign bit, so each op keeps probability 1 / 14, as in
        torchvision; signed ops take either sign with probability 1/2."""
        ops = torch.randint(len(self.names), (batch_size, self.reference.num_ops))
        negative = torch.randint(2, (batch_size, self.reference.num_ops))
        return 2 * ops + negative

    def _geometric_grid(self, name: str, magnitude: float, height: int, width: int) -> Tensor:
        """torchvision's sampling grid (1, H, W, 2) for geometric op ``name`` (the arguments
        ``RandAugment`` passes to ``F.affine`` / ``F.rotate``)."""
        if name in ("ShearX", "ShearY"):
            shear = math.degrees(math.atan(magnitude))
            center = [-0.5 * width, -0.5 * height]  # center=[0, 0]: the top-left corner
            args = (
                center,
                0.0,
                [0.0, 0.0],
                1.0,
                [shear, 0.0] if name == "ShearX" else [0.0, shear],
            )
        elif name in ("TranslateX", "TranslateY"):
            shift = float(int(magnitude))
            translate = [shift, 0.0] if name == "TranslateX" else [0.0, shift]
            args = ([0.0, 0.0], 0.0, translate, 1.0, [0.0, 0.0])
        else:  # Rotate: F.rotate inverts the angle's direction
            args = ([0.0, 0.0], -(magnitude % 360), [0.0, 0.0], 1.0, [0.0, 0.0])
        theta = torch.tensor(_get_inverse_affine_matrix(*args)).reshape(1, 2, 3)
        return _affine_grid(theta, w=width, h=height, ow=width, oh=height)

    def grids(self, height: int, width: int, device: torch.device) -> Tensor:
        """Each code's sampling grid, (2 * 14, H, W, 2) (identity for other ops), cached."""
        key = (height, width, str(device))
        if key not in self._grids:
            identity = _affine_grid(
                torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]]), width, height, width, height
            )
            table = []
            for name, magnitude, _ in self.magnitudes(height, width):
                for sign in (1.0, -1.0):
                    geometric = name in self.GEOMETRIC
                    table.append(
                        self._geometric_grid(name, sign * magnitude, height, width)
                        if geometric
                        else identity
                    )
            self._grids[key] = torch.cat(table).to(device)
        return self._grids[key]

    def __call__(self, images: Tensor, codes: Tensor | None = None) -> Tensor:
        """Augment uint8 ``images`` (B, C, H, W); ``codes`` (B, num_ops) fixes :meth:`draw`."""
        codes = self.draw(len(images)) if codes is None else codes
        height, width = images.shape[-2:]
        table = self.magnitudes(height, width)
        group_of, geometric = self._codes
        grids = self.grids(height, width, images.device)
        out = images.clone()
        for slot in range(codes.shape[1]):
            code = codes[:, slot]
            is_geo = geometric[code]
            idx = is_geo.nonzero().flatten()
            if len(idx):
                grid = grids[code[idx].to(images.device)]
                out[idx] = _apply_grid_transform(out[idx], grid, "nearest", fill=None)
            rest = (~is_geo).nonzero().flatten()
            group = group_of[code[rest]]
            order = torch.argsort(group, stable=True)
            rest, group = rest[order], group[order]
            values, counts = torch.unique_consecutive(group, return_counts=True)
            for value, chunk in zip(values.tolist(), rest.split(counts.tolist()), strict=True):
                name, magnitude, _ = table[value // 2]
                if name == "Identity":
                    continue
                chunk = chunk.to(images.device)
                sign = -1.0 if value % 2 else 1.0
                out[chunk] = self.apply_op(out[chunk], name, sign * magnitude)
        return out


class BatchView:
    """One view (``plain``, ``weak`` or ``strong``) of data set ``spec`` for uint8 batches.

    Call it on uint8 images (B, C, H, W) on any device; it returns normalised float32 images of
    the same shape on that device. The crop, flip and Cutout are tensor indexing on the whole
    batch (kornia's batched equivalents were measured 2-4x slower on a CPU, its default crop
    looping over the images in Python); RandAugment is :class:`BatchRandAugment`.
    """

    def __init__(self, view: str, spec: DatasetSpec) -> None:
        if view not in VIEWS:
            raise ValueError(f"unknown view {view!r}; choose one of {VIEWS}")
        self.view, self.spec = view, spec
        self.pad = spec.size // 8
        self.randaugment = BatchRandAugment()

    def weak_geometry(self, images: Tensor) -> Tensor:
        """torchvision's ``RandomCrop(size, padding=size // 8, padding_mode="reflect")`` and,
        where it keeps the label, ``RandomHorizontalFlip()``, with an offset and a coin per
        image: uint8 in, uint8 out."""
        b, c, h, w = images.shape
        p = self.pad
        padded = torch.nn.functional.pad(images.float(), (p, p, p, p), mode="reflect")
        top = torch.randint(0, 2 * p + 1, (b,)).to(images.device)
        left = torch.randint(0, 2 * p + 1, (b,)).to(images.device)
        rows = top[:, None] + torch.arange(h, device=images.device)  # (B, H)
        cols = left[:, None] + torch.arange(w, device=images.device)  # (B, W)
        if self.spec.hflip:
            flip = (torch.rand(b) < 0.5).to(images.device)
            cols = torch.where(flip[:, None], cols.flip(1), cols)
        batch = torch.arange(b, device=images.device)[:, None, None, None]
        channel = torch.arange(c, device=images.device)[None, :, None, None]
        out = padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]
        return out.to(torch.uint8)

    def cutout(self, images: Tensor) -> Tensor:
        """torchvision's ``RandomErasing(p=1, scale=CUTOUT_SCALE, ratio=(1, 1), value=0)``
        per image: a square of side round(sqrt(s H W)), s ~ U(scale), at a uniform position,
        set to 0 in every channel (the normalised data set mean)."""
        b, _, h, w = images.shape
        area = torch.empty(b).uniform_(*CUTOUT_SCALE) * (h * w)
        side = area.sqrt().round().long()  # < min(h, w) for scale <= 0.25: the first try fits
        top = (torch.rand(b) * (h - side + 1)).long()
        left = (torch.rand(b) * (w - side + 1)).long()
        rows = torch.arange(h)[None, :]
        cols = torch.arange(w)[None, :]
        inside_rows = (rows >= top[:, None]) & (rows < (top + side)[:, None])  # (B, H)
        inside_cols = (cols >= left[:, None]) & (cols < (left + side)[:, None])  # (B, W)
        erase = (inside_rows[:, :, None] & inside_cols[:, None, :]).to(images.device)
        return images.masked_fill(erase[:, None], 0.0)

    def normalize(self, images: Tensor) -> Tensor:
        mean = torch.tensor(self.spec.mean, device=images.device).view(1, -1, 1, 1)
        std = torch.tensor(self.spec.std, device=images.device).view(1, -1, 1, 1)
        return (images.float() / 255.0 - mean) / std

    def __call__(self, images: Tensor) -> Tensor:
        """The view of uint8 ``images`` (B, C, H, W): float32, channels-last (the networks'
        layout, :func:`fedlit.models.build_classifier`)."""
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(
                f"expected uint8 images (B, C, H, W), got {images.dtype} {tuple(images.shape)}"
            )
        if self.view == "plain" or len(images) == 0:
            out = self.normalize(images)
        elif self.view == "weak":
            out = self.normalize(self.weak_geometry(images))
        else:
            out = self.cutout(self.normalize(self.randaugment(self.weak_geometry(images))))
        return out.contiguous(memory_format=torch.channels_last)


@cache
def batch_view(view: str, spec: DatasetSpec) -> Callable[[Tensor], Tensor]:
    """The (shared, stateless) :class:`BatchView` of ``view`` for data set ``spec``."""
    return BatchView(view, spec)
