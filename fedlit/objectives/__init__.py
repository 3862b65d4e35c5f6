"""Training objectives: every server and client loss is a LightningModule."""

from fedlit.objectives.base import FitState, Objective
from fedlit.objectives.consistency import ConsistencyLoss, WeakStrongObjective
from fedlit.objectives.ema import copy_buffers, frozen_copy
from fedlit.objectives.fedcon import FedConClient, FedConServer
from fedlit.objectives.fedmatch import FedMatchClient, FedMatchLoss, FedMatchServer
from fedlit.objectives.fedprox import FedProx, proximal_term
from fedlit.objectives.fedseal import (
    FedSEALClient,
    FedSEALLoss,
    class_thresholds,
    complementary_loss,
    positive_negative_sets,
    self_ensemble,
)
from fedlit.objectives.fedsup import FedSupClient, feature_map_mse
from fedlit.objectives.fixmatch import FixMatch, FixMatchLoss, SelfTraining, fixmatch_loss
from fedlit.objectives.fl2 import FL2Client, FL2Loss, adaptive_thresholds, thresholded_loss
from fedlit.objectives.means import Hits, RunningMeans
from fedlit.objectives.mixing import mixup, mixup_cross_entropy
from fedlit.objectives.optimization import Optimization
from fedlit.objectives.sam import SamLosses, SharpnessAware, sharpness_aware_gradients
from fedlit.objectives.schedules import (
    WarmupCosine,
    feature_map_weight,
    gaussian_rampup,
    ramped_decay,
)
from fedlit.objectives.semifl import SemiFLClient, SemiFLLoss, confident_labels
from fedlit.objectives.ssl import BYOL, SimCLR, SimSiam
from fedlit.objectives.supervised import SupervisedCE
from fedlit.objectives.teacher_student import (
    TeacherStudentClient,
    TeacherStudentLoss,
    kl_to_uniform,
)
from fedlit.objectives.uda import UDA, UDALoss, uda_loss

__all__ = [
    "Hits",
    "RunningMeans",
    "UDALoss",
    "TeacherStudentLoss",
    "Optimization",
    "FixMatchLoss",
    "FL2Loss",
    "FL2Client",
    "SamLosses",
    "SharpnessAware",
    "adaptive_thresholds",
    "sharpness_aware_gradients",
    "thresholded_loss",
    "FedSEALLoss",
    "FedMatchLoss",
    "ConsistencyLoss",
    "BYOL",
    "FedConClient",
    "FedConServer",
    "FedMatchClient",
    "FedMatchServer",
    "FedSEALClient",
    "FedSupClient",
    "FixMatch",
    "FedProx",
    "FitState",
    "Objective",
    "SelfTraining",
    "SimCLR",
    "SimSiam",
    "SupervisedCE",
    "TeacherStudentClient",
    "UDA",
    "WarmupCosine",
    "WeakStrongObjective",
    "class_thresholds",
    "complementary_loss",
    "copy_buffers",
    "feature_map_mse",
    "feature_map_weight",
    "fixmatch_loss",
    "frozen_copy",
    "gaussian_rampup",
    "kl_to_uniform",
    "positive_negative_sets",
    "proximal_term",
    "ramped_decay",
    "self_ensemble",
    "uda_loss",
    "SemiFLClient",
    "SemiFLLoss",
    "confident_labels",
    "mixup",
    "mixup_cross_entropy",
]
