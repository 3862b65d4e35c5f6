"""FedSup (paper 000, section 4.1 and Algorithm 2): the server's supervised net as the target."""

from __future__ import annotations

from typing import Any

from torch import nn

from fedlit.aggregation import GroupwiseWithServer
from fedlit.aggregation.payloads import state_part
from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.pool import ClientData
from fedlit.methods.base import (
    DEFAULT_OPTIMIZATION,
    Payload,
    StateDict,
    classifier_part,
    seed_classifier,
)
from fedlit.methods.client_side import ClientSetup, ClientSide
from fedlit.methods.ssl import FedAvgSSL
from fedlit.models import Architecture, Classifier, has_stages
from fedlit.objectives import (
    FedSupClient,
    Objective,
    Optimization,
    SupervisedCE,
    feature_map_weight,
)

TARGET = "target"  # the payload part of the server's supervised network


class FedSup(FedAvgSSL):
    """FedSup.

    Two networks of one architecture (backbone + classifier head + BYOL projector and predictor):
    the *online* network (``self.network``), trained by clients and aggregated, and the server's
    *supervised* network f_Server (``self.server_network``, server state), trained with CE on the
    labeled set every round. Each sampled client receives both; it trains the online network with
    :class:`~fedlit.objectives.FedSupClient` against the frozen f_Server (negative-cosine
    consistency + lambda_s^(t/T) x stage-wise feature-map MSE; no pseudo-labels) and uploads the
    online network only. Uploads are combined by group-wise averaging with f_Server (paper 004
    eq 7, ``num_groups`` groups) into the next online network. The per-round ``test/acc`` is
    f_Server's; the online encoder is judged by ``federation.final_eval`` (finetune, linear).

    Args:
        lambda_s: base of the feature-map weight lambda_s^(t/T) (1e-4 in paper 000).
        num_groups: S, groups for group-wise averaging (2: five clients as 2 + 3; validated by
            :class:`~fedlit.aggregation.GroupwiseWithServer`).
        The others: see :class:`FedAvgSSL` (``proj_dim``) and :class:`FederatedMethod`.
    """

    ssl_kind = "byol"

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        proj_dim: int | None = None,
        lambda_s: float = 1e-4,
        num_groups: int = 2,
    ) -> None:
        if not 0 < lambda_s <= 1:
            raise ValueError(f"model.lambda_s must be in (0, 1], got {lambda_s}")
        aggregator = GroupwiseWithServer(num_groups)  # paper 000 Algorithm 2
        super().__init__(network, optim, proj_dim)
        if not has_stages(self.network.backbone):
            raise ValueError(
                f"model.network.backbone={self.backbone_name!r}: FedSup's client loss compares the "
                "feature maps of every backbone stage (paper 000, 4.1.1), and this network does "
                "not expose its stages; use one of fedlit's backbones, a torchvision ResNet "
                "(torchvision/resnet18, ...) or a fedlit.models.Backbone subclass (its stages)"
            )
        self.lambda_s = lambda_s
        self.aggregator = aggregator
        self.server_network = self._new_network()

    def initialize(self) -> None:
        super().initialize()
        self.server_network.load_state_dict(self._new_network().state_dict())

    @classmethod
    def scored_state(cls, method_state: StateDict, template: Classifier) -> StateDict:
        """f_Server, the network FedSup scores (``server_network.*``)."""
        return classifier_part(method_state, "server_network.", template)

    def warm_start(self, network: StateDict, data: FederatedDataModule) -> None:
        """f_Server (the scored, supervised network) and the online network's backbone and
        classifier head take the source's network; the online network's BYOL projector and
        predictor keep their initial draw."""
        seed_classifier(self.server_network, network)
        seed_classifier(self.network, network)

    # --- server: f_Server is trained, and evaluated each round ----------------------------
    def server_objective(self) -> Objective:
        return SupervisedCE(self.server_network, **self._server_kwargs())

    def eval_network(self) -> nn.Module:
        return self.server_network

    # --- communication: the online network + f_Server down, the online network up -----------
    def broadcast(self) -> Payload:
        server = self.server_network.state_dict()
        target = {k: v.detach().clone() for k, v in server.items() if self.is_shared(k)}
        return super().broadcast() | {TARGET: target}

    def client_side(self) -> FedSupClientSide:
        return FedSupClientSide(self._client_setup(), lambda_s=self.lambda_s)

    def server_model(self) -> StateDict:
        """f_Server: the group-wise average (paper 004 eq 7, Algorithm 2) takes the server's
        supervised network."""
        return {k: v for k, v in self.server_network.state_dict().items() if self.is_shared(k)}


class FedSupClientSide(ClientSide):
    """FedSup's client: the online network trained against the received f_Server
    (:class:`~fedlit.objectives.FedSupClient`) on (strong, plain) views, the feature-map MSE
    weighted by lambda_s^(t/T).

    Args:
        lambda_s: base of the feature-map weight.
        The others: see :class:`~fedlit.methods.client_side.ClientSide`.
    """

    def __init__(self, setup: ClientSetup, lambda_s: float) -> None:
        super().__init__(setup, ("strong", "plain"))
        self.lambda_s = lambda_s
        self.mse_weight = 1.0  # lambda_s^(t/T), set by on_round_start

    def on_round_start(self, round_idx: int, total_rounds: int) -> None:
        super().on_round_start(round_idx, total_rounds)
        self.mse_weight = feature_map_weight(self.lambda_s, round_idx, total_rounds)

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        return FedSupClient(
            self.model(payload),
            self.network(state_part(payload, TARGET), TARGET),
            mse_weight=self.mse_weight,
            **self.optimizer_kwargs(),
        )
