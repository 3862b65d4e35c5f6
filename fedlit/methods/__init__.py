"""Federated methods: each is a LightningModule holding the global network plus its rules."""

from fedlit.methods.base import ClientUpdate, FederatedMethod
from fedlit.methods.baselines import FedAvgSL, ServerSL
from fedlit.methods.fedcon import FedCon
from fedlit.methods.fedsup import FedSup
from fedlit.methods.fixmatch import FedAvgFixMatch
from fedlit.methods.ssl import FedAvgBYOL, FedAvgSimCLR, FedAvgSimSiam, FedAvgSSL
from fedlit.methods.uda import FedAvgUDA

__all__ = [
    "ClientUpdate",
    "FedAvgBYOL",
    "FedAvgFixMatch",
    "FedAvgSL",
    "FedAvgSSL",
    "FedAvgSimCLR",
    "FedAvgSimSiam",
    "FedAvgUDA",
    "FedCon",
    "FedSup",
    "FederatedMethod",
    "ServerSL",
]
