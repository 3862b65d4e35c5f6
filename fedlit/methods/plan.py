"""A method's round as a declared plan: the steps the round loop
(:func:`fedlit.federation.rounds.run_round`) runs, in order, and the bootstrap before round 1.

Every round starts with the method's ``on_round_start`` and ends with its ``end_round`` and,
every ``federation.eval_every`` rounds, the evaluation; the plan says what happens between.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from lightning.pytorch.utilities import CombinedLoader

    from fedlit.data.datamodule import FederatedDataModule
    from fedlit.data.loaders import ImageBatches
    from fedlit.objectives import Objective


class Step(Enum):
    """One step of a round, as the round loop runs it."""

    #: The server trains its objective on its labeled set (``server/*``, stage "server step").
    SERVER = "server"
    #: The server builds what it sends this round (the method's ``broadcast``).
    BROADCAST = "broadcast"
    #: C of K clients are sampled, each sent its payload (``client_payload``) and run through
    #: the run's executor; a client that raises or uploads a non-finite value is left out.
    CLIENTS = "clients"
    #: The clients not sampled receive the broadcast without training (their client side's
    #: ``receive``; paper 002's Algorithm 1, line 6: FedSEAL).
    RECEIVE = "receive"
    #: The survivors' updates: checked against ``federation.min_clients``, observed by the
    #: callbacks, aggregated into the global network, averaged into ``client/*``.
    AGGREGATE = "aggregate"
    #: A second server step, on the aggregate, on a seed of its own (``finetune/*``, stage
    #: "fine-tune"; paper 000's Algorithm 1).
    FINETUNE = "finetune"
    #: No federation: the server trains the method's ``central_objective`` on every client's
    #: images pooled at the server, as many steps as the round's clients take together
    #: (``central/*``, stage "centralized step"; the centralized reference).
    CENTRAL = "central"


@runtime_checkable
class CentralTraining(Protocol):
    """What a method whose plan has :attr:`Step.CENTRAL` defines (the centralized reference)."""

    def central_objective(self) -> Objective:
        """The centralized step's objective, training the method's global network in place."""
        ...

    def central_loader(self, data: FederatedDataModule) -> ImageBatches | CombinedLoader:
        """The centralized step's loader: every client's whole shard, pooled at the server."""
        ...


#: The steps that exist only together, in this order: a round with clients.
CLIENT_STEPS = (Step.BROADCAST, Step.CLIENTS, Step.AGGREGATE)


@dataclass(frozen=True)
class RoundPlan:
    """A method's round: ``steps``, run in order each round, and ``bootstrap_epochs`` epochs of
    the server's objective before round 1 (0: no bootstrap; logged in row 0 as
    ``bootstrap/*``).

    Raises ValueError for a plan the loop cannot run: a step twice; broadcast, clients and
    aggregation not all present or not in that order; the unsampled clients' receive outside
    clients .. aggregation; a fine-tune before aggregation; negative bootstrap epochs.
    """

    steps: tuple[Step, ...]
    bootstrap_epochs: int = 0

    def __post_init__(self) -> None:
        steps = self.steps
        if not steps or len(set(steps)) != len(steps):
            raise ValueError(f"a round plan names each step once, got {self._names()}")
        in_order = [step for step in steps if step in CLIENT_STEPS]
        if in_order and in_order != list(CLIENT_STEPS):
            raise ValueError(
                f"a round plan with clients has broadcast, clients, aggregate in this order, "
                f"got {self._names()}"
            )
        if Step.RECEIVE in steps and not (
            Step.CLIENTS in steps
            and steps.index(Step.CLIENTS) < steps.index(Step.RECEIVE) < steps.index(Step.AGGREGATE)
        ):
            raise ValueError(f"receive comes between clients and aggregate, got {self._names()}")
        before = [s for s in (Step.AGGREGATE, Step.CENTRAL) if s in steps]
        if Step.FINETUNE in steps and not (
            before and steps.index(before[0]) < steps.index(Step.FINETUNE)
        ):
            raise ValueError(f"finetune comes after aggregate (or central), got {self._names()}")
        if self.bootstrap_epochs < 0:
            raise ValueError(f"bootstrap_epochs must be >= 0, got {self.bootstrap_epochs}")

    def _names(self) -> str:
        return "(" + ", ".join(step.value for step in self.steps) + ")"

    @property
    def uses_clients(self) -> bool:
        """Clients take part (not Server-SL's plan, the server's step alone)."""
        return Step.CLIENTS in self.steps


#: The server trains, then broadcasts; the clients' uploads are aggregated (FedAvg's default:
#: FedCon, FedMatch).
SERVER_FIRST = RoundPlan((Step.SERVER, *CLIENT_STEPS))
#: As :data:`SERVER_FIRST`, and the server fine-tunes the aggregate before it is scored
#: (paper 000's Algorithm 1: FedAvg-FixMatch, FedAvg-UDA, the FedAvg + SSL baselines).
SERVER_FIRST_AND_FINETUNE = RoundPlan((Step.SERVER, *CLIENT_STEPS, Step.FINETUNE))
#: The clients' uploads are aggregated, then the server trains the aggregate (FedAvg-SL, the
#: teacher-student family).
SERVER_LAST = RoundPlan((*CLIENT_STEPS, Step.SERVER))
#: The server trains on its labels alone (Server-SL).
SERVER_ONLY = RoundPlan((Step.SERVER,))
#: :data:`SERVER_FIRST_AND_FINETUNE` with the clients' work done at the server on their pooled
#: images (the centralized reference).
CENTRALIZED = RoundPlan((Step.SERVER, Step.CENTRAL, Step.FINETUNE))
