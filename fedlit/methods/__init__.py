"""Federated methods: each is a LightningModule holding the global network plus its rules."""

from fedlit.methods.base import ClientUpdate, FederatedMethod
from fedlit.methods.baselines import FedAvgSL, ServerSL
from fedlit.methods.fixmatch import FedAvgFixMatch

__all__ = ["ClientUpdate", "FedAvgFixMatch", "FedAvgSL", "FederatedMethod", "ServerSL"]
