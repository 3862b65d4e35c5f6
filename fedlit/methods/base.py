"""The shared base of every federated method.

A method is a LightningModule that holds the *global* network and evaluates it, plus the
method's rules: which objective the server trains and when, which objective a client trains,
what is sent down, what is uploaded and how uploads are aggregated, and what a client keeps
between rounds. The federation driver (``fedlit.federation``) runs the rounds, fits the objectives
in fedlit's own loop (:mod:`fedlit.federation.fit`), and owns logging and checkpoints; it never
knows which method it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from lightning import LightningModule
from lightning.pytorch.utilities import CombinedLoader
from torch import Tensor, nn

from fedlit.aggregation import Aggregated, Aggregator, WeightedMean
from fedlit.aggregation.payloads import MODEL, Payload, StateDict
from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.loaders import ImageBatches
from fedlit.methods.client_side import ClientSetup, ClientSide, ClientUpdate
from fedlit.methods.plan import SERVER_FIRST, RoundPlan
from fedlit.models import Architecture, Backbone, Classifier, check_input_fits, describe
from fedlit.objectives import Objective, Optimization, SupervisedCE
from fedlit.search_space import SERVER_SPACE, Distribution

if TYPE_CHECKING:
    from fedlit.federation.config import FederationConfig

DEFAULT_OPTIMIZATION = Optimization()


def classifier_part(state: StateDict, prefix: str, template: Classifier) -> StateDict:
    """The entries of ``state`` under ``prefix`` (e.g. ``network.``) that ``template`` (a
    Classifier) has, the prefix removed; a KeyError names a key of ``template`` it lacks."""
    keys = template.state_dict().keys()
    part = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    missing = [k for k in keys if k not in part]
    if missing:
        raise KeyError(f"no {prefix}{missing[0]} in the checkpoint")
    return {k: part[k] for k in keys}


def seed_classifier(network: Classifier, state: StateDict) -> None:
    """Load a Classifier's state (``backbone.*``, ``head.*``) into ``network``; heads it has
    besides (projector, predictor) keep their values."""
    result = network.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"{result.unexpected_keys[0]!r} is not in the network")
    left = [k for k in result.missing_keys if not k.startswith(("projector.", "predictor."))]
    if left:
        raise ValueError(f"the warm start has no {left[0]!r}")


def marks(method: type[FederatedMethod]) -> tuple[str, ...]:
    """What results tables write beside a method's name (``run.json``'s ``marks``), from its
    class's flags: ``oracle``, ``centralized``, ``not private``."""
    return (
        ("oracle",) * method.oracle
        + ("centralized",) * method.centralized
        + ("not private",) * (not method.private)
    )


