"""fedlit's loop: an objective's fit and the evaluator's test, owned by fedlit.

Its contract is its own, not a Lightning Trainer's: it calls the objective's methods that
:class:`~fedlit.objectives.Objective` lists, in that order, and no other. Precision is torch's
autocast (with its gradient scaler in fp16), clipping torch's ``clip_grad_norm_`` or
``clip_grad_value_``."""

from __future__ import annotations

import copy
import itertools
import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch
from lightning.fabric.utilities import move_data_to_device
from lightning.pytorch.utilities.combined_loader import CombinedLoader

from fedlit.data.augment import FitDraws
from fedlit.data.loaders import AugmentsOnDevice, ImageBatches, draw_batches, expand_batches
from fedlit.evaluation.evaluator import Evaluator
from fedlit.federation.fit.compiled import OneCallStep, one_call_step
from fedlit.objectives.base import FitState, KeptOptimizers, Objective
from fedlit.objectives.fedprox import FedProx
from fedlit.objectives.sam import sharpness_aware_gradients

#: ``trainer.precision`` values the loop takes, and autocast's dtype for each (None: fp32).
PRECISIONS: dict[Any, torch.dtype | None] = {
    "32-true": None,
    "32": None,
    32: None,
    "bf16-mixed": torch.bfloat16,
    "bf16": torch.bfloat16,
    "16-mixed": torch.float16,
    "16": torch.float16,
    16: torch.float16,  # Lightning's alias of 16-mixed
}


#: fp16's gradient scaler of each network the run fits without a worker's kept optimisers (the
#: server's networks, in the driver's process), kept across its fits: a new one starts at
#: 2**16, which overflows (and skips) the first steps of a network such as ResNet-18 at every
#: fit. A client's fit (on a worker's persistent network) gets a new scaler every fit: a
#: worker's kept one would make a client's update depend on the clients its worker ran before
#: (and so on the executor and its workers).
SCALERS: weakref.WeakKeyDictionary[torch.nn.Module, torch.amp.GradScaler] = (
    weakref.WeakKeyDictionary()
)
#: Scalers' states read from a checkpoint (:func:`restore_scalers`), each taken by its
#: network's first fp16 fit.
_SAVED_SCALERS: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Any]] = (
    weakref.WeakKeyDictionary()
)


def kept_scaler(network: torch.nn.Module, device: torch.device) -> torch.amp.GradScaler:
    """``network``'s fp16 gradient scaler, made on its first fit (from its checkpointed state
    where a resume restored one) and kept for the run's later fits (:data:`SCALERS`)."""
    scaler = SCALERS.get(network)
    if scaler is None:
        scaler = SCALERS[network] = torch.amp.GradScaler(device.type)
        saved = _SAVED_SCALERS.pop(network, None)
        if saved:
            scaler.load_state_dict(saved)
    return scaler


