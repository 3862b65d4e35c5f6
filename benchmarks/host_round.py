"""The host time of a round: fedlit's round against two floors doing the same steps, on paper
002's FedSEAL protocol with a near-free network, alternated round by round in one process
(the three paths' order rotated each round). The CPU proxy of a GPU round, whose arithmetic is
small beside its host time. The objects floor drives fedlit's own objects by hand (below);
the plain floor (:mod:`plain_floor`) is the same round in PyTorch alone, with no fedlit
object: what fedlit's objects and driver cost over a hand-written loop.

The protocol is ``recipes/papers/paper002_fmnist/fedseal.yaml`` unchanged (10 clients of
1,200 images, all sampled, 500 labels, 2 server epochs in batches of 16, 1 local epoch in
batches of 64, the full test set, evaluated every round) except: the network is near free
(the image averaged to 1x1, a Linear to 8 features, a BatchNorm1d: :class:`NearFree`), one
bootstrap epoch, and the views' tensor work cut to the normalisation, their random draws kept
(so what is left is what the host does around the arithmetic). Both paths train in fp32.

The floor does every step fedlit's round does, with fedlit's own objects (the method, its
client side and objectives, their losses, loaders and hooks, the aggregation, FedSEAL's
measure, the evaluator's network scored as fedlit scores it, its accuracy and loss on the
validation and test sets) and nothing else: a hand-written loop over each objective's
``training_step`` (zero_grad, backward, the optimiser's step, the scheduler's), the
objective's hooks called directly, each client's upload a clone, its state kept in a dict.
Compiled (``--compile default``), both run the same compiled step: the step, its backward
and the optimiser's update as one call
(:class:`~fedlit.federation.fit.compiled.OneCallStep`, with the fit's own draws). What fedlit
does beyond the floor is its own: the lean loop's hooks, the client runner, the round's
checkpoint and its CSV row.

Printed, per repeat (a repeat builds its federations anew; ``--seeds`` cycles the repeats'
seeds): each path's CPU time per round (this process's, all threads: the steadier measure on
a shared machine; wall time beside it), their ratio, medians over the rounds after the first,
and fedlit's per-round counts of the host work the round does beyond the floor: Lightning
Trainers built (all, and in clients' fits), moves of a network between devices (``to``,
``cpu``, ``cuda`` on a LightningModule or network), deep copies of a network, ``state_dict()``
calls, uploads copied to the host, client-state files written and read; each path's last
test/acc (the plain floor's random stream is its own: compare it within the seeds' spread).
``--profile fedlit "plain floor"`` prints a cProfile of those paths' rounds 2-N by own time
(``--profile-sort cumulative``: by cumulative time, where a round's time goes by layer).

    OMP_NUM_THREADS=1 python benchmarks/host_round.py --rounds 8 --repeats 3 --seeds 3
    OMP_NUM_THREADS=1 python benchmarks/host_round.py --rounds 4 --profile fedlit "plain floor"
    OMP_NUM_THREADS=1 python benchmarks/host_round.py --rounds 8
    OMP_NUM_THREADS=1 python benchmarks/host_round.py --rounds 8 --compile default
    OMP_NUM_THREADS=1 python benchmarks/host_round.py --trainer-per-fit   # a Trainer per fit
"""

from __future__ import annotations

import argparse
import cProfile
import copy
import pstats
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning
import torch
import torch.nn.functional as F
from lightning import LightningModule
from torch import Tensor, nn

from fedlit.aggregation.payloads import MODEL
from fedlit.cli.fit import federation_of
from fedlit.resolver import resolve
from fedlit.data.augment import BatchView, FitDraws
from fedlit.data.sampling import sample_clients
from fedlit.evaluation import scored
from fedlit.federation import Federation
from fedlit.federation.fit.compiled import one_call_step, whole_step_compiled
from fedlit.federation.seeding import EVAL, SERVER, derive_seed, seed_all
from fedlit.federation.fit.loop import on_device, views
from fedlit.methods.client_side import ClientUpdate
from fedlit.methods.plan import Step
from fedlit.models import Classifier
from fedlit.objectives import FedProx, FitState, Objective
from fedlit.objectives.base import KeptOptimizers
from plain_floor import PlainFloor

