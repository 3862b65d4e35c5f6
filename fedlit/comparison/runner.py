"""``fedlit compare``: recipes x settings x seeds, run one after another, then one report.

Each run is an ordinary ``fedlit fit`` of a recipe with the comparison's overrides, in its own
directory ``<out>/<setting>/<recipe>/seed<k>`` with a ``run.json`` naming its method, setting,
seed and recipe. A finished run is skipped; an interrupted one is resumed from its checkpoint,
so re-running the same command continues a comparison where it stopped. A run directory a live
process is writing (its ``.lock`` held: a fit of an earlier comparison still running) is
refused before anything starts.

With ``jobs >= 2`` the fits are child processes, and they stop when the comparison stops: a
SIGTERM or SIGINT is passed on to each running fit (which stops at its next safe point,
resumable) and waited for, and each child is started with Linux's parent-death signal
(``prctl(PR_SET_PDEATHSIG, SIGTERM)``), so that even a SIGKILL of the comparison stops them.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import numpy as np

from fedlit.comparison.report import log_to_wandb, write_report
from fedlit.federation.checkpoint import checkpoint_round
from fedlit.federation.console import warn
from fedlit.federation.rundir import holding, set_aside_dead_run
from fedlit.reporting import FINAL_EVAL_KEYS, last_k_warning, load_run
from fedlit.reporting.runs import read_run_json
from fedlit.run_layout import CHECKPOINT, MAX_SEED, RUN_FILE, RUN_MARKERS, write_path_error


@dataclass(frozen=True)
class WandbSettings:
    """Where a comparison's runs go on W&B: one ``group`` per comparison.

    Args:
        project: the W&B project.
        offline: log to local files only (``wandb sync`` uploads them later).
    """

    project: str = "fedlit"
    offline: bool = False


@dataclass(frozen=True)
class SourceRun:
    """The run every run of a comparison starts from (``federation.init_from``): the recipe
    run once per setting and seed, before the others, in ``<out>/<setting>/<folder>/seed<k>``,
    with the comparison's overrides, the setting's, then its own (which win), and the seed.

    Args:
        recipe: its recipe file (e.g. a Server-SL trained to its plateau).
        overrides: its own overrides, after the comparison's and the setting's.
        folder: the name of its folder in each setting's directory.
    """

    recipe: str
    overrides: list[str] = field(default_factory=list)
    folder: str = "init_from"


@dataclass(frozen=True)
class Comparison:
    """What a comparison runs and reports (the ``fedlit compare`` config).

    Args:
        name: the comparison's name (also the W&B group), and that of its report's files in
            ``out`` (``<name>.md``, ``<name>.csv``, ``<name>_curves.png``, ...): comparisons
            of other names can share one ``out``, e.g. one that adds a recipe to another's
            runs, whose finished runs it skips.
        recipes: recipe files; each recipe's file stem names its method in the results.
        seeds: run seeds (``seed_everything``): the partition, sampling and initialisation.
        settings: setting name -> overrides for it (e.g. ``noniid: [--data.partitioner=...]``);
            one column group of the results per setting.
        overrides: overrides for every run (e.g. fewer rounds, a smaller backbone).
        out: the comparison's directory: its runs, their logs and its report's files.
        target: report the first round each run reaches this test accuracy.
        baseline: a recipe stem (e.g. ``server_sl``) every method is compared with, seed by
            seed: the paired difference of the score, in points, with its 95% interval.
        last_k: a run's score is the mean of its last ``last_k`` rounds' test accuracy.
        report: also write the Markdown report here (plots beside it).
        published: recipe stem -> setting -> a paper's accuracy (percent), shown beside ours.
        wandb: log every run to W&B (None: no W&B).
        description: Markdown lines that open the report (the protocol in words).
        init_from: a run per setting and seed that every run of that setting and seed starts
            from (:class:`SourceRun`, ``federation.init_from``); run first. None: every run
            starts afresh.
        jobs: runs at a time. 1 runs them one after another in this process; more runs each in
            its own ``fedlit fit`` process with torch limited to (CPU cores // jobs) threads
            (``OMP_NUM_THREADS``: processes that each take every core slow each other down
            many times over), its output in ``<out>/logs/``.
    """

    name: str
    recipes: list[str]
    seeds: list[int] = field(default_factory=lambda: [0])
    settings: dict[str, list[str]] = field(default_factory=lambda: {"default": []})
    overrides: list[str] = field(default_factory=list)
    out: str = "runs/compare"
    target: float | None = None
    baseline: str | None = None
    last_k: int = 1
    report: str | None = None
    published: dict[str, dict[str, float]] = field(default_factory=dict)
    wandb: WandbSettings | None = None
    description: list[str] = field(default_factory=list)
    jobs: int = 1
    init_from: SourceRun | None = None

    def __post_init__(self) -> None:
        if not self.name or Path(self.name).name != self.name or self.name in (".", ".."):
            raise ValueError(
                f"name={self.name!r}: give one file name (the report files written into `out` "
                "are named after it)"
            )
        if not self.recipes:
            raise ValueError("recipes: give at least one recipe")
        missing = [r for r in self.recipes if not Path(r).is_file()]
        if missing:
            raise ValueError(f"recipes: no such file {missing[0]!r}")
        stems = [Path(r).stem for r in self.recipes]
        if len(set(stems)) != len(stems):
            raise ValueError(f"recipes: two recipes share a file name ({stems})")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: give distinct seeds, got {self.seeds}")
        for seed in self.seeds:
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
                raise ValueError(f"seeds: {seed!r} is not a seed (an integer in [0, {MAX_SEED}])")
        if not self.settings:
            raise ValueError("settings: give at least one setting")
        if self.init_from is not None:
            if not Path(self.init_from.recipe).is_file():
                raise ValueError(f"init_from.recipe: no such file {self.init_from.recipe!r}")
            folder = self.init_from.folder
            if not folder or Path(folder).name != folder or folder in stems or folder == "logs":
                raise ValueError(
                    f"init_from.folder={folder!r}: name one folder that is no recipe's ({stems})"
                )
        if self.baseline is not None and self.baseline not in stems:
            raise ValueError(f"baseline: {self.baseline!r} is not one of the recipes {stems}")
        if isinstance(self.last_k, bool) or not isinstance(self.last_k, int) or self.last_k < 1:
            raise ValueError(f"last_k must be a positive integer, got {self.last_k!r}")
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 1:
            raise ValueError(f"jobs must be a positive integer, got {self.jobs!r}")
        if self.target is not None and not 0 < self.target <= 1:
            raise ValueError(f"target must be in (0, 1], got {self.target}")
        error = write_path_error(self.out, "out", "folder")
        if error is None and self.report is not None:
            error = write_path_error(self.report, "report", "file")
        for run in plan(self) if error is None else ():
            error = write_path_error(run.run_dir, f"settings.{run.setting}", "run")
            if error:
                break
        if error:
            raise ValueError(error)


ROOT_DIR_ARG = "--trainer.default_root_dir="


@dataclass(frozen=True)
class PlannedRun:
    """One run of a comparison."""

    recipe: Path
    setting: str
    seed: int
    run_dir: Path
    args: tuple[str, ...]  # the ``fedlit fit`` arguments, without any resume

    @property
    def method(self) -> str:
        return self.recipe.stem

    def command(self) -> str:
        return shlex.join(["fedlit", "fit", *self.args])


INIT_FROM_ARG = "--federation.init_from="


def source_dir(comparison: Comparison, setting: str, seed: int) -> Path:
    """Where the run that ``setting``'s runs of ``seed`` start from is written."""
    assert comparison.init_from is not None
    return Path(comparison.out) / setting / comparison.init_from.folder / f"seed{seed}"


def plan_sources(comparison: Comparison) -> list[PlannedRun]:
    """The runs the others start from (``comparison.init_from``), setting by setting, seed by
    seed; none without ``init_from``."""
    source = comparison.init_from
    if source is None:
        return []
    recipe = Path(source.recipe)
    runs = []
    for setting, setting_args in comparison.settings.items():
        for seed in comparison.seeds:
            run_dir = source_dir(comparison, setting, seed)
            args = [
                f"--config={recipe}",
                *comparison.overrides,
                *setting_args,
                *source.overrides,
                f"--seed_everything={seed}",
                f"{ROOT_DIR_ARG}{run_dir}",
            ]
            runs.append(PlannedRun(recipe, setting, seed, run_dir, tuple(args)))
    return runs


def plan(comparison: Comparison) -> list[PlannedRun]:
    """Every run of ``comparison``, setting by setting, recipe by recipe, seed by seed (each
    started from its setting's and seed's source run where ``init_from`` is given)."""
    runs = []
    for setting, setting_args in comparison.settings.items():
        for recipe in map(Path, comparison.recipes):
            for seed in comparison.seeds:
                run_dir = Path(comparison.out) / setting / recipe.stem / f"seed{seed}"
                warm = (
                    [f"{INIT_FROM_ARG}{source_dir(comparison, setting, seed)}"]
                    if comparison.init_from is not None
                    else []
                )
                args = [
                    f"--config={recipe}",
                    *comparison.overrides,
                    *setting_args,
                    *warm,
                    f"--seed_everything={seed}",
                    f"{ROOT_DIR_ARG}{run_dir}",
                    *_wandb_args(comparison, setting, recipe.stem, seed, run_dir),
                ]
                runs.append(PlannedRun(recipe, setting, seed, run_dir, tuple(args)))
    return runs


def _wandb_args(
    comparison: Comparison, setting: str, method: str, seed: int, run_dir: Path
) -> list[str]:
    if comparison.wandb is None:
        return []
    return [
        "--trainer.logger=lightning.pytorch.loggers.WandbLogger",
        f"--trainer.logger.init_args.project={comparison.wandb.project}",
        f"--trainer.logger.init_args.name={comparison.name}/{setting}/{method}/seed{seed}",
        f"--trainer.logger.init_args.save_dir={run_dir}",
        f"--trainer.logger.init_args.offline={str(comparison.wandb.offline).lower()}",
        f"--trainer.logger.dict_kwargs.group={comparison.name}",
        f"--trainer.logger.dict_kwargs.tags=[{method}, {setting}, seed{seed}]",
        f"--trainer.logger.dict_kwargs.config={{method: {method}, setting: {setting}}}",
    ]


def run_state(run: PlannedRun, rounds: int) -> str:
    """ "new" (nothing written), "finished", "resumable" (a checkpoint short of ``rounds``)
    or "broken" (files but no checkpoint: stopped inside its first round)."""
    ckpt = run.run_dir / CHECKPOINT
    if ckpt.is_file():
        # the round alone, from a checkpoint of any format: a finished run written by an
        # earlier fedlit is finished; one to resume needs today's format (the resume says so)
        return "finished" if checkpoint_round(ckpt) >= rounds else "resumable"
    return "broken" if any((run.run_dir / m).exists() for m in RUN_MARKERS) else "new"


class Refused(ValueError):
    """A comparison that cannot go on for a reason its user can fix (a run directory a live
    process is writing); ``fedlit compare`` exits with status 2 and this message."""


FitFn = Callable[[Sequence[str]], None]

#: ``prctl``'s option that sends the calling process a signal when its parent dies.
PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _die_with_parent(parent: int) -> None:
    """In a child, between fork and exec: receive SIGTERM when the parent dies (Linux), and
    end at once if it already has."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(128 + signal.SIGTERM)


class Children:
    """The ``fedlit fit`` processes a comparison runs, stopped with it (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running: set[subprocess.Popen[bytes]] = set()
        self.stopped_by: int | None = None  # the signal that stopped the comparison

    def start(self, args: Sequence[str], **popen: object) -> subprocess.Popen[bytes] | None:
        """Start a child (None once the comparison is stopping: start no more)."""
        with self._lock:
            if self.stopped_by is not None:
                return None
            proc: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
                args, preexec_fn=functools.partial(_die_with_parent, os.getpid()), **popen
            )
            self.running.add(proc)
            return proc

    def wait(self, proc: subprocess.Popen[bytes]) -> int:
        """Wait for ``proc`` to end; its status."""
        code = proc.wait()
        with self._lock:
            self.running.discard(proc)
        return code

    def forward(self, signum: int) -> None:
        """Pass ``signum`` on to every running child, and start no more."""
        with self._lock:
            self.stopped_by = self.stopped_by or signum
            for proc in self.running:
                with suppress(ProcessLookupError):  # ended meanwhile
                    proc.send_signal(signum)

    @contextmanager
    def forwarding_signals(self) -> Iterator[None]:
        """While the children run (in the main thread): a SIGTERM or SIGINT is passed on to
        them; then the comparison waits for them to stop and exits with 128 + the signal."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signums = (signal.SIGTERM, signal.SIGINT)

        def handler(signum: int, frame: FrameType | None) -> None:
            self.forward(signum)

        previous = {sig: signal.signal(sig, handler) for sig in signums}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
        if self.stopped_by is not None:
            name = signal.Signals(self.stopped_by).name
            print(
                f"fedlit compare: stopped by {name}; its fits were stopped too. Run the same "
                "command again to go on (interrupted runs resume from their checkpoints).",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(128 + self.stopped_by)


def fit_in_subprocess(log_dir: Path, threads: int, children: Children | None = None) -> FitFn:
    """A ``fit`` that runs ``fedlit fit`` in its own Python process with ``threads`` torch
    threads, its output appended to ``log_dir/<run>.log``; raises if the process fails. The
    process is one of ``children``: it stops when the comparison stops."""
    children = children or Children()

    def fit(args: Sequence[str]) -> None:
        run_dir = next(a.split("=", 1)[1] for a in args if a.startswith(ROOT_DIR_ARG))
        log_dir.mkdir(parents=True, exist_ok=True)
        name = Path(run_dir).as_posix().replace("/", "_")
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        with open(log_dir / f"{name}.log", "a") as out:
            proc = children.start(
                [sys.executable, "-m", "fedlit.cli", *args], env=env, stdout=out, stderr=out
            )
            if proc is None:
                raise RuntimeError(f"{run_dir}: not started, the comparison is stopping")
            code = children.wait(proc)
        if code != 0:
            raise RuntimeError(f"{run_dir}: fedlit fit exited with {code}, see {out.name}")

    return fit


def execute(
    runs: Sequence[PlannedRun],
    rounds: Mapping[PlannedRun, int],
    fit: FitFn,
    log: Callable[[str], None] = print,
    jobs: int = 1,
    children: Children | None = None,
) -> dict[str, int]:
    """Run what is not finished, ``jobs`` at a time; returns how many runs were run, resumed
    and skipped. With ``jobs > 1`` a failed run stops new ones from starting, lets the running
    ones finish, then raises; ``children``, the processes ``fit`` starts, are stopped with
    the comparison (:meth:`Children.forwarding_signals`). Raises :class:`Refused` before
    anything runs if a live process holds a run directory's lock."""
    counts = {"run": 0, "resumed": 0, "skipped": 0}
    todo: list[list[str]] = []
    for run in runs:  # a run directory a live process writes: refused before anything runs
        try:
            with holding(run.run_dir, None):
                pass
        except ValueError as err:
            raise Refused(
                f"{err} (a fit of an earlier fedlit compare may still be running)"
            ) from None
    for i, run in enumerate(runs, start=1):
        state = run_state(run, rounds[run])
        head = f"[{i}/{len(runs)}] {run.setting} {run.method} seed {run.seed}"
        if state == "finished":
            log(f"{head}: finished, skipped")
            counts["skipped"] += 1
            continue
        args = list(run.args)
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
        run.run_dir.mkdir(parents=True, exist_ok=True)
        info = {"method": run.method, "setting": run.setting, "seed": run.seed}
        info |= {"recipe": str(run.recipe)}
        run_file = run.run_dir / RUN_FILE
        if state == "resumable":
            # what the run recorded itself (its warm start's source: a resume does not read
            # the source again, so nothing else would write it back) is kept; an unreadable
            # record is the run's to rewrite
            with suppress(ValueError):
                info = read_run_json(run_file) | info
        run_file.write_text(json.dumps(info))
        if jobs == 1:
            fit(["fit", *args])
        else:
            todo.append(["fit", *args])
    if todo:
        _run_parallel(todo, fit, jobs, children)
    return counts


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


def _source_lines(comparison: Comparison, sources: Sequence[PlannedRun]) -> list[str]:
    """What the report says of the runs every run started from: the recipe, its overrides,
    where they are, and each one's final test accuracy."""
    assert comparison.init_from is not None
    source = comparison.init_from
    scores = []
    for run in sources:
        history = load_run(run.run_dir).history
        acc = history[-1].get("test/acc") if history else None
        shown = f"{100 * acc:.2f}" if acc is not None else "-"
        scores.append(f"{run.setting} seed {run.seed}: {shown}")
    return [
        f"- *warm start*: every run starts (`federation.init_from`) from the final network of "
        f"`{source.recipe}` with `{' '.join(source.overrides) or '(no overrides)'}` (after "
        "the comparison's and the setting's overrides), run once per setting and seed, before "
        f"the others, in `{comparison.out}/<setting>/{source.folder}/seed<k>`; its test/acc "
        f"(%): {'; '.join(scores)}. The *Warm starts* table names each source's weights by "
        "their SHA-256.",
    ]


def run_comparison(
    comparison: Comparison,
    command: str,
    fit: FitFn,
    rounds: Callable[[Sequence[str]], int],
    partition: Callable[[Sequence[str], int], np.ndarray],
    log: Callable[[str], None] = print,
) -> dict[str, Path]:
    """Check every recipe x setting, run what is not finished, then write the report.

    Args:
        comparison: what to run.
        command: the command line that asked for it (quoted in the report).
        fit: runs ``fedlit fit`` with the given arguments.
        rounds: a run's configured rounds from its ``fit`` arguments; raises (or exits) on
            bad input, so every run is checked before the first one starts.
        partition: the (clients x classes) counts a run's data makes for a seed.
        log: where progress lines go.

    Returns:
        name -> path of every file of the report.
    """
    sources, runs = plan_sources(comparison), plan(comparison)
    configured: dict[tuple[str, str], int] = {}
    partitions: dict[str, np.ndarray] = {}
    for run in (*sources, *runs):
        key = (run.setting, str(run.run_dir.parent))
        if key not in configured:
            log(f"checking {run.setting}/{run.run_dir.parent.name}")
            configured[key] = rounds(run.args)
        if run.setting not in partitions:
            partitions[run.setting] = partition(run.args, run.seed)
    per_run = {run: configured[(run.setting, str(run.run_dir.parent))] for run in (*sources, *runs)}
    start = time.perf_counter()
    children = None
    if comparison.jobs > 1:
        threads = max(1, (os.cpu_count() or 1) // comparison.jobs)
        children = Children()
        fit = fit_in_subprocess(Path(comparison.out) / "logs", threads, children)
    if sources:  # the runs the others start from, first
        execute(sources, per_run, fit, log, comparison.jobs, children)
    counts = execute(runs, per_run, fit, log, comparison.jobs, children)
    minutes = (time.perf_counter() - start) / 60
    records = [load_run(run.run_dir) for run in runs]
    short = last_k_warning(records, comparison.last_k)
    if short:
        warn(short)
    compute = sum(row.get("time/round_s", 0.0) for r in records for row in r.history) / 60
    settings = [
        f"- setting `{name}`: `{' '.join(args) or '(the recipes as they are)'}`"
        for name, args in comparison.settings.items()
    ]
    about = [
        *comparison.description,
        "",
        f"Made by `{command}`: {len(runs)} runs ({counts['run']} run, {counts['resumed']} "
        f"resumed, {counts['skipped']} finished before; this invocation took {minutes:.1f} "
        f"min; the runs' rounds took {compute:.1f} min in all). Every number below comes "
        "from those runs.",
        "",
        f"- recipes: {', '.join(f'`{r}`' for r in comparison.recipes)}",
        f"- seeds: {list(comparison.seeds)}",
        *settings,
        f"- every run: `{' '.join(comparison.overrides) or '(no overrides)'}`",
    ]
    if comparison.init_from is not None:
        about += _source_lines(comparison, sources)
    if comparison.baseline is not None:
        about.append(
            f"- *vs {comparison.baseline} (paired, 95% CI)*: per seed, the method's score "
            f"minus {comparison.baseline}'s with the same seed (the same labeled set and "
            "partition); mean ± sample std over the seeds, in points, then the two-sided 95% "
            "t-interval of the mean difference; `*` where it excludes 0."
        )
    if comparison.last_k > 1:
        about.append(
            f"- *mean of last {comparison.last_k}*: each run's score, the mean of its last "
            f"{comparison.last_k} rounds' test/acc (less of one round's noise than the last)."
        )
    if any(r.series(key)[1].size for r in records for key in FINAL_EVAL_KEYS.values()):
        about.append(
            "- *finetune / linear (final eval)*: the global encoder after the last round, "
            "fine-tuned end to end / with a linear classifier on the server's labeled set "
            "(`federation.final_eval`), for the recipes that ask for it."
        )
    written = write_report(
        records,
        comparison.out,
        title=f"Comparison: {comparison.name}",
        target=comparison.target,
        published=comparison.published,
        partitions=partitions,
        about=about,
        report=comparison.report,
        baseline=comparison.baseline,
        last_k=comparison.last_k,
        name=comparison.name,
    )
    if comparison.wandb is not None:
        log_to_wandb(
            records,
            written,
            comparison.wandb.project,
            comparison.name,
            comparison.wandb.offline,
            comparison.out,
            target=comparison.target,
            baseline=comparison.baseline,
            last_k=comparison.last_k,
        )
    return written
