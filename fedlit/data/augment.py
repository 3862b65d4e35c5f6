"""Batched weak and strong views: a whole uint8 batch at once, each image with its own draw.

These are the views of :mod:`fedlit.data.transforms` (the per-image definition, kept as the
reference) computed on a batch (B, C, H, W) on whatever device the batch is on, with
independent random parameters per image and no per-image Python:

- weak, alpha(x): random crop with ``size // 8`` reflect padding, then a horizontal flip with
  probability 1/2 where it keeps the label, each image with its own offset and coin;
- strong, A(x): weak, then torchvision's ``RandAugment(num_ops=2, magnitude=10)`` drawn per image
  (:class:`~fedlit.data.randaugment.BatchRandAugment`), then normalisation and Cutout: one
  square patch of 2-25% of the image set to 0 (the normalised mean), drawn per image;
- plain: normalisation only.

Every random parameter is drawn on the CPU, so the same seed gives the same views on a CPU and
on a GPU. A fit in fedlit's loop, eager or compiled, takes them from its :class:`FitDraws`: a
chunk of steps drawn from the fit's own generator in a few whole-tensor ops
(:meth:`BatchView.from_uniforms`) and moved to the device in one transfer, each step then
taking its slice. A batch drawn outside fedlit's loop (a loader iterated by hand, a view called
directly) draws its own from torch's global generator (:meth:`BatchView.draw`): 6-12 small
calls per view. The rows and their distributions are the same either way; the values are
not. The views and the draws of their parameters are one contract, kept in this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import torch
from torch import Tensor

from fedlit.data.datasets import DatasetSpec
from fedlit.data.randaugment import RANDAUGMENT_OPS, BatchRandAugment, uniform_below

VIEWS = ("plain", "weak", "strong")
CUTOUT_SCALE = (0.02, 0.25)  # Cutout's area, as a fraction of the image


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
        self._index_cache: dict[tuple[int, int, int, str], dict[str, Tensor]] = {}
        self._batch_index: dict[tuple[int, str], Tensor] = {}
        self._moments: dict[str, tuple[Tensor, Tensor]] = {}
        self._prepared: tuple[torch.Size, torch.device] | None = None  # prepare's last shape
        self._rows = {"plain": 0, "weak": len(self.WEAK_ROWS)}.get(view, len(self.STRONG_ROWS))

    #: Rows of a view's draws (:meth:`draw`): the weak crop's offsets and flip, then (strong)
    #: RandAugment's codes per slot and Cutout's side and position.
    WEAK_ROWS = ("top", "left", "flip")
    STRONG_ROWS = (
        *WEAK_ROWS,
        *(f"op{k}" for k in range(RANDAUGMENT_OPS)),
        "side",
        "cut_top",
        "cut_left",
    )

    def rows(self) -> int:
        """How many rows :meth:`draw` gives (0 for ``plain``)."""
        return self._rows

    def draw(self, b: int, h: int, w: int) -> Tensor:
        """This view's random parameters for b images of h x w: (:meth:`rows`, B) int64 on the
        CPU (:data:`WEAK_ROWS`, :data:`STRONG_ROWS`), drawn from torch's global CPU generator in
        the order the views are computed (crop, flip, RandAugment, Cutout)."""
        if self.view == "plain" or b == 0:
            return torch.empty((0, b), dtype=torch.int64)
        weak = self._draw_weak(b)
        if self.view == "weak":
            return weak
        codes = self.randaugment.draw(b).T
        return torch.cat([weak, codes, self._draw_cutout(b, h, w)])

    def _draw_weak(self, b: int) -> Tensor:
        """The rows top, left, flip (3, B). One call draws both offsets: the CPU generator
        fills a tensor element by element, so (2, B) holds what two calls of B would."""
        offsets = torch.randint(0, 2 * self.pad + 1, (2, b))
        if self.spec.hflip:
            flip = (torch.rand(1, b) < 0.5).long()
        else:
            flip = torch.zeros(1, b, dtype=torch.long)
        return torch.cat([offsets, flip])

    def _draw_cutout(self, b: int, h: int, w: int) -> Tensor:
        """The rows side, top, left (3, B); one call draws both positions' uniforms (as
        :meth:`_draw_weak` its offsets)."""
        area = torch.empty(b).uniform_(*CUTOUT_SCALE) * (h * w)
        side = area.sqrt().round().long()  # < min(h, w) for scale <= 0.25: the first try fits
        room = _ends(h, w) - side  # (2, B): the positions that fit
        corner = (torch.rand(2, b) * room).long()
        return torch.cat([side[None], corner])

    def from_uniforms(self, uniforms: Tensor, h: int, w: int) -> Tensor:
        """The rows :meth:`draw` gives, made from ``uniforms`` in [0, 1) of shape
        (..., :meth:`rows`, B), one per row (a chunk of a fit's steps at once,
        :class:`FitDraws`): int64 of the same shape, with :meth:`draw`'s
        distributions. An integer uniform in [0, n) is floor(u * n); a coin is u < 1/2;
        RandAugment's codes are :meth:`~fedlit.data.randaugment.BatchRandAugment.codes`;
        Cutout's area is U(CUTOUT_SCALE) * h * w from its row, and its position, uniform over
        those that fit its side, from the next two."""
        if self.view == "plain":
            return torch.empty(uniforms.shape, dtype=torch.int64)
        u = uniforms.unbind(-2)
        top, left = uniform_below(u[0], 2 * self.pad + 1), uniform_below(u[1], 2 * self.pad + 1)
        flip = (u[2] < 0.5).long() if self.spec.hflip else torch.zeros_like(top)
        rows = [top, left, flip]
        if self.view == "strong":
            rows += self.randaugment.codes(uniforms[..., 3 : 3 + RANDAUGMENT_OPS, :]).unbind(-2)
            low, high = CUTOUT_SCALE
            side = ((low + (high - low) * u[3 + RANDAUGMENT_OPS]) * (h * w)).sqrt().round().long()
            rows += [side, uniform_below(u[4 + RANDAUGMENT_OPS], h - side + 1)]
            rows.append(uniform_below(u[5 + RANDAUGMENT_OPS], w - side + 1))
        return torch.stack(rows, dim=-2)

    def prepare(self, images: Tensor) -> None:
        """Build every table :meth:`apply` reads for ``images``' shape and device (outside a
        compiled step, so that the step only reads them). Nothing to do where the last call
        had the same shape and device (no table is ever dropped)."""
        if self._prepared == (images.shape, images.device):
            return
        b, c, h, w = images.shape
        self._indices(c, h, w, images.device)
        key = (b, str(images.device))
        if key not in self._batch_index:
            self._batch_index[key] = torch.arange(b, device=images.device).view(b, 1, 1, 1)
        self._mean_std(images.device)
        if self.view == "strong" and b:
            self.randaugment.prepare(images)
        self._prepared = (images.shape, images.device)

    def weak_geometry(self, images: Tensor, drawn: Tensor | None = None) -> Tensor:
        """torchvision's ``RandomCrop(size, padding=size // 8, padding_mode="reflect")`` and,
        where it keeps the label, ``RandomHorizontalFlip()``, with an offset and a coin per
        image (``drawn``: the rows top, left, flip on ``images``' device; None: drawn here):
        uint8 in, uint8 out, by one gather (each row and column of the crop read through the
        reflection of the padded border)."""
        b, c, h, w = images.shape
        if drawn is None:
            self.prepare(images)
            drawn = self._draw_weak(b).to(images.device)
        top, left, flip = drawn[0], drawn[1], drawn[2]
        index = self._indices(c, h, w, images.device)
        rows = index["reflect_rows"][top.view(b, 1, 1, 1) + index["rows"]]  # (B, 1, H, 1)
        cols = index["reflect_cols"][left.view(b, 1, 1, 1) + index["cols"]]  # (B, 1, 1, W)
        if self.spec.hflip:
            cols = torch.where(flip.view(b, 1, 1, 1) != 0, cols.flip(-1), cols)
        batch = self._batch_index[(b, str(images.device))]
        return images[batch, index["channels"], rows, cols]

    def _indices(self, c: int, h: int, w: int, device: torch.device) -> dict[str, Tensor]:
        """The index tensors of :meth:`weak_geometry` and :meth:`cutout`, cached per size and
        device: ``reflect_rows`` / ``reflect_cols``, the source row or column of each padded
        one; ``rows`` (1, 1, H, 1), ``cols`` (1, 1, 1, W) and ``channels`` (1, C, 1, 1)
        aranges; and Cutout's ``cut_rows`` (S, T, H) and ``cut_cols`` (S, T, W) masks on the
        CPU (where the sides and positions are drawn), position t of side s covering
        [t, t + s)."""
        key = (c, h, w, str(device))
        if key not in self._index_cache:
            p = self.pad

            def reflect(n: int) -> Tensor:  # "reflect" padding: the border is not repeated
                i = (torch.arange(n + 2 * p) - p).abs()
                return ((n - 1) - ((n - 1) - i).abs()).to(device)

            self._index_cache[key] = {
                "reflect_rows": reflect(h),
                "reflect_cols": reflect(w),
                "rows": torch.arange(h, device=device).view(1, 1, h, 1),
                "cols": torch.arange(w, device=device).view(1, 1, 1, w),
                "channels": torch.arange(c, device=device).view(1, c, 1, 1),
            }
        return self._index_cache[key]

    def cutout(self, images: Tensor, drawn: Tensor | None = None) -> Tensor:
        """torchvision's ``RandomErasing(p=1, scale=CUTOUT_SCALE, ratio=(1, 1), value=0)``
        per image: a square of side round(sqrt(s H W)), s ~ U(scale), at a uniform position,
        set to 0 in every channel (the normalised data set mean). ``drawn``: the rows side,
        top, left on ``images``' device; None: drawn here."""
        b, c, h, w = images.shape
        if drawn is None:
            self.prepare(images)
            drawn = self._draw_cutout(b, h, w).to(images.device)
        side, top, left = (r.view(b, 1, 1, 1) for r in drawn.unbind(0))
        index = self._indices(c, h, w, images.device)
        rows, cols = index["rows"], index["cols"]
        inside = (rows >= top) & (rows < top + side) & (cols >= left) & (cols < left + side)
        return images.masked_fill(inside, 0.0)

    def _mean_std(self, device: torch.device) -> tuple[Tensor, Tensor]:
        key = str(device)
        if key not in self._moments:
            mean, std = (torch.tensor(m, device=device) for m in (self.spec.mean, self.spec.std))
            self._moments[key] = (mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1))
        return self._moments[key]

    def normalize(self, images: Tensor) -> Tensor:
        """(x / 255 - mean) / std with the data set's channel means and deviations."""
        mean, std = self._mean_std(images.device)
        return (images.float() / 255.0 - mean) / std

    def __call__(self, images: Tensor) -> Tensor:
        """The view of uint8 ``images`` (B, C, H, W), drawn here: float32, channels-last (the
        networks' layout, :func:`fedlit.models.build_classifier`)."""
        self.check(images)
        self.prepare(images)
        drawn = self.draw(*images.shape[:1], *images.shape[2:])
        return self.apply(images, drawn.to(images.device, non_blocking=True))

    @staticmethod
    def check(images: Tensor) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(
                f"expected uint8 images (B, C, H, W), got {images.dtype} {tuple(images.shape)}"
            )

    def apply(self, images: Tensor, drawn: Tensor) -> Tensor:
        """The view of uint8 ``images`` (B, C, H, W) with its draws ``drawn`` (:meth:`draw`'s
        rows, on ``images``' device), after :meth:`prepare`: tensor work alone, no draw, no
        transfer and no read back (a compiled step traces it). float32, channels-last."""
        if self.view == "plain" or len(images) == 0:
            out = self.normalize(images)
        else:
            out = self.weak_geometry(images, drawn[:3])
            if self.view == "weak":
                out = self.normalize(out)
            else:
                ops = drawn[3 : 3 + RANDAUGMENT_OPS].T
                out = self.randaugment.apply(out, ops)
                out = self.cutout(self.normalize(out), drawn[3 + RANDAUGMENT_OPS :])
        return out.contiguous(memory_format=torch.channels_last)


