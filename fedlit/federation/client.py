"""One client's work in one round, as a function with no hidden shared state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedlit.aggregation.payloads import Payload
from fedlit.data.datamodule import FederatedDataModule
from fedlit.federation.seeding import derive_seed, seed_all
from fedlit.federation.fit import TrainerTemplate
from fedlit.methods.client_side import ClientSide, ClientUpdate


@dataclass(frozen=True)
class ClientJob:
    """One client's work in one round: what it received and what it kept."""

    client_id: int
    payload: Payload
    state: Any
    visit: int


@dataclass(frozen=True)
class ReceiveJob:
    """Clients that receive a round's payload without training (the plan's
    ``Step.RECEIVE``): who they are, what they kept and how often they were selected."""

    payload: Payload
    client_ids: Sequence[int]
    states: Sequence[Any]
    visits: Sequence[int]

    def chunks(self, count: int) -> list[slice]:
        """The job split over ``count`` workers: worker i takes clients i, i + count, ...;
        no empty chunk."""
        return [slice(i, len(self.client_ids), count) for i in range(min(count, len(self)))]

    def part(self, chunk: slice) -> ReceiveJob:
        """The clients of ``chunk`` (a slice of :meth:`chunks`) without the payload (``{}``):
        an executor sends the payload apart, once for all parts, and gives it back to each
        part in the worker (:func:`dataclasses.replace`)."""
        return ReceiveJob(
            {},
            list(self.client_ids[chunk]),
            list(self.states[chunk]),
            list(self.visits[chunk]),
        )

    def __len__(self) -> int:
        return len(self.client_ids)


@dataclass(frozen=True)
class ClientRunner:
    """Everything a client's round needs besides its inputs: fixed for the whole run.

    ``client`` is the method's client side (its client settings, none of its server state),
    ``data`` is used for the client's own shard, so a runner can be shipped to another process.

    Each worker's copy keeps, for the whole run, the client side's persistent networks
    (:meth:`~fedlit.methods.client_side.ClientSide.network`: built once from a fixed seed,
    overwritten in place for every client) and its optimiser (reset in place, as new); a
    client's persistent state comes in and goes out as tensors. Every client's randomness comes
    from the global generators seeded from (run seed, round, client) before its work, which no
    build draws from, so its update is the same whichever worker runs it, and after whichever
    other clients. Its fit leaves the networks on the training device.
    """

    client: ClientSide
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
        side = self.client
        side.on_round_start(round_idx, self.total_rounds)
        client = self.data.client_data(client_id, visit)  # its own data, nothing else
        objective = side.objective(payload, client, state)
        loader = side.loader(client)
        metrics = self.trainer.fit(
            objective, loader, self.local_epochs, self.local_steps, kept=side.kept_optimizers
        )  # the worker's optimisers: reset in place, not built anew
        return ClientUpdate(
            client_id=client_id,
            upload=side.upload(objective),
            num_examples=len(client),
            state=side.state(objective, state),
            metrics=metrics,
        )

    def receive(self, job: ReceiveJob) -> list[Any]:
        """The job's clients receive its payload without training (the plan's
        ``Step.RECEIVE``): their new persistent states, in order."""
        visits = zip(job.client_ids, job.visits, strict=True)
        clients = [self.data.client_data(c, v) for c, v in visits]
        return self.client.receive(job.payload, clients, job.states, self.trainer.device())
