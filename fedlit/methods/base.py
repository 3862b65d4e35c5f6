"""The shared base of every federated method.

A method is a LightningModule that holds the *global* network and evaluates it, plus the
method's rules: which objective the server trains and when, which objective a client trains,
what is sent down, what is uploaded and how uploads are aggregated, and what a client keeps
between rounds. The federation driver (``fedlit.federation``) runs the rounds and owns Trainers,
logging and checkpoints; it never knows which method it runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from lightning import LightningModule
from lightning.pytorch.utilities import CombinedLoader
from torch import Tensor, nn

from fedlit.aggregation import Aggregated, Aggregator, WeightedMean
from fedlit.aggregation.payloads import MODEL, Payload, StateDict, state_part
from fedlit.data.client import ClientData
from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.loaders import ImageBatches
from fedlit.models import Backbone, Classifier, build_classifier
from fedlit.objectives import Objective, SupervisedCE, WarmupCosine
from fedlit.objectives.base import OPTIMIZERS

LR_SCHEDULES = ("constant", "cosine")


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


class FederatedMethod(LightningModule):
    """Base of all methods: the global network, its evaluation, and default FedAvg rules.

    Args:
        num_classes: classes of the data set (linked from ``data.num_classes`` by the CLI).
        in_channels: image channels (linked from ``data.in_channels``).
        backbone: a name from :data:`fedlit.models.BACKBONES`.
        norm: "bn", "gn" or "none"; None keeps the backbone's own.
        server_lr: learning rate of the server's objective.
        client_lr: learning rate of the clients' objective.
        optimizer: "sgd" or "adam", for server and clients.
        momentum: SGD momentum, in [0, 1).
        weight_decay: L2 weight decay, >= 0.
        lr_decay: per-round factor on both learning rates (lr * lr_decay ** (round - 1); paper
            002's 0.995).
        lr_schedule: "cosine" (default): both learning rates follow a warm-up + cosine schedule
            over the whole run (:class:`~fedlit.objectives.WarmupCosine`), stepped every
            optimiser step, the server's and the clients' steps of round r covering the run's
            fraction ((r - 1) / R, r / R); "constant": no schedule (``lr_decay`` only).
        warmup: fraction of the run spent warming up linearly (cosine schedule).
        cosine_c: the cosine's periodic coefficient: 0.5 decays to the floor at the end of the
            run; FixMatch's and paper 004's 7/16 to cos(7 pi / 16) ~ 0.2.
        cosine_eps: the schedule's floor (paper 004: 1e-4).

    Every value is checked here, where it is declared (finite, in range, a known optimizer),
    so a bad one stops the CLI before anything is written.
    """

    #: Clients take part (False for Server-SL, which trains on the server's labels only).
    uses_clients: ClassVar[bool] = True
    #: The server trains before broadcasting (True) or after aggregation (False).
    server_first: ClassVar[bool] = True
    #: A server-first method's server also fine-tunes the aggregate before it is scored
    #: (paper 000's Algorithm 1 for its FixMatch and SSL baselines): a second server step.
    server_finetunes: ClassVar[bool] = False
    #: Client loaders carry true labels: an oracle, not a semi-supervised method (announced
    #: when a run starts and marked in results tables, see :meth:`marks`).
    oracle: ClassVar[bool] = False
    #: Every client receives each round's broadcast, sampled or not (paper 002's Algorithm 1,
    #: line 6); those that do not train update their state in :meth:`clients_receive`.
    all_clients_receive: ClassVar[bool] = False
    #: Augmented views of each unlabeled image a client's objective takes.
    client_views: ClassVar[tuple[str, ...]] = ("weak",)
    #: The method can run with the labels at the clients (``data.labels_at: client``).
    supports_labels_at_client: ClassVar[bool] = False
    #: Epochs of the server objective on the labeled set before round 1 (0: none).
    bootstrap_epochs: int = 0

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        backbone: str = "small_cnn",
        norm: str | None = None,
        server_lr: float = 0.03,
        client_lr: float = 0.03,
        optimizer: str = "sgd",
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        lr_decay: float = 1.0,
        lr_schedule: str = "cosine",
        warmup: float = 0.0,
        cosine_c: float = 0.5,
        cosine_eps: float = 1e-4,
    ) -> None:
        super().__init__()
        for key, value in (("model.server_lr", server_lr), ("model.client_lr", client_lr)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{key} must be finite and > 0, got {value}")
        if not 0 < lr_decay <= 1:  # False for NaN too
            raise ValueError(f"model.lr_decay must be in (0, 1], got {lr_decay}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"model.optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        if not 0 <= momentum < 1:
            raise ValueError(f"model.momentum must be in [0, 1), got {momentum}")
        if not (math.isfinite(weight_decay) and weight_decay >= 0):
            raise ValueError(f"model.weight_decay must be finite and >= 0, got {weight_decay}")
        if lr_schedule not in LR_SCHEDULES:
            raise ValueError(
                f"model.lr_schedule must be one of {LR_SCHEDULES}, got {lr_schedule!r}"
            )
        try:
            schedule = WarmupCosine(warmup, cosine_c, cosine_eps)
        except ValueError as err:
            raise ValueError(f"model.warmup / model.cosine_c / model.cosine_eps: {err}") from err
        #: The run-level learning-rate schedule (None: constant).
        self.schedule = schedule if lr_schedule == "cosine" else None
        self.num_classes, self.in_channels = num_classes, in_channels
        self.backbone_name, self.norm = backbone, norm
        self.server_lr, self.client_lr = server_lr, client_lr
        self.optimizer_name, self.momentum, self.weight_decay = optimizer, momentum, weight_decay
        self.lr_decay = lr_decay
        self.save_hyperparameters()
        self.network: Classifier = self.new_network()
        #: How the uploads become the global network: FedAvg by n_k unless the method says.
        self.aggregator: Aggregator = WeightedMean()

    @classmethod
    def marks(cls) -> tuple[str, ...]:
        """What results tables write beside the method's name (``run.json``'s ``marks``)."""
        return ("oracle",) if cls.oracle else ()

    # --- the network ---------------------------------------------------------------------
    def new_network(self) -> Classifier:
        """A freshly initialised network of this method's architecture."""
        return build_classifier(self.backbone_name, self.num_classes, self.in_channels, self.norm)

    def initialize(self) -> None:
        """Re-draw every network the method holds (the driver seeds this from the run seed)."""
        self.network.load_state_dict(self.new_network().state_dict())

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    def optimizer_kwargs(self, lr: float, round_idx: int, total_rounds: int) -> dict[str, Any]:
        """An objective's optimiser settings in round ``round_idx`` of ``total_rounds``: the
        learning rate after ``lr_decay``, and the run-level schedule with the fraction of the
        run this round covers. Round 0 (a bootstrap before round 1) is not scheduled."""
        kw: dict[str, Any] = {
            "lr": lr * self.lr_decay ** max(round_idx - 1, 0),
            "optimizer": self.optimizer_name,
            "momentum": self.momentum,
            "weight_decay": self.weight_decay,
        }
        if self.schedule is not None and round_idx >= 1:
            progress = ((round_idx - 1) / total_rounds, round_idx / total_rounds)
            kw |= {"schedule": self.schedule, "progress": progress}
        return kw

    # --- server ---------------------------------------------------------------------------
    def server_objective(self, round_idx: int, total_rounds: int) -> Objective | None:
        """The objective the server trains ``self.network`` with (in place); None: no step."""
        return SupervisedCE(
            self.network, **self.optimizer_kwargs(self.server_lr, round_idx, total_rounds)
        )

    def server_step_done(self, objective: Objective, data: FederatedDataModule) -> None:
        """Called after the server's objective has trained (e.g. to keep a step count, or to
        measure the new model on the server's validation set)."""

    def server_loader(self, data: FederatedDataModule) -> ImageBatches:
        return data.server_dataloader(("weak",))

    # --- communication --------------------------------------------------------------------
    def is_shared(self, key: str) -> bool:
        """Whether state key ``key`` of the global network is sent to clients and averaged."""
        return True

    def shared_state(self) -> StateDict:
        """A copy of the global network's shared weights."""
        return {
            k: v.detach().clone() for k, v in self.network.state_dict().items() if self.is_shared(k)
        }

    def broadcast(self, round_idx: int) -> Payload:
        """What the server sends to every sampled client this round: named parts, the shared
        weights as ``"model"`` (a method adds its own parts: a teacher, thresholds)."""
        return {MODEL: self.shared_state()}

    def client_payload(self, payload: Payload, client_id: int) -> Payload:
        """What client ``client_id`` receives: the round's ``payload`` unless the method sends
        different clients different models (FedRGD's group averages)."""
        return payload

    # --- client ---------------------------------------------------------------------------
    def client_loader(self, client: ClientData) -> ImageBatches | CombinedLoader:
        """The client's training loader this round, from its own data only."""
        return client.dataloader(self.client_views)

    def client_setup(self, objective: Objective, client: ClientData) -> None:
        """Give a client's objective what it needs from the client's own data before training
        (FedSEAL: its images for the self-ensemble pass). Default: nothing."""

    def client_network(self, weights: StateDict) -> Classifier:
        """A new network holding ``weights`` (a payload's model part, or a teacher's). Client
        code never reads ``self.network``."""
        network = self.new_network()
        missing = [k for k in weights if k not in network.state_dict()]
        if missing:
            raise ValueError(f"payload key {missing[0]!r} is not in the network")
        network.load_state_dict(weights, strict=False)
        return network

    def client_model(self, payload: Payload) -> Classifier:
        """A new network holding the payload's ``"model"`` part."""
        return self.client_network(state_part(payload, MODEL))

    def client_objective(
        self, payload: Payload, round_idx: int, total_rounds: int, state: Any
    ) -> Objective:
        """The objective a client trains this round, from what it received and its state."""
        raise NotImplementedError

    def client_upload(self, objective: Objective) -> Payload:
        """What a client sends back after training: its shared weights, as ``"model"``."""
        weights = objective.network.state_dict()
        shared = {k: v.detach().cpu().clone() for k, v in weights.items() if self.is_shared(k)}
        return {MODEL: shared}

    def client_state(self, objective: Objective, previous: Any) -> Any:
        """The client's persistent state after this round (stateless methods: None)."""
        return None

    def clients_receive(
        self,
        payload: Payload,
        clients: Sequence[ClientData],
        states: Sequence[Any],
        device: torch.device,
    ) -> list[Any]:
        """The persistent states of the clients that received the round's ``payload`` but were
        not sampled to train (only called where ``all_clients_receive``), all at once so that
        what they share (the received network) is built once; work on ``device``."""
        return list(states)

    # --- aggregation ----------------------------------------------------------------------
    def aggregate(self, updates: Sequence[ClientUpdate], round_idx: int) -> Aggregated:
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

    def end_round(self, round_idx: int) -> None:
        """Called once a round's aggregation and server step are done, before evaluation
        (e.g. a teacher's EMA step)."""

    def validate_data(self, data: FederatedDataModule) -> None:
        """Raise ValueError, naming the key, if ``data`` cannot serve this method (called by
        the driver before any work starts)."""

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
