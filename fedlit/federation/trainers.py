"""Lean Lightning Trainers, built per server step, client step and evaluation from a template."""

from __future__ import annotations

import functools
import importlib.util
import itertools
import logging
import os
import shlex
import signal
import subprocess
import threading
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from importlib.metadata import entry_points
from typing import Any, Literal

import torch
from lightning import LightningModule, Trainer
from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.trainer import setup as _trainer_setup
from lightning.pytorch.trainer.connectors import callback_connector as _callback_connector
from lightning.pytorch.utilities.combined_loader import CombinedLoader
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from fedlit.data.loaders import AugmentsOnDevice, ImageBatches
from fedlit.evaluation.evaluator import Evaluator
from fedlit.federation.compiled import compiles_whole, whole_step_compiled
from fedlit.federation.lean import (
    LeanSettings,
    lean_fit,
    lean_test,
    overridden_hooks,
    precision_plugin,
)
from fedlit.objectives.base import Objective

# Per-step Trainers would otherwise print device banners and worker hints hundreds of times.
for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda"):
    logging.getLogger(_name).setLevel(logging.WARNING)
warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
warnings.filterwarnings("ignore", message=r".*barebones=True.*")
warnings.filterwarnings("ignore", message=r".*LeafSpec.*")  # lightning internals, torch 2.14
# A teacher or target network an objective holds stays in eval mode on purpose (it gives
# predictions, it is not trained): Lightning's note at every fit would only alarm the user.
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode at the start")


def _discover_callback_factories_once() -> None:
    """Look up Lightning's external callback factories (an entry-point scan of every installed
    distribution) once per process instead of in every per-step Trainer: the scan was 85% of
    building a Trainer (about 36 of 42 ms here), a fixed cost per client and step. Where a
    factory is installed, every Trainer still calls it, as Lightning does."""
    original = _callback_connector._load_external_callbacks
    if getattr(original, "fedlit_cached", False):
        return

    @functools.cache
    def installed(group: str) -> bool:
        return bool(entry_points(group=group))

    def load(group: str) -> list[Any]:
        return original(group) if installed(group) else []

    load.fedlit_cached = True  # type: ignore[attr-defined]
    _callback_connector._load_external_callbacks = load


_discover_callback_factories_once()


def _log_device_info_once() -> None:
    """Lightning's device lines ("GPU available: ..., used: ...", and its "GPU available but
    not used" warning) once per process and kind of accelerator instead of in every per-step
    Trainer: their checks ask torch for the CUDA devices twice, which with Lightning imported
    is an NVML probe each (about 0.2 ms a Trainer where there is no GPU), and they say the
    same thing every time."""
    original = _trainer_setup._log_device_info
    if getattr(original, "fedlit_once", False):
        return
    logged: set[type] = set()

    def log(trainer: Trainer) -> None:
        kind = type(trainer.accelerator)
        if kind not in logged:
            logged.add(kind)
            original(trainer)

    log.fedlit_once = True  # type: ignore[attr-defined]
    _trainer_setup._log_device_info = log


_log_device_info_once()

TERMINATED = 128 + signal.SIGTERM  # the exit status of a run stopped by SIGTERM

#: ``federation.compile``: torch.compile's modes for the whole training step (None: eager).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


def compile_toolchain_missing(device: torch.device) -> str | None:
    """Why ``torch.compile``'s default backend (inductor) cannot build kernels for ``device``
    here, or None: it compiles C++ on a CPU and Triton kernels on a GPU."""
    if device.type == "cuda":
        return None if importlib.util.find_spec("triton") else "the triton package is missing"
    from torch._inductor import config as inductor_config

    # inductor's own test of a compiler (``$CXX``, else g++): it answers ``--version``
    compilers = [c for c in inductor_config.cpp.cxx if c]
    for compiler in compilers:
        try:
            subprocess.run(
                [*shlex.split(compiler), "--version"], capture_output=True, check=True, timeout=60
            )
            return None
        except (OSError, ValueError, subprocess.SubprocessError):
            continue
    source = f"$CXX={os.environ['CXX']!r}" if os.environ.get("CXX") else "g++"
    return f"the C++ compiler inductor uses, {source}, does not run"


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


