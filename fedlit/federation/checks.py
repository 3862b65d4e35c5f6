"""The checks a run makes before any work: its Trainer settings, and whether the method, the
federation's settings and the data fit together. A refusal is a ValueError naming the key."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from fedlit.data.datamodule import FederatedDataModule
from fedlit.federation.config import FederationConfig
from fedlit.federation.fit import TrainerTemplate, compile_toolchain_missing
from fedlit.federation.fit.loop import limited, optimizer_and_scheduler
from fedlit.federation.seeding import rng_states, set_rng_states
from fedlit.methods.base import FederatedMethod
from fedlit.methods.plan import CentralTraining
from fedlit.objectives.base import Objective


def checked_trainer(
    trainer: TrainerTemplate, method: FederatedMethod, config: FederationConfig
) -> TrainerTemplate:
    """``trainer`` once its settings and the method's federation settings are checked, with
    ``federation.compile`` where it is set and torch.compile can build kernels here."""
    trainer.check()
    trainer = trainer.resolved()  # the precision decided here, for every client and worker
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
    """Refuse, naming it, an objective whose ``configure_optimizers`` returns what fedlit's
    loop does not take (:func:`~fedlit.federation.fit.loop.optimizer_and_scheduler`): the
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
                optimizer_and_scheduler(objective)
    finally:
        set_rng_states(states)
