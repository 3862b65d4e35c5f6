"""The batched views of this checkout against those of another commit, side by side.

Loads ``fedlit/data/augment.py`` (and ``randaugment.py``, where it has one) as it was at
``--against`` (a git revision) beside today's, then for each data set, view and batch:

- checks that both give the same images bit for bit from the same generator state, and leave
  the generator in the same state (a change of the views that should keep every result);
- counts the ops each dispatches (``step_profile.Profile``'s count: on a GPU, about one
  kernel launch each);
- times both, taking turns, and prints the median time of each and their ratio.

    OMP_NUM_THREADS=1 python benchmarks/views_against.py --against HEAD~1
    python benchmarks/views_against.py --against <rev> --datasets cifar10 --batch 256
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from step_profile import Profile

from fedlit.data import augment, dataset_spec

REPO = Path(__file__).resolve().parents[1]
View = Callable[[torch.Tensor], torch.Tensor]  # a batched view: uint8 images in, a batch out


def module_at(revision: str, folder: Path, name: str = "augment") -> ModuleType:
    """``fedlit/data/<name>.py`` at ``revision``, imported as a module of its own
    (``<name>_then``); its import of ``fedlit.data.randaugment``, where the revision has one,
    is that revision's too."""
    source = subprocess.run(
        ["git", "show", f"{revision}:fedlit/data/{name}.py"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    if "from fedlit.data.randaugment import" in source:
        module_at(revision, folder, "randaugment")
        source = source.replace(
            "from fedlit.data.randaugment import", "from randaugment_then import"
        )
    path = folder / f"{name}_then.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{name}_then", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where a dataclass of the module looks itself up
    spec.loader.exec_module(module)
    return module


def same_views(then: View, now: View, images: torch.Tensor) -> bool:
    """Both views from one generator state: equal images and equal states afterwards."""
    torch.manual_seed(0)
    a, after_a = then(images), torch.get_rng_state()
    torch.manual_seed(0)
    b, after_b = now(images), torch.get_rng_state()
    return torch.equal(a, b) and a.stride() == b.stride() and torch.equal(after_a, after_b)


def ops(view: View, images: torch.Tensor) -> int:
    view(images)  # the per-size tables, built once
    counter = Profile(count=True)
    with counter:
        view(images)
    return counter.phases["other"].ops


def timed(view: View, images: torch.Tensor, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        view(images)
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD~1", help="the git revision to compare with")
    parser.add_argument("--datasets", default="fashion_mnist,cifar10")
    parser.add_argument("--views", default="weak,strong")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--calls", type=int, default=20, help="calls a timing")
    parser.add_argument("--repeats", type=int, default=7, help="timings of each, alternated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        then_module = module_at(args.against, Path(folder))
    print(f"views of this checkout against {args.against}; torch threads {torch.get_num_threads()}")
    print(
        f"{'data set':14} {'view':7} {'B':>4} {'same':>5} {'ops then':>9} {'ops now':>8} "
        f"{'ms then':>8} {'ms now':>7} {'now/then':>9}"
    )
    for name in args.datasets.split(","):
        spec = dataset_spec(name)
        generator = torch.Generator().manual_seed(0)
        shape = (args.batch, spec.channels, spec.size, spec.size)
        images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
        for view_name in args.views.split(","):
            then = then_module.BatchView(view_name, spec)
            now = augment.BatchView(view_name, spec)
            same = same_views(then, now, images)
            counts = ops(then, images), ops(now, images)
            times: dict[str, list[float]] = {"then": [], "now": []}
            for _ in range(args.repeats):
                times["then"].append(timed(then, images, args.calls))
                times["now"].append(timed(now, images, args.calls))
            t_then, t_now = (statistics.median(times[k]) * 1e3 for k in ("then", "now"))
            print(
                f"{name:14} {view_name:7} {args.batch:4d} {str(same):>5} {counts[0]:9d} "
                f"{counts[1]:8d} {t_then:8.2f} {t_now:7.2f} {t_now / t_then:9.2f}"
            )


if __name__ == "__main__":
    main()
