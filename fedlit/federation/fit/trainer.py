"""A user's own LightningModule, fitted by a Lightning Trainer as Lightning documents it."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from typing import Any

from lightning import LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException

from fedlit.federation.faults import TERMINATED

# A Trainer per fit would otherwise print its device banner and worker hints every time.
for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda"):
    logging.getLogger(_name).setLevel(logging.WARNING)
warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
warnings.filterwarnings("ignore", message=r".*LeafSpec.*")  # lightning internals, torch 2.14


def build(settings: dict[str, Any], **length: Any) -> Trainer:
    """A Trainer of the run's ``trainer`` settings and ``length``, with no logger, checkpoint,
    progress bar, summary or sanity check (the driver's): ``self.log`` fills
    ``callback_metrics``."""
    return Trainer(
        **settings,
        **length,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )


def fit(
    module: LightningModule,
    loader: Iterable[Any],
    epochs: int,
    max_steps: int | None,
    settings: dict[str, Any],
) -> dict[str, float]:
    """Train ``module`` in a Trainer for ``epochs`` epochs (or ``max_steps`` steps); what it
    logged with ``self.log`` (``callback_metrics``), as floats."""
    length: dict[str, Any] = {"max_epochs": epochs if max_steps is None else -1}
    if max_steps is not None:
        length["max_steps"] = max_steps
    trainer = build(settings, **length)
    trainer.fit(module, train_dataloaders=loader)
    _stop_if_terminated(trainer)
    return {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}


def _stop_if_terminated(trainer: Trainer) -> None:
    """Stop the run if the Trainer caught a SIGTERM: Lightning's handler only sets a flag,
    raised at the next batch or epoch, so one caught in the last would die with the Trainer."""
    if trainer.received_sigterm:
        raise SIGTERMException(TERMINATED)
