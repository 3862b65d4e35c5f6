"""The run's ``trainer`` settings (:class:`TrainerTemplate`), the defaults fedlit decides for
them, and the one rule that decides from them how a module is fitted (:func:`how_to_fit`)."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import torch
from lightning import LightningModule
from torch import nn

from fedlit.evaluation.evaluator import Evaluator
from fedlit.federation.fit import loop, trainer
from fedlit.federation.fit.compiled import whole_step_compiled
from fedlit.federation.fit.loop import PRECISIONS, LoopSettings, on_device
from fedlit.machine import cpu_computes_bf16
from fedlit.objectives.base import Objective

#: A ``trainer.precision`` value (Lightning's spellings).
PrecisionInput = int | str

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
_HOOKS = {
    name
    for cls in LightningModule.__mro__
    if cls not in (nn.Module, object)
    for name, value in vars(cls).items()
    if callable(value) and not name.startswith("_") and name not in LOOP_CALLS
}


def default_precision(accelerator: str = "auto", cpu_bf16: bool | None = None) -> PrecisionInput:
    """The precision of a run that leaves ``trainer.precision`` unset: on a GPU, bf16 mixed
    where it computes bf16 natively (compute capability 8.0 and up: Ampere and later), else
    fp16 mixed (a T4, V100 or RTX 20xx: torch emulates bf16 there, and cuDNN has no bf16
    convolutions); on a CPU, bf16 mixed where it computes bf16 natively (``cpu_bf16``; None:
    :func:`~fedlit.machine.cpu_computes_bf16`), else fp32 (bf16 emulated is slower)."""
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        # not is_bf16_supported(): by default it counts emulation (a T4 says yes)
        native = bool(torch.version.hip) or torch.cuda.get_device_capability() >= (8, 0)
        return "bf16-mixed" if native else "16-mixed"
    if cpu_bf16 is None:
        cpu_bf16 = cpu_computes_bf16()
    return "bf16-mixed" if cpu_bf16 else "32-true"


@dataclass(frozen=True)
class TrainerTemplate:
    """The settings every fit and evaluation shares: a recipe's ``trainer`` group.

    The group also names the run directory and the loggers, the federation's own. How each
    fit runs, :func:`~fedlit.federation.fit.how_to_fit` decides (the values fedlit's loop does
    not take are refused before the run: :func:`~fedlit.federation.checks.check_trainer`).
    Every setting but ``compile`` is the ``lightning.Trainer`` argument of the same name, with
    its default.

    Args:
        accelerator: "cpu", "gpu", "cuda", "mps" or "auto" (a GPU where there is one).
        devices: the devices each Trainer uses (a number, a list of indices or "auto").
        precision: e.g. "32-true", "bf16-mixed"; None: :func:`default_precision` (bf16 mixed
            on a GPU and on a CPU that computes bf16 natively, fp32 on other CPUs).
        strategy: Lightning's strategy (``"auto"``: one device).
        gradient_clip_val: the gradient norm (or value) clipped to; 0 or None: no clipping.
        gradient_clip_algorithm: "norm" or "value".
        accumulate_grad_batches: batches whose gradients make one optimizer step.
        deterministic: torch's deterministic algorithms (True, False or "warn").
        benchmark: cuDNN's benchmark mode.
        limit_train_batches: batches per epoch, as Lightning has it: an integer is a number of
            batches (1: one batch), a float a fraction of the loader (1.0: all of it).
        detect_anomaly: torch's autograd anomaly detection.
        compile: torch.compile's mode for the whole training step (``federation.compile``,
            not a ``trainer`` key; :mod:`fedlit.federation.fit.compiled`).
    """

    accelerator: str = "auto"
    devices: list[int] | str | int = 1
    precision: PrecisionInput | None = None
    strategy: str = "auto"
    gradient_clip_val: int | float | None = None
    gradient_clip_algorithm: str | None = None
    accumulate_grad_batches: int = 1
    deterministic: bool | Literal["warn"] | None = None
    benchmark: bool | None = None
    limit_train_batches: int | float | None = None
    detect_anomaly: bool = False
    compile: str | None = None

    def settings(self) -> dict[str, Any]:
        """The ``lightning.Trainer`` arguments these settings give (all but ``compile``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "compile"}

    def device(self) -> torch.device:
        """The device fits and evaluations train on, for work done outside a Trainer: the GPU
        ``devices`` names (a list of one index, or "i,"; a number or "auto": the current
        one) where there is one and the accelerator allows it, else the CPU."""
        gpu = self.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
        if not gpu:
            return torch.device("cpu")
        index = gpu_index(self.devices)
        return torch.device("cuda") if index is None else torch.device("cuda", index)

    def resolved(self) -> TrainerTemplate:
        """These settings with :meth:`decided_precision` (once, in the driver's process, so
        that every client and worker trains in the same precision)."""
        return replace(self, precision=self.decided_precision())

    def decided_precision(self) -> PrecisionInput:
        """``precision``, or :func:`default_precision` where it is unset; 16-mixed on a CPU is
        bf16-mixed, as Lightning has it (CPU autocast in fp16 is slow and has no gradient
        scaler)."""
        precision = self.precision or default_precision(self.accelerator)
        if precision in ("16-mixed", "16", 16) and self.device().type == "cpu":
            return "bf16-mixed"
        return precision

    def loop(self) -> LoopSettings:
        """What fedlit's loop takes of these settings (:mod:`fedlit.federation.fit.loop`)."""
        device = self.device()
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        same = (f.name for f in fields(LoopSettings) if f.name not in ("device", "precision"))
        return LoopSettings(device, self.decided_precision(), **{k: getattr(self, k) for k in same})

    def fit(
        self,
        module: LightningModule,
        loader: Any,
        epochs: int,
        max_steps: int | None = None,
        kept: Any = None,
    ) -> dict[str, float]:
        """Train ``module`` on ``loader`` for ``epochs`` epochs (or ``max_steps`` steps) as
        :func:`~fedlit.federation.fit.how_to_fit` says; ``kept``: a worker's optimisers to
        reuse. Its metrics: an objective's means, a Trainer's ``callback_metrics``."""
        how = how_to_fit(module, self)
        if how == "trainer":
            return trainer.fit(module, loader, epochs, max_steps, self.resolved().settings())
        assert isinstance(module, Objective)
        settings = self.loop()
        batches = on_device(module, loader, settings.device)
        compiled: AbstractContextManager[dict[str, Any]] = nullcontext({})
        if self.compile:
            compiled = whole_step_compiled(module, self.compile)
        with compiled as fields:
            loop.fit(module, batches, epochs, max_steps, settings, fields, how == "one call", kept)
        return module.epoch_metrics()

    def test(self, evaluator: Evaluator, loader: Any) -> None:
        """Run fedlit's evaluator over ``loader`` in fedlit's loop, eager (its metrics stay in
        the evaluator)."""
        if not isinstance(evaluator, Evaluator):
            raise TypeError(f"{type(evaluator).__name__}: test runs fedlit's Evaluator only")
        settings = self.loop()
        loop.test(evaluator, on_device(evaluator, loader, settings.device), settings)


