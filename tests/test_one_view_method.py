"""A method whose objective takes one view names it, and nothing else: entropy minimisation
(Grandvalet and Bengio 2005) on one weak view, written here as a user would write it (its
objective and a `FedAvgConsistency` subclass whose ``views`` is ``("weak",)``), trains through
the real CLI without overriding the client side."""

from __future__ import annotations

import copy
import csv
from pathlib import Path
from typing import Any

import torch
import yaml
from conftest import tiny_overrides
from torch import Tensor

from fedlit.cli import main
from fedlit.data.datasets import SPECS
from fedlit.data.loaders import ImageBatches
from fedlit.federation.fit import TrainerTemplate
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


class EntropyWithTheTermByHand(EntropyMinimisation):
    """The entropy plus FedProx's term written out, from the weights it starts with."""

    def __init__(self, network: Classifier, lr: float, mu: float) -> None:
        super().__init__(network, lr, loss=NO_PROXIMAL_TERM)
        self.mu = mu
        self.start = [p.detach().clone() for p in network.parameters()]

    def step(self, batch: tuple[Tensor, ...]) -> Step:
        entropy, _ = super().step(batch)
        params = list(self.network.parameters())
        term = sum(((p - a) ** 2).sum() for p, a in zip(params, self.start, strict=True))
        loss = entropy + 0.5 * self.mu * term
        return loss, ((1, {"loss": loss}),)


def test_a_one_view_objective_honours_loss_mu() -> None:
    """``loss.mu`` 0.1 on the docs' one-view objective trains with FedProx's term: the
    weights of the term written out by hand, bit for bit, and not those of mu 0 (the term
    was once silently dropped for an objective other than the two-view base)."""
    torch.manual_seed(0)
    network = Architecture(num_classes=10, in_channels=1, image_size=28).build()
    images = torch.randint(0, 256, (32, 1, 28, 28), dtype=torch.uint8)
    template = TrainerTemplate(accelerator="cpu", precision="32-true")
    fitted = {}
    for name, make in {
        "mu": lambda net: EntropyMinimisation(net, 0.5, loss=ConsistencyLoss(mu=0.1)),
        "by hand": lambda net: EntropyWithTheTermByHand(net, 0.5, mu=0.1),
        "no mu": lambda net: EntropyMinimisation(net, 0.5, loss=NO_PROXIMAL_TERM),
    }.items():
        objective = make(copy.deepcopy(network))
        torch.manual_seed(1)
        loader = ImageBatches(images, SPECS["fashion_mnist"], ("weak",), 8, shuffle=True)
        template.fit(objective, loader, epochs=3)
        fitted[name] = objective
    mu, by_hand, no_mu = (fitted[k].network.state_dict() for k in ("mu", "by hand", "no mu"))
    torch.testing.assert_close(mu, by_hand, rtol=0, atol=0)
    assert any(not torch.equal(mu[k], no_mu[k]) for k in mu)
    assert fitted["mu"].epoch_metrics()["loss"] > fitted["mu"].epoch_metrics()["entropy"]
