"""The lean loop: an objective's fit and an evaluator's test without a Lightning Trainer.

A Trainer built, set up and torn down for every client's fit cost more host time than a small
network's steps (its loop also wraps each step in a closure, a profiler and hook dispatch).
fedlit's objectives compute their step as a pure :meth:`~fedlit.objectives.Objective.step`,
so their fit needs none of that. This loop runs the same hooks in the same order as Lightning's
fit loop (``on_fit_start``, ``on_train_start``, ``on_train_epoch_start``, the batch's transfer
hooks, ``on_train_batch_start``, the step, ``on_before_backward``, ``on_after_backward``,
``on_before_optimizer_step``, the step of the optimiser and of a per-step scheduler,
``on_train_batch_end``, ``on_train_epoch_end``, ``on_train_end``, ``on_fit_end``), so the
weights it gives are those a Trainer gives, bit for bit. Precision comes from Lightning
Fabric's plugins (autocast, and fp16's gradient scaler), the same ones a Trainer uses. A
compiled fit (``federation.compile``) makes each step one call where nothing runs between the
backward and the optimiser's step
(:class:`~fedlit.federation.compiled.OneCallStep`: the step, its backward and the update in
one graph).

A module it cannot run the same way (one that overrides a hook this loop does not call, uses
manual optimisation, or settings it does not take: gradient accumulation, another strategy,
anomaly detection, deterministic or benchmark flags) is fitted by a Trainer instead
(:meth:`~fedlit.federation.TrainerTemplate.lean` says which).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from lightning import LightningModule
from lightning.fabric.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities.combined_loader import CombinedLoader
from torch import nn

from fedlit.federation.compiled import OneCallStep, one_call_step
from fedlit.objectives.base import FitProgress, Objective

#: The LightningModule hooks this loop calls (a fit's and a test's); a module that overrides
#: another one of LightningModule's is fitted by a Trainer.
LEAN_HOOKS = frozenset(
    {
        "setup",
        "teardown",
        "configure_model",
        "configure_optimizers",
        "training_step",
        "test_step",
        "forward",
        "on_fit_start",
        "on_fit_end",
        "on_train_start",
        "on_train_end",
        "on_train_epoch_start",
        "on_train_epoch_end",
        "on_train_batch_start",
        "on_train_batch_end",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_before_zero_grad",
        "on_test_start",
        "on_test_end",
        "on_test_epoch_start",
        "on_test_epoch_end",
        "on_test_batch_start",
        "on_test_batch_end",
        "on_before_batch_transfer",
        "transfer_batch_to_device",
        "on_after_batch_transfer",
    }
)

#: Precisions the loop takes (the ``trainer.precision`` values that name them).
_FULL = ("32-true", "32", 32)
_MIXED = {
    "bf16-mixed": "bf16-mixed",
    "bf16": "bf16-mixed",
    "16-mixed": "16-mixed",
    "16": "16-mixed",
}


def _lightning_hooks() -> frozenset[str]:
    """The public methods a LightningModule defines besides ``nn.Module``'s: its hooks and
    step methods, its own and its mixins' (``ModelHooks``, ``DataHooks``, ...)."""
    classes = [c for c in LightningModule.__mro__ if c not in (nn.Module, object)]
    return frozenset(
        name
        for cls in classes
        for name, value in vars(cls).items()
        if callable(value) and not name.startswith("_")
    )


_HOOKS = _lightning_hooks()


def overridden_hooks(module: LightningModule) -> list[str]:
    """LightningModule's hooks that ``module``'s class overrides and the loop does not call."""
    kind = type(module)
    return sorted(
        name
        for name in _HOOKS - LEAN_HOOKS
        if getattr(kind, name, None) is not getattr(LightningModule, name, None)
    )


class _MixedPrecision(MixedPrecision):
    """Fabric's mixed precision with autocast's cache of cast weights off, as a Trainer's
    plugin has it: a step that calls a network twice (SimCLR's two views, FedSup's two
    passes) casts its weights twice, and their gradients are a Trainer's bit for bit."""

    def forward_context(self) -> AbstractContextManager[Any]:
        return torch.autocast(self.device, dtype=self._desired_input_dtype, cache_enabled=False)