class FederatedMethod(LightningModule):
    """Base of all methods: the global network, its evaluation, and default FedAvg rules.

    A method's ``__init__`` signature is its recipe schema (``model.init_args``): these two
    arguments, then the method's own. Each setting has one home where it is validated: the
    network's in :class:`~fedlit.models.Architecture` (``network``), the optimiser's in
    :class:`~fedlit.objectives.Optimization` (``optim``), a client loss's in its objective's
    dataclass (``loss``, e.g. :class:`~fedlit.objectives.FixMatchLoss`), the method's own in
    the method.

    Args:
        network: the network's settings: backbone, norm, pretrained weights, and the data's
            classes, channels and image side (linked from ``data`` by the CLI).
        optim: learning rates, optimiser and run-level schedule of server and clients.

    Round-dependent values (learning rates, ramps, loss weights) reach the objectives through
    one hook, :meth:`on_round_start`, called before anything of a round is built.
    """

    #: Client loaders carry true labels: an oracle, not a semi-supervised method (announced
    #: when a run starts and marked in results tables, see :meth:`marks`).
    oracle: ClassVar[bool] = False
    #: A client receives the server's model and nothing of another client's. False for a
    #: method that sends clients other clients' models (FedMatch's helpers), which breaks
    #: standard FL's privacy (paper 003): announced and marked as the oracle is.
    private: ClassVar[bool] = True
    #: The method can run with the labels at the clients (``data.labels_at: client``).
    supports_labels_at_client: ClassVar[bool] = False
    #: Every client's images are trained on at the server, without federation: a reference
    #: for what semi-supervised learning gives at the budget, not a federated method
    #: (announced and marked as the oracle is).
    centralized: ClassVar[bool] = False
    #: What a tuning varies (:mod:`fedlit.search_space`): dotted ``fedlit fit`` key -> its
    #: range. Every method tunes the server's learning rate and epochs; a method with clients
    #: adds their learning rate, and each method its own settings, in ranges its paper uses.
    search_space: ClassVar[dict[str, Distribution]] = SERVER_SPACE
    #: Keys a comparison's ``tune.spaces`` may add with a range of its own (e.g. FedProx's mu).
    optional_space: ClassVar[dict[str, Distribution]] = {}

    def __init__(self, network: Architecture, optim: Optimization = DEFAULT_OPTIMIZATION) -> None:
        super().__init__()
        #: The network's settings as given (a backbone given as a module is a template each
        #: build copies: held here, it is in no state dict and no device move).
        self.network_settings = network
        self.backbone_name = describe(network.backbone)
        self.optim = optim
        if isinstance(network.backbone, nn.Module):  # hparams keep the module's description
            self.save_hyperparameters(ignore=["network"])
            self.hparams["network"] = replace(network, backbone=self.backbone_name)
        else:
            self.save_hyperparameters()
        self.network: Classifier = self._new_network()
        if network.image_size is not None:  # a backbone that does not fit the data is refused
            side = network.image_size
            check_input_fits(
                self.network.backbone, (network.in_channels, side, side), self.backbone_name
            )
        #: How the uploads become the global network: FedAvg by n_k unless the method says.
        self.aggregator: Aggregator = WeightedMean()
        #: The round being run and the run's length, set by :meth:`on_round_start`.
        self.round_idx, self.total_rounds = 0, 1

    def round_plan(self) -> RoundPlan:
        """The method's round, step by step, and its bootstrap before round 1
        (:class:`~fedlit.methods.plan.RoundPlan`): by default the server trains, broadcasts,
        and aggregates the clients' uploads (:data:`~fedlit.methods.plan.SERVER_FIRST`)."""
        return SERVER_FIRST

    # --- the network ---------------------------------------------------------------------
    def architecture(self) -> Architecture:
        """The network this method's server and its clients build: :attr:`network_settings`
        (an SSL method adds its heads)."""
        return self.network_settings

    def _new_network(self) -> Classifier:
        """A freshly initialised network of this method's architecture, its backbone holding
        the pretrained weights where ``backbone_weights`` is set."""
        return self.architecture().build(pretrained=True)

    def initialize(self) -> None:
        """Re-draw every network the method holds (the driver seeds this from the run seed)."""
        self.network.load_state_dict(self._new_network().state_dict())

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    # --- warm start (federation.init_from) ------------------------------------------------
    @classmethod
    def scored_state(cls, method_state: StateDict, template: Classifier) -> StateDict:
        """The network this method scores (:meth:`eval_network`) as a Classifier's state
        (``template``'s keys: ``backbone.*``, ``head.*``), from a checkpoint's method state:
        what a run warm-started from a run of this method starts from. By default the global
        network's (``network.*``)."""
        return classifier_part(method_state, "network.", template)

    def warm_start(self, network: StateDict, data: FederatedDataModule) -> None:
        """Seed every network the method holds from ``network``, another run's scored network
        (a Classifier's state of this method's architecture, checked), after
        :meth:`initialize` (the driver calls it for ``federation.init_from``, after the data
        are loaded, instead of the plan's bootstrap). By default the global network takes it;
        an SSL method's projector and predictor heads keep their initial draw."""
        seed_classifier(self.network, network)

    def on_round_start(self, round_idx: int, total_rounds: int) -> None:
        """Round ``round_idx`` of ``total_rounds`` starts (0: the bootstrap before round 1):
        a method computes its server's round values here (its client side has its own
        :meth:`~fedlit.methods.client_side.ClientSide.on_round_start`). Called by the driver;
        it only sets values, so calling it twice for one round changes nothing."""
        self.round_idx, self.total_rounds = round_idx, total_rounds

    def _server_kwargs(self) -> dict[str, Any]:
        """The server objective's optimiser settings this round."""
        return self.optim.objective_kwargs(self.optim.server_lr, self.round_idx, self.total_rounds)

    # --- server ---------------------------------------------------------------------------
    def server_objective(self) -> Objective | None:
        """The objective the server trains ``self.network`` with (in place); None: no step."""
        return SupervisedCE(self.network, **self._server_kwargs())

    def server_step_done(
        self, objective: Objective, data: FederatedDataModule, device: torch.device | None = None
    ) -> None:
        """Called after the server's objective has trained (e.g. to keep a step count, or to
        measure the new model on the server's validation set); ``device``: the training
        device, where work outside a Trainer runs (None: the network's own)."""

    def server_loader(self, data: FederatedDataModule) -> ImageBatches | CombinedLoader:
        """The server step's loader (FedCon with unlabeled images at the server: a labeled
        and an unlabeled batch together)."""
        return data.server_dataloader(("weak",))

    # --- communication --------------------------------------------------------------------
    def is_shared(self, key: str) -> bool:
        """Whether state key ``key`` of the global network is sent to clients and averaged."""
        return True

    def _shared_state(self) -> StateDict:
        """A copy of the global network's shared weights."""
        return {
            k: v.detach().clone() for k, v in self.network.state_dict().items() if self.is_shared(k)
        }

    def broadcast(self) -> Payload:
        """What the server sends to every sampled client this round: named parts, the shared
        weights as ``"model"`` (a method adds its own parts: a teacher, thresholds)."""
        return {MODEL: self._shared_state()}

    def client_payload(self, payload: Payload, client_id: int) -> Payload:
        """What client ``client_id`` receives: the round's ``payload`` unless the method sends
        different clients different models (FedRGD's group averages)."""
        return payload

    # --- client ---------------------------------------------------------------------------
    def client_side(self) -> ClientSide:
        """What the clients run (built once per run, before round 1): a
        :class:`~fedlit.methods.client_side.ClientSide` holding the method's client settings
        and none of its server state. This default trains no client objective (Server-SL)."""
        return ClientSide(self._client_setup())

    def _client_setup(self) -> ClientSetup:
        """What every client side is built from (a subclass's :meth:`client_side` passes it
        on): the architecture, the optimiser settings and the shared state keys
        (:meth:`is_shared` of the global network's keys)."""
        shared = frozenset(k for k in self.network.state_dict() if self.is_shared(k))
        return ClientSetup(self.architecture(), self.optim, shared)

    # --- aggregation ----------------------------------------------------------------------
    def aggregate(self, updates: Sequence[ClientUpdate]) -> Aggregated:
        """Replace the shared part of the global network by the uploads' aggregate
        (:attr:`aggregator`, given :meth:`server_model` where the rule averages it in)."""
        server = self.server_model() if self.aggregator.needs_server else None
        result = self.aggregator(
            [u.model for u in updates], [u.num_examples for u in updates], server
        )
        self.network.load_state_dict(result.state, strict=False)
        return result

    def server_model(self) -> StateDict:
        """The server's model, as the rules that average it with the uploads take it: the
        shared part of the global network."""
        return {k: v for k, v in self.network.state_dict().items() if self.is_shared(k)}

    def end_round(self) -> dict[str, float]:
        """Called once a round's steps are done, before evaluation (a teacher's EMA step);
        returns the method's own numbers for the round's row (FedSEAL's lambda and
        thresholds as sent), none by default."""
        return {}

    def validate_data(self, data: FederatedDataModule) -> None:
        """Raise ValueError, naming the key, if ``data`` cannot serve this method; a method
        that needs something of the data takes it here too (FedMatch: its probe images).
        Called by the driver once the data are loaded, before any work starts and before the
        networks are initialised or restored."""
        check_input_fits(self.network.backbone, data.image_shape, self.backbone_name)
        unlabeled = data.clients_without_labels
        if self.oracle and unlabeled is not None:
            setting, why = unlabeled
            raise ValueError(
                f"{setting}: {type(self).__name__} is an oracle whose clients train on their "
                f"true labels, and {why}"
            )

    def check_federation(self, config: FederationConfig) -> None:
        """Raise ValueError, naming the key, if this method's settings cannot run with the
        federation's ``config`` (called by the driver before the data are loaded)."""

    # --- state kept across rounds ------------------------------------------------------
    # What a method keeps on the server between rounds (a teacher, a target, thresholds, step
    # counts) is a submodule or a registered buffer (or, for what is not a tensor, the module's
    # extra state), so ``method.state_dict()`` is the whole server side of a checkpoint.

    # --- evaluation ---------------------------------------------------------------------
    def eval_network(self) -> nn.Module:
        """The network whose test accuracy is logged each round (images -> logits)."""
        return self.network

    def encoder(self) -> Backbone:
        """The encoder the finetune / linear evaluation protocols start from."""
        return self.network.backbone
