"""The centralized reference: FixMatch / UDA on every client's images at the server, as many
unlabeled steps a round as the federated round's clients take together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_overrides

from fedlit.cli import main
from fedlit.data import FederatedDataModule
from fedlit.federation import Federation, FederationConfig
from fedlit.federation.server import client_steps_per_round
from fedlit.methods import CentralizedFixMatch, CentralizedUDA
from fedlit.methods.centralized import pooled_loader
from fedlit.models import Architecture
from fedlit.objectives import FixMatch, FixMatchLoss
from fedlit.objectives.fixmatch import fixmatch_loss
from fedlit.reporting import load_run, summarize, to_markdown

REPO = Path(__file__).parents[1]


def _data(root: Path, **kw: object) -> FederatedDataModule:
    args = {"root": str(root), "num_clients": 3, "examples_per_client": 40,
            "client_batch_size": 16, "labeled_per_class": 5, "test_subset": 100}  # fmt: skip
    data = FederatedDataModule(**(args | kw))  # type: ignore[arg-type]
    data.setup_federation(0)
    return data


def test_the_round_takes_as_many_unlabeled_steps_as_the_federated_clients(
    fmnist_root: Path,
) -> None:
    """3 clients of 40 images in batches of 16: 2 full batches a shard (a client's training
    loader drops the last partial batch of 8). 2 clients a round, 2 local epochs: 2 x 2 x 2 = 8
    steps; with local_steps 5: 2 x 5 = 10."""
    data = _data(fmnist_root)
    config = FederationConfig(clients_per_round=2, local_epochs=2)
    assert client_steps_per_round(config, data) == 8
    assert client_steps_per_round(FederationConfig(clients_per_round=2, local_steps=5), data) == 10


def test_the_pooled_loader_holds_every_clients_images(fmnist_root: Path) -> None:
    data = _data(fmnist_root)
    loader = pooled_loader(data, ("weak", "strong"))
    assert torch.equal(loader.images, torch.cat([shard.images for shard in data.clients]))
    assert len(loader.images) == 120 and loader.batch_size == 16 and loader.labels is None


def test_it_trains_on_the_clients_images_at_the_server(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One round: the centralized step trains FixMatch on batches of the pooled client images
    (8 steps, every batch's images from a client's shard), changes the network, sends nothing,
    and the run is marked as the centralized reference."""
    seen: list[torch.Tensor] = []
    original = FixMatch.training_step

    def recording(self: FixMatch, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> torch.Tensor:
        seen.append(batch[0])
        return original(self, batch, i)

    monkeypatch.setattr(FixMatch, "training_step", recording)
    data = FederatedDataModule(
        root=str(fmnist_root), num_clients=3, examples_per_client=40, client_batch_size=16,
        labeled_per_class=5, test_subset=100,
    )  # fmt: skip
    method = CentralizedFixMatch(Architecture(10, 1), loss=FixMatchLoss(tau=0.0))
    config = FederationConfig(rounds=1, clients_per_round=2, local_epochs=2)
    fed = Federation(method, data, config, run_dir=tmp_path / "run", progress=False)
    fed.prepare()
    before = {k: v.clone() for k, v in method.network.state_dict().items()}
    row = fed.run().final
    assert row["central/steps"] == 8 and len(seen) == 8
    assert row["central/mask_rate"] == 1.0  # tau 0: every pseudo-label is used
    assert row["comm/bytes_down"] == 0 and row["comm/bytes_up"] == 0
    assert "server/loss" in row and "finetune/loss" in row
    assert any(not torch.equal(before[k], v) for k, v in method.network.state_dict().items())
    # full batches only: one pass over the 120 pooled images (7 batches of 16, the last 8
    # images left out), then 1 of the next pass
    assert [len(b) for b in seen] == [16] * 8
    assert json.loads((tmp_path / "run" / "run.json").read_text())["marks"] == ["centralized"]


def test_the_recipes_run_and_are_marked_as_a_reference(fmnist_root: Path, tmp_path: Path) -> None:
    """``fedlit fit`` of both recipes (one tiny round), then a table: their rows carry the
    ``centralized`` mark and the summary gives them apart from the methods."""
    for name in ("centralized_fixmatch", "centralized_uda", "server_sl"):
        main(
            [
                "fit",
                f"--config={REPO / 'recipes' / f'{name}.yaml'}",
                *tiny_overrides(fmnist_root),
                "--federation.final_eval=[]",
                f"--trainer.default_root_dir={tmp_path / name}",
            ]
        )
    runs = [
        load_run(tmp_path / n) for n in ("centralized_fixmatch", "centralized_uda", "server_sl")
    ]
    assert runs[0].history[-1]["central/steps"] == 4  # 2 clients x 1 epoch x 2 batches of 16
    rows = summarize(runs, baseline="ServerSL")
    assert {r.method: r.marks for r in rows}["CentralizedUDA"] == ("centralized",)
    table = to_markdown(rows, baseline="ServerSL")
    assert "CentralizedFixMatch (centralized) | 1 |" in table
    assert "- CentralizedFixMatch (centralized) vs ServerSL:" in table


def test_streaming_data_is_refused_by_name(fmnist_root: Path, tmp_path: Path) -> None:
    data = FederatedDataModule(
        root=str(fmnist_root), num_clients=2, examples_per_client=32, stream_steps=2
    )
    fed = Federation(
        CentralizedUDA(Architecture(10, 1)), data, FederationConfig(rounds=1, clients_per_round=2),
        run_dir=tmp_path / "run", progress=False,
    )  # fmt: skip
    with pytest.raises(ValueError, match="data.stream_steps=2"):
        fed.prepare()
    fed.close()
    assert not (tmp_path / "run").exists()


def test_the_joint_step_is_ce_on_the_labels_plus_the_unlabeled_loss() -> None:
    """``joint_step`` on a BatchNorm-free network: CE on the labeled batch plus FixMatch's
    masked pseudo-label CE, each computed on its own, summed (lambda_u = 1)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    x, y = torch.randn(2, 1, 2, 2), torch.tensor([0, 2])
    weak, strong = torch.randn(5, 1, 2, 2), torch.randn(5, 1, 2, 2)
    tau = float(net(weak).detach().softmax(1).max(1).values.sort().values[2])  # keeps 3 of 5
    objective = FixMatch(net, lr=0.1, loss=FixMatchLoss(tau=tau))  # type: ignore[arg-type]
    got, _ = objective.joint_step((weak, strong), (x, y))
    unlabeled, mask = fixmatch_loss(net(weak), net(strong), tau)
    expected = F.cross_entropy(net(x), y) + unlabeled
    assert mask.tolist().count(1.0) == 3  # the threshold keeps some pseudo-labels, drops others
    assert torch.allclose(got, expected)
    assert torch.allclose(
        objective.training_step({"unlabeled": (weak, strong), "labeled": (x, y)}, 0), expected
    )


def test_with_labeled_in_step_every_step_takes_a_labeled_batch(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """labeled_in_step: the centralized step's 8 steps each get a batch of the pooled client
    images and a batch of the server's labeled images (50 labels in batches of 16, cycled),
    and log the labeled CE beside the unlabeled loss."""
    seen: list[dict[str, tuple[torch.Tensor, ...]]] = []
    original = FixMatch.training_step

    def recording(
        self: FixMatch, batch: dict[str, tuple[torch.Tensor, ...]], i: int
    ) -> torch.Tensor:
        seen.append(batch)
        return original(self, batch, i)

    monkeypatch.setattr(FixMatch, "training_step", recording)
    data = FederatedDataModule(
        root=str(fmnist_root), num_clients=3, examples_per_client=40, client_batch_size=16,
        batch_size=16, labeled_per_class=5, test_subset=100,
    )  # fmt: skip
    method = CentralizedFixMatch(
        Architecture(10, 1), loss=FixMatchLoss(tau=0.0), labeled_in_step=True
    )
    config = FederationConfig(rounds=1, clients_per_round=2, local_epochs=2)
    row = Federation(method, data, config, run_dir=tmp_path / "run", progress=False).run().final
    assert row["central/steps"] == 8 and len(seen) == 8
    assert all(set(b) == {"unlabeled", "labeled"} for b in seen)
    assert [len(b["unlabeled"][0]) for b in seen] == [16] * 8
    assert [len(b["labeled"][0]) for b in seen] == [16] * 8
    # the server's 5 labels a class, cycled: each pass of 3 batches (48 of the 50, the last
    # partial batch dropped) holds every class 4 or 5 times
    for first in (0, 3):
        labels = torch.cat([b["labeled"][1] for b in seen[first : first + 3]])
        assert sorted(set(torch.bincount(labels, minlength=10).tolist())) == [4, 5]
        assert len(labels) == 48
    assert "central/ce" in row and row["central/mask_rate"] == 1.0


def test_labeled_in_step_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="model.labeled_in_step must be a bool"):
        CentralizedFixMatch(Architecture(10, 1), labeled_in_step="yes")  # type: ignore[arg-type]
