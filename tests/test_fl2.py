"""(FL)^2's mechanisms on tiny inputs (the thresholds, the mask, SAM's perturbation and step,
the status-weighted aggregation), and its runs: exact resume, pool = local."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import load_script, stop_in_round
from ray_runs import differences, federation
from torch import Tensor, nn

from fedlit.aggregation import Mean, StatisticWeighted, statistic_weighted_average
from fedlit.federation import PoolSettings, RaySettings
from fedlit.federation.fit import loop
from fedlit.methods import FL2, ClientUpdate
from fedlit.methods.fl2 import STATUS, learning_status_weights
from fedlit.models import Architecture
from fedlit.objectives import (
    FL2Client,
    FL2Loss,
    Objective,
    SharpnessAware,
    adaptive_thresholds,
    sharpness_aware_gradients,
    thresholded_loss,
)
from fedlit.objectives.base import Step
from fedlit.objectives.fedseal import predict_probabilities
from fedlit.objectives.sam import SamLosses


# --- CAT ------------------------------------------------------------------------------------
def test_adaptive_thresholds_follow_the_clients_confidence_round_by_round() -> None:
    """tau_k = mean max p, tau_k(c) = tau_k p~(c) / max p~, measured anew from each round's
    received model: a known history of a client's predictions gives known thresholds."""
    round1 = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1]])
    thresholds, tau = adaptive_thresholds(round1)
    assert tau.item() == pytest.approx(0.65)  # (0.6 + 0.7) / 2
    # p~ = (0.4, 0.5, 0.1): class c's threshold 0.65 * p~(c) / 0.5
    torch.testing.assert_close(thresholds, torch.tensor([0.52, 0.65, 0.13]))
    round2 = torch.tensor([[0.9, 0.05, 0.05], [0.1, 0.85, 0.05]])  # a surer model later
    thresholds, tau = adaptive_thresholds(round2)
    assert tau.item() == pytest.approx(0.875)
    torch.testing.assert_close(thresholds, torch.tensor([0.875, 0.875 * 0.45 / 0.5, 0.0875]))
    with pytest.raises(ValueError, match="probs must be"):
        adaptive_thresholds(torch.zeros(0, 3))


def _client(adaptive: bool = True, sam: bool = True) -> tuple[FL2Client, Tensor]:
    torch.manual_seed(0)
    network = Architecture(10, 1, image_size=8).build()
    images = torch.randn(6, 1, 8, 8)
    objective = FL2Client(network, 0.1, FL2Loss(tau=0.9), adaptive=adaptive, sharpness_aware=sam)
    objective.attach([(images[:4],), (images[4:],)])
    return objective, images


@pytest.mark.parametrize("adaptive", [True, False])
def test_a_client_measures_its_thresholds_from_the_received_model(adaptive: bool) -> None:
    objective, images = _client(adaptive)
    probs, _ = predict_probabilities(objective.network, [(images,)])
    want, tau = adaptive_thresholds(probs)
    objective.before_fit()
    assert objective.confidence is not None
    torch.testing.assert_close(objective.confidence, tau)  # uploaded whether CAT is on or off
    if adaptive:
        torch.testing.assert_close(objective.thresholds, want)
    else:
        assert torch.equal(objective.thresholds, torch.full((10,), 0.9))


def test_the_mask_takes_each_pseudo_labels_class_threshold() -> None:
    logits_weak = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.3, 0.3, 0.4]]))
    logits_strong = torch.zeros(3, 3)
    thresholds = torch.tensor([0.8, 0.5, 0.3])  # 0.7 < 0.8; 0.6 >= 0.5; 0.4 >= 0.3
    loss, mask = thresholded_loss(logits_weak, logits_strong, thresholds)
    assert mask.tolist() == [0.0, 1.0, 1.0]
    assert loss.item() == pytest.approx(2 * torch.log(torch.tensor(3.0)).item() / 3)
    # one threshold for every class is FixMatch's mask
    _, fixed = thresholded_loss(logits_weak, logits_strong, torch.full((3,), 0.65))
    assert fixed.tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("field", "value"),
    [("rho", 0.0), ("rho", float("nan")), ("sam_tau", 1.5), ("temperature", 0.0), ("tau", -0.1)],
)
def test_fl2_loss_refuses_a_bad_setting_naming_it(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"^{field} must be"):
        FL2Loss(**{field: value})


# --- SAM ------------------------------------------------------------------------------------
def test_sams_perturbation_is_rho_g_over_the_norm_of_g() -> None:
    g = [torch.tensor([3.0, 0.0]), None, torch.tensor([[4.0]])]
    eps = SharpnessAware(rho=0.5).perturbation(g)
    assert eps[1] is None
    torch.testing.assert_close(eps[0], torch.tensor([0.3, 0.0]))  # 0.5 * 3 / 5
    torch.testing.assert_close(eps[2], torch.tensor([[0.4]]))
    with pytest.raises(ValueError, match="rho must be"):
        SharpnessAware(rho=0.0)


