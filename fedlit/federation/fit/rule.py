"""How a module is fitted: one rule, in :func:`how_to_fit`."""

from __future__ import annotations

import os
from typing import Literal, Protocol

import torch
from lightning import LightningModule
from torch import nn

from fedlit.evaluation.evaluator import Evaluator
from fedlit.federation.fit.compiled import compiles_whole
from fedlit.federation.fit.loop import PRECISIONS
from fedlit.objectives.base import Objective


class FitSettings(Protocol):
    """What the rule reads of a run's settings (:class:`~fedlit.federation.TrainerTemplate`)."""

    @property
    def compile(self) -> str | None: ...

    @property
    def gradient_clip_val(self) -> float | int | None: ...

    @property
    def detect_anomaly(self) -> bool: ...

    def decided_precision(self) -> int | str: ...


#: How a fit runs (:func:`how_to_fit`).
How = Literal["trainer", "eager", "compiled", "one call"]

#: Set to 0, a compiled fit's step is three calls (the step, its backward, the optimiser's
#: step), not one; 1 or unset: one.
ONE_CALL_ENV = "FEDLIT_ONE_CALL"

#: The methods of LightningModule fedlit's loop calls on an objective (besides
#: :class:`~fedlit.objectives.Objective`'s own hooks) and the evaluator's.
LOOP_CALLS = frozenset(
    {"configure_optimizers", "training_step", "forward", "test_step", "on_test_epoch_start"}
)


#: LightningModule's public methods besides ``nn.Module``'s (its own and its mixins' hooks and
#: step methods) that fedlit's loop does not call.
_HOOKS = frozenset(
    name
    for cls in LightningModule.__mro__
    if cls not in (nn.Module, object)
    for name, value in vars(cls).items()
    if callable(value) and not name.startswith("_")
) - LOOP_CALLS


def uncalled_hooks(module: nn.Module) -> list[str]:
    """LightningModule's hooks that ``module``'s class (an objective or the evaluator)
    overrides and fedlit's loop does not call."""
    base = Objective if isinstance(module, Objective) else Evaluator
    kind = type(module)
    return sorted(h for h in _HOOKS if getattr(kind, h, None) is not getattr(base, h, None))


def one_call_asked() -> bool:
    """Whether ``FEDLIT_ONE_CALL`` lets a compiled fit take its step as one call: "1" or unset
    yes, "0" no; any other value is refused, naming it."""
    value = os.environ.get(ONE_CALL_ENV, "1").strip()
    if value not in ("0", "1", ""):
        raise ValueError(
            f"{ONE_CALL_ENV}={os.environ[ONE_CALL_ENV]!r}: 1 (a compiled step is one call, the "
            "default) or 0 (three calls: the step, its backward, the optimiser's step)"
        )
    return value != "0"


def how_to_fit(module: nn.Module, settings: FitSettings) -> How:
    """How ``module`` is fitted (or tested) under ``settings``: the only place that decides.

    - A LightningModule of the user's own (not a fedlit
      :class:`~fedlit.objectives.Objective` or :class:`~fedlit.evaluation.Evaluator`):
      ``"trainer"``, a Lightning Trainer of the ``trainer`` settings, as Lightning documents
      it. ``federation.compile`` is refused for it (compile it in its own code).
    - fedlit's objectives and evaluator: fedlit's loop (:mod:`fedlit.federation.fit.loop`),
      never a Trainer. The ``trainer`` settings it does not take are refused before the run
      (:func:`~fedlit.federation.checks.check_trainer`); an objective that overrides a
      LightningModule hook the loop does not call, or optimises by hand, is refused here,
      naming it. Then:

      - ``"eager"``: ``federation.compile`` unset (and always for the evaluator);
      - ``"one call"``: compiled, the step, its backward and the optimiser's update one
        compiled call (:class:`~fedlit.federation.fit.compiled.OneCallStep`), where nothing
        needs them apart: no gradient clipping, no fp16 gradient scaler, no anomaly
        detection, and ``FEDLIT_ONE_CALL`` not 0 (an optimiser a graph does not hold, SGD or
        Adam of one group, takes three calls);
      - ``"compiled"``: compiled, as three calls, elsewhere.
    """
    name = type(module).__name__
    if not isinstance(module, (Objective, Evaluator)):
        if settings.compile is not None:
            raise ValueError(
                f"federation.compile={settings.compile!r}: {name} is a LightningModule of your "
                "own, fitted by a Lightning Trainer as Lightning documents it; compile it in "
                "its own code, or leave federation.compile null"
            )
        return "trainer"
    hooks = uncalled_hooks(module)
    if hooks:
        raise ValueError(
            f"{name} overrides {', '.join(hooks)}: LightningModule hooks fedlit's loop does "
            "not call; an objective uses its own hooks (before_fit, after_step, after_fit: "
            "fedlit.objectives.Objective)"
        )
    if not module.automatic_optimization:
        raise ValueError(f"{name}.automatic_optimization is False: fedlit's loop optimises")
    if settings.compile is None or isinstance(module, Evaluator):
        return "eager"
    if not compiles_whole(module):
        raise ValueError(
            f"federation.compile={settings.compile!r}: {name} defines no step(batch), which "
            "the compiled fit takes; leave federation.compile null"
        )
    apart = settings.gradient_clip_val or settings.detect_anomaly
    fp16 = PRECISIONS.get(settings.decided_precision()) is torch.float16
    return "compiled" if apart or fp16 or not one_call_asked() else "one call"
