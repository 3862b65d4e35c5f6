"""What a round's aggregation and its logged diagnostic cost on ResNet-18's state: fedlit's
``weighted_average`` and ``weight_diversity`` over 10 uploads, beside a plain ``torch._foreach``
mean of the same tensors, alternated in one process at one thread.

The uploads are ResNet-18's state (11.2 M parameters, 122 tensors) plus small random moves, the
clients' starting state their common start. Printed: the median seconds of each over
``--repeats`` rounds and each one's ratio to the plain mean.

    python benchmarks/aggregation_cost.py
    PYTHONPATH=<another checkout> python benchmarks/aggregation_cost.py   # another version
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from fedlit.aggregation import weight_diversity, weighted_average
from fedlit.models import Architecture


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clients", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    network = Architecture(10, 3, "resnet18").build()
    start = {k: v.detach().clone() for k, v in network.state_dict().items()}

    def moved(v: torch.Tensor) -> torch.Tensor:
        return v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v.clone()

    uploads = [{k: moved(v) for k, v in start.items()} for _ in range(args.clients)]
    weights = [1200.0] * args.clients
    floats = [k for k, v in start.items() if v.is_floating_point()]

    def foreach_mean() -> None:
        sums = torch._foreach_mul([uploads[0][k] for k in floats], 1 / args.clients)
        for upload in uploads[1:]:
            torch._foreach_add_(sums, [upload[k] for k in floats], alpha=1 / args.clients)

    timed: dict[str, Callable[[], object]] = {
        "plain foreach mean": foreach_mean,
        "weighted_average": lambda: weighted_average(uploads, weights),
        "weight_diversity": lambda: weight_diversity([start] * args.clients, uploads),
    }
    seconds: dict[str, list[float]] = {name: [] for name in timed}
    for _ in range(args.repeats + 1):  # the first repeat warms up and is not counted
        for name, work in timed.items():
            t0 = time.perf_counter()
            work()
            seconds[name].append(time.perf_counter() - t0)
    plain = statistics.median(seconds["plain foreach mean"][1:])
    params = sum(v.numel() for v in start.values())
    print(f"{args.clients} uploads of {params:,} values ({len(start)} tensors), one thread:")
    both = 0.0
    for name, values in seconds.items():
        median = statistics.median(values[1:])
        both += median if name != "plain foreach mean" else 0.0
        print(f"  {name}: {median:.3f} s ({median / plain:.2f}x the plain mean)")
    print(f"  aggregation and its diagnostic: {both:.3f} s ({both / plain:.2f}x the plain mean)")


if __name__ == "__main__":
    main()