@cache
def _ends(h: int, w: int) -> Tensor:
    """(2, 1) int64 [[h + 1], [w + 1]] on the CPU, made once per size (read, never written)."""
    return torch.tensor([[h + 1], [w + 1]])


@cache
def batch_view(view: str, spec: DatasetSpec) -> BatchView:
    """The (shared, stateless) :class:`BatchView` of ``view`` for data set ``spec``."""
    return BatchView(view, spec)


# --- a fit's draws, a chunk of steps at once -------------------------------------------------
#: Steps drawn at once: one rand call, one transfer per this many steps of a batch shape.
CHUNK = 64


@dataclass
class _Stream:
    """One batch shape's draws: its generator, the chunk drawn last and the next step in it."""

    generator: torch.Generator
    steps: list[tuple[Tensor, ...]] = field(default_factory=list)
    next: int = 0


class FitDraws:
    """Every step's view draws for one fit, from a generator of its own.

    Made at the start of a fit, it takes one draw from torch's global CPU generator as its
    seed (the federation seeds that generator per fit, so a fit's draws follow the run's seed,
    on any executor and after a resume). :meth:`draw` gives a batch's rows, view by view, as
    :meth:`~fedlit.data.loaders.RawBatch.draw` takes them. Each batch shape (the views, the
    batch's size and image size, its device) draws from a generator of its own, seeded from
    the fit's at its first batch, so two loaders of one fit (a ``CombinedLoader``) never
    change each other's draws. A shape's steps are its uniforms (K, rows, B) taken in order
    from its generator, so the chunk's length ``chunk`` does not change the values: fedlit's
    loop makes one for each fit (:meth:`for_fit`).

    Args:
        chunk: steps drawn at once (K).
    """

    def __init__(self, chunk: int = CHUNK) -> None:
        if chunk < 1:
            raise ValueError(f"chunk must be a positive number of steps, got {chunk}")
        self.chunk = chunk
        seed = int(torch.randint(2**62, ()))  # one draw from the global generator
        self.generator = torch.Generator().manual_seed(seed)
        self._streams: dict[tuple[tuple[BatchView, ...], int, int, int, torch.device], _Stream]
        self._streams = {}

    @classmethod
    def for_fit(cls, planned_steps: int) -> FitDraws:
        """A fit's draws, its chunk the fit's ``planned_steps`` up to :data:`CHUNK` (no step
        drawn that the fit will not take)."""
        return cls(max(1, min(CHUNK, planned_steps)))

    def draw(
        self, views: tuple[BatchView, ...], b: int, h: int, w: int, device: torch.device
    ) -> tuple[Tensor, ...]:
        """The next step's draws of ``views`` for b images of h x w on ``device``: each view's
        (its :meth:`BatchView.rows`, B) int64 on ``device``, in order. Views of the current
        chunk, split by view once a chunk: no draw, no transfer and no op but once a chunk."""
        key = (views, b, h, w, device)
        stream = self._streams.get(key)
        if stream is None:
            seed = int(torch.randint(2**62, (), generator=self.generator))
            stream = self._streams[key] = _Stream(torch.Generator().manual_seed(seed))
        if stream.next == len(stream.steps):
            chunk = self._chunk(views, b, h, w, stream.generator)
            parts = chunk.to(device, non_blocking=True).split([v.rows() for v in views], 1)
            stream.steps = list(zip(*(part.unbind(0) for part in parts), strict=True))
            stream.next = 0
        stream.next += 1
        return stream.steps[stream.next - 1]

    def _chunk(
        self, views: tuple[BatchView, ...], b: int, h: int, w: int, generator: torch.Generator
    ) -> Tensor:
        """``chunk`` steps' draws (K, rows, B) on the CPU: one uniform per row and image, each
        view's mapped to its rows by :meth:`BatchView.from_uniforms`."""
        rows = [view.rows() for view in views]
        uniforms = torch.rand((self.chunk, sum(rows), b), generator=generator)
        parts = uniforms.split(rows, dim=1)
        return torch.cat([v.from_uniforms(u, h, w) for v, u in zip(views, parts, strict=True)], 1)
