"""Data sets of the user's own files (an image folder, clients as folders, arrays, a torch
Dataset), written here as PNGs and arrays from the generated ``synthetic`` data set: they learn
through the CLI, equal each other bit for bit, hold determinism and resume, and are read as
the user laid them out (statistics cached beside them, grey or RGB detected, sizes fitted)."""

from __future__ import annotations

import csv
import json
import math
import pickle
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from conftest import stop_in_round
from torch.utils.data import Dataset, TensorDataset
from torchvision.io import write_png

from fedlit.cli import main
from fedlit.data import Dirichlet, FederatedDataModule
from fedlit.data.datasets import synthetic_images
from fedlit.data.own.folders import image_files
from fedlit.data.own.statistics import STATS_FILE, channel_statistics, fingerprint
from fedlit.federation.callbacks import Announce
from fedlit.federation.checkpoint import load_checkpoint
from fedlit.methods import ServerSL
from fedlit.models import Architecture

EXAMPLES = Path(__file__).parents[1] / "recipes" / "examples"


def write_class_folders(split_dir: Path, images: torch.Tensor, labels: torch.Tensor) -> None:
    """``images`` (N, C, H, W) uint8 as ``split_dir/c<label>/<n>.png``."""
    for n, (image, label) in enumerate(zip(images, labels, strict=True)):
        folder = split_dir / f"c{int(label)}"
        folder.mkdir(parents=True, exist_ok=True)
        write_png(image, str(folder / f"{n:05d}.png"))


