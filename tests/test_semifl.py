"""SemiFL's mechanisms, each pinned on tiny inputs (the confidence mask, pseudo-labels fixed
for the round, the mix loss, the server's momentum, static BatchNorm), its switches, and its
runs: a resumed run ends with the uninterrupted run's state, and a pool of two workers gives
the in-process run."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import load_script, stop_in_round, tiny_data
from ray_runs import differences
from torch import nn

from fedlit.aggregation import ServerMomentum, momentum_step
from fedlit.aggregation.payloads import MODEL, state_part
from fedlit.data import FederatedDataModule
from fedlit.data.datasets import SPECS
from fedlit.data.loaders import ImageBatches
from fedlit.evaluation.batchnorm import recalibrated
from fedlit.federation import Federation, FederationConfig, PoolSettings
from fedlit.federation.fit.loop import LoopSettings, fit
from fedlit.methods import ClientUpdate, SemiFL
from fedlit.methods.plan import SERVER_LAST
from fedlit.methods.semifl import PARALLEL
from fedlit.models import Architecture
from fedlit.objectives import (
    Optimization,
    SemiFLClient,
    SemiFLLoss,
    confident_labels,
    mixup,
    mixup_cross_entropy,
)
from fedlit.objectives.mixing import beta_draws


# --- the confidence mask ------------------------------------------------------------------
def test_the_mask_keeps_exactly_the_labels_at_or_above_tau() -> None:
    probs = torch.tensor([[0.96, 0.04], [0.05, 0.95], [0.94, 0.06], [0.5, 0.5]])
    labels, mask = confident_labels(probs, 0.95)
    assert labels[:3].tolist() == [0, 1, 0]
    assert mask.tolist() == [1.0, 1.0, 0.0, 0.0]  # 0.95 itself passes, 0.94 does not
    assert confident_labels(probs, 0.0)[1].tolist() == [1.0] * 4


def test_the_method_settings_are_checked_naming_the_key() -> None:
    """(The loss's: tests/test_objectives.py's ``BAD_SETTINGS``.)"""
    with pytest.raises(ValueError, match="global_momentum"):
        SemiFL(Architecture(10, 1), global_momentum=1.0)
    with pytest.raises(ValueError, match="static_bn"):
        SemiFL(Architecture(10, 1), static_bn="yes")  # type: ignore[arg-type]


# --- the mix loss -------------------------------------------------------------------------
def test_mixup_and_its_loss_on_a_known_pair() -> None:
    """Two examples, lam 0.75: x~_0 = 0.75 x_0 + 0.25 x_1, x~_1 = 0.75 x_1 + 0.25 x_0, and the
    loss of logits (ln 3, 0) on labels (0, 1): 0.75 CE(., 0) + 0.25 CE(., 1), by hand."""
    x = torch.tensor([[4.0], [8.0]])
    lam = torch.tensor(0.75)
    assert mixup(x, lam).tolist() == [[5.0], [7.0]]
    logits = torch.tensor([[math.log(3.0), 0.0], [math.log(3.0), 0.0]])
    # p = (3/4, 1/4): CE(., 0) = ln(4/3), CE(., 1) = ln 4
    got = mixup_cross_entropy(logits, torch.tensor([0, 1]), lam)
    want = [
        0.75 * math.log(4 / 3) + 0.25 * math.log(4),
        0.75 * math.log(4) + 0.25 * math.log(4 / 3),
    ]
    assert got.tolist() == pytest.approx(want, abs=1e-6)


def test_the_mixing_weights_follow_the_seed_and_beta() -> None:
    torch.manual_seed(0)
    a = beta_draws(0.75, 2000)
    torch.manual_seed(0)
    assert torch.equal(a, beta_draws(0.75, 2000))
    assert 0 <= a.min() and a.max() <= 1
    assert a.mean().item() == pytest.approx(0.5, abs=0.03)  # Beta(a, a): mean 1/2
    # variance 1 / (4 (2a + 1)) = 0.1 at a = 0.75
    assert a.var().item() == pytest.approx(0.1, abs=0.01)


# --- pseudo-labels fixed for the round ----------------------------------------------------
class _Linear(nn.Module):
    """A Classifier's shape on 1x2x2 images: flatten, then a linear head of 2 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.flatten(1))


