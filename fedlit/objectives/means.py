"""What a training step logs and the running means an objective keeps of it."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import NamedTuple, TypeAlias

import numpy as np
import torch
from torch import Tensor


class Hits(NamedTuple):
    """A step's top-1 accuracy as it logs it: the mean of ``logits.argmax(-1) == labels``,
    ``logits`` (B, C) and ``labels`` (B,). An eager fit keeps the two tensors as they are (a
    step's outputs, which nothing changes after it) and computes the means of many steps in
    one batched op when they are read (:meth:`RunningMeans.read`): each step's value bit for
    bit what :meth:`fraction` gives, without four ops a step."""

    logits: Tensor
    labels: Tensor

    def fraction(self) -> Tensor:
        """The mean of the hits: a float32 scalar."""
        return (self.logits.argmax(-1) == self.labels).float().mean()


#: What a training step logs: (weight, {name: value}) pairs, each added to the fit's running
#: means by :meth:`~fedlit.objectives.Objective.accumulate` (values: scalar tensors, Python
#: numbers or :class:`Hits`).
Logged: TypeAlias = tuple[tuple[float, Mapping[str, Tensor | float | Hits]], ...]

#: The logits the means keep for their :class:`Hits` at most (elements) before they reduce
#: them: a bound on the memory they take (16 MiB of float32).
HITS_KEPT = 1 << 22


def as_fractions(logged: Logged) -> Logged:
    """``logged`` with each :class:`Hits` made its fraction (inside a compiled step's graph,
    whose outputs a later step may overwrite)."""
    return tuple(
        (w, {k: v.fraction() if isinstance(v, Hits) else v for k, v in values.items()})
        for w, values in logged
    )


class RunningMeans:
    """Weighted running means of named values, read without a host-device sync until
    :meth:`read`.

    Each call's tensors are stacked into one float32 vector on their device (one op) and kept
    with its weight; Python numbers are summed on the host; eager :class:`Hits` are kept as
    they are (at most :data:`HITS_KEPT` logits, then made fractions on their device).
    :meth:`read` copies every kept value to the host at once and adds each group of names
    (those of one call) call after call, in call order, in float32 (NumPy's
    ``add.accumulate``: sequential, unlike a reduction's pairwise order). A name's sum is the
    same alone or beside others."""

    __slots__ = ("_steps", "_sums", "_host_sums", "_weights", "_hits", "_hits_kept")

    def __init__(self) -> None:
        self._steps: dict[tuple[str, ...], list[tuple[float, Tensor]]] = {}
        self._sums: dict[tuple[str, ...], np.ndarray] = {}
        self._host_sums: dict[str, float] = {}
        self._weights: dict[str, float] = {}
        self._hits: dict[str, list[tuple[float, Hits]]] = {}
        self._hits_kept = 0  # the kept Hits' logits' elements

    def add(self, weight: float, values: Mapping[str, Tensor | float | Hits], eager: bool) -> None:
        """Add ``values`` weighted by ``weight``; ``eager``: :class:`Hits` may be kept (else
        made a fraction at once: a compiled step's outputs may be overwritten)."""
        weights, names, tensors = self._weights, [], []
        for name, value in values.items():
            weights[name] = weights.get(name, 0.0) + weight
            if isinstance(value, Hits):
                if eager:
                    self._keep_hits(name, weight, value)
                    continue
                value = value.fraction()
            if isinstance(value, Tensor):
                names.append(name)
                tensors.append(value.detach())  # out of the graph
            else:
                self._host_sums[name] = self._host_sums.get(name, 0.0) + float(value) * weight
        if not tensors:
            return
        device, f32 = tensors[0].device, torch.float32
        kept = [v if v.dtype == f32 and v.device == device else v.to(device, f32) for v in tensors]
        self._steps.setdefault(tuple(names), []).append((weight, torch.stack(kept)))

    def read(self) -> dict[str, float]:
        """The mean of each name added so far."""
        self._reduce_hits()
        # the kept vectors of each device to the host in one op and one copy
        vectors: dict[torch.device, list[Tensor]] = {}
        filled: dict[torch.device, int] = {}  # the elements of each device's vectors so far
        spans = []
        for names, steps in self._steps.items():
            device = steps[0][1].device
            start = filled.get(device, 0)
            filled[device] = start + len(steps) * len(names)
            spans.append((names, steps, device, start))
            vectors.setdefault(device, []).extend(v for _, v in steps)
        flat = {device: torch.cat(kept).cpu().numpy() for device, kept in vectors.items()}
        for names, steps, device, start in spans:
            values = flat[device][start : start + len(steps) * len(names)]
            self._add_sums(names, values.reshape(len(steps), len(names)), [w for w, _ in steps])
        self._steps = {}
        totals = dict(self._host_sums)
        for names, sums in self._sums.items():
            for name, value in zip(names, sums.tolist(), strict=True):
                totals[name] = totals.get(name, 0.0) + value
        return {k: totals[k] / w for k, w in self._weights.items()}

    def _keep_hits(self, name: str, weight: float, hits: Hits) -> None:
        self._hits.setdefault(name, []).append((weight, Hits(hits.logits.detach(), hits.labels)))
        self._hits_kept += hits.logits.numel()
        if self._hits_kept > HITS_KEPT:
            self._reduce_hits()

    def _reduce_hits(self) -> None:
        """The kept :class:`Hits` made fractions on their device, each run of one shape, dtype
        and device in one batched op, and kept as one name's values (no read back)."""
        for name, kept in self._hits.items():
            steps = self._steps.setdefault((name,), [])
            for _, run in itertools.groupby(kept, key=lambda wh: _shape(wh[1].logits)):
                weights, hits = zip(*run, strict=True)
                logits = torch.stack([h.logits for h in hits])
                labels = torch.stack([h.labels for h in hits])
                fractions = (logits.argmax(-1) == labels).float().mean(-1, keepdim=True)
                steps += zip(weights, fractions.unbind(0), strict=True)
        self._hits, self._hits_kept = {}, 0

    def _add_sums(self, names: tuple[str, ...], values: np.ndarray, weights: list[float]) -> None:
        weighted = values * np.array([[w] for w in weights], dtype=np.float32)
        if names in self._sums:
            weighted = np.concatenate([self._sums[names][None], weighted])
        self._sums[names] = np.add.accumulate(weighted, axis=0)[-1]


def _shape(t: Tensor) -> tuple[torch.Size, torch.dtype, torch.device]:
    """What stacking needs alike: shape, dtype and device."""
    return t.shape, t.dtype, t.device
