"""Training objectives: every server and client loss is a LightningModule."""

from fedlit.objectives.base import Objective
from fedlit.objectives.consistency import WeakStrongObjective, proximal_term
from fedlit.objectives.fedcon import FedConClient, FedConServer
from fedlit.objectives.fedsup import FedSupClient, feature_map_mse, feature_map_weight
from fedlit.objectives.fixmatch import FixMatch, fixmatch_loss
from fedlit.objectives.ssl import BYOL, SimCLR, SimSiam
from fedlit.objectives.supervised import SupervisedCE
from fedlit.objectives.uda import UDA, uda_loss

__all__ = [
    "BYOL",
    "FedConClient",
    "FedConServer",
    "FedSupClient",
    "FixMatch",
    "Objective",
    "SimCLR",
    "SimSiam",
    "SupervisedCE",
    "UDA",
    "WeakStrongObjective",
    "feature_map_mse",
    "feature_map_weight",
    "fixmatch_loss",
    "proximal_term",
    "uda_loss",
]