def test_the_sharpness_aware_gradient_is_taken_at_w_plus_eps_and_w_restored() -> None:
    """On L(w) = sum c w^2 / 2 (gradient c w): SAM's update gradient is c (w + eps) with
    eps = rho c w / ||c w||; with ``keep``, the gradient at w is added."""
    c = torch.tensor([1.0, 2.0, 3.0])
    w = nn.Parameter(torch.tensor([1.0, -1.0, 0.5]))
    before = w.detach().clone()

    def loss() -> Tensor:
        return (c * w * w).sum() / 2

    sam = SharpnessAware(rho=0.1)
    g = c * before
    eps = 0.1 * g / g.norm()
    for keep in (False, True):
        at_w = loss()
        (grad,) = sharpness_aware_gradients(sam, [w], SamLosses(at_w, (), at_w, loss, keep))
        want = c * (before + eps) + (g if keep else 0)
        assert grad is not None
        torch.testing.assert_close(grad, want)
        assert torch.equal(w.detach(), before)  # copied back exactly


class Quadratic(Objective):
    """min sum c w^2 / 2 of one parameter vector, batches ignored; SAM where ``rho``."""

    def __init__(self, rho: float | None) -> None:
        super().__init__(nn.Linear(1, 1), lr=0.1, momentum=0.0)  # type: ignore[arg-type]
        self.w = nn.Parameter(torch.tensor([1.0, -1.0, 0.5]))
        self.network.requires_grad_(False)
        self.c = torch.tensor([1.0, 2.0, 3.0])
        self.rho = rho

    def step(self, batch: Any) -> Step:
        loss = (self.c * self.w * self.w).sum() / 2
        return loss, ((1, {"loss": loss}),)

    def sharpness_aware(self) -> SharpnessAware | None:
        return None if self.rho is None else SharpnessAware(self.rho)


class Batches:
    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[tuple[Tensor]]:
        yield (torch.zeros(1),)


def _never(*args: Any) -> Any:
    raise AssertionError("a SAM objective's step ran compiled")


@pytest.mark.parametrize("compiled", [False, True])
def test_the_fit_loop_takes_sams_step_for_any_objective(compiled: bool) -> None:
    """One SGD step of the fit: w - lr * grad L(w + eps); a compiled fit's SAM steps run eager
    (its compiled step is never called); without SAM, the plain step w - lr * grad L(w)."""
    settings = loop.LoopSettings(torch.device("cpu"))
    fields = {"compiled_step": _never, "compiled_mode": "default", "slots": {}} if compiled else {}
    w, c = torch.tensor([1.0, -1.0, 0.5]), torch.tensor([1.0, 2.0, 3.0])
    eps = 0.05 * c * w / (c * w).norm()
    sam = Quadratic(rho=0.05)
    loop.fit(sam, Batches(), 1, None, settings, fields, one_call=True)
    torch.testing.assert_close(sam.w.detach(), w - 0.1 * c * (w + eps))
    assert sam.epoch_metrics()["loss"] == pytest.approx(((c * w * w).sum() / 2).item())
    plain = Quadratic(rho=None)
    loop.fit(plain, Batches(), 1, None, settings, {})
    torch.testing.assert_close(plain.w.detach(), w - 0.1 * c * w)


def test_sams_step_in_fp16_scales_and_unscales_its_gradients() -> None:
    """fp16's gradient scaler: the losses scaled, eps unchanged, the gradients unscaled before
    the step (the quadratic's elementwise ops stay fp32 under autocast: the fp32 step)."""
    fp32, fp16 = Quadratic(rho=0.05), Quadratic(rho=0.05)
    loop.fit(fp32, Batches(), 1, None, loop.LoopSettings(torch.device("cpu")), {})
    loop.fit(fp16, Batches(), 1, None, loop.LoopSettings(torch.device("cpu"), "16-mixed"), {})
    torch.testing.assert_close(fp16.w.detach(), fp32.w.detach(), rtol=0, atol=0)


def test_sacr_adds_the_perturbed_kl_gradient_of_the_confident_images_alone() -> None:
    """FL2Client's SAM losses: the kept loss is the thresholded loss at w; the ascent loss
    counts only the pseudo-labels at least sam_tau confident; with none that confident, the
    KL term is 0 and the update is the thresholded loss's gradient."""
    objective, images = _client()
    objective.before_fit()
    weak = strong = images[:4]
    losses = objective.sam_losses((weak, strong))
    loss, _ = objective.step((weak, strong))
    torch.testing.assert_close(losses.loss, loss)
    confident = objective.network(weak).softmax(-1).max(-1).values >= 0.95
    assert not confident.any()  # an untrained network: no pseudo-label 0.95 confident
    assert losses.ascent.item() == 0.0 and losses.perturbed().item() == 0.0
    objective.loss = replace(objective.loss, sam_tau=0.0)  # every image regularised
    losses = objective.sam_losses((weak, strong))
    assert losses.ascent.item() > 0 and losses.keep
    assert objective.sharpness_aware() == SharpnessAware(0.1)
    assert _client(sam=False)[0].sharpness_aware() is None


