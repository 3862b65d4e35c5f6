"""What each phase of a round costs the host: fedlit beside a plain PyTorch loop, same work.

For each method (FedAvg-FixMatch, FedSEAL, Server-SL) and backbone (the small CNN, ResNet-18) a
tiny in-process run on the generated ``synthetic`` data set is made twice, under a
``TorchDispatchMode`` that counts, per phase:

- syncs: host-device synchronisations, the ops that make a GPU's host wait for the device
  (``aten._local_scalar_dense``, what ``.item()``, ``float(t)`` and ``bool(t)`` reach,
  ``nonzero``, ``masked_select``, ``unique`` and indexing by a boolean mask, whose output shape
  depends on the values);
- dispatched ops: every aten op (on a GPU, about one kernel launch each);
- batch shapes: the distinct image shapes entering the network's first convolution;

and then again without the counter, timed: host time per phase at near-zero compute (tiny
batches and images, so what is left is mostly the host's work per op and per call).

The phases: ``client step`` (one training batch of a client: drawing it, its views, forward,
backward, optimiser), ``client set-up and upload`` (the rest of a client's round: its
objective, loader, Trainer, upload and state), ``server step`` and ``server set-up`` (the
same for the server's training), ``evaluation`` and ``aggregation``; ``other`` is the rest
(the round's bookkeeping, logging, checkpoints). Each is counted per unit: per client step,
per client, per server step, per server fit, per evaluation, per round.

The plain loop does the same work with the same objects: the same objectives (their
``training_step``), loaders, optimisers, seeds and steps, driven by a hand-written loop with no
Lightning, no logging and no checkpoints; the aggregation is a hand-written weighted average of
the uploads, the evaluation a hand-written loop after the same BatchNorm re-estimation.

    python benchmarks/step_profile.py                       # all methods, both backbones
    python benchmarks/step_profile.py --methods fixmatch --backbones small_cnn \
        --clients 4 --examples 128 --batch 32 --rounds 2     # issue 31's FixMatch count

Also printed: all ops and syncs of the whole run per client step (the issue's "ops per client
step, all phases together").
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fedlit.aggregation.payloads import MODEL, state_part
from fedlit.data import FederatedDataModule, sample_clients
from fedlit.evaluation import scored
from fedlit.federation import Federation, FederationConfig, TrainerTemplate
from fedlit.federation import rounds as rounds_module
from fedlit.federation.seeding import EVAL, FINETUNE, INIT, SERVER, derive_seed, seed_all
from fedlit.federation.server import Server
from fedlit.methods import FedAvgFixMatch, FederatedMethod, FedSEAL, SemiFL, ServerSL
from fedlit.methods.plan import Step
from fedlit.models import Architecture
from fedlit.objectives import Objective, Optimization, SemiFLLoss

aten = torch.ops.aten

#: Ops that wait for the device's values: a blocking copy to the host on a GPU.
SYNC_OPS = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.equal.default,
}

#: The convolutions whose image input is recorded (conv2d itself under inference_mode).
FIRST_LAYER_OPS = (aten.convolution.default, aten.conv2d.default)

PHASES = (
    "client step",
    "client set-up and upload",
    "server step",
    "server set-up",
    "evaluation",
    "aggregation",
    "other",
)
#: What each phase is counted per.
UNITS = {
    "client step": "step",
    "client set-up and upload": "client",
    "server step": "step",
    "server set-up": "fit",
    "evaluation": "eval",
    "aggregation": "round",
    "other": "run",
}


def is_sync(func: Any, args: tuple[Any, ...]) -> bool:
    """Whether ``func(*args)`` waits for the device: a sync op, or indexing by a bool mask."""
    if func in SYNC_OPS:
        return True
    if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
        indices = args[1] if len(args) > 1 else ()
        return any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
        )
    return False


@dataclass
class PhaseCounts:
    ops: int = 0
    syncs: int = 0
    seconds: float = 0.0
    units: int = 0
    shapes: set[tuple[int, ...]] = field(default_factory=set)
    sync_ops: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    op_names: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class Profile(TorchDispatchMode):
    """Counts ops, syncs and first-convolution input shapes per phase (``count``), and the
    host time spent in each phase, exclusive of the phases entered inside it."""

    def __init__(self, count: bool) -> None:
        super().__init__()
        self.count = count
        self.phases: dict[str, PhaseCounts] = defaultdict(PhaseCounts)
        self.stack = ["other"]
        self.mark = time.perf_counter()

    def _switch(self, to: str | None) -> None:
        now = time.perf_counter()
        self.phases[self.stack[-1]].seconds += now - self.mark
        self.mark = now
        if to is None:
            self.stack.pop()
        else:
            self.stack.append(to)

    @contextmanager
    def phase(self, name: str, unit: bool = True) -> Iterator[None]:
        """Work inside the block counts for ``name`` (and one more unit of it)."""
        if unit:
            self.phases[name].units += 1
        self._switch(name)
        try:
            yield
        finally:
            self._switch(None)

    @property
    def current(self) -> str:
        return self.stack[-1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        counts = self.phases[self.stack[-1]]
        counts.ops += 1
        counts.op_names[str(func)] += 1
        if is_sync(func, args):
            counts.syncs += 1
            counts.sync_ops[str(func)] += 1
        if func in FIRST_LAYER_OPS and args[0].shape[1] <= 3:
            counts.shapes.add(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))

    def session(self) -> AbstractContextManager[Any]:
        return self if self.count else nullcontext()


# --- fedlit's run, with its phases marked ----------------------------------------------------
@contextmanager
def patched(obj: Any, name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    original = getattr(obj, name) if not isinstance(obj, dict) else obj[name]
    if isinstance(obj, dict):
        obj[name] = wrap(original)
    else:
        setattr(obj, name, wrap(original))
    try:
        yield
    finally:
        if isinstance(obj, dict):
            obj[name] = original
        else:
            setattr(obj, name, original)


def in_phase(profile: Profile, name: str) -> Callable[[Any], Any]:
    def wrap(original: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            with profile.phase(name):
                return original(*args, **kwargs)

        return run

    return wrap


def in_step(profile: Profile) -> Callable[[Any], Any]:
    """One training batch (fetched, transferred, its step and hooks): a step of the client or
    server fit around it."""

    def wrap(original: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            outer = profile.current
            if outer == "client set-up and upload":
                name = "client step"
            elif outer == "server set-up":
                name = "server step"
            else:
                return original(*args, **kwargs)
            with profile.phase(name):
                return original(*args, **kwargs)

        return run

    return wrap


@contextmanager
def fedlit_phases(profile: Profile) -> Iterator[None]:
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    from fedlit.federation.fit import loop

    steps = rounds_module.STEPS
    with (
        patched(steps, Step.SERVER, in_phase(profile, "server set-up")),
        patched(steps, Step.FINETUNE, in_phase(profile, "server set-up")),
        patched(steps, Step.CLIENTS, in_phase(profile, "client set-up and upload")),
        patched(steps, Step.RECEIVE, in_phase(profile, "client set-up and upload")),
        patched(steps, Step.AGGREGATE, in_phase(profile, "aggregation")),
        patched(Server, "bootstrap", in_phase(profile, "server set-up")),
        patched(Server, "evaluate", in_phase(profile, "evaluation")),
        patched(_TrainingEpochLoop, "advance", in_step(profile)),  # a fit in a Trainer
        patched(loop.Fit, "step", in_step(profile)),  # a fit in fedlit's loop (its batch's step)
    ):
        yield


@dataclass(frozen=True)
class Setting:
    method: str
    backbone: str
    clients: int
    examples: int
    batch: int
    rounds: int
    server_epochs: int


METHODS: dict[str, Callable[[Setting], FederatedMethod]] = {
    "fixmatch": lambda s: FedAvgFixMatch(
        Architecture(10, 1, backbone=s.backbone), optim=Optimization(client_lr=0.003)
    ),
    "fedseal": lambda s: FedSEAL(Architecture(10, 1, backbone=s.backbone), bootstrap_epochs=1),
    "server_sl": lambda s: ServerSL(Architecture(10, 1, backbone=s.backbone)),
    "semifl": lambda s: SemiFL(Architecture(10, 1, backbone=s.backbone), loss=SemiFLLoss(tau=0.0)),
}


def federation(s: Setting, run_dir: Path) -> Federation:
    data = FederatedDataModule(
        dataset="synthetic",
        num_clients=s.clients,
        examples_per_client=s.examples,
        labeled_per_class=4,
        val_per_class=2,
        batch_size=s.batch,
        client_batch_size=s.batch,
        eval_batch_size=4 * s.batch,
        test_subset=4 * s.batch,
    )
    config = FederationConfig(
        rounds=s.rounds,
        clients_per_round=s.clients,
        server_epochs=s.server_epochs,
        eval_every=s.rounds,
    )
    trainer = TrainerTemplate(accelerator="cpu", precision="32-true")  # as the plain loop
    return Federation(
        METHODS[s.method](s), data, config, run_dir=run_dir, trainer=trainer, progress=False
    )


def run_fedlit(s: Setting, profile: Profile) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fed = federation(s, Path(tmp) / "run")
        fed.prepare()
        with fedlit_phases(profile), profile.session():
            fed.run()


# --- the same work as a plain PyTorch loop --------------------------------------------------
def plain_fit(
    objective: Objective, loader: Iterable[Any], epochs: int, profile: Profile, step: str
) -> None:
    """The objective's own loss and optimiser in a hand-written loop; each batch is a step."""
    objective.train()
    optimizer, scheduler = objective.optimizer_and_scheduler(epochs * len(loader))  # type: ignore[arg-type]
    objective.before_fit()
    for _ in range(epochs):
        batches = iter(loader)
        i = 0
        while True:
            with profile.phase(step):
                batch = next(batches, None)
                if batch is None:
                    profile.phases[step].units -= 1
                    break
                loss = objective.training_step(batch, i)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
            i += 1


