"""How every objective is optimised: the one home of the optimiser's hyperparameters."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from fedlit.objectives.schedules import WarmupCosine

OPTIMIZERS = ("sgd", "adam")
LR_SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class Optimization:
    """The optimiser settings of a method's server and client objectives (a recipe's
    ``model.init_args.optim``), validated here once, so a bad value stops the CLI before
    anything is written.

    Args:
        server_lr: learning rate of the server's objective.
        client_lr: learning rate of the clients' objective.
        optimizer: "sgd" or "adam", for server and clients.
        momentum: SGD momentum, in [0, 1).
        weight_decay: L2 weight decay, >= 0.
        lr_decay: per-round factor on both learning rates (lr * lr_decay ** (round - 1); paper
            002's 0.995).
        lr_schedule: "cosine" (default): both learning rates follow a warm-up + cosine schedule
            over the whole run (:class:`~fedlit.objectives.WarmupCosine`), stepped every
            optimiser step, the server's and the clients' steps of round r covering the run's
            fraction ((r - 1) / R, r / R); "constant": no schedule (``lr_decay`` only).
        warmup: fraction of the run spent warming up linearly (cosine schedule).
        cosine_c: the cosine's periodic coefficient: 0.5 decays to the floor at the end of the
            run; FixMatch's and paper 004's 7/16 to cos(7 pi / 16) ~ 0.2.
        cosine_eps: the schedule's floor (paper 004: 1e-4).
    """

    server_lr: float = 0.03
    client_lr: float = 0.03
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_decay: float = 1.0
    lr_schedule: Literal["constant", "cosine"] = "cosine"
    warmup: float = 0.0
    cosine_c: float = 0.5
    cosine_eps: float = 1e-4

    def __post_init__(self) -> None:
        for key, value in (("server_lr", self.server_lr), ("client_lr", self.client_lr)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"optim.{key} must be finite and > 0, got {value}")
        if not 0 < self.lr_decay <= 1:  # False for NaN too
            raise ValueError(f"optim.lr_decay must be in (0, 1], got {self.lr_decay}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optim.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"optim.momentum must be in [0, 1), got {self.momentum}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"optim.weight_decay must be finite and >= 0, got {self.weight_decay}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(
                f"optim.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}"
            )
        try:
            WarmupCosine(self.warmup, self.cosine_c, self.cosine_eps)
        except ValueError as err:
            raise ValueError(f"optim.warmup / optim.cosine_c / optim.cosine_eps: {err}") from err

    @property
    def schedule(self) -> WarmupCosine | None:
        """The run-level learning-rate schedule (None: constant)."""
        if self.lr_schedule == "constant":
            return None
        return WarmupCosine(self.warmup, self.cosine_c, self.cosine_eps)

    def objective_kwargs(self, lr: float, round_idx: int, total_rounds: int) -> dict[str, Any]:
        """An objective's optimiser settings in round ``round_idx`` of ``total_rounds``: the
        learning rate ``lr`` after ``lr_decay``, and the run-level schedule with the fraction of
        the run this round covers. Round 0 (a bootstrap before round 1) is not scheduled."""
        kw: dict[str, Any] = {
            "lr": lr * self.lr_decay ** max(round_idx - 1, 0),
            "optimizer": self.optimizer,
            "momentum": self.momentum,
            "weight_decay": self.weight_decay,
        }
        schedule = self.schedule
        if schedule is not None and round_idx >= 1:
            progress = ((round_idx - 1) / total_rounds, round_idx / total_rounds)
            kw |= {"schedule": schedule, "progress": progress}
        return kw
