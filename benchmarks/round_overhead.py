"""fedlit's round vs. the same round as a plain PyTorch loop, alternated in one process.

Both paths use the same method objects (losses), the same data loaders (same batches), the same
seeds and the same steps; fedlit's path is the driver's real round (its fits in the lean loop,
broadcast, aggregation, logging to metrics.csv and the atomic checkpoint), evaluation excluded
from both. Prints the median seconds per round of each and their ratio.

    python benchmarks/round_overhead.py                 # FedAvg-FixMatch and FedAvg-SL rounds
    python benchmarks/round_overhead.py --method sl --rounds 7

With ``--executor pool`` it times instead fedlit's round in this process (at each of
``--local_threads``) against the pool executor with each of ``--workers`` (``--threads`` torch
threads each), rounds alternated; the clients' phase (the executor's ``run``) is timed apart,
and on CUDA the GPU's utilisation is sampled during it (``torch.cuda.utilization``, NVML):

    python benchmarks/round_overhead.py --executor pool --method fixmatch --clients 10 \
        --server_epochs 10 --workers 2 --local_threads 2,1      # the common protocol's round
    python benchmarks/round_overhead.py --executor pool --device cuda --backbone resnet18 \
        --method fixmatch --clients 10 --workers 1,2,4,8
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from fedlit.aggregation import weighted_average
from fedlit.data import FederatedDataModule, sample_clients
from fedlit.federation import Federation, FederationConfig, PoolSettings, TrainerTemplate
from fedlit.federation.seeding import FINETUNE, SERVER, derive_seed, seed_all
from fedlit.methods import FedAvgFixMatch, FedAvgSL, FederatedMethod
from fedlit.methods.plan import Step
from fedlit.models import Architecture
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


def prepared_on_cpu(method: FederatedMethod, data: FederatedDataModule) -> TrainerTemplate:
    """Sets ``method`` and ``data`` up as a run of 100 rounds of 10 clients does (in a run
    folder removed after); returns the engine's template for them: the CPU in fp32, as the
    plain loop runs, whatever the CPU's default."""
    template = TrainerTemplate(accelerator="cpu", precision="32-true")
    with tempfile.TemporaryDirectory() as tmp:
        config = FederationConfig(rounds=100, clients_per_round=10)
        fed = Federation(
            method, data, config, run_dir=Path(tmp) / "run", trainer=template, progress=False
        )
        fed.prepare()
    return template


def plain_round(fed: Federation, round_idx: int) -> None:
    """One round of ``fed``'s method written directly in PyTorch (no Lightning, no logging)."""
    method, data, cfg = fed.method, fed.data, fed.config
    side = method.client_side()
    method.on_round_start(round_idx, cfg.rounds)
    side.on_round_start(round_idx, cfg.rounds)
    steps = method.round_plan().steps
    server_first = steps.index(Step.SERVER) < steps.index(Step.CLIENTS)
    if server_first:
        seed_all(derive_seed(fed.seed, round_idx, SERVER))
        server = method.server_objective()
        plain_train(server, method.server_loader(data), cfg.server_epochs)
    payload = method.broadcast()
    uploads, weights = [], []
    for cid in sample_clients(data.num_clients, cfg.clients_per_round, fed.seed, round_idx):
        seed_all(derive_seed(fed.seed, round_idx, int(cid)))
        client = data.client_data(int(cid))
        objective = side.objective(payload, client, None)
        loader = side.loader(client)
        plain_train(objective, loader, cfg.local_epochs)
        uploads.append({k: v.detach().clone() for k, v in objective.network.state_dict().items()})
        weights.append(loader.num_examples)
    method.network.load_state_dict(weighted_average(uploads, weights))
    if not server_first or Step.FINETUNE in steps:
        seed_all(derive_seed(fed.seed, round_idx, SERVER if not server_first else FINETUNE))
        server = method.server_objective()
        plain_train(server, method.server_loader(data), cfg.server_epochs)


def federation(
    name: str, args: argparse.Namespace, run_dir: Path, executor: str = "local", workers: int = 1
) -> Federation:
    """The benchmark's federation: all ``--clients`` sampled every round, evaluation only
    after round 10,000 (never)."""
    data = FederatedDataModule(
        root=args.root, num_clients=args.clients, examples_per_client=args.examples
    )
    method = METHODS[name](
        Architecture(10, 1, backbone=args.backbone), optim=Optimization(client_lr=0.003)
    )
    config = FederationConfig(
        rounds=10_000,
        clients_per_round=args.clients,
        server_epochs=args.server_epochs,
        eval_every=10_000,
        executor=executor,  # type: ignore[arg-type]
        pool=PoolSettings(workers=workers, threads=args.threads),
    )
    # beside the plain loop (fp32) the engine trains in fp32 too; pool mode: its default precision
    precision = "32-true" if args.executor == "local" else None
    accelerator = "gpu" if args.device == "cuda" else "cpu"
    trainer = TrainerTemplate(accelerator=accelerator, precision=precision)
    fed = Federation(method, data, config, run_dir=run_dir, trainer=trainer, progress=False)
    fed.prepare()
    return fed


