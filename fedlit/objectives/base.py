"""The shared base of every server and client objective."""

from __future__ import annotations

from typing import Any

import torch
from lightning import LightningModule
from torch import Tensor

from fedlit.data.loaders import AugmentsOnDevice
from fedlit.models import Classifier
from fedlit.objectives.optimization import OPTIMIZERS
from fedlit.objectives.schedules import WarmupCosine


class Objective(AugmentsOnDevice, LightningModule):
    """One training objective on ``network``: a loss in ``training_step`` and its optimiser.

    Objectives are built afresh by a method for every server step and every client step, so the
    round-dependent parts (loss weights, learning-rate decay across rounds) are given to them by
    the federation driver, never read from Lightning's ``global_step``, which restarts with every
    Trainer. Metrics are accumulated here (no ``self.log``: client Trainers run bare) and read by
    the driver with :meth:`epoch_metrics`.

    Batches arrive as the loaders of :mod:`fedlit.data.loaders` make them: augmented on the
    device the objective trains on, right after the transfer.

    ``schedule`` (optional) scales the learning rate every step by ``schedule(p)``, where p moves
    linearly over ``progress`` = (start, end), the fraction of the whole run this fit covers.
    """

    def __init__(
        self,
        network: Classifier,
        lr: float,
        optimizer: str = "sgd",
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        schedule: WarmupCosine | None = None,
        progress: tuple[float, float] = (0.0, 1.0),
    ) -> None:
        super().__init__()
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        self.network = network
        self.lr = lr
        self.optimizer_name = optimizer
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.schedule = schedule
        self.progress = progress
        # running weighted sums: one device vector per group of names accumulated together
        # (read once, by epoch_metrics), host floats for Python numbers, and each name's weight
        self._sums: dict[tuple[str, ...], Tensor] = {}
        self._host_sums: dict[str, float] = {}
        self._weights: dict[str, float] = {}

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    def optimizer_and_scheduler(
        self, steps: int
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR | None]:
        """The optimiser, and the run-level schedule's per-step scheduler (None without a
        schedule) for a fit of ``steps`` optimiser steps over the run's fraction ``progress``."""
        params = [p for p in self.parameters() if p.requires_grad]
        # foreach: a few multi-tensor ops per step instead of a few ops per parameter (torch's
        # default on a GPU already; on a CPU it makes the same per-tensor updates)
        if self.optimizer_name == "adam":
            optimizer: torch.optim.Optimizer = torch.optim.Adam(
                params, lr=self.lr, weight_decay=self.weight_decay, foreach=True
            )
        else:
            optimizer = torch.optim.SGD(
                params,
                lr=self.lr,
                momentum=self.momentum,
                weight_decay=self.weight_decay,
                foreach=True,
            )
        if self.schedule is None:
            return optimizer, None
        start, end = self.progress
        steps = max(steps, 1)
        schedule = self.schedule

        def factor(step: int) -> float:
            return schedule(start + (end - start) * min(step / steps, 1.0))

        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    def configure_optimizers(self) -> Any:
        steps = int(self.trainer.estimated_stepping_batches) if self.schedule is not None else 1
        optimizer, scheduler = self.optimizer_and_scheduler(steps)
        if scheduler is None:
            return optimizer
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Log the learning rate each optimiser step uses: ``lr`` is its mean over the fit
        (``server/lr``, ``client/lr`` in a round's row)."""
        self.accumulate(1.0, lr=float(optimizer.param_groups[0]["lr"]))

    def accumulate(self, weight: float = 1.0, **values: Tensor | float) -> None:
        """Add ``values`` (scalar tensors or Python numbers), weighted by ``weight``, to the
        running means.

        Nothing is read back: the tensors of one call are stacked into one vector and added to
        the running sum of that group of names on their device (a few ops, no host-device sync
        inside a training step); :meth:`epoch_metrics` reads the sums once."""
        tensors = {k: v for k, v in values.items() if isinstance(v, Tensor)}
        for name, value in values.items():
            self._weights[name] = self._weights.get(name, 0.0) + weight
            if name not in tensors:
                self._host_sums[name] = self._host_sums.get(name, 0.0) + float(value) * weight
        if not tensors:
            return
        names = tuple(tensors)
        device = next(iter(tensors.values())).device
        stacked = torch.stack([v.detach().to(device, torch.float32) for v in tensors.values()])
        stacked = stacked * weight
        self._sums[names] = self._sums[names] + stacked if names in self._sums else stacked

    def epoch_metrics(self) -> dict[str, float]:
        """Means of everything accumulated since the objective was built (one read of each
        group's sums)."""
        totals = dict(self._host_sums)
        for names, sums in self._sums.items():
            for name, value in zip(names, sums.tolist(), strict=True):
                totals[name] = totals.get(name, 0.0) + value
        return {k: totals[k] / w for k, w in self._weights.items()}
