"""SSFL / FedRGD (paper 004, section 3): consistency loss, GroupNorm, averaging with the
server's model, grouping-based averaging, period T, warm-up + cosine learning rate."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fedlit.aggregation import Aggregated, GroupwiseWithServer, MeanWithServer
from fedlit.aggregation.payloads import MODEL
from fedlit.methods.base import (
    DEFAULT_OPTIMIZATION,
    FederatedMethod,
    Payload,
    StateDict,
)
from fedlit.methods.client_side import ClientUpdate, ObjectiveClientSide
from fedlit.methods.plan import RoundPlan, Step
from fedlit.models import Architecture
from fedlit.objectives import (
    FixMatch,
    FixMatchLoss,
    Objective,
    Optimization,
    SelfTraining,
)
from fedlit.search_space import CLIENT_SPACE

if TYPE_CHECKING:
    from fedlit.federation.config import FederationConfig


class PeerUploadWarning(UserWarning):
    """A group average from which a client can recover a peer's upload (FedRGD, groups of 2)."""


class FedRGD(FederatedMethod):
    """FedRGD, the SSFL benchmark's method.

    Each round the server trains its model on the labeled set (eq 2) and, in parallel from the
    same model w_avg (section 3.2), the sampled clients train on their unlabeled data with the
    consistency-regularisation loss (CRL, eq 6:
    pseudo-label from the weak view, CE on the strong view, threshold tau) or, as the paper's
    weak baseline, traditional self-training (eq 3: one weak view for both). The uploads are
    averaged together with the server's model:

    * ``num_groups: 1``: w_avg = (w_s + sum_k w_k) / (C + 1) (eqs 4-5); every client starts
      from w_avg, the model the server's step started from (not the server's trained w_s).
    * ``num_groups: S >= 2``: the round's clients are split into S groups (consecutive ids);
      w_avg,i = (w_s + sum_{k in G_i} w_k) / (|G_i| + 1) and w_avg = mean_i w_avg,i (eq 7).
      The server trains from w_avg; a client of G_i starts its next round from w_avg,i (a
      client not in the last round's groups starts from w_avg).
      A group of two gives its clients each other's upload: w_avg,i = (w_s + w_a + w_b) / 3,
      so a client that knows the server's model w_s and its own w_a has
      w_b = 3 w_avg,i - w_s - w_a. The first round that forms one warns
      (:class:`PeerUploadWarning`); groups of three or more (``clients_per_round >=
      3 * num_groups``) or ``num_groups: 1`` avoid it.

    Use ``network.norm: gn`` for the paper's GroupNorm and ``federation.local_steps`` for its
    communication period T. Eq 9's warm-up + cosine learning-rate schedule over the whole run
    is the base class's run-level schedule (``lr_schedule: cosine`` with ``warmup``,
    ``cosine_c: 0.4375``, ``cosine_eps``). The driver logs the weight diversity of the
    client updates (eq 8) as ``diag/weight_diversity``.

    Args:
        loss: tau, the confidence threshold (0.95), and FedProx's mu (0 in the paper)
            (:class:`~fedlit.objectives.FixMatchLoss`).
        self_training: False: CRL (eq 6); True: traditional self-training (eq 3).
        num_groups: S, at most ``federation.clients_per_round`` (a round whose faults leave
            fewer clients than S uses one group per client).
        The others: see :class:`FederatedMethod`.
    """

    search_space = CLIENT_SPACE

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        loss: FixMatchLoss = FixMatchLoss(),
        self_training: bool = False,
        num_groups: int = 2,
    ) -> None:
        aggregator = MeanWithServer() if num_groups == 1 else GroupwiseWithServer(num_groups)
        super().__init__(network, optim)
        self.loss, self.self_training = loss, self_training
        self.aggregator = aggregator
        self.group_models: list[StateDict] = []
        self.client_group: dict[int, int] = {}
        self.warned_pairs = False  # PeerUploadWarning is given once per run
        self.num_groups = num_groups

    def check_federation(self, config: FederationConfig) -> None:
        if self.num_groups > config.clients_per_round:
            raise ValueError(
                f"model.init_args.num_groups={self.num_groups} exceeds "
                f"federation.clients_per_round={config.clients_per_round}: each group "
                "needs a client of the round"
            )

    def initialize(self) -> None:
        super().initialize()
        self.group_models, self.client_group = [], {}

    def round_plan(self) -> RoundPlan:
        """The broadcast is w_avg, taken before the server's step (server and clients train
        in parallel from it, section 3.2); the server's trained w_s enters the aggregate."""
        return RoundPlan((Step.BROADCAST, Step.SERVER, Step.CLIENTS, Step.AGGREGATE))

    # --- clients ------------------------------------------------------------------------
    def client_payload(self, payload: Payload, client_id: int) -> Payload:
        group = self.client_group.get(client_id)
        return payload if group is None else {MODEL: self.group_models[group]}

    def client_side(self) -> ObjectiveClientSide:
        """CRL (FixMatch's loss on weak and strong views) or self-training (one weak view)."""
        views: tuple[str, ...]
        objective: type[Objective]
        if self.self_training:
            views, objective = ("weak",), SelfTraining
        else:
            views, objective = ("weak", "strong"), FixMatch
        return ObjectiveClientSide(self._client_setup(), views, objective, loss=self.loss)

    # --- aggregation --------------------------------------------------------------------
    def aggregate(self, updates: Sequence[ClientUpdate]) -> Aggregated:
        """w_avg with the server's trained w_s (eqs 4-5 or 7); each group's w_avg,i is what its
        clients start from next time."""
        result = super().aggregate(updates)
        self._warn_about_pairs(result.groups, self.round_idx)
        self.group_models = result.group_states
        self.client_group = {
            updates[k].client_id: i for i, group in enumerate(result.groups) for k in group
        }
        return result

    def _warn_about_pairs(self, groups: Sequence[Sequence[int]], round_idx: int) -> None:
        """Warn (once) when a group has two clients: each can recover the other's upload from
        the group average it receives and the server's model."""
        pairs = sum(len(g) == 2 for g in groups)
        if not pairs or self.warned_pairs:
            return
        self.warned_pairs = True
        warnings.warn(
            f"FedRGD, round {round_idx}: {pairs} of {len(groups)} groups hold two clients; a "
            "client of such a group that knows the server's model w_s and its own upload w_a "
            "recovers its peer's upload from the group average it receives, "
            "w_b = 3 w_avg,i - w_s - w_a. Use groups of three or more "
            "(federation.clients_per_round >= 3 * model.num_groups) or model.num_groups: 1",
            PeerUploadWarning,
            stacklevel=2,
        )

    # the group averages and who is in which group: not tensors of fixed shape, so the
    # module's extra state (in ``state_dict()`` as ``_extra_state``)
    def get_extra_state(self) -> dict[str, Any]:
        return {"group_models": self.group_models, "client_group": self.client_group}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.group_models = list(state["group_models"])
        self.client_group = dict(state["client_group"])