def default_precision(accelerator: str = "auto", cpu_bf16: bool | None = None) -> _PRECISION_INPUT:
    """The precision of a run that leaves ``trainer.precision`` unset.

    On a GPU, mixed precision: bf16 where supported, else fp16. On a CPU, bf16 mixed
    precision where the CPU computes bf16 natively (``cpu_bf16``; None: :func:`cpu_computes_bf16`),
    where it was measured about 1.5x faster than fp32 with results within seed noise; fp32
    elsewhere, where bf16 is emulated and slower."""
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    if cpu_bf16 is None:
        cpu_bf16 = cpu_computes_bf16()
    return "bf16-mixed" if cpu_bf16 else "32-true"


@dataclass(frozen=True)
class TrainerTemplate:
    """The settings every fit and evaluation shares: a recipe's ``trainer`` group.

    The group also names the run directory and the loggers, the federation's own. fedlit's
    objectives fit in the lean loop (:meth:`lean`); any other module's Trainer is built from
    these settings and runs bare: no logger, checkpointing, progress
    bar, model summary or sanity check of its own; the federation driver owns logging and
    checkpoints. Every setting but ``compile`` is the ``lightning.Trainer`` argument of the
    same name, with its default.

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
            not a ``trainer`` key; :mod:`fedlit.federation.compiled`).
    """

    accelerator: str = "auto"
    devices: list[int] | str | int = 1
    precision: _PRECISION_INPUT | None = None
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

    def check(self) -> None:
        """Raise ValueError naming the ``trainer.*`` key and its value if these settings cannot
        train: a GPU accelerator on a machine without CUDA, ``limit_train_batches`` of 0 (no
        batch), a negative ``gradient_clip_val`` (0 or None: no clipping, as in Lightning),
        ``accumulate_grad_batches`` below 1, or any setting a Trainer refuses. Builds one
        Trainer and writes nothing."""
        if self.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
            raise ValueError(
                f"trainer.accelerator={self.accelerator!r}: this machine has no CUDA GPU "
                "(torch.cuda.is_available() is False); use 'cpu' or 'auto'"
            )
        rules = {
            "limit_train_batches": (
                lambda v: v > 0,
                "must be > 0 (a number of batches, or a fraction in (0, 1]); 0 trains nothing",
            ),
            "gradient_clip_val": (
                lambda v: v >= 0,
                "must be >= 0 (0 or null: no clipping)",
            ),
            "accumulate_grad_batches": (
                lambda v: isinstance(v, int) and v >= 1,
                "must be an integer >= 1",
            ),
        }
        settings = self.settings()
        for key, (valid, rule) in rules.items():
            value = settings[key]
            if value is not None and (isinstance(value, bool) or not valid(value)):
                raise ValueError(f"trainer.{key}={value!r}: {rule}")
        refused = (MisconfigurationException, ValueError, TypeError, ImportError)
        try:
            built = self.build()
        except refused as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            for key, value in settings.items():  # the one a Trainer refuses on its own
                try:
                    Trainer(**{key: value}, barebones=True, logger=False)
                except refused:
                    raise ValueError(f"trainer.{key}={value!r}: {reason}") from err
            raise ValueError(f"trainer: Lightning refuses these settings: {reason}") from err
        if built.num_devices > 1:  # a process per device, each re-running the whole command
            raise ValueError(
                f"trainer.devices={self.devices!r}: {built.num_devices} devices; fedlit trains "
                "each step on one device (--trainer.devices 1). Clients in parallel: "
                "federation.executor pool (several workers may share one GPU) or ray; runs in "
                "parallel: fedlit compare's jobs"
            )

    def device(self) -> torch.device:
        """The device fits and evaluations train on (the first GPU where there is one and
        the accelerator allows it), for work done outside a Trainer."""
        gpu = self.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
        return torch.device("cuda") if gpu else torch.device("cpu")

    def resolved(self) -> TrainerTemplate:
        """These settings with ``precision`` decided (:func:`default_precision` where it is
        unset), once, in the driver's process: every client and worker then trains in the
        same precision."""
        return replace(self, precision=self.precision or default_precision(self.accelerator))

    def build(self, **overrides: Any) -> Trainer:
        """A bare Trainer of these settings, ``overrides`` (its length) on top."""
        kwargs = self.settings()
        kwargs.update(
            precision=self.precision or default_precision(self.accelerator), barebones=True
        )
        kwargs.update(overrides)
        if kwargs["accelerator"] in ("auto", "gpu", "cuda") and torch.cuda.is_available():
            kwargs["accelerator"] = CUDAKeepingCache()
        return Trainer(**kwargs)

    def fit(
        self,
        module: LightningModule,
        loader: Iterable[Any],
        epochs: int,
        max_steps: int | None = None,
        stay_on_device: bool = False,
    ) -> None:
        """Train ``module`` on ``loader`` for ``epochs`` epochs (or ``max_steps`` steps),
        its whole training step compiled meanwhile where ``compile`` says so
        (:func:`~fedlit.federation.compiled.whole_step_compiled`).
        fedlit's objectives fit in the lean loop (:meth:`lean`: no Trainer; the module stays
        on the training device), anything else in a bare Trainer. ``stay_on_device`` (a
        client's fit in a Trainer): on one device, ``module`` is left on the device after the
        fit, and not moved there again when it is already there (:class:`StayOnDevice`), so a
        worker's persistent networks never cross to the host."""
        own_step = isinstance(module, Objective) and (
            type(module).training_step is not Objective.training_step
        )  # a subclass's training_step may ask its Trainer (self.optimizers(), self.log)
        lean = self.lean(module, compiles_whole(module) and not own_step)
        if lean is not None:
            with whole_step_compiled(module, self.compile):
                lean_fit(module, on_device(module, loader, lean.device), epochs, max_steps, lean)
            return
        length = {"max_epochs": epochs} if max_steps is None else {"max_epochs": -1}
        if max_steps is not None:
            length["max_steps"] = max_steps
        strategy = self._stay_on_device() if stay_on_device else None
        if strategy is not None:
            length["strategy"] = strategy  # type: ignore[assignment]
        trainer = self.build(**length, limit_val_batches=0)
        with whole_step_compiled(module, self.compile):
            trainer.fit(module, train_dataloaders=on_device(module, loader, self.device()))
        _stop_if_terminated(trainer)

    def lean(self, module: LightningModule, lean_module: bool) -> LeanSettings | None:
        """The lean loop's settings (:mod:`fedlit.federation.lean`: no Trainer) for
        ``module``, or None where a Trainer runs it: a module that is not ``lean_module``
        (fedlit's objectives with a :meth:`~fedlit.objectives.Objective.step` and its
        evaluator are; a user's own LightningModule is not), one that overrides a hook the
        loop does not call or optimises manually, and settings the loop does not take (another
        strategy or several devices, gradient accumulation, anomaly detection, torch's
        deterministic or cuDNN's benchmark flags, a precision other than 32-true, 16-mixed
        and bf16-mixed)."""
        device = self.device()
        if device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        plain = (
            lean_module
            and module.automatic_optimization
            and not overridden_hooks(module)
            and self.strategy == "auto"
            and self.devices in (1, "auto")
            and self.accelerator in ("auto", "cpu", "gpu", "cuda")
            and self.accumulate_grad_batches == 1
            and not self.detect_anomaly
            and self.deterministic is None
            and self.benchmark is None
        )
        precision = self.precision or default_precision(self.accelerator)
        if not plain or precision_plugin(precision, device) is None:
            return None
        return LeanSettings(
            device,
            precision,
            self.gradient_clip_val,
            self.gradient_clip_algorithm,
            self.limit_train_batches,
        )

    def _stay_on_device(self) -> StayOnDevice | None:
        """The client fit's strategy where these settings train on one device with Lightning's
        own strategy (``strategy: auto``, ``devices`` 1 or "auto", a CPU or CUDA accelerator);
        None elsewhere (Lightning's strategy, as for every other fit)."""
        one = self.devices in (1, "auto") and self.strategy == "auto"
        if not one or self.accelerator not in ("auto", "cpu", "gpu", "cuda"):
            return None
        device = self.device()
        if device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        return StayOnDevice(device=device)

    def test(self, module: LightningModule, loader: Iterable[Any]) -> None:
        """Run ``module``'s test loop over ``loader`` (metrics stay in the module): fedlit's
        evaluator without a Trainer (:meth:`lean`), any other module in a Trainer."""
        lean = self.lean(module, isinstance(module, Evaluator))
        if lean is not None:
            lean_test(module, on_device(module, loader, lean.device), lean)
            return
        trainer = self.build()
        trainer.test(module, dataloaders=on_device(module, loader, self.device()), verbose=False)
        _stop_if_terminated(trainer)


