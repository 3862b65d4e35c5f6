"""The checks a run makes before any work: its Trainer settings, whether torch.compile can
build kernels here, and whether the method, the federation's settings and the data fit
together. A refusal is a ValueError naming the key."""

from __future__ import annotations

import copy
import importlib.util
import os
import shlex
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch
import torch._dynamo
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from fedlit.data.datamodule import FederatedDataModule
from fedlit.federation.config import FederationConfig
from fedlit.federation.console import warn
from fedlit.federation.fit import TrainerTemplate
from fedlit.federation.fit.loop import PRECISIONS, limited, optimizer_and_scheduler
from fedlit.federation.fit.settings import gpu_index, how_to_fit, one_call_asked
from fedlit.federation.fit.trainer import build
from fedlit.federation.seeding import rng_states, set_rng_states
from fedlit.methods.base import FederatedMethod
from fedlit.methods.plan import CentralTraining
from fedlit.objectives.base import Objective


def checked_trainer(
    trainer: TrainerTemplate, method: FederatedMethod, config: FederationConfig
) -> TrainerTemplate:
    """``trainer`` once its settings and the method's federation settings are checked, its
    precision decided (stderr names one a CPU changes), with ``federation.compile`` where it
    is set and torch.compile can build kernels here."""
    check_trainer(trainer)
    given, trainer = trainer.precision, trainer.resolved()  # for every client and worker
    if given and given != trainer.precision:  # 16-mixed on a CPU
        warn(f"trainer.precision={given!r} on a CPU: {trainer.precision} is used instead")
    method.check_federation(config)
    if config.compile is None:
        return trainer
    device = trainer.device()
    missing = compile_toolchain_missing(device)
    if missing:
        raise ValueError(
            f"federation.compile={config.compile!r}: torch.compile cannot build kernels "
            f"for {device.type} here ({missing}); leave federation.compile null"
        )
    return replace(trainer, compile=config.compile)


def check_trainer(trainer: TrainerTemplate) -> None:
    """Raise ValueError naming the ``trainer.*`` key and its value if ``trainer`` cannot
    train: a GPU accelerator without CUDA, no batch, a negative ``gradient_clip_val`` (0 or
    None: no clipping), any setting a Trainer refuses, and what fedlit's loop does not take:
    another ``strategy``, ``accumulate_grad_batches`` other than 1, a ``precision`` other than
    32-true, bf16-mixed and 16-mixed. Builds one Trainer and writes nothing."""
    one_call_asked()  # FEDLIT_ONE_CALL: refused by name unless 0 or 1
    if trainer.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"trainer.accelerator={trainer.accelerator!r}: this machine has no CUDA GPU "
            "(torch.cuda.is_available() is False); use 'cpu' or 'auto'"
        )
    if trainer.accelerator not in ("auto", "cpu", "gpu", "cuda"):  # mps would train on the CPU
        raise ValueError(
            f"trainer.accelerator={trainer.accelerator!r}: fedlit trains on a CPU or a CUDA "
            "GPU; use 'cpu', 'gpu', 'cuda' or 'auto'"
        )
    index = gpu_index(trainer.devices) if trainer.device().type == "cuda" else None
    if index is not None and not 0 <= index < torch.cuda.device_count():
        raise ValueError(
            f"trainer.devices={trainer.devices!r}: this machine has "
            f"{torch.cuda.device_count()} visible GPU(s), numbered from 0"
        )
    ours = "fedlit's loop fits every fedlit objective and runs every evaluation"
    rules: dict[str, tuple[Callable[[Any], bool], str]] = {
        "limit_train_batches": (
            lambda v: v > 0,
            "must be > 0 (a number of batches, or a fraction in (0, 1]); 0 trains nothing",
        ),
        "gradient_clip_val": (lambda v: v >= 0, "must be >= 0 (0 or null: no clipping)"),
        "accumulate_grad_batches": (
            lambda v: isinstance(v, int) and v == 1,
            f"{ours}, one optimiser step a batch; take larger batches (data.batch_size)",
        ),
        "precision": (
            lambda v: v in PRECISIONS,
            f"{ours}, in 32-true, bf16-mixed or 16-mixed (on a CPU, 16-mixed is bf16-mixed)",
        ),
        "strategy": (lambda v: v == "auto", f"{ours}, on one device"),
    }
    settings = trainer.settings()
    for key, (valid, why) in rules.items():
        value = settings[key]
        if value is not None and (isinstance(value, bool) or not valid(value)):
            raise ValueError(f"trainer.{key}={value!r}: {why}")
    refused = (MisconfigurationException, ValueError, TypeError, ImportError)
    try:
        built = build(settings)
    except refused as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        for key, value in settings.items():  # the one a Trainer refuses on its own
            try:
                build({key: value})
            except refused:
                raise ValueError(f"trainer.{key}={value!r}: {reason}") from err
        raise ValueError(f"trainer: Lightning refuses these settings: {reason}") from err
    if built.num_devices > 1:  # a process per device, each re-running the whole command
        raise ValueError(
            f"trainer.devices={trainer.devices!r}: {built.num_devices} devices; fedlit trains "
            "each step on one device (--trainer.devices 1). Clients in parallel: "
            "federation.executor pool (several workers may share one GPU) or ray; runs in "
            "parallel: fedlit compare's jobs"
        )


