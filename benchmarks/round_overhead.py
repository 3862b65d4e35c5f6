"""fedlit's round vs. the same round as a plain PyTorch loop, alternated in one process.

Both paths use the same method objects (losses), the same data loaders (same batches), the same
seeds and the same steps; fedlit's path is the driver's real round (per-step Lightning Trainers,
broadcast, aggregation, logging to metrics.csv and the atomic checkpoint), evaluation excluded
from both. Prints the median seconds per round of each and their ratio.

    python benchmarks/round_overhead.py                 # FedAvg-FixMatch and FedAvg-SL rounds
    python benchmarks/round_overhead.py --method sl --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from fedlit.aggregation import weighted_average
from fedlit.data import FederatedDataModule, sample_clients
from fedlit.federation import Federation, FederationConfig
from fedlit.federation.seeding import FINETUNE, SERVER, derive_seed, seed_all
from fedlit.methods import FedAvgFixMatch, FedAvgSL, FederatedMethod
from fedlit.objectives import Objective, Optimization

METHODS: dict[str, type[FederatedMethod]] = {"fixmatch": FedAvgFixMatch, "sl": FedAvgSL}


def plain_train(objective: Objective, loader: Iterable[Any], epochs: int) -> None:
    """The hand-written loop: the objective's own loss and optimiser, nothing else."""
    objective.train()
    optimizer, scheduler = objective.optimizer_and_scheduler(epochs * len(loader))  # type: ignore[arg-type]
    for _ in range(epochs):
        for i, batch in enumerate(loader):
            loss = objective.training_step(batch, i)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()


def plain_round(fed: Federation, round_idx: int) -> None:
    """One round of ``fed``'s method written directly in PyTorch (no Lightning, no logging)."""
    method, data, cfg = fed.method, fed.data, fed.config
    method.on_round_start(round_idx, cfg.rounds)
    if method.server_first:
        seed_all(derive_seed(fed.seed, round_idx, SERVER))
        server = method.server_objective()
        plain_train(server, method.server_loader(data), cfg.server_epochs)
    payload = method.broadcast()
    uploads, weights = [], []
    for cid in sample_clients(data.num_clients, cfg.clients_per_round, fed.seed, round_idx):
        seed_all(derive_seed(fed.seed, round_idx, int(cid)))
        client = data.client_data(int(cid))
        objective = method.client_objective(payload, client, None)
        loader = method.client_loader(client)
        plain_train(objective, loader, cfg.local_epochs)
        uploads.append({k: v.detach().clone() for k, v in objective.network.state_dict().items()})
        weights.append(loader.num_examples)
    method.network.load_state_dict(weighted_average(uploads, weights))
    if not method.server_first or method.server_finetunes:
        seed_all(derive_seed(fed.seed, round_idx, SERVER if not method.server_first else FINETUNE))
        server = method.server_objective()
        plain_train(server, method.server_loader(data), cfg.server_epochs)


def measure(name: str, args: argparse.Namespace, workdir: Path) -> tuple[float, float]:
    def federation(run: str) -> Federation:
        data = FederatedDataModule(
            root=args.root, num_clients=args.clients, examples_per_client=args.examples
        )
        method = METHODS[name](num_classes=10, in_channels=1, optim=Optimization(client_lr=0.003))
        config = FederationConfig(
            rounds=10_000,
            clients_per_round=args.clients,
            server_epochs=args.server_epochs,
            eval_every=10_000,
        )
        fed = Federation(method, data, config, run_dir=workdir / f"{name}-{run}", progress=False)
        fed.prepare()
        return fed

    fedlit_fed, plain_fed = federation("fedlit"), federation("plain")
    fedlit_fed.open_run_dir()
    fedlit_fed.callbacks.run_start(fedlit_fed)  # its rows and checkpoints, as in a run
    fedlit_s, plain_s = [], []
    for r in range(1, args.rounds + 2):  # round 1 warms both paths up and is not counted
        t0 = time.perf_counter()
        fedlit_fed.run_and_record_round(r)
        t1 = time.perf_counter()
        plain_round(plain_fed, r)
        t2 = time.perf_counter()
        if r > 1:
            fedlit_s.append(t1 - t0)
            plain_s.append(t2 - t1)
    return statistics.median(fedlit_s), statistics.median(plain_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--method", choices=[*METHODS, "all"], default="all")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per path")
    parser.add_argument("--clients", type=int, default=5, help="clients, all sampled each round")
    parser.add_argument("--examples", type=int, default=1200, help="unlabeled images per client")
    parser.add_argument("--server_epochs", type=int, default=2)
    parser.add_argument("--root", default="data")
    args = parser.parse_args()
    print(f"torch threads: {torch.get_num_threads()}; {args.clients} clients x {args.examples}")
    print(f"{'round':<10}{'fedlit s':>10}{'plain s':>10}{'ratio':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in METHODS if args.method == "all" else [args.method]:
            fedlit_s, plain_s = measure(name, args, Path(tmp))
            print(f"{name:<10}{fedlit_s:>10.3f}{plain_s:>10.3f}{fedlit_s / plain_s:>8.3f}x")


if __name__ == "__main__":
    main()
