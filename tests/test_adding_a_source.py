"""The "Adding a kind of data set" example of the documentation (docs/contributing.md), as
printed there: a CSV file listing image paths, labels and splits, registered as
``data.dataset: csv``, serves a run through the real CLI and refuses a listing without a test
split, naming ``data.path``."""

from __future__ import annotations

import csv
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import docs_example
from torchvision.io import write_png

from fedlit.cli import main
from fedlit.data import FederatedDataModule, sources
from fedlit.data.datasets import synthetic_images

PAGE = Path(__file__).parents[1] / "docs" / "contributing.md"
RECIPE = Path(__file__).parents[1] / "recipes" / "quickstart.yaml"
MODULE = "csv_listing"


@pytest.fixture
def csv_listing(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """The example's code block, run as the module ``csv_listing``: ``csv`` is registered in
    ``sources.FILES`` until the test ends."""
    monkeypatch.setitem(sources.FILES, "csv", sources.Folder)  # undone after the test
    with docs_example(PAGE, "Adding a kind of data set", MODULE) as module:
        yield module


def write_listing(folder: Path, splits: tuple[str, ...] = ("train", "test")) -> Path:
    """PNGs of 20 training and 5 test images a class (10 classes, 28x28 grey) under
    ``folder/img`` and ``folder/list.csv`` listing them, labels by name (``shirt<k>``)."""
    (folder / "img").mkdir(parents=True)
    with open(folder / "list.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label", "split"])
        for split, count, seed in (("train", 200, 0), ("test", 50, 1)):
            if split not in splits:
                continue
            images, _ = synthetic_images(count, seed, 10, 1, 28)
            labels = torch.arange(count) % 10  # every class alike
            for n, (image, label) in enumerate(zip(images, labels, strict=True)):
                name = f"img/{split}{n}.png"
                write_png(image, str(folder / name))
                writer.writerow([name, f"shirt{int(label)}", split])
    return folder / "list.csv"


def test_a_csv_listing_serves_a_run(csv_listing: types.ModuleType, tmp_path: Path) -> None:
    listing = write_listing(tmp_path / "data")
    data = FederatedDataModule("csv", path=str(listing), num_clients=2, labeled_per_class=5)
    assert type(data.source) is csv_listing.CsvListing and data.is_users_own
    assert data.spec.classes == tuple(f"shirt{k}" for k in range(10))
    assert data.image_shape == (1, 28, 28)
    data.setup_federation(0)
    assert len(data.server) == 50 and [len(c) for c in data.clients] == [75, 75]

    run_dir = tmp_path / "run"
    main(
        [
            "fit",
            f"--config={RECIPE}",
            "--data.dataset=csv",
            f"--data.path={listing}",
            f"--data.root={tmp_path / 'root'}",
            "--data.num_clients=2",
            "--data.examples_per_client=null",
            "--data.labeled_per_class=5",
            "--data.val_per_class=2",
            "--data.client_batch_size=16",
            "--federation.rounds=1",
            "--federation.clients_per_round=2",
            "--federation.server_epochs=1",
            f"--trainer.default_root_dir={run_dir}",
        ]
    )
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(row["round"]) for row in rows] == [0, 1]  # the partition row, one round
    assert 0 <= float(rows[-1]["test/acc"]) <= 1


def test_a_listing_without_a_test_split_is_refused(
    csv_listing: types.ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listing = write_listing(tmp_path / "data", splits=("train",))
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "fit",
                f"--config={RECIPE}",
                "--data.dataset=csv",
                f"--data.path={listing}",
                f"--trainer.default_root_dir={tmp_path / 'run'}",
            ]
        )
    assert exc.value.code == 2
    assert f"data.path: {listing} lists no test images" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
