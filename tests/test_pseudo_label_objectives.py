"""The pseudo-label losses and rules of papers 002-004 on hand-computed cases and NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedlit.aggregation import weight_diversity
from fedlit.methods import FedSwitch
from fedlit.models import Architecture
from fedlit.objectives import (
    FedSEALLoss,
    FixMatchLoss,
    SelfTraining,
    TeacherStudentClient,
    TeacherStudentLoss,
    WarmupCosine,
    class_thresholds,
    complementary_loss,
    gaussian_rampup,
    kl_to_uniform,
    positive_negative_sets,
    self_ensemble,
)


def test_complementary_loss_is_minus_log_one_minus_p() -> None:
    # softmax([0, ln 3, 0]) = [1/5, 3/5, 1/5]
    logits = torch.tensor([[0.0, math.log(3.0), 0.0], [0.0, math.log(3.0), 0.0]])
    loss = complementary_loss(logits, torch.tensor([1, 0]))
    assert loss.tolist() == pytest.approx([-math.log(0.4), -math.log(0.8)])
    # against NumPy on random logits, including confident ones (stability)
    rng = np.random.default_rng(0)
    z = rng.normal(scale=8.0, size=(6, 5))
    y = rng.integers(0, 5, size=6)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    expected = -np.log1p(-p[np.arange(6), y])
    got = complementary_loss(torch.tensor(z), torch.tensor(y)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4)


def test_complementary_loss_gradient_pushes_the_class_down() -> None:
    logits = torch.zeros(1, 4, requires_grad=True)
    complementary_loss(logits, torch.tensor([2])).sum().backward()
    assert logits.grad[0, 2] > 0 and (logits.grad[0, [0, 1, 3]] < 0).all()


def test_kl_to_uniform_of_predicted_labels() -> None:
    assert float(kl_to_uniform(torch.tensor([0, 1, 0, 1]), 2)) == pytest.approx(0.0)
    assert float(kl_to_uniform(torch.tensor([3, 3, 3]), 4)) == pytest.approx(math.log(4))
    expected = 0.75 * math.log(0.75 * 2) + 0.25 * math.log(0.25 * 2)
    assert float(kl_to_uniform(torch.tensor([0, 0, 0, 1]), 2)) == pytest.approx(expected)
    # a class that never appears contributes 0 log 0 = 0
    expected = 2 * 0.5 * math.log(0.5 * 3)
    assert float(kl_to_uniform(torch.tensor([0, 2]), 3)) == pytest.approx(expected)


def test_class_thresholds_on_a_hand_made_validation_set() -> None:
    probs = torch.tensor(
        [
            [0.9, 0.1, 0.0],  # predicted 0, true 0
            [0.6, 0.4, 0.0],  # predicted 0, true 1
            [0.2, 0.7, 0.1],  # predicted 1, true 1
            [0.1, 0.1, 0.8],  # predicted 2, true 2
        ]
    )
    labels = torch.tensor([0, 1, 1, 2])
    # tau_0 = (0.9 + 0.6) / 1, tau_1 = 0.7 / 2, tau_2 = 0.8 / 1
    assert class_thresholds(probs, labels).tolist() == pytest.approx([1.5, 0.35, 0.8])
    with pytest.raises(ValueError, match=r"classes \[2\]"):
        class_thresholds(probs[:3], labels[:3])


def test_self_ensemble_after_three_rounds_is_the_mean_of_the_predictions() -> None:
    preds = torch.rand(3, 5, 4).softmax(-1)
    pbar = None
    for t in range(1, 4):
        pbar = self_ensemble(pbar, preds[t - 1], t)
    torch.testing.assert_close(pbar, preds.mean(0))
    with pytest.raises(ValueError):
        self_ensemble(None, preds[0], 2)


def test_positive_and_negative_sets() -> None:
    pbar = torch.tensor(
        [
            [0.90, 0.07, 0.03],  # y+ = 0 >= tau_0: positive
            [0.50, 0.48, 0.02],  # y+ = 0 < tau_0; class 2 <= theta: negative, y- = 2
            [0.40, 0.30, 0.30],  # neither
            [0.10, 0.60, 0.30],  # y+ = 1 >= tau_1: positive
        ]
    )
    tau = torch.tensor([0.8, 0.6, 0.9])
    pseudo, positive, complementary = positive_negative_sets(pbar, tau, theta=0.05)
    assert pseudo.tolist() == [0, 0, 0, 1]
    assert positive.tolist() == [True, False, False, True]
    assert complementary.tolist() == [-1, 2, -1, -1]
    # y- is drawn uniformly among the classes under theta
    many = torch.tensor([[0.96, 0.01, 0.01, 0.02]]).repeat(3000, 1)
    torch.manual_seed(0)
    _, _, comp = positive_negative_sets(many, torch.ones(4), theta=0.05)
    counts = torch.bincount(comp, minlength=4)
    assert counts[0] == 0 and (counts[1:] > 900).all()
    # without negative learning (5.2.3's ablation) the same rows give no negative set
    pseudo, positive, complementary = positive_negative_sets(pbar, tau, 0.05, False)
    assert positive.tolist() == [True, False, False, True]
    assert complementary.tolist() == [-1, -1, -1, -1]


@pytest.mark.parametrize(
    ("key", "kw"),
    [
        ("loss.fixed_tau", {"fixed_tau": 0.0}),
        ("loss.fixed_tau", {"fixed_tau": 1.5}),
        ("loss.fixed_tau", {"fixed_tau": float("nan")}),
        ("loss.negative_learning", {"negative_learning": "no"}),
        ("loss.ramp", {"ramp": 1.5}),
    ],
)
def test_fedseal_loss_validation_names_the_key(key: str, kw: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=key):
        FedSEALLoss(**kw)  # type: ignore[arg-type]


def test_gaussian_rampup() -> None:
    # fractions of the run: a ramp over the first 40% of it
    assert gaussian_rampup(0.0, 0.4) == pytest.approx(math.exp(-5))
    assert gaussian_rampup(0.2, 0.4) == pytest.approx(math.exp(-5 * 0.25))
    assert gaussian_rampup(0.4, 0.4) == 1.0 == gaussian_rampup(0.9, 0.4) == gaussian_rampup(0.1, 0)
    # the same fraction of a 5-round and a 50-round run gives the same weight
    assert gaussian_rampup(2 / 5, 0.8) == gaussian_rampup(20 / 50, 0.8)


def test_warmup_cosine_schedule() -> None:
    s = WarmupCosine(warmup=0.1, c=0.5, eps=1e-3)
    assert s(0.05) == pytest.approx(0.5)
    assert s(0.1) == pytest.approx(1.0)
    assert s(0.55) == pytest.approx(math.cos(math.pi * 0.5 * 0.5))
    assert s(1.0) == pytest.approx(1e-3)  # cos(pi / 2) = 0, floored at eps
    periodic = WarmupCosine(c=2.3, eps=1e-4)  # paper 004 Table A.1's c
    assert periodic(0.5) == pytest.approx(1e-4) and periodic(0.9) > 0.5


def test_weight_diversity_on_known_tensors() -> None:
    starts = [{"w": torch.zeros(2), "n": torch.tensor(3)}] * 2
    same = [{"w": torch.tensor([1.0, 1.0]), "n": torch.tensor(5)}] * 2
    assert weight_diversity(starts, same) == pytest.approx(0.5)  # 1 / C
    orthogonal = [{"w": torch.tensor([1.0, 0.0]), "n": torch.tensor(5)},
                  {"w": torch.tensor([0.0, 1.0]), "n": torch.tensor(5)}]  # fmt: skip
    assert weight_diversity(starts, orthogonal) == pytest.approx(1.0)
    rng = np.random.default_rng(1)
    s = [rng.normal(size=4) for _ in range(3)]
    f = [rng.normal(size=4) for _ in range(3)]
    d = [b - a for a, b in zip(s, f, strict=True)]
    expected = sum(np.sum(x**2) for x in d) / np.sum(np.sum(d, axis=0) ** 2)
    got = weight_diversity([{"w": torch.tensor(x)} for x in s], [{"w": torch.tensor(x)} for x in f])
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("kl_teacher", "kl_student", "beta", "send"),
    [
        (0.1, 0.5, 0.0, True),  # teacher closer to beta = 0
        (0.5, 0.1, 0.0, False),
        (0.5, 0.1, 0.6, True),  # clients expected imbalanced: the confident teacher is closer
        (float("nan"), 0.3, 0.0, True),  # nothing measured yet: round 1 sends the teacher
    ],
)
def test_fedswitch_switch_decision(
    kl_teacher: float, kl_student: float, beta: float, send: bool
) -> None:
    method = FedSwitch(Architecture(10, 1), beta=beta)
    values = torch.tensor([kl_teacher, kl_student], dtype=torch.float64)
    method.kl.copy_(values.nan_to_num())
    method.kl_measured.copy_(~values.isnan())  # NaN: not measured yet
    assert method.send_teacher() is send
    assert ("teacher" in method.broadcast()) is send
    # the switch's ablation: the teacher goes out whatever the measures say
    fixed = FedSwitch(Architecture(10, 1), beta=beta, switching=False)
    fixed.kl.copy_(method.kl)
    fixed.kl_measured.copy_(method.kl_measured)
    assert fixed.send_teacher() is True and "teacher" in fixed.broadcast()


class _Fixed(nn.Module):
    """Logits that do not depend on the input (one row per example)."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits[: len(x)]


