"""A user's own LightningModule, fitted by a Lightning Trainer as Lightning documents it."""

from __future__ import annotations

import logging
import signal
import warnings
from collections.abc import Iterable
from typing import Any

from lightning import LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException

# A Trainer per fit would otherwise print its device banner and worker hints every time.
for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda"):
    logging.getLogger(_name).setLevel(logging.WARNING)
warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
warnings.filterwarnings("ignore", message=r".*LeafSpec.*")  # lightning internals, torch 2.14

TERMINATED = 128 + signal.SIGTERM  # the exit status of a run stopped by SIGTERM


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
    steps = -1 if max_steps is None else max_steps  # -1: Lightning's "no limit"
    trainer = build(settings, max_epochs=epochs if max_steps is None else -1, max_steps=steps)
    trainer.fit(module, train_dataloaders=loader)
    _stop_if_terminated(trainer)
    return {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}


def _stop_if_terminated(trainer: Trainer) -> None:
    """Stop the run if the Trainer caught a SIGTERM: Lightning's handler only sets a flag,
    raised at the next batch or epoch, so one caught in the last would die with the Trainer."""
    if trainer.received_sigterm:
        raise SIGTERMException(TERMINATED)
