"""One client's work in one round, as a function with no hidden shared state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedlit.data.datamodule import FederatedDataModule
from fedlit.federation.seeding import derive_seed, seed_all
from fedlit.federation.trainers import TrainerTemplate
from fedlit.methods.base import ClientUpdate, FederatedMethod, Payload


@dataclass(frozen=True)
class ClientJob:
    """One client's work in one round: what it received and what it kept."""

    client_id: int
    payload: Payload
    state: Any
    visit: int


@dataclass(frozen=True)
class ClientRunner:
    """Everything a client's round needs besides its inputs: fixed for the whole run.

    ``method`` is used only for its configuration and factories (never its global network),
    ``data`` for the client's own shard, so a runner can be shipped to another process.
    """

    method: FederatedMethod
    data: FederatedDataModule
    trainer: TrainerTemplate
    seed: int
    total_rounds: int
    local_epochs: int = 1
    local_steps: int | None = None

    def __call__(
        self, payload: Payload, client_id: int, round_idx: int, state: Any, visit: int = 1
    ) -> ClientUpdate:
        """Train client ``client_id`` in round ``round_idx`` from ``payload`` and ``state``;
        ``visit`` counts the rounds it has been selected in, this one included (streaming data).

        Returns the upload, the client's example count, its new persistent state and metrics.
        """
        seed_all(derive_seed(self.seed, round_idx, client_id))
        method = self.method
        method.on_round_start(round_idx, self.total_rounds)
        client = self.data.client_data(client_id, visit)  # its own data, nothing else
        objective = method.client_objective(payload, client, state)
        loader = method.client_loader(client)
        self.trainer.fit(objective, loader, self.local_epochs, self.local_steps)
        return ClientUpdate(
            client_id=client_id,
            upload=method.client_upload(objective),
            num_examples=len(client),
            state=method.client_state(objective, state),
            metrics=objective.epoch_metrics(),
        )

    def receive(
        self,
        payload: Payload,
        client_ids: Sequence[int],
        states: Sequence[Any],
        visits: Sequence[int],
    ) -> list[Any]:
        """Clients ``client_ids`` receive ``payload`` without training
        (the plan's ``Step.RECEIVE``): their new persistent states, in order."""
        clients = [self.data.client_data(c, v) for c, v in zip(client_ids, visits, strict=True)]
        return self.method.clients_receive(payload, clients, states, self.trainer.device())
