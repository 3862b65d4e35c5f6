"""The round loop every method shares: no files, no printing; what a round produces is its
metrics, and what happens around it (logging, checkpoints, progress) is a callback's
(:mod:`fedlit.federation.callbacks`).

Each round: the method's ``on_round_start``, then the steps of its plan
(:meth:`~fedlit.methods.FederatedMethod.round_plan`, :class:`~fedlit.methods.plan.Step`) in
order, then its ``end_round`` and, every ``federation.eval_every`` rounds, the evaluation.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedlit.aggregation.payloads import Payload, payload_bytes
from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.sampling import sample_clients
from fedlit.federation.callbacks import Callbacks
from fedlit.federation.client import ClientJob, ReceiveJob
from fedlit.federation.config import FederationConfig
from fedlit.federation.console import first_line
from fedlit.federation.executors import ClientExecutor, InProcess
from fedlit.federation.faults import ClientFault, WorkerDied, fault_metrics, upload_fault
from fedlit.federation.server import Server
from fedlit.federation.store import ClientStateStore
from fedlit.methods.base import FederatedMethod
from fedlit.methods.client_side import ClientUpdate
from fedlit.methods.plan import Step


@dataclass(frozen=True)
class RoundContext:
    """What a round works with: the run's method, settings and data, the client states and
    visits it updates, the run's seed, the callbacks it announces stages to, the server's
    steps and guards, and the clients' executor."""

    method: FederatedMethod
    config: FederationConfig
    data: FederatedDataModule
    store: ClientStateStore
    visits: dict[int, int]  # client id -> rounds it has been selected in (updated here)
    seed: int
    callbacks: Callbacks
    server: Server
    #: The run's executor, started on its first call (the first round with clients).
    start_executor: Callable[[], ClientExecutor]

    @property
    def executor(self) -> ClientExecutor:
        """Where the clients' work runs (``federation.executor``)."""
        return self.start_executor()


@dataclass
class RoundWork:
    """What a round's steps hand on to the later ones, and the round's metrics so far."""

    metrics: dict[str, float]
    down: Counter[str] = field(default_factory=Counter)  # bytes sent down / up, by part
    up: Counter[str] = field(default_factory=Counter)
    payload: Payload | None = None  # the round's broadcast
    sampled: list[int] = field(default_factory=list)  # the clients sampled to train
    kept: list[tuple[ClientJob, ClientUpdate]] = field(default_factory=list)  # the survivors
    faults: list[ClientFault] = field(default_factory=list)  # the clients left out


def run_round(ctx: RoundContext, round_idx: int) -> dict[str, float]:
    """Round ``round_idx`` of a run (``ctx``); returns its metrics."""
    t0 = time.perf_counter()
    method, cfg = ctx.method, ctx.config
    work = RoundWork({"round": float(round_idx)})
    method.on_round_start(round_idx, cfg.rounds)
    ctx.store.begin_round(round_idx)
    for step in method.round_plan().steps:
        STEPS[step](ctx, round_idx, work)
    ended = method.end_round() or {}  # (None from a method written before it returned)
    ctx.server.check_finite(round_idx, "the end of the round (end_round)")
    metrics = work.metrics | ended
    if round_idx % cfg.eval_every == 0 or round_idx == cfg.rounds:
        ctx.callbacks.stage(round_idx, "evaluation")
        metrics |= ctx.server.evaluate(round_idx=round_idx)
    for direction, counts in (("down", work.down), ("up", work.up)):  # in all, then by part
        metrics[f"comm/bytes_{direction}"] = float(sum(counts.values()))
        metrics |= {f"comm/bytes_{direction}/{part}": float(n) for part, n in counts.items()}
    if ctx.store.bytes_written:  # the client states changed, written with the checkpoint
        metrics["state/bytes_written"] = float(ctx.store.bytes_written)
    metrics["time/round_s"] = time.perf_counter() - t0
    return metrics


def _server(ctx: RoundContext, round_idx: int, work: RoundWork) -> None:
    """:attr:`Step.SERVER`: the server's objective on its labeled set (``server/*``)."""
    ctx.callbacks.stage(round_idx, "server step")
    work.metrics |= ctx.server.server_step(round_idx)


def _broadcast(ctx: RoundContext, round_idx: int, work: RoundWork) -> None:
    """:attr:`Step.BROADCAST`: what the server sends this round."""
    work.payload = ctx.method.broadcast()


