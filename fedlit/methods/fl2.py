"""(FL)^2 (Lee et al., "(FL)^2: Overcoming Few Labels in Federated Semi-Supervised Learning",
NeurIPS 2024, arXiv 2410.23227): client-specific adaptive thresholds, sharpness-aware
consistency regularisation and learning-status-aware aggregation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fedlit.aggregation import Aggregated, Mean, StatisticWeighted
from fedlit.aggregation.payloads import Payload, tensor_part
from fedlit.data.pool import ClientData
from fedlit.methods.base import DEFAULT_OPTIMIZATION
from fedlit.methods.client_side import ClientSetup, ClientUpdate, ObjectiveClientSide
from fedlit.methods.consistency import FedAvgConsistency
from fedlit.models import Architecture
from fedlit.objectives import FL2Client, FL2Loss, Objective, Optimization
from fedlit.search_space import CLIENT_SPACE, log_uniform

#: The upload's part that carries a client's mean confidence tau_k (a 0-dim tensor).
STATUS = "status"


def learning_status_weights(confidences: Sequence[float]) -> list[float]:
    """LSAA's weights before normalisation: 1 - tau_k for each client's mean confidence tau_k
    on its images under the received model (a client that is less sure learns more)."""
    return [1.0 - float(c) for c in confidences]


class FL2(FedAvgConsistency):
    """(FL)^2: the server trains CE on its labels and broadcasts; each client measures the
    received model on its un-augmented images: its mean confidence tau_k = 1/N sum_i max_c p_ic
    and its class thresholds tau_k(c) = tau_k p~_k(c) / max_c p~_k(c), p~_k its mean
    prediction (CAT); it minimises l_u = 1/B sum_b 1[max p(alpha(u_b)) >= tau_k(y^_b)]
    CE(y^_b, f(A(u_b))) and adds SACR's gradient: on the pseudo-labels at least ``loss.sam_tau``
    confident, eps = rho g / ||g|| from their cross-entropy's gradient g, and the gradient at
    w + eps of 1/B sum_b KL(p_w(A(u_b)) || p_{w+eps}(A(u_b))) over them; it uploads its weights
    and tau_k; the server averages the uploads with weights (1 - tau_k) / sum_j (1 - tau_j)
    (LSAA) and fine-tunes the aggregate with CE before it is scored.

    Args:
        loss: tau (the fixed threshold without CAT), sam_tau, rho, temperature and mu
            (:class:`~fedlit.objectives.fl2.FL2Loss`).
        adaptive_threshold: CAT; False: ``loss.tau`` for every class and client.
        sharpness_aware: SACR; False: the thresholded loss alone.
        status_aggregation: LSAA; False: the plain mean of the uploads.
        The others: see :class:`~fedlit.methods.FederatedMethod`.
    """

    #: SAM's radius over the range SAM's paper searches (0.01-0.5), and the clients' rate.
    search_space = {**CLIENT_SPACE, "model.init_args.loss.rho": log_uniform(0.01, 0.5)}

    objective_class = FL2Client

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        loss: FL2Loss = FL2Loss(),
        adaptive_threshold: bool = True,
        sharpness_aware: bool = True,
        status_aggregation: bool = True,
    ) -> None:
        super().__init__(network, optim, loss=loss)
        self.loss: FL2Loss = loss
        self.adaptive_threshold = adaptive_threshold
        self.use_sharpness_aware = sharpness_aware
        self.status_aggregation = status_aggregation
        self.aggregator = StatisticWeighted() if status_aggregation else Mean()

    def client_side(self) -> FL2ClientSide:
        return FL2ClientSide(
            self._client_setup(),
            self.loss,
            adaptive=self.adaptive_threshold,
            sharpness_aware=self.use_sharpness_aware,
        )

    def aggregate(self, updates: Sequence[ClientUpdate]) -> Aggregated:
        """LSAA where ``status_aggregation``: the uploads weighted by
        :func:`learning_status_weights` of their tau_k (one host read for the round); else the
        plain mean."""
        if not self.status_aggregation:
            return super().aggregate(updates)
        status = torch.stack([tensor_part(u.upload, STATUS).float().cpu() for u in updates])
        weights = learning_status_weights(status.tolist())
        result = StatisticWeighted()(
            [u.model for u in updates], [u.num_examples for u in updates], statistics=weights
        )
        self.network.load_state_dict(result.state, strict=False)
        return result


class FL2ClientSide(ObjectiveClientSide):
    """(FL)^2's client: :class:`~fedlit.objectives.fl2.FL2Client` on the received model and
    the client's un-augmented images; it uploads its weights and tau_k (``"status"``).

    Args:
        loss: the objective's settings.
        adaptive: CAT on; sharpness_aware: SACR on.
        The others: see :class:`~fedlit.methods.client_side.ClientSide`.
    """

    def __init__(
        self, setup: ClientSetup, loss: FL2Loss, adaptive: bool, sharpness_aware: bool
    ) -> None:
        super().__init__(
            setup,
            ("weak", "strong"),
            FL2Client,
            loss=loss,
            adaptive=adaptive,
            sharpness_aware=sharpness_aware,
        )

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        objective = super().objective(payload, client, state)
        assert isinstance(objective, FL2Client)
        objective.attach(client.plain_dataloader())
        return objective

    def upload(self, objective: Objective) -> Payload:
        assert isinstance(objective, FL2Client) and objective.confidence is not None
        return super().upload(objective) | {STATUS: objective.confidence.detach().clone()}
