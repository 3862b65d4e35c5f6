"""Evaluation: the test-set evaluator and the finetune / linear protocols for encoders."""

from fedlit.evaluation.batchnorm import recalibrate, recalibrated, scored
from fedlit.evaluation.evaluator import Evaluator
from fedlit.evaluation.protocols import PROTOCOLS, LinearProbe, evaluate_encoder

__all__ = [
    "PROTOCOLS",
    "Evaluator",
    "LinearProbe",
    "evaluate_encoder",
    "recalibrate",
    "recalibrated",
    "scored",
]
