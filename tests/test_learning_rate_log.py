"""The learning rate each optimiser step used, logged as ``lr`` (``server/lr``, ``client/lr``)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from fedlit.federation.fit import TrainerTemplate
from fedlit.models import build_classifier
from fedlit.objectives import SupervisedCE
from fedlit.objectives.schedules import WarmupCosine


@pytest.mark.parametrize(
    ("schedule", "progress", "factors"),
    [
        (None, (0.0, 1.0), [1.0, 1.0, 1.0, 1.0]),
        # a cosine to 0 over the run (c = 0.5), this fit the run's first half: p = k / 8
        (WarmupCosine(c=0.5, eps=0.0), (0.0, 0.5), [math.cos(math.pi * k / 16) for k in range(4)]),
    ],
)
def test_lr_is_the_mean_rate_of_the_steps(
    schedule: WarmupCosine | None, progress: tuple[float, float], factors: list[float]
) -> None:
    torch.manual_seed(0)
    images, labels = torch.randn(8, 1, 28, 28), torch.arange(8) % 10
    loader = DataLoader(TensorDataset(images, labels), batch_size=2)  # 4 steps
    network = build_classifier("small_cnn", 10, 1, None)
    objective = SupervisedCE(network, lr=0.1, schedule=schedule, progress=progress)
    TrainerTemplate(accelerator="cpu").fit(objective, loader, epochs=1)
    assert objective.epoch_metrics()["lr"] == pytest.approx(0.1 * sum(factors) / 4)