def class_major(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The images in the order a folder of them is read: by class, then by file name."""
    order = torch.argsort(labels, stable=True)
    return images[order], labels[order]


def image_folder(root: Path, train: int = 600, test: int = 300, channels: int = 1) -> Path:
    """A ``folder`` data set of ``synthetic`` images: ``train/c<k>/*.png``, ``test/...``."""
    size = 28 if channels == 1 else 32
    write_class_folders(root / "train", *synthetic_images(train, 0, 10, channels, size))
    write_class_folders(root / "test", *synthetic_images(test, 1, 10, channels, size))
    return root


CLIENT_SIZES = (40, 70, 120)  # uneven


def client_folders(root: Path, labeled: int = 200, test: int = 300) -> Path:
    """A ``client_folders`` data set of ``synthetic`` images: ``labeled/c<k>/*.png``,
    ``clients/<name>/*.png`` (:data:`CLIENT_SIZES` images each), ``test/c<k>/*.png``."""
    write_class_folders(root / "labeled", *synthetic_images(labeled, 0, 10, 1, 28))
    pool, _ = synthetic_images(sum(CLIENT_SIZES), 2, 10, 1, 28)
    start = 0
    for name, size in zip(("alice", "bob", "carol"), CLIENT_SIZES, strict=True):
        folder = root / "clients" / name
        folder.mkdir(parents=True)
        for n, image in enumerate(pool[start : start + size]):
            write_png(image, str(folder / f"{n:04d}.png"))
        start += size
    write_class_folders(root / "test", *synthetic_images(test, 1, 10, 1, 28))
    return root


def final_line(capsys: pytest.CaptureFixture[str]) -> dict[str, float]:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def snapshot(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def plot_rows(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Each matplotlib figure saved from now on: its first axes' row labels, as drawn."""
    from matplotlib.figure import Figure

    rows: list[list[str]] = []
    original = Figure.savefig

    def keep(self: Figure, *args: Any, **kwargs: Any) -> None:
        rows.append([t.get_text() for t in self.axes[0].get_yticklabels()])
        original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return rows


def test_an_image_folder_learns_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """recipes/examples/image_folder.yaml on a folder of 400 training and 200 test PNGs (at
    their own 28x28), shrunk to 2 clients and 1 round: far above chance (0.1); only the
    statistics cache is written into the folder, and a data module made afterwards reads it.
    A line says that the weak view flips the images (``data.hflip`` left to its default);
    none where it is set."""
    root = image_folder(tmp_path / "images", train=400, test=200)
    before = snapshot(root)
    args = [
        "fit",
        f"--config={EXAMPLES / 'image_folder.yaml'}",
        f"--data.path={root}",
        "--data.image_size=null",
        "--data.num_clients=2",
        "--data.client_batch_size=32",
        "--data.labeled_per_class=20",
        "--data.val_per_class=0",
        "--federation.rounds=1",
        "--federation.clients_per_round=2",
        "--federation.server_epochs=5",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
    ]
    main(args)
    shown = capsys.readouterr()
    assert json.loads(shown.out.strip().splitlines()[-1])["test/acc"] > 0.6
    # the flips of the weak view, the default for one's own images, said once at the start
    assert shown.err.count("note: data.hflip: the weak view flips your images") == 1
    after = snapshot(root)
    assert set(after) - set(before) == {root / STATS_FILE} and before.items() <= after.items()
    saved = json.loads((root / STATS_FILE).read_text())
    data = FederatedDataModule("folder", path=str(root), labeled_per_class=20)
    assert (data.spec.mean, data.spec.std) == (tuple(saved["mean"]), tuple(saved["std"]))
    assert (data.in_channels, data.spec.size, data.num_classes) == (1, 28, 10)
    assert data.class_names == tuple(f"c{k}" for k in range(10))
    for hflip, lines in ((None, 1), (False, 0), (True, 0)):  # said only for the default
        view = SimpleNamespace(
            data=FederatedDataModule("folder", path=str(root), labeled_per_class=20, hflip=hflip),
            method=ServerSL(Architecture(10, 1)),
        )
        Announce().on_run_start(view)  # type: ignore[arg-type]
        assert capsys.readouterr().err.count("note: data.hflip") == lines


def test_clients_as_folders_learn_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """recipes/examples/client_folders.yaml on 3 clients' folders of 40, 70 and 120 PNGs:
    each client's shard is its folder, no partition/R is measured, and it learns."""
    root = client_folders(tmp_path / "clients")
    run = tmp_path / "run"
    main(
        [
            "fit",
            f"--config={EXAMPLES / 'client_folders.yaml'}",
            f"--data.path={root}",
            "--data.client_batch_size=32",
            "--federation.rounds=1",
            "--federation.clients_per_round=3",
            "--federation.server_epochs=5",
            f"--trainer.default_root_dir={run}",
        ]
    )
    assert final_line(capsys)["test/acc"] > 0.6
    with open(run / "metrics.csv", newline="") as f:
        row0 = next(csv.DictReader(f))
    assert math.isnan(float(row0["partition/R"]))  # no labels to measure it with
    assert float(row0["partition/min_client_size"]) == min(CLIENT_SIZES)
    assert float(row0["partition/max_client_size"]) == max(CLIENT_SIZES)
    assert float(row0["data/server_labeled"]) == 200 - 5 * 10  # all of labeled/ less val
    recorded = yaml.safe_load((run / "hparams.yaml").read_text())  # the folders' number
    assert (recorded["data.num_clients"], recorded["data.examples_per_client"]) == (3, None)

    data = FederatedDataModule(
        "client_folders", path=str(root), labeled_per_class=None, val_per_class=5
    )
    data.setup_federation(0)
    assert [len(c) for c in data.clients] == list(CLIENT_SIZES)
    assert data.class_counts.tolist() == [[n] for n in CLIENT_SIZES]
    pool, _ = synthetic_images(sum(CLIENT_SIZES), 2, 10, 1, 28)
    assert torch.equal(data.clients[1].images, pool[40:110])  # bob's folder, in name order
    assert not data.clients[0].has_labels


def test_arrays_equal_the_same_images_as_a_folder_bit_for_bit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same images as PNG folders and as one .npz (class by class, as the folder is
    read): one round of FedAvg-FixMatch ends at the same weights, bit for bit on CPU."""
    root = image_folder(tmp_path / "images", train=300, test=100)
    x, y = class_major(*synthetic_images(300, 0, 10, 1, 28))
    xt, yt = class_major(*synthetic_images(100, 1, 10, 1, 28))
    npz = tmp_path / "arrays" / "images.npz"
    npz.parent.mkdir()
    np.savez(
        npz, x_train=x[:, 0].numpy(), y_train=y.numpy(), x_test=xt[:, 0].numpy(), y_test=yt.numpy()
    )

    def run(name: str, *data: str) -> dict[str, torch.Tensor]:
        main(
            [
                "fit",
                f"--config={EXAMPLES / 'image_folder.yaml'}",
                *data,
                "--data.image_size=null",
                "--data.num_clients=2",
                "--data.client_batch_size=16",
                "--data.labeled_per_class=5",
                "--data.val_per_class=2",
                "--federation.rounds=1",
                "--federation.clients_per_round=2",
                "--federation.server_epochs=1",
                f"--trainer.default_root_dir={tmp_path / name}",
            ]
        )
        capsys.readouterr()
        return load_checkpoint(tmp_path / name / "checkpoints" / "last.ckpt")["method_state"]

    folder = run("folder", f"--data.path={root}")
    arrays = run("arrays", "--data.dataset=arrays", f"--data.path={npz}")
    assert folder.keys() == arrays.keys()
    for key, value in folder.items():
        assert torch.equal(value, arrays[key]), key
    assert (npz.parent / "images.npz.fedlit-stats.json").is_file()  # beside the file


def test_clients_as_folders_hold_determinism_and_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Clients as folders, 2 rounds: a run stopped as round 2 starts and resumed ends at the
    uninterrupted run's weights (the same seed: the same weights)."""
    root = client_folders(tmp_path / "clients", labeled=100, test=50)
    recipe = [
        "fit",
        f"--config={EXAMPLES / 'client_folders.yaml'}",
        f"--data.path={root}",
        "--data.image_size=null",
        "--data.val_per_class=2",
        "--data.client_batch_size=16",
        "--federation.rounds=2",
        "--federation.clients_per_round=2",
        "--federation.server_epochs=1",
    ]
    whole, part = tmp_path / "whole", tmp_path / "part"
    main([*recipe, f"--trainer.default_root_dir={whole}"])
    undo = stop_in_round(monkeypatch, 2)
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        main([*recipe, f"--trainer.default_root_dir={part}"])
    undo()
    ckpt = part / "checkpoints" / "last.ckpt"
    assert load_checkpoint(ckpt)["round"] == 1
    main([*recipe, f"--trainer.default_root_dir={part}", f"--federation.resume={ckpt}"])
    capsys.readouterr()
    a, b = load_checkpoint(whole / "checkpoints" / "last.ckpt"), load_checkpoint(ckpt)
    assert a["round"] == b["round"] == 2
    for key, value in a["method_state"].items():
        assert torch.equal(value, b["method_state"][key]), key


def test_a_worker_gets_the_shards_without_the_images_read(tmp_path: Path) -> None:
    """What a pool or Ray worker receives, the data module pickled: every client's shard and
    the spec, but not a second copy of the images read (its loader holds none)."""
    root = client_folders(tmp_path / "clients", labeled=50, test=20)
    data = FederatedDataModule(
        "client_folders", path=str(root), num_clients=3, labeled_per_class=None, val_per_class=1
    )
    data.setup_federation(0)
    copy = pickle.loads(pickle.dumps(data))
    assert copy.spec == data.spec
    for k in range(3):
        assert torch.equal(copy.client_data(k).shard.images, data.clients[k].images)
    assert len(pickle.dumps(data.spec)) < 4096
    with pytest.raises(RuntimeError, match="holds no images"):
        copy.spec.loader(root, "train", False)


def test_a_changed_folder_is_recomputed(tmp_path: Path) -> None:
    """The cache holds the statistics of one version of the files: a run's check writes it,
    the next data module reads it, and an added image makes it recompute them."""
    root = image_folder(tmp_path / "images", train=100, test=20)
    first = FederatedDataModule("folder", path=str(root), labeled_per_class=2)
    first.save_statistics()
    cached = json.loads((root / STATS_FILE).read_text())
    (root / STATS_FILE).write_text(json.dumps({**cached, "mean": [0.25]}))  # marked
    assert FederatedDataModule("folder", path=str(root), labeled_per_class=2).spec.mean == (0.25,)
    write_png(torch.full((1, 28, 28), 255, dtype=torch.uint8), str(root / "train/c0/new.png"))
    changed = FederatedDataModule("folder", path=str(root), labeled_per_class=2)
    train = changed.spec.loader(root, "train", False)[0]
    assert len(train) == 101
    assert changed.spec.mean == channel_statistics(train)[0] != (0.25,)
    changed.save_statistics()
    assert json.loads((root / STATS_FILE).read_text())["fingerprint"] != cached["fingerprint"]


def test_statistics_are_the_formulas_bit_for_bit_and_leave_the_images_alone() -> None:
    """channel_statistics scales and squares its float64 copy of a chunk in place (one copy
    of a chunk's size at a time, not three): the same numbers, bit for bit, as the formulas
    written out of place, chunk by chunk over two sets of images; the images are untouched."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (70, 3, 9, 9), generator=g, dtype=torch.uint8)
    more = torch.randint(0, 256, (20, 3, 9, 9), generator=g, dtype=torch.uint8)
    kept = images.clone(), more.clone()
    for chunk in (16, 4096):
        total = torch.zeros(3, dtype=torch.float64)
        squares = torch.zeros_like(total)
        for part in (images, more):
            for start in range(0, len(part), chunk):
                x = part[start : start + chunk].to(torch.float64) / 255
                total += x.sum(dim=(0, 2, 3))
                squares += (x * x).sum(dim=(0, 2, 3))
        n = 90 * 9 * 9
        mean = total / n
        std = ((squares - n * mean * mean) / (n - 1)).clamp_min(0).sqrt()
        expected = (tuple(mean.tolist()), tuple(std.tolist()))
        assert channel_statistics(images, more, chunk=chunk) == expected
    assert torch.equal(images, kept[0]) and torch.equal(more, kept[1])


def test_grey_and_rgb_are_detected_and_sizes_fitted(tmp_path: Path) -> None:
    """A folder with one RGB image among grey ones is RGB (the grey ones repeated to three
    channels); data.image_size resizes (shorter side) and centre-crops every image."""
    root = image_folder(tmp_path / "images", train=40, test=10)
    rgb = torch.zeros(3, 40, 56, dtype=torch.uint8)
    rgb[0] = 200
    write_png(rgb, str(root / "train/c3/zz_rgb.png"))
    data = FederatedDataModule("folder", path=str(root), labeled_per_class=1, image_size=16)
    train, labels = data.spec.loader(root, "train", False)
    assert data.in_channels == 3 and train.shape[1:] == (3, 16, 16)
    last_of_c3 = int(torch.nonzero(labels == 3).max())
    assert train[last_of_c3, 0].eq(200).all() and train[last_of_c3, 1:].eq(0).all()
    grey = train[0]
    assert torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])
    made_rgb = "50 of your data set's images are grey and the others in colour: the data set is RGB"
    assert len(data.notes) == 1 and data.notes[0].startswith(made_rgb)  # 40 + 10 grey, 1 RGB
    again = FederatedDataModule("folder", path=str(root), labeled_per_class=1, image_size=16)
    assert again.notes == data.notes  # read from the cache, said the same
    (root / "train/c3/zz_rgb.png").unlink()
    assert FederatedDataModule("folder", path=str(root), labeled_per_class=1).notes == ()


class PILDataset(Dataset):
    """``(image, label)`` items of PIL images, as torchvision's data sets give them."""

    def __init__(self, images: list[Any], labels: list[int]) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, n: int) -> tuple[Any, int]:
        return self.images[n], self.labels[n]


class LargeImages(Dataset):
    """Colour images of 3x64x64 that count how many of those handed out are still alive
    when the next is asked for."""

    def __init__(self, count: int) -> None:
        self.count, self.handed = count, []  # type: list[weakref.ref[torch.Tensor]]
        self.most_alive = 0

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, n: int) -> tuple[torch.Tensor, int]:
        alive = sum(ref() is not None for ref in self.handed)
        self.most_alive = max(self.most_alive, alive)
        image = torch.full((3, 64, 64), n, dtype=torch.uint8)
        self.handed.append(weakref.ref(image))
        return image, n % 2


def test_a_datasets_images_are_fitted_as_they_are_read() -> None:
    """A Dataset's images are fitted to data.image_size one at a time: no more than the one
    being fitted (and the one just handed out) is alive at its own size."""
    train, test = LargeImages(40), LargeImages(10)
    data = FederatedDataModule(
        train,  # type: ignore[arg-type]
        test_dataset=test,  # type: ignore[arg-type]
        image_size=8,
        num_clients=2,
        labeled_per_class=1,
    )
    assert data.image_shape == (3, 8, 8) and train.most_alive <= 2 and test.most_alive <= 2
    images, labels = data.spec.loader(Path(), "train", False)
    assert images[:, 0, 0, 0].tolist() == list(range(40)) and labels.tolist() == [0, 1] * 20


def test_a_datasets_grey_images_stay_grey_or_are_said_to_be_made_rgb() -> None:
    """A Dataset's grey PIL images (grey modes, and a palette of greys) stay grey; among
    colour ones they are made RGB, and a line says how many."""
    from PIL import Image

    x, y = synthetic_images(60, 0, 10, 1, 28)
    grey = [Image.fromarray(image[0].numpy(), mode="L") for image in x]
    palette = [image.convert("P") for image in grey]  # an adaptive palette of greys
    assert {image.mode for image in palette} == {"P"}
    labels = y.tolist()
    for images in (grey, palette):
        data = FederatedDataModule(
            PILDataset(images, labels),  # type: ignore[arg-type]
            test_dataset=PILDataset(images[:20], labels[:20]),  # type: ignore[arg-type]
            num_clients=2,
            labeled_per_class=1,
        )
        assert data.in_channels == 1 and data.notes == ()
    mixed = [*grey[:-1], grey[-1].convert("RGB").point(lambda v: 255 - v)]
    mixed[-1] = Image.merge("RGB", (mixed[-1].getchannel(0), grey[0], grey[1]))  # in colour
    data = FederatedDataModule(
        PILDataset(mixed, labels),  # type: ignore[arg-type]
        test_dataset=PILDataset(grey[:20], labels[:20]),  # type: ignore[arg-type]
        num_clients=2,
        labeled_per_class=1,
    )
    assert data.in_channels == 3
    assert data.notes == (
        "79 of your data set's images are grey and the others in colour: the data set is "
        "RGB, so those were made RGB (their grey repeated to three channels)",
    )


def test_a_torch_dataset_instance_passes_straight_in(tmp_path: Path) -> None:
    """Two torch Datasets (tensors, here float in [0, 1]) are a data set: the classes from
    the labels, the images as the data module's uint8 tensors."""
    x, y = synthetic_images(200, 0, 10, 1, 28)
    xt, yt = synthetic_images(50, 1, 10, 1, 28)
    data = FederatedDataModule(
        TensorDataset(x.float() / 255, y),  # type: ignore[arg-type]
        test_dataset=TensorDataset(xt, yt),  # type: ignore[arg-type]
        num_clients=2,
        labeled_per_class=3,
    )
    data.setup_federation(0)
    assert (data.dataset, data.num_classes, data.in_channels) == ("TensorDataset", 10, 1)
    assert torch.equal(data.test.images, xt) and torch.equal(data.test.labels, yt)
    assert sum(len(c) for c in data.clients) == 200 - 30


def test_a_torch_dataset_by_class_path_runs_a_round(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torchvision's FakeData (PIL images) by class path through the CLI: one tiny round."""
    fake = "torchvision.datasets.FakeData"
    main(
        [
            "fit",
            f"--config={EXAMPLES / 'image_folder.yaml'}",
            f"--data.dataset={fake}",
            "--data.dataset.size=100",
            "--data.dataset.image_size=[1, 12, 12]",
            f"--data.test_dataset={{class_path: {fake}, init_args: {{random_offset: 7}}}}",
            "--data.test_dataset.init_args.size=20",
            "--data.test_dataset.init_args.image_size=[1, 12, 12]",
            "--data.path=null",
            "--data.image_size=null",
            "--data.num_clients=2",
            "--data.labeled_per_class=1",
            "--data.val_per_class=0",
            "--federation.rounds=1",
            "--federation.clients_per_round=2",
            "--federation.server_epochs=1",
            f"--trainer.default_root_dir={tmp_path / 'run'}",
        ]
    )
    assert 0 <= final_line(capsys)["test/acc"] <= 1
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert fake in saved  # the run's config names the data set's class


def test_fedlit_partition_on_clients_as_folders_and_an_image_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fedlit partition``: clients as folders show their folders' sizes under their names,
    in the printed counts and on the plot's rows, and say that no R is measured (and that a
    given data.num_clients is not used); an image folder is divided by the recipe's
    partitioner (named with its parameters), its R measured, its plot's rows numbered."""
    rows = plot_rows(monkeypatch)
    clients = client_folders(tmp_path / "clients", labeled=100, test=20)
    main(
        [
            "partition",
            f"--config={EXAMPLES / 'client_folders.yaml'}",
            f"--data.path={clients}",
            "--data.num_clients=10",
            f"--out={tmp_path / 'clients.png'}",
        ]
    )
    said = capsys.readouterr()
    assert "note: data.num_clients=10 not used: with data.dataset='client_folders'" in said.err
    shown = json.loads(said.out.strip().splitlines()[-1])
    assert shown["title"] == "client_folders: the clients' own folders (no labels: R not measured)"
    names = ("alice", "bob", "carol")  # the folders' names, in their order
    assert shown["class_counts"] == {name: [n] for name, n in zip(names, CLIENT_SIZES, strict=True)}
    assert (tmp_path / "clients.png").is_file()
    images = image_folder(tmp_path / "images", train=200, test=20)
    main(
        [
            "partition",
            f"--config={EXAMPLES / 'image_folder.yaml'}",
            f"--data.path={images}",
            "--data.num_clients=2",
            "--data.labeled_per_class=5",
            "--data.partitioner=Dirichlet",
            "--data.partitioner.alpha=0.1",
            f"--out={tmp_path / 'images.png'}",
        ]
    )
    shown = final_line(capsys)
    assert shown["title"].startswith("folder, Dirichlet(alpha=0.1): R = ")
    assert shown["partition/R"] > 0.3
    assert sum(sum(row) for row in shown["class_counts"].values()) == 200 - 50 - 100
    assert rows == [list(names), ["0", "1"]]


def test_a_runs_partition_image_names_the_client_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partition plot a run logs as an image (W&B) has the client folders' names on its
    rows, as ``fedlit partition``'s has."""
    from fedlit.federation.callbacks import PartitionImage

    rows = plot_rows(monkeypatch)
    root = client_folders(tmp_path / "clients", labeled=100, test=20)
    data = FederatedDataModule("client_folders", path=str(root), labeled_per_class=None)
    data.setup_federation(0)
    logged: list[tuple[str, list[str], int]] = []

    class Imaging:  # a logger that takes images, as W&B's does
        def log_image(self, key: str, images: list[str], step: int) -> None:
            logged.append((key, images, step))

    run = SimpleNamespace(data=data, run_dir=tmp_path / "run")
    PartitionImage([Imaging()]).on_first_row(run, {})
    assert rows == [["alice", "bob", "carol"]]
    assert logged == [("partition", [str(tmp_path / "run" / "partition.png")], 0)]


def test_partitioners_labels_at_client_and_streaming_work_unchanged(tmp_path: Path) -> None:
    """On an image folder: a Dirichlet partition, labels dealt to the clients; on clients as
    folders: each folder streamed in file-name order."""
    root = image_folder(tmp_path / "images", train=300, test=20)
    skewed = FederatedDataModule(
        "folder",
        path=str(root),
        num_clients=3,
        labeled_per_class=3,
        partitioner=Dirichlet(alpha=0.1),
        labels_at="client",
    )
    skewed.setup_federation(0)
    assert skewed.non_iid_R > 0.3 and len(skewed.server) == 0
    assert sum(len(c) for c in skewed.pool.labeled) == 30 and all(
        len(c) == 10 for c in skewed.pool.labeled
    )
    assert sum(len(c) for c in skewed.clients) == 270
    clients = client_folders(tmp_path / "clients", labeled=50, test=20)
    streamed = FederatedDataModule(
        "client_folders",
        path=str(clients),
        num_clients=3,
        labeled_per_class=None,
        val_per_class=0,
        stream_steps=2,
    )
    streamed.setup_federation(0)
    pool, _ = synthetic_images(sum(CLIENT_SIZES), 2, 10, 1, 28)
    assert torch.equal(streamed.client_shard(0, visit=1).images, pool[:20])
    assert torch.equal(streamed.client_shard(0, visit=2).images, pool[20:40])
    assert torch.equal(streamed.client_shard(2, visit=3).images, pool[110:170])


def test_a_pt_file_holds_the_same_arrays_as_an_npz(tmp_path: Path) -> None:
    """Arrays in a .pt file (loaded with weights_only=True), RGB as (N, H, W, C) with class
    names, read as the .npz of the same arrays is."""
    x, y = synthetic_images(60, 0, 10, 3, 32)
    xt, yt = synthetic_images(20, 1, 10, 3, 32)
    arrays = {"x_train": x.permute(0, 2, 3, 1), "y_train": y, "x_test": xt.permute(0, 2, 3, 1)}
    arrays["y_test"] = yt
    names = [f"class {k}" for k in range(10)]
    torch.save({**arrays, "classes": names}, tmp_path / "images.pt")
    np.savez(
        tmp_path / "images.npz",
        classes=np.array(names),
        **{k: v.numpy() for k, v in arrays.items()},
    )
    pt = FederatedDataModule("arrays", path=str(tmp_path / "images.pt"), labeled_per_class=1)
    npz = FederatedDataModule("arrays", path=str(tmp_path / "images.npz"), labeled_per_class=1)
    assert pt.spec == npz.spec and pt.class_names == tuple(names) and pt.in_channels == 3
    for split in ("train", "test"):
        images, labels = pt.spec.loader(tmp_path, split, False)
        assert torch.equal(images, x if split == "train" else xt)
        assert torch.equal(labels, npz.spec.loader(tmp_path, split, False)[1])


def test_a_class_too_small_for_the_split_is_named_by_its_folder(tmp_path: Path) -> None:
    """A message about one class of the user's folder names it by its folder, beside its
    number."""
    images = image_folder(tmp_path / "images", train=100, test=20)  # 10 images a class
    with pytest.raises(ValueError, match=r"labeled_per_class=30 .*class 0 \('c0'\) of folder"):
        FederatedDataModule(dataset="folder", path=str(images), labeled_per_class=30)


def test_image_files_are_in_path_order_and_the_fingerprint_follows_every_file(
    tmp_path: Path,
) -> None:
    """Images under a folder come in the order their paths sort in, part by part (a
    sub-folder ``a`` before ``a-b``, which sorts first as a string), hidden ones left out; the
    fingerprint changes with a file's size and with a renamed file."""
    names = ["a-b/x.png", "a/b.png", "a/c d.png", "a.b/z.png", "ab.png", "a/b/c.png", ".h/i.png"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    files = image_files(tmp_path)
    expected = sorted(Path(tmp_path / n) for n in names if not n.startswith("."))
    assert files == expected
    first = ["a/b/c.png", "a/b.png", "a/c d.png"]
    assert [str(f.relative_to(tmp_path)) for f in files][:3] == first
    before = fingerprint(files, tmp_path, 28)
    (tmp_path / "ab.png").write_bytes(b"xy")
    assert fingerprint(files, tmp_path, 28) != before
    grown = fingerprint(files, tmp_path, 28)
    (tmp_path / "ab.png").rename(tmp_path / "ac.png")
    assert fingerprint(image_files(tmp_path), tmp_path, 28) != grown
