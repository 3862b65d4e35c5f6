"""The round loop every method shares: no files, no printing; what a round produces is its
metrics, and what happens around it (logging, checkpoints, progress) is a callback's
(:mod:`fedlit.federation.callbacks`).

Each round: (server step) -> sample C of K clients -> broadcast -> clients' work (through the
run's executor) -> aggregate -> (server step) -> end of round -> evaluate. Whether the server
trains before broadcasting or after aggregating is the method's ``server_first``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fedlit.aggregation.payloads import payload_bytes
from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.sampling import sample_clients
from fedlit.federation.callbacks import Callbacks
from fedlit.federation.client import ClientJob, ReceiveJob
from fedlit.federation.config import FederationConfig
from fedlit.federation.console import first_line
from fedlit.federation.executors import ClientExecutor, InProcess
from fedlit.federation.faults import ClientFault, fault_metrics, upload_fault
from fedlit.federation.server import Server
from fedlit.federation.store import ClientStateStore
from fedlit.methods.base import ClientUpdate, FederatedMethod


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


def run_round(ctx: RoundContext, round_idx: int) -> dict[str, float]:
    """Round ``round_idx`` of a run (``ctx``); returns its metrics."""
    t0 = time.perf_counter()
    method, cfg = ctx.method, ctx.config
    metrics: dict[str, float] = {"round": float(round_idx)}
    method.on_round_start(round_idx, cfg.rounds)
    ctx.store.begin_round(round_idx)
    if method.server_first or not method.uses_clients:
        ctx.callbacks.stage(round_idx, "server step")
        metrics |= ctx.server.server_step(round_idx)
    down: Counter[str] = Counter()  # bytes sent down / up, by payload part
    up: Counter[str] = Counter()
    if method.uses_clients:
        updates = _clients(ctx, round_idx, metrics, down, up)
        method.aggregate(updates)
        ctx.server.check_finite(round_idx, "aggregation")
        metrics |= mean_metrics("client", [u.metrics for u in updates])
        metrics |= method.round_metrics()
        if not method.server_first:
            ctx.callbacks.stage(round_idx, "server step")
            metrics |= ctx.server.server_step(round_idx)
        elif method.server_finetunes:  # paper 000's Algorithm 1: fine-tune the aggregate
            ctx.callbacks.stage(round_idx, "fine-tune")
            metrics |= ctx.server.server_step(round_idx, stage="finetune")
    method.end_round()
    ctx.server.check_finite(round_idx, "the end of the round (end_round)")
    if round_idx % cfg.eval_every == 0 or round_idx == cfg.rounds:
        ctx.callbacks.stage(round_idx, "evaluation")
        metrics |= ctx.server.evaluate()
    for direction, counts in (("down", down), ("up", up)):  # in all, then by part
        metrics[f"comm/bytes_{direction}"] = float(sum(counts.values()))
        metrics |= {f"comm/bytes_{direction}/{part}": float(n) for part, n in counts.items()}
    if ctx.store.bytes_written:  # the client states this round wrote
        metrics["state/bytes_written"] = float(ctx.store.bytes_written)
    metrics["time/round_s"] = time.perf_counter() - t0
    return metrics


def _clients(
    ctx: RoundContext,
    round_idx: int,
    metrics: dict[str, float],
    down: Counter[str],
    up: Counter[str],
) -> list[ClientUpdate]:
    """Sample, broadcast, run the clients, keep their states; the survivors' updates. A client
    that raises or uploads a non-finite value is left out of the round (``fault/*``)."""
    method, cfg = ctx.method, ctx.config
    clients = sample_clients(ctx.data.num_clients, cfg.clients_per_round, ctx.seed, round_idx)
    payload = method.broadcast()
    jobs = []
    for cid in clients.tolist():
        ctx.visits[cid] = ctx.visits.get(cid, 0) + 1  # a faulty visit counts too
        sent = method.client_payload(payload, cid)
        down.update(payload_bytes(sent))
        jobs.append(ClientJob(cid, sent, ctx.store.get(cid), ctx.visits[cid]))
    kept: list[tuple[ClientJob, ClientUpdate]] = []
    faults: list[ClientFault] = []
    for job, result in zip(jobs, _run_clients(ctx, round_idx, jobs), strict=True):
        if isinstance(result, Exception):
            why = ": ".join(filter(None, (type(result).__name__, first_line(result))))
            fault: ClientFault | None = ClientFault(job.client_id, "raised", why)
        else:
            up.update(payload_bytes(result.upload))
            fault = upload_fault(job.client_id, result.upload)
        if fault is not None:  # left out; its persistent state stays as it was
            faults.append(fault)
            ctx.callbacks.client_fault(round_idx, fault)
            continue
        assert isinstance(result, ClientUpdate)
        ctx.store.put(job.client_id, result.state)
        kept.append((job, result))
    if method.all_clients_receive:  # the others receive the round's broadcast too
        idle = sorted(set(range(ctx.data.num_clients)) - set(clients.tolist()))
        for part, n in payload_bytes(payload).items():
            down[part] += n * len(idle)
        states = ctx.executor.receive(
            ReceiveJob(
                payload,
                idle,
                [ctx.store.get(cid) for cid in idle],
                [max(ctx.visits.get(cid, 0), 1) for cid in idle],
            )
        )
        for cid, state in zip(idle, states, strict=True):
            ctx.store.put(cid, state)
    updates = [update for _, update in kept]
    ctx.server.check_survivors(round_idx, len(clients), updates, faults)
    metrics |= fault_metrics(faults)
    ctx.callbacks.updates(round_idx, [job.payload for job, _ in kept], updates, metrics)
    return updates


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