def plain_server(
    method: FederatedMethod, data: FederatedDataModule, epochs: int, seed: int, profile: Profile
) -> None:
    with profile.phase("server set-up"):
        seed_all(seed)
        objective = method.server_objective()
        assert objective is not None
        plain_fit(objective, method.server_loader(data), epochs, profile, "server step")
        method.server_step_done(objective, data)


def plain_evaluate(method: FederatedMethod, data: FederatedDataModule, profile: Profile) -> None:
    with profile.phase("evaluation"), torch.no_grad():
        seed_all(derive_seed(0, 0, EVAL))
        network = scored(method.eval_network(), data, torch.device("cpu"))
        network.eval()
        correct = torch.zeros((), dtype=torch.long)
        for x, y in data.test_dataloader():
            correct += (network(x).argmax(-1) == y).sum()
        float(correct)  # one read per evaluation


def plain_run(s: Setting, profile: Profile) -> None:
    """``fed``'s run (bootstrap, rounds, the last evaluation) written directly in PyTorch."""
    with tempfile.TemporaryDirectory() as tmp:
        fed = federation(s, Path(tmp) / "run")
        fed.prepare()
    method, data, cfg = fed.method, fed.data, fed.config
    seed_all(derive_seed(fed.seed, 0, INIT))
    method.initialize()
    side = method.client_side()
    states: dict[int, Any] = {}
    plan = method.round_plan()
    with profile.session():
        if plan.bootstrap_epochs:
            method.on_round_start(0, cfg.rounds)
            plain_server(
                method, data, plan.bootstrap_epochs, derive_seed(fed.seed, 0, SERVER), profile
            )
        for r in range(1, cfg.rounds + 1):
            method.on_round_start(r, cfg.rounds)
            payload: Any = None
            uploads: list[tuple[dict[str, torch.Tensor], int]] = []
            sampled = sample_clients(data.num_clients, cfg.clients_per_round, fed.seed, r)
            for step in plan.steps:
                if step in (Step.SERVER, Step.FINETUNE):
                    tag = FINETUNE if step is Step.FINETUNE else SERVER
                    plain_server(
                        method, data, cfg.server_epochs, derive_seed(fed.seed, r, tag), profile
                    )
                elif step is Step.BROADCAST:
                    payload = method.broadcast()
                elif step is Step.CLIENTS:
                    for cid in sampled.tolist():
                        with profile.phase("client set-up and upload"):
                            seed_all(derive_seed(fed.seed, r, cid))
                            side.on_round_start(r, cfg.rounds)
                            client = data.client_data(cid, 1)
                            sent = method.client_payload(payload, cid)
                            objective = side.objective(sent, client, states.get(cid))
                            plain_fit(
                                objective,
                                side.loader(client),
                                cfg.local_epochs,
                                profile,
                                "client step",
                            )
                            uploads.append((state_part(side.upload(objective), MODEL), len(client)))
                            states[cid] = side.state(objective, states.get(cid))
                elif step is Step.RECEIVE:
                    with profile.phase("client set-up and upload", unit=False):
                        idle = sorted(set(range(data.num_clients)) - set(sampled.tolist()))
                        news = side.receive(
                            payload,
                            [data.client_data(c, 1) for c in idle],
                            [states.get(c) for c in idle],
                            torch.device("cpu"),
                        )
                        states.update(zip(idle, news, strict=True))
                elif step is Step.AGGREGATE:
                    with profile.phase("aggregation"):
                        total = sum(n for _, n in uploads)
                        average = {
                            k: sum(u[k].float() * (n / total) for u, n in uploads)
                            for k in uploads[0][0]
                        }
                        method.network.load_state_dict(average, strict=False)
            method.end_round()
        plain_evaluate(method, data, profile)


