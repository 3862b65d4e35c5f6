"""A folder of images read through the image cache: peak memory and the data's set-up time.

Two data sets, each written as a ``folder`` data set (``train/<class>/*`` and
``test/<class>/*``) in a temporary folder:

- by default, ``--images`` JPEGs of 1024x768 (10 classes, a tenth of them the test split),
  trained at ``--image_size`` (64). Only the first ``--distinct`` (2,200) are encoded, from
  random pictures; every later file is a copy of an earlier one (file ``n`` of file
  ``n % distinct``), so that 20,000 are written in about the time 2,200 take. The cache's
  fingerprint reads the files' names, sizes and modification times, never their content,
  and decoding a copy costs what decoding its original does: for memory and decoding time
  the copies are as good as distinct pictures. The default 2,200 are all distinct (the same
  files as before ``--distinct`` existed);
- with ``--fashion``, Fashion-MNIST's 70,000 images (60,000 train, 10,000 test; the first
  ``--fashion_limit`` of each split for a quick check) as greyscale PNGs of 28x28, in class
  folders named ``<label>-<class>``, trained at their own size (``--image_size`` 28: no
  resize; the recipe's 32 would resize every image). They are read as fedlit reads its
  built-in ``fashion_mnist`` (:func:`fedlit.data.datasets.load_split`: Debian's
  ``dataset-fashion-mnist`` files staged offline into ``--fashion_root``, a temporary data
  root by default, or a root that holds ``FashionMNIST/raw`` already).

Then ``fedlit fit`` runs on them (recipes/examples/image_folder.yaml, one short round: 2
clients, 5 labeled images a class, no validation set, 100 test images, 2 local steps, one
server epoch) in a child process for each case:

- first run, decoding in this process alone (``FEDLIT_DECODE_WORKERS=1``), a fresh ``data.root``;
- first run, decoding in 2 worker processes, another fresh ``data.root``;
- second run, the same files and size: read from the 2-worker run's cache.

Before each first run the folder's statistics file (``fedlit-stats.json``, which a run writes
beside the images) is removed, so that both first runs compute the statistics as a first run
does; the second run reads them, as a second run does.

For each case it prints the child's peak resident memory (its ``VmHWM``, read by the child as
it ends), in GiB (2**30 bytes) and in GB (10**9 bytes): the decoding workers, forked from
it and sharing its pages, are not in it (each holds its own image being decoded and up to two
chunks of 8 MiB it hands back); the data's set-up time (making
the data module: decoding or reading the cache, and the statistics) and the whole run's time;
then the set-up of 2 decoding workers against 1, and of the second run against the first.

    python benchmarks/image_cache.py                          # 2,200 JPEGs, as in the targets
    python benchmarks/image_cache.py --images 20000           # the larger target
    python benchmarks/image_cache.py --fashion                # 70,000 PNGs, the cache's speed-up
    python benchmarks/image_cache.py --images 300             # quick checks
    python benchmarks/image_cache.py --fashion --fashion_limit 2000
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as nnf
from torchvision.io import encode_jpeg, encode_png, write_file

from fedlit.data.datasets import dataset_spec, load_split
from fedlit.data.own.statistics import STATS_FILE

RECIPE = Path(__file__).parents[1] / "recipes" / "examples" / "image_folder.yaml"
CLASSES = 10
GiB, GB = 2**30, 10**9
TAGS = ("SETUP ", "PEAK ")

#: The child: ``fedlit fit`` with the data module's making timed, and its own peak resident
#: memory (``VmHWM``) at the end, printed to stderr.
CHILD = """
import functools, sys, time
from fedlit.data import datamodule
made = datamodule.FederatedDataModule.__init__
@functools.wraps(made)
def timed(self, *args, **kwargs):
    start = time.perf_counter()
    made(self, *args, **kwargs)
    print(f"SETUP {time.perf_counter() - start:.3f}", file=sys.stderr, flush=True)
