"""``fedlit compare``: recipes x settings x seeds, then one report, as a pipeline of stages
(:func:`run_comparison`): check everything, run the source runs, the studies (a tuned
comparison), the scored runs, then write the report and log it to W&B. Each stage is a
function of what the stages before it give; the runs themselves are run by
:mod:`~fedlit.comparison.runs`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedlit.comparison.cluster import RayRuns
from fedlit.comparison.every_label import check_every_label, with_every_label
from fedlit.comparison.plan import INIT_FROM_ARG, PlannedRun, plan, plan_sources, run_state
from fedlit.comparison.report import about_lines, log_to_wandb, terminal_table, write_report
from fedlit.comparison.runs import (
    FitFn,
    Refused,
    changed_runs,
    chosen_settings,
    execute,
    fit_in_subprocess,
    refuse_changed,
    timing,
)
from fedlit.comparison.spec import Comparison
from fedlit.comparison.studies import check_studies, tuning_comparison, with_settings
from fedlit.comparison.tune import overrides
from fedlit.comparison.tuned import Tuning, tune_runs
from fedlit.federation.children import Children
from fedlit.federation.console import warn
from fedlit.federation.loggers import quiet_wandb
from fedlit.machine import available_cores
from fedlit.reporting import RunRecord, last_k_warning, load_run
from fedlit.run_layout import CHECKPOINT, RECORD_FILE

__all__ = [
    "Checked",
    "FitFn",
    "Refused",
    "Scoring",
    "check",
    "execute",
    "fit_in_subprocess",
    "run_comparison",
    "timing",
    "tuning_budget",
]


def run_comparison(
    comparison: Comparison,
    command: str,
    fit: FitFn,
    rounds: Callable[[Sequence[str]], int],
    partition: Callable[[Sequence[str], int], np.ndarray],
    log: Callable[[str], None] = print,
    settings: Callable[[Sequence[str]], dict[str, Any]] | None = None,
    rerun_changed: bool = False,
) -> dict[str, Path]:
    """Check every recipe x setting (:func:`check`), run what is not finished (the source
    runs, the studies, the scored runs), then write the report, log it to W&B and show its
    main tables (``log``); returns name -> path of every file of the report.

    ``command`` is quoted in the report; ``fit`` runs ``fedlit fit`` with the given
    arguments; ``rounds`` gives a run's configured rounds from its ``fit`` arguments and
    raises (or exits) on bad input; ``partition`` gives the (clients x classes) counts a
    run's data makes for a seed; ``settings`` gives a run's flat config (as ``fedlit fit``
    records it): a run written already is reused only where its settings are these
    (:func:`~fedlit.comparison.runs.execute`; None: not checked); ``rerun_changed`` runs
    afresh a run written with other settings, the old one set aside."""
    checked = check(comparison, rounds, partition, settings, rerun_changed, log)
    start = time.perf_counter()
    # no W&B summary block after each run: the table comes last
    with fit_for_jobs(comparison, fit, log) as (fit, children), quiet_wandb():
        run_sources(comparison, checked, fit, log, children)
        scoring = run_tuning(comparison, checked, rounds, fit, log, children, settings)
        counts = run_scored(comparison, checked, scoring, fit, log, children)
    minutes = (time.perf_counter() - start) / 60
    records, written = report(comparison, checked, scoring, counts, minutes, command)
    if comparison.wandb is not None:
        to_wandb(comparison, records, written, scoring.tuning)
    table = terminal_table(
        records, comparison.target, comparison.baseline, comparison.last_k, comparison.calibration
    )
    log(table)
    return written


@dataclass
class Checked:
    """A comparison checked before anything runs: its source runs and runs (:func:`plan`),
    each run's configured rounds (``rounds``, learning the tuned runs' too) and flat config
    (``given``; empty where not checked), each setting's partition, the settings and seeds
    whose source is run afresh (``renewed``), and whether changed runs are run afresh."""

    sources: list[PlannedRun]
    runs: list[PlannedRun]
    rounds: dict[PlannedRun, int]
    given: dict[PlannedRun, dict[str, Any]]
    partitions: dict[str, np.ndarray]
    renewed: set[tuple[str, int]]
    rerun_changed: bool = False


@dataclass
class Scoring:
    """The runs the report scores, the flat config each is checked against, and what the
    tuning (None: untuned) says of them."""

    runs: list[PlannedRun]
    given: Mapping[PlannedRun, dict[str, Any]]
    tuning: Tuning | None = None
    label_lines: list[str] = field(default_factory=list)


def check(
    comparison: Comparison,
    rounds: Callable[[Sequence[str]], int],
    partition: Callable[[Sequence[str], int], np.ndarray],
    settings: Callable[[Sequence[str]], dict[str, Any]] | None,
    rerun_changed: bool,
    log: Callable[[str], None] = print,
) -> Checked:
    """Every run checked before the first one starts (a tuned comparison's scored runs once
    their settings are chosen): each recipe and setting parsed once, a run written with other
    settings refused (:class:`~fedlit.comparison.runs.Refused`) unless ``rerun_changed``, and
    a tuned comparison's studies checked (:func:`check_tuning`)."""
    sources, runs = plan_sources(comparison), plan(comparison)
    configured: dict[tuple[str, str], int] = {}
    flat: dict[tuple[str, str], dict[str, Any]] = {}
    partitions: dict[str, np.ndarray] = {}
    for run in (*sources, *runs):
        key = (run.setting, str(run.run_dir.parent))
        if key not in configured:
            log(f"checking {run.setting}/{run.run_dir.parent.name}")
            configured[key] = rounds(run.args)
            if settings is not None:
                flat[key] = settings(run.args)
        if run.setting not in partitions:
            partitions[run.setting] = partition(run.args, run.seed)
    per_run = {run: configured[(run.setting, str(run.run_dir.parent))] for run in (*sources, *runs)}
    given = {run: flat[(run.setting, str(run.run_dir.parent))] for run in (*sources, *runs) if flat}
    # a tuned comparison's scored runs are checked once their settings are chosen
    checked = (*sources, *runs) if comparison.tune is None else sources
    if not rerun_changed:
        refuse_changed(changed_runs(checked, per_run, given))
    if comparison.tune is not None:
        check_tuning(comparison, rounds, settings)
        log(tuning_budget(comparison, {(r.setting, r.method): per_run[r] for r in runs}))
    # a source run afresh: the runs that start from it, too
    renewed = {(r.setting, r.seed) for r in changed_runs(sources, per_run, given)}
    refuse_sourceless(runs, per_run)
    try:
        check_every_label(comparison, settings)
    except ValueError as err:
        raise Refused(str(err)) from None
    return Checked(sources, runs, per_run, given, partitions, renewed, rerun_changed)