PATHS = ("fedlit", "objects floor", "plain floor")
RECIPE = Path(__file__).parents[1] / "recipes" / "papers" / "paper002_fmnist" / "fedseal.yaml"


class NearFree(nn.Module):
    """A near-free backbone: the image averaged to 1x1, a Linear to 8 features, a
    BatchNorm1d. Images (N, C, H, W) -> (N, 8)."""

    def __init__(self, in_channels: int = 1) -> None:
        super().__init__()
        self.fc = nn.Linear(in_channels, 8)
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(self.fc(x.mean(dim=(2, 3))))


def normalise_only(self: BatchView, images: Tensor, drawn: Tensor) -> Tensor:
    """A view's tensor work cut to its normalisation (its draws are made all the same)."""
    return self.normalize(images)


# --- the floor: the same steps, written directly in PyTorch ----------------------------------
def plain_fit(
    objective: Objective,
    loader: Iterable[Any],
    epochs: int,
    kept: KeptOptimizers | None = None,
    compiled: dict[str, Any] | None = None,
) -> None:
    """The objective's fit as a hand-written loop: its fit state, its hooks called directly,
    its ``training_step`` on each batch, zero_grad, backward, the optimiser's and the
    scheduler's steps (compiled: the step, its backward and the optimiser's update as one
    call, :class:`~fedlit.federation.fit.compiled.OneCallStep`, as fedlit runs it)."""
    device = torch.device("cpu")
    batches = on_device(objective, loader, device)
    steps = epochs * len(batches)  # type: ignore[arg-type]
    mu = objective.proximal_mu()
    fedprox = FedProx(objective.network, mu) if mu > 0 else None
    draws = FitDraws.for_fit(steps)  # the fit's views' draws, as fedlit's loop makes them
    state = FitState(steps, kept_optimizers=kept, fedprox=fedprox, draws=draws, **(compiled or {}))
    objective.fit_state = state
    optimizer, scheduler = objective.optimizer_and_scheduler(steps)
    one_call = one_call_step(objective, optimizer, None) if compiled else None
    objective.before_fit()
    for _ in range(epochs):
        for i, raw in enumerate(batches):
            batch = views(raw, device, state)
            if one_call is not None:
                loss, logged = one_call(batch)
                objective.record(logged)
            else:
                loss = objective.training_step(batch, i)
                optimizer.zero_grad()
                loss.backward()
            objective.accumulate(1.0, lr=float(optimizer.param_groups[0]["lr"]))
            if one_call is None:
                optimizer.step()
            state.steps_taken += 1
            if scheduler is not None:
                scheduler.step()
            objective.after_step()
    objective.after_fit()


@torch.no_grad()
def plain_accuracy(network: nn.Module, loader: Iterable[Any]) -> tuple[float, float]:
    """Top-1 accuracy and mean cross-entropy of ``network`` over a labeled loader (eval
    mode): what fedlit's evaluation reports."""
    network.eval()
    right = total = 0
    loss = torch.zeros(())
    for x, y in loader:
        logits = network(x).float()
        right += int((logits.argmax(1) == y).sum())
        loss += F.cross_entropy(logits, y, reduction="sum")
        total += len(y)
    return right / total, float(loss) / total


