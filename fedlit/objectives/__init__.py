"""Training objectives: every server and client loss is a LightningModule."""

from fedlit.objectives.base import Objective
from fedlit.objectives.fixmatch import FixMatch, fixmatch_loss, proximal_term
from fedlit.objectives.supervised import SupervisedCE

__all__ = ["FixMatch", "Objective", "SupervisedCE", "fixmatch_loss", "proximal_term"]