def check_tuning(
    comparison: Comparison,
    rounds: Callable[[Sequence[str]], int],
    settings: Callable[[Sequence[str]], dict[str, Any]] | None,
) -> None:
    """Every study's settings parse and the studies already in ``out`` can go on, before
    anything runs; :class:`Refused` otherwise."""
    check_spaces(comparison, rounds)
    refusal = check_studies(comparison)
    if refusal:
        raise Refused(refusal)


def check_spaces(comparison: Comparison, rounds: Callable[[Sequence[str]], int]) -> None:
    """Have ``fedlit fit``'s parser check every study's settings at both ends of their ranges
    (``rounds`` parses a run's arguments and exits on a bad key or value), before anything
    runs."""
    assert comparison.tune is not None
    runs = plan(tuning_comparison(comparison))
    for recipe in comparison.recipes:
        stem = Path(recipe).stem
        base = next(r for r in runs if r.method == stem)
        space = comparison.tune.space(recipe)
        for end in ("low", "high"):
            params = {
                key: (d.choices[0 if end == "low" else -1] if d.choices else getattr(d, end))
                for key, d in space.items()
            }
            params = {k: int(v) if space[k].integer else v for k, v in params.items()}
            rounds(with_settings(base.args, overrides(params)))


@contextmanager
def fit_for_jobs(
    comparison: Comparison, fit: FitFn, log: Callable[[str], None] = print
) -> Iterator[tuple[FitFn, Children | None]]:
    """While the runs run: the ``fit`` they use, and what it starts, stopped with the
    comparison. With ``executor: local``, ``fit`` itself one at a time, or with ``jobs >= 2``
    a child process per run with the cores shared among them; with ``executor: ray``, a Ray
    task per run (:class:`~fedlit.comparison.cluster.RayRuns`, connected here and
    disconnected after)."""
    if comparison.executor == "ray":
        runs = RayRuns(comparison.ray, Path(comparison.out) / "logs")
        log(
            f"ray: {runs.nodes} node(s) hold {runs.capacity} run(s) of {comparison.ray.cpus:g} "
            f"CPUs and {comparison.ray.gpus:g} GPUs at once; jobs: {comparison.jobs} at a time"
        )
        try:
            yield runs, runs.tasks
        finally:
            runs.close()
    elif comparison.jobs <= 1:
        yield fit, None
    else:
        threads = max(1, available_cores() // comparison.jobs)
        children = Children()
        yield fit_in_subprocess(Path(comparison.out) / "logs", threads, children), children


def refuse_sourceless(runs: Sequence[PlannedRun], rounds: Mapping[PlannedRun, int]) -> None:
    """Refuse (:class:`~fedlit.comparison.runs.Refused`) a run still to run whose warm
    start's source is kept as its record without its checkpoint: nothing to start from."""
    for run in runs:
        source = [a.split("=", 1)[1] for a in run.args if a.startswith(INIT_FROM_ARG)]
        if not source or run_state(run, rounds[run]) == "finished":
            continue
        folder = Path(source[-1])
        if (folder / RECORD_FILE).is_file() and not (folder / CHECKPOINT).is_file():
            raise Refused(
                f"{run.run_dir}: its warm start's source {folder} is kept as its record "
                "without its checkpoint, so it has nothing to start from; restore the "
                "source's checkpoint (saved records keep it)"
            )


def run_sources(
    comparison: Comparison,
    checked: Checked,
    fit: FitFn,
    log: Callable[[str], None],
    children: Children | None,
) -> None:
    """Run the source runs, which the others start from, first."""
    if checked.sources:
        execute(
            checked.sources, checked.rounds, fit, log, comparison.jobs, children, checked.given,
            checked.rerun_changed,
        )  # fmt: skip


def run_tuning(
    comparison: Comparison,
    checked: Checked,
    rounds: Callable[[Sequence[str]], int],
    fit: FitFn,
    log: Callable[[str], None],
    children: Children | None,
    settings: Callable[[Sequence[str]], dict[str, Any]] | None,
) -> Scoring:
    """The runs to score: an untuned comparison's own; a tuned one's after its studies
    (:func:`~fedlit.comparison.tuned.tune_runs`), with their chosen settings; either with
    the ``every_label`` row where asked."""
    if comparison.tune is None:
        runs, label_lines = with_every_label(comparison, checked.runs, checked.rounds, settings)
        extra = runs[len(checked.runs) :]
        given = dict(checked.given)
        if extra and settings is not None:
            given |= chosen_settings(extra, settings)
        return Scoring(runs, given, None, label_lines)
    tuning = tune_runs(comparison, checked.runs, checked.rounds, rounds, fit, log, children)
    runs, label_lines = with_every_label(comparison, tuning.runs, checked.rounds, settings)
    given = chosen_settings(runs, settings) if settings is not None else {}
    return Scoring(runs, given, tuning, label_lines)


def run_scored(
    comparison: Comparison,
    checked: Checked,
    scoring: Scoring,
    fit: FitFn,
    log: Callable[[str], None],
    children: Children | None,
) -> dict[str, int]:
    """Run the scored runs; returns how many were run, resumed and skipped."""
    return execute(
        scoring.runs, checked.rounds, fit, log, comparison.jobs, children, scoring.given,
        checked.rerun_changed, checked.renewed,
    )  # fmt: skip


def report(
    comparison: Comparison,
    checked: Checked,
    scoring: Scoring,
    counts: dict[str, int],
    minutes: float,
    command: str,
) -> tuple[list[RunRecord], dict[str, Path]]:
    """The scored runs' records and the report written from them."""
    records = [load_run(run.run_dir) for run in scoring.runs]
    short = last_k_warning(records, comparison.last_k)
    if short:
        warn(short)
    about = about_lines(comparison, records, checked.sources, counts, minutes, command)
    if scoring.tuning is not None:
        about += [*scoring.tuning.lines(), ""]
    about += scoring.label_lines
    written = write_report(
        records,
        comparison.out,
        title=f"Comparison: {comparison.name}",
        target=comparison.target,
        published=comparison.published,
        partitions=checked.partitions,
        about=about,
        report=comparison.report,
        baseline=comparison.baseline,
        last_k=comparison.last_k,
        name=comparison.name,
        calibration=comparison.calibration,
    )
    return records, written


def to_wandb(
    comparison: Comparison,
    records: Sequence[RunRecord],
    written: Mapping[str, Path],
    tuning: Tuning | None,
) -> None:
    """Log the report (and the studies) to the comparison's W&B project."""
    assert comparison.wandb is not None
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
    if tuning is not None:
        tuning.log_to_wandb()


def tuning_budget(comparison: Comparison, rounds: Mapping[tuple[str, str], int]) -> str:
    """What the tuning asks, before it runs: its studies and their rounds in all (``rounds``:
    a run's rounds per setting and recipe); each run's time is printed as it ends."""
    tune = comparison.tune
    assert tune is not None
    per = tune.trials * len(tune.seeds)
    total = sum(per * n for n in rounds.values())
    return (
        f"tuning: {len(rounds)} stud{'y' if len(rounds) == 1 else 'ies'}, up to {total} rounds "
        f"of trials in all ({tune.trials} trials x a run's rounds x {len(tune.seeds)} tuning "
        "seeds each, pruned trials' rounds spent on more trials); each run's time and the "
        "estimate for the rest follow it"
    )
