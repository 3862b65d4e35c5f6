"""Losses on hand-computed cases."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from fedlit.objectives import (
    UDA,
    FedMatchLoss,
    FedProx,
    FitState,
    FixMatch,
    FixMatchLoss,
    Hits,
    SemiFLLoss,
    SupervisedCE,
    UDALoss,
    fixmatch_loss,
    means,
    proximal_term,
    uda_loss,
)
from fedlit.objectives.means import HITS_KEPT


def test_fixmatch_loss_hand_computed() -> None:
    # Example 0: weak softmax ~ [0.982, 0.018] >= 0.95 -> pseudo-label 0, kept.
    # Example 1: weak softmax [0.5, 0.5] -> masked out.
    logits_weak = torch.tensor([[4.0, 0.0], [1.0, 1.0]])
    logits_strong = torch.tensor([[1.0, 2.0], [5.0, -5.0]])
    loss, mask = fixmatch_loss(logits_weak, logits_strong, tau=0.95)
    ce0 = -math.log(math.exp(1.0) / (math.exp(1.0) + math.exp(2.0)))
    assert mask.tolist() == [1.0, 0.0]
    assert loss.item() == pytest.approx(ce0 / 2, rel=1e-6)  # mean over the whole batch


def test_fixmatch_loss_no_gradient_through_weak_view() -> None:
    lw = torch.tensor([[5.0, 0.0]], requires_grad=True)
    ls = torch.tensor([[0.0, 0.0]], requires_grad=True)
    loss, _ = fixmatch_loss(lw, ls, tau=0.5)
    loss.backward()
    assert lw.grad is None
    assert ls.grad is not None and ls.grad.abs().sum() > 0


def test_fixmatch_loss_threshold_one_masks_all() -> None:
    loss, mask = fixmatch_loss(torch.tensor([[9.0, 0.0]]), torch.zeros(1, 2), tau=1.0)
    assert mask.sum() == 0 and loss.item() == 0.0


def test_proximal_term() -> None:
    net = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, 2.0]]))
    anchor = [torch.tensor([[0.0, 0.0]])]
    # (mu/2) * (1 + 4) with mu = 0.2 -> 0.5
    assert proximal_term(net, anchor, mu=0.2).item() == pytest.approx(0.5)


def test_fixmatch_objective_adds_prox_after_a_step() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    obj = FixMatch(net, lr=0.1, loss=FixMatchLoss(tau=0.0, mu=1.0))
    obj.fit_state = FitState(fedprox=FedProx(net, obj.proximal_mu()))  # as its fit makes it
    anchor = obj.fit_state.fedprox.anchor  # type: ignore[union-attr]
    batch = (torch.randn(8, 1, 2, 2), torch.randn(8, 1, 2, 2))
    opt = obj.configure_optimizers()
    loss0 = obj.training_step(batch, 0)  # at the anchor: prox = 0
    lw, ls = net(torch.cat(batch)).chunk(2)
    assert loss0.item() == pytest.approx(fixmatch_loss(lw, ls, 0.0)[0].item(), rel=1e-6)
    opt.zero_grad()
    loss0.backward()
    opt.step()
    lw, ls = net(torch.cat(batch)).chunk(2)
    expected = fixmatch_loss(lw, ls, 0.0)[0] + proximal_term(net, anchor, 1.0)
    assert obj.training_step(batch, 1).item() == pytest.approx(expected.item(), rel=1e-6)
    assert proximal_term(net, anchor, 1.0).item() > 0


def test_supervised_ce_and_metrics() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False))
    with torch.no_grad():
        net[1].weight.copy_(torch.eye(2))
    obj = SupervisedCE(net, lr=0.1)
    x = torch.tensor([[[[2.0, 0.0]]], [[[0.0, 2.0]]]])
    y = torch.tensor([0, 0])
    loss = obj.training_step((x, y), 0)
    ce = [-math.log(math.exp(2) / (math.exp(2) + 1)), -math.log(1 / (math.exp(2) + 1))]
    assert loss.item() == pytest.approx(sum(ce) / 2, rel=1e-6)
    assert obj.epoch_metrics()["acc"] == pytest.approx(0.5)


def test_running_means_are_float32_sums_call_after_call() -> None:
    """accumulate's means: each value times its weight in float32, added in call order in
    float32 (as a loop of adds would: not a pairwise or float64 sum), over reads too; a value
    changed in place after its call counts as it was."""
    obj = SupervisedCE(nn.Linear(1, 1), lr=0.1)
    calls = [(1.0, 1e8), (3.0, 1.0), (0.1, -3e8), (2.0, 0.7), (64.0, 1e-3)]
    expected = np.float32(0.0)
    for k, (weight, value) in enumerate(calls):
        x = torch.tensor(value, requires_grad=True) * 1.0  # a tensor of a graph, as a loss
        obj.accumulate(weight, loss=x, lr=0.5)
        with torch.no_grad():
            x.add_(100.0)  # after its call: not counted
        term = np.float32(value) * np.float32(weight)
        expected = term if k == 0 else np.float32(expected + term)
        if k == 2:
            obj.epoch_metrics()  # a read in between changes nothing
    total = sum(w for w, _ in calls)
    metrics = obj.epoch_metrics()
    assert metrics["loss"] == float(expected) / total
    assert metrics["loss"] != sum(np.float64(v) * w for w, v in calls) / total
    assert metrics["lr"] == 0.5


@pytest.mark.parametrize("kept", [HITS_KEPT, 100], ids=["kept", "reduced-on-the-way"])
def test_hits_kept_in_an_eager_fit_are_their_fractions_bit_for_bit(
    kept: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's accuracy logged as Hits: an eager fit keeps the logits (at most HITS_KEPT
    elements, then makes them fractions on their device) and makes them fractions many steps
    at once when read; each step's value and the means are bit for bit those of the fractions
    added call by call, as a compiled fit adds them, for any batch sizes, bf16 logits and ties."""
    monkeypatch.setattr(means, "HITS_KEPT", kept)
    torch.manual_seed(0)
    eager, compiled, reference = (SupervisedCE(nn.Linear(1, 1), lr=0.1) for _ in range(3))
    compiled.fit_state = FitState(compiled_step=lambda objective, batch: (torch.zeros(()), ()))
    f32, bf16 = torch.float32, torch.bfloat16  # bf16 of the f32 run's shape: a run of its own
    for b, dtype in [(16, f32)] * 5 + [(16, bf16), (7, f32), (3, f32)]:
        logits = torch.randn(b, 10).to(dtype)
        logits[: b // 2] = logits[: b // 2].round()  # ties: the first largest is the prediction
        labels = torch.randint(0, 10, (b,))
        for objective in (eager, compiled):
            objective.accumulate(float(b), loss=logits.float().sum(), acc=Hits(logits, labels))
        fraction = (logits.argmax(-1) == labels).float().mean()
        reference.accumulate(float(b), loss=logits.float().sum(), acc=fraction)
        assert eager._means._hits_kept <= means.HITS_KEPT
    assert eager.epoch_metrics() == compiled.epoch_metrics() == reference.epoch_metrics()


#: (an objective's or its loss's bad settings, the key the refusal names): every loss's here
BAD_SETTINGS: list[tuple[Callable[[], object], str]] = [
    (lambda: FixMatchLoss(tau=1.5), "tau"),
    (lambda: FixMatchLoss(mu=-0.1), "mu"),
    (lambda: UDALoss(temperature=0.0), "temperature"),
    (lambda: SupervisedCE(nn.Linear(1, 1), lr=0.1, optimizer="lbfgs"), "optimizer"),
    (lambda: SemiFLLoss(alpha=0.0), "loss.alpha"),
    (lambda: SemiFLLoss(mix_weight=-1.0), "loss.mix_weight"),
    (lambda: SemiFLLoss(tau=1.5), "tau"),
    (lambda: FedMatchLoss(tau=1.5), "loss.tau"),
    (lambda: FedMatchLoss(lambda_l2=-1.0), "loss.lambda_l2"),
]


@pytest.mark.parametrize(("build", "key"), BAD_SETTINGS)
def test_objective_rejects_bad_settings(build: Callable[[], object], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        build()


def test_uda_loss_hand_computed() -> None:
    # weak logits [ln 9, 0]: p = [0.9, 0.1] >= 0.8 -> kept; sharpened with T = 0.5:
    # q = softmax([2 ln 9, 0]) = [81/82, 1/82]. Strong logits [0, 0]: p = [0.5, 0.5].
    logits_weak = torch.tensor([[math.log(9.0), 0.0], [0.0, 0.0]])  # 2nd: p = 0.5 < 0.8, masked
    logits_strong = torch.zeros(2, 2)
    loss, mask = uda_loss(logits_weak, logits_strong, temperature=0.5, threshold=0.8)
    q = [81 / 82, 1 / 82]
    kl = sum(qc * (math.log(qc) - math.log(0.5)) for qc in q)
    assert mask.tolist() == [1.0, 0.0]
    assert loss.item() == pytest.approx(kl / 2, rel=1e-5)


def test_uda_objective_with_prox_matches_its_parts() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    obj = UDA(net, lr=0.1, loss=UDALoss(temperature=0.4, threshold=0.0, mu=0.5))
    obj.fit_state = FitState(fedprox=FedProx(net, obj.proximal_mu()))
    anchor = obj.fit_state.fedprox.anchor  # type: ignore[union-attr]
    batch = (torch.randn(6, 1, 2, 2), torch.randn(6, 1, 2, 2))
    with torch.no_grad():
        net[1].weight.add_(0.1)  # move away from the anchor
    lw, ls = net(torch.cat(batch)).chunk(2)
    expected = uda_loss(lw, ls, 0.4, 0.0)[0] + proximal_term(net, anchor, 0.5)
    assert obj.training_step(batch, 0).item() == pytest.approx(expected.item(), rel=1e-6)
