"""A method's client side: what one client's round needs of the method, and nothing more.

A method (:class:`~fedlit.methods.FederatedMethod`) builds its client side once per run
(:meth:`~fedlit.methods.FederatedMethod.client_side`) from its settings: the architecture the
clients build, the clients' optimiser settings, the names of the shared state keys, the views
and the method's client-loss settings. Executors receive and pickle the client side, never the
method, so client code cannot reach the server's network, teacher or buffers under any
executor: what a client knows of the server is what its payload carries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.pytorch.utilities import CombinedLoader
from torch import Tensor

from fedlit.aggregation.payloads import MODEL, Payload, StateDict, detached_copy, state_part
from fedlit.data.loaders import ImageBatches
from fedlit.data.pool import ClientData
from fedlit.models import Architecture, Classifier
from fedlit.objectives import Objective, Optimization
from fedlit.objectives.base import KeptOptimizers


@dataclass(frozen=True)
class ClientUpdate:
    """What one client returns from a round."""

    client_id: int
    upload: Payload  # what is sent up: named parts, the network's shared weights as "model"
    num_examples: int  # n_k, the FedAvg weight
    state: Any = None  # the client's new persistent state (never uploaded)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def model(self) -> StateDict:
        """The upload's model part: the client's shared weights."""
        return state_part(self.upload, MODEL)


#: The seed every client network's initial weights are drawn from (:meth:`ClientSide.network`):
#: they are the values of the keys a payload does not carry (an SSL method's local head).
BUILD_SEED = 0


@dataclass(frozen=True)
class PersistentNetwork:
    """A network kept by a worker for a whole run, and its state as built (``built``, by
    state-dict key: what a key the received weights do not carry is reset to)."""

    network: Classifier
    built: dict[str, Tensor]

    @classmethod
    def build(cls, architecture: Architecture) -> PersistentNetwork:
        """``architecture`` built from :data:`BUILD_SEED`, torch's global generators untouched:
        only the CPU's generator is seeded (the network is built on the CPU); ``manual_seed``
        would also re-seed every GPU's generator, which the fork does not restore."""
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(BUILD_SEED)
            network = architecture.build()
        return cls(network, {k: v.detach().clone() for k, v in network.state_dict().items()})

    def load(self, weights: StateDict) -> Classifier:
        """The network holding ``weights`` (state-dict keys to tensors of the keys' shapes), and
        every key ``weights`` lacks as built; a ValueError names a key the network lacks.

        The live tensors are looked up every time: moving a module between devices (to the
        training device for a fit, and back) replaces its buffers."""
        missing = [k for k in weights if k not in self.built]
        if missing:
            raise ValueError(f"payload key {missing[0]!r} is not in the network")
        live = self.network.state_dict(keep_vars=True)
        with torch.no_grad():  # one multi-tensor copy, not one op a tensor
            torch._foreach_copy_(
                [live[key] for key in self.built],
                [weights.get(key, value) for key, value in self.built.items()],
            )
        return self.network


@dataclass(frozen=True)
class ClientSetup:
    """What every client side is built from, whatever its method."""

    architecture: Architecture  # the network a client builds from received weights
    optim: Optimization  # the clients' optimiser and learning-rate schedule
    shared: frozenset[str]  # the state keys of the global network that are sent and averaged


