"""The cache of the user's decoded images (:mod:`fedlit.data.own.cache`), on real JPEG and
PNG files written here: written once under ``<data.root>/fedlit-cache`` and read after without
decoding, a new one for a changed, added or removed file, never read half-written, the same
tensors as decoding into memory; and a split over its cap, memory-mapped, trains to the
weights the in-memory split does."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import tiny_overrides
from filelock import FileLock
from torchvision.io import encode_jpeg, write_file, write_png

from fedlit.cli import main
from fedlit.data import FederatedDataModule
from fedlit.data.mapped import MappedImages, as_tensor
from fedlit.data.own import decode as decode_module
from fedlit.data.own.cache import CACHE_FOLDER, ImageCache, content_key
from fedlit.data.own.folders import FolderListing, folder_splits, list_folders, read_folders
from fedlit.data.own.statistics import file_stamps
from fedlit.data.own.stored import STAGE_LIMIT_ENV
from fedlit.data.sources import Clients, make_source
from fedlit.federation.callbacks import Announce
from fedlit.federation.checkpoint import load_checkpoint
from fedlit.methods import ServerSL
from fedlit.models import Architecture

EXAMPLES = Path(__file__).parents[1] / "recipes" / "examples"
SIZE = 16


def photo(seed: int, height: int, width: int) -> torch.Tensor:
    """An RGB image (3, H, W) uint8 with structure a resize keeps (smooth gradients, noise)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.linspace(0, 1, height)[:, None]
    x = torch.linspace(0, 1, width)[None, :]
    noise = torch.rand(3, height, width, generator=g) * 55
    base = torch.stack(torch.broadcast_tensors(y * x, 1 - y, x)) * 200 + noise
    return base.to(torch.uint8)


def photo_folder(root: Path, per_class: int = 6, test: int = 2) -> Path:
    """A ``folder`` data set of JPEGs (and one PNG per class) of several sizes, 3 classes."""
    for split, count in (("train", per_class), ("test", test)):
        for c in range(3):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for n in range(count):
                image = photo(100 * c + n + (0 if split == "train" else 50), 40 + 4 * n, 56)
                if n == 0:
                    write_png(image, str(folder / f"{n:03d}.png"))
                else:
                    write_file(str(folder / f"{n:03d}.jpg"), encode_jpeg(image, quality=90))
    return root


def made(root: Path, data_root: Path, **kwargs: object) -> FederatedDataModule:
    settings: dict[str, object] = {"image_size": SIZE, "labeled_per_class": 2, "num_clients": 2}
    return FederatedDataModule(
        "folder",
        root=str(data_root),
        path=str(root),
        **settings | kwargs,  # type: ignore[arg-type]
    )


def caches(data_root: Path) -> list[Path]:
    return sorted(p for p in (data_root / CACHE_FOLDER).iterdir() if p.is_dir())


def splits(data: FederatedDataModule) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    out = {}
    for split in ("train", "test"):
        images, labels = data.spec.loader(Path(), split, False)
        out[split] = (as_tensor(images), labels)
    return out


def cache_of(listing: FolderListing, data_root: Path, size: int = SIZE) -> ImageCache:
    """The cache ``listing``'s data set is read through under ``data_root``."""
    files, labels, extra = folder_splits(listing)
    stamps = {split: file_stamps(names, listing.root) for split, names in files.items()}
    content = content_key(stamps, labels, size, extra)
    return ImageCache.of(data_root / CACHE_FOLDER, listing.kind, listing.path, content)


def no_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any image decoded from now on fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("an image was decoded")

    monkeypatch.setattr(decode_module, "decode_image", refuse)