# --- LSAA -----------------------------------------------------------------------------------
def test_status_weighted_average_on_known_statistics() -> None:
    states = [
        {"w": torch.tensor([1.0, 0.0]), "n": torch.tensor(2)},
        {"w": torch.tensor([0.0, 4.0]), "n": torch.tensor(4)},
    ]
    out = statistic_weighted_average(states, [0.75, 0.25])
    torch.testing.assert_close(out["w"], torch.tensor([0.75, 1.0]))
    assert out["n"].item() == 2  # 0.75 * 2 + 0.25 * 4 = 2.5, rounded half to even
    uniform = statistic_weighted_average(states, [0, 0])["w"]  # no weight at all: the mean
    torch.testing.assert_close(uniform, torch.tensor([0.5, 2.0]))
    with pytest.raises(ValueError, match="finite and >= 0"):
        statistic_weighted_average(states, [1.0, -0.1])
    with pytest.raises(ValueError, match="2 statistics for 1 states"):
        statistic_weighted_average(states[:1], [1.0, 1.0])
    with pytest.raises(ValueError, match="statistics="):
        StatisticWeighted()(states, [1, 1])
    assert learning_status_weights([0.9, 0.6]) == pytest.approx([0.1, 0.4])


def test_fl2_averages_the_uploads_by_one_minus_their_confidence() -> None:
    method = FL2(Architecture(10, 1, image_size=8))
    base = method.network.state_dict()
    uploads = [{k: torch.full_like(v, x) for k, v in base.items()} for x in (1.0, 5.0)]
    updates = [
        ClientUpdate(i, {"model": up, STATUS: torch.tensor(tau)}, num_examples=n)
        for i, (up, tau, n) in enumerate(zip(uploads, (0.8, 0.2), (100, 1), strict=True))
    ]
    result = method.aggregate(updates)  # weights 0.2 / 1.0 and 0.8 / 1.0, whatever n_k
    key = next(k for k, v in base.items() if v.is_floating_point())
    torch.testing.assert_close(result.state[key], torch.full_like(base[key], 0.2 + 0.8 * 5))
    plain = FL2(Architecture(10, 1, image_size=8), status_aggregation=False)
    assert isinstance(plain.aggregator, Mean)
    mean = plain.aggregate(updates).state[key]
    torch.testing.assert_close(mean, torch.full_like(base[key], 3.0))


# --- runs -----------------------------------------------------------------------------------
@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow  # about 15 s: three 2-round federations of 3 clients of 64 images
def test_fl2_on_a_pool_gives_the_in_process_run(
    fmnist_root: Path, tmp_path: Path, one_thread: None
) -> None:
    local = federation(str(fmnist_root), tmp_path / "local", FL2, "local", RaySettings())
    local.run()
    pool = federation(str(fmnist_root), tmp_path / "pool", FL2, "local", RaySettings())
    pool.config = replace(pool.config, executor="pool", pool=PoolSettings(workers=2))
    pool.run()
    assert differences(local, pool) == []
    assert all(h["fault/clients"] == 0 for h in pool.history)
    assert 0 < local.history[-1]["client/confidence"] < 1


@pytest.mark.slow  # about 12 s: four rounds in all
def test_fl2_resume_is_exact(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = federation(str(fmnist_root), tmp_path / "full", FL2, "local", RaySettings())
    full.run()
    run_dir = tmp_path / "cut"
    undo = stop_in_round(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        federation(str(fmnist_root), run_dir, FL2, "local", RaySettings()).run()
    undo()
    resumed = federation(str(fmnist_root), run_dir, FL2, "local", RaySettings())
    resumed.config = replace(resumed.config, resume=str(run_dir / "checkpoints/last.ckpt"))
    resumed.run()
    assert resumed.start_round == 2  # round 1 came from the checkpoint
    assert differences(full, resumed) == []


def test_sacrs_step_never_waits_for_the_device() -> None:
    """SACR's two gradients and SAM's perturbation read nothing back to the host
    (benchmarks/step_profile.py's counter, as tests/test_step_syncs.py uses it)."""
    profile = load_script(Path(__file__).parents[1] / "benchmarks" / "step_profile.py")
    objective, images = _client()
    objective.before_fit()
    objective.loss = replace(objective.loss, sam_tau=0.0)
    params = [p for p in objective.parameters() if p.requires_grad]
    counter = profile.Profile(count=True)
    with counter:
        losses = objective.sam_losses((images[:4], images[:4]))
        sharpness_aware_gradients(SharpnessAware(0.1), params, losses)
    assert counter.phases["other"].syncs == 0, dict(counter.phases["other"].sync_ops)