def test_self_training_uses_one_weak_view() -> None:
    logits = torch.tensor([[4.0, 0.0], [0.1, 0.0]])  # confident, not confident (tau 0.9)
    objective = SelfTraining(_Fixed(logits), lr=0.1, loss=FixMatchLoss(tau=0.9))
    loss = objective.training_step((torch.zeros(2, 1),), 0)
    expected = -torch.log_softmax(logits, -1)[0, 0] / 2  # masked mean over the batch
    assert float(loss.detach()) == pytest.approx(float(expected))


def test_teacher_pseudo_labels_and_local_adaptation() -> None:
    student = nn.Linear(3, 2)
    teacher = nn.Linear(3, 2)
    with torch.no_grad():
        teacher.weight.zero_()
        teacher.bias.copy_(torch.tensor([5.0, 0.0]))  # the teacher says class 0, confidently
    x = torch.randn(4, 3)
    loss = TeacherStudentLoss(tau=0.9)
    fixed = TeacherStudentClient(student, 0.1, teacher=teacher, num_classes=2, loss=loss)
    loss = fixed.training_step((x, x), 0)
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(student(x), torch.zeros(4, dtype=torch.long))
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-5)
    assert fixed.epoch_metrics()["kl/teacher"] == pytest.approx(math.log(2))
    before = teacher.bias.detach().clone()
    fixed.after_step()
    assert torch.equal(teacher.bias, before)  # TS-Server EMA: the teacher stays
    adapting = TeacherStudentClient(student, 0.1, teacher, num_classes=2, teacher_ema=0.9)
    adapting.after_step()
    torch.testing.assert_close(teacher.bias, 0.9 * before + 0.1 * student.bias.detach())
