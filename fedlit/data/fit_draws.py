"""A compiled fit's random draws for its views, made for many steps at once.

Eager, each batch draws its views' parameters when it is expanded: 6-12 small calls on
torch's global CPU generator per view, then one transfer, every step (the host cost is
measured in ``benchmarks/step_call.py``, its figures in the docs' Host time section). A
compiled fit (``federation.compile``) instead takes them from a :class:`FitDraws`: a chunk of
steps drawn in a few whole-tensor ops and moved to the device in one transfer, each step then
taking its slice. The rows and their distributions are the views' own
(:meth:`~fedlit.data.augment.BatchView.draw` and
:meth:`~fedlit.data.augment.BatchView.from_uniforms`); only the random stream differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from fedlit.data.augment import BatchView

#: Steps drawn at once: one rand call, one transfer per this many steps of a batch shape.
CHUNK = 64


@dataclass
class _Stream:
    """One batch shape's draws: its generator, the chunk drawn last and the next step in it."""

    generator: torch.Generator
    steps: Tensor = field(default_factory=lambda: torch.empty(0))
    next: int = 0


class FitDraws:
    """Every step's view draws for one fit, from a generator of its own.

    Made at the start of a fit, it takes one draw from torch's global CPU generator as its
    seed (the federation seeds that generator per fit, so a fit's draws follow the run's seed,
    on any executor and after a resume). :meth:`draw` gives a batch's packed rows, as
    :meth:`~fedlit.data.loaders.RawBatch.draw` packs them. Each batch shape (the views, the
    batch's size and image size, its device) draws from a generator of its own, seeded from
    the fit's at its first batch, so two loaders of one fit (a ``CombinedLoader``) never
    change each other's draws. A shape's steps are its uniforms (K, rows, B) taken in order
    from its generator, so the chunk's length ``chunk`` does not change the values.

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

    def draw(
        self, views: tuple[BatchView, ...], b: int, h: int, w: int, device: torch.device
    ) -> Tensor:
        """The next step's draws of ``views`` for b images of h x w on ``device``: (the sum of
        the views' :meth:`~fedlit.data.augment.BatchView.rows`, B) int64 on ``device``, view
        after view. A slice of the current chunk: no draw and no transfer but once a chunk."""
        key = (views, b, h, w, device)
        stream = self._streams.get(key)
        if stream is None:
            seed = int(torch.randint(2**62, (), generator=self.generator))
            stream = self._streams[key] = _Stream(torch.Generator().manual_seed(seed))
        if stream.next == len(stream.steps):
            chunk = self._chunk(views, b, h, w, stream.generator)
            stream.steps = chunk.to(device, non_blocking=True)  # one transfer a chunk
            stream.next = 0
        stream.next += 1
        return stream.steps[stream.next - 1]

    def _chunk(
        self, views: tuple[BatchView, ...], b: int, h: int, w: int, generator: torch.Generator
    ) -> Tensor:
        """``chunk`` steps' draws (K, rows, B) on the CPU: one uniform per row and image, each
        view's mapped to its rows by :meth:`~fedlit.data.augment.BatchView.from_uniforms`."""
        rows = [view.rows() for view in views]
        uniforms = torch.rand((self.chunk, sum(rows), b), generator=generator)
        parts = uniforms.split(rows, dim=1)
        return torch.cat([v.from_uniforms(u, h, w) for v, u in zip(views, parts, strict=True)], 1)