# --- the table ---------------------------------------------------------------------------
def profiled(run: Callable[[Setting, Profile], None], s: Setting, count: bool) -> Profile:
    profile = Profile(count)
    run(s, profile)
    profile._switch("other")  # close the last stretch of "other"
    return profile


def per_unit(counts: PhaseCounts, value: float) -> float:
    return value / max(counts.units, 1)


def shapes_text(shapes: set[tuple[int, ...]]) -> str:
    if not shapes:
        return "-"
    batches = sorted({s[0] for s in shapes}, reverse=True)
    return f"{len(shapes)}: B=" + ",".join(map(str, batches))


def report(s: Setting, repeats: int, top: int = 0) -> None:
    counted = {name: profiled(run, s, count=True) for name, run in RUNS.items()}
    times: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in RUNS}
    for _ in range(repeats):  # alternated, so both see the same machine
        for name, run in RUNS.items():
            timed = profiled(run, s, count=False)
            for phase, c in timed.phases.items():
                times[name][phase].append(1000 * per_unit(c, c.seconds))
    print(
        f"\n== {s.method}, {s.backbone}: {s.clients} clients x {s.examples} images, batch "
        f"{s.batch}, {s.rounds} rounds, {s.server_epochs} server epoch(s); torch threads "
        f"{torch.get_num_threads()}"
    )
    print(f"{'phase (per unit)':<32}" + "".join(f"{n:>42}" for n in RUNS))
    print(f"{'':<32}" + f"{'syncs':>8}{'ops':>9}{'ms':>9}{'shapes':>16}" * len(RUNS))
    for phase in PHASES:
        if all(phase not in counted[n].phases for n in RUNS):
            continue
        cells = ""
        for name in RUNS:
            c = counted[name].phases.get(phase, PhaseCounts())
            ms = statistics.median(times[name][phase]) if times[name][phase] else 0.0
            cells += (
                f"{per_unit(c, c.syncs):8.1f}{per_unit(c, c.ops):9.0f}{ms:9.2f}"
                f"{shapes_text(c.shapes):>16}"
            )
        print(f"{phase + ' (' + UNITS[phase] + ')':<32}{cells}")
    for name in RUNS:
        phases = counted[name].phases
        steps = phases["client step"].units if "client step" in phases else 0
        ops = sum(c.ops for c in phases.values())
        syncs = sum(c.syncs for c in phases.values())
        where = {p: dict(c.sync_ops) for p, c in phases.items() if c.syncs}
        line = f"{name}: the whole run {syncs} syncs, {ops} ops"
        if steps:
            line += f"; per client step {syncs / steps:.1f} syncs, {ops / steps:.0f} ops"
        print(line + f"; syncs by phase and op: {where}")
    if top:
        print(f"the {top} most dispatched ops per unit of each phase:")
        for phase in PHASES:
            for name in RUNS:
                c = counted[name].phases.get(phase)
                if c is None or not c.ops:
                    continue
                common = sorted(c.op_names.items(), key=lambda kv: -kv[1])[:top]
                cells = ", ".join(
                    f"{op.removeprefix('aten.')} {per_unit(c, n):.1f}" for op, n in common
                )
                print(f"  {phase} ({name}): {cells}")


RUNS: dict[str, Callable[[Setting, Profile], None]] = {"fedlit": run_fedlit, "plain": plain_run}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default="fixmatch,fedseal,server_sl")
    parser.add_argument("--backbones", default="small_cnn,resnet18")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--examples", type=int, default=16, help="images per client")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--server_epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of each")
    parser.add_argument("--top", type=int, default=0, help="also list each phase's N commonest ops")
    args = parser.parse_args()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    for backbone in args.backbones.split(","):
        for method in args.methods.split(","):
            s = Setting(
                method,
                backbone,
                args.clients,
                args.examples,
                args.batch,
                args.rounds,
                args.server_epochs,
            )
            report(s, args.repeats, args.top)


if __name__ == "__main__":
    main()
