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
from torchvision.transforms.v2.functional import _color
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
    for the signed ops, a sign (:meth:`draw`, on torch's CPU generator). A slot is then at most
    seven passes, each over the images that drew one of its ops (:data:`PASSES`), with each
    image's own parameters as tensors: one ``grid_sample`` for the five geometric ops (each
    image's torchvision grid), one blend for Brightness, Color and Contrast (a per-image ratio
    and degenerate image), one for Sharpness (a per-image factor), and one call of
    torchvision's own op for each of Posterize, Solarize, AutoContrast and Equalize. Which
    images go to which pass is worked out on the CPU draws and sent to the device at once, so
    nothing waits on the device. The result equals applying torchvision's op per image with
    the same draws (tested).

    Args:
        num_ops: ops applied one after another to each image.
        magnitude: the magnitude bin, out of ``num_magnitude_bins``.
        num_magnitude_bins: as in torchvision.
    """

    GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
    BLEND = ("Brightness", "Color", "Contrast")  # blended with black, grey image, grey mean
    # the passes of a slot, in order; each op belongs to one (Identity and, on one channel,
    # Color to none)
    PASSES = (
        "geometric",
        "blend",
        "Sharpness",
        "Posterize",
        "Solarize",
        "AutoContrast",
        "Equalize",
    )
    COLUMNS = ("ratio", "weight", "grey", "mean", "sharpness")  # of the per-code parameters

    def __init__(
        self,
        num_ops: int = RANDAUGMENT_OPS,
        magnitude: int = RANDAUGMENT_MAGNITUDE,
        num_magnitude_bins: int = 31,
    ) -> None:
        self.reference = v2.RandAugment(num_ops, magnitude, num_magnitude_bins)
        self.names = list(self.reference._AUGMENTATION_SPACE)
        self._grids: dict[tuple[int, int, str], Tensor] = {}
        self._parameters: dict[tuple[int, int, int, str], Tensor] = {}

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

    def signed_magnitude(self, code: int, height: int, width: int) -> tuple[str, float]:
        """(op name, the magnitude torchvision passes to it) of ``code`` for this size."""
        name, magnitude, signed = self.magnitudes(height, width)[code // 2]
        return name, -magnitude if signed and code % 2 else magnitude

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
            for code in range(2 * len(self.names)):
                name, magnitude = self.signed_magnitude(code, height, width)
                geometric = name in self.GEOMETRIC
                table.append(
                    self._geometric_grid(name, magnitude, height, width) if geometric else identity
                )
            self._grids[key] = torch.cat(table).to(device)
        return self._grids[key]

    def parameters(self, channels: int, height: int, width: int, device: torch.device) -> Tensor:
        """Each code's op parameters, (2 * 14, len(COLUMNS)) float32, cached per size and device.

        Columns (:data:`COLUMNS`): ``ratio``, the factor r that torchvision's Brightness, Color
        or Contrast blends the image with, and ``weight``, 1 - r (each cast from the Python
        float, as torchvision casts its scalars); ``grey`` and ``mean``, 1 where the image is
        blended with its grey image (Color) or that image's mean (Contrast), black otherwise
        (Brightness); ``sharpness``, 1 - Sharpness's factor. Codes of other ops: 1, 0, 0, 0, 0.
        """
        key = (channels, height, width, str(device))
        if key not in self._parameters:
            rows = []
            for code in range(2 * len(self.names)):
                name, magnitude = self.signed_magnitude(code, height, width)
                row = dict.fromkeys(self.COLUMNS, 0.0) | {"ratio": 1.0}
                if name in self.BLEND:
                    row.update(ratio=1.0 + magnitude, weight=1.0 - (1.0 + magnitude))
                    row.update(grey=float(name == "Color"), mean=float(name == "Contrast"))
                elif name == "Sharpness":
                    row["sharpness"] = 1.0 - (1.0 + magnitude)
                rows.append([row[c] for c in self.COLUMNS])
            self._parameters[key] = torch.tensor(rows, dtype=torch.float32, device=device)
        return self._parameters[key]

    def pass_of(self, channels: int) -> Tensor:
        """Each code's pass, an index into :data:`PASSES`, or -1 (none): (2 * 14,) int64."""
        out = []
        for name in self.names:
            if name == "Identity" or (name == "Color" and channels == 1):  # as torchvision
                index = -1
            elif name in self.GEOMETRIC:
                index = self.PASSES.index("geometric")
            elif name in self.BLEND:
                index = self.PASSES.index("blend")
            else:
                index = self.PASSES.index(name)
            out += [index, index]
        return torch.tensor(out)

    @staticmethod
    def _column(params: Tensor, column: str) -> Tensor:
        """One column of per-image parameters (B, len(COLUMNS)) as (B, 1, 1, 1)."""
        return params[:, BatchRandAugment.COLUMNS.index(column), None, None, None]

    def __call__(self, images: Tensor, codes: Tensor | None = None) -> Tensor:
        """Augment uint8 ``images`` (B, C, H, W); ``codes`` (B, num_ops) fixes :meth:`draw`."""
        codes = self.draw(len(images)) if codes is None else codes.cpu()
        channels, height, width = images.shape[-3:]
        device = images.device
        table = self.parameters(channels, height, width, device)
        pass_of = self.pass_of(channels)
        out = images.clone()
        for slot in range(codes.shape[1]):
            code = codes[:, slot]
            group = pass_of[code]
            order = torch.argsort(group, stable=True)  # the images, pass by pass
            counts = torch.bincount(group + 1, minlength=len(self.PASSES) + 1).tolist()
            # one transfer a slot: the images' order and their codes in that order
            moved = torch.stack([order, code[order]]).to(device, non_blocking=True)
            start = counts[0]  # no pass
            for name, count in zip(self.PASSES, counts[1:], strict=True):
                if not count:
                    continue
                index, chosen = moved[0, start : start + count], moved[1, start : start + count]
                start += count
                x = out[index]
                if name == "geometric":
                    grid = self.grids(height, width, device)[chosen]
                    x = _apply_grid_transform(x, grid, "nearest", fill=None)
                elif name == "blend":
                    x = self._blend(x, table[chosen])
                elif name == "Sharpness":
                    x = self._sharpness(x, self._column(table[chosen], "sharpness"))
                else:  # an unsigned op: one magnitude for all
                    x = self.apply_op(
                        x, name, self.magnitudes(height, width)[self.names.index(name)][1]
                    )
                out[index] = x
        return out

    def _blend(self, images: Tensor, params: Tensor) -> Tensor:
        """torchvision's ``_blend(image, degenerate, ratio)`` with a per-image ratio and
        degenerate (black, the grey image or its mean), ``params`` (B, len(COLUMNS))."""
        ratio, weight = self._column(params, "ratio"), self._column(params, "weight")
        if images.shape[-3] == 3:
            grey = _color._rgb_to_grayscale_image(images, 1, preserve_dtype=False).floor_()
        else:
            grey = images.to(torch.float32)
        mean = grey.mean(dim=(-3, -2, -1), keepdim=True)
        # grey * 1 + mean * 0, grey * 0 + mean * 1 or 0 + 0: exactly one of them, or black
        degenerate = torch.addcmul(
            grey * self._column(params, "grey"), mean, self._column(params, "mean")
        )
        # torchvision: image.mul(ratio).add_(degenerate, alpha=1 - ratio), a fused multiply-add
        out = torch.addcmul(images * ratio, degenerate, weight)
        return out.clamp_(0, 255).to(torch.uint8)

    def _sharpness(self, images: Tensor, weight: Tensor) -> Tensor:
        """torchvision's ``adjust_sharpness`` with a per-image weight 1 - factor (B, 1, 1, 1):
        the interior blended with its rounded 3x3 smoothing (weights 1/13, 5/13 in the centre),
        the border kept.

        torchvision convolves in float and rounds; here the integer sum k of the 3x3
        neighbourhood plus 4 times the centre is rounded as k / 13, which is never within 1/26
        of a half, so both round to the same integer (and the box sums are cheaper than a
        depthwise convolution on a CPU)."""
        height, width = images.shape[-2:]
        if height <= 2 or width <= 2:
            return images
        out = images.to(torch.float32)
        rows = out[..., :, :-2] + out[..., :, 1:-1] + out[..., :, 2:]  # (B, C, H, W - 2)
        box = rows[..., :-2, :] + rows[..., 1:-1, :] + rows[..., 2:, :]  # (B, C, H - 2, W - 2)
        interior = out[..., 1:-1, 1:-1]
        blurred = box.add_(interior, alpha=4.0).div_(13.0).round_()
        interior.copy_(torch.addcmul(interior, blurred.sub_(interior), weight))
        return out.clamp_(0, 255).to(torch.uint8)


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