def gpu_index(devices: list[int] | str | int) -> int | None:
    """The GPU index ``trainer.devices`` names (``[i]`` or ``"i,"``, Lightning's spellings of
    one index), or None (a number of devices or "auto": the current GPU). More than one
    device is refused before the run (:func:`~fedlit.federation.checks.check_trainer`)."""
    try:
        if isinstance(devices, str) and devices.strip() != "auto" and "," in devices:
            devices = [int(d) for d in devices.split(",") if d.strip()]
        if isinstance(devices, (list, tuple)) and devices:
            return int(devices[0])
    except (TypeError, ValueError):  # not an index: Lightning's check names it
        pass
    return None


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


def how_to_fit(module: nn.Module, settings: TrainerTemplate) -> How:
    """How ``module`` is fitted under ``settings``: the only place that decides.

    - A LightningModule of the user's own (not a fedlit
      :class:`~fedlit.objectives.Objective`): ``"trainer"``, a Lightning Trainer of the
      ``trainer`` settings, as Lightning documents it. ``federation.compile`` is refused for
      it (compile it in its own code).
    - fedlit's objectives: fedlit's loop (:mod:`fedlit.federation.fit.loop`), never a
      Trainer. The ``trainer`` settings it does not take are refused before the run
      (:func:`~fedlit.federation.checks.check_trainer`); an objective that overrides a
      LightningModule hook the loop does not call, or optimises by hand, is refused here,
      naming it. Then:

      - ``"eager"``: ``federation.compile`` unset;
      - ``"one call"``: compiled, the step, its backward and the optimiser's update one
        compiled call (:class:`~fedlit.federation.fit.compiled.OneCallStep`), where nothing
        needs them apart: no gradient clipping, no fp16 gradient scaler, no anomaly
        detection, and ``FEDLIT_ONE_CALL`` not 0 (an optimiser a graph does not hold, SGD or
        Adam of one group, takes three calls);
      - ``"compiled"``: compiled, as three calls, elsewhere.

    fedlit's evaluator always runs in fedlit's loop, eager (:meth:`TrainerTemplate.test`).
    """
    kind = type(module)
    name = kind.__name__
    if not isinstance(module, Objective):
        if settings.compile is not None:
            raise ValueError(
                f"federation.compile={settings.compile!r}: {name} is a LightningModule of your "
                "own, fitted by a Lightning Trainer as Lightning documents it; compile it in "
                "its own code, or leave federation.compile null"
            )
        return "trainer"
    hooks = sorted(h for h in _HOOKS if getattr(kind, h, None) is not getattr(Objective, h, None))
    if hooks:
        raise ValueError(
            f"{name} overrides {', '.join(hooks)}: LightningModule hooks fedlit's loop does "
            "not call; an objective uses its own hooks (before_fit, after_step, after_fit: "
            "fedlit.objectives.Objective)"
        )
    if not module.automatic_optimization:
        raise ValueError(f"{name}.automatic_optimization is False: fedlit's loop optimises")
    if settings.compile is None:
        return "eager"
    if type(module).step is Objective.step:
        raise ValueError(
            f"federation.compile={settings.compile!r}: {name} defines no step(batch), which "
            "the compiled fit takes; leave federation.compile null"
        )
    apart = settings.gradient_clip_val or settings.detect_anomaly
    fp16 = PRECISIONS.get(settings.decided_precision()) is torch.float16
    return "compiled" if apart or fp16 or not one_call_asked() else "one call"
