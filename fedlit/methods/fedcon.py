"""FedCon (paper 001, section III): contrastive online/target nets, backbone-only federation."""

from __future__ import annotations

import copy
from typing import Any

import torch
from lightly.models.modules.heads import ProjectionHead
from torch import nn

from fedlit.aggregation import Mean
from fedlit.data.client import ClientData
from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.loaders import ImageBatches
from fedlit.methods.base import DEFAULT_OPTIMIZATION, FederatedMethod, Payload
from fedlit.objectives import FedConClient, FedConServer, Objective, Optimization


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

    Args:
        ema_decay: tau, the server target's upper EMA decay (0.999).
        client_ema_decay: mu, the client target's EMA decay (0.999).
        The others: see :class:`FederatedMethod`.
    """

    client_views = ("weak", "weak")

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        backbone: str = "small_cnn",
        norm: str | None = None,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        ema_decay: float = 0.999,
        client_ema_decay: float = 0.999,
    ) -> None:
        for key, value in (("ema_decay", ema_decay), ("client_ema_decay", client_ema_decay)):
            if not 0 <= value <= 1:
                raise ValueError(f"model.{key} must be in [0, 1], got {value}")
        super().__init__(num_classes, in_channels, backbone, norm, optim)
        self.ema_decay, self.client_ema_decay = ema_decay, client_ema_decay
        self.aggregator = Mean()  # b_theta^G = 1/B sum_k b_theta^k (paper 001 III-B)
        self.target = copy.deepcopy(self.network)
        self.server_steps: torch.Tensor
        self.register_buffer("server_steps", torch.tensor(0))  # the target's ramp-up count

    def initialize(self) -> None:
        super().initialize()
        self.target.load_state_dict(self.network.state_dict())
        self.server_steps.zero_()

    def is_shared(self, key: str) -> bool:
        return key.startswith("backbone.")

    # --- server ---------------------------------------------------------------------------
    def server_loader(self, data: FederatedDataModule) -> ImageBatches:
        return data.server_dataloader(("weak", "weak"))

    def server_objective(self) -> Objective:
        return FedConServer(
            self.network,
            self.target,
            ema_decay=self.ema_decay,
            start_step=int(self.server_steps),
            **self.server_kwargs(),
        )

    def server_step_done(self, objective: Objective, data: FederatedDataModule) -> None:
        assert isinstance(objective, FedConServer)
        self.server_steps.fill_(objective.steps_done)

    # --- client ---------------------------------------------------------------------------
    def client_objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        network = self.client_model(payload)
        projector = fedcon_projector(network.backbone.feature_dim)
        if state is not None:
            projector.load_state_dict(state["projector"])
        network.projector = projector
        return FedConClient(network, ema_decay=self.client_ema_decay, **self.client_kwargs())

    def client_state(self, objective: Objective, previous: Any) -> Any:
        assert objective.network.projector is not None
        projector = objective.network.projector.state_dict()
        return {"projector": {k: v.detach().cpu().clone() for k, v in projector.items()}}
