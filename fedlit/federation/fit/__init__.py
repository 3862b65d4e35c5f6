"""How a module is fitted, in one package with one rule (:func:`how_to_fit`): a user's own
LightningModule in a Lightning Trainer (:mod:`~fedlit.federation.fit.trainer`), fedlit's
objectives and evaluator in fedlit's loop (:mod:`~fedlit.federation.fit.loop`), eager,
compiled or one call a step (:mod:`~fedlit.federation.fit.compiled`), under the run's
``trainer`` settings (:class:`TrainerTemplate`)."""

from fedlit.federation.fit.settings import How, TrainerTemplate, default_precision, how_to_fit

__all__ = ["How", "TrainerTemplate", "default_precision", "how_to_fit"]
