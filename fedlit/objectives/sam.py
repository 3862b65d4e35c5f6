"""Sharpness-aware steps (SAM, Foret et al. 2021) for any objective, taken by fedlit's loop.

An objective opts in by returning a :class:`SharpnessAware` from its
:meth:`~fedlit.objectives.Objective.sharpness_aware` hook; its
:meth:`~fedlit.objectives.Objective.sam_losses` says which losses a step uses (by default
SAM's own: the step's loss, its gradient taken at the perturbed weights). The fit then takes
each optimiser step on :func:`sharpness_aware_gradients` instead of the loss's backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from fedlit.objectives.means import Logged


@dataclass(frozen=True)
class SharpnessAware:
    """SAM's settings: the perturbation's radius.

    Args:
        rho: the radius of the ascent step, eps = rho * g / ||g||_2 (Foret et al. 2021, eq 2;
            its default 0.05).
    """

    rho: float = 0.05

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rho) and self.rho > 0):
            raise ValueError(f"rho must be finite and > 0, got {self.rho}")

    def perturbation(self, grads: Sequence[Tensor | None]) -> list[Tensor | None]:
        """eps = rho * g / (||g||_2 + 1e-12), ||g||_2 the norm of every gradient together
        (None where a parameter has no gradient); tensors alone, nothing read back."""
        present = [g for g in grads if g is not None]
        if not present:
            return [None] * len(grads)
        norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g.float()) for g in present])
        )
        scale = self.rho / (norm + 1e-12)
        return [None if g is None else (g.float() * scale).to(g.dtype) for g in grads]


@dataclass
class SamLosses:
    """What one sharpness-aware step is made of.

    Args:
        loss: the step's loss at the weights w (logged; its gradient at w is added where
            ``keep``).
        logged: what the step logs.
        ascent: the loss whose gradient g at w gives the perturbation eps.
        perturbed: the loss evaluated at w + eps (called there); its gradient is added.
        keep: True: the update's gradient is grad loss(w) + grad perturbed(w + eps) (a
            sharpness term added to a loss, as (FL)^2's SACR); False: grad perturbed(w + eps)
            alone (SAM's own update).
    """

    loss: Tensor
    logged: Logged
    ascent: Tensor
    perturbed: Callable[[], Tensor]
    keep: bool = False


def sharpness_aware_gradients(
    sam: SharpnessAware, params: Sequence[Tensor], losses: SamLosses
) -> list[Tensor | None]:
    """The update's gradients of one sharpness-aware step (None for a parameter none reaches):
    g = grad ascent(w), eps = :meth:`SharpnessAware.perturbation` (g), then grad perturbed at
    w + eps, plus grad loss(w) where ``losses.keep``. The parameters hold w again after it
    (copied back, not subtracted)."""
    params = list(params)
    keep = losses.keep
    ascent = torch.autograd.grad(losses.ascent, params, allow_unused=True, retain_graph=keep)
    own: Sequence[Tensor | None] = [None] * len(params)
    if keep:
        own = torch.autograd.grad(losses.loss, params, allow_unused=True)
    eps = sam.perturbation(ascent)
    moved = [k for k, e in enumerate(eps) if e is not None]
    with torch.no_grad():
        saved = [params[k].detach().clone() for k in moved]
        shifts = [eps[k] for k in moved]
        torch._foreach_add_([params[k] for k in moved], shifts)  # type: ignore[arg-type]
    try:
        perturbed = torch.autograd.grad(losses.perturbed(), params, allow_unused=True)
    finally:
        with torch.no_grad():
            torch._foreach_copy_([params[k] for k in moved], saved)
    return [
        b if a is None else (a if b is None else a + b)
        for a, b in zip(own, perturbed, strict=True)
    ]