def measure(name: str, args: argparse.Namespace, workdir: Path) -> tuple[float, float]:
    fedlit_fed, plain_fed = (
        federation(name, args, workdir / f"{name}-fedlit"),
        federation(name, args, workdir / f"{name}-plain"),
    )
    fedlit_fed.open_run_dir()
    fedlit_fed.callbacks.run_start()  # its rows and checkpoints, as in a run
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


class GpuSampler:
    """The GPU's utilisation (%), sampled every 50 ms while :meth:`sampling` is active."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    @contextmanager
    def sampling(self) -> Iterator[None]:
        if not torch.cuda.is_available():
            yield
            return
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                self.samples.append(gpu_utilization())

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def mean(self) -> float:
        return statistics.fmean(self.samples) if self.samples else float("nan")


def gpu_utilization() -> float:
    """The GPU's current utilisation (%): NVML through torch, else ``nvidia-smi``."""
    try:
        return float(torch.cuda.utilization())
    except Exception:  # no pynvml
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
        )
        return float(out.stdout.split()[0])


class Timed:
    """A federation whose rounds, and whose clients' phase (its executor's ``run``), are timed;
    ``threads``: torch's thread count in this process while it runs (None: as it is)."""

    def __init__(self, label: str, fed: Federation, threads: int | None) -> None:
        self.label, self.fed, self.threads = label, fed, threads
        self.round_s: list[float] = []
        self.clients_s: list[float] = []
        self.gpu = GpuSampler()
        self.clients: list[float] = []  # every round's clients' phase
        fed.open_run_dir()
        fed.callbacks.run_start()
        executor = fed.executor
        run = executor.run

        def timed_run(jobs: Any, round_idx: int) -> Any:
            t0 = time.perf_counter()
            with self.gpu.sampling():
                out = run(jobs, round_idx)
            self.clients.append(time.perf_counter() - t0)
            return out

        executor.run = timed_run  # type: ignore[method-assign]

    def round(self, r: int, counted: bool) -> None:
        before = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        t0 = time.perf_counter()
        self.fed.run_and_record_round(r)
        elapsed = time.perf_counter() - t0
        torch.set_num_threads(before)
        if counted:
            self.round_s.append(elapsed)
            self.clients_s.append(self.clients[-1])

    def close(self) -> None:
        self.fed.close()


def measure_pool(name: str, args: argparse.Namespace, workdir: Path) -> list[Timed]:
    """fedlit's round in this process at each of ``--local_threads`` and on the pool with each
    of ``--workers``, rounds alternated; round 1 (the workers' start) is not counted."""
    runs = [
        Timed(f"local x{t} thr", federation(name, args, workdir / f"{name}-local{t}"), t)
        for t in _ints(args.local_threads)
    ]
    runs += [
        Timed(
            f"pool {k}x{args.threads} thr",
            federation(name, args, workdir / f"{name}-pool{k}", "pool", k),
            None,
        )
        for k in _ints(args.workers)
    ]
    try:
        for r in range(1, args.rounds + 2):
            for run in runs:
                run.round(r, counted=r > 1)
    finally:
        for run in runs:
            run.close()
    return runs


def _ints(text: str) -> Sequence[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--method", choices=[*METHODS, "all"], default="all")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per path")
    parser.add_argument("--clients", type=int, default=5, help="clients, all sampled each round")
    parser.add_argument("--examples", type=int, default=1200, help="unlabeled images per client")
    parser.add_argument("--server_epochs", type=int, default=2)
    parser.add_argument("--root", default="data")
    parser.add_argument("--backbone", default="small_cnn")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--executor", choices=["local", "pool"], default="local")
    parser.add_argument("--workers", default="1,2,4,8", help="pool sizes to time (--executor pool)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per pool worker")
    parser.add_argument(
        "--local_threads", default="", help="in-process runs at these thread counts (pool mode)"
    )
    args = parser.parse_args()
    if args.device == "cuda" and args.executor != "pool":
        parser.error("the plain loop runs on the CPU: --device cuda needs --executor pool")
    print(
        f"torch threads: {torch.get_num_threads()}; {args.clients} clients x {args.examples}; "
        f"{args.backbone} on {args.device}; server epochs {args.server_epochs}"
    )
    if args.executor == "pool":
        print(f"{'round':<10}{'run':<18}{'round s':>10}{'clients s':>11}{'GPU %':>8}")
        with tempfile.TemporaryDirectory() as tmp:
            for name in METHODS if args.method == "all" else [args.method]:
                for run in measure_pool(name, args, Path(tmp)):
                    print(
                        f"{name:<10}{run.label:<18}{statistics.median(run.round_s):>10.3f}"
                        f"{statistics.median(run.clients_s):>11.3f}{run.gpu.mean():>8.1f}"
                    )
        return
    print(f"{'round':<10}{'fedlit s':>10}{'plain s':>10}{'ratio':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in METHODS if args.method == "all" else [args.method]:
            fedlit_s, plain_s = measure(name, args, Path(tmp))
            print(f"{name:<10}{fedlit_s:>10.3f}{plain_s:>10.3f}{fedlit_s / plain_s:>8.3f}x")


if __name__ == "__main__":
    main()