class CUDAKeepingCache(CUDAAccelerator):
    """Lightning's CUDA accelerator without its clearing of the device's memory at every fit's
    set-up and teardown (``torch.cuda.empty_cache`` and cuBLAS's workspaces). fedlit builds a
    Trainer for every step of a round (each client's fit, the server's, the evaluation), so
    that clearing gave the caching allocator's memory back to the driver and took it again a
    few dozen times a round, each a synchronising driver call; PyTorch's caching allocator
    reuses it instead."""

    def setup(self, trainer: Trainer) -> None:
        """Nothing: Lightning's set-up only clears the memory (and logs the visible devices)."""

    def teardown(self) -> None:
        """Nothing: the memory stays cached for the next step's Trainer."""


class StayOnDevice(SingleDeviceStrategy):
    """Lightning's one-device strategy, less two moves: a module whose parameters and buffers
    all lie on the device already is not moved there (``Module.to`` walks every module even
    then), and after the fit the module stays on the device instead of going back to the CPU."""

    def model_to_device(self) -> None:
        assert self.model is not None, "self.model must be set before self.model.to()"
        tensors = itertools.chain(self.model.parameters(), self.model.buffers())
        if any(t.device != self.root_device for t in tensors):
            self.model.to(self.root_device)

    def teardown(self) -> None:
        """Lightning's teardown without moving the module and its optimisers to the CPU."""
        self.precision_plugin.teardown()
        assert self.accelerator is not None
        self.accelerator.teardown()
        self.checkpoint_io.teardown()