def scaler_states(root: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """The fp16 scalers' states of ``root``'s submodules (by module name; a checkpoint's
    ``scalers``): plain numbers, loadable with ``weights_only``."""
    return {
        name: SCALERS[module].state_dict()
        for name, module in root.named_modules()
        if module in SCALERS
    }


def restore_scalers(root: torch.nn.Module, states: Mapping[str, dict[str, Any]]) -> None:
    """Set ``root``'s submodules' fp16 scalers to ``states`` (:func:`scaler_states`): a
    resumed run scales as the run it continues."""
    for name, state in states.items():
        module = root.get_submodule(name)
        if module in SCALERS:
            SCALERS[module].load_state_dict(state)
        else:
            _SAVED_SCALERS[module] = dict(state)


#: fp16 steps skipped in a row (the scale halved each time) that stop a fit: its loss is not
#: finite.
MAX_SKIPPED = 100


def scaled_step(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """The scaler's optimiser step and update, after its ``unscale_``; whether the step was
    taken (False: a gradient was inf or NaN, the optimiser not called and the scale backed
    off). The gradients' check is read on the host, as ``scaler.step`` reads it anyway."""
    found = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
    taken = not sum(v.item() for v in found.values())
    if taken:  # a fused optimiser told to skip still makes its first step's momentum buffers
        scaler.step(optimizer)  # (torch.empty_like: garbage its next step reads)
    scaler.update()
    return taken


@dataclass(frozen=True)
class LoopSettings:
    """What fedlit's loop takes of a run's ``trainer`` settings (all checked before the run)."""

    device: torch.device
    precision: Any = "32-true"
    gradient_clip_val: int | float | None = None
    gradient_clip_algorithm: str | None = None
    limit_train_batches: int | float | None = None
    detect_anomaly: bool = False
    deterministic: bool | str | None = None
    benchmark: bool | None = None

    def set_torch_flags(self) -> None:
        """torch's deterministic algorithms and cuDNN's benchmark mode, where set."""
        if self.deterministic is not None:
            warn = self.deterministic == "warn"
            torch.use_deterministic_algorithms(bool(self.deterministic), warn_only=warn)
        if self.benchmark is not None:
            torch.backends.cudnn.benchmark = self.benchmark

    def autocast(self) -> tuple[str, torch.dtype] | None:
        """(device type, dtype) of the precision's autocast; None in fp32."""
        dtype = PRECISIONS[self.precision]
        return None if dtype is None else (self.device.type, dtype)

    def forward_context(self) -> AbstractContextManager[Any]:
        """The precision's autocast (no cache of cast weights), or nothing in fp32."""
        how = self.autocast()
        if how is None:
            return nullcontext()
        return torch.autocast(how[0], dtype=how[1], cache_enabled=False)


def limited(length: int, limit: int | float | None) -> int:
    """Batches of an epoch of ``length`` under ``limit_train_batches`` (a fraction, or a
    number); a fraction that leaves no batch of a loader that has some is refused."""
    if limit is None:
        return length
    if isinstance(limit, float):
        taken = int(length * limit) if limit != 1.0 else length
        if taken == 0 and length > 0:
            raise ValueError(
                f"trainer.limit_train_batches={limit!r}: {limit} of a loader of {length} "
                f"batches is less than one batch; use at least {1 / length:.3g}"
            )
        return taken
    return min(length, limit)


def batches(loader: Iterable[Any], limit: int | float | None) -> tuple[Iterable[Any], int]:
    """What each epoch iterates and the batches it takes: one loader, or several combined
    (``max_size_cycle``), each limited; a ``CombinedLoader``'s first iterator is made here."""
    if not isinstance(loader, (CombinedLoader, Mapping, list, tuple)):
        return loader, limited(len(loader), limit)  # type: ignore[arg-type]
    loaders = (
        loader if isinstance(loader, CombinedLoader) else CombinedLoader(loader, "max_size_cycle")
    )
    loaders.limits = [limited(len(dl), limit) for dl in loaders.flattened]
    iter(loaders)  # its length is known once its iterator is made
    return loaders, len(loaders)


def epoch(loader: Iterable[Any]) -> Iterator[Any]:
    """An epoch's batches of what :func:`batches` returns (a ``CombinedLoader``: of its
    iterator, made by ``iter``)."""
    if isinstance(loader, CombinedLoader):
        return (batch for batch, _, _ in iter(loader.__next__, None))
    return iter(loader)


def on_device(
    module: Any, loader: Iterable[Any], device: torch.device | None = None
) -> Iterable[Any]:
    """``loader`` set to augment on ``device`` where ``module`` computes its views after the
    transfer (:class:`~fedlit.data.loaders.AugmentsOnDevice`); else ``loader`` as it is."""
    if not isinstance(module, AugmentsOnDevice):
        return loader
    if isinstance(loader, ImageBatches):
        return loader.on_device(device)
    if isinstance(loader, CombinedLoader):
        moved = copy.copy(loader)
        moved.flattened = [on_device(module, dl, device) for dl in loader.flattened]
        return moved
    return loader


def views(batch: Any, device: torch.device, state: FitState | None = None) -> Any:
    """``batch`` on ``device``, its views' parameters drawn (from the fit's draws where it has
    them) and, unless the compiled step computes them, its views computed."""
    if device.type != "cpu":
        batch = move_data_to_device(batch, device)
    draws = state.draws if state is not None else None
    if state is not None and state.views_in_step:
        return draw_batches(batch, draws)
    return expand_batches(batch, draws)


def to_device(module: torch.nn.Module, device: torch.device) -> None:
    """``module`` on ``device``, moved only where a tensor of it lies elsewhere (``Module.to``
    walks every submodule even then)."""
    tensors = [*module.parameters(), *module.buffers()]
    if getattr(module, "device", device) != device or any(t.device != device for t in tensors):
        module.to(device)


def optimizer_and_scheduler(module: Objective) -> tuple[torch.optim.Optimizer, Any, str, int]:
    """What ``configure_optimizers`` returns, as (optimiser, scheduler or None, interval,
    frequency). It takes one optimiser, or a dict of it and ``lr_scheduler``: a scheduler, or
    a dict of ``scheduler``, ``interval`` ("epoch", the default, or "step") and ``frequency``
    (default 1). A step-interval scheduler steps after each optimiser step, an epoch-interval
    one after the epoch's last step and its :meth:`~fedlit.objectives.Objective.after_step`.
    Refused, naming it: lists, ``monitor``, ReduceLROnPlateau (the loop keeps no metric)."""
    name = f"{type(module).__name__}.configure_optimizers"
    conf = module.configure_optimizers()
    if isinstance(conf, torch.optim.Optimizer):
        conf = {"optimizer": conf}
    if not isinstance(conf, dict) or not isinstance(conf.get("optimizer"), torch.optim.Optimizer):
        raise ValueError(
            f"{name} returned {type(conf).__name__}: fedlit's loop takes one optimiser, or a "
            "dict of one 'optimizer' and one 'lr_scheduler' (no lists of either)"
        )
    scheduler = conf.get("lr_scheduler")
    settings = scheduler if isinstance(scheduler, dict) else {"scheduler": scheduler}
    extra = sorted(set(conf) - {"optimizer", "lr_scheduler"})
    taken = {"scheduler", "interval", "frequency"}
    extra += sorted(f"lr_scheduler.{k}" for k in set(settings) - taken)
    if extra:
        raise ValueError(f"{name} returned {', '.join(extra)}: fedlit's loop monitors no metric")
    scheduler = settings["scheduler"]
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise ValueError(
            f"{name} returned a ReduceLROnPlateau: it steps on a monitored metric, which "
            "fedlit's loop does not keep; use a scheduler that steps by itself"
        )
    interval, frequency = settings.get("interval", "epoch"), settings.get("frequency", 1)
    if interval not in ("step", "epoch"):
        raise ValueError(f"{name}: lr_scheduler.interval={interval!r}: 'step' or 'epoch'")
    if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1:
        raise ValueError(f"{name}: lr_scheduler.frequency={frequency!r}: an integer >= 1")
    return conf["optimizer"], scheduler, interval, frequency


def clip(
    optimizer: torch.optim.Optimizer, value: int | float | None, algorithm: str | None
) -> None:
    """Clip the optimiser's gradients to ``value``, by norm (the default) or by value."""
    if not value:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if (algorithm or "norm").lower() == "value":  # either case, as Lightning has it
        torch.nn.utils.clip_grad_value_(params, clip_value=value)
    else:
        torch.nn.utils.clip_grad_norm_(params, value)


class Fit:
    """One fit of an objective: its state (handed to the objective as ``fit_state``),
    optimiser, scheduler and precision."""

    def __init__(
        self, module: Objective, state: FitState, settings: LoopSettings, one_call: bool
    ) -> None:
        """``state.kept_optimizers`` set (a client's fit on a worker's network): a new fp16
        scaler; else the network's own, kept across its fits (:func:`kept_scaler`)."""
        self.module, self.state, self.settings = module, state, settings
        module.fit_state = state
        self.optimizer, self.scheduler, self.interval, self.frequency = optimizer_and_scheduler(
            module
        )
        how = settings.autocast()
        fp16 = how is not None and how[1] == torch.float16
        self.scaler: torch.amp.GradScaler | None = None
        if fp16 and state.kept_optimizers is None:
            self.scaler = kept_scaler(getattr(module, "network", module), settings.device)
        elif fp16:
            self.scaler = torch.amp.GradScaler(settings.device.type)
        self.forward_context = settings.forward_context()  # reused by every step
        #: SAM's settings where the objective takes sharpness-aware steps (eager alone).
        self.sam = module.sharpness_aware()
        self.one_call: OneCallStep | None = None
        if one_call and self.scaler is None:
            self.one_call = one_call_step(module, self.optimizer, how)
        self.intervals = 0
        self.skipped = 0  # fp16 steps skipped in a row

    def step(self, batch: Any) -> None:
        """One optimiser step: the training step (in autocast), zero_grad, backward, the
        learning rate logged, clipping, the optimiser's step; or the one call that makes them
        all. Then the step-interval scheduler and the objective's ``after_step``: not after
        a step fp16's scaler skipped (an inf or NaN gradient), which counts as no step."""
        module, optimizer, scaler = self.module, self.optimizer, self.scaler
        lr = float(optimizer.param_groups[0]["lr"])
        if self.one_call is not None:
            module.record(self.one_call(batch)[1])
            module.accumulate(1.0, lr=lr)
        elif self.sam is not None:
            if not self.sharpness_aware_step(batch, lr):
                return
        else:
            with self.forward_context:
                loss = module.training_step(batch, self.state.steps_taken)
            optimizer.zero_grad()
            (loss if scaler is None else scaler.scale(loss)).backward()
            if scaler is not None:
                scaler.unscale_(optimizer)
            module.accumulate(1.0, lr=lr)
            clip(optimizer, self.settings.gradient_clip_val, self.settings.gradient_clip_algorithm)
            if not self.optimizer_step():
                return
        self.state.steps_taken += 1
        self.schedule("step")
        module.after_step()

    def sharpness_aware_step(self, batch: Any, lr: float) -> bool:
        """One optimiser step on the objective's sharpness-aware gradients
        (:func:`~fedlit.objectives.sam.sharpness_aware_gradients`), set as the parameters'
        ``.grad``, then clipping and the optimiser's step (:meth:`optimizer_step`: whether it
        was taken). In fp16 every loss is scaled (eps = rho g / ||g|| does not change with the
        scale) and the gradients unscaled before clipping, as a plain step's."""
        module, optimizer, scaler = self.module, self.optimizer, self.scaler
        assert self.sam is not None
        params = [p for group in optimizer.param_groups for p in group["params"]]
        with self.forward_context:
            losses = module.sam_losses(batch)
            if scaler is not None:
                perturbed = losses.perturbed
                losses = replace(
                    losses,
                    loss=scaler.scale(losses.loss),
                    ascent=scaler.scale(losses.ascent),
                    perturbed=lambda: scaler.scale(perturbed()),
                )
            grads = sharpness_aware_gradients(self.sam, params, losses)
        module.record(losses.logged)
        optimizer.zero_grad()
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        if scaler is not None:
            scaler.unscale_(optimizer)
        module.accumulate(1.0, lr=lr)
        clip(optimizer, self.settings.gradient_clip_val, self.settings.gradient_clip_algorithm)
        return self.optimizer_step()

    def optimizer_step(self) -> bool:
        """The optimiser's step, through fp16's scaler where there is one; False where the
        scaler skipped it (an inf or NaN gradient), which counts as no step. Stops the fit after
        :data:`MAX_SKIPPED` skips in a row."""
        if self.scaler is None:
            self.optimizer.step()
            return True
        if scaled_step(self.scaler, self.optimizer):
            self.skipped = 0
            return True
        self.skipped += 1
        if self.skipped >= MAX_SKIPPED:
            raise FloatingPointError(
                f"trainer.precision=16-mixed: {MAX_SKIPPED} steps in a row had inf "
                "or NaN gradients at every scale; the loss is not finite"
            )
        return False

    def schedule(self, interval: str) -> None:
        """One ``interval`` ("step" or "epoch") done: its scheduler steps every ``frequency``."""
        if self.scheduler is None or self.interval != interval:
            return
        self.intervals += 1
        if self.intervals % self.frequency:
            return
        if self.one_call is None:
            self.scheduler.step()
            return
        with warnings.catch_warnings():  # the one call steps no optimizer.step() it sees
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step")
            self.scheduler.step()


def fit(
    module: Objective,
    loader: Iterable[Any],
    epochs: int,
    max_steps: int | None,
    settings: LoopSettings,
    compiled: Mapping[str, Any],
    one_call: bool = False,
    kept: KeptOptimizers | None = None,
) -> None:
    """Train ``module`` on ``loader`` for ``epochs`` epochs (or ``max_steps`` steps, over as
    many epochs as they take), leaving it on the device; ``compiled``: a compiled fit's
    :class:`~fedlit.objectives.FitState` fields (empty: eager); ``one_call``: its step as one
    call where the optimiser allows it; ``kept``: the worker's optimisers to reuse."""
    loaders, per_epoch = batches(loader, settings.limit_train_batches)
    if per_epoch == 0:
        return
    iterator = epoch(loaders)  # a CombinedLoader's first epoch: the iterator made above
    to_device(module, settings.device)
    settings.set_torch_flags()
    mu = module.proximal_mu()
    if module.sharpness_aware() is not None:
        compiled = {}  # SAM's two gradients a step: its steps eager (Objective.sharpness_aware)
    planned = max_steps if max_steps is not None else per_epoch * epochs
    state = FitState(
        planned_steps=planned,
        kept_optimizers=kept,
        fedprox=FedProx(module.network, mu) if mu > 0 else None,
        draws=FitDraws.for_fit(planned),  # before any draw of the fit
        **compiled,
    )
    run = Fit(module, state, settings, one_call)
    with torch.autograd.detect_anomaly() if settings.detect_anomaly else nullcontext():
        module.before_fit()
        done = 0
        while state.steps_taken < state.planned_steps and (max_steps is not None or done < epochs):
            if done > 0:
                iterator = epoch(iter(loaders) if isinstance(loaders, CombinedLoader) else loaders)
            seen = 0
            for batch in itertools.islice(iterator, per_epoch):
                seen += 1
                run.step(views(batch, settings.device, state))
                if state.steps_taken >= state.planned_steps:
                    break
            run.schedule("epoch")
            done += 1
            if seen == 0:  # an epoch of no batch: no more will have one
                break
        module.after_fit()
    state.compiled_step, state.slots, state.draws = None, None, None


def test(module: Evaluator, loader: Iterable[Any], settings: LoopSettings) -> None:
    """Run the evaluator over ``loader`` in eval and inference mode (each submodule's mode
    restored after), leaving it on the device: ``on_test_epoch_start``, then ``test_step``."""
    device = settings.device
    to_device(module, device)
    settings.set_torch_flags()
    modes = {m: m.training for m in module.modules()}
    try:
        module.eval()
        with torch.inference_mode():
            module.on_test_epoch_start()
            for batch_idx, batch in enumerate(loader):
                with settings.forward_context():
                    module.test_step(views(batch, device), batch_idx)
    finally:
        for m, training in modes.items():
            m.training = training
