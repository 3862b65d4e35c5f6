"""Client executors: where a round's client work runs.

The driver hands an executor the round's jobs (who trains, on what payload, from which state)
and gets back, in the same order, each client's :class:`~fedlit.methods.ClientUpdate` or the
exception its work raised. A client's work is a function of its inputs (it is seeded from the
run seed, the round and the client id), so every executor gives the same results:
:class:`InProcess` runs the jobs one after another in the driver's process; :class:`RayPool`
runs them on long-lived Ray actors, in parallel, on one machine or a cluster;
:class:`~fedlit.federation.pool.ProcessPool` on local worker processes, without Ray.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol

from fedlit.aggregation.payloads import Payload
from fedlit.federation.client import ClientJob, ClientRunner, ReceiveJob
from fedlit.federation.pool import PoolSettings, ProcessPool
from fedlit.methods.client_side import ClientUpdate


class ClientExecutor(Protocol):
    def run(self, jobs: Sequence[ClientJob], round_idx: int) -> list[ClientUpdate | Exception]:
        """Each job's update, or the exception its work raised, in the jobs' order."""
        ...

    def receive(self, job: ReceiveJob) -> list[Any]:
        """The new persistent states of the job's clients, which receive its payload without
        training, in order."""
        ...

    def close(self) -> None: ...


class InProcess:
    """The clients' work in the driver's process, one client after another (the default).
    Torch keeps its own thread count."""

    def __init__(self, runner: ClientRunner) -> None:
        self.runner = runner

    def run(self, jobs: Sequence[ClientJob], round_idx: int) -> list[ClientUpdate | Exception]:
        results: list[ClientUpdate | Exception] = []
        for job in jobs:
            try:
                results.append(
                    self.runner(job.payload, job.client_id, round_idx, job.state, job.visit)
                )
            except Exception as err:  # not KeyboardInterrupt, SIGTERM: those stop the run
                results.append(err)
        return results

    def receive(self, job: ReceiveJob) -> list[Any]:
        return self.runner.receive(job)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class RaySettings:
    """Where and how :class:`RayPool` runs (the ``federation.ray_*`` settings).

    Args:
        address: an existing cluster's address ("auto": the one this machine belongs to);
            None starts a local Ray instance for the run and stops it after.
        workers: actors, each running one client at a time; None: as many as the cluster's
            resources allow for ``cpus`` and ``gpus`` each, at most ``clients_per_round``.
        cpus: CPUs per client (torch's thread count in each worker).
        gpus: GPUs per client; fractions share a GPU (0.25: four clients on one GPU).
        max_retries: times a client's work is retried when its worker process dies.
        connect_timeout: seconds to wait for ``address`` to answer (its host to resolve, a
            TCP connection to its port) before the run is refused.
    """

    address: str | None = None
    workers: int | None = None
    cpus: float = 1.0
    gpus: float = 0.0
    max_retries: int = 3
    connect_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"federation.ray.workers must be positive, got {self.workers}")
        if not self.cpus > 0:
            raise ValueError(f"federation.ray.cpus must be > 0, got {self.cpus}")
        if not self.gpus >= 0:
            raise ValueError(f"federation.ray.gpus must be >= 0, got {self.gpus}")
        if self.max_retries < 0:
            raise ValueError(f"federation.ray.max_retries must be >= 0, got {self.max_retries}")
        if not self.connect_timeout > 0:
            raise ValueError(
                f"federation.ray.connect_timeout must be > 0, got {self.connect_timeout}"
            )


def on_host(value: Any) -> Any:
    """``value``'s tensors on the CPU (what a Ray actor sends back to a driver on the CPU: a
    head without a GPU cannot unpickle a CUDA tensor); a CPU tensor is not copied."""
    from lightning.fabric.utilities import move_data_to_device

    return move_data_to_device(value, "cpu")


def _worker_class() -> Any:
    """The Ray actor class (built on first use, so that Ray is imported only when used)."""
    import ray

    @ray.remote
    class ClientWorker:
        """A long-lived worker: holds the run's :class:`ClientRunner` (the method's client
        side, the data, the run's ``trainer`` settings), received once, and runs clients."""

        def __init__(self, runner: ClientRunner, threads: int, to_host: bool = False) -> None:
            import torch

            torch.set_num_threads(threads)  # the CPUs it was given, not every core
            self.runner = runner
            # a driver on the CPU (a head without a GPU) cannot unpickle a CUDA tensor
            self.sent: Callable[[Any], Any] = on_host if to_host else lambda value: value

        def run(
            self, payload: Payload, client_id: int, round_idx: int, state: Any, visit: int
        ) -> ClientUpdate:
            update = self.runner(payload, client_id, round_idx, state, visit)
            return replace(update, upload=self.sent(update.upload), state=self.sent(update.state))

        def receive(self, payload: Payload, job: ReceiveJob) -> list[Any]:
            received: list[Any] = self.sent(self.runner.receive(replace(job, payload=payload)))
            return received

        def where(self) -> tuple[str, int]:
            """(node id, process id): where this worker runs."""
            return ray.get_runtime_context().get_node_id(), os.getpid()

    return ClientWorker


