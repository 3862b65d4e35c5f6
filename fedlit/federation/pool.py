"""The clients' work on a pool of local worker processes (``federation.executor: pool``).

Many clients at once on one machine, without Ray: worker processes started with
:mod:`multiprocessing`'s ``spawn`` start method (each a fresh interpreter, so several workers may
share one GPU, each with its own CUDA context), each joined to the driver by a pipe of its own.
Each worker receives the run's :class:`~fedlit.federation.client.ClientRunner` (the method's
client side and the data) once, when it starts, sets torch's thread count, and runs one client
at a time for the whole run. What crosses between processes is pickled bytes (each round's
payload pickled once, each client's state and update), so no tensor is shared in memory.

A client's work is a function of its inputs (seeded from the run seed, the round and the client;
a worker's persistent networks overwritten for each client), so the results are those of
:class:`~fedlit.federation.executors.InProcess` at the same torch thread count, whichever worker
runs which client, in whichever order. Because each worker runs one job at a time
on its own pipe, a worker process that dies names the job it was running: only that job is run
again (on a fresh worker), the other workers' jobs go on untouched, and a job whose worker dies
on every attempt is left out as its client's fault (:class:`~fedlit.federation.faults.WorkerDied`).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.util import Finalize
from types import FrameType
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities.exceptions import SIGTERMException

from fedlit.federation.faults import WorkerDied
from fedlit.federation.fit.trainer import TERMINATED
from fedlit.lifeline import parent_death_signal, run_tied
from fedlit.machine import available_cores

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
        max_retries: times a client's work is run again, on a fresh worker, after the worker
            process running it died; a client whose worker dies on each of its
            ``1 + max_retries`` attempts is left out of its round as a fault.
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
        if (
            not isinstance(self.max_retries, int)
            or isinstance(self.max_retries, bool)
            or self.max_retries < 0
        ):
            raise ValueError(
                f"federation.pool.max_retries must be an integer >= 0, got {self.max_retries!r}"
            )


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


# --- in the worker processes ------------------------------------------------------------------
_RUNNER: ClientRunner | None = None  # the worker's runner, set once by _start_worker


def _serve(conn: Connection, threads: int) -> None:
    """A worker's life: its start (:func:`_start_worker`, with the runner the driver sends
    first), then one request after another, each ``(function, args)`` pickled, answered with
    ``(True, result)`` or ``(False, exception)`` pickled, until the driver closes the pipe or
    is gone. Started by :func:`~fedlit.lifeline.run_tied`: tied to the driver's life from its
    first line, by the parent-death signal while it starts (its imports hold the interpreter
    for seconds), by a thread after."""
    _leave_signals_to_the_driver()
    try:
        runner = conn.recv_bytes()
        try:
            _start_worker(runner, threads)
            broken: Exception | None = None
        except Exception as err:  # every request gets it: its clients' faults, not a dead worker
            broken = err
        # set up: the thread watches the driver from now on (the signal would also come when
        # the driver's thread that started this worker ends)
        parent_death_signal(0)
        while True:
            function, args = pickle.loads(conn.recv_bytes())
            try:
                if broken is not None:
                    raise broken
                reply = pickle.dumps((True, function(*args)), pickle.HIGHEST_PROTOCOL)
            except Exception as err:  # the client's own work raised
                reply = pickle.dumps((False, _sendable(err)), pickle.HIGHEST_PROTOCOL)
            conn.send_bytes(reply)
    except (EOFError, OSError):  # the driver closed the pipe or is gone: end, printing nothing
        os._exit(0)


def _leave_signals_to_the_driver() -> None:
    """Ctrl-C and a SIGTERM sent to the process group stop the driver, which stops the pool; a
    worker that acted on them itself would look like a dead worker and have its client run
    again."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _start_worker(runner_bytes: bytes, threads: int) -> None:
    """A worker's start: torch's threads, the runner (once)."""
    global _RUNNER
    import torch

    torch.set_num_threads(threads)
    _RUNNER = pickle.loads(runner_bytes)


def _sendable(err: Exception) -> Exception:
    """``err`` if it survives pickling (its type and message reach the driver), else a
    RuntimeError that carries both as text."""
    try:
        pickle.loads(pickle.dumps(err, pickle.HIGHEST_PROTOCOL))
    except Exception:
        return RuntimeError(f"{type(err).__name__}: {err}")
    return err


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
Call = tuple[Callable[..., Any], tuple[Any, ...]]


