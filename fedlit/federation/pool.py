"""The clients' work on a pool of local worker processes (``federation.executor: pool``).

Many clients at once on one machine, without Ray: the standard library's
:class:`~concurrent.futures.ProcessPoolExecutor` with the ``spawn`` start method (each worker a
fresh interpreter, so several workers may share one GPU, each with its own CUDA context). Each
worker receives the run's :class:`~fedlit.federation.client.ClientRunner` (the method's
client side and the data) once, when it starts, sets torch's thread count, and runs one client
at a time for the whole run. What crosses between processes is pickled bytes (each round's
payload pickled once, each client's state and update), so no tensor is shared in memory.

A client's work is a function of its inputs (seeded from the run seed, the round and the client;
a worker's persistent networks overwritten for each client), so the results are those of
:class:`~fedlit.federation.executors.InProcess` at the same torch thread count, whichever worker
runs which client, in whichever order.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from types import FrameType
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities.exceptions import SIGTERMException

from fedlit.federation.trainers import TERMINATED

if TYPE_CHECKING:
    from fedlit.federation.client import ClientJob, ClientRunner, ReceiveJob
    from fedlit.methods.client_side import ClientUpdate


@dataclass(frozen=True)
class PoolSettings:
    """How :class:`ProcessPool` runs (the ``federation.pool.*`` settings).

    Args:
        workers: worker processes, each running one client at a time; None: as many as this
            machine's CPU cores fit at ``threads`` each, at most ``clients_per_round``. On a GPU
            every worker uses the run's device (several workers share one GPU).
        threads: torch's thread count in each worker.
        max_retries: times a round's unfinished clients are run again on a fresh pool when a
            worker process dies; a client still unfinished after that is left out of its
            round as a fault.
    """

    workers: int | None = None
    threads: int = 1
    max_retries: int = 3

    def __post_init__(self) -> None:
        if self.workers is not None and not _positive(self.workers):
            raise ValueError(
                f"federation.pool.workers must be a positive integer, got {self.workers!r}"
            )
        if not _positive(self.threads):
            raise ValueError(
                f"federation.pool.threads must be a positive integer, got {self.threads!r}"
            )
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(
                f"federation.pool.max_retries must be an integer >= 0, got {self.max_retries!r}"
            )


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def available_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# --- in the worker processes ------------------------------------------------------------------
_RUNNER: ClientRunner | None = None  # the worker's runner, set once by _start_worker


def _start_worker(runner_bytes: bytes, threads: int) -> None:
    """A worker's start: signals left to the driver, torch's threads, the runner (once)."""
    global _RUNNER
    # Ctrl-C and a SIGTERM sent to the process group stop the driver, which stops the pool; a
    # worker that acted on them itself would look like a dead worker and have its client retried.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_parent()
    import torch

    torch.set_num_threads(threads)
    _RUNNER = pickle.loads(runner_bytes)


def _exit_with_parent() -> None:
    """End this worker as soon as the driver's process is gone (killed, not only stopped)."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return
    sentinel = parent.sentinel

    def watch() -> None:
        wait([sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="fedlit-parent-watch", daemon=True).start()


def _runner() -> ClientRunner:
    assert _RUNNER is not None, "not a pool worker"
    return _RUNNER


def _run_client(payload: bytes, job: bytes) -> bytes:
    """One client's round in a worker; its pickled :class:`~fedlit.methods.ClientUpdate`."""
    client_id, round_idx, state, visit = pickle.loads(job)
    update = _runner()(pickle.loads(payload), client_id, round_idx, state, visit)
    return pickle.dumps(update, pickle.HIGHEST_PROTOCOL)


def _receive(payload: bytes, job: bytes) -> bytes:
    """A receive job's clients (a :meth:`ReceiveJob.part`) receive ``payload`` without
    training, in a worker: their pickled states."""
    new_states = _runner().receive(replace(pickle.loads(job), payload=pickle.loads(payload)))
    return pickle.dumps(new_states, pickle.HIGHEST_PROTOCOL)


# --- in the driver ----------------------------------------------------------------------------
Call = tuple[Callable[..., bytes], tuple[Any, ...]]


class ProcessPool:
    """The clients' work on long-lived local worker processes (``federation.executor: pool``).

    The jobs go to free workers as they finish; the results come back in the jobs' order. An
    exception raised by a client's own work is that client's fault, as in-process; a worker
    process that dies (:class:`~concurrent.futures.process.BrokenProcessPool`) has the pool
    restarted and the round's unfinished jobs run again, up to ``max_retries`` times. A SIGTERM
    or Ctrl-C in the driver stops the run as in-process (the workers are killed); the workers
    ignore both, and end by themselves if the driver's process dies.
    """

    def __init__(self, runner: ClientRunner, settings: PoolSettings, clients_per_round: int):
        self.settings = settings
        self.workers = settings.workers or max(
            1, min(available_cores() // settings.threads, clients_per_round)
        )
        self._runner = pickle.dumps(runner, pickle.HIGHEST_PROTOCOL)  # pickled once
        self._pool: ProcessPoolExecutor | None = None
        self.restarts = 0  # pools started again after a worker died, over the run

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(self._runner, self.settings.threads),
            )
        return self._pool

    def run(self, jobs: Sequence[ClientJob], round_idx: int) -> list[ClientUpdate | Exception]:
        payloads: dict[int, bytes] = {}  # one pickle of each distinct payload
        for job in jobs:
            if id(job.payload) not in payloads:
                payloads[id(job.payload)] = pickle.dumps(job.payload, pickle.HIGHEST_PROTOCOL)
        calls: list[Call] = [
            (
                _run_client,
                (
                    payloads[id(job.payload)],
                    pickle.dumps(
                        (job.client_id, round_idx, job.state, job.visit), pickle.HIGHEST_PROTOCOL
                    ),
                ),
            )
            for job in jobs
        ]
        return [
            out if isinstance(out, Exception) else pickle.loads(out) for out in self._gather(calls)
        ]

    def receive(self, job: ReceiveJob) -> list[Any]:
        """Spread over the workers: worker i takes clients i, i + workers, ..."""
        if not len(job):
            return []
        sent = pickle.dumps(job.payload, pickle.HIGHEST_PROTOCOL)  # once for all workers
        chunks = job.chunks(self.workers)
        calls: list[Call] = [
            (_receive, (sent, pickle.dumps(job.part(c), pickle.HIGHEST_PROTOCOL))) for c in chunks
        ]
        out: list[Any] = [None] * len(job)
        for c, result in zip(chunks, self._gather(calls), strict=True):
            if isinstance(result, Exception):
                raise result
            out[c] = pickle.loads(result)
        return out

    def _gather(self, calls: Sequence[Call]) -> list[bytes | Exception]:
        """Each call's result or exception, in order; those a dead worker left unfinished are
        run again on a fresh pool, up to ``max_retries`` times."""
        results: list[bytes | Exception | None] = [None] * len(calls)
        pending = list(range(len(calls)))
        retries = 0
        with _sigterm_stops_the_run():
            try:
                while pending:
                    pool = self._executor()
                    futures = [(i, _submit(pool, calls[i])) for i in pending]
                    pending = []
                    for i, future in futures:
                        try:
                            results[i] = future.result()
                        except BrokenProcessPool as err:
                            pending.append(i)
                            results[i] = err
                        except Exception as err:  # the client's own work raised
                            results[i] = err
                    if pending:  # a worker died: the others were stopped with it
                        self._shutdown(kill=True)
                        if retries == self.settings.max_retries:
                            break  # left as BrokenProcessPool: the clients' faults
                        retries += 1
                        self.restarts += 1
            except BaseException:  # SIGTERM, Ctrl-C: stop now, not after the running clients
                self._shutdown(kill=True)
                raise
        assert all(r is not None for r in results)
        return [r for r in results if r is not None]

    def pids(self) -> list[int]:
        """The worker processes' ids (those started so far)."""
        return sorted(p.pid for p in self._processes() if p.pid is not None)

    def _processes(self) -> list[multiprocessing.process.BaseProcess]:
        # ProcessPoolExecutor keeps its processes private; Python 3.14 adds kill_workers()
        return list((getattr(self._pool, "_processes", None) or {}).values())

    def _shutdown(self, kill: bool) -> None:
        if self._pool is None:
            return
        if kill:
            for process in self._processes():
                if process.is_alive():
                    process.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None

    def close(self) -> None:
        self._shutdown(kill=False)


def _submit(pool: ProcessPoolExecutor, call: Call) -> Future[bytes]:
    """``call`` submitted to ``pool``; a pool that broke already gives a failed future."""
    try:
        return pool.submit(call[0], *call[1])
    except BrokenProcessPool as err:
        future: Future[bytes] = Future()
        future.set_exception(err)
        return future


@contextmanager
def _sigterm_stops_the_run() -> Iterator[None]:
    """While the driver waits for its workers, a SIGTERM stops the run as a per-step Trainer
    does (:class:`SIGTERMException`, exit status 143), unless the process handles SIGTERM
    itself; the handler it had is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # another one does not cut the stopping
        raise SIGTERMException(TERMINATED)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