class RayPool:
    """The clients' work on a pool of Ray actors (``federation.executor: ray``).

    Made by :meth:`Federation.prepare`, before anything of the run is written: it connects to
    ``settings.address`` (refused with a ValueError naming ``federation.ray.address`` if the
    host does not resolve or its port does not answer within ``connect_timeout``, or if Ray
    cannot connect) or starts a local Ray instance, and checks that ``cpus``, ``gpus`` and
    ``workers`` fit what the cluster offers (:func:`fitting_workers`, a ValueError naming
    the key and the cluster's resources; a Ray that was started is stopped again).

    The actors are started once per run: each receives the runner (and so the data) once,
    through the object store, and sets torch's thread count to its CPUs. Each round's payload
    is put into the object store once; Ray's :class:`~ray.util.ActorPool` hands the jobs to
    free actors and returns the results in the jobs' order. A worker process that dies is
    restarted by Ray and its client's work retried (``max_restarts``, ``max_task_retries``);
    an exception raised by the client's own work is not retried: it comes back as that
    client's fault, as in-process. :meth:`close` kills the actors and disconnects (a local
    instance it started is shut down with it); the driver calls it when the run ends, fails
    or is stopped by a signal.
    """

    def __init__(self, runner: ClientRunner, settings: RaySettings, clients_per_round: int):
        if not settings.gpus and runner.trainer.device().type == "cuda":
            # an actor asks Ray for no GPU: Ray hides the GPUs from it (the client trains on
            # the CPU) or, in recent Ray, lets every actor onto GPU 0 uncounted
            raise ValueError(
                "federation.ray.gpus=0 on a machine with a CUDA GPU: give each client a GPU "
                "or a share of one (federation.ray.gpus 1, or 0.25: four on a GPU), or train "
                "on the CPU (trainer.accelerator cpu)"
            )
        import ray
        from ray.util import ActorPool

        self._ray = ray
        self.actors: list[Any] = []
        self._connected = connect_ray(settings.address, settings.connect_timeout)
        try:
            nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
            workers = fitting_workers(settings, clients_per_round, nodes)
            options = {
                "num_cpus": settings.cpus,
                "num_gpus": settings.gpus,
                "max_restarts": -1,
                "max_task_retries": settings.max_retries,
            }
            shared = ray.put(runner)
            worker = _worker_class()
            threads = max(1, int(settings.cpus))
            to_host = runner.trainer.device().type == "cpu"
            self.actors = [
                worker.options(**options).remote(shared, threads, to_host) for _ in range(workers)
            ]
            self.pool = ActorPool(self.actors)
        except BaseException:
            self.close()
            raise

    def run(self, jobs: Sequence[ClientJob], round_idx: int) -> list[ClientUpdate | Exception]:
        refs: dict[int, Any] = {}  # one object-store copy of each distinct payload
        for job in jobs:
            if id(job.payload) not in refs:
                refs[id(job.payload)] = self._ray.put(job.payload)
        for job in jobs:
            self.pool.submit(
                lambda actor, j: actor.run.remote(
                    refs[id(j.payload)], j.client_id, round_idx, j.state, j.visit
                ),
                job,
            )
        results: list[ClientUpdate | Exception] = []
        for _ in jobs:
            try:
                results.append(self.pool.get_next())  # in submission order
            except Exception as err:
                results.append(_cause(err))
        return results

    def receive(self, job: ReceiveJob) -> list[Any]:
        """Spread over the actors: actor i takes clients i, i + actors, ..."""
        if not len(job):
            return []
        ref = self._ray.put(job.payload)  # the payload once in the object store, not per actor
        chunks = job.chunks(len(self.actors))
        futures = [
            actor.receive.remote(ref, job.part(c))
            for actor, c in zip(self.actors[: len(chunks)], chunks, strict=True)
        ]
        out: list[Any] = [None] * len(job)
        for c, states_c in zip(chunks, self._ray.get(futures), strict=True):
            out[c] = states_c
        return out

    def where(self) -> list[tuple[str, int]]:
        """(node id, process id) of every worker."""
        return list(self._ray.get([actor.where.remote() for actor in self.actors]))

    def close(self) -> None:
        """Kill the actors; disconnect from Ray if this pool connected (a local instance it
        started stops with it). A no-op the second time."""
        for actor in self.actors:
            self._ray.kill(actor)
        self.actors = []
        if self._connected:
            self._ray.shutdown()
            self._connected = False


