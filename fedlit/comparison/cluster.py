"""A comparison's runs on a Ray cluster (``executor: ray``, :class:`RayRuns`): each
``fedlit fit`` of the comparison (source runs, trials, scored runs) is a Ray task, which Ray
starts on a node with the run's ``ray.cpus`` and ``ray.gpus`` free. The task runs the fit as a
child process there (:func:`~fedlit.comparison.runs.fit_in_subprocess`, torch at ``ray.cpus``
threads), in the comparison's working directory, its output appended to
``<out>/logs/<run>.log``: the nodes see ``out``, the recipes and the data at the same paths (a
shared folder). The comparison itself (its plan, the studies' asks and tells) stays in the
process that runs ``fedlit compare``; ``jobs`` tasks are in flight at a time.

Ray retries a run whose worker process dies (``ray.max_retries``), or whose ``fedlit fit`` a
signal ended (:class:`~fedlit.comparison.runs.FitKilled`, Ray's ``retry_exceptions``); the
run then goes on from what its directory holds (:func:`continued`). A fit that fails (exits
with an error) is not retried. When the ``fedlit compare`` process dies, Ray ends its tasks'
workers and each fit stops with its worker (the parent-death signal); running the command
again resumes the runs, as without Ray. Ray is imported when a :class:`RayRuns` is made.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedlit.comparison.plan import ROOT_DIR_ARG
from fedlit.comparison.runs import FitKilled, Refused, fit_in_subprocess
from fedlit.comparison.spec import RayCluster
from fedlit.federation.checkpoint import checkpoint_round, checkpoint_settings
from fedlit.federation.children import Children
from fedlit.federation.executors import connect_ray, fitting
from fedlit.federation.rundir import holding, set_aside_dead_run
from fedlit.run_layout import CHECKPOINT, RECORD_FILE, RUN_MARKERS

#: A ``fedlit fit`` argument that resumes a run from its checkpoint.
RESUME_ARG = "--federation.resume="

#: How long a retried run waits for its earlier fit to let go of its directory, in seconds (a
#: fit stops at its step's end once its worker is gone).
RELEASE_WAIT_S = 300.0


class RayTasks(Children):
    """The runs' Ray tasks in flight, stopped with the comparison as its local fits are
    (:class:`~fedlit.federation.children.Children`): a SIGTERM or SIGINT of ``fedlit compare``
    cancels them, each task's worker ended (``ray.cancel(force=True)``, never retried) and its
    fit stopped with it at its step's end, resumable; no task starts after."""

    def __init__(self, ray: Any) -> None:
        super().__init__()
        self._ray = ray
        self.refs: set[Any] = set()

    def submit(self, task: Any, *args: Any) -> Any | None:
        """``task.remote(*args)``'s reference, kept while in flight (:meth:`done`); None once
        the comparison is stopping."""
        with self._lock:
            if self.stopped_by is not None:
                return None
            ref = task.remote(*args)
            self.refs.add(ref)
            return ref

    def done(self, ref: Any) -> None:
        with self._lock:
            self.refs.discard(ref)

    def forward(self, signum: int) -> None:
        """Cancel every task in flight (``signum``: the signal that stops the comparison), and
        start no more."""
        with self._lock:
            self.stopped_by = self.stopped_by or signum
            refs = list(self.refs)
        for ref in refs:
            self._ray.cancel(ref, force=True)