datamodule.FederatedDataModule.__init__ = timed
from fedlit.cli import main
try:
    main(sys.argv[1:])
finally:
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    print(f"PEAK {peak}", file=sys.stderr, flush=True)
"""


def make_images(folder: Path, count: int, distinct: int = 2200, seed: int = 0) -> int:
    """``count`` JPEGs of 1024x768 under ``folder/train/<class>`` and ``folder/test/<class>``:
    the first ``distinct`` encoded (a smooth random picture and noise, quality 75), each later
    one a copy of file ``n % distinct`` (copied on disk: no bytes held here); returns their
    bytes on disk."""
    g = torch.Generator().manual_seed(seed)
    written: list[Path] = []
    total = 0
    for n in range(count):
        split = "test" if (n // CLASSES) % 10 == 9 else "train"
        target = folder / split / f"class{n % CLASSES}"
        target.mkdir(parents=True, exist_ok=True)
        path = target / f"{n:06d}.jpg"
        if n < distinct:
            coarse = torch.rand(1, 3, 12, 16, generator=g)
            image = nnf.interpolate(coarse, size=(768, 1024), mode="bilinear", align_corners=False)
            image = image[0] * 240 + torch.rand(3, 768, 1024, generator=g) * 12
            write_file(str(path), encode_jpeg(image.to(torch.uint8), quality=75))
            written.append(path)
        else:
            shutil.copyfile(written[n % distinct], path)
        total += path.stat().st_size
    return total


def make_fashion_pngs(folder: Path, root: Path, limit: int | None) -> tuple[dict[str, int], int]:
    """Fashion-MNIST's splits (the first ``limit`` images of each; None: all), read as fedlit
    reads its built-in data set under data root ``root``, as PNGs under
    ``folder/<split>/<label>-<class>/``; returns the images per split and their bytes on disk."""
    spec = dataset_spec("fashion_mnist")
    names = [f"{k}-{name.replace('/', '_')}" for k, name in enumerate(spec.classes or ())]
    counts, total = {}, 0
    for split in ("train", "test"):
        try:
            data = load_split(spec, root, train=split == "train", download=False)
        except RuntimeError as err:  # torchvision: not found, and no download asked for
            raise SystemExit(
                f"Fashion-MNIST is not under {root} ({err}); install Debian's "
                "dataset-fashion-mnist or give --fashion_root a data root that holds it"
            ) from err
        images, labels = data.images, data.labels
        assert isinstance(images, torch.Tensor)
        count = len(images) if limit is None else min(limit, len(images))
        for name in names:
            (folder / split / name).mkdir(parents=True, exist_ok=True)
        for n in range(count):
            png = encode_png(images[n])
            write_file(str(folder / split / names[int(labels[n])] / f"{n:05d}.png"), png)
            total += len(png)
        counts[split] = count
    return counts, total


def run_case(images: Path, root: Path, run_dir: Path, image_size: int, workers: int) -> dict:
    """One ``fedlit fit`` in a child: its peak RSS (bytes), data set-up and total seconds.

    The peak is the child's own ``VmHWM``, not ``os.wait4``'s ``ru_maxrss``: Linux carries the
    memory a process had before its ``execve`` into ``ru_maxrss``, and the child starts as a
    ``vfork`` of this process, so that figure is never below this process's own peak."""
    args = [
        "fit",
        f"--config={RECIPE}",
        f"--data.path={images}",
        f"--data.root={root}",
        f"--data.image_size={image_size}",
        "--data.num_clients=2",
        "--data.labeled_per_class=5",
        "--data.val_per_class=0",
        "--data.test_subset=100",
        "--federation.rounds=1",
        "--federation.clients_per_round=1",
        "--federation.server_epochs=1",
        "--federation.local_steps=2",
        f"--trainer.default_root_dir={run_dir}",
    ]
    env = {**os.environ, "FEDLIT_DECODE_WORKERS": str(workers)}
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stderr is not None
    err = child.stderr.read()
    child.wait()
    seconds = time.perf_counter() - start
    if child.returncode != 0:
        raise SystemExit(f"fedlit fit failed ({child.returncode}):\n{err[-3000:]}")
    found = {line.split()[0]: line.split()[1] for line in err.splitlines() if line.startswith(TAGS)}
    return {"rss": int(found["PEAK"]) * 1024, "setup": float(found["SETUP"]), "total": seconds}