class Floor:
    """fedlit's method, data and plan for ``fed``, run round by round as plain PyTorch."""

    def __init__(self, fed: Federation, compile_mode: str | None) -> None:
        self.fed, self.compile = fed, compile_mode
        self.side = fed.method.client_side()
        self.states: dict[int, Any] = {}

    def fit(
        self, objective: Objective, loader: Iterable[Any], epochs: int, kept: Any = None
    ) -> None:
        if self.compile is None:
            plain_fit(objective, loader, epochs, kept)
            return
        with whole_step_compiled(objective, self.compile) as compiled:
            plain_fit(objective, loader, epochs, kept, compiled)

    def round(self, r: int) -> float:
        fed, side = self.fed, self.side
        method, data, cfg = fed.method, fed.data, fed.config
        method.on_round_start(r, cfg.rounds)
        payload: Any = None
        updates: list[ClientUpdate] = []
        for step in method.round_plan().steps:
            if step == Step.BROADCAST:
                payload = method.broadcast()
            elif step == Step.CLIENTS:
                for cid in sample_clients(data.num_clients, cfg.clients_per_round, fed.seed, r):
                    cid = int(cid)
                    seed_all(derive_seed(fed.seed, r, cid))
                    side.on_round_start(r, cfg.rounds)
                    client = data.client_data(cid)
                    sent = method.client_payload(payload, cid)
                    objective = side.objective(sent, client, self.states.get(cid))
                    kept = side.kept_optimizers
                    self.fit(objective, side.loader(client), cfg.local_epochs, kept)
                    shared = {
                        k: v.detach().clone()
                        for k, v in objective.network.state_dict().items()
                        if side.is_shared(k)
                    }
                    self.states[cid] = side.state(objective, self.states.get(cid))
                    updates.append(ClientUpdate(cid, {MODEL: shared}, len(client)))
            elif step == Step.AGGREGATE:
                method.aggregate(updates)
            elif step == Step.SERVER:
                seed_all(derive_seed(fed.seed, r, SERVER))
                objective = method.server_objective()
                assert objective is not None
                self.fit(objective, method.server_loader(data), cfg.server_epochs)
                method.server_step_done(objective, data, torch.device("cpu"))
            elif step != Step.RECEIVE or len(updates) < data.num_clients:
                raise NotImplementedError(f"the floor runs FedSEAL's plan, not {step}")
        method.end_round()
        seed_all(derive_seed(fed.seed, 0, EVAL))
        network = scored(method.eval_network(), data, torch.device("cpu"))
        if len(data.val):
            plain_accuracy(network, data.val_dataloader())
        return plain_accuracy(network, data.test_dataloader())[0]


# --- counting fedlit's host work -------------------------------------------------------------
class Counts:
    """Counts of host work, by name, while :meth:`counting` is active."""

    def __init__(self) -> None:
        self.now: Counter[str] = Counter()
        self.active = False
        self.in_client = False

    def add(self, name: str) -> None:
        if self.active:
            self.now[name] += 1


