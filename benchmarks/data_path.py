"""The per-image data path vs the batched one, alternated in one process, on one device.

Per-image: torchvision's v2 transforms of :mod:`fedlit.data.transforms` called on each image in
a ``Dataset.__getitem__`` and collated by a ``DataLoader`` (``num_workers=0``), as fedlit did
before. Batched: :class:`fedlit.data.ImageBatches` index draws from the uint8 tensor, moved to the
device as uint8 and augmented there a whole batch at a time (:mod:`fedlit.data.augment`).

Measured, images per second (median of ``--repeats``, the two paths taking turns):
the weak view, the strong view, and a full FixMatch client step (weak + strong views, the small
CNN's forward and backward, the SGD step), plus the augmentation's share of the batched step.

``--randaugment`` instead compares two batched strong views, taking turns: RandAugment as fedlit
computed it before (:class:`GroupedRandAugment`: the images that drew the same op and sign
gathered and sent through torchvision's op, a group at a time) and as it does now
(:class:`fedlit.data.randaugment.BatchRandAugment`: a few masked passes over the whole batch), at
``--batch_size`` and at 1,024 (the same draws give the same images: checked before timing).

    python benchmarks/data_path.py                      # CPU, torch's default threads
    OMP_NUM_THREADS=1 python benchmarks/data_path.py    # one core
    python benchmarks/data_path.py --device cuda        # on a GPU (bf16 autocast for the step)
    python benchmarks/data_path.py --randaugment [--device cuda]  # the strong view, before/now
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms.v2.functional._geometry import _apply_grid_transform

from fedlit.data import ImageBatches, build_transform, dataset_spec, load_split
from fedlit.data.augment import batch_view
from fedlit.data.datasets import stage_debian_fashion_mnist
from fedlit.data.loaders import expand_batches
from fedlit.data.randaugment import BatchRandAugment
from fedlit.models import build_classifier
from fedlit.objectives import FixMatch


class PerImage(Dataset):
    """The old path: one transform call per view per image."""

    def __init__(self, images: torch.Tensor, views: tuple[str, ...]) -> None:
        spec = dataset_spec("fashion_mnist")
        self.images, self.transforms = images, [build_transform(v, spec) for v in views]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        return tuple(t(self.images[i]) for t in self.transforms)


class GroupedRandAugment(BatchRandAugment):
    """RandAugment as fedlit computed it before: per slot, one ``grid_sample`` over the images
    that drew a geometric op, then each other (op, sign) group through torchvision's op (a
    device synchronisation per slot, up to 13 groups of torchvision calls)."""

    def __call__(self, images: torch.Tensor, codes: torch.Tensor | None = None) -> torch.Tensor:
        codes = self.draw(len(images)) if codes is None else codes
        height, width = images.shape[-2:]
        table = self.magnitudes(height, width)
        names = self.names
        group_of = torch.tensor(
            [2 * k + (s if table[k][2] else 0) for k in range(len(names)) for s in (0, 1)]
        )
        geometric = torch.tensor([n in self.GEOMETRIC for n in names for _ in (0, 1)])
        grids = self.grids(height, width, images.device)
        out = images.clone()
        for slot in range(codes.shape[1]):
            code = codes[:, slot]
            is_geo = geometric[code]
            idx = is_geo.nonzero().flatten()
            if len(idx):
                grid = grids[code[idx].to(images.device)]
                out[idx] = _apply_grid_transform(out[idx], grid, "nearest", fill=None)
            rest = (~is_geo).nonzero().flatten()
            group = group_of[code[rest]]
            order = torch.argsort(group, stable=True)
            rest, group = rest[order], group[order]
            values, counts = torch.unique_consecutive(group, return_counts=True)
            for value, chunk in zip(values.tolist(), rest.split(counts.tolist()), strict=True):
                name, magnitude, _ = table[value // 2]
                if name == "Identity":
                    continue
                sign = -1.0 if value % 2 else 1.0
                chunk = chunk.to(images.device)
                out[chunk] = self.apply_op(out[chunk], name, sign * magnitude)
        return out


def compare_randaugment(images: torch.Tensor, device: str, repeats: int, sizes: list[int]) -> None:
    """The strong view with the grouped RandAugment (before) and the masked passes (now)."""
    spec = dataset_spec("fashion_mnist")
    view = batch_view("strong", spec)
    now, before = view.randaugment, GroupedRandAugment()  # type: ignore[attr-defined]
    x = images[:256].to(device)
    codes = now.draw(len(x))
    assert torch.equal(now(x, codes), before(x, codes)), "the two differ on the same draws"
    print(f"{'strong view, images/s':<22}{'before':>12}{'now':>12}{'ratio':>10}")
    for bs in sizes:

        def rate(ra: BatchRandAugment, bs: int = bs) -> float:
            view.randaugment = ra  # type: ignore[attr-defined]
            return views_rate(batched(images, ("strong",), bs, device), device, len(images))

        compare(f"batch {bs}", lambda: rate(before), lambda: rate(now), repeats)
    view.randaugment = now  # type: ignore[attr-defined]


def per_image_batches(images: torch.Tensor, views: tuple[str, ...], bs: int) -> Iterable[Any]:
    return DataLoader(PerImage(images, views), batch_size=bs, shuffle=True)


def batched(images: torch.Tensor, views: tuple[str, ...], bs: int, device: str) -> Iterable[Any]:
    loader = ImageBatches(images, dataset_spec("fashion_mnist"), views, bs, shuffle=True)
    for raw in loader.on_device():
        yield expand_batches(raw.to(device, non_blocking=True))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def views_rate(batches: Iterable[Any], device: str, n: int) -> float:
    """Images per second of producing every batch (on ``device``)."""
    sync(device)
    t0 = time.perf_counter()
    for batch in batches:
        for x in batch:
            x.to(device, non_blocking=True)
    sync(device)
    return n / (time.perf_counter() - t0)


def step_rate(batches: Iterable[Any], device: str, n: int, objective: FixMatch) -> float:
    """Images per second of FixMatch client steps on ``batches``."""
    optimizer, _ = objective.optimizer_and_scheduler(1)  # constructed without a schedule
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=device.startswith("cuda"))
    sync(device)
    t0 = time.perf_counter()
    for i, (weak, strong) in enumerate(batches):
        with autocast:
            loss = objective.training_step((weak.to(device), strong.to(device)), i)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()  # type: ignore[union-attr]
    sync(device)
    return n / (time.perf_counter() - t0)


def compare(
    name: str, per_image: Callable[[], float], batched_: Callable[[], float], repeats: int
) -> float:
    a, b = [], []
    per_image(), batched_()  # warm-up
    for _ in range(repeats):
        a.append(per_image())
        b.append(batched_())
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{name:<22}{ma:>12.0f}{mb:>12.0f}{mb / ma:>9.2f}x")
    return mb / ma


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--images", type=int, default=1200, help="a client shard's size")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--root", default="data")
    parser.add_argument(
        "--randaugment", action="store_true", help="compare the strong view before/now only"
    )
    args = parser.parse_args()
    root = Path(args.root)
    stage_debian_fashion_mnist(root)
    images = load_split("fashion_mnist", root, train=True, download=True).images[: args.images]
    n, bs, dev = len(images), args.batch_size, args.device
    torch.manual_seed(0)
    print(f"device {dev}; torch threads {torch.get_num_threads()}; {n} images, batch {bs}")
    if args.randaugment:
        compare_randaugment(images, dev, args.repeats, sorted({bs, 1024}))
        return
    print(f"{'images/s':<22}{'per-image':>12}{'batched':>12}{'ratio':>10}")
    for view in ("weak", "strong"):
        compare(
            f"{view} view",
            lambda v=view: views_rate(per_image_batches(images, (v,), bs), dev, n),
            lambda v=view: views_rate(batched(images, (v,), bs, dev), dev, n),
            args.repeats,
        )
    net = build_classifier("small_cnn", 10, 1).to(dev)
    objective = FixMatch(net, lr=0.003)
    pair = ("weak", "strong")
    speedup = compare(
        "fixmatch client step",
        lambda: step_rate(per_image_batches(images, pair, bs), dev, n, objective),
        lambda: step_rate(batched(images, pair, bs, dev), dev, n, objective),
        args.repeats,
    )
    # the augmentation's share of the batched step: the views alone vs the whole step
    views = statistics.median(
        views_rate(batched(images, pair, bs, dev), dev, n) for _ in range(args.repeats)
    )
    step = statistics.median(
        step_rate(batched(images, pair, bs, dev), dev, n, objective) for _ in range(args.repeats)
    )
    print(f"augmentation share of the batched fixmatch step: {100 * step / views:.1f}%")
    print(f"fixmatch client step speed-up: {speedup:.2f}x")


if __name__ == "__main__":
    main()
