"""The shared base of every server and client objective."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
from lightning import LightningModule
from torch import Tensor, nn

from fedlit.data.augment import FitDraws
from fedlit.data.loaders import AugmentsOnDevice
from fedlit.models import Classifier
from fedlit.objectives.fedprox import FedProx
from fedlit.objectives.means import Hits, Logged, RunningMeans, as_fractions
from fedlit.objectives.optimization import OPTIMIZERS
from fedlit.objectives.sam import SamLosses, SharpnessAware
from fedlit.objectives.schedules import WarmupCosine

#: A training step's result: the loss to minimise and what the step logs.
Step: TypeAlias = tuple[Tensor, Logged]


class KeptOptimizers:
    """A worker's optimiser, kept across the objectives that train its persistent networks
    (one per optimiser kind: "sgd", "adam"): asked for the same parameters again, it is reset
    in place to the state a new one starts from (every state tensor zero: SGD's momentum
    buffers, Adam's moments and step counts; the settings given; no scheduler's
    ``initial_lr``), which trains bit for bit as a new one; asked for other parameters (a
    network built anew), a new one replaces it."""

    def __init__(self) -> None:
        self._kept: dict[str, torch.optim.Optimizer] = {}

    def get(
        self,
        kind: str,
        params: list[nn.Parameter],
        settings: dict[str, float],
        fused: bool = False,
    ) -> torch.optim.Optimizer:
        """The optimiser of ``kind`` over ``params`` with ``settings`` (lr, weight_decay and,
        for SGD, momentum), as new; ``fused``: torch's fused implementation (one kernel per
        step over all parameters, for a compiled step), else the multi-tensor ``foreach``."""
        key = f"{kind}-fused" if fused else kind
        kept = self._kept.get(key)
        if kept is not None and _same_parameters(kept, params):
            group = kept.param_groups[0]
            group.pop("initial_lr", None)
            group.update(settings)
            buffers = [v for s in kept.state.values() for v in s.values() if isinstance(v, Tensor)]
            if buffers:
                torch._foreach_zero_(buffers)  # one op, not one a buffer
            return kept
        lr, decay = settings["lr"], settings["weight_decay"]
        # foreach: a few multi-tensor ops per step instead of a few ops per parameter (torch's
        # default on a GPU already; on a CPU it makes the same per-tensor updates)
        foreach, fuse = (None, True) if fused else (True, None)
        if kind == "adam":
            optimizer: torch.optim.Optimizer = torch.optim.Adam(
                params, lr=lr, weight_decay=decay, foreach=foreach, fused=fuse
            )
        else:
            momentum = settings["momentum"]
            optimizer = torch.optim.SGD(
                params, lr=lr, momentum=momentum, weight_decay=decay, foreach=foreach, fused=fuse
            )
        self._kept[key] = optimizer
        return optimizer


def _same_parameters(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> bool:
    groups = optimizer.param_groups
    return (
        len(groups) == 1
        and len(groups[0]["params"]) == len(params)
        and all(a is b for a, b in zip(groups[0]["params"], params, strict=True))
    )


@dataclass
class FitState:
    """What an objective reads of the fit that runs it: made by the fit
    (:mod:`fedlit.federation.fit`) and handed over whole as ``objective.fit_state``; nothing
    else writes it. Outside a fit it is the default: no step planned, eager, no FedProx.

    Args:
        planned_steps: the optimiser steps the fit plans.
        steps_taken: those taken so far (the fit counts them; they stay after it).
        kept_optimizers: a worker's optimisers to reuse (a client's objective on persistent
            networks), or None: a new optimiser every fit.
        compiled_step: the compiled whole step, ``(objective, drawn batch) -> Step``, where the
            fit runs compiled (:mod:`fedlit.federation.fit.compiled`); None: eager.
        compiled_mode: torch.compile's mode of a compiled fit.
        slots: where a compiled fit keeps the tensors :meth:`Objective.step_input` sets, one
            slot a name, the same for every fit of the worker's objective class and network.
        draws: the fit's draws of its views' parameters (made by the fit); None: outside
            a fit.
        fedprox: FedProx's term (:class:`~fedlit.objectives.fedprox.FedProx`), made by the fit
            where ``loss.mu`` > 0; None: none.
    """

    planned_steps: int = 0
    steps_taken: int = 0
    kept_optimizers: KeptOptimizers | None = None
    compiled_step: Callable[[Objective, Any], Step] | None = None
    compiled_mode: str | None = None
    slots: dict[str, Tensor] | None = None
    draws: FitDraws | None = None
    fedprox: FedProx | None = None

    @property
    def views_in_step(self) -> bool:
        """Whether the views are computed inside the (compiled) step, not before it."""
        return self.compiled_step is not None


class Objective(AugmentsOnDevice, LightningModule):
    """One training objective on ``network``: a loss in :meth:`step` and its optimiser.

    Objectives are built afresh by a method for every server step and every client step, so the
    round-dependent parts (loss weights, learning-rate decay across rounds) are given to them by
    the federation driver. Metrics are accumulated here (:meth:`accumulate`) and read by the
    driver with :meth:`epoch_metrics`.

    fedlit's loop fits an objective (:mod:`fedlit.federation.fit`), never a Lightning Trainer,
    and calls these methods, in this order, and no other of LightningModule's:

    1. ``configure_optimizers()``: one optimiser, or a dict of it and one ``lr_scheduler``
       (the rules: :func:`fedlit.federation.fit.loop.optimizer_and_scheduler`);
    2. :meth:`before_fit`, once the fit's first batches are drawn;
    3. for each batch: its views (:mod:`fedlit.data.loaders`), ``training_step`` (:meth:`step`
       with FedProx's term where ``loss.mu`` > 0: :meth:`fit_step`), the backward (where
       :meth:`sharpness_aware` gives SAM's settings: :meth:`sam_losses` and SAM's two
       gradients instead), the optimiser's step, a per-step scheduler's step, then
       :meth:`after_step`; after each epoch's last batch, a per-epoch scheduler's step;
    4. :meth:`after_fit`.

    A subclass that overrides another of LightningModule's hooks (``on_train_batch_end``,
    ``optimizer_step``, ...) is refused by name before its fit. What a fit hands over is one
    object, :attr:`fit_state` (:class:`FitState`): the steps planned and taken, the compiled
    step and its slots, the draws, the kept optimisers, FedProx's anchor.

    A subclass computes its loss in :meth:`step`, tensor work alone (what it logs is returned,
    not stored), so that the whole step (the views, every forward pass, the loss and its
    backward) can run as one compiled graph (``federation.compile``).

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
        self._means = RunningMeans()  # of what the steps log
        #: The fit being run, or last run (:class:`FitState`), set by the fit alone.
        self.fit_state = FitState()

    def planned_steps(self) -> int:
        """The optimiser steps of the fit being run."""
        return self.fit_state.planned_steps

    def steps_taken(self) -> int:
        """The optimiser steps taken so far in the fit being run (this one counted in
        :meth:`after_step`)."""
        return self.fit_state.steps_taken

    def before_fit(self) -> None:
        """Called once a fit has its optimiser and its first batches, before its first step
        (a round's inputs set with :meth:`step_input`, a target network copied)."""

    def after_step(self) -> None:
        """Called after each optimiser step, and a per-step scheduler's (an EMA's update)."""

    def after_fit(self) -> None:
        """Called after the fit's last step (what the fit alone needed let go)."""

    def step_input(self, name: str, value: Tensor) -> None:
        """Sets ``self.<name>`` to ``value`` on the objective's device: a tensor that
        :meth:`step` reads and that changes between fits (a round's loss weight, a client's
        pseudo-labels).

        Eager, it is ``value`` itself. Compiled, it is a slot kept for every fit of the worker
        (:attr:`FitState.slots`), ``value`` copied into it: a compiled step reads an nn.Module's
        tensor attributes as static inputs, whose memory a CUDA graph records
        (``reduce-overhead``), so a new tensor every fit would record the graphs anew every
        fit. A slot keeps its shape: ``value`` (N, ...) fills its first N rows where the slot
        has as many or more (rows past N are a longer earlier value's: the step indexes the
        first N alone), and a longer ``value`` takes a new slot (one more recording)."""
        value = value.to(self.device)
        slots = self.fit_state.slots
        if slots is not None:
            slot = slots.get(name)
            fits = (
                slot is not None
                and slot.dtype == value.dtype
                and slot.device == value.device
                and (
                    slot.shape == value.shape
                    if value.dim() == 0
                    else slot.shape[1:] == value.shape[1:] and len(slot) >= len(value)
                )
            )
            if fits:
                assert slot is not None
                (slot if value.dim() == 0 else slot[: len(value)]).copy_(value)
            else:
                slot = slots[name] = value.clone()
            value = slot
        setattr(self, name, value)

    def sharpness_aware(self) -> SharpnessAware | None:
        """SAM's settings where the fit takes sharpness-aware steps
        (:func:`~fedlit.objectives.sam.sharpness_aware_gradients` on :meth:`sam_losses`);
        None, the default: plain steps. A compiled fit of an objective that returns one takes
        its steps eager (a compiled step holds one gradient, SAM's take two)."""
        return None

    def sam_losses(self, batch: Any) -> SamLosses:
        """The losses of one sharpness-aware step on ``batch`` (views computed): by default
        SAM's own, the step's loss (:meth:`fit_step`) for the ascent and again at the
        perturbed weights, whose gradient alone makes the update."""
        loss, logged = self.fit_step(batch)
        return SamLosses(loss, logged, loss, lambda: self.fit_step(batch)[0], keep=False)

    def step(self, batch: Any) -> Step:
        """One training step on a batch of views: its loss and what it logs. Tensor work alone:
        no side effect, no read back to the host, no Python branch on a tensor's value (a
        compiled fit traces it whole, with the views before it)."""
        raise NotImplementedError(f"{type(self).__name__} defines no step")

    def fit_step(self, batch: Any) -> Step:
        """:meth:`step`, FedProx's term added where the fit made one (:attr:`FitState.fedprox`):
        to the loss, and to the logged ``loss`` where it is the loss. In a compiled fit (which
        traces it) its :class:`~fedlit.objectives.Hits` are made fractions in the graph."""
        loss, logged = self.step(batch)
        if self.fit_state.compiled_step is not None:
            logged = as_fractions(logged)
        fedprox = self.fit_state.fedprox
        if fedprox is None:
            return loss, logged
        total = fedprox(self.network, loss)
        return total, tuple(
            (w, {k: total if k == "loss" and v is loss else v for k, v in values.items()})
            for w, values in logged
        )

    def proximal_mu(self) -> float:
        """FedProx's coefficient: ``self.loss.mu`` where the objective keeps settings that
        have one, else 0."""
        return float(getattr(getattr(self, "loss", None), "mu", 0.0) or 0.0)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        """:meth:`fit_step` (or the compiled whole step), its logs added to the running
        means."""
        compiled = self.fit_state.compiled_step
        loss, logged = self.fit_step(batch) if compiled is None else compiled(self, batch)
        self.record(logged)
        return loss

    def record(self, logged: Logged) -> None:
        """Adds what a step logs to the running means (:meth:`accumulate`)."""
        eager = self.fit_state.compiled_step is None
        for weight, values in logged:
            self._means.add(weight, values, eager)

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    def optimizer_and_scheduler(
        self, steps: int
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR | None]:
        """The optimiser, and the run-level schedule's per-step scheduler (None without a
        schedule) for a fit of ``steps`` optimiser steps over the run's fraction ``progress``."""
        params = [p for p in self.parameters() if p.requires_grad]
        settings: dict[str, float] = {"lr": self.lr, "weight_decay": self.weight_decay}
        if self.optimizer_name != "adam":
            settings["momentum"] = self.momentum
        state = self.fit_state
        optimizer = (state.kept_optimizers or KeptOptimizers()).get(
            self.optimizer_name, params, settings, fused=state.compiled_step is not None
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
        steps = self.planned_steps() if self.schedule is not None else 1
        optimizer, scheduler = self.optimizer_and_scheduler(steps)
        if scheduler is None:
            return optimizer
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def accumulate(self, weight: float = 1.0, **values: Tensor | float | Hits) -> None:
        """Add ``values`` (scalar tensors, Python numbers or :class:`~fedlit.objectives.Hits`),
        weighted by ``weight``, to the running means
        (:class:`~fedlit.objectives.means.RunningMeans`: nothing read back, no host-device sync
        inside a training step)."""
        self._means.add(weight, values, eager=self.fit_state.compiled_step is None)

    def epoch_metrics(self) -> dict[str, float]:
        """Means of everything accumulated since the objective was built (one read of the
        values; each name's sum float32, added call after call in call order)."""
        return self._means.read()
