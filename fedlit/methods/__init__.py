"""Federated methods: each is a LightningModule holding the global network plus its rules."""

from fedlit.methods.base import FederatedMethod
from fedlit.methods.baselines import FedAvgSL, ServerSL
from fedlit.methods.centralized import CentralizedConsistency, CentralizedFixMatch, CentralizedUDA
from fedlit.methods.client_side import ClientUpdate
from fedlit.methods.consistency import FedAvgConsistency
from fedlit.methods.fedcon import FedCon
from fedlit.methods.fedmatch import FedMatch
from fedlit.methods.fedrgd import FedRGD
from fedlit.methods.fedseal import FedSEAL
from fedlit.methods.fedsup import FedSup
from fedlit.methods.fixmatch import FedAvgFixMatch
from fedlit.methods.fl2 import FL2
from fedlit.methods.semifl import SemiFL
from fedlit.methods.ssl import FedAvgBYOL, FedAvgSimCLR, FedAvgSimSiam, FedAvgSSL
from fedlit.methods.teacher_student import FedSwitch, TeacherStudentEMA, TSClientEMA, TSServerEMA
from fedlit.methods.uda import FedAvgUDA

__all__ = [
    "CentralizedConsistency",
    "CentralizedFixMatch",
    "CentralizedUDA",
    "FL2",
    "ClientUpdate",
    "FedAvgBYOL",
    "FedAvgConsistency",
    "FedAvgFixMatch",
    "FedAvgSL",
    "FedAvgSSL",
    "FedAvgSimCLR",
    "FedAvgSimSiam",
    "FedAvgUDA",
    "FedCon",
    "FedMatch",
    "FedRGD",
    "FedSEAL",
    "FedSup",
    "FedSwitch",
    "FederatedMethod",
    "SemiFL",
    "ServerSL",
    "TSClientEMA",
    "TSServerEMA",
    "TeacherStudentEMA",
]