def _client(global_labels: bool, mix: bool = False) -> tuple[SemiFLClient, torch.Tensor]:
    net = _Linear()
    with torch.no_grad():
        net.head.weight.zero_()
        net.head.bias.copy_(torch.tensor([5.0, 0.0]))  # every image: class 0, p = 0.993
    objective = SemiFLClient(
        net,  # type: ignore[arg-type]
        lr=0.1,
        loss=SemiFLLoss(tau=0.95),
        global_labels=global_labels,
        mix=mix,
    )
    images = torch.rand(6, 1, 2, 2)
    objective.attach([(images,)])
    return objective, images


def test_a_pseudo_label_fixed_for_the_round_does_not_move_while_the_client_trains() -> None:
    """The received model labels every image class 0; then the network is changed as training
    could change it (it now predicts class 1 with confidence). The fix loss still uses the
    labels of the received model: CE against class 0; FixMatch's per-batch rule, against 1."""
    objective, images = _client(global_labels=True)
    objective.before_fit()
    assert objective.pseudo.tolist() == [0] * 6 and objective.confident.tolist() == [1.0] * 6
    with torch.no_grad():
        objective.network.head.bias.copy_(torch.tensor([0.0, 5.0]))  # type: ignore[operator]
    index = torch.arange(6)
    loss, _ = objective.step((index, images, images))
    logits = objective.network(images)
    to_class_0 = F.cross_entropy(logits, torch.zeros(6, dtype=torch.long))
    assert loss.item() == pytest.approx(to_class_0.item())
    local, _ = _client(global_labels=False)
    local.before_fit()
    with torch.no_grad():
        local.network.head.bias.copy_(torch.tensor([0.0, 5.0]))  # type: ignore[operator]
    moved, _ = local.step((index, images, images))
    to_class_1 = F.cross_entropy(logits, torch.ones(6, dtype=torch.long))
    assert moved.item() == pytest.approx(to_class_1.item())
    assert moved.item() < loss.item()


def test_a_real_fit_keeps_the_round_s_labels() -> None:
    """Through fedlit's loop, two epochs at a high rate: the labels set before the first step
    are those at the end, while the network moved; the fit logs the fix and mix losses."""
    spec = SPECS["fashion_mnist"]
    torch.manual_seed(0)
    arch = Architecture(10, 1)
    net = arch.build()
    images = torch.randint(0, 256, (32, 1, 28, 28), dtype=torch.uint8)
    objective = SemiFLClient(net, lr=0.5, loss=SemiFLLoss(tau=0.0), global_labels=True, mix=True)
    objective.attach(ImageBatches(images, spec, ("plain",), 32, False))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    loader = ImageBatches(images, spec, ("weak", "strong"), 8, True, with_index=True)
    seen: list[torch.Tensor] = []
    original = objective.after_step

    def record() -> None:
        seen.append(objective.pseudo.clone())
        original()

    objective.after_step = record  # type: ignore[method-assign]
    fit(objective, loader, 2, None, LoopSettings(torch.device("cpu")), {})
    assert len(seen) == 8 and all(torch.equal(s, seen[0]) for s in seen)
    assert int(objective.lam_step) == 8  # one mixing weight a step
    assert any(not torch.equal(before[k], v) for k, v in net.state_dict().items())
    metrics = objective.epoch_metrics()
    assert {"fix", "mix", "mask_rate", "pseudo/frac"} <= metrics.keys()
    assert metrics["pseudo/frac"] == 1.0 and metrics["mix"] > 0