def precision_plugin(precision: Any, device: torch.device) -> Precision | None:
    """Lightning Fabric's precision plugin for ``precision`` on ``device`` (a new one, so an
    fp16 gradient scaler starts afresh as a new Trainer's does), or None where the loop does
    not take that precision."""
    if precision in _FULL:
        return Precision()
    if precision in _MIXED:
        return _MixedPrecision(_MIXED[precision], device.type)  # type: ignore[arg-type]
    return None


@dataclass(frozen=True)
class LeanSettings:
    """What a lean fit takes of a run's ``trainer`` settings."""

    device: torch.device
    precision: Any
    gradient_clip_val: float | int | None = None
    gradient_clip_algorithm: str | None = None
    limit_train_batches: float | int | None = None


def _limit(length: int, limit: float | int | None) -> int:
    """Batches of an epoch of ``length`` under ``limit_train_batches`` (Lightning's rule: a
    float is a fraction of the loader, an int a number of batches)."""
    if limit is None:
        return length
    if isinstance(limit, float):
        return int(length * limit) if limit != 1.0 else length
    return min(length, limit)


def _to_device(module: nn.Module, device: torch.device) -> None:
    """``module`` on ``device``: moved only where a tensor of it lies elsewhere (``Module.to``
    walks every submodule even then); a LightningModule's ``device`` set either way."""
    tensors = [*module.parameters(), *module.buffers()]
    if any(t.device != device for t in tensors):
        module.to(device)
    elif isinstance(module, LightningModule):
        module._device = device  # what Module.to would have recorded


def _optimizer_and_scheduler(module: LightningModule) -> tuple[torch.optim.Optimizer, Any, str]:
    """What ``configure_optimizers`` returns, as one optimiser and at most one scheduler with
    its interval ("step" or "epoch")."""
    conf = module.configure_optimizers()
    if isinstance(conf, torch.optim.Optimizer):
        return conf, None, "step"
    if isinstance(conf, dict) and isinstance(conf.get("optimizer"), torch.optim.Optimizer):
        scheduler = conf.get("lr_scheduler")
        if scheduler is None:
            return conf["optimizer"], None, "step"
        if isinstance(scheduler, dict):
            return conf["optimizer"], scheduler["scheduler"], scheduler.get("interval", "epoch")
        return conf["optimizer"], scheduler, "epoch"
    raise TypeError(
        f"{type(module).__name__}.configure_optimizers returned {type(conf).__name__}: the lean "
        "loop takes one optimiser, or a dict of one optimiser and one lr_scheduler"
    )


def _clip(
    optimizer: torch.optim.Optimizer, value: float | int | None, algorithm: str | None
) -> None:
    """Lightning's gradient clipping of the optimiser's parameters (by norm by default)."""
    if not value:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if algorithm == "value":
        torch.nn.utils.clip_grad_value_(params, clip_value=value)
    else:
        torch.nn.utils.clip_grad_norm_(params, value)


def combined(loader: Iterable[Any], limit: float | int | None) -> CombinedLoader:
    """``loader`` as Lightning's fit loop iterates it: a ``CombinedLoader`` (one made in
    ``max_size_cycle`` mode where it is none), each of its loaders limited to
    ``limit_train_batches``."""
    loaders = (
        loader if isinstance(loader, CombinedLoader) else CombinedLoader(loader, "max_size_cycle")
    )
    loaders.limits = [_limit(len(dl), limit) for dl in loaders.flattened]
    return loaders


class _Batches:
    """A ``CombinedLoader``'s batches without their indices: what an epoch iterates."""

    def __init__(self, loaders: CombinedLoader) -> None:
        self.loaders = loaders

    def __iter__(self) -> Iterator[Any]:
        return (batch for batch, _, _ in self.loaders)