def fitting_workers(
    settings: RaySettings, clients_per_round: int, nodes: Sequence[dict[str, float]]
) -> int:
    """How many workers the run gets on a cluster whose live nodes have ``nodes`` resources
    (Ray's ``{"CPU": 16.0, "GPU": 1.0, ...}`` each): ``settings.workers``, or as many as fit
    (each needs ``cpus`` and ``gpus`` on one node), at most ``clients_per_round``. A ValueError
    names the key and the cluster's resources if not one worker, or not ``workers``, fit."""
    fits = fitting(settings.cpus, settings.gpus, nodes, "federation.ray", "a client")
    if settings.workers is not None and settings.workers > fits:
        raise ValueError(
            f"federation.ray.workers={settings.workers}: only {fits} worker(s) of "
            f"{settings.cpus:g} CPUs and {settings.gpus:g} GPUs fit ({offer(nodes)})"
        )
    return settings.workers or max(1, min(fits, clients_per_round))


def offer(nodes: Sequence[dict[str, float]]) -> str:
    """What a Ray cluster whose live nodes have ``nodes`` resources offers, in words."""
    cpus = [node.get("CPU", 0.0) for node in nodes]
    gpus = [node.get("GPU", 0.0) for node in nodes]
    return (
        f"the Ray cluster offers {sum(cpus):g} CPUs and {sum(gpus):g} GPUs on {len(nodes)} "
        f"node(s), at most {max(cpus, default=0):g} CPUs and {max(gpus, default=0):g} GPUs on "
        "one node"
    )