class ClientSide:
    """The client side of a method: a client's loader, objective, upload and kept state.

    Args:
        setup: what every client side is built from (:class:`ClientSetup`).
        views: the augmented views of each unlabeled image the objective takes.

    Round-dependent values reach it through :meth:`on_round_start`, called by the client
    runner before a client's work; a subclass adds the method's client-loss settings.
    """

    def __init__(self, setup: ClientSetup, views: tuple[str, ...] = ("weak",)) -> None:
        self.architecture, self.optim, self.shared = setup.architecture, setup.optim, setup.shared
        self.views = views
        #: The round being run and the run's length, set by :meth:`on_round_start`.
        self.round_idx, self.total_rounds = 0, 1
        #: This worker's persistent networks, by slot (:meth:`network`), and the optimisers
        #: its client objectives reuse; never pickled.
        self._networks: dict[str, PersistentNetwork] = {}
        self.kept_optimizers = KeptOptimizers()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the persistent networks and optimisers: each worker has its own."""
        return self.__dict__ | {"_networks": {}, "kept_optimizers": KeptOptimizers()}

    def on_round_start(self, round_idx: int, total_rounds: int) -> None:
        """Round ``round_idx`` of ``total_rounds`` starts: a subclass computes its round's
        values (ramps, loss weights) here. It only sets values, so calling it twice for one
        round changes nothing."""
        self.round_idx, self.total_rounds = round_idx, total_rounds

    def optimizer_kwargs(self) -> dict[str, Any]:
        """The client objective's optimiser settings this round."""
        return self.optim.objective_kwargs(self.optim.client_lr, self.round_idx, self.total_rounds)

    def is_shared(self, key: str) -> bool:
        """Whether a client network's state key ``key`` is uploaded."""
        return key in self.shared

    def network(self, weights: StateDict, slot: str | None = MODEL) -> Classifier:
        """This worker's network of ``slot`` (a role: the model, a teacher, a target) holding
        ``weights`` (a payload's model part, or a teacher's): built once per worker on first
        use, then overwritten in place for every client (``copy_``: the received keys from
        ``weights``, every other key back to its built value). ``slot`` None: a new network
        (for a client that changes its network's structure, as FedMatch's decomposition does).

        Every build draws its initial weights from a fixed seed (:data:`BUILD_SEED`) in a
        forked generator, so building a network neither depends on nor moves the client's
        generator: what a client computes is the same whichever worker ran it, first or not.
        """
        if slot is None:
            return PersistentNetwork.build(self.architecture).load(weights)
        if slot not in self._networks:
            self._networks[slot] = PersistentNetwork.build(self.architecture)
        return self._networks[slot].load(weights)

    def model(self, payload: Payload) -> Classifier:
        """The worker's model network holding the payload's ``"model"`` part (:meth:`network`)."""
        return self.network(state_part(payload, MODEL))

    def loader(self, client: ClientData) -> ImageBatches | CombinedLoader:
        """The client's training loader this round, from its own data only."""
        return client.dataloader(self.views)

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        """The objective ``client`` trains this round, from what it received and its state
        (and, where the method needs it, the client's own data)."""
        raise NotImplementedError(f"{type(self).__name__} trains no client objective")

    def upload(self, objective: Objective) -> Payload:
        """What a client sends back after training: its shared weights, as ``"model"``."""
        return {MODEL: detached_copy(objective.network, self.is_shared)}

    def state(self, objective: Objective, previous: Any) -> Any:
        """The client's persistent state after this round (stateless methods: None)."""
        return None

    def receive(
        self,
        payload: Payload,
        clients: Sequence[ClientData],
        states: Sequence[Any],
        device: torch.device,
    ) -> list[Any]:
        """The persistent states of the clients that received the round's ``payload`` but were
        not sampled to train (the plan's ``Step.RECEIVE``), all at once so that what they
        share (the received network) is built once; work on ``device``."""
        return list(states)


class ObjectiveClientSide(ClientSide):
    """A client that trains one objective class on the received model:
    ``objective(model, **settings, **optimizer_kwargs)`` (FixMatch and UDA with their
    ``loss``, the SSL objectives with theirs).

    Args:
        objective: the objective class.
        settings: its keyword arguments besides the network and the optimiser's.
        The others: see :class:`ClientSide`.
    """

    def __init__(
        self,
        setup: ClientSetup,
        views: tuple[str, ...],
        objective: type[Objective],
        **settings: Any,
    ) -> None:
        super().__init__(setup, views)
        self.objective_class, self.settings = objective, settings

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        return self.objective_class(self.model(payload), **self.settings, **self.optimizer_kwargs())