def on_device(
    module: LightningModule, loader: Iterable[Any], device: torch.device | None = None
) -> Iterable[Any]:
    """``loader`` set to augment on the training device when ``module`` computes the views
    after the transfer (:class:`~fedlit.data.loaders.AugmentsOnDevice`), its split staged on
    ``device`` (the training device: batches drawn there by index) where given; otherwise
    ``loader`` as it is (its batches are augmented on the CPU as they are drawn)."""
    if not isinstance(module, AugmentsOnDevice):
        return loader
    if isinstance(loader, ImageBatches):
        return loader.on_device(device)
    if isinstance(loader, CombinedLoader):
        iterables = loader.iterables
        moved = (
            {k: on_device(module, v, device) for k, v in iterables.items()}
            if isinstance(iterables, dict)
            else [on_device(module, v, device) for v in iterables]
        )
        return CombinedLoader(moved, loader._mode)
    return loader


def _stop_if_terminated(trainer: Trainer) -> None:
    """Stop the run if the Trainer caught a SIGTERM (a scheduler's time limit, ``timeout``).

    Lightning's handler only sets a flag while a Trainer runs and raises at the next epoch or
    batch boundary; a signal caught in the last one would die with this per-step Trainer and
    the federation would go on. The last round's checkpoint is on disk: resume from it.
    """
    if trainer.received_sigterm:
        raise SIGTERMException(TERMINATED)


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """While a run runs (in the main thread), make a SIGTERM stop it cleanly wherever it comes.

    Inside a Trainer's step, Lightning's handler is the one installed (it calls this one
    after its own): the run stops at that step's end (:func:`_stop_if_terminated`). Anywhere
    else (between steps: aggregation, writing metrics or a checkpoint, waiting for Ray's
    workers), Python's default would end the process at once, skipping every clean-up; here
    the signal raises :class:`SIGTERMException` at once instead, so the run's ``finally``
    blocks run (a half-written file's temporary removed, Ray shut down, the lock released)
    and ``fedlit fit`` exits with status 143. Either way the last checkpoint is whole.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        if signal.getsignal(signal.SIGTERM) is handler:  # not inside a Trainer's step
            raise SIGTERMException(TERMINATED)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
