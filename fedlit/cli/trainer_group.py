"""The ``trainer`` group of a recipe: its keys (the settings of fedlit's per-step Trainers,
the run directory, the loggers) and the ``lightning.Trainer`` arguments fedlit never applied."""

from __future__ import annotations

import inspect
from dataclasses import fields
from typing import Any

from lightning import Trainer

from fedlit.federation import TrainerTemplate

#: The ``trainer`` group's keys: the per-step Trainers' settings, the run directory, the loggers.
TRAINER_KEYS = (
    *(f.name for f in fields(TrainerTemplate) if f.name != "compile"),
    "default_root_dir",
    "logger",
)
#: ``lightning.Trainer``'s other arguments and their defaults: a run directory's config.yaml
#: written before fedlit had a ``trainer`` group of its own lists them all.
LIGHTNING_ONLY = {
    name: parameter.default
    for name, parameter in inspect.signature(Trainer.__init__).parameters.items()
    if name != "self" and name not in TRAINER_KEYS
}


def without_lightning_defaults(trainer: dict[str, Any]) -> dict[str, Any]:
    """A config's ``trainer`` group without the ``lightning.Trainer`` arguments fedlit never
    applied (:data:`LIGHTNING_ONLY`) that hold Lightning's default, as a run directory's
    config.yaml of an earlier fedlit lists them. Raises ValueError naming one that holds
    another value."""
    for key, value in trainer.items():
        if key in LIGHTNING_ONLY and value != LIGHTNING_ONLY[key]:
            raise ValueError(
                f"trainer.{key}={value!r}: a Lightning Trainer setting fedlit never applied "
                "(it runs each server and client step on its own: lengths are "
                "federation.rounds, federation.local_epochs, federation.server_epochs; logging "
                "and checkpoints are the federation's); remove it. trainer keys: "
                + ", ".join(TRAINER_KEYS)
            )
    return {k: v for k, v in trainer.items() if k not in LIGHTNING_ONLY}