# --- the server's momentum ----------------------------------------------------------------
def test_the_momentum_step_on_known_tensors() -> None:
    """w = 1, aggregate 0.5 (d = 0.5), v = 0.2, beta 0.5: v' = 0.1 + 0.5 = 0.6, w' = 0.4; a
    buffer without velocity takes the aggregate; the inputs are unchanged."""
    current = {"w": torch.tensor([1.0, 2.0]), "bn": torch.tensor([3.0])}
    aggregate = {"w": torch.tensor([0.5, 1.0]), "bn": torch.tensor([7.0])}
    velocity = {"w": torch.tensor([0.2, 0.0])}
    state, new = momentum_step(current, aggregate, velocity, 0.5)
    assert new["w"].tolist() == pytest.approx([0.6, 1.0])
    assert state["w"].tolist() == pytest.approx([0.4, 1.0])
    assert state["bn"].tolist() == [7.0]
    assert velocity["w"].tolist() == pytest.approx([0.2, 0.0])  # not changed
    # beta 0: the aggregate itself
    plain, _ = momentum_step(current, aggregate, velocity, 0.0)
    assert plain["w"].tolist() == pytest.approx([0.5, 1.0])
    with pytest.raises(ValueError, match="'x'"):
        momentum_step(current, aggregate, {"x": torch.zeros(1)}, 0.5)


def test_the_server_momentum_keeps_its_velocity_in_its_state_dict() -> None:
    """Two steps: the first lands on the aggregate, the second overshoots by beta x the first
    update; a copy loaded from the state dict takes the same second step."""
    momentum = ServerMomentum([("w", torch.Size([1]))], 0.5)
    w1 = momentum({"w": torch.tensor([1.0])}, {"w": torch.tensor([0.0])})
    assert w1["w"].tolist() == [0.0]
    copy = ServerMomentum([("w", torch.Size([1]))], 0.5)
    copy.load_state_dict(momentum.state_dict())
    w2 = momentum(w1, {"w": torch.tensor([0.0])})
    assert w2["w"].tolist() == [-0.5]  # v = 0.5 * 1 + 0
    assert copy(w1, {"w": torch.tensor([0.0])})["w"].tolist() == [-0.5]


# --- the method: plans, static BatchNorm, runs ---------------------------------------------
def test_the_switches_choose_the_plan_and_the_momentum() -> None:
    arch = Architecture(10, 1)
    assert SemiFL(arch).round_plan() == SERVER_LAST
    assert SemiFL(arch, server_finetune=False).round_plan() == PARALLEL
    assert any(k.startswith("momentum.") for k in SemiFL(arch).state_dict())
    plain = SemiFL(arch, global_momentum=0.0)
    assert not any(k.startswith("momentum.") for k in plain.state_dict())


def _data(root: Path) -> FederatedDataModule:
    return tiny_data(
        root, num_clients=4, examples_per_client=64, client_batch_size=32, test_subset=200
    )


def _fed(root: Path, run_dir: Path, **config: object) -> Federation:
    """2 rounds, 3 of 4 clients; tau 0 so that every pseudo-label is trained on."""
    method = SemiFL(
        Architecture(10, 1),
        optim=Optimization(client_lr=0.03),
        loss=SemiFLLoss(tau=0.0),
    )
    cfg = FederationConfig(
        rounds=2,
        clients_per_round=3,
        server_epochs=1,
        **config,  # type: ignore[arg-type]
    )
    return Federation(method, _data(root), cfg, run_dir=run_dir, seed=0, progress=False)


@pytest.mark.parametrize("static_bn", [True, False])
def test_static_batchnorm_sends_the_server_s_statistics(
    static_bn: bool, fmnist_root: Path, tmp_path: Path
) -> None:
    """sBN: the broadcast's BatchNorm statistics are those of a pass over the server's clean
    labeled images; without sBN, the running statistics the network holds."""
    fed = _fed(fmnist_root, tmp_path / "run")
    method = fed.method
    assert isinstance(method, SemiFL)
    method.static_bn = static_bn
    fed.prepare()
    method.network.train()
    with torch.no_grad():  # a training pass leaves running statistics of other images
        method.network(torch.randn(8, 1, 28, 28) * 3 + 1)
    trained = {k: v.clone() for k, v in method.network.state_dict().items() if "running" in k}
    want = recalibrated(method.network, fed.data.server_plain_dataloader()).state_dict()
    sent = state_part(method.broadcast(), MODEL)
    assert trained
    for key, value in trained.items():
        assert torch.equal(sent[key], want[key] if static_bn else value), key
    assert not all(torch.equal(want[k], v) for k, v in trained.items())
    # a copy of the method (the checks before a run make one) shares the data, never copies it
    copied = copy.deepcopy(method)
    assert copied.data is not None and copied.data() is fed.data


