"""Mixup within a batch (Zhang et al. 2018): each example mixed with its neighbour in the
batch's (shuffled) order, and the matching cross-entropy."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def beta_draws(alpha: float, count: int) -> Tensor:
    """``count`` mixing weights lam ~ Beta(alpha, alpha), float32 on the CPU, drawn in a forked
    generator seeded by one draw from torch's global CPU generator (the fit's seed decides
    them; no other draw moves)."""
    seed = int(torch.randint(2**62, ()))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        a = torch.tensor(float(alpha))
        return torch.distributions.Beta(a, a).sample((count,)).float()


def mixup(x: Tensor, lam: Tensor) -> Tensor:
    """lam x_b + (1 - lam) x_{b-1}: every example mixed with the one before it in the batch (the
    first with the last). A shuffled batch pairs each example with a random partner; the
    partner's index is ``torch.roll(arange(B), 1)``, as :func:`mixup_cross_entropy` takes it.

    Args:
        x: (B, ...) inputs.
        lam: the mixing weight, a scalar tensor in [0, 1].
    """
    return lam * x + (1 - lam) * x.roll(1, 0)


def mixup_cross_entropy(logits: Tensor, targets: Tensor, lam: Tensor) -> Tensor:
    """Per-example lam CE(logits_b, y_b) + (1 - lam) CE(logits_b, y_{b-1}): the loss of
    :func:`mixup`'s inputs on the mixed labels, (B,) float32.

    Args:
        logits: (B, K) logits on the mixed inputs.
        targets: (B,) the unmixed examples' (pseudo-)labels.
        lam: the mixing weight the inputs were mixed with.
    """
    own = F.cross_entropy(logits.float(), targets, reduction="none")
    partner = F.cross_entropy(logits.float(), targets.roll(1, 0), reduction="none")
    return lam * own + (1 - lam) * partner
