"""A folder of large JPEGs trained at a small size: peak memory and the data's set-up time.

Makes ``--images`` JPEGs of 1024x768 (10 classes, a tenth of them the test split) in a
temporary folder, then runs ``fedlit fit`` on them (recipes/examples/image_folder.yaml at
``--image_size``, one short round) in a child process for each case:

- first run, decoding with 1 thread (``FEDLIT_DECODE_WORKERS=1``), a fresh ``data.root``;
- first run, decoding with 2 threads, another fresh ``data.root``;
- second run, the same files and size: read from the 2-thread run's cache.

For each it prints the child's peak resident memory (``getrusage`` of the child, by
``os.wait4``), the data's set-up time (making the data module: decoding or reading the cache,
and the statistics) and the whole run's time, then the second run's set-up against the first's.

    python benchmarks/image_cache.py                  # 2,200 images, as in the targets
    python benchmarks/image_cache.py --images 20000   # the larger target
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as nnf
from torchvision.io import encode_jpeg, write_file

RECIPE = Path(__file__).parents[1] / "recipes" / "examples" / "image_folder.yaml"
CLASSES = 10

#: The child: ``fedlit fit`` with the data module's making timed (printed to stderr).
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
main(sys.argv[1:])
"""


def make_images(folder: Path, count: int, seed: int = 0) -> int:
    """``count`` JPEGs of 1024x768 (a smooth random picture and noise, quality 75) under
    ``folder/train/<class>`` and ``folder/test/<class>``; returns their bytes on disk."""
    g = torch.Generator().manual_seed(seed)
    total = 0
    for n in range(count):
        split = "test" if (n // CLASSES) % 10 == 9 else "train"
        target = folder / split / f"class{n % CLASSES}"
        target.mkdir(parents=True, exist_ok=True)
        coarse = torch.rand(1, 3, 12, 16, generator=g)
        image = nnf.interpolate(coarse, size=(768, 1024), mode="bilinear", align_corners=False)
        image = image[0] * 240 + torch.rand(3, 768, 1024, generator=g) * 12
        data = encode_jpeg(image.to(torch.uint8), quality=75)
        write_file(str(target / f"{n:06d}.jpg"), data)
        total += len(data)
    return total


def run_case(images: Path, root: Path, run_dir: Path, image_size: int, workers: int) -> dict:
    """One ``fedlit fit`` in a child: its peak RSS (bytes), data set-up and total seconds."""
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
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if child.returncode != 0:
        raise SystemExit(f"fedlit fit failed ({child.returncode}):\n{err[-3000:]}")
    setup = [float(line.split()[1]) for line in err.splitlines() if line.startswith("SETUP ")]
    return {"rss": usage.ru_maxrss * 1024, "setup": setup[0], "total": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2200, help="how many JPEGs (2200)")
    parser.add_argument("--image_size", type=int, default=64, help="data.image_size (64)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fedlit-image-cache-") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        size = make_images(work / "images", opts.images)
        print(
            f"{opts.images} JPEGs of 1024x768, {size / 1e6:.0f} MB on disk, made in "
            f"{time.perf_counter() - start:.0f} s; fedlit fit at data.image_size "
            f"{opts.image_size}, torch {torch.__version__}, {os.cpu_count()} CPUs"
        )
        cases = [
            ("first run, 1 decoding thread", "root1", 1),
            ("first run, 2 decoding threads", "root2", 2),
            ("second run (from the cache)", "root2", 2),
        ]
        results = {}
        print(f"{'case':32} {'peak RSS':>10} {'data set-up':>12} {'whole run':>10}")
        for n, (name, root, workers) in enumerate(cases):
            result = run_case(
                work / "images", work / root, work / f"run{n}", opts.image_size, workers
            )
            results[name] = result
            print(
                f"{name:32} {result['rss'] / 2**30:>8.2f} GB {result['setup']:>10.2f} s "
                f"{result['total']:>8.1f} s",
                flush=True,
            )
        first1, first2, second = (results[name] for name, _, _ in cases)
        print(
            f"decoding, 1 -> 2 threads: set-up {first1['setup'] / first2['setup']:.2f}x "
            f"faster; second run's set-up {first2['setup'] / second['setup']:.1f}x faster "
            f"than the first's (2 threads), {first1['setup'] / second['setup']:.1f}x (1 thread)"
        )


if __name__ == "__main__":
    main()
