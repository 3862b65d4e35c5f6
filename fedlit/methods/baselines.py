"""The bounds every semi-supervised method is compared with (paper 002 section 5.1)."""

from __future__ import annotations

from typing import Any

from fedlit.data.loaders import ImageBatches
from fedlit.data.pool import ClientData
from fedlit.methods.base import FederatedMethod, Payload
from fedlit.methods.client_side import ClientSide
from fedlit.methods.plan import SERVER_LAST, SERVER_ONLY, RoundPlan
from fedlit.objectives import Objective, SupervisedCE
from fedlit.search_space import CLIENT_SPACE


class ServerSL(FederatedMethod):
    """Server-SL, the lower bound: CE on weak views of the server's labeled set; no clients.

    Paper 002 section 5.1 ("Server-SL"); paper 000 "Centralized".
    """

    def round_plan(self) -> RoundPlan:
        return SERVER_ONLY


class FedAvgSL(FederatedMethod):
    """FedAvg-SL, the upper bound. ORACLE: clients train with CE on their TRUE labels.

    Not a semi-supervised method (client labels do not exist in the setting fedlit studies);
    it marks how far the unlabeled methods are from full supervision. Aggregation is FedAvg
    weighted by n_k, then the server trains on its labeled set (paper 002 section 5.1).
    """

    search_space = CLIENT_SPACE

    oracle = True

    def round_plan(self) -> RoundPlan:
        return SERVER_LAST

    def client_side(self) -> OracleClient:
        return OracleClient(self._client_setup())


class OracleClient(ClientSide):
    """FedAvg-SL's client: CE on weak views of its images with their TRUE labels."""

    def loader(self, client: ClientData) -> ImageBatches:
        return client.oracle_dataloader("weak")

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        return SupervisedCE(self.model(payload), **self.optimizer_kwargs())
