"""A method whose objective takes one view names it, and nothing else: entropy minimisation
(Grandvalet and Bengio 2005) on one weak view, written here as a user would write it (its
objective and a `FedAvgConsistency` subclass whose ``views`` is ``("weak",)``), trains through
the real CLI without overriding the client side."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch
import yaml
from conftest import tiny_overrides
from torch import Tensor

from fedlit.cli import main
from fedlit.methods import FedAvgConsistency
from fedlit.methods.base import DEFAULT_OPTIMIZATION
from fedlit.models import Architecture, Classifier
from fedlit.objectives import ConsistencyLoss, Objective, Optimization
from fedlit.objectives.base import Step


class EntropyMinimisation(Objective):
    """The mean entropy of the predictions on one weak view of each unlabeled image.

    Batches: (weak (B, C, H, W),)."""

    def __init__(self, network: Classifier, lr: float, loss: ConsistencyLoss, **kw: Any) -> None:
        super().__init__(network, lr, **kw)
        self.loss = loss

    def step(self, batch: tuple[Tensor, ...]) -> Step:
        (weak,) = batch  # one view: a (weak, strong) batch fails here
        log_p = self.network(weak).float().log_softmax(dim=1)
        entropy = -(log_p.exp() * log_p).sum(dim=1).mean()
        return entropy, ((len(weak), {"loss": entropy, "entropy": entropy}),)


NO_PROXIMAL_TERM = ConsistencyLoss()  # mu = 0


class FedAvgEntropy(FedAvgConsistency):
    """FedAvg whose clients minimise the entropy of their predictions on one weak view."""

    objective_class = EntropyMinimisation
    views = ("weak",)

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        loss: ConsistencyLoss = NO_PROXIMAL_TERM,
    ) -> None:
        super().__init__(network, optim, loss=loss)


def test_the_client_side_takes_the_methods_views() -> None:
    method = FedAvgEntropy(Architecture(num_classes=10, in_channels=1, image_size=28))
    assert method.client_side().views == ("weak",)


def test_a_one_view_method_trains_from_a_recipe(fmnist_root: Path, tmp_path: Path) -> None:
    recipe = tmp_path / "entropy.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "model": {"class_path": f"{__name__}.FedAvgEntropy"},
                "data": {"dataset": "fashion_mnist"},
            }
        )
    )
    run_dir = tmp_path / "run"
    main(
        [
            "fit",
            f"--config={recipe}",
            *tiny_overrides(fmnist_root),
            f"--trainer.default_root_dir={run_dir}",
        ]
    )
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(row["round"]) for row in rows] == [0, 1]  # the partition row, one round
    entropy = float(rows[-1]["client/entropy"])  # its objective ran on the clients
    assert 0 < entropy <= torch.log(torch.tensor(10.0)).item()
