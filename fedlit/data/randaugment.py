"""RandAugment on a whole uint8 batch, each image with its own draw: the strong view's
middle stage (:mod:`fedlit.data.augment` computes the views).

torchvision's ``RandAugment(num_ops=2, magnitude=10)`` as FixMatch uses it, drawn per image on
the CPU (torch's global generator, or a compiled fit's own:
:class:`~fedlit.data.augment.FitDraws`), computed as the same whole-batch stages whatever was
drawn, on whatever device the batch is on.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torchvision.transforms import v2
from torchvision.transforms.v2.functional import _color
from torchvision.transforms.v2.functional._geometry import (
    _affine_grid,
    _apply_grid_transform,
    _get_inverse_affine_matrix,
)

RANDAUGMENT_OPS = 2  # FixMatch: two ops per image
RANDAUGMENT_MAGNITUDE = 10  # of torchvision's 31 bins (0..30), the same for every op


def uniform_below(uniforms: Tensor, n: int | Tensor) -> Tensor:
    """floor(u * n), an integer uniform in [0, n) for u uniform in [0, 1): int64, at most
    n - 1 (where float rounding would carry u * n up to n)."""
    return (uniforms * n).long().clamp_(max=n - 1)


class BatchRandAugment:
    """torchvision's ``RandAugment(num_ops, magnitude)`` on a uint8 batch, drawn per image.

    For each of ``num_ops`` slots every image draws one of torchvision's 14 ops uniformly and,
    for the signed ops, a sign (:meth:`draw` on torch's CPU generator, or :meth:`codes` from a
    compiled fit's uniforms). A slot is then the same fixed sequence of whole-batch stages for
    every batch, whatever was drawn, each image taking its own parameters from per-code tables
    by a gather, and each stage the identity (exactly) for the images that drew another op:

    1. geometric: one ``grid_sample`` (nearest) with each image's torchvision grid
       (ShearX/Y, TranslateX/Y, Rotate; the identity grid otherwise);
    2. Sharpness: each image blended with its rounded 3x3 smoothing (weight 0 otherwise);
    3. Color (three channels only; torchvision skips it on one): blended with its grey image;
    4. the ops that map each pixel value through a table: one lookup table (B, C, 256) per
       image and channel, chosen among identity, Brightness and Contrast (a blend with black or
       the grey image's mean), Posterize, Solarize, AutoContrast (the channel's min and max)
       and Equalize (the channel's histogram), then one gather.

    The op count of a batch is fixed (no per-pass indexing, no Python branch on the draws),
    and nothing is read back from the device. The result equals applying torchvision's op per
    image with the same draws (tested), since each table entry is torchvision's own arithmetic
    on that pixel value.

    Args:
        num_ops: ops applied one after another to each image.
        magnitude: the magnitude bin, out of ``num_magnitude_bins``.
        num_magnitude_bins: as in torchvision.
    """

    GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
    BLEND = ("Brightness", "Color", "Contrast")  # blended with black, grey image, grey mean
    #: The lookup-table ops, in the order of their tables (0: the identity or a blend).
    TABLES = ("blend", "Posterize", "Solarize", "AutoContrast", "Equalize")
    # the per-code parameters: the blend with black or the grey mean as a table (Brightness,
    # Contrast), Color's blend with the grey image, Sharpness, and the code's table
    COLUMNS = (
        "ratio",
        "weight",
        "mean",
        "color_ratio",
        "color_weight",
        "sharpness",
        "table",
    )

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
        self._fixed_tables: dict[tuple[int, int, str], Tensor] = {}
        self._slot_tables: dict[tuple[int, int, int, str], _SlotTables] = {}

    @functools.lru_cache(maxsize=8)  # noqa: B019 (one instance per view, kept for the run)
    def magnitudes(self, height: int, width: int) -> list[tuple[str, float, bool]]:
        """(op name, magnitude, signed) of every op for images of this size."""
        ref, out = self.reference, []
        for name in self.names:
            space, signed = ref._AUGMENTATION_SPACE[name]
            values = space(ref.num_magnitude_bins, height, width)
            # tolist(): Python numbers without a read through the dispatcher
            magnitude = 0.0
            if values is not None and values.ndim:
                magnitude = float(values.tolist()[ref.magnitude])
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

    def codes(self, uniforms: Tensor) -> Tensor:
        """The codes :meth:`draw` gives, from ``uniforms`` in [0, 1) (any shape, one per code):
        floor(u * 2 * ops), int64 of the same shape. A code uniform over 0..2 * ops - 1 is an
        op uniform over the ops and an independent fair sign bit, :meth:`draw`'s
        distribution."""
        return uniform_below(uniforms, 2 * len(self.names))

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

        Columns (:data:`COLUMNS`): ``ratio`` and ``weight``, the factor r that torchvision's
        Brightness or Contrast blends the image with and 1 - r (each cast from the Python
        float, as torchvision casts its scalars), ``mean``, 1 where the image is blended with
        its grey image's mean (Contrast), black otherwise (Brightness); ``color_ratio`` and
        ``color_weight``, the same for Color (on three channels; torchvision skips Color on
        one); ``sharpness``, 1 - Sharpness's factor; ``table``, the code's lookup table (an
        index into :data:`TABLES`). Codes of other ops: the identity (ratios 1, the rest 0).
        """
        key = (channels, height, width, str(device))
        if key not in self._parameters:
            rows = []
            for code in range(2 * len(self.names)):
                name, magnitude = self.signed_magnitude(code, height, width)
                row = dict.fromkeys(self.COLUMNS, 0.0) | {"ratio": 1.0, "color_ratio": 1.0}
                if name in ("Brightness", "Contrast"):
                    row.update(ratio=1.0 + magnitude, weight=1.0 - (1.0 + magnitude))
                    row["mean"] = float(name == "Contrast")
                elif name == "Color" and channels == 3:
                    row.update(color_ratio=1.0 + magnitude, color_weight=1.0 - (1.0 + magnitude))
                elif name == "Sharpness":
                    row["sharpness"] = 1.0 - (1.0 + magnitude)
                elif name in self.TABLES:
                    row["table"] = float(self.TABLES.index(name))
                rows.append([row[c] for c in self.COLUMNS])
            self._parameters[key] = torch.tensor(rows, dtype=torch.float32, device=device)
        return self._parameters[key]

    def fixed_tables(self, height: int, width: int, device: torch.device) -> Tensor:
        """Posterize's and Solarize's lookup tables at this size's magnitudes, (2, 256) uint8
        (torchvision's ops applied to the values 0..255), cached."""
        key = (height, width, str(device))
        if key not in self._fixed_tables:
            values = torch.arange(256, dtype=torch.uint8).view(1, 1, 256)
            magnitude = {name: m for name, m, _ in self.magnitudes(height, width)}
            tables = [
                self.apply_op(values, name, magnitude[name])[0, 0]
                for name in ("Posterize", "Solarize")
            ]
            self._fixed_tables[key] = torch.stack(tables).to(device)
        return self._fixed_tables[key]

    def slot_tables(
        self, channels: int, height: int, width: int, device: torch.device
    ) -> _SlotTables:
        """The per-code tables a slot gathers from, at this size and device, cached."""
        key = (channels, height, width, str(device))
        if key not in self._slot_tables:
            params = self.parameters(channels, height, width, device)
            which = params[:, self.COLUMNS.index("table")].long()
            self._slot_tables[key] = _SlotTables(
                grids=self.grids(height, width, device),
                columns=params.T.contiguous(),
                which=which.view(-1, 1, 1, 1, 1),
                fixed=self.fixed_tables(height, width, device).view(2, 1, 1, 1, 256),
                values=torch.arange(256, dtype=torch.float32, device=device),
            )
        return self._slot_tables[key]

    def __call__(self, images: Tensor, codes: Tensor | None = None) -> Tensor:
        """Augment uint8 ``images`` (B, C, H, W); ``codes`` (B, num_ops) fixes :meth:`draw`."""
        codes = self.draw(len(images)) if codes is None else codes
        self.prepare(images)
        return self.apply(images, codes.to(images.device, non_blocking=True))

    def prepare(self, images: Tensor) -> None:
        """Build the tables :meth:`apply` reads for ``images``' size and device (outside a
        compiled step, so that the step only reads them)."""
        b, channels, height, width = images.shape
        tables = self.slot_tables(channels, height, width, images.device)
        tables.ones(torch.Size((b, channels, 1, height * width)))
        tables.expanded(b, channels)

    def apply(self, images: Tensor, codes: Tensor) -> Tensor:
        """Augment uint8 ``images`` (B, C, H, W) with the drawn ``codes`` (B, num_ops) on their
        device: tensor work alone, no draw and no transfer (a compiled step traces it)."""
        b, channels, height, width = images.shape
        tables = self.slot_tables(channels, height, width, images.device)
        out = images
        for slot in range(codes.shape[1]):
            code = codes[:, slot]
            # each column of the drawn codes' parameters as (B, 1, 1, 1): one gather, one view
            drawn = tables.columns[:, code].view(len(self.COLUMNS), b, 1, 1, 1).unbind(0)
            params = dict(zip(self.COLUMNS, drawn, strict=True))
            out = _apply_grid_transform(out, tables.grids[code], "nearest", fill=None)
            out = self._sharpness(out, params["sharpness"])
            if channels == 3:
                out = self._color(out, params)
            out = self._lookup(out, params, tables.which[code], tables)
        return out

    def _color(self, images: Tensor, params: dict[str, Tensor]) -> Tensor:
        """torchvision's ``adjust_saturation`` (Color) with a per-image ratio: the blend with
        the image's grey image (B, 3, H, W); ratio 1, weight 0: the image unchanged."""
        grey = _color._rgb_to_grayscale_image(images, 1, preserve_dtype=False).floor_()
        out = torch.addcmul(images * params["color_ratio"], grey, params["color_weight"])
        return out.clamp_(0, 255).to(torch.uint8)

    def _lookup(
        self, images: Tensor, params: dict[str, Tensor], which: Tensor, tables: _SlotTables
    ) -> Tensor:
        """The lookup-table ops of a slot on uint8 ``images`` (B, C, H, W): each image's and
        channel's table (B, C, 1, 256) chosen by its code's table (``which``, (B, 1, 1, 1, 1)
        indices into :data:`TABLES`), then one gather.

        Each candidate table is torchvision's arithmetic on the values 0..255 with the image's
        statistics: the blend ``v * r + d * (1 - r)`` (d: 0 or the grey image's mean),
        AutoContrast's ``(v - min) / ((max - min) / 255)`` per channel, and Equalize's
        PIL-style table from the channel's histogram."""
        b, c, h, w = images.shape
        values = tables.values  # (256,)
        index = images.reshape(b, c, 1, h * w).long()
        as_float = index.to(torch.float32)
        # Brightness / Contrast / identity: v * r + d * w with d = the grey image's mean
        if c == 3:
            grey = _color._rgb_to_grayscale_image(images, 1, preserve_dtype=False).floor_()
            mean = grey.mean(dim=(-3, -2, -1), keepdim=True)  # (B, 1, 1, 1)
        else:
            mean = as_float.mean(dim=(-3, -2, -1), keepdim=True)
        degenerate = mean * params["mean"]
        blend = torch.addcmul(values * params["ratio"], degenerate, params["weight"])
        blend = blend.clamp_(0, 255).to(torch.uint8)  # (B, 1, 1, 256)
        # AutoContrast, per channel: a flat channel is kept (min 0, scale 1)
        low = as_float.amin(dim=-1, keepdim=True)  # (B, C, 1, 1)
        high = as_float.amax(dim=-1, keepdim=True)
        flat_channel = high == low
        inv_scale = (high - low).mul_(1.0 / 255).masked_fill_(flat_channel, 1.0)
        low = low.masked_fill_(flat_channel, 0.0)
        contrast = (values - low).div_(inv_scale).clamp_(0, 255).to(torch.uint8)
        # Equalize, per channel (torchvision's equalize_image on the histogram); the table at
        # value v is (pixels below v + step // 2) // step, and the image itself where step is 0
        hist = torch.zeros((b, c, 1, 256), dtype=torch.int32, device=images.device)
        hist.scatter_add_(-1, index, tables.ones(index.shape))
        cum = hist.cumsum(-1)
        top = hist.gather(-1, cum.argmax(-1, keepdim=True))
        step = (h * w - top).div_(256 - 1, rounding_mode="floor")
        below = (cum - hist).add_(step // 2).div_(step.clamp(min=1), rounding_mode="floor")
        identity, posterize, solarize = tables.expanded(b, c)
        equal = torch.where(step != 0, below.clamp_(0, 255).to(torch.uint8), identity)
        candidates = torch.stack(
            [blend.expand(b, c, 1, 256), posterize, solarize, contrast, equal], dim=1
        )  # (B, len(TABLES), C, 1, 256)
        lut = candidates.gather(1, which.expand(b, 1, c, 1, 256)).view(b, c, 1, 256)
        return lut.gather(-1, index).view(b, c, h, w)

    def _sharpness(self, images: Tensor, weight: Tensor) -> Tensor:
        """torchvision's ``adjust_sharpness`` with a per-image weight 1 - factor (B, 1, 1, 1):
        the interior blended with its rounded 3x3 smoothing (weights 1/13, 5/13 in the centre),
        the border kept.

        torchvision convolves in float and rounds; here the integer sum k of the 3x3
        neighbourhood (exact in float32) plus 4 times the centre is rounded as k / 13, which is
        never within 1/26 of a half, so both round to the same integer (a sum pool or a
        convolution would be fewer ops but several times slower on a CPU)."""
        height, width = images.shape[-2:]
        if height <= 2 or width <= 2:
            return images
        out = images.to(torch.float32)
        interior = out[..., 1:-1, 1:-1]
        # the 3x3 box sums as two 3-wide sums of windows (views): two reductions
        box = out.unfold(-1, 3, 1).sum(-1).unfold(-2, 3, 1).sum(-1)  # (B, C, H - 2, W - 2)
        blurred = box.add_(interior, alpha=4.0).div_(13.0).round_()
        interior.copy_(torch.addcmul(interior, blurred.sub_(interior), weight))
        return out.clamp_(0, 255).to(torch.uint8)


@dataclass
class _SlotTables:
    """What a RandAugment slot gathers from, per code (2 * 14 codes), on one device: the
    sampling ``grids`` (codes, H, W, 2), the parameter ``columns`` (len(COLUMNS), codes), the
    lookup table's index ``which`` (codes, 1, 1, 1, 1), Posterize's and Solarize's ``fixed``
    tables (2, 1, 1, 1, 256) and the pixel ``values`` 0..255 (float32); and, per batch shape,
    the constant tensors of :meth:`BatchRandAugment._lookup`."""

    grids: Tensor
    columns: Tensor
    which: Tensor
    fixed: Tensor
    values: Tensor
    _ones: dict[tuple[int, ...], Tensor] = field(default_factory=dict)
    _expanded: dict[tuple[int, int], tuple[Tensor, Tensor, Tensor]] = field(default_factory=dict)

    def ones(self, shape: torch.Size) -> Tensor:
        """int32 ones of ``shape``: each pixel's count in a histogram."""
        key = tuple(shape)
        if key not in self._ones:
            self._ones[key] = torch.ones(key, dtype=torch.int32, device=self.values.device)
        return self._ones[key]

    def expanded(self, b: int, c: int) -> tuple[Tensor, Tensor, Tensor]:
        """The identity, Posterize and Solarize tables as (B, C, 1, 256) uint8 views."""
        if (b, c) not in self._expanded:
            identity = self.values.to(torch.uint8).expand(b, c, 1, 256)
            posterize, solarize = (t.expand(b, c, 1, 256) for t in self.fixed)
            self._expanded[(b, c)] = (identity, posterize, solarize)
        return self._expanded[(b, c)]