@dataclass(eq=False)
class _Worker:
    """A worker process, the driver's end of its pipe, and the call it runs (None: idle)."""

    process: BaseProcess
    conn: Connection
    call: int | None = None

    @property
    def waits_on(self) -> list[Any]:
        """What becomes ready when it answers or dies: its pipe's end, its sentinel."""
        return [self.conn, self.process.sentinel]

    def send(self, message: bytes) -> None:
        """``message`` down the pipe; a worker that died before reading it is seen when the
        driver waits for its answer (its pipe's end and its sentinel are then ready)."""
        with suppress(OSError):
            self.conn.send_bytes(message)

    def kill(self) -> None:
        """End the process now (SIGKILL: it ignores SIGTERM) and reap it."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


class ProcessPool:
    """The clients' work on long-lived local worker processes (``federation.executor: pool``).

    The jobs go to free workers as they finish; the results come back in the jobs' order. An
    exception raised by a client's own work is that client's fault, as in-process. A worker
    process that dies takes only the job it was running with it: that job is run again on a
    fresh worker, up to ``max_retries`` times, and then comes back as
    :class:`~fedlit.federation.faults.WorkerDied`, its client's fault; the other workers' jobs
    are not touched. A SIGTERM or Ctrl-C in the driver stops the run as in-process and kills
    every worker at once (workers ignore both signals themselves); workers end by themselves
    if the driver's process dies, within a second, also while they start
    (:mod:`fedlit.lifeline`).
    """

    def __init__(self, runner: ClientRunner, settings: PoolSettings, clients_per_round: int):
        self.settings = settings
        self.workers = settings.workers or max(
            1, min(available_cores() // settings.threads, clients_per_round)
        )
        self._runner = pickle.dumps(runner, pickle.HIGHEST_PROTOCOL)  # pickled once
        self._context = multiprocessing.get_context("spawn")
        self._pool: list[_Worker] = []
        self.restarts = 0  # worker processes that died and were replaced, over the run
        # workers left when the interpreter exits without close() are killed, not waited for
        Finalize(self, _kill, args=(self._pool,), exitpriority=100)

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

    def _gather(self, calls: Sequence[Call]) -> list[Any]:
        """Each call's result or exception, in order. A call whose worker process died is run
        again on a fresh worker, up to ``max_retries`` times; after that its result is
        :class:`~fedlit.federation.faults.WorkerDied`. The other calls are not touched."""
        results: list[Any] = [None] * len(calls)
        done = [False] * len(calls)
        deaths: list[list[int | None]] = [[] for _ in calls]  # each attempt's exit code
        todo = deque(range(len(calls)))
        requests = [pickle.dumps(call, pickle.HIGHEST_PROTOCOL) for call in calls]
        with _sigterm_stops_the_run():
            try:
                while todo or self._busy():
                    self._drop_dead_idle_workers()
                    self._start_workers(min(len(todo), self.workers - len(self._pool)))
                    for worker in self._pool:
                        if todo and worker.call is None:
                            worker.call = todo.popleft()
                            worker.send(requests[worker.call])
                    busy = self._busy()
                    ready = set(wait([x for w in busy for x in w.waits_on]))
                    for worker in busy:
                        if ready.isdisjoint(worker.waits_on):
                            continue
                        i, worker.call = worker.call, None
                        assert i is not None
                        try:
                            ok, value = pickle.loads(worker.conn.recv_bytes())
                        except (EOFError, OSError):  # the worker process died under call i
                            deaths[i].append(self._remove(worker))
                            if len(deaths[i]) > self.settings.max_retries:
                                results[i], done[i] = WorkerDied(deaths[i]), True
                            else:
                                todo.appendleft(i)  # first in line for the next free worker
                            continue
                        results[i], done[i] = value, True
            except BaseException:  # SIGTERM, Ctrl-C: stop now, not after the running clients
                self._kill_all()
                raise
        assert all(done)
        return results

    def _busy(self) -> list[_Worker]:
        return [w for w in self._pool if w.call is not None]

    def _start_workers(self, count: int) -> None:
        """Start ``count`` workers: all the processes first (they start in parallel), then
        the runner sent to each."""
        started = []
        for _ in range(count):
            ours, theirs = self._context.Pipe(duplex=True)
            process = self._context.Process(
                target=run_tied,  # its imports after the tie to the driver
                args=(f"{__name__}:_serve", theirs, self.settings.threads),
                name="fedlit-pool-worker",
            )
            with _signals_deferred():  # every process started is in the pool, to be killed
                process.start()
                self._pool.append(_Worker(process, ours))
            theirs.close()
            started.append(self._pool[-1])
        for worker in started:
            worker.send(self._runner)

    def _remove(self, worker: _Worker) -> int | None:
        """Kill ``worker`` (if still alive), take it out of the pool; its exit code."""
        self._pool.remove(worker)
        worker.kill()
        self.restarts += 1
        return worker.process.exitcode

    def _drop_dead_idle_workers(self) -> None:
        """An idle worker that died (killed from outside) is replaced before it is given a
        call, so that no client is charged with its death."""
        for worker in [w for w in self._pool if w.call is None and not w.process.is_alive()]:
            self._remove(worker)

    def pids(self) -> list[int]:
        """The worker processes' ids."""
        return sorted(w.process.pid for w in self._pool if w.process.pid is not None)

    def _kill_all(self) -> None:
        _kill(self._pool)

    def close(self) -> None:
        """Kill the workers (they hold nothing to save); a no-op the second time."""
        self._kill_all()


def _kill(pool: list[_Worker]) -> None:
    """Kill every worker of ``pool`` at once, then reap them; ``pool`` is emptied."""
    workers, pool[:] = list(pool), []
    for worker in workers:
        if worker.process.is_alive():
            worker.process.kill()
    for worker in workers:
        worker.kill()


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGTERM and SIGINT held while a worker process starts, so that a stop never comes
    between its start and the driver's record of it (a process the stop could not kill); a
    signal that came meanwhile is raised again after, to the handler the run had."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        caught.append(int(signum))

    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


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