def epoch_batches(loader: Iterable[Any], limit: float | int | None) -> tuple[Iterable[Any], int]:
    """What each epoch iterates (a new iterator an epoch) and the batches it takes, as
    Lightning's fit loop has them: one loader as it is, limited to ``limit_train_batches``
    (a ``CombinedLoader`` of one loader in ``max_size_cycle`` mode gives its batches
    unchanged, at a host cost per batch); a ``CombinedLoader``, or a collection of loaders,
    combined (:func:`combined`)."""
    if not isinstance(loader, (CombinedLoader, Mapping, list, tuple)):
        return loader, _limit(len(loader), limit)  # type: ignore[arg-type]
    loaders = combined(loader, limit)
    assert loaders.limits is not None
    per_epoch = int((min if loaders._mode == "min_size" else max)(loaders.limits))
    return _Batches(loaders), per_epoch


def _transferred(module: LightningModule, batch: Any, device: torch.device) -> Any:
    """``batch`` through the module's transfer hooks onto ``device`` (on a CPU, where every
    batch already lies, only a module's own transfer hook is called)."""
    batch = module.on_before_batch_transfer(batch, 0)
    own = type(module).transfer_batch_to_device is not LightningModule.transfer_batch_to_device
    if device.type != "cpu" or own:
        batch = module.transfer_batch_to_device(batch, device, 0)
    return module.on_after_batch_transfer(batch, 0)


class _Fit:
    """One lean fit of ``module``: its optimiser, scheduler and precision, and the steps it
    has taken (``module.fit_progress``)."""

    def __init__(self, module: LightningModule, planned: int, settings: LeanSettings) -> None:
        plugin = precision_plugin(settings.precision, settings.device)
        assert plugin is not None, "a lean fit takes the precisions TrainerTemplate.lean accepts"
        self.module, self.settings, self.plugin = module, settings, plugin
        self.progress = FitProgress(planned)
        # (setattr: mypy types an nn.Module's attributes as tensors or modules)
        setattr(module, "fit_progress", self.progress)  # noqa: B010
        _to_device(module, settings.device)
        module.setup("fit")
        module.configure_model()
        self.optimizer, self.scheduler, self.interval = _optimizer_and_scheduler(module)
        self.one_call = self._one_call()

    def _one_call(self) -> OneCallStep | None:
        """The step as one compiled call (:class:`~fedlit.federation.compiled.OneCallStep`)
        where the fit runs compiled and nothing between Lightning's step, backward and
        optimiser step needs them apart: no hook overridden there (only the objective's own
        ``on_before_optimizer_step``, which reads the learning rate), no clipping, no fp16
        gradient scaler; else None."""
        module, plugin = self.module, self.plugin
        if not isinstance(module, Objective) or self.settings.gradient_clip_val:
            return None
        kind = type(module)
        apart = ("on_before_zero_grad", "on_before_backward", "on_after_backward")
        if any(getattr(kind, h) is not getattr(LightningModule, h) for h in apart):
            return None
        if kind.on_before_optimizer_step is not Objective.on_before_optimizer_step:
            return None
        if isinstance(plugin, MixedPrecision):
            if plugin.scaler is not None:
                return None
            autocast = (plugin.device, plugin._desired_input_dtype)
        elif type(plugin) is Precision:
            autocast = None
        else:
            return None
        return one_call_step(module, self.optimizer, autocast)

    def advance(self, iterator: Iterator[Any], batch_idx: int) -> bool:
        """One batch of the epoch, as Lightning's training epoch loop runs it: fetched and
        transferred, ``on_train_batch_start``, the optimiser step, a per-step scheduler's step,
        ``on_train_batch_end``. False where the epoch ends instead (no batch left, or
        ``on_train_batch_start`` returned -1)."""
        module = self.module
        try:
            batch = next(iterator)
        except StopIteration:
            return False
        batch = _transferred(module, batch, self.settings.device)
        if module.on_train_batch_start(batch, batch_idx) == -1:
            return False
        loss = self.step(batch, batch_idx)
        self.progress.steps_taken += 1
        if self.scheduler is not None and self.interval == "step":
            self.scheduler.step()
        module.on_train_batch_end({"loss": loss}, batch, batch_idx)
        return True

    def step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """One optimiser step, in the order of Lightning's automatic optimisation: the
        training step (in the precision's autocast), zero_grad, backward, the gradients
        unscaled (fp16), ``on_before_optimizer_step``, clipping, the optimiser's step. Where
        the step is one compiled call (:meth:`_one_call`): that call, its logs recorded, and
        ``on_before_optimizer_step`` (which logs the learning rate the call used)."""
        module, plugin, optimizer = self.module, self.plugin, self.optimizer
        if self.one_call is not None:
            assert isinstance(module, Objective)
            stepped, logged = self.one_call(batch)
            module.record(logged)
            module.on_before_optimizer_step(optimizer)
            return stepped
        context: AbstractContextManager[Any] = plugin.forward_context()
        with context:
            output = module.training_step(batch, batch_idx)
        loss = output["loss"] if isinstance(output, Mapping) else output
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"{type(module).__name__}.training_step returned {output!r}, no loss")
        module.on_before_zero_grad(optimizer)
        optimizer.zero_grad()
        module.on_before_backward(loss)
        plugin.backward(loss, module)
        module.on_after_backward()
        if isinstance(plugin, MixedPrecision) and plugin.scaler is not None:
            plugin.unscale_gradients(optimizer)
        module.on_before_optimizer_step(optimizer)
        _clip(optimizer, self.settings.gradient_clip_val, self.settings.gradient_clip_algorithm)
        plugin.optimizer_step(optimizer)
        return loss.detach()

    def end_epoch(self) -> None:
        """An epoch's end: a per-epoch scheduler's step, ``on_train_epoch_end``."""
        if self.scheduler is not None and self.interval == "epoch":
            self.scheduler.step()
        self.module.on_train_epoch_end()