def fitting(
    cpus: float, gpus: float, nodes: Sequence[dict[str, float]], key: str, each: str
) -> int:
    """How many tasks of ``cpus`` and ``gpus`` each fit at once on a cluster whose live nodes
    have ``nodes`` resources, each task on one node. A ValueError names ``<key>.cpus`` or
    ``<key>.gpus`` and the cluster's resources if not one fits (``each``: what a task is, in
    words)."""
    fits = 0
    for node in nodes:
        here = int(node.get("CPU", 0.0) // cpus + 1e-9)
        if gpus > 0:
            here = min(here, int(node.get("GPU", 0.0) // gpus + 1e-9))
        fits += here
    if gpus > 0 and all(node.get("GPU", 0.0) < gpus for node in nodes):
        raise ValueError(
            f"{key}.gpus={gpus:g}: no node has {gpus:g} GPU(s) for {each} ({offer(nodes)})"
        )
    if fits == 0:
        raise ValueError(
            f"{key}.cpus={cpus:g}: no node has {cpus:g} CPUs"
            f"{f' and {gpus:g} GPUs' if gpus else ''} for {each} ({offer(nodes)})"
        )
    return fits


def connect_ray(address: str | None, timeout: float, settings: str = "federation.ray") -> bool:
    """Connect this process to the Ray cluster at ``address``, or start a new local Ray
    instance (None: Ray's ``"local"``, not a cluster already running on this machine), unless
    it is connected already; True where it connected here (and so disconnects
    when done). Refused with a ValueError naming ``<settings>.address`` if the address does
    not answer within ``timeout`` seconds (:func:`check_reachable`) or Ray cannot connect.
    This process keeps its SIGTERM and SIGINT handlers."""
    import ray

    if ray.is_initialized():
        return False
    if address is not None:
        check_reachable(address, timeout, settings)
    try:
        with own_signal_handlers():  # a SIGTERM stops the run as without Ray (143)
            ray.init(  # None: a new instance, never a cluster Ray finds on this machine
                address="local" if address is None else address,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
    except Exception as err:  # ConnectionError, a missing Ray Client, ...
        if ray.is_initialized():
            ray.shutdown()
        text = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(
            f"{settings}.address={address!r}: Ray could not "
            f"{'connect' if address else 'start'}: {type(err).__name__}: {text}"
        ) from None
    return True


def check_reachable(address: str, timeout: float, settings: str = "federation.ray") -> None:
    """Refuse (ValueError naming ``<settings>.address``) an address whose host does not
    resolve or whose port does not accept a TCP connection within ``timeout`` seconds, so
    that ``ray.init`` never waits on it. ``auto`` (a cluster this machine belongs to) is left
    to Ray."""
    if address == "auto":
        return
    key = f"{settings}.address={address!r}"
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{key}: give host:port, ray://host:port or auto")
    found: list[Any] = []

    def resolve() -> None:
        try:
            found.append(socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM))
        except OSError as err:
            found.append(err)

    thread = threading.Thread(target=resolve, daemon=True)  # the resolver may hang
    thread.start()
    thread.join(timeout)
    if not found:
        raise ValueError(f"{key}: the host {host!r} did not resolve within {timeout:g} s")
    if isinstance(found[0], OSError):
        reason = found[0].strerror or str(found[0])
        raise ValueError(f"{key}: the host {host!r} does not resolve ({reason})")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        reason = "timed out" if isinstance(err, TimeoutError) else err.strerror or str(err)
        raise ValueError(
            f"{key}: nothing answers at {host}:{port} within {timeout:g} s ({reason}); is a "
            f"Ray cluster running there? ({settings}.connect_timeout sets the wait)"
        ) from None


@contextmanager
def own_signal_handlers() -> Iterator[None]:
    """Keep this process's SIGTERM and SIGINT handlers: ``ray.init`` replaces them with its
    own (SIGTERM would exit with status 15, not stop the run at a step's end)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _cause(err: Exception) -> Exception:
    """The client's own exception inside Ray's wrapper (a RayTaskError), else ``err``."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, Exception) else err


#: Starts an executor from the run's client runner and its ``federation.ray``,
#: ``federation.pool`` and ``federation.clients_per_round`` settings.
ExecutorFactory = Callable[[ClientRunner, RaySettings, PoolSettings, int], ClientExecutor]

#: The executors ``federation.executor`` may name, each with its factory. Adding an executor is
#: adding its entry: the config's check and :func:`make_executor` both read this.
EXECUTORS: dict[str, ExecutorFactory] = {
    "local": lambda runner, ray, pool, clients_per_round: InProcess(runner),
    "pool": lambda runner, ray, pool, clients_per_round: ProcessPool(
        runner, pool, clients_per_round
    ),
    "ray": lambda runner, ray, pool, clients_per_round: RayPool(runner, ray, clients_per_round),
}


def check_executor(name: str) -> None:
    """Refuse an executor name :data:`EXECUTORS` does not hold, or ``ray`` where Ray is not
    installed (a ValueError naming the key and the extra to install)."""
    if name not in EXECUTORS:
        raise ValueError(f"federation.executor must be one of {tuple(EXECUTORS)}, got {name!r}")
    if name == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError(
            "federation.executor='ray': Ray is not installed here; install fedlit's ray "
            "extra (pip install 'fedlit[ray]'), or use federation.executor local or pool"
        )


def make_executor(
    name: str,
    runner: ClientRunner,
    settings: RaySettings,
    clients_per_round: int,
    pool: PoolSettings | None = None,
) -> ClientExecutor:
    """The executor ``federation.executor`` names, started by its factory in :data:`EXECUTORS`
    with the Ray ``settings`` and the ``pool`` settings (their defaults when None)."""
    check_executor(name)
    return EXECUTORS[name](runner, settings, pool or PoolSettings(), clients_per_round)
