"""The run's ``trainer`` settings (:class:`TrainerTemplate`) and the defaults fedlit decides
for them."""

from __future__ import annotations

import os
import sys
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import torch
from lightning import LightningModule

from fedlit.evaluation.evaluator import Evaluator
from fedlit.federation.fit import loop, rule, trainer
from fedlit.federation.fit.compiled import whole_step_compiled
from fedlit.federation.fit.loop import LoopSettings, on_device
from fedlit.objectives.base import Objective

#: A ``trainer.precision`` value (Lightning's spellings).
PrecisionInput = int | str

#: Set to "0" or "1", says whether this CPU computes bf16 natively instead of asking torch (the
#: tests set "0", so that they run in fp32 on every CPU, in subprocesses and workers too).
CPU_BF16_ENV = "FEDLIT_CPU_BF16"


def cpu_computes_bf16() -> bool:
    """Whether this CPU computes bf16 natively: AVX-512 BF16 or AMX tiles, as torch's CPU
    capability checks see them (:data:`CPU_BF16_ENV` overrides them)."""
    forced = os.environ.get(CPU_BF16_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


def default_precision(accelerator: str = "auto", cpu_bf16: bool | None = None) -> PrecisionInput:
    """The precision of a run that leaves ``trainer.precision`` unset: on a GPU, bf16 mixed
    where supported, else fp16 mixed; on a CPU, bf16 mixed where it computes bf16 natively
    (``cpu_bf16``; None: :func:`cpu_computes_bf16`), else fp32 (bf16 emulated is slower)."""
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
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
        limit_train_batches: batches per epoch (a number, or a fraction of the loader).
        detect_anomaly: torch's autograd anomaly detection.
        compile: torch.compile's mode for the whole training step (``federation.compile``,
            not a ``trainer`` key; :mod:`fedlit.federation.fit.compiled`).
    """

    accelerator: str = "auto"
    devices: list[int] | str | int = 1
    precision: PrecisionInput | None = None
    strategy: str = "auto"
    gradient_clip_val: float | int | None = None
    gradient_clip_algorithm: str | None = None
    accumulate_grad_batches: int = 1
    deterministic: bool | Literal["warn"] | None = None
    benchmark: bool | None = None
    limit_train_batches: float | int | None = None
    detect_anomaly: bool = False
    compile: str | None = None

    def settings(self) -> dict[str, Any]:
        """The ``lightning.Trainer`` arguments these settings give (all but ``compile``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "compile"}

    def device(self) -> torch.device:
        """The device fits and evaluations train on (the first GPU where there is one and
        the accelerator allows it), for work done outside a Trainer."""
        gpu = self.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
        return torch.device("cuda") if gpu else torch.device("cpu")

    def resolved(self) -> TrainerTemplate:
        """These settings with ``precision`` decided (:func:`default_precision` where it is
        unset), once, in the driver's process: every client and worker then trains in the
        same precision. On a CPU, 16-mixed is bf16-mixed, as Lightning has it (CPU autocast
        in fp16 is slow and has no gradient scaler); stderr says so, naming the key."""
        precision = self.decided_precision()
        if precision != (self.precision or precision):
            print(
                f"warning: trainer.precision={self.precision!r} on a CPU: {precision} is used "
                "instead",
                file=sys.stderr,
            )
        return replace(self, precision=precision)

    def decided_precision(self) -> PrecisionInput:
        """``precision``, or :func:`default_precision` where it is unset; 16-mixed on a CPU is
        bf16-mixed."""
        precision = self.precision or default_precision(self.accelerator)
        if precision in ("16-mixed", "16") and self.device().type == "cpu":
            return "bf16-mixed"
        return precision

    def loop(self) -> LoopSettings:
        """What fedlit's loop takes of these settings (:mod:`fedlit.federation.fit.loop`)."""
        device = self.device()
        if device.type == "cuda":
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
        how = rule.how_to_fit(module, self)
        if how == "trainer":
            return trainer.fit(module, loader, epochs, max_steps, self.resolved().settings())
        assert isinstance(module, Objective)
        settings = self.loop()
        batches = on_device(module, loader, settings.device)
        fields: AbstractContextManager[dict[str, Any]] = (
            whole_step_compiled(module, self.compile) if self.compile else nullcontext({})
        )
        with fields as compiled:
            one_call = how == "one call"
            loop.fit(module, batches, epochs, max_steps, settings, compiled, one_call, kept)
        return module.epoch_metrics()

    def test(self, module: LightningModule, loader: Any) -> None:
        """Run ``module``'s test over ``loader`` as :func:`~fedlit.federation.fit.how_to_fit`
        says (its metrics stay in the module)."""
        if rule.how_to_fit(module, self) == "trainer":
            trainer.test(module, loader, self.resolved().settings())
            return
        assert isinstance(module, Evaluator)
        settings = self.loop()
        loop.test(module, on_device(module, loader, settings.device), settings)
