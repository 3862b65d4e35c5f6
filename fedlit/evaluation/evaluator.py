"""Top-1 accuracy and loss of a network on a labeled loader, as a LightningModule."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning import LightningModule
from torch import Tensor, nn
from torchmetrics.functional.classification import multiclass_accuracy

from fedlit.data.loaders import AugmentsOnDevice


class Evaluator(AugmentsOnDevice, LightningModule):
    """Runs ``network`` over (x, y) batches and keeps the metrics (fedlit's loop runs it:
    :func:`fedlit.federation.fit.loop.test`).

    After the test, :meth:`metrics` gives accuracy (a fraction in [0, 1], torchmetrics) and
    mean cross-entropy.
    """

    def __init__(self, network: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.network = network
        self.num_classes = num_classes
        self._loss_sum = torch.zeros(())
        self._count = 0
        self._predicted: list[tuple[Tensor, Tensor]] = []

    def on_test_epoch_start(self) -> None:
        self._loss_sum = torch.zeros((), device=self.device)
        self._count = 0
        self._predicted = []

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """A batch's loss summed, its predicted classes kept: the accuracy takes them all in
        one update when it is read (micro accuracy counts; batching changes no count)."""
        x, y = batch
        logits = self.network(x).float()
        self._predicted.append((logits.argmax(-1), y))
        self._loss_sum = self._loss_sum + F.cross_entropy(logits, y, reduction="sum").detach()
        self._count += len(y)

    def metrics(self, prefix: str = "test") -> dict[str, float]:
        """``<prefix>/acc`` and ``<prefix>/loss`` of the batches since the test began (the
        accuracy: torchmetrics' micro multiclass accuracy, 0 without a batch)."""
        accuracy = 0.0
        if self._predicted:
            predicted, labels = (torch.cat(t) for t in zip(*self._predicted, strict=True))
            accuracy = float(
                multiclass_accuracy(
                    predicted, labels, self.num_classes, average="micro", validate_args=False
                )
            )
        return {
            f"{prefix}/acc": accuracy,
            f"{prefix}/loss": float(self._loss_sum) / max(self._count, 1),
        }

    def correct(self) -> list[bool]:
        """Which examples since the test began the network classified right, in the loader's
        order."""
        if not self._predicted:
            return []
        predicted, labels = (torch.cat(t) for t in zip(*self._predicted, strict=True))
        return [bool(c) for c in (predicted == labels).cpu().tolist()]
