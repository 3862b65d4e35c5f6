"""The scored model (BatchNorm statistics re-estimated) and the run-level learning-rate schedule."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from fedlit.data import FederatedDataModule
from fedlit.evaluation import Evaluator, batchnorm, recalibrate, recalibrated, scored
from fedlit.federation import TrainerTemplate
from fedlit.methods import ServerSL
from fedlit.models import Architecture, build_classifier
from fedlit.objectives import Optimization, SupervisedCE


@pytest.fixture(scope="module")
def data(fmnist_root: Path) -> FederatedDataModule:
    dm = FederatedDataModule(root=str(fmnist_root), num_clients=2, examples_per_client=64)
    dm.setup_federation(seed=0)
    return dm


def test_scored_statistics_are_a_full_pass_over_the_clean_images(
    data: FederatedDataModule,
) -> None:
    torch.manual_seed(0)
    network = build_classifier("small_cnn", 10, 1)
    with torch.no_grad():  # stale statistics, as after a high-learning-rate step
        for m in network.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-3, 3)
                m.running_var.uniform_(5, 9)
    before = {k: v.clone() for k, v in network.state_dict().items()}
    copy = scored(network, data)

    # a full pass in training mode over the 500 clean labeled images, by hand: each BN's input
    inputs: dict[str, torch.Tensor] = {}
    reference = build_classifier("small_cnn", 10, 1)
    reference.load_state_dict(before)
    hooks = [
        m.register_forward_pre_hook(lambda mod, args, name=name: inputs.__setitem__(name, args[0]))
        for name, m in reference.named_modules()
        if isinstance(m, nn.BatchNorm2d)
    ]
    images = torch.cat([x for (x,) in data.server_plain_dataloader()])
    assert len(images) == 500
    reference.train()
    with torch.no_grad():
        reference(images)
    for h in hooks:
        h.remove()
    modules = dict(copy.named_modules())
    assert inputs
    for name, x in inputs.items():
        # float64 reference; the channels-last BatchNorm kernel sums in float32 (~1e-5 relative)
        bn, x = modules[name], x.double()
        mean = x.mean(dim=(0, 2, 3))
        var = x.transpose(0, 1).flatten(1).var(dim=1, unbiased=True)
        torch.testing.assert_close(bn.running_mean.double(), mean, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(bn.running_var.double(), var, rtol=1e-3, atol=1e-3)
        stale = dict(network.named_modules())[name]
        assert (stale.running_mean.double() - mean).abs().max() > 0.1  # the pass changed them
    # the weights are the network's, and the network itself is untouched
    for k, v in network.state_dict().items():
        assert torch.equal(v, before[k]), k
        if "running" not in k and "num_batches" not in k:
            assert torch.equal(copy.state_dict()[k], v), k


def test_scored_statistics_do_not_depend_on_the_batch_size_while_one_batch_holds_the_server(
    fmnist_root: Path,
) -> None:
    """500 server images: eval batches of 500 and 1,000 give the same statistics (one batch,
    the full pass); batches of 100 give another estimate (the mean of five batches')."""
    torch.manual_seed(0)
    network = build_classifier("small_cnn", 10, 1)
    running = {}
    for size in (1000, 500, 100):
        dm = FederatedDataModule(
            root=str(fmnist_root), num_clients=2, examples_per_client=64, eval_batch_size=size
        )
        dm.setup_federation(seed=0)
        state = scored(network, dm).state_dict()
        running[size] = torch.cat([v.flatten() for k, v in state.items() if "running" in k])
    assert torch.equal(running[1000], running[500])
    assert (running[100] - running[1000]).abs().max() > 1e-3


def test_a_network_that_keeps_its_statistics_is_scored_without_a_second_pass(
    data: FederatedDataModule, fmnist_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """recalibrate gives the network the statistics scored gives a copy; scored then copies it
    without a pass, bit for bit what a pass gives, while the images (the server data and its
    eval batch size), the device and every weight and statistic are those of that pass; and
    re-estimates as soon as one of them is not."""
    torch.manual_seed(0)
    network = build_classifier("small_cnn", 10, 1)
    reference = recalibrated(network, data.server_plain_dataloader())
    passes = []
    update_bn = torch.optim.swa_utils.update_bn

    def counted(*args: object, **kwargs: object) -> None:
        passes.append(1)
        update_bn(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.optim.swa_utils, "update_bn", counted)
    recalibrate(network, data)
    assert len(passes) == 1
    _assert_same_state(network, reference)  # the network holds the scored copy's statistics
    copy = scored(network, data, torch.device("cpu"))
    assert len(passes) == 1 and copy is not network and not copy.training
    _assert_same_state(copy, reference)
    estimate = batchnorm._ESTIMATES[network]
    assert estimate.holds(network, data.server_data, None)
    assert not estimate.holds(network, data.server_data, torch.device("meta"))  # another device
    smaller = FederatedDataModule(
        root=str(fmnist_root), num_clients=2, examples_per_client=64, eval_batch_size=100
    )
    smaller.setup_federation(seed=0)  # the same 500 images in batches of 100
    scored(network, smaller)
    assert len(passes) == 2
    weight = next(network.parameters())
    kept = weight.detach().clone()
    with torch.no_grad():  # a weight changes: the statistics are re-estimated for it
        weight.add_(1e-3)
    changed = scored(network, data).state_dict()
    assert len(passes) == 3
    assert any(
        not torch.equal(v, changed[k]) for k, v in reference.state_dict().items() if "running" in k
    )
    with torch.no_grad():  # changed back: the network is again the one the pass left
        weight.copy_(kept)
    _assert_same_state(scored(network, data), reference)
    assert len(passes) == 3


def test_a_shared_scored_network_is_the_network_itself_and_its_test_leaves_it_as_it_was(
    data: FederatedDataModule,
) -> None:
    """``scored(..., shared=True)``: the network itself where it holds its statistics and lies
    on the device (no pass, no copy); a re-estimated copy where it does not. The evaluator's
    test leaves the shared network's mode and state as they were, and scores it as it scores
    a copy."""
    torch.manual_seed(0)
    network = build_classifier("small_cnn", 10, 1)
    recalibrate(network, data)
    network.train()
    before = {k: v.clone() for k, v in network.state_dict().items()}
    cpu = TrainerTemplate(accelerator="cpu", precision="32-true")
    assert scored(network, data, torch.device("cpu"), shared=True) is network
    metrics = []
    for shared in (True, False):
        evaluator = Evaluator(scored(network, data, cpu.device(), shared=shared), 10)
        cpu.test(evaluator, data.test_dataloader())
        metrics.append(evaluator.metrics())
    assert metrics[0] == metrics[1]
    assert network.training and all(m.training for m in network.modules())
    assert all(torch.equal(v, before[k]) for k, v in network.state_dict().items())
    with torch.no_grad():  # a weight changes: a re-estimated copy, the network untouched
        next(network.parameters()).add_(1e-3)
    assert scored(network, data, torch.device("cpu"), shared=True) is not network


def _assert_same_state(a: nn.Module, b: nn.Module) -> None:
    theirs = b.state_dict()
    for key, value in a.state_dict().items():
        assert torch.equal(value, theirs[key]), key


def test_run_level_schedule_values_at_known_steps(data: FederatedDataModule) -> None:
    """Round 2 of 4 covers the run's fraction [0.25, 0.5): the server's learning rate at its
    k-th of S steps is lr * cos(pi / 2 * (0.25 + 0.25 k / S)) (cosine to 0, no warm-up)."""
    method = ServerSL(Architecture(10, 1), optim=Optimization(server_lr=0.1))
    method.on_round_start(2, 4)
    kw = method._server_kwargs()
    assert kw["progress"] == (0.25, 0.5)
    seen: list[float] = []

    class Recording(SupervisedCE):
        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            conf = super().configure_optimizers()
            self.optimizer = conf["optimizer"]
            return conf

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            seen.append(self.optimizer.param_groups[0]["lr"])
            return super().training_step(batch, batch_idx)

    objective = Recording(method.network, **kw)
    loader = data.server_dataloader()
    TrainerTemplate(accelerator="cpu").fit(objective, loader, epochs=1)
    steps = len(loader)
    expected = [0.1 * math.cos(math.pi / 2 * (0.25 + 0.25 * k / steps)) for k in range(steps)]
    assert seen == pytest.approx(expected, rel=1e-6)
    # constant: no schedule; the bootstrap (round 0) is never scheduled
    constant = Optimization(lr_schedule="constant")
    assert "schedule" not in constant.objective_kwargs(0.1, 2, 4)
    method.on_round_start(0, 4)
    assert "schedule" not in method._server_kwargs()
    with pytest.raises(ValueError, match="optim.lr_schedule"):
        Optimization(lr_schedule="step")  # type: ignore[arg-type]