def test_decoded_once_then_read_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first data module decodes into one cache folder under data.root (the data folder
    gets no file but the statistics'), holding the tensors decoding into memory gives; a
    second one reads it and decodes nothing."""
    root, data_root = photo_folder(tmp_path / "photos"), tmp_path / "data"
    before = sorted(root.rglob("*"))
    first = made(root, data_root)
    assert sorted(root.rglob("*")) == before
    [folder] = caches(data_root)
    assert sorted(p.name for p in folder.iterdir()) == [
        "meta.json", "test-labels.npy", "test.npy", "train-labels.npy", "train.npy",
    ]  # fmt: skip
    assert np.load(folder / "train.npy", mmap_mode="r").shape == (18, 3, SIZE, SIZE)
    in_memory = read_folders(list_folders("folder", root), SIZE)[1]
    for split, (images, labels) in splits(first).items():
        expected, expected_labels = in_memory(Path(), split, False)
        assert torch.equal(images, as_tensor(expected)) and torch.equal(labels, expected_labels)
    assert first.in_channels == 3 and first.spec.size == SIZE

    no_decoding(monkeypatch)
    second = made(root, data_root)
    assert caches(data_root) == [folder]
    for split, (images, labels) in splits(second).items():
        assert torch.equal(images, splits(first)[split][0])
        assert torch.equal(labels, splits(first)[split][1])
    assert second.spec == first.spec


def test_a_changed_added_or_removed_file_is_a_new_cache(tmp_path: Path) -> None:
    """Each change to the files gives a cache of its own, holding the files as they are, which
    replaces the one before; a cache of the same files at another size stays."""
    root, data_root = photo_folder(tmp_path / "photos"), tmp_path / "data"
    made(root, data_root)
    other_size = made(root, data_root, image_size=SIZE // 2).spec.size
    assert other_size == SIZE // 2 and len(caches(data_root)) == 2
    target = root / "train" / "class1" / "002.jpg"
    write_file(str(target), encode_jpeg(torch.zeros(3, 40, 40, dtype=torch.uint8)))
    os.utime(target, ns=(time.time_ns(), time.time_ns() + 10**9))
    before = set(caches(data_root))
    changed = splits(made(root, data_root))["train"][0]
    assert len(caches(data_root)) == 2 and len(set(caches(data_root)) - before) == 1
    assert changed[6 + 2].eq(0).all()  # class 1's third image, now black
    write_png(torch.full((3, 20, 20), 255, dtype=torch.uint8), str(root / "train/class2/x.png"))
    assert len(splits(made(root, data_root))["train"][0]) == 19
    (root / "train" / "class0" / "001.jpg").unlink()
    (root / "train" / "class2" / "x.png").unlink()
    assert len(splits(made(root, data_root))["train"][0]) == 17
    kept = [json.loads((c / "meta.json").read_text())["image_size"] for c in caches(data_root)]
    assert sorted(kept) == [SIZE // 2, SIZE]


def test_the_cache_of_a_folder_that_is_gone_is_removed_unless_held(tmp_path: Path) -> None:
    """Writing a cache removes those of data sets whose folders are gone (and their locks),
    but not one another run holds; other data sets' caches stay."""
    data_root = tmp_path / "data"
    gone, held, kept = (photo_folder(tmp_path / name) for name in ("gone", "held", "kept"))
    for root in (gone, held, kept):
        made(root, data_root)
    by_name = {c.name.split("-")[1]: c for c in caches(data_root)}
    shutil.rmtree(gone)
    shutil.rmtree(held)
    lock = FileLock(data_root / CACHE_FOLDER / f".{by_name['held'].name}.lock")
    with lock:
        made(photo_folder(tmp_path / "new"), data_root)
    names = {c.name.split("-")[1] for c in caches(data_root)}
    assert names == {"held", "kept", "new"}
    assert not (data_root / CACHE_FOLDER / f".{by_name['gone'].name}.lock").exists()


def test_a_half_written_cache_is_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer's leftover temporary folder is not read (and is removed by the next writer);
    a cache folder without its meta is written again; images decoded every time."""
    root, data_root = photo_folder(tmp_path / "photos"), tmp_path / "data"
    expected = splits(FederatedDataModule(
        "folder", root=str(tmp_path / "other"), path=str(root), image_size=SIZE,
        labeled_per_class=2, num_clients=2,
    ))  # fmt: skip
    cache = cache_of(list_folders("folder", root), data_root)
    leftover = cache.root / f".{cache.name}.tmp-killed"
    leftover.mkdir(parents=True)
    np.save(leftover / "train.npy", np.zeros((18, 3, SIZE, SIZE), dtype=np.uint8))
    cache.folder.mkdir()
    np.save(cache.folder / "train.npy", np.zeros((18, 3, SIZE, SIZE), dtype=np.uint8))
    data = made(root, data_root)
    assert not leftover.exists() and (cache.folder / "meta.json").is_file()
    for split, (images, labels) in splits(data).items():
        assert torch.equal(images, expected[split][0]) and torch.equal(labels, expected[split][1])


CONCURRENT = """
import hashlib, sys
from fedlit.data import FederatedDataModule
data = FederatedDataModule("folder", root=sys.argv[1], path=sys.argv[2], image_size=16,
                           labeled_per_class=2, num_clients=2)
images = data.spec.loader(None, "train", False)[0]
print(hashlib.sha256(images.numpy().tobytes()).hexdigest())
"""


def test_runs_side_by_side_write_one_cache(tmp_path: Path) -> None:
    """Two processes making the data module at once: one writes the cache, the other waits
    for it (or finds it), and both hold the same images."""
    root, data_root = photo_folder(tmp_path / "photos", per_class=20), tmp_path / "data"
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT, str(data_root), str(root)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    digests = {run.communicate(timeout=300)[0].strip() for run in runs}
    assert all(run.returncode == 0 for run in runs)
    assert len(digests) == 1
    assert len(caches(data_root)) == 1
    assert not [p for p in (data_root / CACHE_FOLDER).iterdir() if ".tmp-" in p.name]


def test_a_split_over_its_cap_is_mapped_and_trains_to_the_same_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """FEDLIT_STAGE_LIMIT_BYTES a third of the training split: the splits are memory-mapped,
    batches read from the file, and one round of FedAvg-FixMatch ends at the weights of the
    run whose splits are in memory, bit for bit on CPU."""
    root = photo_folder(tmp_path / "photos", per_class=40, test=10)
    data_root = tmp_path / "data"

    def run(name: str) -> dict[str, torch.Tensor]:
        main(
            [
                "fit",
                f"--config={EXAMPLES / 'image_folder.yaml'}",
                f"--data.path={root}",
                f"--data.image_size={SIZE}",
                *tiny_overrides(data_root, test_subset=30),  # the folder's 30 test images
                f"--trainer.default_root_dir={tmp_path / name}",
            ]
        )
        capsys.readouterr()
        return load_checkpoint(tmp_path / name / "checkpoints" / "last.ckpt")["method_state"]

    staged = run("staged")
    train_bytes = as_tensor(made(root, data_root).spec.loader(Path(), "train", False)[0]).nbytes
    monkeypatch.setenv(STAGE_LIMIT_ENV, str(train_bytes // 3))
    data = made(root, data_root)
    assert isinstance(data.spec.loader(Path(), "train", False)[0], MappedImages)
    data.setup_federation(0)
    assert isinstance(data.clients[0].images, MappedImages)
    assert isinstance(data.server.images, MappedImages)
    reads = []
    read = MappedImages.read
    monkeypatch.setattr(MappedImages, "read", lambda self: reads.append(len(self)) or read(self))
    mapped = run("mapped")
    assert reads  # batches were read from the file
    assert staged.keys() == mapped.keys()
    for key, value in staged.items():
        assert torch.equal(value, mapped[key]), key


def test_client_folders_take_their_own_sizes_from_a_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A recipe written for a built-in data set (``examples_per_client``, ten clients) used on
    three client folders: the clients are the folders, each holding its whole folder, found
    from a listing (no image decoded), and one line at the run's start says which given
    settings were not used; none where they are left unset."""
    root = tmp_path / "mine"
    for split in ("labeled", "test"):
        for c in range(3):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            write_png(photo(c, SIZE, SIZE), str(folder / "0.png"))
    for name in ("ada", "bo", "cy"):
        (root / "clients" / name).mkdir(parents=True)
        write_png(photo(7, SIZE, SIZE), str(root / "clients" / name / "0.png"))
    source = make_source("client_folders", str(root), None, None, tmp_path / "data")
    no_decoding(monkeypatch)
    clients = source.clients(10, 1200)
    assert (clients.count, clients.examples_per_client) == (3, None)
    assert clients.note == (
        "data.num_clients=10 and data.examples_per_client=1200 not used: with "
        "data.dataset='client_folders' the clients are the 3 client folders of "
        f"{root / 'clients'}, each holding its whole folder"
    )
    assert source.clients(None, None) == Clients(3, None) and source.clients(3, None).note is None
    assert not (tmp_path / "data").exists()
    monkeypatch.undo()
    data = FederatedDataModule(
        "client_folders",
        root=str(tmp_path / "data"),
        path=str(root),
        num_clients=10,
        examples_per_client=1200,
        labeled_per_class=None,
    )
    assert (data.num_clients, data.examples_per_client, data.notes) == (3, None, (clients.note,))
    view = SimpleNamespace(data=data, method=ServerSL(Architecture(3, 3)))
    Announce().on_run_start(view)  # type: ignore[arg-type]
    assert capsys.readouterr().err.count(f"note: {clients.note}") == 1


def test_a_folders_sizes_are_refused_before_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A labeled set larger than a class, or clients larger than the pool, are refused from a
    listing of the folder, naming the key and the class: no image decoded, nothing written
    under ``data.root``."""
    root = tmp_path / "mine"
    for split, count in (("train", 6), ("test", 1)):
        for c in range(2):
            folder = root / split / f"cat{c}"
            folder.mkdir(parents=True)
            for n in range(count):
                write_png(photo(c + n, SIZE, SIZE), str(folder / f"{n}.png"))
    no_decoding(monkeypatch)
    data_root = tmp_path / "data"
    given = {"root": str(data_root), "path": str(root), "image_size": SIZE}
    too_many = r"labeled_per_class=7 .*class 0 \('cat0'\) of folder has \(6\)"
    with pytest.raises(ValueError, match=too_many):
        FederatedDataModule("folder", **given, labeled_per_class=7)
    too_large = r"= 9 exceeds the 8 .*examples_per_client=null to divide them all \(about 2 "
    with pytest.raises(ValueError, match=too_large):
        FederatedDataModule(
            "folder", **given, labeled_per_class=2, num_clients=3, examples_per_client=3
        )
    assert not data_root.exists()


def test_the_draw_holds_the_only_copy_of_the_splits_read_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data set read from the cache hands its splits over to the draw: once drawn, the
    split read is freed (the clients' shards and the server's sets are the run's only copy of
    its images); a second draw reads the cache again, without decoding, and is the draw a
    fresh data module makes. A cache gone meanwhile is named."""
    root, data_root = photo_folder(tmp_path / "photos"), tmp_path / "data"
    made(root, data_root)  # writes the cache: the data module below reads it
    data = made(root, data_root)
    read = data.user_data
    train = weakref.ref(read.images("train"))
    data.setup_federation(0)
    gc.collect()
    assert train() is None
    no_decoding(monkeypatch)
    for seed in (0, 1):
        data.setup_federation(seed)
        fresh = made(root, data_root)
        fresh.setup_federation(seed)
        for ours, theirs in zip([data.server, data.test, *data.clients], [
            fresh.server, fresh.test, *fresh.clients
        ], strict=True):  # fmt: skip
            assert torch.equal(ours.images, theirs.images)
            assert torch.equal(ours.labels, theirs.labels)
    [folder] = caches(data_root)
    shutil.rmtree(folder)
    with pytest.raises(RuntimeError, match=f"the image cache {folder} cannot be read again"):
        data.setup_federation(0)


def test_clients_folders_read_from_the_cache_are_handed_over_too(tmp_path: Path) -> None:
    """Clients as folders: the clients' images read from the cache go to the draw, whose
    shards are their only copy; read again, they are the same."""
    root = tmp_path / "mine"
    for split in ("labeled", "test"):
        for c in range(3):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for n in range(3):
                write_png(photo(10 * c + n, SIZE, SIZE), str(folder / f"{n}.png"))
    for k, name in enumerate(("ada", "bo")):
        (root / "clients" / name).mkdir(parents=True)
        for n in range(2 + k):
            write_png(photo(50 + 10 * k + n, SIZE, SIZE), str(root / "clients" / name / f"{n}.png"))

    def client_data() -> FederatedDataModule:
        data = FederatedDataModule(
            "client_folders",
            root=str(tmp_path / "data"),
            path=str(root),
            num_clients=2,
            labeled_per_class=None,
        )
        data.setup_federation(0)
        return data

    client_data()  # writes the cache
    data = client_data()
    assert data.user_data._clients is None  # handed over to the shards
    before = [shard.images for shard in data.clients]
    assert [len(images) for images in data.user_data.clients] == [2, 3]
    data.setup_federation(0)
    for images, again in zip(before, data.clients, strict=True):
        assert torch.equal(images, again.images)


def _meta_without_test(folder: Path) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    del meta["splits"]["test"]
    (folder / "meta.json").write_text(json.dumps(meta))


def _pixels_overwritten(folder: Path) -> None:
    """``train.npy``'s pixels overwritten with random bytes, its header (and size) intact."""
    array = np.load(folder / "train.npy", mmap_mode="r+")
    array[:] = np.random.default_rng(0).integers(0, 256, array.shape, dtype=np.uint8)
    array.flush()


#: (how the cache is damaged, why the line says it is written again, a stage limit: mapped)
DAMAGE = {
    "zero-byte split": (
        lambda f: (f / "train.npy").write_bytes(b""),
        "train.npy: No data left in file",
        None,
    ),
    "zero-byte labels": (
        lambda f: (f / "test-labels.npy").write_bytes(b""),
        "test-labels.npy: No data left in file",
        None,
    ),
    "splits lack test": (_meta_without_test, "its splits are {'train': 18}, the data", None),
    "pixels overwritten": (
        _pixels_overwritten,
        "train.npy: its checksum is not the one written",
        None,
    ),
    "pixels overwritten, mapped": (_pixels_overwritten, "train.npy: its checksum is not", "1000"),
}


@pytest.mark.parametrize(("damage", "why", "limit"), DAMAGE.values(), ids=list(DAMAGE))
def test_a_damaged_cache_is_written_again_with_a_line_saying_why(
    damage: Callable[[Path], None],
    why: str,
    limit: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A cache whose file is empty (an EOFError's traceback before), whose meta.json lacks a
    split (a KeyError's) or whose pixels were overwritten, its header intact (trained on
    without a word before; in memory or mapped): decoded again into the cache, one line
    naming it and why, the images those of the clean cache; the cache written is read after
    without a line and without decoding."""
    if limit is not None:
        monkeypatch.setenv(STAGE_LIMIT_ENV, limit)
    root, data_root = photo_folder(tmp_path / "photos"), tmp_path / "data"
    clean = splits(made(root, data_root))
    [folder] = caches(data_root)
    damage(folder)
    capsys.readouterr()
    again = splits(made(root, data_root))
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert len(notes) == 1 and notes[0].startswith(f"note: the image cache {folder} cannot be")
    assert why in notes[0] and notes[0].endswith("): decoding the images again")
    no_decoding(monkeypatch)
    third = splits(made(root, data_root))
    assert "note:" not in capsys.readouterr().err
    for split, (images, labels) in clean.items():
        for got in (again, third):
            assert torch.equal(got[split][0], images) and torch.equal(got[split][1], labels)


def test_a_split_changed_while_a_run_holds_it_is_named_when_read_again(tmp_path: Path) -> None:
    """A split whose pixels change after the data module read it: its second draw, which
    reads the cache again, stops naming the cache and the file, rather than draw from them."""
    root, data_root = photo_folder(tmp_path / "photos"), tmp_path / "data"
    made(root, data_root)
    data = made(root, data_root)
    data.setup_federation(0)
    [folder] = caches(data_root)
    _pixels_overwritten(folder)
    with pytest.raises(
        RuntimeError, match=f"{folder} cannot be read again \\(train.npy: its checksum"
    ):
        data.setup_federation(1)


def _relabelled(listing: FolderListing, kind: str) -> FolderListing:
    """``listing`` as a source of ``kind`` that maps its classes otherwise: class k is k + 1
    (the last, 0), the same files in the same order."""
    n = len(listing.classes)
    return replace(
        listing,
        kind=kind,
        train=[((label + 1) % n, files) for label, files in listing.train],
        test=[((label + 1) % n, files) for label, files in listing.test],
    )


def test_a_relabel_is_a_new_cache_never_stale_labels(tmp_path: Path) -> None:
    """The cache is keyed by the labels as well as the files: the same image files listed
    with other labels (a source that maps its classes otherwise) are read through a new
    cache holding the new labels, and the old one, now stale, is removed; the first cache
    never serves the old labels."""
    root, data_root = photo_folder(tmp_path / "photos"), tmp_path / "data"
    listing = list_folders("folder", root)
    read_folders(listing, SIZE, data_root / CACHE_FOLDER)
    [first] = caches(data_root)
    relabelled = _relabelled(listing, "folder")
    _, read = read_folders(relabelled, SIZE, data_root / CACHE_FOLDER)
    [second] = caches(data_root)
    assert second != first
    counts = {"train": 18, "test": 6}
    cached = cache_of(relabelled, data_root).read(counts)
    assert cached is not None and cache_of(relabelled, data_root).folder == second
    for split, folders in (("train", relabelled.train), ("test", relabelled.test)):
        expected = torch.tensor([label for label, files in folders for _ in files])
        assert torch.equal(cached.labels[split], expected)
        assert torch.equal(read(Path(), split, False)[1], expected)
    assert torch.equal(cached.labels["train"][:6], torch.full((6,), 1))


def test_two_kinds_over_one_folder_keep_their_own_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sources over one folder (the ``folder`` kind and one that labels its files
    otherwise) each write a cache of their own and neither removes the other's: a third read
    of either decodes nothing."""
    root, data_root = photo_folder(tmp_path / "photos"), tmp_path / "data"
    listing = list_folders("folder", root)
    other = _relabelled(listing, "relabelled")
    read_folders(listing, SIZE, data_root / CACHE_FOLDER)
    read_folders(other, SIZE, data_root / CACHE_FOLDER)
    assert len(caches(data_root)) == 2
    for each in (listing, other):
        assert cache_of(each, data_root).read({"train": 18, "test": 6}) is not None
    no_decoding(monkeypatch)
    for each in (listing, other, listing):
        _, read = read_folders(each, SIZE, data_root / CACHE_FOLDER)
        expected = torch.tensor([label for label, files in each.train for _ in files])
        assert torch.equal(read(Path(), "train", False)[1], expected)
    assert len(caches(data_root)) == 2


def test_two_listings_in_one_folder_keep_their_own_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two listings of one kind in one folder (two CSV files, say, each its listing's source)
    are read in turn: each keeps a cache and a statistics file of its own, named by its
    source; neither removes the other's, so from the third read on nothing is decoded."""
    root, data_root = photo_folder(tmp_path / "photos"), tmp_path / "data"
    listing = list_folders("folder", root)
    for name in ("a.csv", "b.csv"):
        (root / name).write_text("the rows a source reads\n")
    a = replace(listing, kind="listed", source=root / "a.csv")
    b = replace(_relabelled(listing, "listed"), source=root / "b.csv")
    for each in (a, b):
        read_folders(each, SIZE, data_root / CACHE_FOLDER)[1].save_statistics()
    assert caches(data_root) == sorted(cache_of(each, data_root).folder for each in (a, b))
    assert (root / "a.csv.fedlit-stats.json").is_file()
    assert (root / "b.csv.fedlit-stats.json").is_file()
    no_decoding(monkeypatch)
    for each in (a, b, a, b):
        _, read = read_folders(each, SIZE, data_root / CACHE_FOLDER)
        expected = torch.tensor([label for label, files in each.train for _ in files])
        assert torch.equal(read(Path(), "train", False)[1], expected)
    assert len(caches(data_root)) == 2


def test_a_cache_of_an_older_version_is_replaced(tmp_path: Path) -> None:
    """A cache an older fedlit wrote of the same folder (version 2: no kind in its meta.json)
    is not read, and is removed once this version's is written."""
    root, data_root = photo_folder(tmp_path / "photos"), tmp_path / "data"
    listing = list_folders("folder", root)
    read_folders(listing, SIZE, data_root / CACHE_FOLDER)
    [ours] = caches(data_root)
    older = ours.with_name("folder-photos-0123456789-0123456789abcdef")
    ours.rename(older)
    meta = json.loads((older / "meta.json").read_text())
    del meta["kind"]
    (older / "meta.json").write_text(json.dumps({**meta, "version": 2}))
    read_folders(listing, SIZE, data_root / CACHE_FOLDER)
    assert caches(data_root) == [ours]
