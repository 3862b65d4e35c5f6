"""The federation driver: rounds, clients, Trainers, logging, checkpoints."""

from fedlit.federation.checkpoint import load_checkpoint, save_checkpoint
from fedlit.federation.client import ClientRunner
from fedlit.federation.driver import Federation, FederationConfig, FederationResult
from fedlit.federation.faults import ROUND_FAILED, ClientFault, RoundFailed
from fedlit.federation.loggers import RoundCSVLogger
from fedlit.federation.store import ClientStateStore
from fedlit.federation.trainers import TrainerTemplate

__all__ = [
    "ROUND_FAILED",
    "ClientFault",
    "ClientRunner",
    "ClientStateStore",
    "Federation",
    "FederationConfig",
    "FederationResult",
    "RoundCSVLogger",
    "RoundFailed",
    "TrainerTemplate",
    "load_checkpoint",
    "save_checkpoint",
]
