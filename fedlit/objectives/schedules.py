"""Schedules and ramps: functions of how far the run (or a step count) has got, in one place.

The learning-rate schedule of every objective, the EMA decays' ramp-ups and the loss weights
that grow or shrink over a run. Each is a function of a fraction of the run, or of a step count,
so a shorter run is the same schedule compressed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class WarmupCosine:
    """Linear warm-up, then cosine decay with a floor (paper 004 eq 9, as in FixMatch).

    gamma(p) = gamma * p / warmup for p < warmup, else
    gamma * max(cos(pi * c * (p - warmup) / (1 - warmup)), eps), with p in [0, 1] the fraction
    of the whole run's iterations done (the paper's t / (E M / B); warm-up = e / E).

    Args:
        warmup: fraction of the run spent warming up (paper 004: 5 of 300 epochs).
        c: the periodic coefficient (FixMatch's 7/16 decays once to cos(7 pi / 16) ~ 0.2).
        eps: the floor of the factor (paper 004: 1e-4).
    """

    warmup: float = 0.0
    c: float = 7 / 16
    eps: float = 1e-4

    def __post_init__(self) -> None:
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup must be in [0, 1), got {self.warmup}")
        if not (math.isfinite(self.c) and self.c > 0) or not 0 <= self.eps <= 1:
            raise ValueError(f"need c > 0 and eps in [0, 1], got c={self.c}, eps={self.eps}")

    def __call__(self, progress: float) -> float:
        p = min(max(progress, 0.0), 1.0)
        if p < self.warmup:
            return max(p / self.warmup, self.eps)
        cos = math.cos(math.pi * self.c * (p - self.warmup) / (1.0 - self.warmup))
        return max(cos, self.eps)


def ramped_decay(step: int, upper: float) -> float:
    """EMA decay with ramp-up: min(1 - 1/(step + 1), upper) (the "upper EMA decay" of paper
    001 IV-E, as in Mean Teacher): the target forgets the early, inaccurate online weights fast."""
    return min(1.0 - 1.0 / (step + 1), upper)


def gaussian_rampup(progress: float, ramp: float) -> float:
    """exp(-5 (1 - min(p / p_r, 1))^2) (Laine & Aila 2017): small early, 1 from p_r on, with
    p the fraction of the run done and p_r the fraction the ramp spans (0: 1 throughout)."""
    if ramp <= 0:
        return 1.0
    x = min(max(progress, 0.0) / ramp, 1.0)
    return math.exp(-5.0 * (1.0 - x) ** 2)


def feature_map_weight(lambda_s: float, round_idx: int, total_rounds: int) -> float:
    """lambda_s^(t/T): 1 in round 0, lambda_s after the last round (paper 000 4.1.1)."""
    return float(lambda_s ** (round_idx / total_rounds))