def run_cases(work: Path, images: Path, image_size: int) -> None:
    """The three cases on the folder ``images``, a line each, then the set-up ratios."""
    cases = [
        ("first run, 1 decoding worker", "root1", 1, True),
        ("first run, 2 decoding workers", "root2", 2, True),
        ("second run (from the cache)", "root2", 2, False),
    ]
    results = []
    print("peak RSS in GiB (2**30 bytes) and in GB (10**9 bytes)")
    print(f"{'case':31} {'peak RSS':>20} {'data set-up':>11} {'whole run':>9}")
    for n, (name, root, workers, first) in enumerate(cases):
        if first:  # a first run computes the statistics too
            (images / STATS_FILE).unlink(missing_ok=True)
        result = run_case(images, work / root, work / f"run{n}", image_size, workers)
        results.append(result)
        rss = result["rss"]
        print(
            f"{name:31} {rss / GiB:>6.3f} GiB {rss / GB:>6.3f} GB "
            f"{result['setup']:>9.2f} s {result['total']:>7.1f} s",
            flush=True,
        )
    first1, first2, second = results
    print(
        f"set-up speed-up: 2 decoding workers over 1: {first1['setup'] / first2['setup']:.2f}x; "
        f"second run over the first: {first2['setup'] / second['setup']:.1f}x (2 workers), "
        f"{first1['setup'] / second['setup']:.1f}x (1 worker)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2200, help="how many JPEGs (2200)")
    parser.add_argument(
        "--distinct", type=int, default=2200, help="JPEGs encoded; the rest copy them (2200)"
    )
    parser.add_argument(
        "--image_size", type=int, help="data.image_size (64 for the JPEGs, 28 for --fashion)"
    )
    parser.add_argument(
        "--fashion", action="store_true", help="Fashion-MNIST as PNG folders, not the JPEGs"
    )
    parser.add_argument(
        "--fashion_limit", type=int, help="--fashion: the first N images of each split only"
    )
    parser.add_argument(
        "--fashion_root",
        type=Path,
        help="--fashion: the data root to read Fashion-MNIST from (FashionMNIST/raw; "
        "default: a temporary one, Debian's files staged into it)",
    )
    opts = parser.parse_args()
    if opts.images < 1 or opts.distinct < 1:
        parser.error("--images and --distinct take a positive count")
    with tempfile.TemporaryDirectory(prefix="fedlit-image-cache-") as tmp:
        work = Path(tmp)
        images = work / "images"
        start = time.perf_counter()
        if opts.fashion:
            size = opts.image_size or 28
            root = opts.fashion_root or work / "fashion-root"
            counts, written = make_fashion_pngs(images, root, opts.fashion_limit)
            what = (
                f"Fashion-MNIST as {sum(counts.values())} PNGs of 28x28 ({counts['train']} "
                f"train, {counts['test']} test)"
            )
        else:
            size = opts.image_size or 64
            written = make_images(images, opts.images, min(opts.distinct, opts.images))
            what = f"{opts.images} JPEGs of 1024x768 ({min(opts.distinct, opts.images)} distinct)"
        print(
            f"{what}, {written / 1e6:.0f} MB on disk, made in {time.perf_counter() - start:.0f} "
            f"s; fedlit fit at data.image_size {size}, torch {torch.__version__}, "
            f"{os.cpu_count()} CPUs"
        )
        run_cases(work, images, size)


if __name__ == "__main__":
    main()
