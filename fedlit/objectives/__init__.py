"""Training objectives: every server and client loss is a LightningModule."""

from fedlit.objectives.base import Objective
from fedlit.objectives.fedcon import FedConClient, FedConServer
from fedlit.objectives.fedsup import FedSupClient, feature_map_mse, feature_map_weight
from fedlit.objectives.fixmatch import FixMatch, fixmatch_loss, proximal_term
from fedlit.objectives.ssl import BYOL, SimCLR, SimSiam
from fedlit.objectives.supervised import SupervisedCE

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
    "feature_map_mse",
    "feature_map_weight",
    "fixmatch_loss",
    "proximal_term",
]
