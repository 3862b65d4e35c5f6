"""What the papers' remaining protocols need: FedCon with unlabeled data at the server
(paper 001 section IV-E): the server's consistency loss J also covers images it holds without
labels (``model.server_unlabeled``, ``data.server_unlabeled_fraction``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import fed_dm, tiny_overrides

from fedlit.cli import main
from fedlit.data import FederatedDataModule
from fedlit.federation import Federation, FederationConfig
from fedlit.methods import FedCon
from fedlit.models import Architecture, build_classifier
from fedlit.objectives import FedConServer
from fedlit.objectives.fedcon import server_loss

LN3 = math.log(3.0)  # softmax([ln 3, 0]) = (3/4, 1/4); softmax([0, 0]) = (1/2, 1/2)
RECIPE = "recipes/papers/fedcon_mnist_iid_server_unlabeled.yaml"


# --- the loss -------------------------------------------------------------------------------
def test_server_loss_on_a_hand_computed_case() -> None:
    # two rows per view: row 0 labeled (class 0), row 1 one of the server's unlabeled images
    online_1 = torch.tensor([[0.0, 0.0], [0.0, 0.0]], requires_grad=True)  # (1/2, 1/2) twice
    online_2 = torch.tensor([[LN3, 0.0], [LN3, 0.0]], requires_grad=True)  # (3/4, 1/4) twice
    target_1 = torch.tensor([[0.0, 0.0], [0.0, LN3]], requires_grad=True)  # (1/2, 1/2), (1/4, 3/4)
    target_2 = torch.tensor([[LN3, 0.0], [0.0, 0.0]], requires_grad=True)  # (3/4, 1/4), (1/2, 1/2)
    y = torch.tensor([0])
    loss, ce, consistency = server_loss(online_1, online_2, target_1, target_2, y)
    # CE on the labeled row of each view only: -ln(1/2) - ln(3/4) = ln(8/3)
    assert ce.item() == pytest.approx(math.log(8 / 3) / 2)
    # J over the n + m = 2 rows: J(online_1, target_2) = (1/8 + 0) / 2 = 1/16 and
    # J(online_2, target_1) = (1/8 + 1/2) / 2 = 5/16 (eq 3's 1/(n + m) sum)
    assert consistency.item() == pytest.approx((1 / 16 + 5 / 16) / 2)
    assert loss.item() == pytest.approx((math.log(8 / 3) + 3 / 8) / 2)
    # the labeled row alone: J = (1/8 + 1/8) / 2, the loss as FedCon's without IV-E
    alone = server_loss(online_1[:1], online_2[:1], target_1[:1], target_2[:1], y)
    assert alone[2].item() == pytest.approx(1 / 8)
    # the unlabeled row trains the online net through J; the target net gets no gradient
    loss.backward()
    assert online_2.grad is not None and online_2.grad[1].abs().sum() > 0
    assert target_1.grad is None and target_2.grad is None


def test_server_objective_feeds_the_unlabeled_batch_to_j_only() -> None:
    torch.manual_seed(0)
    network = build_classifier("small_cnn", 10, 1).eval()  # eval: no batch statistics
    target = build_classifier("small_cnn", 10, 1).eval()
    objective = FedConServer(network, target, lr=0.1)
    l1, l2, u1, u2 = (torch.randn(n, 1, 28, 28) for n in (3, 3, 5, 5))
    y = torch.tensor([0, 1, 2])
    loss = objective.training_step({"labeled": (l1, l2, y), "unlabeled": (u1, u2)}, 0)
    with torch.no_grad():
        c1, c2 = network(torch.cat([l1, u1])), network(torch.cat([l2, u2]))
        t1, t2 = target(torch.cat([l1, u1])), target(torch.cat([l2, u2]))
        expected, ce, _ = server_loss(c1, c2, t1, t2, y)
        labeled_only = server_loss(c1[:3], c2[:3], t1[:3], t2[:3], y)[0]
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert objective.epoch_metrics()["ce"] == pytest.approx(ce.item(), rel=1e-5)
    # a plain (labeled) batch is FedCon's loss without IV-E
    plain = FedConServer(network, target, lr=0.1).training_step((l1, l2, y), 0)
    assert plain.item() == pytest.approx(labeled_only.item(), rel=1e-5)


# --- the data -------------------------------------------------------------------------------
def test_server_unlabeled_split_and_loader(fmnist_root: Path) -> None:
    base = fed_dm(fmnist_root)
    dm = fed_dm(fmnist_root, server_unlabeled_fraction=0.01)
    assert len(base.server_unlabeled) == 0
    assert dm.partition_summary()["data/server_unlabeled"] == 600
    # 1% of each Fashion-MNIST class (6,000 each), taken after the labeled and validation sets
    assert torch.bincount(dm.server_unlabeled.labels, minlength=10).tolist() == [60] * 10
    assert torch.equal(dm.server.images, base.server.images)
    assert torch.equal(dm.val.images, base.val.images)
    held = {img.numpy().tobytes() for img in dm.server_unlabeled.images}
    for split in (dm.server, dm.val, *dm.clients):
        assert held.isdisjoint(img.numpy().tobytes() for img in split.images)
    # batches of the unlabeled batch size, images only
    batches = list(dm.server_unlabeled_dataloader(("weak", "weak")))
    assert all(len(b) == 2 for b in batches)
    assert batches[0][0].shape == (dm.client_batch_size, 1, 28, 28)
    assert sum(len(b[0]) for b in batches) == 600 - 600 % dm.client_batch_size  # full batches


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan")])
def test_bad_server_unlabeled_fraction_names_the_key(bad: float) -> None:
    with pytest.raises(ValueError, match="data.server_unlabeled_fraction"):
        FederatedDataModule(server_unlabeled_fraction=bad)


def test_a_split_that_does_not_fit_names_the_key(fmnist_root: Path) -> None:
    with pytest.raises(ValueError, match="data.server_unlabeled_fraction=0.6"):
        fed_dm(
            fmnist_root, labeled_per_class=None, labeled_fraction=0.5, server_unlabeled_fraction=0.6
        )


# --- the method -----------------------------------------------------------------------------
def _fed(root: Path, run_dir: Path, server_unlabeled: bool, fraction: float) -> Federation:
    data = FederatedDataModule(
        root=str(root),
        num_clients=2,
        examples_per_client=32,
        labeled_per_class=5,  # 50 labeled images: one batch of 64
        client_batch_size=32,
        test_subset=200,
        server_unlabeled_fraction=fraction,
    )
    method = FedCon(Architecture(10, 1), server_unlabeled=server_unlabeled)
    cfg = FederationConfig(rounds=1, clients_per_round=2)
    return Federation(method, data, cfg, run_dir=run_dir, seed=0, progress=False)


def test_fedcon_server_epoch_runs_over_the_larger_set(fmnist_root: Path, tmp_path: Path) -> None:
    # 300 unlabeled images in 9 full batches of 32 (the last 12 dropped), the one labeled
    # batch cycled along
    on = _fed(fmnist_root, tmp_path / "on", server_unlabeled=True, fraction=0.005)
    final = on.run().final
    assert int(on.method.server_steps) == 9
    assert math.isfinite(final["server/consistency"]) and 0 <= final["test/acc"] <= 1
    # the same split without the option: the server's unlabeled images stay unused
    off = _fed(fmnist_root, tmp_path / "off", server_unlabeled=False, fraction=0.005)
    off.run()
    assert int(off.method.server_steps) == 1


def test_server_unlabeled_without_images_names_the_key(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "fit",
                f"--config={RECIPE}",
                "--data.dataset=fashion_mnist",
                *tiny_overrides(fmnist_root),
                "--data.labeled_fraction=null",
                "--data.server_unlabeled_fraction=0",
                "--model.init_args.network.backbone=small_cnn",
                f"--trainer.default_root_dir={run_dir}",
            ]
        )
    assert exc.value.code != 0
    err = capsys.readouterr().err
    assert "model.server_unlabeled" in err and "data.server_unlabeled_fraction" in err, err
    assert not run_dir.exists()  # refused before anything is written
