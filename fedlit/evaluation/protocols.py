"""Evaluation protocols for a global encoder: finetuning and linear evaluation (paper 000 5.1.2).

Both attach a fresh linear classifier to a copy of the encoder and train it with CE on the
server's labeled set: *finetune* trains encoder and classifier end to end, *linear* trains the
classifier only, on the frozen encoder (its BatchNorm statistics frozen too). The global model
is left untouched.
"""

from __future__ import annotations

import copy

from lightly.models.utils import deactivate_requires_grad

from fedlit.data.datamodule import FederatedDataModule
from fedlit.evaluation.batchnorm import scored
from fedlit.evaluation.evaluator import Evaluator
from fedlit.models import Backbone, Classifier
from fedlit.objectives import SupervisedCE

PROTOCOLS = ("finetune", "linear")


class LinearProbe(SupervisedCE):
    """CE on a classifier whose backbone is frozen: parameters and BatchNorm statistics."""

    def before_fit(self) -> None:
        self.network.backbone.eval()


def evaluate_encoder(
    encoder: Backbone,
    protocol: str,
    data: FederatedDataModule,
    trainer: object,
    epochs: int,
    lr: float,
) -> float:
    """Test accuracy of ``encoder`` under ``protocol`` ("finetune" or "linear").

    ``trainer`` is a :class:`fedlit.federation.TrainerTemplate` (fit and test).
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown evaluation protocol {protocol!r}; choose from {PROTOCOLS}")
    backbone = copy.deepcopy(encoder)
    network = Classifier(backbone, data.num_classes)
    if protocol == "linear":
        deactivate_requires_grad(backbone)
        objective: SupervisedCE = LinearProbe(network, lr=lr, weight_decay=0.0)
    else:
        objective = SupervisedCE(network, lr=lr, weight_decay=5e-4)
    trainer.fit(objective, data.server_dataloader(("weak",)), epochs)  # type: ignore[attr-defined]
    if protocol == "finetune":  # scored like every model; the linear probe's BN stays frozen
        network = scored(network, data, trainer.device())  # type: ignore[assignment,attr-defined]
    evaluator = Evaluator(network, data.num_classes)
    trainer.test(evaluator, data.test_dataloader())  # type: ignore[attr-defined]
    return evaluator.metrics()["test/acc"]
