"""Representation-learning losses on tiny tensors, against NumPy or hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from lightly.models.utils import update_momentum
from torch import nn

from fedlit.federation import TrainerTemplate
from fedlit.models import build_classifier, ssl_heads
from fedlit.objectives import (
    BYOL,
    FedSupClient,
    SimCLR,
    SimSiam,
    feature_map_mse,
    feature_map_weight,
)
from fedlit.objectives.fedcon import prob_consistency, projection_mse
from fedlit.objectives.schedules import ramped_decay


class Identity2(nn.Module):
    """A 'network' whose backbone and heads are identities: the loss sees the inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Flatten()
        self.projector = nn.Identity()
        self.predictor = nn.Identity()
        self.w = nn.Parameter(torch.zeros(1))  # something to optimise

    def projection(self, features: torch.Tensor) -> torch.Tensor:
        return self.projector(features)

    def prediction(self, z: torch.Tensor) -> torch.Tensor:
        return self.predictor(z)


def nt_xent_numpy(z1: np.ndarray, z2: np.ndarray, tau: float) -> float:
    """NT-Xent (paper 000 eq 3.3) symmetrised over all 2B anchors, as a double loop."""
    z = np.concatenate([z1, z2])
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    n, b = len(z), len(z1)
    total = 0.0
    for i in range(n):
        pos = (i + b) % n
        sims = np.array([z[i] @ z[j] / tau for j in range(n) if j != i])
        total += -(z[i] @ z[pos] / tau) + math.log(np.exp(sims).sum())
    return total / n


def test_simclr_matches_numpy_nt_xent() -> None:
    g = torch.Generator().manual_seed(0)
    v1, v2 = torch.randn(4, 1, 1, 3, generator=g), torch.randn(4, 1, 1, 3, generator=g)
    loss = SimCLR(Identity2(), lr=0.1, temperature=0.5).training_step((v1, v2), 0)
    ref = nt_xent_numpy(v1.flatten(1).numpy(), v2.flatten(1).numpy(), 0.5)
    assert loss.item() == pytest.approx(ref, rel=1e-5)


def neg_cos(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float(-(a * b).sum(1).mean())


def test_simsiam_loss_and_stop_gradient() -> None:
    torch.manual_seed(0)
    v1, v2 = torch.randn(5, 1, 1, 4), torch.randn(5, 1, 1, 4)
    loss = SimSiam(Identity2(), lr=0.1).training_step((v1, v2), 0)
    a, b = v1.flatten(1).numpy(), v2.flatten(1).numpy()
    assert loss.item() == pytest.approx(0.5 * neg_cos(a, b) + 0.5 * neg_cos(b, a), rel=1e-5)

    # stop-gradient: v1's gradient comes from D(p_1, sg(z_2)) alone, not from D(p_2, sg(z_1))
    x1 = v1.clone().requires_grad_()
    SimSiam(Identity2(), lr=0.1).training_step((x1, v2), 0).backward()
    r1 = v1.clone().requires_grad_()
    cos = nn.functional.cosine_similarity(r1.flatten(1), v2.flatten(1))
    (-0.5 * cos.mean()).backward()
    torch.testing.assert_close(x1.grad, r1.grad)


def test_byol_target_lives_only_during_local_training() -> None:
    torch.manual_seed(0)
    network = build_classifier("small_cnn", 10, 1)
    network.projector, network.predictor = ssl_heads("byol", 128, 16)
    objective = BYOL(network, lr=0.05)
    before = {k: v.clone() for k, v in network.backbone.state_dict().items()}
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(8, 1, 28, 28), torch.randn(8, 1, 28, 28)),
        batch_size=4,
    )
    seen: list[float] = []
    original = objective.after_step

    def record(*args: object) -> None:
        assert objective.target is not None
        seen.append(float(objective.target.backbone.stages[0][0].weight.sum()))
        original(*args)

    objective.after_step = record  # type: ignore[method-assign]
    TrainerTemplate(accelerator="cpu").fit(objective, loader, epochs=1)
    assert objective.target is None  # discarded after local training
    assert len(seen) == 2
    assert seen[0] != seen[1]  # the target moved by EMA after the first step
    changed = any(not torch.equal(before[k], v) for k, v in network.backbone.state_dict().items())
    assert changed


def test_update_momentum_is_an_ema() -> None:
    online, target = nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        online.weight.fill_(1.0)
        target.weight.fill_(0.0)
    update_momentum(online, target, 0.9)  # xi <- 0.9 xi + 0.1 theta
    assert target.weight.item() == pytest.approx(0.1)


def test_fedcon_losses_hand_computed() -> None:
    c_online = torch.tensor([[0.0, 0.0]])
    c_target = torch.tensor([[math.log(3.0), 0.0]])  # softmax -> [0.75, 0.25]
    # ||[0.5, 0.5] - [0.75, 0.25]||^2 = 0.125
    assert prob_consistency(c_online, c_target).item() == pytest.approx(0.125)
    z, t = torch.tensor([[1.0, 2.0], [0.0, 0.0]]), torch.tensor([[0.0, 0.0], [3.0, 4.0]])
    assert projection_mse(z, t).item() == pytest.approx((5.0 + 25.0) / 2)
    assert ramped_decay(0, 0.999) == 0.0
    assert ramped_decay(9, 0.999) == pytest.approx(0.9)
    assert ramped_decay(10_000, 0.999) == 0.999


def test_feature_map_weight_follows_lambda_power() -> None:
    assert feature_map_weight(1e-4, 0, 100) == 1.0
    assert feature_map_weight(1e-4, 50, 100) == pytest.approx(1e-2)
    assert feature_map_weight(1e-4, 100, 100) == pytest.approx(1e-4)


def test_feature_map_mse_averages_stages() -> None:
    online = [torch.zeros(1, 2), torch.zeros(1, 4)]
    target = [torch.ones(1, 2), torch.full((1, 4), 3.0)]
    assert feature_map_mse(online, target).item() == pytest.approx((1.0 + 9.0) / 2)


def test_fedsup_loss_is_consistency_plus_weighted_mse() -> None:
    torch.manual_seed(0)

    def net() -> nn.Module:
        n = build_classifier("small_cnn", 10, 1, norm="none")
        n.projector, n.predictor = ssl_heads("byol", 128, 8)
        return n

    online, target = net(), net()
    objective = FedSupClient(online, target, lr=0.1, mse_weight=0.25)
    objective.eval()  # deterministic BN-free forward
    aug, raw = torch.randn(3, 1, 28, 28), torch.randn(3, 1, 28, 28)
    loss = objective.training_step((aug, raw), 0)
    m = objective.epoch_metrics()
    assert loss.item() == pytest.approx(m["consistency"] + 0.25 * m["feature_mse"], rel=1e-5)
    assert m["feature_mse"] > 0
    assert all(not p.requires_grad for p in target.parameters())