def install_counters(counts: Counts) -> None:
    """Wrap what is counted (once per process)."""
    from fedlit.federation import client as client_module
    from fedlit.federation import store as store_module
    from fedlit.methods import client_side, fedcon, teacher_student

    trainer_init = lightning.Trainer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        counts.add("Trainers built")
        if counts.in_client:
            counts.add("Trainers built in client fits")
        trainer_init(self, *args, **kwargs)

    lightning.Trainer.__init__ = init  # type: ignore[method-assign]

    def moving(name: str) -> None:
        original = getattr(nn.Module, name)

        def wrapped(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if isinstance(self, (LightningModule, Classifier)):
                counts.add("network moves (to/cpu/cuda)")
            return original(self, *args, **kwargs)

        setattr(nn.Module, name, wrapped)

    for name in ("to", "cpu", "cuda"):
        moving(name)

    deepcopy = copy.deepcopy

    def counted_deepcopy(x: Any, *args: Any) -> Any:
        if isinstance(x, nn.Module):
            counts.add("deep copies of a network")
        return deepcopy(x, *args)

    copy.deepcopy = counted_deepcopy

    state_dict = nn.Module.state_dict

    def counted_state_dict(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not args and kwargs.get("prefix", "") == "":
            counts.add("state_dict() calls")
        return state_dict(self, *args, **kwargs)

    nn.Module.state_dict = counted_state_dict  # type: ignore[method-assign,assignment]

    for module in (client_side, fedcon, teacher_student):
        host_copy = getattr(module, "host_copy", None)
        if host_copy is None:  # (its uploads stay where they were computed)
            continue

        def counted_host_copy(*args: Any, _copy: Any = host_copy, **kwargs: Any) -> Any:
            counts.add("uploads copied to the host")
            return _copy(*args, **kwargs)

        module.host_copy = counted_host_copy  # type: ignore[attr-defined]

    save = store_module._save

    def counted_save(path: Path, state: Any) -> None:
        counts.add("client-state files written")
        save(path, state)

    store_module._save = counted_save  # type: ignore[attr-defined]
    load = torch.load

    def counted_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, (str, Path)) and f"/{store_module.CLIENT_DIR}/" in str(f):
            counts.add("client-state files read")
        return load(f, *args, **kwargs)

    torch.load = counted_load
    runner_call = client_module.ClientRunner.__call__

    def client_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts.in_client = True
        try:
            return runner_call(self, *args, **kwargs)
        finally:
            counts.in_client = False

    client_module.ClientRunner.__call__ = client_call  # type: ignore[method-assign]


@contextmanager
def counting(counts: Counts) -> Iterator[None]:
    counts.now, counts.active = Counter(), True
    try:
        yield
    finally:
        counts.active = False


# --- the measurement ------------------------------------------------------------------------
def federation(args: argparse.Namespace, run_dir: Path, seed: int = 0) -> Federation:
    overrides = [
        f"--config={RECIPE}",
        f"--seed_everything={seed}",
        f"--data.root={args.root}",
        "--model.init_args.network.backbone=host_round.NearFree",
        "--model.init_args.bootstrap_epochs=1",
        f"--federation.rounds={args.rounds}",
        "--trainer.precision=32-true",
        "--trainer.accelerator=cpu",
    ]
    if args.compile:
        overrides.append(f"--federation.compile={args.compile}")
    if args.examples:
        overrides.append(f"--data.examples_per_client={args.examples}")
    fed = federation_of(resolve(overrides), run_dir, progress=False)
    fed.prepare()
    return fed


def trainer_per_fit() -> None:
    """Every fit in a Lightning Trainer: the engine before fedlit's loop, which fedlit no
    longer has (its objectives always fit in fedlit's loop)."""
    raise SystemExit(
        "--trainer-per-fit: fedlit's objectives no longer fit in a Trainer; check out a "
        "commit before fedlit.federation.fit to measure that engine"
    )


def run_once(args: argparse.Namespace, counts: Counts, seed: int) -> dict[str, Any]:
    """One repeat: fresh federations, the three paths round by round, their order rotated
    each round; each path's CPU and wall seconds per round (rounds 2-N), fedlit's counts and
    every round's test/acc."""
    with tempfile.TemporaryDirectory() as tmp:
        fed = federation(args, Path(tmp) / "fedlit", seed)
        floor = Floor(federation(args, Path(tmp) / "floor", seed), args.compile)
        fed.open_run_dir()
        fed.callbacks.run_start()
        fed.callbacks.first_row({"round": 0, **fed.server.bootstrap()})
        plain = PlainFloor(fed, seed)  # the bootstrapped weights and thresholds, copied
        seed_all(0)
        floor.fed.server.bootstrap()
        cpu: dict[str, list[float]] = {p: [] for p in PATHS}
        wall: dict[str, list[float]] = {p: [] for p in PATHS}
        per_round: list[Counter[str]] = []
        accs: dict[str, list[float]] = {p: [] for p in PATHS}
        profiles = {p: cProfile.Profile() for p in args.profile}

        def fedlit_round(r: int) -> float:
            with counting(counts):
                return float(fed.run_and_record_round(r)["test/acc"])

        paths = {"fedlit": fedlit_round, "objects floor": floor.round, "plain floor": plain.round}
        for r in range(1, args.rounds + 1):
            order = PATHS[r % 3 :] + PATHS[: r % 3]
            for path in order:
                profiled = path in args.profile and r > 1
                c0, w0 = time.process_time(), time.perf_counter()
                if profiled:
                    profiles[path].enable()
                accs[path].append(paths[path](r))
                if profiled:
                    profiles[path].disable()
                c1, w1 = time.process_time(), time.perf_counter()
                if r > 1:
                    cpu[path].append(c1 - c0)
                    wall[path].append(w1 - w0)
            if r > 1:
                per_round.append(counts.now)
            print(f"round {r}: " + ", ".join(f"{p} {cpu[p][-1]:.3f}" for p in PATHS if r > 1)
                  + " s CPU", flush=True)  # fmt: skip
        fed.close()
    for path, profile in profiles.items():
        print(f"\n--- {path}: rounds 2-{args.rounds}, by {args.profile_sort}")
        pstats.Stats(profile).sort_stats(args.profile_sort).print_stats(args.profile_lines)
    return {"cpu": cpu, "wall": wall, "counts": per_round, "accs": accs}


def median_ratio(cpu: dict[str, list[float]], over: str) -> float:
    return statistics.median(a / b for a, b in zip(cpu["fedlit"], cpu[over], strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds per path (1 warms up)")
    parser.add_argument("--repeats", type=int, default=1, help="runs in this process")
    parser.add_argument("--seeds", type=int, default=1, help="repeats' seeds: 0, 1, ...")
    parser.add_argument(
        "--profile", nargs="*", default=[], choices=PATHS, help="cProfile these paths"
    )
    parser.add_argument("--profile-lines", type=int, default=30)
    parser.add_argument("--profile-sort", default="tottime", help="pstats' key: cumulative")
    parser.add_argument("--compile", default=None, help="federation.compile (default: eager)")
    parser.add_argument("--examples", type=int, default=None, help="images per client")
    parser.add_argument("--root", default="data")
    parser.add_argument(
        "--trainer-per-fit", action="store_true", help="fedlit fits in a Trainer every time"
    )
    args = parser.parse_args()
    BatchView.apply = normalise_only  # type: ignore[method-assign]
    if args.trainer_per_fit:
        trainer_per_fit()
    counts = Counts()
    install_counters(counts)
    runs = []
    for k in range(args.repeats):
        seed = k % args.seeds
        print(f"-- repeat {k + 1} of {args.repeats} (seed {seed})", flush=True)
        runs.append(run_once(args, counts, seed))
    mode = args.compile or "eager"
    print(f"\n{mode}; medians of rounds 2-{args.rounds}, per repeat:")
    for k, run in enumerate(runs, 1):
        cpu, wall = run["cpu"], run["wall"]
        print(f"  repeat {k}: CPU s/round "
              + ", ".join(f"{p} {statistics.median(cpu[p]):.3f}" for p in PATHS)
              + f"; wall fedlit {statistics.median(wall['fedlit']):.3f}"
              + f"; fedlit / plain floor {median_ratio(cpu, 'plain floor'):.3f}"
              + f", fedlit / objects floor {median_ratio(cpu, 'objects floor'):.3f}")  # fmt: skip
    for over in PATHS[1:]:
        ratios = [median_ratio(run["cpu"], over) for run in runs]
        print(f"  fedlit / {over}: median {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} repeats)")  # fmt: skip
    print("  fedlit's counts per round (median, repeat 1):")
    per_round = runs[0]["counts"]
    names = sorted({k for c in per_round for k in c} | set(COUNTED))
    for name in names:
        print(f"    {name}: {statistics.median(c[name] for c in per_round):g}")
    for k, run in enumerate(runs, 1):
        accs = run["accs"]
        same = all(abs(a - b) < 1e-6 for a, b in zip(accs["fedlit"], accs["objects floor"]))
        print(f"  repeat {k}: test/acc fedlit vs objects floor, every round: "
              f"{'identical' if same else 'differ'}; last round: "
              + ", ".join(f"{p} {accs[p][-1]:.4f}" for p in PATHS))  # fmt: skip


COUNTED = (
    "Trainers built",
    "Trainers built in client fits",
    "network moves (to/cpu/cuda)",
    "deep copies of a network",
    "state_dict() calls",
    "uploads copied to the host",
    "client-state files written",
    "client-state files read",
)


if __name__ == "__main__":
    main()
