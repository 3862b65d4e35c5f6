"""What one client's round costs beyond its steps, part by part, in one process.

Each repeat runs one client's work as :class:`~fedlit.federation.client.ClientRunner` does,
timing its parts: the objective (the network built from the payload, the client's data and
loader), its fit in fedlit's loop (``TrainerTemplate.fit``, as :func:`fedlit.federation.fit.how_to_fit`
routes an objective), and the upload and persistent state; then the same client's steps again
as a plain PyTorch loop (the objective's own loss and optimiser, the same batches). "fixed" is
everything but the steps: objective + (fit - plain steps) + upload. Prints the medians in ms.
A whole round against its floors: ``benchmarks/host_round.py``.

    python benchmarks/client_cost.py                          # small CNN, 64 images: one step
    python benchmarks/client_cost.py --backbone resnet18 --examples 1200
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from round_overhead import plain_train, prepared_on_cpu

from fedlit.data import FederatedDataModule
from fedlit.federation.seeding import derive_seed, seed_all
from fedlit.methods import FedAvgFixMatch
from fedlit.models import Architecture
from fedlit.objectives import Optimization

PARTS = ("objective", "fit", "upload", "plain steps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backbone", default="small_cnn")
    parser.add_argument("--examples", type=int, default=64, help="unlabeled images per client")
    parser.add_argument("--repeats", type=int, default=10, help="timed clients (2 more warm up)")
    parser.add_argument("--root", default="data")
    args = parser.parse_args()
    data = FederatedDataModule(root=args.root, num_clients=10, examples_per_client=args.examples)
    method = FedAvgFixMatch(
        Architecture(10, 1, backbone=args.backbone), optim=Optimization(client_lr=0.003)
    )
    template = prepared_on_cpu(method, data)
    payload = method.broadcast()
    side = method.client_side()
    times: dict[str, list[float]] = {part: [] for part in PARTS}
    for i in range(args.repeats + 2):
        cid = i % 10
        seed_all(derive_seed(0, 1, cid))
        side.on_round_start(1, 100)
        t0 = time.perf_counter()
        client = data.client_data(cid, 1)
        objective = side.objective(payload, client, None)
        loader = side.loader(client)
        t1 = time.perf_counter()
        template.fit(objective, loader, 1, kept=side.kept_optimizers)
        t3 = time.perf_counter()
        side.upload(objective)
        side.state(objective, None)
        t4 = time.perf_counter()
        seed_all(derive_seed(0, 1, cid))
        plain = side.objective(payload, client, None)
        plain_loader = side.loader(client)
        t5 = time.perf_counter()
        plain_train(plain, plain_loader, 1)
        t6 = time.perf_counter()
        if i >= 2:
            for part, t in zip(PARTS, (t1 - t0, t3 - t1, t4 - t3, t6 - t5), strict=True):
                times[part].append(t)
    med = {part: 1000 * statistics.median(ts) for part, ts in times.items()}
    fixed = med["objective"] + med["fit"] - med["plain steps"] + med["upload"]
    print(
        f"{args.backbone}, {args.examples} images ({len(loader)} steps), CPU, "
        f"torch threads {torch.get_num_threads()}: "
        + ", ".join(f"{part} {ms:.1f}" for part, ms in med.items())
        + f" ms; fixed {fixed:.1f} ms"
    )


if __name__ == "__main__":
    main()
