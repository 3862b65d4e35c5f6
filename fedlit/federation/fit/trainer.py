"""A user's own LightningModule, fitted and tested by a Lightning Trainer as Lightning
documents it; and a run's answer to SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
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
    length: dict[str, Any] = {"max_epochs": epochs if max_steps is None else -1}
    if max_steps is not None:
        length["max_steps"] = max_steps
    trainer = build(settings, **length)
    trainer.fit(module, train_dataloaders=loader)
    _stop_if_terminated(trainer)
    return {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}


def test(module: LightningModule, loader: Iterable[Any], settings: dict[str, Any]) -> None:
    """Run ``module``'s test loop over ``loader`` in a Trainer."""
    trainer = build(settings)
    trainer.test(module, dataloaders=loader, verbose=False)
    _stop_if_terminated(trainer)


def _stop_if_terminated(trainer: Trainer) -> None:
    """Stop the run if the Trainer caught a SIGTERM: Lightning's handler only sets a flag,
    raised at the next batch or epoch, so one caught in the last would die with the Trainer."""
    if trainer.received_sigterm:
        raise SIGTERMException(TERMINATED)


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """While a run runs (in the main thread), make a SIGTERM stop it cleanly wherever it comes.

    Inside a Trainer's fit, Lightning's handler is the one installed (it calls this one after
    its own): the run stops at that fit's end (:func:`_stop_if_terminated`). Anywhere else
    (fedlit's loop, aggregation, writing metrics or a checkpoint, waiting for Ray's workers),
    the signal raises :class:`SIGTERMException` at once, so the run's ``finally`` blocks run
    (a half-written file's temporary removed, Ray shut down, the lock released) and
    ``fedlit fit`` exits with status 143. Either way the last checkpoint is whole.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        if signal.getsignal(signal.SIGTERM) is handler:  # not inside a Trainer's fit
            raise SIGTERMException(TERMINATED)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