def _clients(ctx: RoundContext, round_idx: int, work: RoundWork) -> None:
    """:attr:`Step.CLIENTS`: sample, send each its payload, run the clients, keep the states
    of the survivors. A client that raises, uploads a non-finite value or whose worker process
    died on every attempt is left out of the round (``fault/*``); its persistent state stays
    as it was."""
    method, cfg = ctx.method, ctx.config
    assert work.payload is not None  # the plan broadcasts before the clients (RoundPlan)
    work.sampled = sample_clients(
        ctx.data.num_clients, cfg.clients_per_round, ctx.seed, round_idx
    ).tolist()
    jobs = []
    for cid in work.sampled:
        ctx.visits[cid] = ctx.visits.get(cid, 0) + 1  # a faulty visit counts too
        sent = method.client_payload(work.payload, cid)
        work.down.update(payload_bytes(sent))
        jobs.append(ClientJob(cid, sent, ctx.store.get(cid), ctx.visits[cid]))
    for job, result in zip(jobs, _run_clients(ctx, round_idx, jobs), strict=True):
        if isinstance(result, WorkerDied):
            fault: ClientFault | None = ClientFault(job.client_id, "died", str(result))
        elif isinstance(result, Exception):
            why = ": ".join(filter(None, (type(result).__name__, first_line(result))))
            fault = ClientFault(job.client_id, "raised", why)
        else:
            work.up.update(payload_bytes(result.upload))
            fault = upload_fault(job.client_id, result.upload)
        if fault is not None:
            work.faults.append(fault)
            ctx.callbacks.client_fault(round_idx, fault)
            continue
        assert isinstance(result, ClientUpdate)
        ctx.store.put(job.client_id, result.state)
        work.kept.append((job, result))


def _receive(ctx: RoundContext, round_idx: int, work: RoundWork) -> None:
    """:attr:`Step.RECEIVE`: the clients not sampled receive the round's broadcast and keep
    their new states."""
    assert work.payload is not None
    idle = sorted(set(range(ctx.data.num_clients)) - set(work.sampled))
    for part, n in payload_bytes(work.payload).items():
        work.down[part] += n * len(idle)
    states = ctx.executor.receive(
        ReceiveJob(
            work.payload,
            idle,
            [ctx.store.get(cid) for cid in idle],
            [max(ctx.visits.get(cid, 0), 1) for cid in idle],
        )
    )
    for cid, state in zip(idle, states, strict=True):
        ctx.store.put(cid, state)


def _aggregate(ctx: RoundContext, round_idx: int, work: RoundWork) -> None:
    """:attr:`Step.AGGREGATE`: stop the run if too few clients survived, let the callbacks
    observe the updates, aggregate them; the clients' metrics averaged (``client/*``)."""
    method, metrics = ctx.method, work.metrics
    updates = [update for _, update in work.kept]
    ctx.server.check_survivors(round_idx, len(work.sampled), updates, work.faults)
    metrics |= fault_metrics(work.faults)
    ctx.callbacks.updates(round_idx, [job.payload for job, _ in work.kept], updates, metrics)
    method.aggregate(updates)
    ctx.server.check_finite(round_idx, "aggregation")
    metrics |= mean_metrics("client", [u.metrics for u in updates])


def _finetune(ctx: RoundContext, round_idx: int, work: RoundWork) -> None:
    """:attr:`Step.FINETUNE`: the server's objective again, on the aggregate (``finetune/*``)."""
    ctx.callbacks.stage(round_idx, "fine-tune")
    work.metrics |= ctx.server.server_step(round_idx, stage="finetune")


def _central(ctx: RoundContext, round_idx: int, work: RoundWork) -> None:
    """:attr:`Step.CENTRAL`: the method's objective on every client's images at the server
    (``central/*``)."""
    ctx.callbacks.stage(round_idx, "centralized step")
    work.metrics |= ctx.server.central_step(round_idx)


#: What the loop runs for each step of a plan.
STEPS: dict[Step, Callable[[RoundContext, int, RoundWork], None]] = {
    Step.SERVER: _server,
    Step.BROADCAST: _broadcast,
    Step.CLIENTS: _clients,
    Step.RECEIVE: _receive,
    Step.AGGREGATE: _aggregate,
    Step.FINETUNE: _finetune,
    Step.CENTRAL: _central,
}


def _run_clients(
    ctx: RoundContext, round_idx: int, jobs: Sequence[ClientJob]
) -> list[ClientUpdate | Exception]:
    """The jobs through the run's executor; in the driver's process one at a time, each
    announced as a stage (``client k/C``), elsewhere all at once (``C clients``)."""
    executor = ctx.executor
    if not isinstance(executor, InProcess):
        ctx.callbacks.stage(round_idx, f"{len(jobs)} clients")
        return executor.run(jobs, round_idx)
    results: list[ClientUpdate | Exception] = []
    for k, job in enumerate(jobs, start=1):
        ctx.callbacks.stage(round_idx, f"client {k}/{len(jobs)}")
        results += executor.run([job], round_idx)
    return results


def mean_metrics(prefix: str, per_client: Sequence[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the clients that report it, as ``<prefix>/<name>``; names that
    carry their own namespace (``pseudo/pos_acc``, ``kl/teacher``) are kept as they are."""
    keys = sorted({k for m in per_client for k in m})
    return {
        (k if "/" in k else f"{prefix}/{k}"): float(np.mean([m[k] for m in per_client if k in m]))
        for k in keys
    }