class RayRuns:
    """The comparison's ``fit`` (a ``FitFn``) with ``executor: ray``: each call runs ``fedlit
    fit`` with the given arguments as a Ray task (:func:`fit_on_node`) and waits for it;
    raises if the fit fails. Made before any run starts: it connects to
    ``ray.address`` (or starts Ray on this machine) and counts the runs the cluster holds at
    once (``capacity``); a cluster that does not answer, or where no node has a run's CPUs
    and GPUs, is refused (:class:`~fedlit.comparison.runs.Refused`, naming the key)."""

    def __init__(self, cluster: RayCluster, log_dir: Path) -> None:
        import ray

        self._ray = ray
        try:
            self._connected = connect_ray(cluster.address, cluster.connect_timeout, "ray")
        except ValueError as err:
            raise Refused(str(err)) from None
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        try:
            self.capacity = fitting(cluster.cpus, cluster.gpus, nodes, "ray", "a run")
        except ValueError as err:
            self.close()
            raise Refused(str(err)) from None
        self.nodes = len(nodes)
        # what the driver's environment says of fedlit's numbers (FEDLIT_CPU_BF16, ...)
        env = {k: v for k, v in os.environ.items() if k.startswith("FEDLIT_")}
        self._task = ray.remote(fit_on_node).options(
            num_cpus=cluster.cpus,
            num_gpus=cluster.gpus,
            max_retries=cluster.max_retries,
            retry_exceptions=[FitKilled],
            runtime_env={"env_vars": env} if env else None,
        )
        self._where = (os.getcwd(), str(log_dir.resolve()), max(1, int(cluster.cpus)))
        self.tasks = RayTasks(ray)

    def __call__(self, args: Sequence[str]) -> None:
        run_dir = next(a.split("=", 1)[1] for a in args if a.startswith(ROOT_DIR_ARG))
        ref = self.tasks.submit(self._task, list(args), *self._where)
        if ref is None:
            raise RuntimeError(f"{run_dir}: not started, the comparison is stopping")
        try:
            self._ray.get(ref)
        except self._ray.exceptions.RayTaskError as err:  # the fit's own error, from the node
            cause = getattr(err, "cause", None)
            raise RuntimeError(str(cause if cause is not None else err)) from None
        except self._ray.exceptions.RayError as err:  # its workers died, retries spent; cancelled
            text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise RuntimeError(f"{run_dir}: its Ray task failed: {text}") from None
        finally:
            self.tasks.done(ref)

    def close(self) -> None:
        """Disconnect from Ray where this connected (a Ray it started stops with it)."""
        if self._connected:
            self._ray.shutdown()
            self._connected = False


def fit_on_node(args: Sequence[str], cwd: str, log_dir: str, threads: int) -> str:
    """A Ray task: run ``fedlit fit`` with ``args`` (going on from what its directory holds,
    :func:`continued`) in ``cwd`` at ``threads`` torch threads, its output appended to its log
    in ``log_dir``, headed by a line naming this node; returns the node's id."""
    import ray

    os.chdir(cwd)  # the comparison's paths are relative to where it runs
    node = ray.get_runtime_context().get_node_id()
    run_dir = Path(next(a.split("=", 1)[1] for a in args if a.startswith(ROOT_DIR_ARG)))
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    log = Path(log_dir) / f"{run_dir.as_posix().replace('/', '_')}.log"
    with open(log, "a") as out:
        out.write(f"fedlit compare: ray node {node}, process {os.getpid()}\n")
    going_on = continued(args)
    if going_on is not None:
        fit_in_subprocess(Path(log_dir), threads)(going_on)
    return str(node)


def continued(args: Sequence[str], wait_s: float = RELEASE_WAIT_S) -> list[str] | None:
    """A run's ``fit`` arguments as they go on from what its directory holds, once no live
    process holds it (a retried run's earlier fit stops at its step's end; waited for up to
    ``wait_s`` seconds): a run written already resumes from its checkpoint; one stopped
    before its first checkpoint is set aside (``<run>.incomplete<n>``); None where its
    checkpoint has its last round (it finished before its worker died: nothing to run) or
    it is kept as its record;
    ``args`` as given where its directory holds nothing."""
    run_dir = Path(next(a.split("=", 1)[1] for a in args if a.startswith(ROOT_DIR_ARG)))
    if not run_dir.is_dir():
        return list(args)
    _wait_until_free(run_dir, wait_s)
    if (run_dir / RECORD_FILE).is_file():
        return None  # a finished run kept as its record
    ckpt = run_dir / CHECKPOINT
    if ckpt.is_file():
        rounds = checkpoint_settings(ckpt).get("federation.rounds")
        if rounds is not None and checkpoint_round(ckpt) >= int(rounds):
            return None
        resumed = any(a.startswith(RESUME_ARG) for a in args)
        return list(args) if resumed else [*args, f"{RESUME_ARG}{ckpt}"]
    if any((run_dir / marker).exists() for marker in RUN_MARKERS):
        set_aside_dead_run(run_dir)
    return list(args)


def _wait_until_free(run_dir: Path, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with holding(run_dir, None):
                return
        except ValueError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)

