"""The generated data sets (``synthetic``, ``synthetic_rgb``): shapes, determinism, learnability."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedlit.cli import main
from fedlit.data import FederatedDataModule, dataset_spec, load_split
from fedlit.data.datasets import SYNTHETIC_SIZES, synthetic_images

QUICKSTART = Path(__file__).parents[1] / "recipes" / "quickstart.yaml"


@pytest.mark.parametrize(
    ("name", "shape"), [("synthetic", (1, 28, 28)), ("synthetic_rgb", (3, 32, 32))]
)
def test_splits_match_the_spec(name: str, shape: tuple[int, int, int], tmp_path: Path) -> None:
    spec = dataset_spec(name)
    assert (spec.channels, spec.size, spec.size) == shape and spec.num_classes == 10
    train = load_split(name, tmp_path / "nothing", train=True)
    test = load_split(name, tmp_path / "nothing", train=False)
    assert not (tmp_path / "nothing").exists()  # generated: nothing read or written
    for split, n in ((train, SYNTHETIC_SIZES["train"]), (test, SYNTHETIC_SIZES["test"])):
        assert split.images.shape == (n, *shape) and split.images.dtype == torch.uint8
        assert torch.bincount(split.labels).tolist() == [n // 10] * 10
    # the spec's statistics are the training split's
    pixels = train.images.float() / 255
    assert pixels.mean(dim=(0, 2, 3)).tolist() == pytest.approx(spec.mean, abs=1e-4)
    assert pixels.std(dim=(0, 2, 3)).tolist() == pytest.approx(spec.std, abs=1e-4)
    assert not torch.equal(train.images[: len(test)], test.images)  # streams of their own


def test_generation_is_deterministic_per_split_seed() -> None:
    a, b = synthetic_images(50, 0, 10, 1, 28), synthetic_images(50, 0, 10, 1, 28)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    other = synthetic_images(50, 1, 10, 1, 28)
    assert not torch.equal(a[0], other[0])


def test_classes_are_their_patterns_plus_noise() -> None:
    """Within a class, images are closer to their class's mean image than to another's."""
    images, labels = synthetic_images(2000, 0, 10, 1, 28)
    x = images.float().flatten(1)
    means = torch.stack([x[labels == c].mean(0) for c in range(10)])
    nearest = torch.cdist(x, means).argmin(dim=1)
    assert (nearest == labels).float().mean() > 0.9


def test_a_data_module_on_it_draws_the_same_split_for_a_seed(tmp_path: Path) -> None:
    def drawn(seed: int) -> FederatedDataModule:
        data = FederatedDataModule(
            "synthetic", root=str(tmp_path), num_clients=3, labeled_per_class=5, val_per_class=2
        )
        data.setup_federation(seed)
        return data

    a, b, c = drawn(0), drawn(0), drawn(1)
    assert len(a.server) == 50 and len(a.val) == 20
    assert sorted(len(s) for s in a.clients) == [1976, 1977, 1977]  # the 5,930 images left
    assert torch.equal(a.server.images, b.server.images)
    assert torch.equal(a.clients[2].images, b.clients[2].images)
    assert not torch.equal(a.server.images, c.server.images)


def test_a_tiny_federation_learns_it_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The quick-start recipe (FedAvg-FixMatch, small CNN), shrunk: 2 clients of 100 images,
    20 labels per class, 1 round: test accuracy far above chance (0.1)."""
    main(
        [
            "fit",
            f"--config={QUICKSTART}",
            "--data.dataset=synthetic",
            f"--data.root={tmp_path / 'data'}",
            "--data.num_clients=2",
            "--data.examples_per_client=100",
            "--data.client_batch_size=32",
            "--data.labeled_per_class=20",
            "--data.val_per_class=0",
            "--data.test_subset=500",
            "--federation.rounds=1",
            "--federation.clients_per_round=2",
            "--federation.server_epochs=5",
            f"--trainer.default_root_dir={tmp_path / 'run'}",
        ]
    )
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert final["test/acc"] > 0.6
