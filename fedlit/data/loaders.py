"""Batches as index draws from uint8 tensors, augmented a whole batch at a time.

A split (a client's shard, the server's labeled set, the test set) stays one uint8 tensor
(N, C, H, W); :class:`ImageBatches` draws a batch of indices (a random permutation per epoch, or
in order) and slices it: no per-image ``__getitem__``, no collation. The views are computed on
the whole batch by :mod:`fedlit.data.augment`:

- iterated directly (a notebook, a manual loop), it yields the finished batch tuples on the CPU;
- inside fedlit's fit loop (:meth:`ImageBatches.on_device`, which the loop applies for a
  module that is :class:`AugmentsOnDevice`: fedlit's objectives and evaluator), it yields
  :class:`RawBatch` objects that the loop moves to the training device as uint8, then
  computes their views there (:func:`expand_batches`), on the GPU when there is one.

Either way a batch is ``(index?, view_1, ..., view_n, labels?)``: the index (B,) int64 with
``with_index``, one float32 tensor (B, C, H, W) per view, and the labels (B,) int64 when the
split carries them.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from fedlit.data.augment import VIEWS, BatchView, FitDraws, batch_view
from fedlit.data.datasets import DatasetSpec
from fedlit.data.mapped import MappedImages, Pixels, as_tensor


class RawBatch:
    """A batch before augmentation: uint8 ``images`` (B, C, H, W), optional ``index`` (B,) and
    ``labels`` (B,), and the ``views`` to compute. ``to(device)`` moves the tensors, so
    Lightning transfers it like any batch; :meth:`expand` computes the views where it lies."""

    __slots__ = ("batch_views", "images", "index", "labels", "spec", "views")

    def __init__(
        self,
        images: Tensor,
        views: tuple[str, ...],
        spec: DatasetSpec,
        index: Tensor | None = None,
        labels: Tensor | None = None,
        batch_views: tuple[BatchView, ...] | None = None,
    ) -> None:
        self.images, self.views, self.spec = images, views, spec
        self.index, self.labels = index, labels
        #: the views' :class:`~fedlit.data.augment.BatchView` objects, looked up once by the
        #: loader (None: looked up by :meth:`draw`)
        self.batch_views = batch_views

    def to(self, *args: Any, **kwargs: Any) -> RawBatch:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(*args, **kwargs)

        images = self.images.to(*args, **kwargs)
        return RawBatch(
            images, self.views, self.spec, move(self.index), move(self.labels), self.batch_views
        )

    def __len__(self) -> int:
        return len(self.images)

    def draw(self, fit_draws: FitDraws | None = None) -> DrawnBatch:
        """The batch with every view's random parameters drawn: taken from ``fit_draws``
        (the fit's, already on the device), or, without it, drawn from torch's global CPU
        generator, view after view, and moved to the images' device in one transfer."""
        views = self.batch_views or tuple(batch_view(v, self.spec) for v in self.views)
        BatchView.check(self.images)
        for view in views:
            view.prepare(self.images)
        b, _, h, w = self.images.shape
        rows = [view.rows() for view in views]
        device = self.images.device
        if sum(rows) and fit_draws is not None:
            draws = fit_draws.draw(views, b, h, w, device)
            return DrawnBatch(self.images, views, draws, self.index, self.labels)
        if sum(rows) and device.type == "cpu":  # where they are drawn: nothing to pack
            draws = tuple(view.draw(b, h, w) for view in views)
            return DrawnBatch(self.images, views, draws, self.index, self.labels)
        if sum(rows):
            packed = torch.cat([view.draw(b, h, w) for view in views])
            packed = packed.to(device, non_blocking=True)  # one transfer for every view
        else:
            packed = torch.empty((0, b), dtype=torch.int64, device=device)
        return DrawnBatch(self.images, views, packed.split(rows), self.index, self.labels)

    def expand(self) -> tuple[Tensor, ...]:
        """``(index?, view_1(x), ..., view_n(x), labels?)``, each view drawn independently."""
        return self.draw().expand()


class DrawnBatch(NamedTuple):
    """A batch whose random parameters are drawn, before its views are computed: what a
    compiled training step takes (:meth:`expand` is tensor work alone, no draw, no transfer).

    ``draws`` holds each view's rows (:meth:`~fedlit.data.augment.BatchView.draw`) on the
    images' device; ``positions`` is :class:`RawBatch`'s ``index``."""

    images: Tensor
    views: tuple[BatchView, ...]
    draws: tuple[Tensor, ...]
    positions: Tensor | None
    labels: Tensor | None

    def expand(self) -> tuple[Tensor, ...]:
        """``(index?, view_1(x), ..., view_n(x), labels?)``."""
        views = tuple(
            view.apply(self.images, drawn)
            for view, drawn in zip(self.views, self.draws, strict=True)
        )
        head = () if self.positions is None else (self.positions,)
        tail = () if self.labels is None else (self.labels,)
        return (*head, *views, *tail)


def _replaced(batch: Any, kinds: tuple[type, ...], replace: Any) -> Any:
    """``batch`` with every object of ``kinds`` in it (also inside the tuples, lists and dicts
    of a ``CombinedLoader``) replaced by ``replace(it)``; anything else as it is."""
    if isinstance(batch, kinds):
        return replace(batch)
    if isinstance(batch, dict):
        return {k: _replaced(v, kinds, replace) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and any(isinstance(b, kinds) for b in batch):
        return type(batch)(_replaced(b, kinds, replace) for b in batch)
    return batch


def expand_batches(batch: Any, fit_draws: FitDraws | None = None) -> Any:
    """``batch`` with every :class:`RawBatch` or :class:`DrawnBatch` in it (also inside the
    tuples, lists and dicts of a ``CombinedLoader``) replaced by its views (a raw batch's
    draws from ``fit_draws`` where given: :meth:`RawBatch.draw`); anything else is returned
    as it is."""

    def expand(b: RawBatch | DrawnBatch) -> tuple[Tensor, ...]:
        return (b.draw(fit_draws) if isinstance(b, RawBatch) else b).expand()

    if type(batch) is RawBatch:  # a loader's own batch: no walk through containers
        return expand(batch)
    return _replaced(batch, (RawBatch, DrawnBatch), expand)


def draw_batches(batch: Any, fit_draws: FitDraws | None = None) -> Any:
    """``batch`` with every :class:`RawBatch` in it replaced by its :class:`DrawnBatch` (the
    draws made, from ``fit_draws`` where given: :meth:`RawBatch.draw`; the views not yet
    computed), as :func:`expand_batches` walks it."""
    return _replaced(batch, (RawBatch,), lambda b: b.draw(fit_draws))


class AugmentsOnDevice:
    """Mark of the LightningModules that take these loaders' batches (objectives, the
    evaluator): fedlit's fit loop (:mod:`fedlit.federation.fit`) gives them
    :class:`RawBatch` objects and computes their views on the device the module runs on,
    after the transfer. Put it before ``LightningModule`` in the bases."""


#: Each split's tensor staged on a device, by (id of the split's tensor, device); an entry is
#: removed when that tensor is freed (so an id is never reused while its entry lives).
_STAGED: dict[tuple[int, torch.device], Tensor] = {}


def staged(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor`` on ``device``, copied there on first use and kept while ``tensor`` lives: a
    client's shard and the server's sets are staged once per run (a streaming client's chunk,
    a new tensor every visit, once per visit). ``tensor`` itself where it already lies there."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if tensor.device == device:
        return tensor
    key = (id(tensor), device)
    if key not in _STAGED:
        _STAGED[key] = tensor.to(device)
        weakref.finalize(tensor, _STAGED.pop, key, None)
    return _STAGED[key]


class ImageBatches:
    """Batches of ``views`` of uint8 ``images`` (N, C, H, W), by index draws.

    A split of mapped images (:class:`~fedlit.data.mapped.MappedImages`, too large for its
    cap) is never staged: each batch's rows are read from the file on the CPU, drawn as a
    tensor's would be there, and Lightning moves the batch to the training device.

    Args:
        images: the split's images, uint8 (a tensor or mapped).
        spec: their data set (sizes and statistics for the views).
        views: the views of each image a batch holds, in order (:data:`VIEWS`).
        batch_size: images per batch.
        shuffle: a new random order every epoch (torch's global generator of the images'
            device), else in order. Shuffled batches all have ``batch_size`` images (one
            shape per training loop): the last partial batch is dropped, a different random
            ``N mod batch_size`` images each epoch; a split smaller than one batch gives one
            batch of all of it (none if that is one image: BatchNorm cannot train on it).
            In order (evaluation), every image is in a batch and the last may be partial.
        labels: (N,) labels to append to every batch, or None.
        with_index: start every batch with the images' positions in ``images``.
    """

    def __init__(
        self,
        images: Pixels,
        spec: DatasetSpec,
        views: Sequence[str],
        batch_size: int,
        shuffle: bool,
        labels: Tensor | None = None,
        with_index: bool = False,
    ) -> None:
        unknown = [v for v in views if v not in VIEWS]
        if unknown:
            raise ValueError(f"unknown view {unknown[0]!r}; choose from {VIEWS}")
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype}")
        if labels is not None and len(labels) != len(images):
            raise ValueError(f"{len(labels)} labels for {len(images)} images")
        self.images, self.spec, self.views = images, spec, tuple(views)
        self.batch_size, self.shuffle = batch_size, shuffle
        self.labels, self.with_index = labels, with_index
        self.deferred = False

    @property
    def num_examples(self) -> int:
        return len(self.images)

    def __len__(self) -> int:
        n, b = len(self.images), self.batch_size
        if not self.shuffle:
            return -(-n // b)
        return n // b if n >= b else int(n > 1)

    def on_device(self, device: torch.device | None = None) -> ImageBatches:
        """A copy that yields :class:`RawBatch` objects, to be expanded after the transfer to
        the training device (:func:`expand_batches`). With ``device``, the split's tensors are
        staged there (:func:`staged`: copied once, while the split lives) and the batches are
        drawn there by index, so the fit loop's transfer moves nothing; mapped images stay
        where they are."""
        deferred = copy.copy(self)
        deferred.deferred = True
        if device is not None and not isinstance(self.images, MappedImages):
            deferred.images = staged(self.images, device)
            deferred.labels = None if self.labels is None else staged(self.labels, device)
        return deferred

    def __iter__(self) -> Iterator[Any]:
        n, b, device = len(self.images), self.batch_size, self.images.device
        order = torch.randperm(n, device=device) if self.shuffle else torch.arange(n, device=device)
        # a tensor's batch: in order, a slice of it (a view, no copy); shuffled, its rows by
        # index_select (the same values as images[idx], at a tenth of its host time)
        images, views = self.images, tuple(batch_view(v, self.spec) for v in self.views)
        for k in range(len(self)):
            idx = order[k * b : (k + 1) * b]
            rows: slice | Tensor = slice(k * b, (k + 1) * b) if not self.shuffle else idx
            raw = RawBatch(
                _rows(images, rows) if isinstance(images, Tensor) else as_tensor(images[idx]),
                self.views,
                self.spec,
                index=idx if self.with_index else None,
                labels=None if self.labels is None else _rows(self.labels, rows),
                batch_views=views,
            )
            yield raw if self.deferred else raw.expand()


def _rows(tensor: Tensor, rows: slice | Tensor) -> Tensor:
    """``tensor[rows]``: a slice's view, or an index's rows copied by ``index_select``."""
    return tensor[rows] if isinstance(rows, slice) else tensor.index_select(0, rows)
