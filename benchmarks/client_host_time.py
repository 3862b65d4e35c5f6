"""The host time a client costs beyond its steps: fedlit's client runner against a plain PyTorch
loop doing the same steps, alternated in one process.

Each repeat runs one client's round as an executor does (:class:`~fedlit.federation.client.
ClientRunner`: its data, the objective on the received weights, its fit in fedlit's lean loop,
the upload and state), then the same client's steps as a plain loop (the objective's own loss
and optimiser over the same loader; the objective is built outside the timed part). The
difference of the medians is what a client costs beyond its steps. Small clients make the steps
cheap, so that milliseconds show. Both wall-clock time and this process's CPU time are given (on
a machine shared with other work, CPU time is the steadier of the two).

    OMP_NUM_THREADS=1 python benchmarks/client_host_time.py --root data
    OMP_NUM_THREADS=1 python benchmarks/client_host_time.py --method fixmatch --examples 64

It uses only what every version of the engine has (run it with another checkout first on the
path to compare engines).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from round_overhead import plain_train, prepared_on_cpu

from fedlit.data import FederatedDataModule
from fedlit.federation.client import ClientRunner
from fedlit.federation.seeding import derive_seed, seed_all
from fedlit.methods import FedAvgFixMatch, FedAvgSL, FederatedMethod
from fedlit.models import Architecture
from fedlit.objectives import Optimization

METHODS: dict[str, type[FederatedMethod]] = {"fixmatch": FedAvgFixMatch, "sl": FedAvgSL}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--method", choices=list(METHODS), default="sl")
    parser.add_argument("--backbone", default="small_cnn")
    parser.add_argument("--examples", type=int, default=16, help="unlabeled images per client")
    parser.add_argument("--batch", type=int, default=16, help="the clients' batch size")
    parser.add_argument("--repeats", type=int, default=40, help="timed clients (5 more warm up)")
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--root", default="data")
    args = parser.parse_args()
    data = FederatedDataModule(
        dataset=args.dataset,
        root=args.root,
        num_clients=10,
        examples_per_client=args.examples,
        client_batch_size=args.batch,
    )
    method = METHODS[args.method](
        Architecture(10, 1, backbone=args.backbone), optim=Optimization(client_lr=0.003)
    )
    template = prepared_on_cpu(method, data)
    payload = method.broadcast()
    runner = ClientRunner(method.client_side(), data, template, seed=0, total_rounds=100)
    plain_side = method.client_side()  # its own networks: the runner's stay the runner's
    engine_s: list[tuple[float, float]] = []
    plain_s: list[tuple[float, float]] = []
    steps = 0
    for i in range(args.repeats + 5):
        cid = i % 10
        t0, c0 = time.perf_counter(), time.process_time()
        runner(payload, cid, 1, None, 1)
        t1, c1 = time.perf_counter(), time.process_time()
        seed_all(derive_seed(0, 1, cid))
        plain_side.on_round_start(1, 100)
        client = data.client_data(cid, 1)
        objective = plain_side.objective(payload, client, None)
        loader = plain_side.loader(client)
        steps = len(loader)
        t2, c2 = time.perf_counter(), time.process_time()
        plain_train(objective, loader, 1)
        t3, c3 = time.perf_counter(), time.process_time()
        if i >= 5:
            engine_s.append((t1 - t0, c1 - c0))
            plain_s.append((t3 - t2, c3 - c2))
    print(
        f"{args.method}, {args.backbone}, {args.examples} images, batch {args.batch} ({steps} "
        f"steps), CPU, torch threads {torch.get_num_threads()}, {args.repeats} clients (medians):"
    )
    for k, clock in enumerate(("wall", "CPU")):
        engine = 1000 * statistics.median(e[k] for e in engine_s)
        plain = 1000 * statistics.median(p[k] for p in plain_s)
        print(
            f"  {clock:<5} engine client {engine:7.1f} ms, plain steps {plain:7.1f} ms, "
            f"beyond the steps {engine - plain:6.1f} ms"
        )


if __name__ == "__main__":
    main()
