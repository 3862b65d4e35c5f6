"""The federation driver: rounds, clients, the fits (fedlit's own loop for its objectives),
logging, checkpoints."""

from fedlit.federation.callbacks import Callback, RunView
from fedlit.federation.checkpoint import load_checkpoint, save_checkpoint
from fedlit.federation.client import ClientRunner
from fedlit.federation.config import FederationConfig, FederationResult
from fedlit.federation.driver import Federation
from fedlit.federation.executors import InProcess, RayPool, RaySettings
from fedlit.federation.faults import ROUND_FAILED, ClientFault, RoundFailed
from fedlit.federation.loggers import RoundCSVLogger
from fedlit.federation.pool import PoolSettings, ProcessPool
from fedlit.federation.store import ClientStateStore, load_client_states
from fedlit.federation.fit import TrainerTemplate

__all__ = [
    "Callback",
    "InProcess",
    "PoolSettings",
    "ProcessPool",
    "RayPool",
    "RaySettings",
    "ROUND_FAILED",
    "ClientFault",
    "ClientRunner",
    "ClientStateStore",
    "Federation",
    "FederationConfig",
    "FederationResult",
    "RoundCSVLogger",
    "RoundFailed",
    "RunView",
    "TrainerTemplate",
    "load_checkpoint",
    "load_client_states",
    "save_checkpoint",
]