def lean_fit(
    module: LightningModule,
    loader: Iterable[Any],
    epochs: int,
    max_steps: int | None,
    settings: LeanSettings,
) -> None:
    """Train ``module`` on ``loader`` for ``epochs`` epochs (or ``max_steps`` optimiser
    steps, over as many epochs as they take), as a bare Trainer's fit would, leaving it on
    the device. ``module.fit_progress`` counts its steps, and stays after it (as a Trainer
    stays attached to the module it fitted)."""
    loaders, per_epoch = epoch_batches(loader, settings.limit_train_batches)
    if per_epoch == 0:
        return
    planned = max_steps if max_steps is not None else per_epoch * epochs
    fit = _Fit(module, planned, settings)
    progress = fit.progress
    module.on_fit_start()
    module.zero_grad()
    iterator = iter(loaders)  # the first epoch's, made where Lightning makes it
    module.on_train_start()
    epoch = 0
    while progress.steps_taken < planned and (max_steps is not None or epoch < epochs):
        module.on_train_epoch_start()
        if epoch > 0:
            iterator = iter(loaders)
        taken = progress.steps_taken
        for batch_idx in range(per_epoch):
            if not fit.advance(iterator, batch_idx) or progress.steps_taken >= planned:
                break
        fit.end_epoch()
        epoch += 1
        if progress.steps_taken == taken:  # an epoch that took no step: no more will
            break
    module.on_train_end()
    module.on_fit_end()
    module.teardown("fit")


def lean_test(module: LightningModule, loader: Iterable[Any], settings: LeanSettings) -> None:
    """Run ``module``'s test loop over ``loader`` as a bare Trainer's ``test`` would (in eval
    mode and inference mode, each module's own mode restored after), leaving it on the
    device."""
    device = settings.device
    plugin = precision_plugin(settings.precision, device)
    assert plugin is not None
    _to_device(module, device)
    modes = {m: m.training for m in module.modules()}
    module.setup("test")
    module.configure_model()
    try:
        module.eval()
        with torch.inference_mode():
            module.on_test_start()
            module.on_test_epoch_start()
            loaders = CombinedLoader(loader, "sequential")
            iterator = iter(loaders)
            for batch_idx, (raw, _, _) in enumerate(iterator):
                batch = _transferred(module, raw, device)
                module.on_test_batch_start(batch, batch_idx)
                with plugin.forward_context():
                    output = module.test_step(batch, batch_idx)
                module.on_test_batch_end(output, batch, batch_idx)
            module.on_test_epoch_end()
            module.on_test_end()
    finally:
        for m, training in modes.items():
            m.training = training
    module.teardown("test")