def compile_toolchain_missing(device: torch.device) -> str | None:
    """Why ``torch.compile``'s default backend (inductor) cannot build kernels for ``device``
    here, or None: it compiles C++ on a CPU and Triton kernels on a GPU. The compiled step
    also needs torch 2.11 or later (it traces its backward into its graph with dynamo's
    ``trace_autograd_ops``, which older torch lacks)."""
    if not hasattr(torch._dynamo.config, "trace_autograd_ops"):
        return f"torch {torch.__version__} lacks torch._dynamo.config.trace_autograd_ops: 2.11+"
    if device.type == "cuda":
        if not importlib.util.find_spec("triton"):
            return "the triton package is missing"
        major, minor = torch.cuda.get_device_capability(device)
        if major < 7:  # Triton's oldest target is Volta
            return f"Triton builds no kernels for compute capability {major}.{minor} (7.0+)"
        return None
    # inductor's own test of its compiler (``$CXX``, else g++): it answers ``--version``
    compiler = os.environ.get("CXX") or "g++"
    try:
        subprocess.run(
            [*shlex.split(compiler), "--version"], capture_output=True, check=True, timeout=60
        )
        return None
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    source = f"$CXX={os.environ['CXX']!r}" if os.environ.get("CXX") else "g++"
    return f"the C++ compiler inductor uses, {source}, does not run"


def check_batches(trainer: TrainerTemplate, data: FederatedDataModule) -> None:
    """Refuse a ``trainer.limit_train_batches`` fraction that leaves a client's or the
    server's loader no batch (:func:`~fedlit.federation.fit.loop.limited`), once the data are
    loaded, before anything is trained."""
    limit = trainer.limit_train_batches
    if not isinstance(limit, float):
        return
    loaders = [data.client_data(k).dataloader(("weak",)) for k in range(data.num_clients)]
    if data.labels_at != "client":
        loaders.append(data.server_dataloader(("weak",)))
    for loader in loaders:
        limited(len(loader), limit)


def check_fits(
    method: FederatedMethod, data: FederatedDataModule, config: FederationConfig
) -> None:
    """Refuse settings that do not fit together: more clients per round than clients (or
    than ``min_clients`` needs), labels at the clients for a method or an evaluation that
    needs them at the server, a model for another number of classes or channels."""
    uses_clients = method.round_plan().uses_clients
    if uses_clients and config.clients_per_round > data.num_clients:
        raise ValueError(
            f"federation.clients_per_round={config.clients_per_round} exceeds "
            f"data.num_clients={data.num_clients}"
        )
    if uses_clients and config.min_clients > config.clients_per_round:
        raise ValueError(
            f"federation.min_clients={config.min_clients} exceeds "
            f"federation.clients_per_round={config.clients_per_round}"
        )
    if data.labels_at == "client":
        if not method.supports_labels_at_client:
            raise ValueError(
                f"data.labels_at='client': {type(method).__name__} trains on the "
                "server's labels; use labels_at='server'"
            )
        if config.final_eval:
            raise ValueError(
                "federation.final_eval needs the server's labeled set, which "
                "data.labels_at='client' leaves empty"
            )
    network = method.network_settings
    if (network.num_classes, network.in_channels) != (data.num_classes, data.in_channels):
        raise ValueError(
            "model.network.num_classes / model.network.in_channels do not match data.dataset "
            f"{data.dataset!r} ({data.num_classes} classes, {data.in_channels} channels)"
        )


@contextmanager
def loading_data(data: FederatedDataModule) -> Iterator[None]:
    """Turn a data set that cannot be loaded (missing with ``data.download`` off, no network,
    unreadable files) into a ValueError naming ``data.root`` and ``data.dataset``."""
    try:
        yield
    except (RuntimeError, OSError) as err:
        raise ValueError(
            f"data.root: data.dataset={data.dataset!r} could not be loaded from {data.root} "
            f"(data.download={data.download}): {err}"
        ) from err


def check_optimizers(method: FederatedMethod, data: FederatedDataModule, rounds: int) -> None:
    """Refuse, naming it, an objective that overrides a LightningModule hook fedlit's loop does
    not call or optimises by hand (:func:`~fedlit.federation.fit.how_to_fit`), or whose
    ``configure_optimizers`` returns what fedlit's loop does not take
    (:func:`~fedlit.federation.fit.loop.optimizer_and_scheduler`): the
    server's, the centralized step's and a client's objectives, built once on a copy of the
    method, the random generators' states kept. A client's is built only by fedlit's own
    ``ClientSide.objective`` (a method's own is its code, run in its workers; its objective is
    refused at its first fit). Once the data are set up, before any fit."""
    states = rng_states()
    try:
        copied = copy.deepcopy(method)
        objectives: list[Objective | None] = []
        if data.labels_at != "client":
            objectives.append(copied.server_objective())
        if isinstance(copied, CentralTraining):
            objectives.append(copied.central_objective())
        side = copied.client_side() if copied.round_plan().uses_clients else None
        if side is not None and type(side).objective.__module__.startswith("fedlit."):
            side.on_round_start(1, rounds)
            objectives.append(side.objective(copied.broadcast(), data.client_data(0), None))
        for objective in objectives:
            if objective is not None:
                how_to_fit(objective, TrainerTemplate())  # hooks the loop does not call
                optimizer_and_scheduler(objective)
    finally:
        set_rng_states(states)
