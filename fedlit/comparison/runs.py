"""A comparison's runs, run: each an ordinary ``fedlit fit`` of a recipe with the comparison's
overrides, in its own directory ``<out>/<setting>/<recipe>/seed<k>``
(:mod:`~fedlit.comparison.plan`) with a ``run.json`` naming its method, setting, seed and
recipe (:func:`execute`). A finished run is skipped; an interrupted one is resumed from its
checkpoint, so re-running the same command continues a comparison where it stopped. A run
directory a live process is writing (its ``.lock`` held: a fit of an earlier comparison still
running) is refused before anything starts.

With ``jobs >= 2`` the fits are child processes (:func:`fit_in_subprocess`), and they stop
when the comparison stops (:class:`~fedlit.federation.children.Children`): a SIGTERM or SIGINT
is passed on to each running fit (which stops at its next safe point, resumable) and waited
for, and each child is started with Linux's parent-death signal, so that even a SIGKILL of
the comparison stops them.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from fedlit.comparison.devices import GpuSlots, visible_gpus
from fedlit.comparison.plan import INIT_FROM_ARG, ROOT_DIR_ARG, PlannedRun, run_state
from fedlit.federation.checkpoint import checkpoint_settings
from fedlit.federation.children import Children
from fedlit.federation.resume import changed_settings
from fedlit.federation.rundir import holding, set_aside, set_aside_dead_run
from fedlit.reporting.runs import recorded_config
from fedlit.run_layout import CHECKPOINT


class Refused(ValueError):
    """A comparison that cannot go on for a reason its user can fix (a run directory a live
    process is writing); ``fedlit compare`` exits with status 2 and this message."""


FitFn = Callable[[Sequence[str]], None]


class FitKilled(RuntimeError):
    """A ``fedlit fit`` process that a signal ended (killed, or stopped by SIGTERM): run
    again, it resumes from its checkpoint (what Ray's retries of a run do, ``executor: ray``)."""


def fit_in_subprocess(log_dir: Path, threads: int, children: Children | None = None) -> FitFn:
    """A ``fit`` that runs ``fedlit fit`` in its own Python process with ``threads`` torch
    threads, its output appended to ``log_dir/<run>.log``; raises if the process fails. The
    process is one of ``children``: it stops when the comparison stops. On a machine with
    several GPUs each process sees one (:class:`~fedlit.comparison.devices.GpuSlots`)."""
    children = children or Children()
    gpus = GpuSlots(visible_gpus())

    def fit(args: Sequence[str]) -> None:
        run_dir = next(a.split("=", 1)[1] for a in args if a.startswith(ROOT_DIR_ARG))
        log_dir.mkdir(parents=True, exist_ok=True)
        name = Path(run_dir).as_posix().replace("/", "_")
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        with open(log_dir / f"{name}.log", "a") as out, gpus.taken() as gpu:
            proc = children.start(
                [sys.executable, "-m", "fedlit.cli", *args], env=env | gpu, stdout=out, stderr=out
            )
            if proc is None:
                raise RuntimeError(f"{run_dir}: not started, the comparison is stopping")
            code = children.wait(proc)
        if code != 0:
            error = FitKilled if code < 0 or code == 128 + signal.SIGTERM else RuntimeError
            raise error(f"{run_dir}: fedlit fit exited with {code}, see {out.name}")

    return fit


def changed_runs(
    runs: Sequence[PlannedRun],
    rounds: Mapping[PlannedRun, int],
    settings: Mapping[PlannedRun, dict[str, Any]],
    renewed: Collection[tuple[str, int]] = (),
) -> dict[PlannedRun, str]:
    """The runs written already (finished, or to resume) whose recorded settings
    (:func:`recorded_settings`) differ from what the spec now gives them (``settings``: each
    run's flat config as ``fedlit fit`` would record it), each with its first differing
    setting in words. The comparison is a resume's
    (:func:`~fedlit.federation.resume.changed_settings`); the seed and the warm start's
    source are the run's own. A run of a setting and seed in ``renewed``, whose warm start's
    source is run afresh, has changed too."""
    changed = {}
    for run in runs:
        if run_state(run, rounds[run]) not in ("finished", "resumable", "record"):
            continue
        if (run.setting, run.seed) in renewed:
            changed[run] = "its warm start's source (federation.init_from) is run afresh"
            continue
        if run not in settings:
            continue
        saved = recorded_settings(run.run_dir)
        given = settings[run] | {"seed_everything": run.seed}
        source = [a.split("=", 1)[1] for a in run.args if a.startswith(INIT_FROM_ARG)]
        if source:  # a run per seed: the seed's own
            given["federation.init_from"] = _same_folder(source[-1], saved, run.run_dir)
        keys = changed_settings(saved, given)
        if keys:
            key = keys[0]
            more = f" (and {len(keys) - 1} more)" if len(keys) > 1 else ""
            changed[run] = f"{key}={given[key]!r}, the run's {saved[key]!r}{more}"
    return changed


def recorded_settings(run_dir: Path) -> dict[str, Any]:
    """The flat config a written run records: its checkpoint's, else (a run kept as its
    record) its ``hparams.yaml`` (:func:`~fedlit.reporting.runs.recorded_config`), under
    today's keys."""
    if (run_dir / CHECKPOINT).is_file():
        return checkpoint_settings(run_dir / CHECKPOINT)
    try:
        return recorded_config(run_dir, {})
    except ValueError as err:
        raise Refused(f"{run_dir}: the run's recorded settings are unreadable ({err})") from err


def _same_folder(source: str, saved: Mapping[str, Any], run_dir: Path) -> str:
    """The warm start's source the spec gives, written as the run recorded it where both name
    the same folder (``out`` reached through a link, or relative where the run wrote it
    absolute), or the same folder beside the run (a run moved with its ``out``, or restored
    from its record into another): the same source, not a changed setting."""
    recorded = saved.get("federation.init_from")
    if not isinstance(recorded, str):
        return source
    if Path(recorded).resolve() == Path(source).resolve():
        return recorded
    written_in = saved.get("trainer.default_root_dir")
    if isinstance(written_in, str) and os.path.relpath(recorded, written_in) == os.path.relpath(
        source, run_dir
    ):
        return recorded
    return source


def chosen_settings(
    runs: Sequence[PlannedRun], settings: Callable[[Sequence[str]], dict[str, Any]]
) -> dict[PlannedRun, dict[str, Any]]:
    """Each of a tuned comparison's scored ``runs``' flat config with its study's chosen
    settings (``settings``: as ``fedlit fit`` would record it), resolved once per recipe and
    setting."""
    flat: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs:
        key = (run.setting, str(run.run_dir.parent))
        if key not in flat:
            flat[key] = settings(run.args)
    return {run: flat[(run.setting, str(run.run_dir.parent))] for run in runs}


def refuse_changed(changed: Mapping[PlannedRun, str]) -> None:
    """Raise :class:`Refused` naming the first of the ``changed`` runs (:func:`changed_runs`)
    and its first differing setting; nothing where none changed."""
    if not changed:
        return
    run, what = next(iter(changed.items()))
    others = f" (and {len(changed) - 1} other run(s))" if len(changed) > 1 else ""
    raise Refused(
        f"{run.run_dir}{others}: written with other settings than the spec now gives it: "
        f"{what}. Re-run the changed runs with --rerun_changed=true (each old run is set "
        "aside in <run>.changed<n>, never deleted), or give the spec another out"
    )


def set_aside_changed_run(run_dir: Path) -> Path:
    """Move a run whose settings the spec changed out of the way, to ``<run>.changed<n>``
    (never delete what was written); returns where."""
    with holding(run_dir, None):
        try:
            return set_aside(run_dir, "changed")
        except ValueError as err:
            raise Refused(str(err)) from None


def execute(
    runs: Sequence[PlannedRun],
    rounds: Mapping[PlannedRun, int],
    fit: FitFn,
    log: Callable[[str], None] = print,
    jobs: int = 1,
    children: Children | None = None,
    settings: Mapping[PlannedRun, dict[str, Any]] | None = None,
    rerun_changed: bool = False,
    renewed: Collection[tuple[str, int]] = (),
) -> dict[str, int]:
    """Run what is not finished, ``jobs`` at a time; returns how many runs were run, resumed
    and skipped. With ``jobs > 1`` a failed run stops new ones from starting, lets the running
    ones finish, then raises; ``children``, the processes ``fit`` starts, are stopped with
    the comparison (:meth:`Children.forwarding_signals`). Raises :class:`Refused` before
    anything runs if a live process holds a run directory's lock, or if a run written already
    has other settings than the spec gives it (``settings``: each run's flat config;
    :func:`changed_runs`), naming the run and the first setting that differs, or if a run kept
    as its record ends short of its rounds; with ``rerun_changed``, such a run is set aside
    in ``<run>.changed<n>`` and run afresh, as is one whose warm start's source is
    (``renewed``: its setting and seed)."""
    counts = {"run": 0, "resumed": 0, "skipped": 0}
    todo: list[list[str]] = []
    timed: list[tuple[float, int]] = []  # each run's seconds and rounds, as measured here
    for run in runs:  # a run directory a live process writes: refused before anything runs
        try:
            with holding(run.run_dir, None):
                pass
        except ValueError as err:
            raise Refused(
                f"{err} (a fit of an earlier fedlit compare may still be running)"
            ) from None
    changed = changed_runs(runs, rounds, settings or {}, renewed)
    if not rerun_changed:
        refuse_changed(changed)
    for run in changed:
        aside = set_aside_changed_run(run.run_dir)
        log(f"{run.setting} {run.method} seed {run.seed}: settings changed, set aside in {aside}")
    short = [run for run in runs if run_state(run, rounds[run]) == "record"]
    if short and not rerun_changed:
        raise Refused(
            f"{short[0].run_dir}: kept as its record alone, which ends before round "
            f"{rounds[short[0]]}; without its checkpoint it cannot go on. Run it afresh with "
            "--rerun_changed=true (the record is set aside in <run>.changed<n>, never deleted)"
        )
    for run in short:
        aside = set_aside_changed_run(run.run_dir)
        log(f"{run.setting} {run.method} seed {run.seed}: record too short, set aside in {aside}")
    for i, run in enumerate(runs, start=1):
        state = run_state(run, rounds[run])
        head = f"[{i}/{len(runs)}] {run.setting} {run.method} seed {run.seed}"
        if state == "finished":
            log(f"{head}: finished, skipped")
            counts["skipped"] += 1
            continue
        args = [*run.args, run.labels_arg()]  # run.json names the run by these
        if state == "resumable":
            args.append(f"--federation.resume={run.run_dir / CHECKPOINT}")
            counts["resumed"] += 1
            log(f"{head}: resuming")
        else:
            if state == "broken":
                try:
                    aside = set_aside_dead_run(run.run_dir)
                except ValueError as err:
                    raise Refused(str(err)) from None
                log(f"{head}: incomplete run set aside in {aside}")
            counts["run"] += 1
            log(f"{head}: {run.command()}")
        if jobs == 1:
            start = time.perf_counter()
            fit(["fit", *args])
            timed.append((time.perf_counter() - start, rounds[run]))
            log(f"{head}: {timing(timed, [rounds[r] for r in runs[i:]])}")
        else:
            todo.append(["fit", *args])
    if todo:
        _run_parallel(todo, fit, jobs, children)
    return counts


def timing(timed: Sequence[tuple[float, int]], left: Sequence[int]) -> str:
    """A run's measured time, and the time of the runs ``left`` (their rounds) estimated
    from the seconds a round of the runs measured so far (``timed``: seconds, rounds): a
    guide, not a bound, since methods' rounds differ in cost."""
    seconds, rounds = timed[-1]
    per_round = sum(t for t, _ in timed) / max(1, sum(r for _, r in timed))
    text = f"took {seconds:.0f} s ({seconds / max(1, rounds):.1f} s a round)"
    if left:
        estimate = per_round * sum(left) / 60
        text += f"; the {len(left)} runs left: about {estimate:.1f} min at this pace"
    return text


def _run_parallel(
    todo: Sequence[list[str]], fit: FitFn, jobs: int, children: Children | None = None
) -> None:
    failed: list[BaseException] = []

    def one(args: list[str]) -> None:
        if failed:  # a run failed: start no more
            return
        try:
            fit(args)
        except Exception as err:
            failed.append(err)

    stopping = children.forwarding_signals() if children is not None else nullcontext()
    with stopping, ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, todo))
    if failed:
        raise RuntimeError(f"{len(failed)} run(s) failed; the first: {failed[0]}")
