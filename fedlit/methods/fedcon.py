"""FedCon (paper 001, section III): contrastive online/target nets, backbone-only federation."""

from __future__ import annotations

import copy
from typing import Any

import torch
from lightly.models.modules.heads import ProjectionHead
from lightning.pytorch.utilities import CombinedLoader
from torch import nn

from fedlit.aggregation import Mean
from fedlit.aggregation.payloads import StateDict, host_copy
from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.loaders import ImageBatches
from fedlit.data.pool import ClientData
from fedlit.methods.base import DEFAULT_OPTIMIZATION, FederatedMethod, Payload, seed_classifier
from fedlit.methods.client_side import ClientSetup, ClientSide
from fedlit.models import Architecture
from fedlit.objectives import FedConClient, FedConServer, Objective, Optimization
from fedlit.search_space import CLIENT_SPACE


def fedcon_projector(feature_dim: int) -> nn.Module:
    """The client projector p: one linear layer feature_dim -> feature_dim (Table I's
    "MLP (320 x 320)" / "MLP (4096 x 4096)"), built with lightly's ProjectionHead."""
    return ProjectionHead([(feature_dim, feature_dim, None, None)])


class FedCon(FederatedMethod):
    """FedCon.

    Server (eqs 2-4): the online net theta (backbone b + classifier head f) minimises CE on two
    weak views plus the consistency J to the target net xi, symmetrised; xi <- tau xi +
    (1 - tau) theta after each step, tau ramped up to ``ema_decay``. xi is server state.
    Broadcast: the backbone b only; f stays on the server.
    Client (eqs 5-6): its own projector p (persistent client state, never uploaded) on the
    received backbone; loss ||p(b_theta(x + eta)) - b_xi(x + eta')||^2 symmetrised, with b_xi an
    EMA (``client_ema_decay``) of the backbone.
    Aggregation: the plain mean of the uploaded backbones, stitched with the server's f.
    With ``server_unlabeled`` (section IV-E) the server's step also draws a batch of its
    unlabeled images (``data.server_unlabeled_fraction``) with every labeled batch, and J
    covers both (eq 3's 1/(n + m) sum); an epoch is one pass over the larger of the two sets,
    the smaller one cycled.

    Args:
        ema_decay: tau, the server target's upper EMA decay (0.999).
        client_ema_decay: mu, the client target's EMA decay (0.999).
        server_unlabeled: apply J to the server's unlabeled images too (paper 001 IV-E).
        identity_projector: a client's new projector starts as the identity map (weight I,
            bias 0) instead of its random draw: an ablation for warm starts, where b_xi = b_theta
            and a drawn p starts far from the loss's minimum, so that its first gradients run
            through the trained backbone; the paper draws it.
        The others: see :class:`FederatedMethod`.
    """

    search_space = CLIENT_SPACE

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        ema_decay: float = 0.999,
        client_ema_decay: float = 0.999,
        server_unlabeled: bool = False,
        identity_projector: bool = False,
    ) -> None:
        for key, value in (("ema_decay", ema_decay), ("client_ema_decay", client_ema_decay)):
            if not 0 <= value <= 1:
                raise ValueError(f"model.{key} must be in [0, 1], got {value}")
        super().__init__(network, optim)
        self.ema_decay, self.client_ema_decay = ema_decay, client_ema_decay
        self.server_unlabeled, self.identity_projector = server_unlabeled, identity_projector
        self.aggregator = Mean()  # b_theta^G = 1/B sum_k b_theta^k (paper 001 III-B)
        self.target = copy.deepcopy(self.network)
        self.server_steps: torch.Tensor
        self.register_buffer("server_steps", torch.tensor(0))  # the target's ramp-up count

    def initialize(self) -> None:
        super().initialize()
        self.target.load_state_dict(self.network.state_dict())
        self.server_steps.zero_()

    def warm_start(self, network: StateDict, data: FederatedDataModule) -> None:
        """The online net theta (backbone b and the server's classifier f) and the target xi
        both take the source's network (xi = theta, as at a fresh start; its EMA ramp-up starts
        again); the clients' projectors, client state, start as drawn."""
        seed_classifier(self.network, network)
        self.target.load_state_dict(self.network.state_dict())
        self.server_steps.zero_()

    def is_shared(self, key: str) -> bool:
        return key.startswith("backbone.")

    # --- server ---------------------------------------------------------------------------
    def server_loader(self, data: FederatedDataModule) -> ImageBatches | CombinedLoader:
        labeled = data.server_dataloader(("weak", "weak"))
        if not self.server_unlabeled:
            return labeled
        unlabeled = data.server_unlabeled_dataloader(("weak", "weak"))
        return CombinedLoader({"labeled": labeled, "unlabeled": unlabeled}, "max_size_cycle")

    def validate_data(self, data: FederatedDataModule) -> None:
        super().validate_data(data)
        if self.server_unlabeled and len(data.server_unlabeled_dataloader()) == 0:
            raise ValueError(
                "model.server_unlabeled needs unlabeled images at the server: "
                f"data.server_unlabeled_fraction={data.server_unlabeled_fraction} leaves it "
                f"{len(data.server_unlabeled)} (set it > 0 so that at least 2 are held)"
            )

    def server_objective(self) -> Objective:
        return FedConServer(
            self.network,
            self.target,
            ema_decay=self.ema_decay,
            start_step=int(self.server_steps),
            **self._server_kwargs(),
        )

    def server_step_done(
        self, objective: Objective, data: FederatedDataModule, device: torch.device | None = None
    ) -> None:
        assert isinstance(objective, FedConServer)
        self.server_steps.fill_(objective.steps_done)

    # --- client ---------------------------------------------------------------------------
    def client_side(self) -> FedConClientSide:
        return FedConClientSide(
            self._client_setup(),
            ema_decay=self.client_ema_decay,
            identity_projector=self.identity_projector,
        )


class FedConClientSide(ClientSide):
    """FedCon's client (paper 001 eqs 5-6): its own projector, kept between rounds, on the
    received backbone, trained on two weak views against an EMA of the backbone.

    Args:
        ema_decay: mu, the client target's EMA decay.
        identity_projector: a new projector starts as the identity map (see :class:`FedCon`).
        The others: see :class:`~fedlit.methods.client_side.ClientSide`.
    """

    def __init__(
        self, setup: ClientSetup, ema_decay: float, identity_projector: bool = False
    ) -> None:
        super().__init__(setup, ("weak", "weak"))
        self.ema_decay, self.identity_projector = ema_decay, identity_projector

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        network = self.model(payload)
        projector = fedcon_projector(network.backbone.feature_dim)  # drawn either way
        if state is not None:
            projector.load_state_dict(state["projector"])
        elif self.identity_projector:
            with torch.no_grad():
                for layer in projector.modules():
                    if isinstance(layer, nn.Linear):
                        nn.init.eye_(layer.weight)
                        if layer.bias is not None:
                            layer.bias.zero_()
        network.projector = projector
        return FedConClient(network, ema_decay=self.ema_decay, **self.optimizer_kwargs())

    def state(self, objective: Objective, previous: Any) -> Any:
        assert objective.network.projector is not None
        return {"projector": host_copy(objective.network.projector)}