@pytest.mark.slow  # about 10 s: four rounds in all
def test_resume_is_exact(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped in round 2 and resumed: the state (the network and the server's velocity) is
    the uninterrupted run's, bit for bit."""
    full = _fed(fmnist_root, tmp_path / "full")
    full.run()
    assert full.history[-1]["client/mix"] > 0 and full.history[-1]["pseudo/frac"] == 1.0
    run_dir = tmp_path / "cut"
    undo = stop_in_round(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        _fed(fmnist_root, run_dir).run()
    undo()
    resumed = _fed(fmnist_root, run_dir, resume=str(run_dir / "checkpoints/last.ckpt"))
    resumed.run()
    assert differences(full, resumed) == []
    velocity = [k for k in full.method.state_dict() if k.startswith("momentum.")]
    assert velocity and any(full.method.state_dict()[k].abs().sum() > 0 for k in velocity)


@pytest.mark.slow  # about 10 s: two runs of two rounds, a pool of two workers
def test_two_workers_give_the_in_process_run(fmnist_root: Path, tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' thread count
    try:
        local = _fed(fmnist_root, tmp_path / "local")
        local.run()
        pool = _fed(fmnist_root, tmp_path / "pool")
        pool.config = replace(pool.config, executor="pool", pool=PoolSettings(workers=2))
        pool.run()
    finally:
        torch.set_num_threads(threads)
    assert differences(local, pool) == []


def test_static_batchnorm_without_data_is_refused_not_skipped() -> None:
    """sBN needs the server's labeled images: a broadcast without a data module (never given,
    or gone) refuses by the key, where it once sent the running statistics in silence."""
    method = SemiFL(Architecture(10, 1), global_momentum=0.0)
    with pytest.raises(RuntimeError, match=r"model\.static_bn=True"):
        method.broadcast()
    method.static_bn = False  # the key's other value: the statistics as they are
    assert state_part(method.broadcast(), MODEL)


def test_without_the_fine_tune_the_server_s_model_is_half_the_aggregate() -> None:
    """SemiFL's parallel baseline: (w_s + mean_k w_k) / 2 with equal n_k (no momentum)."""
    method = SemiFL(Architecture(10, 1), server_finetune=False, global_momentum=0.0)
    server = {k: v.clone() for k, v in method.network.state_dict().items()}
    uploads = [{k: v + 1.0 if v.is_floating_point() else v for k, v in server.items()}]
    uploads.append({k: v + 3.0 if v.is_floating_point() else v for k, v in server.items()})
    updates = [ClientUpdate(i, {MODEL: u}, 10) for i, u in enumerate(uploads)]
    method.aggregate(updates)
    for key, value in method.network.state_dict().items():
        if value.is_floating_point():
            torch.testing.assert_close(value, server[key] + 1.0)  # (0 + 2) / 2


def test_no_host_sync_inside_semifl_s_client_steps() -> None:
    """benchmarks/step_profile.py's counter: SemiFL's client steps (fixed labels gathered by
    index, the fix and mix losses over masks, the step's lam read on the device) read nothing
    back; its labels are made before the first step."""
    profile = load_script(Path(__file__).parents[1] / "benchmarks" / "step_profile.py")
    setting = profile.Setting("semifl", "small_cnn", clients=2, examples=16, batch=8, rounds=1,
                              server_epochs=1)  # fmt: skip
    phases = profile.profiled(profile.run_fedlit, setting, count=True).phases
    client = phases["client step"]
    assert client.units == 2 * 2 and client.ops > 0  # 2 clients x 16 images / batch 8
    assert client.syncs == 0, dict(client.sync_ops)
    assert phases["server step"].syncs == 0
